"""Ulysses context parallelism on a Hugging Face model, through DeepSpeed's own engine.

`deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF` wraps the model's attention
function: before it, each rank holds seq / cp tokens of every sequence; an all-to-all gives each
rank all tokens for heads / cp heads, the model's own attention runs, and a second all-to-all
returns to the sequence split. DeepSpeed gathers the position ids with the tokens and drops the
local attention mask, so the attention function it wraps must keep packed documents apart from the
gathered position ids alone (they restart at 0 where a document starts, data/collate.py):

- SDPA gets the block-diagonal causal mask built from them (tinytrain's SDPA path on CPU, V100, T4);
- a varlen kernel (torch's, flash-attn's) gets the documents' boundaries (cu_seq_lens), the rows
  flattened to one as model/packed_attention.py does without cp.

The training forward also hands the model the whole rows' boundaries (`cu_seq_lens_q/k`,
`max_length_q/k`, from the collator or found once per micro batch in `shard`), which Hugging Face
passes to every layer's attention as it does at cp=1. The varlen kernel takes them as they are and
SDPA keys its one mask per forward on them, so no layer waits on the GPU: finding boundaries in the
gathered position ids needs their values on the host (a device sync per layer, again in each
recompute). A forward without them (one not through `model_kwargs`) still finds them there.

The batch is split here too: every rank of a cp group receives the same micro batch (the sampler
deals batches to data-parallel ranks, rank // cp), and keeps its own slice of the sequence. The
labels are already shifted by the data stage (labels[i] is the token after i), so a slice's last
label is the next slice's first token, as DeepSpeed's data loader adapter arranges with its
shift_labels. Why not that adapter: it rotates each rank's own batch through the group, which would
make the data order depend on cp and break the sampler's resume position; slicing one
data-parallel batch keeps the stream of batches identical for every cp.

The loss is reduced over the group as DeepSpeed's Ulysses tutorial does: each rank's sum of token
losses and its count of labelled tokens gathered (differentiably), the mean over the whole
sequence on every rank. DeepSpeed then averages gradients over all world ranks (its data-parallel
group is the whole world without an mpu), which makes the cp ranks' partial gradients the cp=1
gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tinytrain.data.collate import batch_boundaries, document_boundaries
from tinytrain.model.token_sums import token_sum

DOCUMENTS_SUFFIX = "_documents"


@dataclass
class ContextGroup:
    """This rank's place in its cp group (consecutive global ranks, DeepSpeed's layout)."""

    cp: int
    rank: int  # within the group
    group: object  # the process group
    micro_batch_size: int  # the rows DeepSpeed's Ulysses attention was built for

    def shard(self, batch: dict) -> dict:
        """This rank's slice of every (rows, seq) tensor of the batch; the rest left as it is. A
        short last validation batch gets rows without labels up to the micro batch (Ulysses reshapes
        by a fixed row count); they add nothing to the loss."""
        batch = self.full_rows(batch)
        seq = batch["input_ids"].shape[1]
        if seq % self.cp:
            raise ValueError(f"a batch of {seq} tokens per row cannot be split over cp {self.cp} ranks (the plan checks data.seq_len; a padded batch must be padded to a multiple of cp)")
        chunk = seq // self.cp
        part = slice(self.rank * chunk, (self.rank + 1) * chunk)
        out = {key: value[:, part] if torch.is_tensor(value) and value.dim() == 2 and value.shape[1] == seq else value for key, value in batch.items()}
        # The attention sees the whole rows again after Ulysses' gather: their boundaries, not the slice's.
        out["cu_seq_lens"], out["max_length"] = whole_rows_boundaries(batch)
        return out

    def full_rows(self, batch: dict) -> dict:
        rows = batch["input_ids"].shape[0]
        missing = self.micro_batch_size - rows
        if missing <= 0:
            return batch
        out = {k: v for k, v in batch.items() if k not in ("cu_seq_lens", "max_length")}  # the added rows' documents too
        for key, value in batch.items():
            if torch.is_tensor(value) and value.dim() == 2 and value.shape[0] == rows:
                fill = -100 if key == "labels" else 0
                pad = value[:1].clone().fill_(fill)
                if key == "position_ids":
                    pad = value[:1].clone()
                out[key] = torch.cat([value, pad.expand(missing, -1)])
        return out

    def model_kwargs(self, input_ids, attention_mask=None, position_ids=None, cu_seq_lens=None, max_length=None, **_) -> dict:
        """The model's inputs for a slice: Ulysses gathers the position ids over the group; the
        whole rows' boundaries from `shard` go to every layer's attention as they are (without
        them it finds the documents in the gathered position ids); a mask of the local slice
        means nothing."""
        kwargs = {"input_ids": input_ids, "position_ids": position_ids if position_ids is not None else self.positions(input_ids), "use_cache": False}
        if cu_seq_lens is not None and max_length is not None:
            cu_seq_lens = cu_seq_lens.to(device=input_ids.device, dtype=torch.int32)
            kwargs.update(cu_seq_lens_q=cu_seq_lens, cu_seq_lens_k=cu_seq_lens, max_length_q=int(max_length), max_length_k=int(max_length))
        return kwargs

    def positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Position ids of this rank's slice of unpacked rows (Ulysses needs them in every forward)."""
        chunk = input_ids.shape[1]
        start = self.rank * chunk
        return torch.arange(start, start + chunk, device=input_ids.device).expand_as(input_ids)

    def mean_loss(self, local_mean: torch.Tensor, labels: torch.Tensor, share: float | None = None) -> torch.Tensor:
        return group_mean_loss(local_mean, labels, self.group, share)


