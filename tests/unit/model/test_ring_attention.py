"""The dp x cp x tp mesh ring attention runs on (model/ring_attention.py): tp innermost, cp next, dp
outermost; the ring check itself is tests/integration/test_ring_attention.py."""

import os

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


SHARD_PEAK = """
import os, sys
import torch, torch.distributed as dist
from tests.conftest import free_port
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
dist.init_process_group("gloo", rank=0, world_size=1)
from tinytrain.model.ring_attention import RingGroup, build_mesh
seq = 8192
ring = RingGroup(build_mesh("cpu", 1, cp=1, tp=1)["cp"], 1, 0)
def batch(n):
    ids = torch.zeros(1, n, dtype=torch.long)
    return {"input_ids": ids, "labels": ids, "position_ids": (torch.arange(n) % 1024)[None]}
def peak_mb():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) // 1024
ring.shard(batch(256))  # the compile's own memory before the reading
before = peak_mb()
shard = ring.shard(batch(seq))
print(peak_mb() - before, shard["attention_mask"].seq_lengths)
dist.destroy_process_group()
"""


def test_a_shard_s_block_mask_is_built_without_the_dense_whole_sequence_mask():
    """RingGroup.shard builds the rank's block mask block by block (torch's _create_cp_block_mask):
    a whole-sequence BlockMask made eagerly first materialised seq x seq masks through vmap (at 32k
    tokens the process's peak grew by 10 GB on this machine; 24 MB now). At 8k tokens the old way
    grew it by ~640 MB."""
    import subprocess
    import sys

    from tests.conftest import REPO

    out = subprocess.run([sys.executable, "-c", SHARD_PEAK], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    grown, lengths = out.stdout.split(maxsplit=1)
    assert lengths.strip() == "(8192, 8192)" and int(grown) < 128, out.stdout
