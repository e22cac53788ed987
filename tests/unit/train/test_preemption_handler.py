"""The signal handlers the Preemption callback installs (tinytrain/train/callbacks/preemption.py)."""

import gc
import signal

from tinytrain.train.callbacks.preemption import Preemption


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
