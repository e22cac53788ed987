"""The data.bad_records policy: a record that cannot be used stops the run (error) or is dropped,
counted and logged (skip). Either way it is found while reading, in the main process, before any
DataLoader worker exists."""

from __future__ import annotations

import logging
from collections import Counter

from tinytrain.config.schema import BadRecordPolicy
from tinytrain.errors import ConfigError, Problem

log = logging.getLogger(__name__)

SKIP_FIX = "set data.bad_records=skip to drop such records (counted and logged)"
LOGGED_PER_KIND = 3


class BadRecords:
    def __init__(self, policy: BadRecordPolicy, key: str = "data.path"):
        self.policy = policy
        self.key = key
        self.counts: Counter[str] = Counter()
        self.first: dict[str, str] = {}

    def report(self, where: str, kind: str, detail: str = "", fix: str = "fix or remove it") -> None:
        """`where` names the file and line (or row); `kind` is the counted category."""
        message = f"{where}: {kind}" + (f" ({detail})" if detail else "")
        if self.policy == BadRecordPolicy.error:
            raise ConfigError(Problem(self.key, where, message, f"{fix}, or {SKIP_FIX}"))
        self.counts[kind] += 1
        self.first.setdefault(kind, message)
        if self.counts[kind] <= LOGGED_PER_KIND:
            log.warning("data.bad_records=skip: skipping %s", message)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        if not self.total:
            return "no bad records"
        parts = ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts.items()))
        return f"skipped {self.total} bad records: {parts}"
