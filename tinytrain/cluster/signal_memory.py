"""A stop signal remembered, not acted on: SIGUSR1 (Slurm's warning before the time limit), SIGTERM
and SIGINT set a flag that training honours at the next optimizer-step boundary
(train/callbacks/preemption.py). Here, without Lightning, so a training run installs it before its
plan and data build: SIGUSR1's default action would kill the process then, and every rank of a
Slurm job receives it.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)


class SignalMemory:
    """The installed handler: it only remembers. It holds nothing of the preemption callback, which
    Lightning binds to the module (its `log`): a handler left installed after fit (Lightning's
    teardown puts back the early SIGUSR1 one) would keep the model, and fsdp_tp's process groups
    with their gloo threads, alive into the interpreter's exit."""

    def __init__(self) -> None:
        self.received: list[str] = []  # signal names, in order of arrival

    def __call__(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if name == "SIGINT" and name in self.received:
            # Ctrl-C again: the user will not wait for the step boundary.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        if name == "SIGINT":
            log.warning("Ctrl-C: saving a checkpoint at the end of this step, then stopping (Ctrl-C again stops at once, without one)")
        self.received.append(name)

    def install(self, signals) -> None:
        if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
            for sig in signals:
                signal.signal(sig, self)

    def install_early(self) -> None:
        """Before the plan, the data and the model are built: a SIGUSR1 then is remembered and
        honoured at the first step boundary. SIGTERM and SIGINT keep their defaults until training
        starts: stopping before then loses nothing."""
        self.install([signal.SIGUSR1])
