"""Model FLOPs for MFU: 6 x matmul parameters per token + the attention term.

Per sequence of length T: 6 * N * T + 12 * L * H * Q * T^2, with N the parameters that take part
in matmuls (all parameters minus the input embedding table, whose lookup is not a matmul; the
lm_head counts with its padded rows, which the GPU computes too), L layers, H heads of size Q.
For packed batches the attention term uses the sum of squared document lengths, since attention
does not cross documents: 12 * L * H * Q * sum(d_i^2), which the collators count on the CPU
(data/collate.py, tokens_and_squares).
"""

from __future__ import annotations

from tinytrain.plan.model_shape import ModelShape, parameter_count


def matmul_parameters(shape: ModelShape) -> int:
    embedding = 0 if shape.tied_embeddings else shape.vocab * shape.hidden
    return parameter_count(shape) - embedding


def batch_flops(shape: ModelShape, tokens: int, sum_squared_lengths: int) -> float:
    """Training FLOPs (forward + backward) for a batch of `tokens` tokens whose attention spans
    have squared lengths summing to `sum_squared_lengths`."""
    dense = 6.0 * matmul_parameters(shape) * tokens
    attention = 12.0 * shape.layers * shape.heads * shape.head_dim * sum_squared_lengths
    return dense + attention
