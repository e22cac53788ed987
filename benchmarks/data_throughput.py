"""Tokenize + pack throughput: tinytrain's token store against the Hugging Face run_clm.py recipe.

    python benchmarks/data_throughput.py [--mb 20] [--workers N] [--seq-len 2048] [--repeats 1]

Corpus: ../shared/data/tinyshakespeare.txt repeated to at least --mb MB, one document per
blank-line-separated block (~150k documents at 20 MB). Tokenizer: the Llama-2 tokenizer from
../shared/data (one loaded object for all three). Workers: --workers for both pipelines (default:
every core this process may use).

  raw ceiling  the tokenizer's own batch encode (encode_batch_fast) over documents already in
               memory, the ids not even read out, measured two ways: in this process with
               `workers` Rust threads, and in `workers` processes each encoding its share (timed
               inside the workers: no start-up, no transfer). The faster is the ceiling.
  tinytrain    read and split the file, tokenize in `workers` spawned processes, write the
               memory-mapped store (tokens + document index), then produce every packed window
               (input ids, labels, position ids) once, as training would
  tinytrain    the same documents shipped compressed: 8 `.jsonl.zst` shards (a `text` field per
   .jsonl.zst  document), decompressed and parsed while streaming, then as above
  HF recipe    load_dataset("text", sample_by="paragraph") + datasets.map(tokenize, batched,
               num_proc=workers) + datasets.map(group_texts, batched, num_proc=workers), the two
               functions as in transformers' examples/pytorch/language-modeling/run_clm.py

Tokens/s are content tokens (the same count for all three: same tokenizer, same documents) over
each pipeline's wall time; every pipeline starts cold (fresh cache folders). With --repeats N the
raw ceiling and tinytrain's two inputs run N times, interleaved (a machine shared with other work
slows them alike), and each reports its fastest run; the HF recipe runs once.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from itertools import chain
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=20.0, help="corpus size in MB (tinyshakespeare repeated)")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=1, help="runs of the ceiling and tinytrain, interleaved; the fastest of each counts")
    return p.parse_args()


def make_corpus(folder: Path, mb: float) -> tuple[Path, list[str]]:
    text = (SHARED / "tinyshakespeare.txt").read_text()
    copies = -(-int(mb * 1e6) // len(text.encode()))
    corpus = "\n\n".join([text.strip()] * copies) + "\n"
    path = folder / "corpus.txt"
    path.write_text(corpus)
    docs = [b.strip() for b in corpus.split("\n\n") if b.strip()]
    return path, docs


def raw_threads(tokenizer, docs: list[str]) -> tuple[float, int]:
    backend = tokenizer.backend_tokenizer
    start = time.perf_counter()
    encodings = backend.encode_batch_fast(docs, add_special_tokens=False)
    seconds = time.perf_counter() - start
    return seconds, sum(len(e) for e in encodings)


def _encode_share(tokenizer_json: str, docs: list[str]) -> float:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer_json)
    start = time.perf_counter()
    backend.encode_batch_fast(docs, add_special_tokens=False)
    return time.perf_counter() - start


def raw_processes(tokenizer, docs: list[str], workers: int) -> float:
    """Wall time of `workers` processes encoding equal shares, counting only the encoding."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    shares = [docs[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return max(pool.map(_encode_share, [tokenizer.backend_tokenizer.to_str()] * workers, shares))


