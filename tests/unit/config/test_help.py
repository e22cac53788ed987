"""`tinytrain --help` is tinytrain's (modes, the shipped groups and options, common keys with their
defaults, docs pages), without the ConfigStore's internal nodes; `--version` is tinytrain's."""

import subprocess
import sys

from tests.conftest import REPO, compose


def test_help_lists_modes_groups_and_keys():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from tinytrain.config import CONF_DIR, help

    compose()  # registers the resolvers and schemas
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        text = help.render(hydra_compose(config_name="config", overrides=["trainer.lr=0.01"], return_hydra_config=True))
    for needle in ("modes (mode=...):", "  plan ", "  eval ", "[tiny], tinyllama_1b", "[csv], tensorboard, wandb", "[single]", "hydra/launcher", "trainer.lr", "[0.01]", "docs/slurm.md", "--hydra-help"):
        assert needle in text, (needle, text)
    for page in help.DOC_PAGES:  # the pages --help names exist
        assert (REPO / "docs" / page).is_file(), page
    assert "schema/" not in text and "config_schema" not in text  # Hydra's help lists the ConfigStore's nodes


def test_help_and_version_through_the_command():
    from tinytrain import __version__

    r = subprocess.run([sys.executable, "-m", "tinytrain", "--version"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (0, f"tinytrain {__version__}\n")
    r = subprocess.run([sys.executable, "-m", "tinytrain", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(f"tinytrain {__version__}: ") and "[pydoc]" in r.stdout, r.stdout + r.stderr
