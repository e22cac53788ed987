"""A run's data, built once: at the first stage that needs it, from the plan's batch and BOS decision.

A mixture's plan table is read from its data as training builds it, so planning builds a mixture's
data; any other run's data is built after planning, so configuration problems are reported before
any tokenizing. Both read the same DataModule: each source is tokenized once per run.
"""

from __future__ import annotations

from tinytrain.data.bos_policy import BosDecision, with_bos
from tinytrain.data.datamodule import DataModule


def step_keys(trainer_cfg) -> tuple[str, ...]:
    """The keys the user set that size an optimizer step (trainer.global_batch_size and
    trainer.accumulate_grad_batches, as given): a refusal of the step's size names them."""
    given = (("trainer.global_batch_size", trainer_cfg.global_batch_size), ("trainer.accumulate_grad_batches", trainer_cfg.accumulate_grad_batches))
    return tuple(key for key, value in given if value is not None) or ("trainer.global_batch_size",)


class RunData:
    def __init__(self, data_cfg, tokenizer, bos: BosDecision, *, seed: int, progress: bool = True, step_keys: tuple[str, ...] = ("trainer.global_batch_size",)):
        """`step_keys`: the keys the user set that size a step (step_keys above)."""
        self.settings = with_bos(data_cfg, bos.add)
        self.step_keys = step_keys
        self.tokenizer = tokenizer
        self.seed = seed
        self.progress = progress
        self._built: tuple | None = None  # (batch, DataModule)

    def build(self, batch) -> DataModule:
        """The DataModule for `batch` (the plan's BatchPlan: micro batch, data-parallel size, global batch)."""
        if self._built is None:
            data = DataModule(
                self.settings,
                self.tokenizer,
                batch.micro_batch_size,
                self.seed,
                progress=self.progress,
                data_parallel=batch.data_parallel,
                samples_per_step=batch.global_batch_size,
                ramp=batch.ramp,
                step_keys=self.step_keys,
            )
            self._built = (batch, data)
        elif self._built[0] != batch:  # the planner and training read one BatchPlan
            raise RuntimeError(f"the run's data was built for {self._built[0]}, now asked for {batch}")
        return self._built[1]
