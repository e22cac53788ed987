"""`mode=plan` in one warm process, Hydra composing the config twice per command (its own way: once
to find hydra.mode, once to run) vs once (tinytrain/config/run_mode.py), alternating rounds of
`--plans` commands each; the best round of each side:

    python benchmarks/plan_composition.py [--rounds 3] [--plans 10]
Reported (the saving is per command, in-process or not)."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time

from _common import REPO


def plan_seconds(plans: int, folder: str) -> float:
    from tinytrain import cli

    start = time.perf_counter()
    for i in range(plans):
        sys.argv = ["tinytrain", "mode=plan", f"hydra.run.dir={folder}/{i}"]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli.main()
    return (time.perf_counter() - start) / plans


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plans", type=int, default=10)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tinytrain.config import run_mode

    plain = run_mode.plainly_a_run
    sides = {"composed twice (Hydra)": lambda _: False, "composed once": plain}
    times: dict[str, list[float]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as tmp:
        plan_seconds(1, tmp)  # imports, caches
        for _ in range(args.rounds):
            for name, decide in sides.items():
                run_mode.plainly_a_run = decide
                times[name].append(plan_seconds(args.plans, tmp))
    for name, values in times.items():
        print(f"{name:24s} {min(values):.3f} s per mode=plan (rounds: {', '.join(f'{v:.3f}' for v in values)})")
    print(f"ratio once / twice: {min(times['composed once']) / min(times['composed twice (Hydra)']):.2f}")


if __name__ == "__main__":
    main()
