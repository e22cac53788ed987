"""Resuming under another layout: the checkpoint's layout (strategy, data-parallel size, tp, ZeRO
stage, on-disk format) against the run's, decided while planning, before anything is built.

A checkpoint records its layout in its tinytrain metadata (`layout`); one saved before it did is
read from the disk (a file, DeepSpeed's folder and its optimizer partitions, a sharded folder and
its ranks). What resumes:

- a file (single, ddp; fsdp_tp before it saved sharded) under single, ddp or fsdp_tp, any world
  size and tp: the full tensors are re-padded for the run (weights and Adam moments);
- a sharded fsdp_tp folder under fsdp_tp, any dp and tp (DCP reshards; the vocab rows of weights
  and moments are re-padded when the padding changed);
- a DeepSpeed folder under DeepSpeed with the same ZeRO family (1 <-> 2, or 3); on another
  data-parallel size it is first converted to DeepSpeed's universal checkpoint (`converts`,
  checkpoint/universal.py) and loaded with `load_universal` (not under trainer.optimizer=muon:
  DeepSpeed's conversion has no Muon momentum, refused by plan/optimizer.py `resume_problem`).

Everything else is refused, naming both layouts and the fix: DeepSpeed <-> the others, a sharded folder under single/ddp, a ZeRO stage change. Weights alone cross any layout:
`checkpoint.init_from=` starts a new run from them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from tinytrain.checkpoint import formats
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.parallel import STRATEGIES, CheckpointFormat, strategy_row


@dataclass(frozen=True)
class Layout:
    format: str  # file | deepspeed | sharded
    strategy: str  # single | ddp | deepspeed | fsdp_tp | unknown (a file saved before layouts were recorded)
    world: int
    dp: int
    tp: int
    zero_stage: int = 0

    def describe(self) -> str:
        if self.format == "deepspeed":
            return f"DeepSpeed ZeRO-{self.zero_stage} over {self.dp} data-parallel rank(s)"
        if self.format == "sharded":
            return f"fsdp_tp sharded over {self.world} rank(s) (tp {self.tp} x dp {self.dp})"
        who = "single/ddp" if self.strategy == "unknown" else self.strategy
        return f"{who} full-tensor file (tp {self.tp})"

    def to_dict(self) -> dict:
        return asdict(self)


def run_layout(strategy: str, world: int, dp: int, tp: int, zero_stage: int, cp: int = 1) -> Layout:
    """`cp`: context parallelism. DeepSpeed partitions over every rank of a cp group too (it sees
    them as data-parallel), so its layout's dp is dp x cp: a cp change is then a partition-count
    change, converted like a dp change; the data stream depends on dp alone."""
    row = strategy_row(strategy)
    return Layout(row.checkpoint_format.value, row.strategy.value, world, dp * cp if row.deepspeed else dp, tp, zero_stage if row.deepspeed else 0)


def saved_layout(path: Path, state: dict) -> Layout:
    """The layout a checkpoint was saved under: its metadata's, else read from the disk by its
    format's row (checkpoint/formats.py)."""
    return Layout(**formats.saved_layout(path, state))


def weights_only(path: str = "<this checkpoint>", resume: str | None = None) -> str:
    """The fix that starts a new run from a checkpoint's weights: `resume` the value the user gave
    (resume=<path>), which must go, since a resume takes precedence over checkpoint.init_from."""
    dropped = f" without resume={resume} (a resume takes precedence over checkpoint.init_from)" if resume else ""
    return f"or start a new run from its weights only: run.name=<new> checkpoint.init_from={path}{dropped}"


def refusal(saved: Layout, run: Layout, *, path: str = "<this checkpoint>", resume: str | None = None, parallel: str | None = None) -> tuple[str, str] | None:
    """(why, fix) when a run of layout `run` cannot resume a checkpoint of layout `saved`; None
    when it can. Which formats a strategy loads is its row's `resumable_from` (plan/parallel.py);
    within DeepSpeed's format, the ZeRO family must match too (another dp size `converts`).
    `parallel`: the run's parallel option (zero2, not its strategy deepspeed); `path`, `resume`:
    the checkpoint and the resume value the user gave (weights_only)."""
    weights = weights_only(path, resume)
    parallel = parallel or run.strategy
    fmt = CheckpointFormat(saved.format)
    if fmt not in strategy_row(run.strategy).resumable_from:
        readers = [s.value for s, row in STRATEGIES.items() if fmt in row.resumable_from]
        if fmt is CheckpointFormat.deepspeed:
            return (f"parallel={parallel} cannot load DeepSpeed's optimizer partitions", f"resume with parallel=zero{saved.zero_stage}, {weights}")
        what = "a sharded fsdp_tp checkpoint" if fmt is CheckpointFormat.sharded else "the optimizer state of a full-tensor file"
        return (f"parallel={parallel} cannot load {what}", f"resume with parallel={' or '.join(readers)} (any world size and tp), {weights}")
    if fmt is not CheckpointFormat.deepspeed:
        return None
    if run.zero_stage != saved.zero_stage and 3 in (run.zero_stage, saved.zero_stage):
        return (f"ZeRO-{saved.zero_stage} partitions do not load under ZeRO-{run.zero_stage}", f"resume with parallel=zero{saved.zero_stage}, {weights}")
    return None


def check_layout(path: Path, state: dict, run: Layout, *, resume: str | None = None, parallel: str | None = None) -> Layout:
    """The checkpoint's layout; raises ConfigError (`resume`) naming both layouts and the fix
    (`resume`, `parallel`: as refusal's)."""
    saved = saved_layout(path, state)
    refused = refusal(saved, run, path=str(path), resume=resume, parallel=parallel)
    if refused:
        why, fix = refused
        raise ConfigError(Problem("resume", str(path), f"saved as {saved.describe()}; this run is {run.describe()}: {why}", fix))
    return saved


def converts(saved: Layout, run: Layout) -> bool:
    """Whether resuming goes through DeepSpeed's universal checkpoint: a DeepSpeed folder whose
    optimizer partitions are cut for another number of data-parallel ranks."""
    return saved.format == "deepspeed" and run.format == "deepspeed" and saved.dp != run.dp


def repads(saved: Layout, run: Layout) -> bool:
    """Whether this change can re-pad the vocab rows of weights and optimizer state (a padding
    change is refused where it cannot)."""
    return saved.format in ("file", "sharded") and run.format in ("file", "sharded")
