"""Structured-config schemas (registered in Hydra's ConfigStore), OmegaConf resolvers, and the
one-paragraph error for what Hydra refuses."""

from pathlib import Path

# The config groups Hydra composes (conf/ beside the package in a checkout).
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
