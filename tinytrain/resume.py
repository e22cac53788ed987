"""`resume`: the checkpoint a run continues from, decided before the model is built.

auto    the newest complete step checkpoint in `<run dir>/checkpoints` (a requeued job continues
        where it stopped), else a fresh start. Saves are atomic, so a file with a step name is
        complete; one that still does not load (a disk that filled up, a copy cut short) is
        skipped for the one before it, and the log says why. None loading is an error.
never   a fresh start; refused where the run directory already holds step checkpoints, because
        the new run's saves and pruning would mix with the old run's.
<path>  that checkpoint (an older one of this run, or another run's, continued here).

Lightning restores everything from it (weights, optimizer, scheduler, loss scale, loop counters)
plus tinytrain's callbacks: data position and RNG. Temp files of saves that were cut short are
removed here (`leftover_temp_files`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from tinytrain.checkpoint import check_resumable, read
from tinytrain.checkpoint_files import is_temp, remove, step_checkpoints
from tinytrain.errors import ConfigError, Problem
from tinytrain.safe_load import check_deepspeed_folder, deepspeed_globals, load_file
from tinytrain.vocab import VocabPlan

log = logging.getLogger(__name__)

AUTO, NEVER = "auto", "never"
# DeepSpeed saves a folder (Lightning's tag "checkpoint"); its client state (step, tinytrain
# metadata) is in rank 0's model-states file: one per model-parallel rank under ZeRO-1/2, one
# per data-parallel rank under ZeRO-3.
DEEPSPEED_STATE_FILES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    step: int
    how: str  # "resume=auto" or "resume=<path>"
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # newer checkpoints that did not load, and why

    def describe(self, run_dir: Path) -> str:
        shown = self.path.relative_to(run_dir) if self.path.is_relative_to(run_dir) else self.path
        return f"resuming from {shown} (step {self.step})"

    def to_dict(self) -> dict:
        return {"path": str(self.path), "step": self.step, "how": self.how, "skipped": [f"{p.name}: {why}" for p, why in self.skipped]}


def read_state(path: Path, key: str = "resume") -> dict:
    """The checkpoint's top-level dict (global_step, tinytrain metadata, ...), memory-mapped and
    read without running code from it; a DeepSpeed folder has each file checked first, since
    DeepSpeed's own loader unpickles anything."""
    if path.is_dir():
        check_deepspeed_folder(path, key)
        return load_file(deepspeed_state_file(path), key, deepspeed_globals())
    return read(str(path), key)


def deepspeed_state_file(folder: Path) -> Path:
    """The file of a DeepSpeed checkpoint folder that holds its client state (the first
    candidate when none exists, so the error names a file that should be there)."""
    candidates = [folder / "checkpoint" / name for name in DEEPSPEED_STATE_FILES]
    return next((c for c in candidates if c.is_file()), candidates[0])


def newest_loadable(directory: Path) -> tuple[Path, dict, list[tuple[Path, str]]] | None:
    """The newest step checkpoint that loads, its state, and the newer ones that did not."""
    skipped = []
    for _, path in step_checkpoints(directory):
        try:
            return path, read_state(path), skipped
        except ConfigError as e:
            why = e.problems[0].message
            log.warning("resume=auto: %s does not load (%s); trying the one before", path.name, why)
            skipped.append((path, why))
    if skipped:
        # Starting over would silently throw the run away; this needs a person.
        raise ConfigError(
            Problem(
                "resume",
                AUTO,
                f"no step checkpoint in {directory} loads ({skipped[0][0].name}: {skipped[0][1]})",
                "point resume=<path> at a checkpoint that loads, or start over in a new directory (run.name=<new>)",
            )
        )
    return None


def resolve_resume(value: str, checkpoint_dir: Path, vocab: VocabPlan, fingerprint: str, model_name: str, shape=None) -> ResumePoint | None:
    """Which checkpoint this run continues from (None: a fresh start). Raises ConfigError naming `resume`."""
    existing = step_checkpoints(checkpoint_dir)
    if value == NEVER:
        if existing:
            raise ConfigError(
                Problem(
                    "resume",
                    value,
                    f"{checkpoint_dir} already holds checkpoints of an earlier run (newest {existing[0][1].name}); a fresh start there would mix the two runs",
                    "give the new run its own directory (run.name=<new> or hydra.run.dir=<new>), delete that folder, or continue it with resume=auto",
                )
            )
        return None
    if value == AUTO:
        found = newest_loadable(checkpoint_dir)
        if found is None:
            return None
        path, ckpt, skipped = found
        how = "resume=auto"
    else:
        path = Path(value).absolute()
        ckpt, skipped, how = read_state(path), [], f"resume={value}"
    check_resumable(ckpt, str(path), vocab, fingerprint, model_name, shape)
    step = int(ckpt["global_step"])
    unreadable = {p for p, _ in skipped}
    newer = [p.name for s, p in existing if s > step and p != path and p not in unreadable]
    if newer:
        raise ConfigError(
            Problem(
                "resume",
                value,
                f"continues from step {step}, but {checkpoint_dir} holds later checkpoints ({', '.join(sorted(newer))}) that this run's saves would mix with",
                "move those checkpoints away (or delete them), or continue in a new directory: run.name=<new>",
            )
        )
    return ResumePoint(path, step, how, skipped)


def set_aside(unreadable: list[tuple[Path, str]]) -> list[Path]:
    """Rename checkpoints that did not load out of the step-name pattern (kept for inspection), so
    neither pruning nor a later resume mistakes them for this run's newest."""
    moved = []
    for path, _ in unreadable:
        target = path.with_name(path.name + ".unreadable")
        if path.exists():
            path.replace(target)
            moved.append(target)
    return moved


def leftover_temp_files(checkpoint_dir: Path) -> list[Path]:
    """Remove the temp files (or DeepSpeed temp folders) of saves a killed process never finished."""
    if not checkpoint_dir.is_dir():
        return []
    removed = []
    for path in sorted(p for p in checkpoint_dir.iterdir() if is_temp(p)):
        remove(path)
        removed.append(path)
    return removed
