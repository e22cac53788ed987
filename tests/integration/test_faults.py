"""Faults that must not lose data or leave processes behind: a disk that fills up during a
checkpoint save, a store build killed with its tokenizer workers running.

(Signals and SIGKILL during a save are in test_resume.py; two runs in one directory in
tests/unit/test_run_directory.py.)
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import mounted_tmpfs, start_cli

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
# A step checkpoint of this model is 7.2 MB. The plan refuses a run root that cannot hold keep_last
# + 1 of them (test_checkpoint_cost.py), so the 40 MB disk is filled by another writer once step 4's
# checkpoint is in place, leaving 3 MB: step 8's save fills it up.
RUN = ["experiment=smoke", *MODEL, "data.seq_len=32", "trainer.max_steps=12", "trainer.progress_bar=false", "trainer.export=false", "trainer.plot=false"]


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MB tmpfs (root only)."""
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    with mounted_tmpfs(mount_point, "size=40m"):
        yield mount_point


@pytest.mark.timeout(300)
def test_disk_full_during_a_save_keeps_the_previous_checkpoint_and_says_so(small_disk, tmp_path):
    run_dir = small_disk / "run"
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    r = run_filling_the_disk(RUN, run_dir, small_disk)
    assert r.returncode == 3, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "enforce fail" not in r.stderr, r.stderr[-3000:]
    assert f"disk full while saving {run_dir / 'checkpoints' / 'step0000008.ckpt'}; the previous checkpoint step0000004.ckpt is intact" in r.stderr
    assert "resume=auto continues from the newest checkpoint" in r.stderr
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert left == ["step0000004.ckpt"]  # the partial file is gone, the previous one stays
    assert torch.load(run_dir / "checkpoints" / "step0000004.ckpt", weights_only=True)["global_step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == outside_before


# A token-store build whose documents stop coming once workers are busy: the parent sits mid-build.
MID_BUILD = """
import sys, time
from tests.conftest import compose
from tinytrain.data import sources, store
from tinytrain.data.sources import Source
from tinytrain.data.tokenizer import load_from_config

text, cache, ready = sys.argv[1:4]
cfg = compose(["data=text", f"data.path={text}", f"data.cache_dir={cache}", "data.tokenize_workers=2"])

def documents(src, bad, field=None):
    for i in range(5 * store.CHUNK_DOCS):  # 4 chunks in flight and the first one's result read: the workers run
        yield f"document number {i}"
    open(ready, "w").write("mid-build")
    time.sleep(600)

sources.documents = documents
store.ensure_store(Source.from_config(cfg.data), cfg.data, load_from_config(cfg.tokenizer), progress=False)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_store_build_workers_end_with_their_parent(sig, tmp_path):
    """No orphans: the tokenizer workers of a store build end when the build's process dies by any
    signal (they used to wait for ever on their task pipe), and the next run builds the store."""
    import psutil

    from tests.conftest import REPO, compose
    from tinytrain.data.sources import Source
    from tinytrain.data.store import ensure_store
    from tinytrain.data.tokenizer import load_from_config

    text, cache, ready = tmp_path / "docs.txt", tmp_path / "cache", tmp_path / "ready"
    text.write_text("\n\n".join(f"Document {i} of the corpus." for i in range(50)))
    proc = subprocess.Popen([sys.executable, "-c", MID_BUILD, str(text), str(cache), str(ready)], cwd=REPO, stderr=subprocess.PIPE, text=True)
    children = []
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the build never got going"
            time.sleep(0.1)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len([c for c in children if "resource_tracker" not in " ".join(c.cmdline())]) == 2, [c.cmdline() for c in children]
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"{len(alive)} worker(s) outlived their parent: {[p.pid for p in alive]}"
    finally:
        proc.kill()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    # The killed build left only its temp folder; the next run removes it and builds the store.
    cfg = compose(["data=text", f"data.path={text}", f"data.cache_dir={cache}", "data.tokenize_workers=0"])
    built, fresh = ensure_store(Source.from_config(cfg.data), cfg.data, load_from_config(cfg.tokenizer), progress=False)
    assert fresh and built.num_documents == 50
    assert [p.name for p in (cache / "stores").iterdir() if ".tmp-" in p.name] == []


def test_a_worker_whose_parent_is_gone_exits_at_once():
    """The race the prctl cannot cover: the parent died before the worker's initializer ran."""
    import multiprocessing

    from tinytrain.data.orphan_guard import die_with_parent

    child = multiprocessing.get_context("fork").Process(target=die_with_parent, args=(1,))  # pid 1 is never its parent
    child.start()
    child.join(timeout=10)
    assert child.exitcode == 1


def run_filling_the_disk(args, run_dir, disk) -> subprocess.CompletedProcess:
    """The CLI, with a ballast file that leaves 3 MB free written once step 4's checkpoint exists.
    Its output goes to files off the small disk."""
    logs = Path(tempfile.mkdtemp(prefix="disk-full-"))
    out, err = logs / "stdout", logs / "stderr"
    proc = start_cli(args, run_dir, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoints" / "step0000004.ckpt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended (or stalled) before step 4's checkpoint"
            time.sleep(0.01)
        with open(disk / "ballast", "wb") as f:
            f.write(bytes(shutil.disk_usage(disk).free - 3 * 2**20))
        proc.wait(timeout=240)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(errors="replace"), err.read_text(errors="replace"))
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(logs)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_disk_full_during_a_sharded_save_keeps_the_previous_checkpoint(small_disk, async_save):
    """The same under fsdp_tp (2 ranks, each writing its shard, in the step or in the background):
    every rank stops with the message, the temp folder is removed, the previous folder is intact.
    (Every rank measures the disk before rank 0 removes the partial shards: measured after, a rank
    saw free space and died with DCP's traceback.)"""
    from tinytrain.checkpoint.resume import read_state

    run_dir = small_disk / "run"
    args = [*RUN, "parallel=fsdp_tp", "cluster.devices=2", f"checkpoint.async_save={str(async_save).lower()}"]
    r = run_filling_the_disk(args, run_dir, small_disk)
    assert r.returncode == 3, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "CheckpointException" not in r.stderr, r.stderr[-3000:]
    assert f"disk full while saving {run_dir / 'checkpoints' / 'step0000008.ckpt'}; the previous checkpoint step0000004.ckpt is intact" in r.stderr, r.stderr[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step0000004.ckpt"]
    assert read_state(run_dir / "checkpoints" / "step0000004.ckpt")["global_step"] == 4


@pytest.mark.timeout(300)
def test_disk_full_during_an_export_keeps_the_previous_export_and_names_the_disk(tmp_path):
    """mode=export onto a disk that fills up while the weights are written: exit 2 naming the folder,
    the free space and the fix (safetensors' SafetensorError used to end it with exit 1); the
    previous export is byte for byte the same, and no temp folder is left."""
    import hashlib

    from omegaconf import OmegaConf

    from tests.conftest import compose
    from tests.unit.test_bad_inputs import SMALL_MODEL, run_in_process, small_model_checkpoint
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.plan.planner import make_plan

    run = tmp_path / "run"
    cfg = compose(SMALL_MODEL)
    plan = make_plan(cfg, load_from_config(cfg.tokenizer), run)
    (run / "checkpoints").mkdir(parents=True)
    (run / "config_resolved.yaml").write_text(OmegaConf.to_yaml(plan.resolved_config(cfg)))
    small_model_checkpoint(run / "checkpoints" / "step0000004.ckpt")  # 2.4 MB of weights
    disk = tmp_path / "small_disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    with mounted_tmpfs(disk, "size=6m"):
        export = ["mode=export", f"checkpoint.path={run / 'checkpoints' / 'step0000004.ckpt'}", f"export.dir={disk / 'hf_export'}"]
        code, err = run_in_process([*export, f"hydra.run.dir={tmp_path / 'first'}"])
        assert code == 0, err
        before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (disk / "hf_export").iterdir()}
        with open(disk / "ballast", "wb") as f:  # 1 MB left: the second export's weights do not fit
            f.write(bytes(shutil.disk_usage(disk).free - 2**20))
        code, err = run_in_process([*export, f"hydra.run.dir={tmp_path / 'second'}"])
        assert code == 2 and "Traceback" not in err and "SafetensorError" not in err, err
        assert f"export.dir='{disk / 'hf_export'}': the disk filled up while the export was written" in err, err
        assert "the previous export there is intact" in err and f"MiB on the disk holding {disk}" in err
        assert f"Fix: free space there (df -h {disk}) or set export.dir to a folder on another disk" in err
        assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (disk / "hf_export").iterdir()} == before
        assert sorted(p.name for p in disk.iterdir()) == ["ballast", "hf_export"]
