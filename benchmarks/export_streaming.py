"""The Hugging Face export of a sharded (fsdp_tp) checkpoint at three model sizes: the whole weights
consolidated then saved (save_pretrained, what the export did before) vs streamed from the shards
one tensor at a time (checkpoint/stream_export.py); peak extra memory of each over the weights' bytes.

The folder is a DCP save of a Llama's fp32 weights and its AdamW moments, as fsdp_tp writes it
(`state_dict.model.*`, `optimizer_0.state.*`), written by one process. Each export runs in a fresh
process; its peak extra memory is the kernel's high-water mark of the process (VmHWM, reset to the
current RSS through /proc/self/clear_refs just before the export, imports and tokenizer loaded) over
that RSS: exact, no sampling. Both exports write the
same bytes (checked here too).

    python benchmarks/export_streaming.py [--sizes 10M,50M,200M] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = {"10M": (256, 4, 1024, 8192), "50M": (512, 8, 2048, 16384), "200M": (1024, 8, 4096, 32000)}  # as checkpoint_scaling.py
TOKENIZER = REPO / "tinytrain" / "assets" / "bundled_tokenizer"


def config(size: str):
    from transformers import LlamaConfig

    hidden, layers, inter, vocab = SIZES[size]
    return LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter, vocab_size=vocab, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, tie_word_embeddings=False)


def write_folder(size: str, folder: Path) -> tuple[int, int]:
    """The sharded folder; returns the weights' bytes and the largest tensor's."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import LlamaForCausalLM

    warnings.filterwarnings("ignore", message=r"torch.distributed is disabled")

    torch.manual_seed(0)
    weights = LlamaForCausalLM(config(size)).state_dict()
    moments = {k: {"exp_avg": torch.randn_like(v), "exp_avg_sq": torch.rand_like(v)} for k, v in weights.items()}
    dcp.save({"state_dict": {"model." + k: v for k, v in weights.items()}, "optimizer_0": {"state": moments}}, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)
    sizes = [v.numel() * v.element_size() for v in weights.values()]
    return sum(sizes), max(sizes)


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def reset_peak() -> int:
    """The RSS now, the high-water mark reset to it (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_bytes("VmRSS")


def export(size: str, folder: Path, out: Path, mode: str) -> dict:
    """In this (fresh) process: one export, its peak extra memory."""
    import warnings

    warnings.filterwarnings("ignore")
    from tinytrain.checkpoint.export import export_sharded, export_state_dict
    from tinytrain.checkpoint.sharded import consolidated_weights
    from tinytrain.data.tokenizer import load_tokenizer

    tokenizer, cfg, rows = load_tokenizer(str(TOKENIZER)), config(size), SIZES[size][3]
    before = reset_peak()
    if mode == "whole":
        export_state_dict(consolidated_weights(folder, "export"), model_config=cfg, tokenizer=tokenizer, true_vocab=rows, out_dir=out)
    else:
        export_sharded(folder, model_config=cfg, tokenizer=tokenizer, true_vocab=rows, out_dir=out)
    peak = status_bytes("VmHWM")
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    return {"extra": peak - before, "sha": digest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10M,50M,200M")
    parser.add_argument("--dir", default=None, help="where the folders are written (default: a temp folder)")
    parser.add_argument("--one", nargs=4, metavar=("SIZE", "FOLDER", "OUT", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        size, folder, out, mode = args.one
        print(json.dumps(export(size, Path(folder), Path(out), mode)))
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="export-streaming-"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    print("fp32 weights + AdamW moments in a DCP folder; MB = 1e6 bytes; extra = peak RSS of the export over RSS before it")
    print(f"{'model':>6} {'weights MB':>10} {'whole extra MB':>14} {'streamed extra MB':>17} {'whole / weights':>15} {'streamed / weights':>18} {'streamed / whole':>16} {'streamed / largest':>18} {'same bytes':>10}")
    for size in args.sizes.split(","):
        folder = work / f"{size}.ckpt"
        weight_bytes, largest = write_folder(size, folder)
        got = {}
        for mode in ("whole", "streamed"):
            line = subprocess.run([sys.executable, __file__, "--one", size, str(folder), str(work / f"{size}-{mode}"), mode], env=env, check=True, capture_output=True, text=True).stdout
            got[mode] = json.loads(line.strip().splitlines()[-1])
            shutil.rmtree(work / f"{size}-{mode}", ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
        w, s = got["whole"]["extra"], got["streamed"]["extra"]
        print(f"{size:>6} {weight_bytes / 1e6:>10,.0f} {w / 1e6:>14,.0f} {s / 1e6:>17,.0f} {w / weight_bytes:>15.2f} {s / weight_bytes:>18.2f} {s / w:>16.2f} {s / largest:>18.2f} {str(got['whole']['sha'] == got['streamed']['sha']):>10}", flush=True)
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
