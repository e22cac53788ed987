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
