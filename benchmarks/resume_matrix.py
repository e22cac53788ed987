"""Every saved -> resumed layout pair of issue 22's matrix, for real, on the CPU (run by hand: far
too slow for CI, whose tests cover the code paths: tests/unit/plan/test_layout_change.py plans
every pair, tests/integration/test_universal_resume.py and test_sharded_checkpoints.py resume
across layouts for real).

Layouts: single; ddp, zero1, zero2, zero3 (DeepSpeed on its CPU accelerator) and fsdp_tp tp1 at
world sizes 1, 2, 4; fsdp_tp tp2 at 2 and 4 (dp = world / tp); zero2 and zero3 with cp 2 (Ulysses,
dp = world / cp) at 2 and 4; `--offload` adds zero2_offload. With `--seq-len 256` (ring splits
128-token blocks: cp x 128 must divide it) also fsdp_tp_ring (torch's ring, tp 1 x cp 2) at 2 and 4
and fsdp_tp_tp2_ring (tp 2 x cp 2) at 4.

1. Each layout trains a tiny Llama (2 layers, hidden 64) for 4 steps, saving at steps 2 and 4.
2. Each pair: a copy of the saved run without its step-4 and final checkpoints is planned
   in-process under the resumed layout with resume=auto (the stages `python -m tinytrain` runs
   before anything is built). A ConfigError is a refusal: it must name both layouts and
   `checkpoint.init_from`. (`--cli-refusals` runs the CLI for them too: exit 2, no traceback.)
   A plan that resumes is run for real (`python -m tinytrain`, 2 more steps), and must exit 0,
   log loss at steps 3 and 4, and its step-3 loss (rank 0's, on the batch at the saved data
   position, with the restored weights) must equal the saved run's step-3 loss: bit-equal where
   the forward is computed the same way, else within `--tol` (a tp change splits the matmuls; a
   wrong batch or wrong weights differ by > 1e-2 here).

Cells: `exact` (step-3 loss bit-equal), `close <diff>` (within --tol), `refused` (in the plan,
naming both layouts and the fix), `FAILED <why>` (a traceback, a crash, another loss, a refusal
without the fix). The table is printed and written to `<dir>/resume_matrix.md` as cells finish.

    python benchmarks/resume_matrix.py [--worlds 1,2,4] [--only zero2,fsdp_tp_tp2] [--offload] [--seq-len 256] [--dir /tmp/resume-matrix]

Cells decided by an earlier run into the same --dir are kept (FAILED ones run again), so the
matrix can be filled in parts; `--table-only` prints what is decided.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import REPO, compose  # noqa: E402

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
RUN = [
    "experiment=smoke",
    *MODEL,
    "data.seq_len=32",
    "trainer.log_every_n_steps=1",
    "trainer.lr=1e-2",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "trainer.max_steps=4",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.val_every_n_steps=100",
    "trainer.export=false",
]
ON_CPU = ["parallel.deepspeed_on_cpu=true"]


@dataclass(frozen=True)
class Layout:
    name: str
    world: int
    options: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.name} w{self.world}"

    @property
    def overrides(self) -> list[str]:
        return [*self.options, f"cluster.devices={self.world}"]


# Ring's layouts and the world size each needs a multiple of (tp x cp).
RING = {
    "fsdp_tp_ring": (["parallel=fsdp_tp", "parallel.tp=1", "parallel.cp=2", "parallel.cp_kind=ring"], 2),
    "fsdp_tp_tp2_ring": (["parallel=fsdp_tp", "parallel.tp=2", "parallel.cp=2"], 4),
}
RING_UNIT = 256  # cp 2 x flex attention's 128-token blocks


def layouts(worlds: list[int], offload: bool, only: set[str] | None, seq_len: int = 32) -> list[Layout]:
    kinds = {
        "single": ["parallel=single"],
        "ddp": ["parallel=ddp"],
        "zero1": ["parallel=zero1", *ON_CPU],
        "zero2": ["parallel=zero2", *ON_CPU],
        "zero3": ["parallel=zero3", *ON_CPU],
        **({"zero2_offload": ["parallel=zero2_offload", *ON_CPU]} if offload else {}),
        "fsdp_tp_tp1": ["parallel=fsdp_tp", "parallel.tp=1"],
        "fsdp_tp_tp2": ["parallel=fsdp_tp", "parallel.tp=2"],
        # Context parallelism (Ulysses): a cp change is a data-layout change (dp alone orders the data)
        "zero2_cp2": ["parallel=zero2", *ON_CPU, "parallel.cp=2"],
        "zero3_cp2": ["parallel=zero3", *ON_CPU, "parallel.cp=2"],
        # Ring (torch's context parallel under fsdp_tp), where the sequence splits into its blocks
        **({name: options for name, (options, _) in RING.items()} if seq_len % RING_UNIT == 0 else {}),
    }
    out = []
    for world in worlds:  # the 4-rank saves last: the slowest
        for name, options in kinds.items():
            if only and name not in only:
                continue
            if (name == "single" and world != 1) or (name in ("fsdp_tp_tp2", "zero2_cp2", "zero3_cp2") and world % 2):
                continue
            if name in RING and world % RING[name][1]:
                continue
            out.append(Layout(name, world, tuple(options)))
    return out


def cli(args: list[str], run_dir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "TINYTRAIN_TRACEBACK")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "tinytrain", *args, f"hydra.run.dir={run_dir}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def losses(run_dir: Path) -> list[str]:
    import csv

    with open(run_dir / "metrics.csv", newline="") as f:
        return [r["loss"] for r in csv.DictReader(f) if r.get("loss")]


def save(layout: Layout, root: Path) -> tuple[Path | None, str]:
    """The saved run, trimmed to its step-2 checkpoint in `<root>/<label>/trimmed`."""
    full, trimmed = root / layout.label.replace(" ", "-") / "full", root / layout.label.replace(" ", "-") / "trimmed"
    if not (full / "checkpoints" / "step0000002.ckpt").exists():
        shutil.rmtree(full, ignore_errors=True)
        r = cli([*RUN, *layout.overrides], full)
        if r.returncode != 0:
            return None, f"FAILED to train: exit {r.returncode}: {tail(r)}"
    shutil.rmtree(trimmed, ignore_errors=True)
    shutil.copytree(full, trimmed)
    for later in ("step0000004.ckpt", "final.ckpt", "final.consolidated.ckpt"):
        path = trimmed / "checkpoints" / later
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return trimmed, ""


def tail(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-400:]


def plan_refusal(saved: Layout, run: Layout, run_dir: Path) -> str | None:
    """The plan's refusal of resuming run_dir's checkpoint under `run`, planned in-process as the
    CLI does; None when it resumes."""
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.errors import ConfigError
    from tinytrain.plan.planner import make_plan
    from tinytrain.plan.validate import validate

    cfg = compose([*RUN, *run.overrides, "resume=auto"])
    try:
        validate(cfg)
        tokenizer = load_from_config(cfg.tokenizer)
        make_plan(cfg, tokenizer, run_dir)  # the BOS decision is made there
    except ConfigError as e:
        return str(e)
    return None


def resume(saved: Layout, run: Layout, trimmed: Path, root: Path, tol: float, cli_refusals: bool) -> str:
    refused = plan_refusal(saved, run, trimmed)
    if refused is not None:
        if "checkpoint.init_from" not in refused or "this run is" not in refused:
            return f"FAILED refusal without both layouts and the fix: {refused[:200]}"
        if cli_refusals:
            r = cli([*RUN, *run.overrides, "resume=auto"], trimmed)
            if r.returncode != 2 or "Traceback" in r.stdout + r.stderr:
                return f"FAILED CLI refusal: exit {r.returncode}: {tail(r)}"
        return "refused"
    run_dir = root / "resumed" / f"{saved.label}--{run.label}".replace(" ", "-")
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(trimmed, run_dir)
    r = cli([*RUN, *run.overrides, "resume=auto"], run_dir)
    out = r.stdout + r.stderr
    if r.returncode != 0 or "Traceback" in out:
        return f"FAILED exit {r.returncode}: {tail(r)}"
    before, after = losses(trimmed.parent / "full"), losses(run_dir)
    if len(after) != 4 or after[:2] != before[:2]:
        return f"FAILED losses {after} (saved {before})"
    if after[2] == before[2]:
        return "exact"
    diff = abs(float(after[2]) - float(before[2]))
    return f"close {diff:.1e}" if diff <= tol else f"FAILED step-3 loss {after[2]} != {before[2]}"


def table(rows: list[Layout], cols: list[Layout], cells: dict) -> str:
    head = "| saved \\ resumed | " + " | ".join(c.label for c in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    for s in rows:
        lines.append(f"| {s.label} | " + " | ".join(cells.get((s.label, c.label), "") for c in cols) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default="1,2,4")
    p.add_argument("--only", default="", help="comma-separated layout names (single, ddp, zero1, zero2, zero3, zero2_offload, fsdp_tp_tp1, fsdp_tp_tp2, zero2_cp2, zero3_cp2, fsdp_tp_ring, fsdp_tp_tp2_ring)")
    p.add_argument("--offload", action="store_true", help="add zero2_offload (builds DeepSpeed's CPU Adam on first use)")
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--seq-len", type=int, default=32, help=f"data.seq_len of every run; a multiple of {RING_UNIT} adds ring's layouts")
    p.add_argument("--cli-refusals", action="store_true", help="also run the CLI for each refused pair (exit 2, no traceback)")
    p.add_argument("--dir", default="/tmp/resume-matrix")
    p.add_argument("--table-only", action="store_true", help="print the table of the cells decided so far in --dir (blank: not run), run nothing")
    a = p.parse_args()
    root = Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    RUN[RUN.index("data.seq_len=32")] = f"data.seq_len={a.seq_len}"
    all_layouts = layouts([int(w) for w in a.worlds.split(",")], a.offload, set(a.only.split(",")) - {""} or None, a.seq_len)
    if a.table_only:
        decided = json.loads((root / "resume_matrix.json").read_text())
        print(table(all_layouts, all_layouts, {tuple(k.split(" -> ")): v for k, v in decided.items()}))
        return
    # Cells already decided by an earlier run into the same --dir are kept (FAILED ones run again).
    done_file = root / "resume_matrix.json"
    done = {k: v for k, v in json.loads(done_file.read_text()).items() if not v.startswith("FAILED")} if done_file.exists() else {}
    cells: dict = {}
    started = time.time()
    for saved in all_layouts:
        trimmed, failed = save(saved, root)
        for run in all_layouts:
            t = time.time()
            key = f"{saved.label} -> {run.label}"
            cell = done.get(key) or failed or resume(saved, run, trimmed, root, a.tol, a.cli_refusals)
            cells[(saved.label, run.label)] = done[key] = cell
            print(f"{saved.label:>16} -> {run.label:<16} {cell}  ({time.time() - t:.0f} s)", flush=True)
            (root / "resume_matrix.md").write_text(table(all_layouts, all_layouts, cells) + "\n")
            done_file.write_text(json.dumps(done, indent=1))
    counts = {k: sum(c.split()[0] == k for c in cells.values()) for k in ("exact", "close", "refused", "FAILED")}
    print(table(all_layouts, all_layouts, cells))
    print(f"{len(cells)} pairs: {counts} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
