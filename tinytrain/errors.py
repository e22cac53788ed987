"""The project's configuration error: every problem found, each naming key, value and fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    key: str
    value: object
    message: str
    fix: str

    def render(self) -> str:
        return f"{self.key}={as_typed(self.value)}: {self.message}. Fix: {self.fix}"


def as_typed(value) -> str:
    """A value as a user writes it after `key=` on the command line: true/false/null (not Python's
    True/False/None), strings quoted, numbers and lists as they are."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


class ConfigError(Exception):
    """Raised before any expensive work when the composed config cannot run.

    Holds every problem found, so a user fixes them all in one round.
    """

    def __init__(self, problems: list[Problem] | Problem):
        self.problems = [problems] if isinstance(problems, Problem) else list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        if len(self.problems) == 1:
            return "tinytrain: configuration error: " + self.problems[0].render()
        lines = [f"tinytrain: {len(self.problems)} configuration errors:"]
        lines += [f"  - {p.render()}" for p in self.problems]
        return "\n".join(lines)


class MissingExtra(ConfigError):
    """An optional package the input needs is not installed: the input is not broken (resume=auto
    must not skip past such a checkpoint, nor set it aside as unreadable)."""


class TrainingStopped(Exception):
    """A runtime guard stopped the run; the message is the whole diagnosis (cause, step, fixes)."""


# EX_TEMPFAIL (sysexits.h): stopped on purpose with a checkpoint saved; running again resumes.
PREEMPTED_EXIT_CODE = 75


# EX_PROTOCOL (sysexits.h): the hang watchdog stopped a run no rank of which made progress within
# its limit (hang_report.txt in the run directory says where); running again resumes.
HANG_EXIT_CODE = 76


def again_in(run_dir, *, sentence: bool = False) -> str:
    """How a stopped run is continued: in its own directory. "Run the same command again" alone
    made a new one where run.name was left at its default (the time the command started)."""
    return f"{'R' if sentence else 'r'}un the same command again with hydra.run.dir={run_dir} (or its run.name)"


class HangStopped(TrainingStopped):
    """Another local rank was stopped by the hang watchdog before this one's own watchdog acted:
    this rank stops the same way, with HANG_EXIT_CODE (a Slurm job requeues on it)."""


class Preempted(Exception):
    """SIGUSR1 / SIGTERM / SIGINT: a checkpoint was saved and the run stopped (callbacks/preemption.py)."""


def raise_if_any(problems: list[Problem]) -> None:
    if problems:
        raise ConfigError(problems)
