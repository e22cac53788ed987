"""tinytrain: a declarative launcher for pretraining and fine-tuning Llama-family models."""

__version__ = "0.1.0"
