"""The end-of-run loss line compares means of the first and last few steps, not two single batches."""

import torch

from tinytrain.train.callbacks.loss_summary import LossSummary


def test_means_of_the_first_and_last_quarter():
    summary = LossSummary()
    assert summary.means() is None and summary.first is None
    for loss in [6.0, 7.0, 5.0, 6.0, 4.0, 5.0, 3.0, 7.5]:  # a noisy fall whose last batch is high
        summary.on_train_batch_end(None, None, {"loss": torch.tensor(loss)}, None, 0)
    assert (summary.first, summary.last, summary.window) == (6.0, 7.5, 2)
    assert summary.means() == (6.5, 5.25)  # falling, though the last batch is above the first
