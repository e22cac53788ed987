"""A strategy or logger whose extra is not installed is a configuration error naming the extra."""

import pytest

from tests.conftest import compose
from tinytrain.plan.extras import missing_extra_problems


def nothing_installed(module: str) -> bool:
    return False


def test_missing_extras_are_named():
    cfg = compose(["parallel=zero2", "logger=[wandb,tensorboard]", "finetune=lora"])
    problems = missing_extra_problems(cfg, nothing_installed)
    assert [(p.key, p.value) for p in problems] == [("parallel", "zero2"), ("logger", "wandb"), ("finetune", "lora"), ("logger", "tensorboard")]
    assert [p.fix.split(" (")[0] for p in problems] == ["pip install 'tinytrain-llm[deepspeed]'", "pip install 'tinytrain-llm[wandb]'", "pip install 'tinytrain-llm[lora]'", "pip install 'tinytrain-llm[tensorboard]'"]


@pytest.mark.parametrize("overrides", [[], ["parallel=ddp"], ["parallel=fsdp_tp"]])
def test_the_core_needs_no_extra(overrides):
    assert missing_extra_problems(compose(overrides), nothing_installed) == []


def test_installed_extras_pass():
    assert missing_extra_problems(compose(["parallel=zero3", "logger=[wandb,tensorboard]"])) == []
