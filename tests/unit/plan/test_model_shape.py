"""The analytic parameter count the plan uses equals a meta-device transformers model's count."""

import pytest
import torch

from tests.conftest import CONF_DIR, compose
from tinytrain.model.build import hf_config
from tinytrain.plan.model_shape import parameter_count, shape_from_config, shape_from_hf


@pytest.mark.parametrize("model", sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml")))
@pytest.mark.parametrize("vocab", [4096, 32064])
def test_analytic_count_matches_meta_model(model, vocab, bundled_tokenizer):
    from transformers import AutoModelForCausalLM

    cfg = compose([f"model={model}"])
    config = hf_config(cfg.model, vocab, bundled_tokenizer)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in meta.parameters())
    assert parameter_count(shape_from_config(cfg.model, vocab)) == expected
    assert shape_from_hf(config, vocab) == shape_from_config(cfg.model, vocab)


def test_plan_imports_no_training_stack(tmp_path):
    """mode=plan stays lean: no Lightning, DeepSpeed, wandb or transformers modeling code, no
    torch._dynamo or sympy (~1.1 s, once pulled in by the varlen kernel's probe), and no lm_eval
    without eval.tasks (its import and task index take seconds)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = (
        "import runpy, sys; sys.argv = ['tinytrain', 'mode=plan', 'model=llama3_8b', 'hydra.run.dir=" + str(tmp_path) + "'];\n"
        "try:\n    runpy.run_module('tinytrain', run_name='__main__')\nfinally:\n"
        "    print('MODULES', ' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'deepspeed', 'wandb', 'lm_eval') or m in ('transformers.modeling_utils', 'transformers.models.llama.modeling_llama', 'torch._dynamo', 'sympy'))))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    line = next(row for row in r.stdout.splitlines() if row.startswith("MODULES"))
    assert line.strip() == "MODULES", line