def whole_rows_boundaries(batch: dict) -> tuple[torch.Tensor, int]:
    """(cu_seq_lens, max_length) of the batch's whole rows flattened to one: the collator's when it
    made them (packed rows), every row one document when there are no position ids (no device
    sync either way), else found in the position ids (a short batch given extra rows)."""
    if "position_ids" not in batch:
        rows, seq = batch["input_ids"].shape
        return torch.arange(0, rows * seq + 1, seq, device=batch["input_ids"].device, dtype=torch.int32), seq
    return batch_boundaries(batch)


def group_mean_loss(local_mean: torch.Tensor, labels: torch.Tensor, group, share: float | None = None) -> torch.Tensor:
    """The mean token loss over the whole sequence from each rank's mean over its slice: the sums of
    token losses reduced over the cp group differentiably (its backward sums the group's gradients
    into every rank's share), the counts of labelled tokens as plain numbers. `share`: the divisor
    instead of the group's count (the module's token_loss)."""
    import torch.distributed as dist
    from torch.distributed._functional_collectives import all_reduce  # differentiable (torch.distributed.nn's is deprecated)

    # A slice with no labelled token has a NaN mean (0 / 0): it adds nothing; a non-finite mean of
    # labelled tokens stays one.
    total = all_reduce(token_sum(local_mean, labels), "sum", group)
    if share is not None:
        return total / share
    tokens = (labels != -100).sum().to(torch.float32).reshape(1)
    dist.all_reduce(tokens, group=group)
    return total / tokens.clamp(min=1.0)[0]


# Each core attention's own function, kept before a flash core's name is given to its wrapper.
CORE_FUNCTIONS: dict = {}


