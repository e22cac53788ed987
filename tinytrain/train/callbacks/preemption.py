"""SIGUSR1, SIGTERM and SIGINT: save a checkpoint at the next optimizer-step boundary, requeue on Slurm, stop.

SIGUSR1 is Slurm's warning before the time limit or a preemption (`#SBATCH --signal=USR1@90`):
checkpoint, `scontrol requeue` the job (rank 0), exit 75; the requeued job resumes from the
checkpoint (resume=auto, run directory from the job id). SIGTERM (scancel, the time limit itself,
`kill`) and SIGINT (Ctrl-C) save the same way and exit 75 without requeueing; if the save cannot
finish before SIGKILL, the atomic write leaves the previous checkpoint as it was. A second Ctrl-C
stops at once, without a checkpoint.

The handlers only set a flag: saving inside a signal handler would save in the middle of a step,
and collectives there can deadlock. At each optimizer-step boundary (after the data position has
counted the batch) all ranks agree whether any of them was signalled, since Slurm's signals reach
ranks at different steps; then every rank saves through the normal checkpoint path and the run
stops before the next batch. This replaces Lightning's SIGTERM handler for the duration of
training (it stops mid-accumulation and broadcasts inside the handler) and, with
`SLURMEnvironment(auto_requeue=False)` (slurm.py), its SIGUSR1 requeue.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import lightning.pytorch as pl

from tinytrain.cluster import slurm
from tinytrain.cluster.sbatch import SCRIPT_NAME
from tinytrain.cluster.signal_memory import SignalMemory
from tinytrain.errors import PREEMPTED_EXIT_CODE, Preempted, again_in
from tinytrain.train.callbacks.step_checkpoints import StepCheckpoints

log = logging.getLogger(__name__)


def requeue_failed(run_dir: Path, outcome: str) -> str:
    """What a job whose `scontrol requeue` failed is told: continue in its own run directory. Its
    run.name need not be slurm-<job>: mode=sbatch's jobs train into hydra.run.dir=<run dir>, and a
    resubmission named slurm-<job> started a fresh run elsewhere."""
    script = run_dir / SCRIPT_NAME
    how = f"resubmit its job script (sbatch {script})" if script.exists() else again_in(run_dir)
    return f"{outcome}; {how}: resume=auto continues from it"


class Preemption(pl.Callback):
    def __init__(self, run_dir: Path, memory: SignalMemory | None = None):
        """`memory`: the handler the run installed before its plan and data (cli.run_stages)."""
        self.run_dir = run_dir
        self.checkpoints: StepCheckpoints | None = None  # the trainer's, found when training starts
        self.memory = memory or SignalMemory()
        self.received = self.memory.received
        self.step_seen = 0
        self.asked_after_save = 0  # the last step whose checkpoint was followed by a stop check
        self.after_validation = False  # every rank agreed to stop at a step that validates: after it
        self.stop_message: str | None = None

    def install_early(self) -> None:
        self.memory.install_early()

    def on_train_start(self, trainer, pl_module):
        self.checkpoints = next(c for c in trainer.checkpoint_callbacks if isinstance(c, StepCheckpoints))
        self.step_seen = self.asked_after_save = trainer.global_step
        # After Lightning installed its handlers (register_signal_handlers); its teardown restores
        # the ones from before fit.
        self.memory.install([signal.SIGUSR1, signal.SIGTERM, signal.SIGINT])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step_seen:  # inside gradient accumulation
            return
        self.step_seen = trainer.global_step
        self.stop_if_signalled(trainer)

    def stop_if_signalled(self, trainer, validated: bool = False) -> None:
        """Whether any rank was signalled (one small all_reduce under DDP/FSDP/DeepSpeed; nothing on
        one process); if so, save this step's checkpoint (unless saved already) and set the stop.
        At a step that validates, the save waits for the validation (`validated`: it ran, or did
        not come), as a step checkpoint's does: a process killed between the two would leave a
        checkpoint whose step's validation row the resumed run never writes."""
        if not trainer.strategy.reduce_boolean_decision(bool(self.received), all=False):
            return
        step = trainer.global_step
        if trainer.max_steps > 0 and step >= trainer.max_steps:
            log.warning("%s at the last step (%d): finishing the run instead", self.what(), step)
            self.received.clear()
            return
        if not validated and self.checkpoints.validates_at(step):
            self.after_validation = True  # the same on every rank: the all_reduce above agreed
            return
        wants_requeue = trainer.strategy.reduce_boolean_decision("SIGUSR1" in self.received, all=False)
        path = self.checkpoints.save(trainer, row_written=validated)
        shown = path.relative_to(self.run_dir) if path.is_relative_to(self.run_dir) else path
        job = slurm.job_id()
        if wants_requeue and job:
            if trainer.is_global_zero:
                requeued, outcome = slurm.requeue(job)
                (log.info if requeued else log.error)("%s", outcome)
                then = "the requeued job resumes from it" if requeued else requeue_failed(self.run_dir, outcome)
            else:
                then = "requeue is rank 0's"
        else:
            then = f"resume with the same run directory ({self.run_dir}: run.name / hydra.run.dir), resume=auto"
        self.stop_message = f"tinytrain: {self.what()} at step {step}: checkpoint saved to {shown}; {then} (exit {PREEMPTED_EXIT_CODE})"

    def what(self) -> str:
        return " and ".join(dict.fromkeys(self.received)) or "a signal on another rank"

    def validation_ended(self, trainer) -> None:
        """SaveAfterValidation's hook: the step's validation is logged; its samples and evals follow."""
        if self.after_validation and not trainer.sanity_checking:
            self.after_validation = False
            self.stop_if_signalled(trainer, validated=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.after_validation:  # Lightning did not validate after all
            self.after_validation = False
            self.stop_if_signalled(trainer, validated=True)
        # A signal that came during the step's own checkpoint save (after on_train_batch_end asked:
        # Lightning runs checkpoint callbacks last) stops here, on that checkpoint, instead of
        # training a step more and saving again (the save Slurm's SIGKILL would land in).
        # Not under an async save (checkpoint.async_save): that save is still being written here;
        # the next step's save waits for it, as before.
        step = trainer.global_step
        written = not getattr(trainer.strategy, "async_save", False)
        if self.stop_message is None and written and self.checkpoints.last_saved_step == step != self.asked_after_save:
            self.asked_after_save = step
            self.stop_if_signalled(trainer, validated=True)  # a validation due at this step has run
        # Here and not right after the save: Lightning logs the step's metrics after
        # on_train_batch_end, and a validation due at this step runs in between (a resumed run
        # does not repeat it), so metrics.csv ends up as an uninterrupted run's.
        if self.stop_message is not None:
            raise Preempted(self.stop_message)


class SaveAfterValidation(pl.Callback):
    """Preemption's save at a step that validates, as soon as the validation is logged: placed
    before the samples and evals that run at validation's end (build_trainer), so a SIGKILL during
    those (Slurm's KillWait after SIGTERM) finds the checkpoint written."""

    def __init__(self, preemption: Preemption):
        self.preemption = preemption

    def on_validation_end(self, trainer, pl_module):
        self.preemption.validation_ended(trainer)

