"""The signal handlers the Preemption callback installs (tinytrain/train/callbacks/preemption.py)."""

import gc
import signal

from tinytrain.train.callbacks.preemption import Preemption, requeue_failed


def test_the_installed_handler_remembers_and_holds_nothing_of_the_callback(tmp_path):
    """Lightning binds a callback to the module (its `log`), and the early SIGUSR1 handler stays
    installed after fit (Lightning's teardown puts it back): a handler that is the callback's method
    kept the model, and fsdp_tp's process groups with their gloo threads, alive into the
    interpreter's exit."""
    before = signal.getsignal(signal.SIGUSR1)
    callback = Preemption(tmp_path)
    try:
        callback.install_early()
        handler = signal.getsignal(signal.SIGUSR1)
        assert not any(r is callback for r in gc.get_referents(handler))
        handler(signal.SIGUSR1, None)
        assert callback.received == ["SIGUSR1"] and callback.what() == "SIGUSR1"
        callback.received.clear()
        handler(signal.SIGUSR1, None)
        assert callback.received == ["SIGUSR1"]
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_failed_requeue_names_the_run_directory_to_continue_in(tmp_path):
    """"resubmit with run.name=slurm-<job>" started a fresh run where the job trained into another
    directory (mode=sbatch's jobs set hydra.run.dir=runs/<timestamp>)."""
    failed = "scontrol requeue 42 failed (exit 1): Requested operation is presently disabled"
    told = requeue_failed(tmp_path, failed)
    assert told == f"{failed}; run the same command again with hydra.run.dir={tmp_path} (or its run.name): resume=auto continues from it"
    assert "slurm-42" not in told
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\n")
    assert requeue_failed(tmp_path, failed) == f"{failed}; resubmit its job script (sbatch {tmp_path / 'job.sbatch'}): resume=auto continues from it"