def documents_attention(core: str) -> str:
    """Register the model's attention (`core`) over whole gathered sequences, packed documents kept
    apart: under `<core>_documents`, or under the core's own name for a flash-attn one, whose
    kernels transformers loads by the model's implementation name (a renamed one would be looked
    for on the hub), as DeepSpeed's Ulysses wrapper takes the core's name. Returns the name to give
    the model."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    base = CORE_FUNCTIONS.setdefault(core, AttentionInterface._global_mapping[core])
    forward = _masked_sdpa(base) if core == "sdpa" else _with_boundaries(base)
    if "flash" in core:  # transformers' own test (is_flash_attention_requested); its mask is already the flash one
        AttentionInterface.register(core, forward)
        return core
    name = core + DOCUMENTS_SUFFIX
    AttentionInterface.register(name, forward)
    # The model's own mask over the local slice is dropped by Ulysses; the cheapest one to build.
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def _document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    starts = position_ids == 0
    starts[:, 0] = True
    return starts.cumsum(-1)


BOUNDARY_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _masked_sdpa(sdpa):
    # Every layer gets the same gathered position ids within a forward: the (rows, seq, seq) mask is
    # built once per window and shared (one tensor saved for backward, not one per layer). A model
    # with sliding-window layers (Mistral, Gemma-2/3, Qwen2 with use_sliding_window) names each
    # layer's window in `sliding_window` (None: a global layer), so each window has its own mask.
    cached: dict = {}

    # Outside compiled graphs: a block's graph is then the same whether the cache hit or missed, so
    # a checkpoint's recompute, which hits it, replays what the block's forward ran (with transformers
    # 5.17, which checkpoints around the compiled call, a graph of its own for a miss broke that).
    @torch.compiler.disable
    def documents_mask(positions: torch.Tensor, dtype: torch.dtype, forward_key: torch.Tensor | None, window: int | None) -> torch.Tensor:
        last = cached.setdefault(window, {})
        if forward_key is not None:
            # The training forward's boundaries: one tensor object handed to every layer (and to
            # its recompute), so identity says whether this forward's mask is built, with no
            # device sync. A recompute that hits runs none of the ops its forward ran to build
            # it; none of them is one selective checkpointing keeps.
            hit = last.get("key") is forward_key and last["mask"].dtype == dtype
        else:
            # A forward without them compares the values in every call, hit or miss (a sync on a
            # GPU): selective checkpointing replays a layer's ops in its recompute, which hits the
            # cache, and stops at an op the layer's forward did not run (the first call compares
            # the positions with themselves; torch.equal of two shapes is False).
            hit = torch.equal(last.get("positions", positions), positions) and "mask" in last and last["mask"].dtype == dtype
        if not hit:
            doc = _document_ids(positions)
            seq = doc.shape[1]
            causal = torch.ones(seq, seq, dtype=torch.bool, device=doc.device).tril()
            if window is not None:  # transformers' sliding window: a query sees the `window` keys up to itself
                causal = causal.triu(-(window - 1))
            allowed = ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]
            # Additive, in the attention's dtype: SDPA would turn a boolean mask into one per call.
            mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device).masked_fill_(~allowed, torch.finfo(dtype).min)
            last.update(positions=positions, mask=mask, key=forward_key)
        return last["mask"]

    def forward(module, query, key, value, attention_mask, **kwargs):
        positions = kwargs["position_ids"]  # (rows, seq): the gathered whole sequence
        forward_key = kwargs.get("cu_seq_lens_q")
        rest = {k: v for k, v in kwargs.items() if k not in BOUNDARY_KEYS}
        return sdpa(module, query, key, value, documents_mask(positions, query.dtype, forward_key, kwargs.get("sliding_window")), **rest)

    return forward


def _with_boundaries(varlen):
    def forward(module, query, key, value, attention_mask, **kwargs):
        b, h, s, d = query.shape
        if kwargs.get("cu_seq_lens_q") is not None:  # the whole rows', from the training forward
            cu, longest = kwargs["cu_seq_lens_q"], kwargs["max_length_q"]
        else:  # found in the gathered position ids: their values on the host (a device sync)
            cu, longest = document_boundaries(kwargs["position_ids"].cpu())
            cu = cu.to(device=query.device, dtype=torch.int32)

        def one_row(x):  # (rows, heads, seq, dim) -> (1, heads, rows x seq, dim)
            return x.transpose(0, 1).reshape(1, x.shape[1], -1, d)

        bounds = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
        rest = {k: v for k, v in kwargs.items() if k != "position_ids" and k not in BOUNDARY_KEYS}
        out, weights = varlen(module, one_row(query), one_row(key), one_row(value), None, **rest, **bounds)
        return out.reshape(b, s, h, d), weights  # (1, rows x seq, heads, dim) back to rows

    return forward


def enable_ulysses(model, *, cp: int, micro_batch_size: int) -> ContextGroup:
    """Wrap `model`'s attention in DeepSpeed's Ulysses for groups of `cp` consecutive ranks (after
    deepspeed.comm is initialised, before deepspeed.initialize); returns this rank's group."""
    import deepspeed
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    from tinytrain.cluster.deepspeed_comm import skip_shared_memory_all_reduce

    if not deepspeed.comm.is_initialized():  # under fsdp_tp: torch.distributed is up, deepspeed.comm wraps it
        skip_shared_memory_all_reduce()
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())
    config = model.config
    name = documents_attention(config._attn_implementation)
    if name != config._attn_implementation:
        model.set_attn_implementation(name)
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        core_attn_implementation=name,
        sequence_parallel_size=cp,
        micro_batch_size=micro_batch_size,
        seq_length_is_variable=True,  # SFT batches are padded to their longest row, a multiple of cp
    )
    return ContextGroup(cp, mpu.get_sequence_parallel_rank(), mpu.get_sequence_parallel_group(), micro_batch_size)
