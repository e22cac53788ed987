"""Shared fixtures: config composition through Hydra's compose API, and the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "conf"
SHARED_DATA = REPO.parent / "shared" / "data"
LLAMA2_TOKENIZER = SHARED_DATA / "llama2-tokenizer" / "tokenizer.model"

needs_llama2 = pytest.mark.skipif(not LLAMA2_TOKENIZER.exists(), reason=f"../shared/data/llama2-tokenizer absent (looked at {LLAMA2_TOKENIZER})")


def compose(overrides: list[str] | tuple[str, ...] = ()):
    """The config `python -m tinytrain <overrides>` would run, composed in-process."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from tinytrain.config.resolvers import register_resolvers
    from tinytrain.config.schema import register_schemas

    register_resolvers()
    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def run_cli(args: list[str], run_dir: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m tinytrain args...` from the repo root, writing into run_dir."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "TINYTRAIN_TRACEBACK")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "tinytrain", *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def bundled_tokenizer():
    from tinytrain.tokenizer import load_tokenizer

    return load_tokenizer(str(REPO / "tinytrain" / "assets" / "bundled_tokenizer"))
