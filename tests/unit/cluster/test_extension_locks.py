"""Stale extension-build locks (tinytrain/cluster/extension_locks.py), with real lock files in a
temporary TORCH_EXTENSIONS_DIR laid out as torch lays it out (<root>/<op>/lock)."""

import os
import subprocess
import sys
import time

from tinytrain.cluster import extension_locks


def lock_in(root, name, age_s):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "build.ninja").write_text("rule cxx\n")
    lock = folder / "lock"
    lock.touch()
    for path in (folder / "build.ninja", lock):
        os.utime(path, (time.time() - age_s, time.time() - age_s))
    return lock


def test_a_lock_left_by_a_killed_build_is_removed_and_said(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = lock_in(tmp_path, "cpu_adam", age_s=70 * 60)
    lines = extension_locks.clear_stale()
    assert not lock.exists()
    assert lines == [f"removed {lock}: an extension-build lock left by a build that was killed (no process holds it, nothing written in its folder for 4200 s); cpu_adam is built again"]
    assert lines[0] in caplog.text


def test_a_lock_held_by_a_running_build_is_left_alone(tmp_path):
    lock = lock_in(tmp_path / "py311_cpu", "deepspeed_shm_comm", age_s=70 * 60)
    # A builder holds the lock open from its creation to its removal, as torch's FileBaton does.
    builder = subprocess.Popen([sys.executable, "-c", f"import os, time; fd = os.open({str(lock)!r}, os.O_RDONLY); print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        builder.stdout.readline()
        assert extension_locks.holders(lock) == [builder.pid]
        assert extension_locks.clear_stale(tmp_path) == []
        assert lock.exists()
    finally:
        builder.kill()


def test_a_fresh_lock_is_left_and_on_a_shared_file_system_named_with_the_fix(tmp_path, monkeypatch):
    lock = lock_in(tmp_path, "fused_adam", age_s=5)
    assert extension_locks.clear_stale(tmp_path) == [] and lock.exists()  # a builder may be about to open it
    monkeypatch.setattr(extension_locks, "file_system", lambda path: "nfs4")
    os.utime(lock, (time.time() - 120, time.time() - 120))
    os.utime(lock.parent / "build.ninja", (time.time() - 120, time.time() - 120))
    (line,) = extension_locks.clear_stale(tmp_path)
    assert lock.exists() and f"if no other host is building fused_adam, remove it: rm {lock}" in line


def test_the_file_system_is_the_longest_mount_above_the_path():
    mounts = "rootfs / ext4 rw 0 0\nserver:/home /home nfs4 rw 0 0\ntmpfs /home/tmp tmpfs rw 0 0\n"
    assert extension_locks.file_system("/home/me/.cache/torch_extensions", mounts) == "nfs4"
    assert extension_locks.file_system("/home/tmp/x", mounts) == "tmpfs"
    assert extension_locks.file_system("/homework", mounts) == "ext4"
