"""Stragglers: a rank whose own compute is consistently slower than the other ranks'.

In a synchronous step every rank waits for the slowest, so step times are all alike; what differs
is each rank's time before it first waits: the forward pass of its micro batches (no collective
in it under DDP and ZeRO-1/2; under FSDP, ZeRO-3 and TP its all-gathers are included, which
blurs the comparison). Every N steps the ranks exchange a typical forward time of those steps
(`typical_forward`: one all_gather of one number); each rank is compared with the median of the *others* (with two
ranks the median of all would halve a slowdown), and a rank above the threshold in CONSECUTIVE
checks running is named. Lightning-free: train/callbacks/stragglers.py measures and exchanges.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

CONSECUTIVE = 2  # checks in a row: one slow window (a page fault, a checkpoint) is not a straggler


def typical_forward(times: list[float]) -> float:
    """A rank's forward time over a window: the lower quartile of its forwards. Noise only adds time
    to a forward (a page fault: on a CPU rank 0, which also logs and saves, faulted in about half its
    forwards, 2-4 ms of system time in a 7 ms forward; a cold cache after the core ran another
    process; a GPU shared for a moment), while a slow device or core slows every forward, so it
    moves the quartile too. The median would follow the noise once half a window has it."""
    if len(times) < 4:
        return min(times)
    return statistics.quantiles(times, n=4, method="inclusive")[0]


def slowdowns(times: list[float]) -> list[float]:
    """Each rank's time over the median of the other ranks' times, minus 1 (0.5: 50% slower)."""
    if len(times) < 2:
        return [0.0] * len(times)
    out = []
    for rank, t in enumerate(times):
        others = statistics.median(times[:rank] + times[rank + 1 :])
        out.append(t / others - 1 if others > 0 else 0.0)
    return out


@dataclass
class StragglerRecord:
    threshold: float
    streak: dict[int, int] = field(default_factory=dict)  # rank -> checks above the threshold in a row
    named: dict[int, list[float]] = field(default_factory=dict)  # rank -> its slowdown at each check it was named in
    checks: int = 0
    worst: tuple[int, float] = (-1, 0.0)  # the largest slowdown seen at any check: (rank, slowdown)

    def check(self, times: list[float]) -> list[tuple[int, float]]:
        """One exchange of per-rank times; returns the ranks named at this check with their slowdown."""
        self.checks += 1
        now = []
        for rank, slow in enumerate(slowdowns(times)):
            if slow > self.worst[1]:
                self.worst = (rank, slow)
            self.streak[rank] = self.streak.get(rank, 0) + 1 if slow > self.threshold else 0
            if self.streak[rank] >= CONSECUTIVE:
                self.named.setdefault(rank, []).append(slow)
                now.append((rank, slow))
        return now

    def summary(self) -> str:
        if not self.checks:
            return "stragglers: not checked (fewer steps than cluster.straggler_every_n_steps)"
        if not self.named:
            worst = f"; the slowest, rank {self.worst[0]}, was {100 * self.worst[1]:.0f}% slower than the others' median" if self.worst[0] >= 0 else ""
            return f"stragglers: none above {100 * self.threshold:.0f}% in {self.checks} checks{worst}"
        parts = [f"rank {rank} {100 * statistics.median(s):.0f}% slower than the others' median (named in {len(s)} of {self.checks} checks)" for rank, s in sorted(self.named.items())]
        return "stragglers: " + "; ".join(parts) + " -- a slow GPU, a throttled or shared CPU, or its data loading (the rank's node: tinytrain.log)"
