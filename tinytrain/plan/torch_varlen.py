"""What the installed torch's packed-document kernel offers.

`torch.nn.attention.varlen.varlen_attn` (FlashAttention's varlen kernel inside PyTorch, CUDA only,
torch >= 2.10) changed its signature between releases: 2.10 takes `is_causal` and nothing else;
later releases take `scale` and `window_size` (causal is (-1, 0), a sliding window (W - 1, 0)); 2.12
adds `enable_gqa`. What a run may ask of it is read from the signature, not the version number, so
a build in between is read right. `read_support(fn)` is the seam tests use to stand for another
torch: it reads any function's signature.

The installed torch's signature is read from the module's source, not by importing it: importing
torch.nn.attention.varlen pulls in torch._dynamo, sympy and torch.export (~1.1 s), which doubled
the time of `mode=plan` even on a CPU where the kernel cannot run.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path

# FlashAttention's kernels (torch's varlen included) run on Ampere and newer only.
MIN_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class VarlenSupport:
    available: bool
    window: bool = False  # window_size=(left, right): causal, and sliding windows (Mistral)
    gqa: bool = False  # enable_gqa: k/v with fewer heads than q (else k/v are repeated per group)
    scale: bool = False  # scale=: a softmax scale other than 1/sqrt(head_dim)
    torch_version: str = ""

    def gap(self, sliding_window: bool, softcap: bool) -> str | None:
        """Why this torch's varlen kernel cannot run the model, or None when it can."""
        if not self.available:
            return f"torch {self.torch_version} has no torch.nn.attention.varlen (it needs torch >= 2.10)"
        if sliding_window and not self.window:
            return f"torch {self.torch_version}'s varlen_attn takes no window_size (the model's sliding window)"
        if softcap:
            return "torch's varlen_attn has no attention soft-capping"
        return None


def read_support(fn, torch_version: str) -> VarlenSupport:
    """What a varlen_attn function with `fn`'s signature can be asked for."""
    if fn is None:
        return VarlenSupport(False, torch_version=torch_version)
    return from_parameters(inspect.signature(fn).parameters, torch_version)


def from_parameters(names, torch_version: str) -> VarlenSupport:
    return VarlenSupport(True, window="window_size" in names, gqa="enable_gqa" in names, scale="scale" in names, torch_version=torch_version)


def parameters_in_source(source: str, name: str = "varlen_attn") -> list[str] | None:
    """The parameter names of the module-level function `name` in `source`, or None where it is
    not defined there by a plain `def` (then only importing it tells)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            return [arg.arg for arg in a.posonlyargs + a.args + a.kwonlyargs]
    return None


def varlen_function():
    """torch's varlen_attn, or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def installed_support() -> VarlenSupport:
    import torch

    version = torch.__version__.split("+")[0]
    try:
        spec = importlib.util.find_spec("torch.nn.attention.varlen")
    except ModuleNotFoundError:  # a torch without torch.nn.attention
        spec = None
    if spec is None or not spec.origin:
        return VarlenSupport(False, torch_version=version)
    names = parameters_in_source(Path(spec.origin).read_text(encoding="utf-8"))
    if names is None:
        return read_support(varlen_function(), version)
    return from_parameters(names, version)
