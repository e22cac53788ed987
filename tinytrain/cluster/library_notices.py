"""Notices libraries print that are not about this run, dropped for every mode (plan, train,
export, ...): in a Slurm job's log file they would outnumber tinytrain's own lines.

- DeepSpeed announces the accelerator it picked when first imported, which transformers and
  accelerate do during a plain export too ("Setting accelerator to CPU"): the plan already says
  what hardware the run is for.
- torchao (imported by transformers whenever the fp8 extra is installed) warns about CUDA and Triton
  kernels this machine cannot load, and registers Enums the way torch's pytree now warns about.
- Lightning hints that `srun` is on the PATH but not used: true outside any Slurm job, where it is
  not about this run (inside one, without srun, it stays).
- transformers' progress bars ("Writing model shards") redraw with carriage returns: in a log that
  is not a terminal they are one line of clutter per save. Shown on a terminal.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings


class _DropAccelerator(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Setting accelerator to" not in record.getMessage()


def quiet() -> None:
    logging.getLogger("DeepSpeed").addFilter(_DropAccelerator())
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    if "SLURM_JOB_ID" not in os.environ:
        warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")
    if not sys.stderr.isatty():
        # Read when huggingface_hub is imported (transformers' bars follow it), here and in child processes.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "transformers" in sys.modules:  # imported already (a caller in this process)
            sys.modules["transformers"].utils.logging.disable_progress_bar()
