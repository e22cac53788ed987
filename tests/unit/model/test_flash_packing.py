"""Packed documents stay isolated under flash_attention_2, for any micro batch.

flash-attn needs CUDA, so transformers' own flash dispatch (`flash_attention_forward` ->
`_flash_attention_forward`, which decides between the dense and the varlen kernel) runs here with
tinytrain/model/flash_reference.py's pure-torch kernels in place of flash-attn's. Every document of a
packed batch, run through the training forward, must give the logits it gives alone.
"""

import numpy as np
import pytest
import torch

from tests.unit.data.test_packing import ATOL, segments, store, tiny_llama  # noqa: F401 (store: fixture)
from tinytrain.data.collate import collate_windows
from tinytrain.data.packing import PackedSamples, PackedWindows
from tinytrain.model.flash_reference import use_reference_flash
from tinytrain.model.module import MODEL_INPUTS, CausalLMModule
from tinytrain.model.module_spec import ModuleSpec


@pytest.fixture(scope="module")
def flash() -> str:
    return use_reference_flash()


def packed_vs_alone(model, batch: dict) -> tuple[float, int]:
    """(largest |packed - alone| over every document of every row, documents checked)."""
    module = CausalLMModule(model, ModuleSpec(model.config.vocab_size))
    with torch.no_grad():
        packed = module(**{k: batch[k] for k in MODEL_INPUTS if k in batch})  # the training forward
    worst, checked = 0.0, 0
    for row in range(batch["input_ids"].shape[0]):
        for a, b in segments(batch["position_ids"][row]):
            with torch.no_grad():
                alone = model(input_ids=batch["input_ids"][row, a:b][None], use_cache=False).logits[0]
            worst = max(worst, float((packed[row, a:b] - alone).abs().max()))
            checked += 1
    return worst, checked


@pytest.mark.parametrize("micro", [1, 3])
def test_packed_windows_stay_isolated_under_flash(store, flash, micro):  # noqa: F811
    windows = PackedWindows(store, np.arange(store.num_documents), seq_len=24)
    batch = collate_windows([windows[i] for i in range(micro)])  # the pretraining loader's collate
    worst, checked = packed_vs_alone(tiny_llama(flash), batch)
    assert checked > micro  # the rows really held several documents
    assert worst < ATOL, f"micro batch {micro}: packed logits differ from each document alone by {worst:.3g}"


def test_packed_sft_rows_with_padding_stay_isolated_under_flash(flash):
    from tinytrain.data.collate import PaddedCollator
    from tinytrain.data.sft import SftSample

    g = np.random.default_rng(0)
    lengths = [9, 5, 12, 3, 7, 6, 11, 4]
    samples = [SftSample(g.integers(5, 500, n), np.full(n, -100)) for n in lengths]
    rows = PackedSamples(samples, capacity=20)
    batch = PaddedCollator(pad_id=0, multiple=8)([rows[i] for i in range(len(rows))])
    assert batch["input_ids"].shape[0] > 1 and min(rows.lengths) < batch["input_ids"].shape[1]  # padded rows
    worst, checked = packed_vs_alone(tiny_llama(flash, vocab=512), batch)
    assert checked > len(rows)
    assert worst < ATOL, f"packed SFT rows differ from each sample alone by {worst:.3g}"


def test_boundaries_found_from_position_ids_when_the_collator_gave_none(store, flash):  # noqa: F811
    from torch.utils.data import default_collate

    windows = PackedWindows(store, np.arange(store.num_documents), seq_len=24)
    batch = default_collate([windows[i] for i in range(3)])  # another loader's batch: position ids only
    worst, checked = packed_vs_alone(tiny_llama(flash), batch)
    assert checked > 3 and worst < ATOL, worst


def test_chunked_loss_on_flash_equals_the_plain_loss(store, flash):  # noqa: F811
    windows = PackedWindows(store, np.arange(store.num_documents), seq_len=24)
    batch = collate_windows([windows[i] for i in range(3)])
    model = tiny_llama(flash)
    plain = CausalLMModule(model, ModuleSpec(4000))
    chunked = CausalLMModule(model, ModuleSpec(4000, loss_chunk_tokens=16))
    with torch.no_grad():
        assert torch.allclose(plain.batch_loss(batch), chunked.batch_loss(batch), atol=1e-5)


def test_document_boundaries_start_at_every_restart_and_every_row():
    from tinytrain.data.collate import document_boundaries

    position_ids = torch.tensor([[0, 1, 2, 0, 1], [3, 4, 0, 1, 2]])  # row 2 opens mid-document
    cu, longest = document_boundaries(position_ids)
    assert cu.tolist() == [0, 3, 5, 7, 10] and cu.dtype == torch.int32 and longest == 3
