"""What the tests' zygote (tests/zygote.py) saves per command: the same `python -m tinytrain`
command (a 2-step smoke run of a tiny Llama, the same on 2 ddp ranks and on 2 ZeRO-2 ranks,
`mode=plan`) run as the tests' `run_cli` runs it, forked from the zygote (a 2-rank run's second rank
a spare forked from its first) vs in a fresh interpreter (its second rank too, as Lightning starts
it), and forked from a plain zygote (its heap not frozen out of the collector, inductor not
preloaded: the zygote before both), alternating the three in each round; the zygotes' own starts
(once per test worker) are left out.

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
    "zero2 smoke run (2 ranks, 2 steps)": [*SMOKE, "parallel=zero2", "parallel.deepspeed_on_cpu=true", "cluster.devices=2"],
    "mode=plan": ["mode=plan", "model=llama3_8b", "hardware.gpu=H100", "cluster.devices=8", "parallel=zero3"],
}


def load_zygotes():
    """tests/zygote.py as a module of its own (it imports nothing from the tests package), so the
    benchmark runs as a script without the repository on PYTHONPATH."""
    spec = importlib.util.spec_from_file_location("test_zygote", REPO / "tests" / "zygote.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {"zygote": module.Zygote(), "plain zygote": module.Zygote(lean_children=False)}


def run(zygotes: dict, way: str, args: list[str], run_dir: Path) -> subprocess.CompletedProcess:
    """The command as the tests' run_cli runs it: forked from a zygote, or a fresh interpreter."""
    argv = [*args, f"hydra.run.dir={run_dir}"]
    if way in zygotes:
        devices = [a.split("=", 1)[1] for a in args if a.startswith("cluster.devices=")]
        return zygotes[way].run("tinytrain", argv, REPO, dict(os.environ), 600, spare_ranks=int(devices[-1]) - 1 if devices else 0)
    return subprocess.run([sys.executable, "-m", "tinytrain", *argv], cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    zygotes = load_zygotes()
    tmp = Path(tempfile.mkdtemp(prefix="zygote-bench-"))
    for name, zygote in zygotes.items():  # their starts, not timed
        zygote.popen("tinytrain", ["--version"], REPO, dict(os.environ), tmp / f"warm-{name.replace(' ', '-')}.log").wait(120)
    ways = ("fresh", *zygotes)
    for index, (name, args) in enumerate(COMMANDS.items()):
        times = {way: [] for way in ways}
        for i in range(rounds):
            for way in ways:
                start = time.perf_counter()
                result = run(zygotes, way, args, tmp / f"command{index}-{way.replace(' ', '-')}{i}")
                times[way].append(time.perf_counter() - start)
                if result.returncode != 0:
                    raise SystemExit(f"{name} ({way}) exited {result.returncode}:\n{result.stderr[-2000:]}")
        fresh, forked, plain = (statistics.median(times[way]) for way in ("fresh", "zygote", "plain zygote"))
        print(f"{name}: fresh interpreter {fresh:.2f} s, forked from the plain zygote {plain:.2f} s, from the zygote {forked:.2f} s (medians of {rounds}); zygote / fresh {forked / fresh:.2f}, zygote / plain zygote {forked / plain:.2f}")


if __name__ == "__main__":
    main()
