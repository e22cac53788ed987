"""Tokens/s per device and model FLOPs utilisation (MFU), per step and for the whole run.

FLOPs per batch come from tinytrain/plan/flops.py (6 x matmul params per token + attention term,
with packed documents' squared lengths when the batch carries position_ids). The peak is the
hardware table's dense bf16 or fp16 figure for the resolved precision; without one (CPU, fp32,
a GPU not in the table) MFU is omitted and the summary says why.
"""

from __future__ import annotations

import logging
import sys
import time
from array import array

import lightning.pytorch as pl

from tinytrain.data.collate import COUNTS, tokens_and_squares
from tinytrain.model.module import writes_metrics_row
from tinytrain.plan.flops import batch_flops
from tinytrain.plan.model_shape import ModelShape
from tinytrain.plan.precision import Dtype

log = logging.getLogger(__name__)


def seconds_since_process_start() -> float:
    import psutil

    return time.time() - psutil.Process().create_time()


def peak_tflops(hardware, dtype: Dtype) -> tuple[float | None, str]:
    """(peak dense TFLOP/s per device, why) for MFU."""
    if hardware.is_cpu:
        return None, "MFU omitted: no tensor-core peak for a CPU"
    if dtype is Dtype.fp32:
        return None, f"MFU omitted: fp32 on {hardware.name} has no dense peak in the hardware table"
    peak = hardware.peak_bf16_tflops if dtype is Dtype.bf16 else hardware.peak_fp16_tflops
    if peak is None:
        return None, f"MFU omitted: {hardware.name} is not in the hardware table (tinytrain/plan/hardware.py)"
    return peak, f"{dtype.value} dense peak {peak:g} TFLOP/s ({hardware.name})"


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process (0 where nothing imported the compiler)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return utils.counters["stats"]["unique_graphs"] if utils is not None else 0


class ThroughputMonitor(pl.Callback):
    """Measured between consecutive optimizer steps, so data loading, every hook and checkpoint
    writes count: it is what a user gets. Validation is left out, and the work other callbacks do at
    its end (sample generations: build_trainer orders them before this one), but not the
    checkpoint saved there. The run summary leaves out the
    first step (warm-up) and every step in which torch.compile compiled on any rank (a block
    compiled again for a new input, e.g. its first batch with a packed-documents mask, or after
    validation's no-grad forwards; the other ranks wait for it at the gradients' exchange) or the
    profiler traced (`profiled(n)`: the process's n-th step, from 0): the steady rate, and how many
    steps it leaves out. Each rank keeps its steps' counts (24 bytes a step) and the steps it
    compiled in; the ranks exchange those at the end of training, once."""

    def __init__(self, shape: ModelShape, peak_tflops_per_device: float | None, peak_note: str, *, ranks_per_batch: int = 1, profiled=None):
        self.shape = shape
        # The tp x cp ranks of a data-parallel rank each see its whole batch and compute a share of
        # it (tp: of every matmul; cp: of the sequence): each token and FLOP is counted once across
        # them (under fsdp_tp tp 2 each rank logged the pair's tokens/s as its own, and MFU x 2).
        self.ranks_per_batch = ranks_per_batch
        self.peak = peak_tflops_per_device
        self.peak_note = peak_note
        self._tokens = 0
        self._flops = 0.0
        self._last_time: float | None = None
        self._last_step = 0
        self._paused = 0.0  # validation time inside the current step interval
        self._validation_start: float | None = None
        self.profiled = profiled or (lambda n: False)
        self._steps = 0  # optimizer steps this process has taken
        self._graphs = 0
        self._measured = array("d")  # (step index, tokens, FLOPs, seconds) of each measured step
        self.compiled: set[int] = set()  # steps (this process's, from 0) any rank compiled in

    def on_train_start(self, trainer, pl_module):
        self._last_step = trainer.global_step  # a resumed run's first micro batch is inside its step

    def on_validation_start(self, trainer, pl_module):
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        if self._validation_start is not None:
            self._paused += time.perf_counter() - self._validation_start

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # Counted by the collator on the CPU; a batch from elsewhere is counted here, on the device.
        tokens, squares = batch[COUNTS] if COUNTS in batch else tokens_and_squares(batch)
        self._tokens += tokens / self.ranks_per_batch
        self._flops += batch_flops(self.shape, tokens, squares) / self.ranks_per_batch
        step = trainer.global_step
        if step == self._last_step:  # inside gradient accumulation
            return
        now = time.perf_counter()
        if step == 1:
            log.info("first optimizer step done %.1f s after process start", seconds_since_process_start())
        graphs, self._graphs = self._graphs, compiled_graphs()
        if self._last_time is not None:
            elapsed = now - self._last_time - self._paused
            if writes_metrics_row(trainer):  # read by the loggers and the progress lines only
                pl_module.log("tokens_per_s", self._tokens / elapsed, prog_bar=True)
                if self.peak:
                    pl_module.log("mfu", self._flops / elapsed / (self.peak * 1e12))
            self._measured.extend((self._steps, self._tokens, self._flops, elapsed))
            if self._graphs != graphs:
                self.compiled.add(self._steps)
        self._steps += 1
        self._tokens, self._flops, self._paused = 0, 0.0, 0.0
        self._last_time, self._last_step = now, step

    def on_train_end(self, trainer, pl_module):
        """The steps any rank compiled in (a handful): one exchange, while the ranks are together."""
        import torch.distributed as dist

        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            every: list = [None] * dist.get_world_size()
            dist.all_gather_object(every, sorted(self.compiled))
            self.compiled = set().union(*map(set, every))

    def steady(self) -> tuple[float, float, float, dict]:
        """(tokens, FLOPs, seconds) of the measured steps not left out, and the counts left out."""
        tokens = flops = seconds = 0.0
        left_out = {"compiling": 0, "profiling": 0}
        for i in range(0, len(self._measured), 4):
            step, step_tokens, step_flops, elapsed = self._measured[i : i + 4]
            why = "compiling" if int(step) in self.compiled else "profiling" if self.profiled(int(step)) else None
            if why:
                left_out[why] += 1
            else:
                tokens, flops, seconds = tokens + step_tokens, flops + step_flops, seconds + elapsed
        return tokens, flops, seconds, left_out

    def summary(self) -> dict:
        tokens, flops, seconds, left_out = self.steady()
        if seconds == 0:
            return {"tokens_per_s_per_device": None, "mfu": None, "note": "too few steps to measure", "left_out": left_out}
        mfu = flops / seconds / (self.peak * 1e12) if self.peak else None
        return {"tokens_per_s_per_device": tokens / seconds, "mfu": mfu, "note": self.peak_note, "left_out": left_out}
