"""How the data path grows with the corpus: build throughput in parts, peak memory of a build and of
a rank's data path, the sample index at 2B vs 20B tokens, time to first batch, SFT start warm vs cold.

    python benchmarks/data_scaling.py [--small-mb 20] [--large-mb 200] [--workers 2] [--only corpus|index|mixture|sft]

Every measurement runs in a fresh child process (peak RSS is the child's own ru_maxrss; "added"
is peak RSS minus the RSS after imports, before the data is touched). Corpus: synthetic JSON Lines
documents (~1,200 characters each), in 8 shards per size, tokenized with the bundled tokenizer.

  build 1 vs 2 parts   the same 20 MB corpus (.jsonl.zst shards): one store built by one process
                       with `workers` tokenizing processes, against data.prepare_parts=2 built as
                       two parts in parallel processes; and plain .jsonl vs .jsonl.zst input
  build RSS            one in-process build (data.tokenize_workers=0) at small vs large MB
  data path RSS        a rank opening the built store and drawing its first 1,000 windows (the index
                       already written by the first rank), small vs large MB
  index 2B vs 20B      synthetic stores (document offsets of ~1,000-token documents, a sparse token
                       file): the first rank computing the index, and another rank mapping it and
                       drawing 1,000 windows of 2048: added memory, time to first batch
  mixture 2B vs 20B    a two-source mixture (data.sources, weights 0.7 / 0.3) over synthetic stores
                       of 1B + 1B vs 10B + 10B tokens: the first rank computes the index and the pass
                       orders, another rank (1 of 8) maps them and draws 1,000 windows of 2048:
                       private memory; side by side, the same rank with the pass orders computed in
                       memory and the epoch's stream at once (how the sampler worked before)
  SFT warm vs cold     a DataModule over 4,000 Alpaca-style records, first start (tokenizes) vs the
                       next (reads the cache); the same for 4,000 preference pairs (data.format=preference)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import compose

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "tinytrain" / "assets" / "bundled_tokenizer"
WINDOWS = 1000


def _status(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return 0.0


def rss_mb() -> float:
    return _status("VmRSS:")


def reset_peak() -> float:
    """Starts the peak over from now (Linux: clear_refs 5 resets VmHWM), so what imports and the
    tokenizer's loading peaked at is not counted; returns the RSS now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_mb()


def peak_mb() -> float:
    return _status("VmHWM:") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- children -------------------------------------------------------------------------------------


def data_cfg(overrides: list[str]):
    return compose(["data=jsonl", "data.text_field=text", *overrides]).data


def child_build(args) -> dict:
    from tinytrain.data import parts
    from tinytrain.data.sources import Source
    from tinytrain.data.store import ensure_store
    from tinytrain.data.tokenizer import load_tokenizer

    tok = load_tokenizer(str(TOKENIZER))
    cfg = data_cfg([f"data.path={args.path}", f"data.cache_dir={args.cache}", f"data.tokenize_workers={args.workers}", f"data.prepare_parts={args.parts}"])
    base = reset_peak()
    start = time.perf_counter()
    store, _ = parts.ensure(Source.from_config(cfg), cfg, tok, False) if args.parts > 1 else ensure_store(Source.from_config(cfg), cfg, tok, False)
    return {"seconds": time.perf_counter() - start, "tokens": store.num_tokens, "added_mb": peak_mb() - base, "peak_mb": peak_mb()}


