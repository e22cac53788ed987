"""The dp x cp x tp mesh ring attention runs on (model/ring_attention.py): tp innermost, cp next, dp
outermost; the ring check itself is tests/integration/test_ring_attention.py."""

import pytest

from tinytrain.model.ring_attention import MESH_DIMS, mesh_shape


@pytest.mark.parametrize("world, cp, tp, shape", [(2, 2, 1, (1, 2, 1)), (4, 2, 2, (1, 2, 2)), (8, 2, 2, (2, 2, 2)), (16, 4, 2, (2, 4, 2))])
def test_the_mesh_is_dp_by_cp_by_tp(world, cp, tp, shape):
    assert mesh_shape(world, cp=cp, tp=tp) == shape and MESH_DIMS == ("dp", "cp", "tp")


def test_a_world_the_split_does_not_divide_is_named():
    with pytest.raises(ValueError, match=r"cp\(4\) x tp\(2\) must divide the world size 12"):
        mesh_shape(12, cp=4, tp=2)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_the_cpu_kernel_is_flex_attention_under_the_same_block_mask(kv_heads):
    """dense_flex_attention (ring's kernel on a CPU, where flex attention has no backward) gives flex
    attention's forward under a causal mask of packed documents, grouped key/value heads too, and
    runs a backward."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from tinytrain.model.ring_attention import _document_mask, dense_flex_attention

    torch.manual_seed(0)
    rows, heads, seq, dim = 2, 4, 256, 16
    positions = torch.cat([torch.arange(100), torch.arange(156)]).expand(rows, seq).clone()
    positions[1] = torch.cat([torch.arange(30), torch.arange(226)])
    block_mask = create_block_mask(_document_mask(positions), rows, None, seq, seq, device="cpu")
    q = torch.randn(rows, heads, seq, dim, requires_grad=True)
    k, v = (torch.randn(rows, kv_heads, seq, dim) for _ in range(2))
    gqa = kv_heads != heads
    got = dense_flex_attention(q, k, v, block_mask=block_mask, scale=0.25, enable_gqa=gqa)
    want = flex_attention(q.detach(), k, v, block_mask=block_mask, scale=0.25, enable_gqa=gqa)
    assert (got.detach() - want).abs().max() < 1e-5
    # Isolation: the second document's first query sees itself only, so its output is its own value.
    own = v[0, 0, 100]  # query head 0 reads key/value head 0 with or without grouping
    assert torch.allclose(got[0, 0, 100].detach(), own, atol=1e-5)
    got.sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
