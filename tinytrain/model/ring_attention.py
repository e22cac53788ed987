"""Ring-style context parallelism on a Hugging Face model through PyTorch's own engine
(`torch.distributed.tensor.experimental`), its flex-attention path, on the cp dimension of a
dp x cp x tp device mesh: parallel.cp_kind=ring under parallel=fsdp_tp.

Why the flex path and not `context_parallel()` around SDPA: SDPA's ring has handlers for the CUDA
kernels only (flash, efficient, cudnn); CPU SDPA fails with "Operator
aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy
registered" (torch 2.13, gloo), and its ring takes no mask, so packed documents would attend to
each other. The flex path carries a document mask: the block mask is built from the whole rows'
position ids (documents restart at 0, data/collate.py) and torch rewrites it for each rank's slice.

What torch does, per attention call: each rank holds seq / cp query tokens (head-tail load
balanced: rank r holds chunk r and chunk 2cp-1-r of the causal sequence, so every rank has the same
share of the causal triangle); keys and values are all-gathered over the cp group (their gradients
reduce-scattered back), and this rank's queries attend to the whole sequence under the rewritten
block mask. The kernel: compiled flex attention on GPUs; on a CPU, where flex attention has no
backward (torch 2.13), SDPA over the same rewritten mask in dense form (`dense_flex_attention`).
Everything around the kernel (sharding, load balancing, the mask's rewrite, the gather and its
gradient) is torch's, the same on both.

The batch, labels and loss follow the Ulysses path (model/context_parallel.py): every rank of a cp
group receives the same micro batch; the labels are already shifted by the data stage, so the
shard of labels is taken with the same load-balancing order as the tokens; the loss is the mean over
the whole sequence from each rank's sum and count (`group_mean_loss`). FSDP averages the gradients
over dp x cp, which makes the cp ranks' partial gradients the whole sequence's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tinytrain.model.context_parallel import group_mean_loss
from tinytrain.plan.context import RING_BLOCK

ATTENTION = "tinytrain_ring_flex"
MESH_DIMS = ("dp", "cp", "tp")


def mesh_shape(world: int, *, cp: int, tp: int) -> tuple[int, int, int]:
    """(dp, cp, tp): tp innermost (consecutive ranks, one node's fast links), cp next, dp outermost,
    as torchtitan lays them out; FSDP shards over dp x cp (the cp ranks hold the same weights)."""
    if world % (cp * tp):
        raise ValueError(f"cp({cp}) x tp({tp}) must divide the world size {world}")
    return (world // (cp * tp), cp, tp)


def build_mesh(device_type: str, world: int, *, cp: int, tp: int):
    """The dp x cp x tp device mesh (after the process group is up)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, mesh_shape(world, cp=cp, tp=tp), mesh_dim_names=MESH_DIMS)


class _FlexCore(torch.nn.Module):
    """The module torch's `_ContextParallel` hooks: its pre-hook all-gathers key and value over the
    cp group (their gradients reduce-scattered back), and this rank's queries attend to them."""

    def __init__(self, device_type: str):
        super().__init__()
        from torch.nn.attention.flex_attention import flex_attention

        # On GPUs the compiled flex kernel (eager flex materialises the scores). On a CPU flex
        # attention has no backward (torch 2.13), so the same block mask runs through SDPA instead.
        self.attend = torch.compile(flex_attention, dynamic=False) if device_type == "cuda" else dense_flex_attention

    def forward(self, query, key, value, *, block_mask, scale, enable_gqa):
        return self.attend(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def dense_flex_attention(query, key, value, *, block_mask, scale, enable_gqa):
    """flex_attention's result under `block_mask`, computed by SDPA on the mask's dense form: the
    CPU's kernel (it has a backward there). Every query keeps at least itself (causal masks
    only), so no row of the mask is empty."""
    from torch.nn.attention.flex_attention import create_mask

    rows, _, q_len, _ = query.shape
    mask = create_mask(block_mask.mask_mod, rows, None, q_len, key.shape[2], device=query.device)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)


def _document_mask(position_ids: torch.Tensor, window: int | None = None):
    """mask_mod over the whole rows: causal, and within one document (position ids restart at 0);
    with a `window`, transformers' sliding window too (a query sees the `window` keys up to itself)."""
    starts = position_ids == 0
    starts[:, 0] = True
    documents = starts.cumsum(-1)

    def mask(b, h, q, kv):
        return (q >= kv) & (documents[b, q] == documents[b, kv])

    def windowed(b, h, q, kv):
        return mask(b, h, q, kv) & (q - kv < window)

    return mask if window is None else windowed


# The windowed layers' block mask rides on the one the model is given (an attribute of that
# BlockMask): transformers hands every layer the same mask and names each layer's window in
# `sliding_window` (None: a global layer), and the attention picks by it.
WINDOWED = "tinytrain_windowed"