def child_windows(args) -> dict:
    """A rank's data path: the DataModule over a built store, then its first WINDOWS windows."""
    from tinytrain.data.datamodule import DataModule
    from tinytrain.data.tokenizer import load_tokenizer

    tok = load_tokenizer(str(TOKENIZER))
    overrides = [f"data.cache_dir={args.cache}", f"data.seq_len={args.seq_len}"]
    overrides += [f"data.store={args.store}"] if args.store else [f"data.path={args.path}", "data.tokenize_workers=0"]
    cfg = data_cfg(overrides)
    base = reset_peak()
    anon, file = _status("RssAnon:"), _status("RssFile:")
    start = time.perf_counter()
    dm = DataModule(cfg, tok, micro_batch_size=8, seed=0, progress=False, data_parallel=args.world)
    dm.train_sampler.set_shard(args.rank, args.world)
    seen, first = 0, None
    for batch in dm.train_sampler:
        for i in batch:
            dm.train[i]
        if first is None:
            first = time.perf_counter() - start
        seen += len(batch)
        if seen >= WINDOWS:
            break
    return {
        "first_batch_s": first,
        "seconds": time.perf_counter() - start,
        "added_mb": peak_mb() - base,
        "anon_mb": _status("RssAnon:") - anon,  # private to this rank
        "file_mb": _status("RssFile:") - file,  # mapped pages of the shared page cache
        "windows": len(dm.train),
    }


def child_mixture(args) -> dict:
    """A rank's data path over a two-source mixture whose stores (synthetic) are in the cache."""
    from tinytrain.data import mixture_sampler
    from tinytrain.data.datamodule import DataModule
    from tinytrain.data.tokenizer import load_tokenizer

    tok = load_tokenizer(str(TOKENIZER))
    cfg = data_cfg(mixture_overrides(Path(args.path), Path(args.cache)))
    base = reset_peak()
    anon = _status("RssAnon:")
    start = time.perf_counter()
    dm = DataModule(cfg, tok, micro_batch_size=8, seed=0, progress=False, data_parallel=args.world)
    sampler = dm.train_sampler
    if args.orders == "memory":  # as before: pass orders in memory, the epoch's stream at once
        mixture_sampler.CHUNK = 1 << 62
        sampler = mixture_sampler.MixtureBatchSampler(sampler.names, sampler.sizes, sampler.weights, sampler.batch_size, sampler.seed)
    sampler.set_shard(args.rank, args.world)
    seen, first = 0, None
    for batch in sampler:
        for i in batch:
            dm.train[i]
        if first is None:
            first = time.perf_counter() - start
        sampler.advance()
        seen += len(batch)
        if seen >= WINDOWS:
            break
    return {"first_batch_s": first, "seconds": time.perf_counter() - start, "added_mb": peak_mb() - base, "anon_mb": _status("RssAnon:") - anon, "windows": len(dm.train)}


def mixture_overrides(folder: Path, cache: Path) -> list[str]:
    entries = ", ".join(f"{{path: {folder / name}.txt, weight: {w}}}" for name, w in (("web", 0.7), ("code", 0.3)))
    return ["data=mixture", f"data.sources=[{entries}]", f"data.cache_dir={cache}", "data.seq_len=2048", "data.val_fraction=0.001"]


def child_sft(args) -> dict:
    from tinytrain.data.datamodule import DataModule
    from tinytrain.data.tokenizer import load_tokenizer

    tok = load_tokenizer(str(TOKENIZER))
    data = ["data=alpaca"] if args.orders != "preference" else ["data=jsonl", "data.format=preference", "finetune.objective=dpo"]  # --orders: the kind of records
    cfg = compose([*data, f"data.path={args.path}", f"data.cache_dir={args.cache}", "data.chat_template=alpaca", "data.seq_len=256"]).data
    start = time.perf_counter()
    DataModule(cfg, tok, micro_batch_size=8, seed=0, progress=False)
    return {"seconds": time.perf_counter() - start}


def run_child(kind: str, **kw) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, *(f"--{k.replace('_', '-')}={v}" for k, v in kw.items())]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{kind} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- inputs ---------------------------------------------------------------------------------------


