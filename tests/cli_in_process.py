"""The CLI in this process (tinytrain.cli.main, as `python -m tinytrain` runs it), so many short
commands share one interpreter's imports instead of paying ~5 s each in a subprocess."""

from __future__ import annotations

import contextlib
import io
import os
import sys


def run_in_process(args: list[str]) -> tuple[int, str]:
    """`python -m tinytrain args...` in this process: the exit status and what it printed to stderr.
    An exception that escapes main() is what a user would see as a traceback, so it propagates."""
    from tinytrain import cli

    saved_argv = sys.argv
    sys.argv = ["tinytrain", *args]
    err = io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            cli.main()
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = saved_argv
        # main() remembers the traceback choice in the environment for its child processes.
        for var in ("HYDRA_FULL_ERROR", "TINYTRAIN_TRACEBACK"):
            os.environ.pop(var, None)
    return code, err.getvalue()
