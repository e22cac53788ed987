"""The CLI in this process (tinytrain.cli.main, as `python -m tinytrain` runs it), so many short
commands share one interpreter's imports instead of paying ~5 s each in a subprocess."""

from __future__ import annotations

import contextlib
import io
import os
import sys


@contextlib.contextmanager
def kept_environment():
    """os.environ as it was before the block, whatever the block set or removed. tinytrain and the
    libraries it loads set variables for their own child processes (Lightning's PL_GLOBAL_SEED, the
    flight recorder's buffer, HF_HUB_DISABLE_PROGRESS_BARS, ...); left in a test worker they would
    make every later command's environment differ from the zygote's, each then paying a fresh
    interpreter's imports (tests/zygote.py)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in [k for k in os.environ if k not in saved]:
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


def run_in_process(args: list[str]) -> tuple[int, str]:
    """`python -m tinytrain args...` in this process: the exit status and what it printed to stderr.
    An exception that escapes main() is what a user would see as a traceback, so it propagates."""
    from tinytrain import cli

    saved_argv = sys.argv
    sys.argv = ["tinytrain", *args]
    err = io.StringIO()
    code = 0
    try:
        # main() remembers the traceback choice in the environment for its child processes.
        with kept_environment(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            cli.main()
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = saved_argv
    return code, err.getvalue()
