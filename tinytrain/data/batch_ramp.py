"""trainer.batch_size_warmup: the global batch grows from `start` to the configured one (Megatron's
rampup_batch_size), a pure function of the optimizer step.

As in Megatron the batch grows in equal increments, each held for an equal share of the warm-up's
samples: batch = min(final, start + floor(consumed / per_increment) x increment), `consumed` the
samples trained before the step. The increment is one sample per micro batch (data_parallel x
accumulate_grad_batches): the ramp grows the micro batch, not the number of micro batches, so
Lightning's and DeepSpeed's accumulation stay fixed and a step's micro batches are all one size
(their losses average as in a step of the final batch). Activation memory is planned at the final
micro batch, the largest.

The learning-rate schedule is kept in tokens: step k trains at the rate a run of final batches
would have after the same number of tokens (`equivalent_step`), so warmup_steps and a decay mean
the same tokens with or without the ramp. Pure: no torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchRamp:
    start: int  # global batch (sequences) of the first step
    final: int  # trainer's global batch
    increment: int  # data_parallel x accumulate_grad_batches: one sample more per micro batch
    samples: int  # the warm-up's length in samples (its tokens / seq_len)
    seq_len: int

    @classmethod
    def over_tokens(cls, start: int, final: int, increment: int, tokens: int, seq_len: int) -> BatchRamp:
        """trainer.batch_size_warmup's ramp, its `tokens` rounded up to whole samples."""
        return cls(start, final, increment, -(-tokens // seq_len), seq_len)

    @property
    def per_increment(self) -> float:
        """Samples trained at each batch size before it grows by one increment."""
        return self.samples / max(1, (self.final - self.start) // self.increment)

    @functools.cached_property
    def steps(self) -> tuple[int, ...]:
        """The global batch of every step before the final one is reached."""
        sizes, consumed, batch = [], 0, self.start
        while batch < self.final:
            sizes.append(batch)
            consumed += batch
            batch = min(self.final, self.start + int(consumed // self.per_increment) * self.increment)
        return tuple(sizes)

    def batch(self, step: int) -> int:
        return self.steps[step] if step < len(self.steps) else self.final

    def micro(self, step: int) -> int:
        """The micro batch of `step`: its global batch over data_parallel x accumulation."""
        return self.batch(step) // self.increment

    def samples_before(self, step: int) -> int:
        ramp = len(self.steps)
        return sum(self.steps[:step]) if step <= ramp else sum(self.steps) + (step - ramp) * self.final

    def equivalent_step(self, step: int) -> float:
        """Where `step` stands in a schedule counted in steps of the final batch (same tokens before it)."""
        return self.samples_before(step) / self.final

    def to_dict(self, max_steps: int) -> dict:
        return {
            "start": self.start,
            "final": self.final,
            "increment": self.increment,
            "ramp_steps": len(self.steps),
            "ramp_tokens": sum(self.steps) * self.seq_len,
            "total_tokens": self.samples_before(max_steps) * self.seq_len,
        }
