"""Hydra callback: what each multirun job returned, next to its results.

A job's return value is its final validation loss (what Hydra sweepers optimise). Each job writes
`result.json` in its directory: the overrides, `completed` or `failed`, `val_loss`, or the error.
This runs inside the job, so it works for any launcher (locally, or on Slurm through submitit).
After the last job the sweep's jobs are listed best first; a failed job makes Hydra raise its
error instead (tinytrain exits 2 or 3), and the `result.json` files hold the others' results.

A training job claims its directory once it holds the run lock (`result.json` says `running`, with
the multirun's id): resume=auto would otherwise continue whatever run it finds there as this
job's, silently: a hydra.sweep.subdir without the job number gave every job one directory (job 1
resumed job 0 and reported its loss as its own), and a second multirun under the same run.name
resumed the first's jobs under its own learning rates. The id lives on this callback, which
Hydra's launchers carry into each job (submitit pickles it). Other modes (an eval of each job's
checkpoint, a plan) write `result-<mode>.json` and never take a training job's record. The list
at the end holds this multirun's jobs only.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from tinytrain.cluster.trained_run import holds_checkpoints
from tinytrain.errors import ConfigError, Problem

log = logging.getLogger("tinytrain")
RESULT_FILE = "result.json"
# This process's multirun job, set as it starts (on_job_start, then the task function runs).
JOB: dict = {}
# What a job may change and still continue its earlier run (a sweep extended to more steps).
CONTINUABLE_KEYS = ("trainer.max_steps", "trainer.progress_bar", "data.num_workers")


def result_file(mode: str) -> str:
    return RESULT_FILE if mode == "train" else f"result-{mode}.json"


class DirectoryTaken(ConfigError):
    """A multirun training job's directory holds another job's run."""


def claim(job_dir: Path, overrides: list[str], subdir: str, sweep_dir: Path) -> None:
    """Rank 0 of a multirun's training job, holding the run lock: write its `running` record, once
    the directory is known to hold no other job's run."""
    this, job_num = JOB.get("sweep"), JOB.get("job")
    if this is None:  # not started by a multirun of this callback
        return
    try:
        earlier = json.loads((job_dir / RESULT_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        earlier = None
    # A failed job's directory holds no checkpoints.
    if earlier is not None and record_mode(earlier) == "train" and holds_checkpoints(job_dir):
        if earlier.get("sweep") == this and earlier.get("job") != job_num:
            raise DirectoryTaken(Problem("hydra.sweep.subdir", subdir, f"puts jobs {earlier.get('job')} and {job_num} of this multirun in one directory, {job_dir}: job {job_num} would resume job {earlier.get('job')}'s run as its own", "give every job its own directory: keep ${hydra.job.num} in hydra.sweep.subdir"))
        if earlier.get("sweep") != this and identity(earlier.get("overrides") or []) != identity(overrides):
            raise DirectoryTaken(
                Problem(
                    "hydra.sweep.dir",
                    str(sweep_dir),
                    f"holds an earlier multirun: {job_dir} is its job {earlier.get('job')} ({' '.join(earlier.get('overrides') or [])}), which this job ({' '.join(overrides)}) would take over (resume=auto continues the run it finds there)",
                    f"name this multirun anew (run.name=<new>), or run the earlier multirun's command again to continue its jobs (changing at most {', '.join(CONTINUABLE_KEYS)})",
                )
            )
    record = {"sweep": this, "mode": "train", "job": job_num, "overrides": overrides, "status": "running", "val_loss": None, "error": None}
    (job_dir / RESULT_FILE).write_text(json.dumps(record, indent=2) + "\n")
    JOB["claimed"] = True


def record_mode(record: dict) -> str:
    """The mode of a job's record. Records of tinytrain before multirun ids carry no mode (nor an
    id), and every mode wrote result.json then: its overrides' mode=, train where none is given."""
    if "mode" in record:
        return str(record["mode"])
    given = [o.split("=", 1)[1] for o in record.get("overrides") or [] if str(o).lstrip("+").startswith("mode=")]
    return given[-1] if given else "train"


def identity(overrides: list[str]) -> list[str]:
    return sorted(o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in CONTINUABLE_KEYS)


def job_result(job_return: JobReturn, job_num: int, sweep: str | None = None, mode: str = "train") -> dict:
    completed = job_return.status == JobStatus.COMPLETED
    # A failed job's return value is its exception; the public property would raise it.
    value = job_return._return_value
    return {
        "sweep": sweep,
        "mode": mode,
        "job": job_num,
        "overrides": list(job_return.overrides or []),
        "status": "completed" if completed else "failed",
        "val_loss": value if completed else None,
        "error": None if completed else f"{type(value).__name__}: {value}".splitlines()[0],
    }


def read_results(sweep_dir: Path, sweep: str | None = None) -> list[dict]:
    """The jobs' result files under a sweep directory (at any depth: a hydra.sweep.subdir may
    nest), this multirun's only where its id is given, best validation loss first (failed and
    unvalidated jobs last)."""
    results = []
    for path in sweep_dir.rglob("result*.json"):
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(result, dict) and "job" in result and (sweep is None or result.get("sweep") == sweep):
            results.append(result)
    return sorted(results, key=lambda r: (r.get("val_loss") is None, r.get("val_loss") or 0.0, r["job"]))


def render(results: list[dict]) -> str:
    lines = []
    for r in results:
        mode = record_mode(r)
        if r["val_loss"] is not None:
            outcome = f"{'val_loss' if mode == 'train' else mode + ' loss'} {r['val_loss']:.4f}"
        else:
            outcome = r["error"] or ("no validation ran" if mode == "train" else f"{mode} {r['status']}")
        lines.append(f"  job {r['job']:<3} {outcome:<20} {' '.join(r['overrides'])}")
    return "\n".join(lines)


class SweepResults(Callback):
    def __init__(self) -> None:
        self.sweep: str | None = None  # this multirun's id, set where it starts

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.sweep = uuid.uuid4().hex

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        JOB.clear()
        if config.hydra.mode == RunMode.MULTIRUN:
            JOB.update(sweep=self.sweep, job=config.hydra.job.num)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        mode = OmegaConf.select(config, "mode", default="train")
        result = job_result(job_return, config.hydra.job.num, self.sweep, str(getattr(mode, "value", mode)))
        # A training job refused before its claim (the run lock held by the job running there, a
        # bad key, DirectoryTaken) leaves the record it found: only its own goes over one.
        if result["mode"] == "train" and not JOB.get("claimed") and Path(config.hydra.runtime.output_dir, RESULT_FILE).exists():
            return
        Path(config.hydra.runtime.output_dir, result_file(result["mode"])).write_text(json.dumps(result, indent=2) + "\n")
        log.info("multirun %s", render([result]).strip())

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        print(f"multirun {sweep_dir}, jobs best first:\n{render(read_results(sweep_dir, self.sweep))}", flush=True)
