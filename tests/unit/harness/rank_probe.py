"""Run by tests/unit/harness/test_zygote.py from the tests' zygote: `launch OUT` starts local ranks
as Lightning's launcher does (its module's subprocess.Popen) and records what each reports; `rank
OUT N CODE` is such a rank."""

import json
import os
import signal
import sys
import time
from pathlib import Path

PRELOADED = "torch" in sys.modules  # before anything here imports it: a spare forked from the zygote has it


def own_children() -> list[int]:
    return [int(p) for p in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()]


def launch(out: Path) -> None:
    from lightning.pytorch.strategies.launchers import subprocess_script

    spares = own_children()
    procs = {}
    for rank, code in ((1, 7), (2, 0), (3, 0)):
        command = [sys.executable, "-m", "tests.unit.harness.rank_probe", "rank", str(out), str(rank), str(code)]
        env = {**os.environ, "LOCAL_RANK": str(rank)}
        if rank == 3:  # read at import: a spare imported with another value, so this rank starts fresh
            env["OMP_NUM_THREADS"] = str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)
        procs[rank] = subprocess_script.subprocess.Popen(command, env=env, cwd=os.getcwd())
    while not (out / "rank2.json").exists():
        time.sleep(0.05)
    procs[2].kill()  # rank 2 sleeps until killed
    ended = {}
    for rank, proc in procs.items():
        while proc.poll() is None:
            time.sleep(0.05)
        ended[rank] = {"pid": proc.pid, "returncode": proc.returncode}
    (out / "launcher.json").write_text(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "spares": spares, "ended": ended}))


def rank(out: Path, number: int, code: int) -> None:
    report = {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "preloaded": PRELOADED, "local_rank": os.environ["LOCAL_RANK"], "cwd": os.getcwd(), "argv": sys.argv[1:]}
    # Written whole, then renamed: the launcher kills rank 2 as soon as its report exists (CI41 read
    # an empty rank2.json, killed between write_text's create and its write).
    partial = out / f"rank{number}.json.partial"
    partial.write_text(json.dumps(report))
    partial.rename(out / f"rank{number}.json")
    print(f"rank {number} says hello", flush=True)
    if number == 2:
        signal.pause()
    sys.exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "launch":
        launch(Path(sys.argv[2]))
    else:
        rank(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
