"""Means over an optimizer step's micro batches, kept on the device (nothing read back).

Lightning logs the last value a step gives: under gradient accumulation that was the step's last
micro batch's loss and preference metrics, not the step's. Each micro batch is weighed alike, as the
backward weighs its loss. A metric some micro batches lack (KTO's chosen side in a batch without a
desirable example) is the mean of those that have it, and NaN in a step where none has: Lightning
would otherwise show the value of the last step that had it.
"""

from __future__ import annotations

import torch


class StepMeans:
    def __init__(self, names=()):
        """`names`: the metrics known before any step (an objective that leaves some out of a step):
        a step lacking one logs NaN from the first step, in a resumed process too."""
        self.step = -1
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.names: set[str] = set(names)  # every name seen in the run: a step lacking one logs NaN

    def add(self, step: int, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | float]:
        """This step's means so far, `values` (one micro batch's) included; at its last micro batch,
        the step's. `step`: the optimizer step, the same for all of a step's micro batches."""
        if step != self.step:
            self.step, self.sums, self.counts = step, {}, {}
        for name, value in values.items():
            value = value.detach()
            self.sums[name] = value if name not in self.sums else self.sums[name] + value
            self.counts[name] = self.counts.get(name, 0) + 1
        self.names |= values.keys()
        return {name: self.mean(name) for name in sorted(self.names)}  # sorted: the same order on every rank

    def mean(self, name: str) -> torch.Tensor | float:
        if name not in self.sums:
            return float("nan")
        count = self.counts[name]
        return self.sums[name] if count == 1 else self.sums[name] / count