@dataclass
class RingGroup:
    """This rank's place on the cp dimension of the mesh, and the batch split torch makes for it."""

    mesh: object  # the cp sub-mesh (DeviceMesh)
    cp: int
    rank: int
    window: int | None = None  # the model's sliding window (Mistral, Gemma-2/3, ...), None without one

    @property
    def group(self):
        return self.mesh.get_group()

    def shard(self, batch: dict) -> dict:
        """This rank's load-balanced share of input ids, labels and position ids, and the block
        mask of its queries against the whole sequence (BlockMask: handed to the model as its
        attention mask, which Hugging Face passes through untouched).

        The rank's mask is torch's `_create_cp_block_mask` over the whole rows' mask_mod (what
        `_context_parallel_shard` makes of a BlockMask buffer), called directly: a whole-sequence
        BlockMask built eagerly first would materialise the dense seq x seq mask (17 GB per row
        at 128k tokens) only for its mask_mod and lengths to be read."""
        from torch.distributed.tensor.experimental._attention import _context_parallel_shard, _HeadTailLoadBalancer

        ids = batch["input_ids"]
        rows, seq = ids.shape
        if seq % (self.cp * RING_BLOCK):
            raise ValueError(f"a batch of {seq} tokens per row cannot be split over cp {self.cp} ranks by ring (a multiple of cp x {RING_BLOCK} is needed; the plan checks data.seq_len and data.pad_to_multiple_of)")
        positions = batch.get("position_ids")
        if positions is None:
            positions = torch.arange(seq, device=ids.device).expand(rows, seq)
        balancer = _HeadTailLoadBalancer(seq, self.cp, ids.device)
        names = ("input_ids", "labels", "position_ids")
        parts = _context_parallel_shard(self.mesh, [ids, batch["labels"], positions], [1, 1, 1], load_balancer=balancer)
        block_mask = rank_block_mask(_document_mask(positions), rows, seq, self.mesh, balancer)
        if self.window is not None:
            setattr(block_mask, WINDOWED, rank_block_mask(_document_mask(positions, self.window), rows, seq, self.mesh, balancer))
        return {**dict(zip(names, parts, strict=True)), "attention_mask": block_mask}

    def model_kwargs(self, input_ids, attention_mask=None, position_ids=None, **_) -> dict:
        """The model's inputs for a shard: its block mask goes in as the attention mask (Hugging
        Face passes a BlockMask through to the attention function untouched)."""
        return {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": attention_mask, "use_cache": False}

    def mean_loss(self, local_mean: torch.Tensor, labels: torch.Tensor, share: float | None = None) -> torch.Tensor:
        return group_mean_loss(local_mean, labels, self.group, share)

    def unshard(self, local: torch.Tensor) -> torch.Tensor:
        """A (rows, local seq, ...) tensor of this group, gathered back into whole-sequence order
        (no gradient: for checks and evaluation)."""
        from torch.distributed.tensor.experimental._attention import _HeadTailLoadBalancer, context_parallel_unshard

        balancer = _HeadTailLoadBalancer(local.shape[1] * self.cp, self.cp, local.device)
        return context_parallel_unshard(self.mesh, [local], [1], load_balancer=balancer)[0]


def rank_block_mask(mask_mod, rows: int, seq: int, cp_mesh, balancer):
    """The block mask of this rank's load-balanced queries against the whole sequence (one head
    dimension, shared), by torch's `_create_cp_block_mask`: built block by block (compiled), never
    as a dense mask."""
    try:
        from torch.distributed.tensor.experimental._context_parallel._attention import _create_cp_block_mask
    except ImportError:  # torch before the module moved
        from torch.distributed.tensor.experimental._attention import _create_cp_block_mask
    return _create_cp_block_mask(mask_mod, rows, 1, seq, seq, cp_mesh, balancer)


def enable_ring_on(model, device_type: str, world: int, *, cp: int, tp: int) -> RingGroup:
    """Build the dp x cp x tp mesh (every rank, after the process group is up) and route `model`'s
    attention through its cp dimension."""
    return enable_ring(model, build_mesh(device_type, world, cp=cp, tp=tp)["cp"])


def enable_ring(model, cp_mesh) -> RingGroup:
    """Route `model`'s attention through torch's context parallel on `cp_mesh` (the cp sub-mesh)."""
    from torch.distributed.tensor.experimental._attention import _ContextParallel
    from torch.distributed.tensor.parallel import parallelize_module
    from transformers import AttentionInterface

    core = _FlexCore(cp_mesh.device_type)
    parallelize_module(core, cp_mesh, _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX))

    window = getattr(model.config, "sliding_window", None)

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        # (rows, heads, local seq, dim) in; Hugging Face expects (rows, local seq, heads, dim) out.
        layer_window = kwargs.get("sliding_window")
        if layer_window is not None:
            if layer_window != window:
                raise ValueError(f"a layer's sliding window {layer_window} is not the model's {window}: ring builds one windowed mask")
            attention_mask = getattr(attention_mask, WINDOWED)
        out = core(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(ATTENTION, forward)
    model.set_attn_implementation(ATTENTION)
    return RingGroup(cp_mesh, cp_mesh.size(), cp_mesh.get_local_rank(), window)