def make_corpus(folder: Path, mb: float, compress: bool, shards: int = 8) -> Path:
    import random

    import zstandard

    folder.mkdir(parents=True)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(3000)] + ["the", "of", "and", "a", "to", "in", "is", "that"] * 200
    per_shard = int(mb * 1e6 / shards)
    for s in range(shards):
        lines, size = [], 0
        while size < per_shard:
            line = json.dumps({"text": " ".join(rng.choices(words, k=240))}) + "\n"
            lines.append(line)
            size += len(line)
        raw = "".join(lines).encode()
        if compress:
            (folder / f"shard-{s:03d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(raw))
        else:
            (folder / f"shard-{s:03d}.jsonl").write_bytes(raw)
    return folder


def synthetic_store(folder: Path, tokens: float) -> Path:
    """Document offsets of ~1,000-token documents summing to `tokens`, a sparse uint16 token file,
    and meta.json as a store built with the bundled tokenizer would have."""
    import numpy as np

    from tinytrain.data.store import STORE_FORMAT
    from tinytrain.data.tokenizer import fingerprint, load_tokenizer

    folder.mkdir(parents=True)
    n_docs = int(tokens // 1000)
    lengths = np.random.default_rng(0).integers(200, 1800, n_docs)
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    np.save(folder / "doc_offsets.npy", offsets)
    with (folder / "tokens.bin").open("wb") as f:
        f.truncate(int(offsets[-1]) * 2)  # sparse: reads as zeros, takes no disk
    tok = load_tokenizer(str(TOKENIZER))
    meta = {
        "format": STORE_FORMAT, "dtype": "uint16", "num_documents": n_docs, "num_tokens": int(offsets[-1]), "true_vocab": len(tok),
        "tokenizer": str(TOKENIZER), "tokenizer_fingerprint": fingerprint(tok), "append_eos": True, "prepend_bos": False,
        "max_token_id": 3, "bad_records": "no bad records", "store_key": f"synthetic-{n_docs}",
    }
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def sft_records(path: Path, n: int = 4000) -> Path:
    path.write_text("".join(json.dumps({"instruction": f"Say something about topic {i}.", "input": "", "output": f"Topic {i} is " + "quite interesting, " * (i % 20 + 3)}) + "\n" for i in range(n)))
    return path


# -- the report -----------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small-mb", type=float, default=20.0)
    p.add_argument("--large-mb", type=float, default=200.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", choices=["corpus", "index", "mixture", "sft"], help="one section of the report")
    p.add_argument("--child")
    for name in ("path", "cache", "store", "orders"):
        p.add_argument(f"--{name}", default="")
    for name, default in (("parts", 1), ("seq-len", 2048), ("rank", 0), ("world", 1)):
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args()
    if args.child:
        print(json.dumps({"build": child_build, "windows": child_windows, "mixture": child_mixture, "sft": child_sft}[args.child](args)))
        return

    root = Path(tempfile.mkdtemp(prefix="tinytrain-data-scaling-"))
    try:
        report(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(args, root: Path) -> None:
    print(f"data scaling: bundled tokenizer, {args.workers} workers, synthetic JSON Lines in 8 shards")
    if args.only in (None, "corpus"):
        corpus_section(args, root)
    if args.only in (None, "index"):
        index_section(root)
    if args.only in (None, "mixture"):
        mixture_section(root)
    if args.only in (None, "sft"):
        sft_section(root)


def corpus_section(args, root: Path) -> None:
    w = args.workers
    zst = make_corpus(root / "small_zst", args.small_mb, compress=True)
    plain = make_corpus(root / "small_plain", args.small_mb, compress=False)
    print(f"  corpus {args.small_mb:g} MB: .jsonl.zst shards {sum(f.stat().st_size for f in zst.iterdir()) / 1e6:.1f} MB on disk")

    one = run_child("build", path=zst, cache=root / "c1", workers=w, parts=1)
    two = run_child("build", path=zst, cache=root / "c2", workers=w, parts=2)
    raw = run_child("build", path=plain, cache=root / "c3", workers=w, parts=1)
    rate = lambda r: r["tokens"] / r["seconds"]  # noqa: E731
    print(f"  build, 1 part ({w} tokenizing processes): {rate(one):,.0f} tokens/s ({one['seconds']:.1f} s, {one['tokens']:,} tokens)")
    print(f"  build, 2 parts ({min(w, 2)} processes, a part each): {rate(two):,.0f} tokens/s ({two['seconds']:.1f} s); 2 parts / 1 part: {rate(two) / rate(one):.2f}x")
    print(f"  input .jsonl.zst vs .jsonl (1 part): {rate(one):,.0f} vs {rate(raw):,.0f} tokens/s; zst / plain: {rate(one) / rate(raw):.2f}x")

    large = make_corpus(root / "large", args.large_mb, compress=False)
    small_path = plain
    b_small = run_child("build", path=small_path, cache=root / "rss_small", workers=0, parts=1)
    b_large = run_child("build", path=large, cache=root / "rss_large", workers=0, parts=1)
    print(
        f"  build peak RSS (in-process tokenizing): {args.small_mb:g} MB {b_small['peak_mb']:.0f} MB (+{b_small['added_mb']:.0f} MB over the loaded process), "
        f"{args.large_mb:g} MB {b_large['peak_mb']:.0f} MB (+{b_large['added_mb']:.0f} MB); ratio {b_large['peak_mb'] / b_small['peak_mb']:.2f}x for {args.large_mb / args.small_mb:g}x data"
    )
    path_rss = {}
    for name, path, cache in (("small", small_path, root / "rss_small"), ("large", large, root / "rss_large")):
        run_child("windows", path=path, cache=cache, seq_len=256)  # the first rank: writes the index
        path_rss[name] = run_child("windows", path=path, cache=cache, seq_len=256, rank=1, world=2)
    s, l_ = path_rss["small"], path_rss["large"]
    print(
        f"  data path, a second rank: open + first {WINDOWS} windows of 256: added {s['added_mb']:.1f} MB at {args.small_mb:g} MB ({s['anon_mb']:.1f} private), "
        f"{l_['added_mb']:.1f} MB at {args.large_mb:g} MB ({l_['anon_mb']:.1f} private); private {l_['anon_mb'] / max(s['anon_mb'], 0.1):.2f}x, "
        f"mapped page cache {l_['file_mb']:.1f} / {s['file_mb']:.1f} MB, all added RSS {l_['added_mb'] / s['added_mb']:.2f}x (target <= 1.2x for {args.large_mb / args.small_mb:g}x data); first batch {s['first_batch_s']:.2f} s vs {l_['first_batch_s']:.2f} s"
    )
    shutil.rmtree(root / "large", ignore_errors=True)


def index_section(root: Path) -> None:
    index = {}
    for label, tokens in (("2B", 2e9), ("20B", 2e10)):
        store = synthetic_store(root / f"syn{label}", tokens)
        cache = root / f"syn_cache{label}"
        first = run_child("windows", store=store, cache=cache, seq_len=2048)
        other = run_child("windows", store=store, cache=cache, seq_len=2048, rank=1, world=8)
        index[label] = (first, other)
        print(f"  index {label} tokens ({first['windows']:,} windows of 2048): first rank computes it: added {first['added_mb']:.0f} MB, {first['seconds']:.1f} s; "
              f"another rank maps it: added {other['added_mb']:.1f} MB ({other['anon_mb']:.1f} MB private, {other['file_mb']:.1f} MB of mapped page cache), first batch {other['first_batch_s']:.2f} s")
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    a, b = index["2B"][1], index["20B"][1]
    print(
        f"  index 20B / 2B, another rank: private memory {b['anon_mb'] / max(a['anon_mb'], 0.1):.2f}x ({b['anon_mb']:.1f} MB at 20B; target <= 1.2x, <= 64 MiB), "
        f"all added RSS {b['added_mb'] / a['added_mb']:.2f}x, first batch {b['first_batch_s'] / a['first_batch_s']:.2f}x"
    )


def mixture_stores(folder: Path, cache: Path, tokens: float) -> None:
    """Two small text files as the mixture's sources, and a synthetic store of tokens / 2 in the
    cache under each one's store key (what a build of them would have written)."""
    from tinytrain.data.mixture import members
    from tinytrain.data.sources import fingerprint as source_fingerprint
    from tinytrain.data.store import store_key
    from tinytrain.data.tokenizer import fingerprint, load_tokenizer

    folder.mkdir(parents=True)
    for name in ("web", "code"):
        (folder / f"{name}.txt").write_text(f"{name} placeholder\n")
    cfg = data_cfg(mixture_overrides(folder, cache))
    tok_fp = fingerprint(load_tokenizer(str(TOKENIZER)))
    for m in members(cfg):
        key = store_key(source_fingerprint(m.source), tok_fp, cfg.append_eos, cfg.prepend_bos)
        store = synthetic_store(cache / "stores" / key, tokens / 2)
        meta = json.loads((store / "meta.json").read_text())
        (store / "meta.json").write_text(json.dumps({**meta, "store_key": key}))


def mixture_section(root: Path) -> None:
    result = {}
    for label, tokens in (("2B", 2e9), ("20B", 2e10)):
        folder, cache = root / f"mix{label}", root / f"mix_cache{label}"
        mixture_stores(folder, cache, tokens)
        first = run_child("mixture", path=folder, cache=cache)
        other = run_child("mixture", path=folder, cache=cache, rank=1, world=8)
        before = run_child("mixture", path=folder, cache=cache, rank=1, world=8, orders="memory")
        result[label] = (other, before)
        print(
            f"  mixture {label} tokens (2 sources, {first['windows']:,} windows of 2048): first rank computes the index and pass orders: added {first['added_mb']:.0f} MB, {first['seconds']:.1f} s; "
            f"another rank: private {other['anon_mb']:.1f} MB (peak RSS +{other['added_mb']:.1f} MB), first batch {other['first_batch_s']:.2f} s; "
            f"the same with the orders in memory (before): private {before['anon_mb']:.1f} MB (peak RSS +{before['added_mb']:.1f} MB), first batch {before['first_batch_s']:.2f} s"
        )
        shutil.rmtree(cache, ignore_errors=True)
    (a, a_before), (b, b_before) = result["2B"], result["20B"]
    print(
        f"  mixture 20B / 2B, another rank's private memory: {b['anon_mb'] / max(a['anon_mb'], 0.1):.2f}x ({b['anon_mb']:.1f} MB at 20B; target <= 1.2x, <= 64 MiB); "
        f"orders in memory (before): {b_before['anon_mb'] / max(a_before['anon_mb'], 0.1):.2f}x ({b_before['anon_mb']:.1f} MB at 20B)"
    )


def sft_section(root: Path) -> None:
    records = sft_records(root / "sft.jsonl")
    cold = run_child("sft", path=records, cache=root / "sft_cache")
    warm = run_child("sft", path=records, cache=root / "sft_cache")
    print(f"  SFT start (4,000 records): cold {cold['seconds']:.2f} s, warm {warm['seconds']:.2f} s; warm / cold {warm['seconds'] / cold['seconds']:.2f}")
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Say something about topic {i}.", "chosen": f"Topic {i} is " + "quite interesting, " * (i % 20 + 3), "rejected": f"No idea about {i}."}) + "\n" for i in range(4000)))
    cold = run_child("sft", path=pairs, cache=root / "pref_cache", orders="preference")
    warm = run_child("sft", path=pairs, cache=root / "pref_cache", orders="preference")
    print(f"  preference start (4,000 pairs): cold {cold['seconds']:.2f} s, warm {warm['seconds']:.2f} s; warm / cold {warm['seconds'] / cold['seconds']:.2f}")


if __name__ == "__main__":
    main()
