"""What mode=eval's next-token loss reads of a held-out split (outputs/modes.py scored_rows): every
row of text and SFT batches; a preference batch's chosen answers, not its rejected ones (it reported
a loss over both, 7.93 for a run whose val_loss, its DPO loss, was 0.197); KTO's desirable examples,
not the undesirable ones or the KL rows that pair a prompt with another example's completion."""

import torch

from tinytrain.outputs.modes import scored_rows


def batch_of(rows: int, **extra) -> dict:
    ids = torch.arange(rows * 3).reshape(rows, 3)
    return {"input_ids": ids, "labels": ids + 100, "attention_mask": torch.ones(rows, 3), **extra}


def test_text_and_sft_batches_are_read_whole():
    batch = batch_of(4)
    assert scored_rows(batch, preference=False) is batch


def test_a_preference_batch_is_read_on_its_chosen_rows():
    batch = batch_of(4)  # 2 pairs: chosen rows 0-1, rejected 2-3
    rows = scored_rows(batch, preference=True)
    assert rows["input_ids"].tolist() == batch["input_ids"][:2].tolist() and rows["labels"].shape == (2, 3)


def test_a_kto_batch_is_read_on_its_desirable_examples():
    batch = batch_of(6, kto_labels=torch.tensor([True, False, True]))  # 3 examples, then 3 KL rows
    rows = scored_rows(batch, preference=True)
    assert rows["input_ids"].tolist() == batch["input_ids"][[0, 2]].tolist() and "kto_labels" not in rows
