"""The end-of-run loss line compares means of the first and last few steps, not two single batches."""

import pytest
import torch

from tinytrain.train.callbacks.loss_summary import LossSummary


def test_means_of_the_first_and_last_quarter():
    summary = LossSummary()
    assert summary.means() is None and summary.first is None
    for loss in [6.0, 7.0, 5.0, 6.0, 4.0, 5.0, 3.0, 7.5]:  # a noisy fall whose last batch is high
        summary.on_train_batch_end(None, None, {"loss": torch.tensor(loss)}, None, 0)
    assert (summary.first, summary.last, summary.window) == (6.0, 7.5, 2)
    assert summary.means() == (6.5, 5.25)  # falling, though the last batch is above the first


def test_losses_read_before_each_update_keep_their_order():
    """Kept on the device until the next update's hook, then read together, in micro-batch order."""
    summary = LossSummary()
    for step, losses in enumerate([[3.0, 2.0], [1.5, 1.0], [0.5]]):
        if step:
            summary.on_before_optimizer_step(None, None, None)
            assert summary._pending == []
        for loss in losses:
            summary.on_train_batch_end(None, None, {"loss": torch.tensor(loss, dtype=torch.bfloat16)}, None, 0)
    assert len(summary._pending) == 1  # the last micro batch's, read when asked
    assert summary.losses == [3.0, 2.0, 1.5, 1.0, 0.5]


def test_a_step_s_loss_is_the_mean_of_its_micro_batches():
    """Under gradient accumulation Lightning hands each micro batch's loss divided by the
    accumulation: a step's loss is their sum (the summary printed the first micro batch's share:
    4.16 for a step at 8.32)."""
    from types import SimpleNamespace

    summary = LossSummary()
    trainer = SimpleNamespace(accumulate_grad_batches=2, strategy=None, model=None)
    micro = [8.4, 8.2, 6.0, 5.0, 3.0, 1.0]  # three steps of two micro batches
    for i, loss in enumerate(micro):
        if i and i % 2 == 0:
            summary.on_before_optimizer_step(trainer, None, None)
        summary.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss / 2)}, None, i)
    assert summary.losses == pytest.approx([8.3, 5.5, 2.0]) and summary.last == 2.0


def test_a_token_share_loss_is_read_as_this_rank_s_token_mean_as_the_logged_loss_is():
    """Fine-tuning weighs a step by its trained tokens (train/callbacks/step_tokens.py): each micro
    batch's loss is a sum over the step's token share, and the logged loss scales it by the step's
    share over this rank's. The summary read the raw shares: on two ranks under accumulation 2 it
    printed 4.7594 for a last step logged at 7.6852."""
    from types import SimpleNamespace

    summary = LossSummary()
    trainer = SimpleNamespace(accumulate_grad_batches=2, strategy=None, model=None)
    module = SimpleNamespace(loss_share=10.0, own_loss_share=4.0)  # this rank trained 4 of the step's 10 tokens per micro batch
    for loss in (0.6, 0.4):
        summary.on_train_batch_end(trainer, module, {"loss": torch.tensor(loss)}, None, 0)
    assert summary.losses == pytest.approx([2.5])
