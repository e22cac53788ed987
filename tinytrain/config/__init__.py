"""Structured-config schemas (registered in Hydra's ConfigStore), OmegaConf resolvers, and the
one-paragraph error for what Hydra refuses."""

from pathlib import Path

# The config groups Hydra composes, shipped inside the package (tinytrain/conf/).
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