def compressed_corpus(folder: Path, docs: list[str], shards: int = 8) -> Path:
    import json

    import zstandard

    folder.mkdir()
    for s in range(shards):
        lines = "".join(json.dumps({"text": d}) + "\n" for d in docs[s::shards])
        (folder / f"shard-{s:03d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(lines.encode()))
    return folder


def tinytrain_store(tokenizer, corpus: Path, cache: Path, workers: int, seq_len: int, source: str = "text") -> tuple[float, int, int]:
    import numpy as np
    from omegaconf import OmegaConf

    from tinytrain.config.schema import DataConfig, DataSource
    from tinytrain.data.packing import PackedWindows
    from tinytrain.data.sources import Source
    from tinytrain.data.store import ensure_store

    cfg = OmegaConf.structured(DataConfig(source=DataSource(source), path=str(corpus), cache_dir=str(cache), tokenize_workers=workers, seq_len=seq_len))
    start = time.perf_counter()
    store, built = ensure_store(Source.from_config(cfg), cfg, tokenizer, progress=False)
    windows = PackedWindows(store, np.arange(store.num_documents), seq_len)
    for i in range(len(windows)):
        windows[i]
    seconds = time.perf_counter() - start
    assert built
    return seconds, store.num_tokens, len(windows)


def hf_recipe(tokenizer, corpus: Path, cache: Path, workers: int, seq_len: int) -> tuple[float, int]:
    from datasets import disable_progress_bars, load_dataset

    disable_progress_bars()
    block_size = seq_len

    def tokenize_function(examples):
        return tokenizer(examples["text"])

    def group_texts(examples):
        concatenated_examples = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated_examples[list(examples.keys())[0]])
        total_length = (total_length // block_size) * block_size
        result = {k: [t[i : i + block_size] for i in range(0, total_length, block_size)] for k, t in concatenated_examples.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    start = time.perf_counter()
    raw = load_dataset("text", data_files={"train": str(corpus)}, sample_by="paragraph", cache_dir=str(cache))["train"]
    tokenized = raw.map(tokenize_function, batched=True, num_proc=workers, remove_columns=["text"])
    lm = tokenized.map(group_texts, batched=True, num_proc=workers)
    seconds = time.perf_counter() - start
    return seconds, len(lm)


def main() -> None:
    args = parse_args()
    # The raw ceiling uses the tokenizer's own thread pool; size it to the same worker count
    # before tokenizers starts it (the first parallel call).
    os.environ["RAYON_NUM_THREADS"] = str(args.workers)
    from tinytrain.data.tokenizer import load_tokenizer

    if not (SHARED / "llama2-tokenizer" / "tokenizer.model").exists():
        sys.exit(f"needs ../shared/data (looked in {SHARED})")
    tokenizer = load_tokenizer(str(SHARED / "llama2-tokenizer" / "tokenizer.model"))
    with tempfile.TemporaryDirectory(prefix="tinytrain-bench-") as tmp:
        tmp = Path(tmp)
        corpus, docs = make_corpus(tmp, args.mb)
        size_mb = corpus.stat().st_size / 1e6
        print(f"corpus     tinyshakespeare x{round(size_mb * 1e6 / (SHARED / 'tinyshakespeare.txt').stat().st_size)}: {size_mb:.1f} MB, {len(docs):,} documents")
        print(f"tokenizer  Llama-2 ({len(tokenizer)} tokens); workers {args.workers}; seq_len {args.seq_len}")

        shards = compressed_corpus(tmp / "shards", docs)
        runs: dict[str, list[float]] = {"threads": [], "processes": [], "ours": [], "zst": []}
        for r in range(args.repeats):
            os.environ["TOKENIZERS_PARALLELISM"] = "true"
            seconds, tokens = raw_threads(tokenizer, docs)
            runs["threads"].append(seconds)
            runs["processes"].append(raw_processes(tokenizer, docs, args.workers))
            seconds, stored, windows = tinytrain_store(tokenizer, corpus, tmp / f"cache{r}", args.workers, args.seq_len)
            runs["ours"].append(seconds)
            seconds, zst_stored, _ = tinytrain_store(tokenizer, shards, tmp / f"cache-zst{r}", args.workers, args.seq_len, "jsonl")
            runs["zst"].append(seconds)
        threads_s, processes_s, ours_s, zst_s = (min(runs[k]) for k in ("threads", "processes", "ours", "zst"))
        raw_s = min(threads_s, processes_s)
        # One thread per datasets worker process, as tinytrain's workers have.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        hf_s, blocks = hf_recipe(tokenizer, corpus, tmp / "hf-cache", args.workers, args.seq_len)

    def rate(seconds):
        return f"{tokens / seconds / 1e6:6.2f}M tokens/s  ({seconds:6.2f} s)"

    print(f"tokens     {tokens:,} content tokens ({stored:,} stored with one EOS per document)")
    threads = "1 thread" if args.workers == 1 else f"{args.workers} threads"
    processes = "1 process" if args.workers == 1 else f"{args.workers} processes"
    print(f"raw        {rate(threads_s)}   tokenizer batch encode, {threads} in one process")
    print(f"raw        {rate(processes_s)}   tokenizer batch encode, {processes} (encoding time only)")
    print(f"tinytrain  {rate(ours_s)}   store + {windows:,} packed windows")
    print(f"tinytrain  {rate(zst_s)}   the same from 8 .jsonl.zst shards ({zst_stored:,} tokens stored)")
    print(f"HF recipe  {rate(hf_s)}   datasets.map tokenize + group_texts -> {blocks:,} blocks")
    print(f"tinytrain / HF recipe: {hf_s / ours_s:.2f}x faster (target >= 3x)")
    if args.repeats > 1:
        print("runs (s)   " + "; ".join(f"{k} {', '.join(f'{x:.1f}' for x in v)}" for k, v in runs.items()))
    print(f"tinytrain / raw ceiling: {ours_s / raw_s:.2f}x the ceiling's time (target <= 1.15x); from .jsonl.zst shards {zst_s / raw_s:.2f}x")


if __name__ == "__main__":
    main()
