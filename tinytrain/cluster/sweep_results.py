"""Hydra callback: what each multirun job returned, next to its results.

A job's return value is its final validation loss (what Hydra sweepers optimise). Each job writes
`result.json` in its directory: the overrides, `completed` or `failed`, `val_loss`, or the error.
This runs inside the job, so it works for any launcher (locally, or on Slurm through submitit).
After the last job the sweep's jobs are listed best first; a failed job makes Hydra raise its
error instead (tinytrain exits 2 or 3), and the `result.json` files hold the others' results.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

log = logging.getLogger("tinytrain")
RESULT_FILE = "result.json"


def job_result(job_return: JobReturn, job_num: int) -> dict:
    completed = job_return.status == JobStatus.COMPLETED
    # A failed job's return value is its exception; the public property would raise it.
    value = job_return._return_value
    return {
        "job": job_num,
        "overrides": list(job_return.overrides or []),
        "status": "completed" if completed else "failed",
        "val_loss": value if completed else None,
        "error": None if completed else f"{type(value).__name__}: {value}".splitlines()[0],
    }


def read_results(sweep_dir: Path) -> list[dict]:
    """Every job's result.json under a sweep directory, best validation loss first (failed and
    unvalidated jobs last)."""
    results = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{RESULT_FILE}")]
    return sorted(results, key=lambda r: (r["val_loss"] is None, r["val_loss"] or 0.0, r["job"]))


def render(results: list[dict]) -> str:
    lines = []
    for r in results:
        outcome = f"val_loss {r['val_loss']:.4f}" if r["val_loss"] is not None else r["error"] or "no validation ran"
        lines.append(f"  job {r['job']:<3} {outcome:<20} {' '.join(r['overrides'])}")
    return "\n".join(lines)


class SweepResults(Callback):
    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        result = job_result(job_return, config.hydra.job.num)
        Path(config.hydra.runtime.output_dir, RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n")
        log.info("multirun %s", render([result]).strip())

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        print(f"multirun {sweep_dir}, jobs best first:\n{render(read_results(sweep_dir))}", flush=True)
