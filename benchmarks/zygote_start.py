"""What the tests' zygote (tests/zygote.py) saves per command: the same `python -m tinytrain`
command (a 2-step smoke run of a tiny Llama, the same on 2 ddp ranks, `mode=plan`) run as the tests'
`run_cli` runs it, forked from the zygote (the ddp run's second rank a spare forked from its first)
vs in a fresh interpreter (its second rank too, as Lightning starts it), alternating fresh / zygote
in each round; the zygote's own start (once per test worker) is left out of its side.

    python benchmarks/zygote_start.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")

SMOKE = ["experiment=smoke", "model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "trainer.max_steps=2", "trainer.warmup_steps=1", "trainer.progress_bar=false", "trainer.plot=false", "generate.sample_prompts=[]"]
COMMANDS = {
    "smoke run (2 steps)": SMOKE,
    "ddp smoke run (2 ranks, 2 steps)": [*SMOKE, "parallel=ddp", "cluster.devices=2"],
    "mode=plan": ["mode=plan", "model=llama3_8b", "hardware.gpu=H100", "cluster.devices=8", "parallel=zero3"],
}


def load_zygote():
    """tests/zygote.py as a module of its own (it imports nothing from the tests package), so the
    benchmark runs as a script without the repository on PYTHONPATH."""
    spec = importlib.util.spec_from_file_location("test_zygote", REPO / "tests" / "zygote.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Zygote()


def run(zygote, way: str, args: list[str], run_dir: Path) -> subprocess.CompletedProcess:
    """The command as the tests' run_cli runs it: forked from the zygote, or a fresh interpreter."""
    argv = [*args, f"hydra.run.dir={run_dir}"]
    if way == "zygote":
        devices = [a.split("=", 1)[1] for a in args if a.startswith("cluster.devices=")]
        return zygote.run("tinytrain", argv, REPO, dict(os.environ), 600, spare_ranks=int(devices[-1]) - 1 if devices else 0)
    return subprocess.run([sys.executable, "-m", "tinytrain", *argv], cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    zygote = load_zygote()
    tmp = Path(tempfile.mkdtemp(prefix="zygote-bench-"))
    zygote.popen("tinytrain", ["--version"], REPO, dict(os.environ), tmp / "warm.log").wait(120)  # its start, not timed
    for name, args in COMMANDS.items():
        times = {"fresh": [], "zygote": []}
        for i in range(rounds):
            for way in ("fresh", "zygote"):
                start = time.perf_counter()
                result = run(zygote, way, args, tmp / f"command{list(COMMANDS).index(name)}-{way}{i}")
                times[way].append(time.perf_counter() - start)
                if result.returncode != 0:
                    raise SystemExit(f"{name} ({way}) exited {result.returncode}:\n{result.stderr[-2000:]}")
        fresh, forked = statistics.median(times["fresh"]), statistics.median(times["zygote"])
        print(f"{name}: fresh interpreter {fresh:.2f} s, forked from the zygote {forked:.2f} s (medians of {rounds}); ratio {forked / fresh:.2f}")


if __name__ == "__main__":
    main()
