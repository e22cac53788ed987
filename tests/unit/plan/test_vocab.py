import pytest
import torch

from tinytrain.checkpoint.format import unpad_rows
from tinytrain.plan.vocab import padded_vocab_size, plan_vocab


@pytest.mark.parametrize(
    "true_vocab, multiple, tp, expected",
    [
        (32000, 64, 1, 32000),  # Llama-2: already a multiple of 64
        (32002, 64, 1, 32064),  # + <|im_start|>, <|im_end|>
        (32002, 64, 8, 32256),  # DESIGN.md's example: multiple 64 x tp 8 = 512
        (65535, 64, 2, 65536),  # the checkpoint bug: 65535 is odd, so not divisible by tp 2
        (65535, 64, 1, 65536),
        (32000, 128, 1, 32000),
        (32002, 128, 1, 32128),
        (32002, 128, 4, 32256),
        (4096, 64, 1, 4096),
        (1, 64, 1, 64),
    ],
)
def test_padded_vocab(true_vocab, multiple, tp, expected):
    padded = padded_vocab_size(true_vocab, multiple, tp)
    assert padded == expected
    assert padded % (multiple * tp) == 0
    assert padded - true_vocab < multiple * tp  # never pads a whole extra block


def test_describe_names_every_factor():
    assert plan_vocab(32002, 64, 8).describe() == "vocab 32002 -> 32256 (multiple 64 x tp 8)"
    assert plan_vocab(32002, 64, 8).padding_rows == 254


@pytest.mark.parametrize("args", [(0, 64, 1), (100, 0, 1), (100, 64, 0)])
def test_rejects_non_positive(args):
    with pytest.raises(ValueError):
        padded_vocab_size(*args)


def test_unpad_rows_keeps_the_first_true_vocab_rows():
    w = torch.arange(12.0).reshape(6, 2)
    assert torch.equal(unpad_rows(w, 4), w[:4])
    with pytest.raises(ValueError):
        unpad_rows(w, 7)
