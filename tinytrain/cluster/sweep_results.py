"""Hydra callback: what each multirun job returned, next to its results.

A job's return value is its final validation loss (what Hydra sweepers optimise). Each job writes
`result.json` in its directory: the overrides, `completed` or `failed`, `val_loss`, or the error.
This runs inside the job, so it works for any launcher (locally, or on Slurm through submitit).
After the last job the sweep's jobs are listed best first; a failed job makes Hydra raise its
error instead (tinytrain exits 2 or 3), and the `result.json` files hold the others' results.

A job's directory is claimed when it starts (`result.json` says `running`, with the multirun's
id): resume=auto would otherwise continue whatever run it finds there as this job's, silently: a
hydra.sweep.subdir without the job number gave every job one directory (job 1 resumed job 0 and
reported its loss as its own), and a second multirun under the same run.name resumed the first's
jobs under its own learning rates. The list at the end holds this multirun's jobs only.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from tinytrain.errors import ConfigError, Problem

log = logging.getLogger("tinytrain")
RESULT_FILE = "result.json"
SWEEP_FILE = ".tinytrain-multirun"  # in the sweep directory: this multirun's id, read by its jobs wherever they run


def multirun_id(sweep_dir: Path) -> str | None:
    try:
        return (sweep_dir / SWEEP_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def claim(job_dir: Path, sweep_dir: Path, job_num: int, overrides: list[str], subdir: str) -> dict:
    """The `running` record of this job, once its directory is known to hold no other job's run."""
    this = multirun_id(sweep_dir)
    try:
        earlier = json.loads((job_dir / RESULT_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        earlier = None
    if earlier is not None:
        same_multirun = earlier.get("sweep") == this
        if same_multirun and earlier.get("job") != job_num:
            raise ConfigError(Problem("hydra.sweep.subdir", subdir, f"puts jobs {earlier.get('job')} and {job_num} of this multirun in one directory, {job_dir}: job {job_num} would resume job {earlier.get('job')}'s run as its own", "give every job its own directory: keep ${hydra.job.num} in hydra.sweep.subdir"))
        if not same_multirun and sorted(earlier.get("overrides") or []) != sorted(overrides):
            raise ConfigError(
                Problem(
                    "hydra.sweep.dir",
                    str(sweep_dir),
                    f"holds an earlier multirun: {job_dir} is its job {earlier.get('job')} ({' '.join(earlier.get('overrides') or [])}), which this job ({' '.join(overrides)}) would take over (resume=auto continues the run it finds there)",
                    "name this multirun anew (run.name=<new>), or run the earlier multirun's command again to continue its jobs",
                )
            )
    return {"sweep": this, "job": job_num, "overrides": overrides, "status": "running", "val_loss": None, "error": None}


def job_result(job_return: JobReturn, job_num: int, sweep: str | None = None) -> dict:
    completed = job_return.status == JobStatus.COMPLETED
    # A failed job's return value is its exception; the public property would raise it.
    value = job_return._return_value
    return {
        "sweep": sweep,
        "job": job_num,
        "overrides": list(job_return.overrides or []),
        "status": "completed" if completed else "failed",
        "val_loss": value if completed else None,
        "error": None if completed else f"{type(value).__name__}: {value}".splitlines()[0],
    }


def read_results(sweep_dir: Path) -> list[dict]:
    """This multirun's jobs' result.json under its sweep directory (at any depth: a
    hydra.sweep.subdir may nest), best validation loss first (failed and unvalidated jobs last)."""
    this = multirun_id(sweep_dir)
    results = []
    for path in sweep_dir.rglob(RESULT_FILE):
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if result.get("sweep") == this:
            results.append(result)
    return sorted(results, key=lambda r: (r["val_loss"] is None, r["val_loss"] or 0.0, r["job"]))


def render(results: list[dict]) -> str:
    lines = []
    for r in results:
        outcome = f"val_loss {r['val_loss']:.4f}" if r["val_loss"] is not None else r["error"] or "no validation ran"
        lines.append(f"  job {r['job']:<3} {outcome:<20} {' '.join(r['overrides'])}")
    return "\n".join(lines)


class SweepResults(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        try:
            sweep_dir = Path(config.hydra.sweep.dir)
        except InterpolationResolutionError:
            return  # refused next where the sweeper resolves it (a run.name that leaves run.root)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / SWEEP_FILE).write_text(uuid.uuid4().hex + "\n")

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        # Only training continues what it finds in its directory (an eval of each job's checkpoint
        # runs in the training multirun's job directories on purpose).
        mode = OmegaConf.select(config, "mode", default="train")
        if config.hydra.mode != RunMode.MULTIRUN or getattr(mode, "value", mode) != "train":
            return
        hydra = config.hydra
        overrides = [str(o) for o in OmegaConf.to_container(hydra.overrides.task, resolve=False)]
        subdir = str(OmegaConf.select(config, "hydra.sweep.subdir", default=""))
        try:
            record = claim(Path(hydra.runtime.output_dir), Path(hydra.sweep.dir), hydra.job.num, overrides, subdir)
        except ConfigError as e:
            # Hydra turns an exception in a callback into a warning and runs the job anyway (its
            # Callbacks._notify): stop the multirun here as the CLI stops on a ConfigError, exit 2.
            print(e.render(), file=sys.stderr, flush=True)
            sys.exit(2)
        Path(hydra.runtime.output_dir, RESULT_FILE).write_text(json.dumps(record, indent=2) + "\n")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        result = job_result(job_return, config.hydra.job.num, multirun_id(Path(config.hydra.sweep.dir)))
        Path(config.hydra.runtime.output_dir, RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n")
        log.info("multirun %s", render([result]).strip())

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        print(f"multirun {sweep_dir}, jobs best first:\n{render(read_results(sweep_dir))}", flush=True)
