"""A step's logged loss and metrics: means over its micro batches (tinytrain/model/step_means.py)."""

import math

import torch

from tinytrain.model.step_means import StepMeans


def test_means_over_a_step_s_micro_batches_and_nan_for_a_metric_no_micro_batch_had():
    means = StepMeans()
    assert means.add(0, {"loss": torch.tensor(2.0), "rewards/chosen": torch.tensor(1.0)}) == {"loss": 2.0, "rewards/chosen": 1.0}
    assert means.add(0, {"loss": torch.tensor(4.0)}) == {"loss": 3.0, "rewards/chosen": 1.0}  # only the micro batch that had it
    step = means.add(1, {"loss": torch.tensor(5.0)})  # a new step: KTO's chosen side absent from all of it
    assert step["loss"] == 5.0 and math.isnan(step["rewards/chosen"])  # not step 0's value, as Lightning would keep
    assert list(step) == ["loss", "rewards/chosen"]  # one order on every rank (a collective per name)


def test_metrics_named_at_the_start_are_nan_from_the_first_step_in_a_resumed_process_too():
    """KTO leaves a side's metrics out of a step without that side: a name first seen later left the
    earlier cells empty, and a resumed process (which had seen none) wrote empty where the
    uninterrupted one wrote NaN. The objective's names are given from the start."""
    from tinytrain.model.module import CausalLMModule
    from tinytrain.model.module_spec import ModuleSpec
    from tinytrain.model.preference_loss import KTO_METRICS, PreferenceObjective

    means = StepMeans(KTO_METRICS)
    first = means.add(0, {"kl": torch.tensor(0.0), "rewards/chosen": torch.tensor(1.0), "logps/chosen": torch.tensor(-3.0)})
    assert list(first) == sorted(KTO_METRICS) and math.isnan(first["rewards/margins"]) and first["rewards/chosen"] == 1.0
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    kto = PreferenceObjective("kto", 0.1)
    assert CausalLMModule(model, ModuleSpec(64, objective=kto)).step_metrics.names == set(KTO_METRICS)
