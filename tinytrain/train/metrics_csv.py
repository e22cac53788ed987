"""metrics.csv that survives crashes and continues across resumes.

Lightning's CSVLogger deletes an existing metrics.csv when it starts (a resumed run would lose the
earlier segments' rows) and buffers 100 rows in memory (a killed run would lose them). This one
writes at every logging step, and on resume keeps the rows of the steps up to the checkpoint and
drops the rest (steps trained after the checkpoint by a run that was then killed, which the
resumed run trains and logs again).

Lightning logs optimizer step k, and the validation after it, with `step = k - 1`; a run resumed
from step N logs from step N on (it does not repeat the validation after step N).

Lightning writes a step's row only after every callback's on_train_batch_end, and the step
checkpoint is saved there: killed in between, the run would resume after the checkpoint without
the row of the step it ends with. `write_step_row_now` writes that row first (a guard that stops
the run writes its step's row the same way), and the logger then skips Lightning's copy of it.
"""

from __future__ import annotations

import csv
import logging
import os
from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from tinytrain.checkpoint.files import replace_csv
from tinytrain.model.module import writes_metrics_row

log = logging.getLogger(__name__)


def rows_to_keep(rows: list[dict], resume_step: int) -> list[dict]:
    """The rows of optimizer steps up to `resume_step` (logged as `step < resume_step`)."""
    return [r for r in rows if int(r["step"]) < resume_step]


def read_complete_rows(path: Path) -> tuple[list[str], list[dict]]:
    """The header and the whole rows of a metrics.csv. A process killed while writing leaves a
    last line without its newline (or without some fields): that row is dropped, since the
    resumed run trains and logs its step again."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        log.warning("metrics.csv: dropped a last line cut off by a crash: %r", lines[-1][:80])
        lines = lines[:-1]
    reader = csv.DictReader(lines)
    keys = list(reader.fieldnames or [])
    rows = [r for r in reader if None not in r and None not in r.values() and r.get("step", "").isdigit()]
    return keys, rows


def optimizer_step(row: dict) -> int:
    """A row's optimizer step as progress lines and checkpoint names count it, from 1: its `step`
    column is Lightning's, one less."""
    return int(row["step"]) + 1


def last_logged(path: Path, key: str) -> tuple[float | None, int | None]:
    """The last value of `key` in a metrics.csv and its optimizer_step; (None, None) where none was
    logged."""
    if not path.is_file():
        return None, None
    _, rows = read_complete_rows(path)
    found = [r for r in rows if r.get(key)]
    return (float(found[-1][key]), optimizer_step(found[-1])) if found else (None, None)


class ContinuedMetrics(ExperimentWriter):
    def __init__(self, log_dir: str, resume_step: int | None):
        self.resume_step = resume_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        # Called by the writer's __init__; Lightning's version deletes metrics.csv.
        path = Path(self.metrics_file_path)
        if self.resume_step is None or not path.is_file():
            super()._check_log_dir_exists()
            return
        keys, rows = read_complete_rows(path)
        replace_csv(path, keys, rows_to_keep(rows, self.resume_step))
        self.metrics_keys = sorted(keys)  # new keys later rewrite the header, old rows kept

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        """A new column (val_loss's first value): Lightning rewrote metrics.csv in place, and a full
        disk there left it empty (every earlier row lost). Written beside it and renamed over it."""
        path = Path(self.metrics_file_path)
        replace_csv(path, fieldnames, read_complete_rows(path)[1])


class ResumableCSVLogger(CSVLogger):
    def __init__(self, run_dir: Path, resume_step: int | None, stage: str = "main"):
        # name="" and version="": metrics.csv directly in the run directory.
        super().__init__(save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=1)
        self.resume_step = resume_step
        self.stage = stage  # trainer.stage: every row says which stage trained its step
        self.written_early: tuple[int | None, dict] | None = None  # the row write_step_row_now wrote

    @rank_zero_only
    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        if self.written_early == (step, metrics):
            self.written_early = None  # Lightning's own copy of the row written before the save
            return
        super().log_metrics({**metrics, "stage": self.stage}, step)

    def log_early(self, metrics: dict, step: int | None) -> None:
        self.log_metrics(metrics, step)
        self.save()  # on disk before the checkpoint is
        self.written_early = (step, dict(metrics))

    @property
    @rank_zero_experiment
    def experiment(self) -> ContinuedMetrics:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = ContinuedMetrics(self.log_dir, self.resume_step)
        return self._experiment


def write_step_row_now(trainer, force: bool = False, fresh: dict | None = None) -> None:
    """Write the current optimizer step's metrics row to metrics.csv now, not after the callbacks
    (see the module docstring). `force`: even off the logging interval (a guard stopping the run),
    with what this step measured: its loss and grad_norm (module.step_values), its lr and `fresh`
    (the guard's own values). Lightning's logged values off the interval are earlier rows' (its
    tokens_per_s, lr), so they are left out."""
    loggers = [lg for lg in trainer.loggers if isinstance(lg, ResumableCSVLogger)]
    connector = trainer._logger_connector
    on_interval = writes_metrics_row(trainer)
    if not loggers or not (force or on_interval):
        return
    metrics = connector.metrics["log"]
    if force and not on_interval:
        module = trainer.lightning_module
        schedulers = trainer.lr_scheduler_configs
        lr = {"lr": schedulers[0].scheduler.get_last_lr()[0]} if schedulers else {}
        metrics = {**getattr(module, "step_values", {}), **lr}
    if force:  # mid-step: the throughput of this step is not measured yet; the logged one is the last row's
        metrics = {k: v for k, v in metrics.items() if k not in ("tokens_per_s", "mfu")}
    metrics = {**metrics, **(fresh or {})}  # on the interval too: the step's grad_norm is logged after a guard's hook
    if not metrics:
        return
    everyone = trainer.loggers
    # Lightning's own conversion (tensors to numbers, the step, `epoch`), into the CSV logger alone.
    trainer.loggers = [_EarlyWriter(loggers[0])]
    try:
        connector.log_metrics(metrics)
    finally:
        trainer.loggers = everyone


class _EarlyWriter:
    """Passes Lightning's converted row to ResumableCSVLogger.log_early."""

    def __init__(self, logger: ResumableCSVLogger):
        self.logger = logger

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.logger.log_early(metrics, step)

    def save(self) -> None:
        pass
