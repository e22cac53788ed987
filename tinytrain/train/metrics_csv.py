"""metrics.csv that survives crashes and continues across resumes.

Lightning's CSVLogger deletes an existing metrics.csv when it starts (a resumed run would lose the
earlier segments' rows) and buffers 100 rows in memory (a killed run would lose them). This one
writes at every logging step, and on resume keeps the rows of the steps up to the checkpoint and
drops the rest (steps trained after the checkpoint by a run that was then killed, which the
resumed run trains and logs again).

Lightning logs optimizer step k, and the validation after it, with `step = k - 1`; a run resumed
from step N logs from step N on (it does not repeat the validation after step N).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from tinytrain.checkpoint.files import temp_path


def rows_to_keep(rows: list[dict], resume_step: int) -> list[dict]:
    """The rows of optimizer steps up to `resume_step` (logged as `step < resume_step`)."""
    return [r for r in rows if int(r["step"]) < resume_step]


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
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            keys = list(reader.fieldnames or [])
            rows = rows_to_keep(list(reader), self.resume_step)
        tmp = temp_path(path)
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)
        self.metrics_keys = sorted(keys)  # new keys later rewrite the header, old rows kept


class ResumableCSVLogger(CSVLogger):
    def __init__(self, run_dir: Path, resume_step: int | None):
        # name="" and version="": metrics.csv directly in the run directory.
        super().__init__(save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=1)
        self.resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ContinuedMetrics:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = ContinuedMetrics(self.log_dir, self.resume_step)
        return self._experiment
