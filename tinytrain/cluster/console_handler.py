"""The console's log handler (hydra/job_logging/tinytrain.yaml, hydra/hydra_logging/tinytrain.yaml).

stdout's reader may leave before the command ends (`tinytrain ... | head`, `--info all | head`):
Python's StreamHandler then printed a "--- Logging error ---" traceback to stderr for every later
line. A reader that left is no error of the run's: stdout is pointed at /dev/null once, and the
run goes on (its log file keeps every line). Hydra's printing flags (--info, --cfg) log through a
handler of Hydra's own making: for them, logging's errors are not printed at all (they print
nothing else)."""

from __future__ import annotations

import logging
import os
import sys


class ConsoleHandler(logging.StreamHandler):
    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            to_devnull(self.stream)
            return
        super().handleError(record)


def to_devnull(stream) -> None:
    """What is still buffered for the pipe, and every later write, goes to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


# Hydra's flags that print and exit; argparse takes any unambiguous abbreviation of a long one.
PRINTING_FLAGS = ("--info", "--cfg", "--hydra-help", "--shell-completion")
PRINTING_SHORT = ("-i", "-c", "-sc")


def quiet_for_printing_flags(argv: list[str]) -> None:
    def printing(arg: str) -> bool:
        name = arg.split("=", 1)[0]
        return name in PRINTING_SHORT or (name.startswith("--") and len(name) > 2 and any(flag.startswith(name) for flag in PRINTING_FLAGS))

    if any(printing(arg) for arg in argv):
        logging.raiseExceptions = False
