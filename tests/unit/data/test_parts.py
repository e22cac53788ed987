"""The token store in parts: the parts opened together equal a one-process build token for token;
a changed file rebuilds only its part; a missing, foreign or stale part is refused naming it; the
marker-file build lock makes one of two racing processes build while the other waits."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO, compose
from tinytrain.data import parts
from tinytrain.data.build_lock import BuildLock
from tinytrain.data.parts import PartedStore
from tinytrain.data.sources import Source
from tinytrain.data.store import ensure_store
from tinytrain.errors import ConfigError


def write_shards(folder, n_files=5, docs_per_file=7):
    import gzip

    folder.mkdir(parents=True, exist_ok=True)
    for f in range(n_files):
        docs = [f"File {f} document {d}: " + " ".join(f"w{(f * 7 + d * 3 + j) % 50}" for j in range(d % 5 + 2)) for d in range(docs_per_file)]
        raw = "".join(json.dumps({"text": t}) + "\n" for t in docs).encode()
        (folder / f"shard-{f:03d}.jsonl.gz").write_bytes(gzip.compress(raw)) if f % 2 else (folder / f"shard-{f:03d}.jsonl").write_bytes(raw)
    return folder


def cfg_for(tmp_path, *overrides):
    return compose(["data=jsonl", f"data.path={tmp_path / 'shards'}", "data.text_field=text", f"data.cache_dir={tmp_path / 'cache'}", "data.tokenize_workers=0", "data.seq_len=16", *overrides]).data


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path / "shards")


def test_parts_opened_together_equal_a_one_process_build(tmp_path, shards, bundled_tokenizer):
    one, _ = ensure_store(Source.from_config(cfg_for(tmp_path)), cfg_for(tmp_path), bundled_tokenizer, False)
    cfg = cfg_for(tmp_path, "data.prepare_parts=3", "data.tokenize_workers=2")  # parts built in 2 processes
    parted, built = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    assert built and isinstance(parted, PartedStore) and len(parted.parts) == 3
    assert parted.num_documents == one.num_documents == 35
    assert np.array_equal(np.asarray(parted.offsets), np.asarray(one.offsets))
    assert np.array_equal(parted.tokens[np.arange(parted.num_tokens)], np.asarray(one.tokens))
    assert parted.max_token_id() == one.max_token_id()
    # A window across the boundary between parts reads from both.
    boundary = int(parted.starts[1])
    assert np.array_equal(parted.tokens[np.arange(boundary - 3, boundary + 3)], np.asarray(one.tokens[boundary - 3 : boundary + 3]))
    assert np.array_equal(parted.read(boundary - 3, boundary + 3), one.read(boundary - 3, boundary + 3))  # read with pread, as windows are
    assert np.array_equal(parted.read(0, parted.num_tokens), np.asarray(one.tokens))
    again, built_again = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    assert not built_again and again.path == parted.path


def test_a_changed_file_rebuilds_only_its_part(tmp_path, shards, bundled_tokenizer, monkeypatch):
    cfg = cfg_for(tmp_path, "data.prepare_parts=2")
    first, _ = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    (shards / "shard-004.jsonl").write_text(json.dumps({"text": "a new last document"}) + "\n")
    read = []
    real = parts.sources.shard_documents
    monkeypatch.setattr(parts.sources, "shard_documents", lambda listed, *a, **k: read.append([f.name for f in listed]) or real(listed, *a, **k))
    second, built = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    assert built and second.path != first.path
    assert read == [["shard-002.jsonl", "shard-003.jsonl.gz", "shard-004.jsonl"]]  # part 0 reused
    assert second.parts[0].path == first.parts[0].path and second.num_documents == 29


def test_one_part_at_a_time_completes_the_store_with_the_last(tmp_path, shards, bundled_tokenizer):
    cfgs = [cfg_for(tmp_path, "mode=prepare", "data.prepare_parts=2", f"data.prepare_part={i}") for i in (1, 0)]
    lines = parts.prepare_one(Source.from_config(cfgs[0]), cfgs[0], bundled_tokenizer)
    assert "part 1 of 2" in lines[0] and "built" in lines[0] and "parts 0 still to build" in lines[1]
    store_dir = parts.layout(Source.from_config(cfgs[0]), cfgs[0], bundled_tokenizer).store_dir
    with pytest.raises(ConfigError) as e:  # a store with a missing part is refused for training
        PartedStore.open(store_dir)
    assert "part(s) 0 of 2 not built" in str(e.value) and "data.prepare_part=0" in str(e.value)
    lines = parts.prepare_one(Source.from_config(cfgs[1]), cfgs[1], bundled_tokenizer)
    assert "complete" in lines[-1] and PartedStore.open(store_dir).num_documents == 35
    again = parts.prepare_one(Source.from_config(cfgs[1]), cfgs[1], bundled_tokenizer)  # a requeued task
    assert "already built" in again[0]


def test_a_part_deleted_after_the_build_is_built_again(tmp_path, shards, bundled_tokenizer):
    """The manifest outlives a part removed by hand: the next run with the same options builds that
    part again (the same files make the same part) instead of refusing the store it wrote."""
    import shutil

    cfg = cfg_for(tmp_path, "data.prepare_parts=2")
    first, _ = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    shutil.rmtree(first.parts[1].path)
    with pytest.raises(ConfigError) as e:  # opened alone (data.store=): the command that builds it
        PartedStore.open(first.path)
    assert f"data.path={tmp_path / 'shards'}" in str(e.value) and "data.prepare_parts=2 data.prepare_part=1" in str(e.value)
    again, built = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    assert built and again.path == first.path and again.num_documents == 35
    assert np.array_equal(again.read(0, again.num_tokens), first.read(0, first.num_tokens))


def test_a_foreign_or_stale_part_is_refused_naming_it(tmp_path, shards, bundled_tokenizer):
    cfg = cfg_for(tmp_path, "data.prepare_parts=2")
    store, _ = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    meta_path = store.parts[1].path / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "tokenizer_fingerprint": "0123456789abcdef"}))
    with pytest.raises(ConfigError, match="part 1 of 2 .* built with tokenizer 0123456789abcdef"):
        PartedStore.open(store.path)
    meta_path.write_text(json.dumps(meta))
    os.utime(shards / "shard-000.jsonl", ns=(1, 1))
    with pytest.raises(ConfigError, match="part 0 of 2 .*shard-000.jsonl changed since the part was built"):
        PartedStore.open(store.path)


def test_the_lock_waits_for_a_live_heartbeat_and_takes_over_a_stale_one(tmp_path):
    marker = tmp_path / "part.lock"
    marker.write_text(json.dumps({"token": "another-node:1:x"}))
    started = time.monotonic()
    with BuildLock(marker, "test part", heartbeat=0.05, stale=0.5, poll=0.02) as lock:
        waited = time.monotonic() - started
        assert lock.waited and waited >= 0.5 and json.loads(marker.read_text())["token"] == lock.token
        before = marker.stat().st_mtime_ns
        time.sleep(0.2)
        assert marker.stat().st_mtime_ns != before  # the heartbeat
    assert not marker.exists()


RACER = """
import sys, time
from tests.conftest import compose
from tinytrain.data import parts, build_lock
from tinytrain.data.sources import Source
from tinytrain.data.tokenizer import load_tokenizer
import tinytrain.data.sources as sources

real = sources.shard_documents
def slow(listed, *a, **k):
    for doc in real(listed, *a, **k):
        time.sleep(0.2)  # ~3 s a part: long enough that the other racer arrives mid-build
        yield doc
sources.shard_documents = slow
cfg = compose(["data=jsonl", "data.path=" + sys.argv[1], "data.text_field=text", "data.cache_dir=" + sys.argv[2],
               "data.tokenize_workers=0", "mode=prepare", "data.prepare_parts=2", "data.prepare_part=0"]).data
print("\\n".join(parts.prepare_one(Source.from_config(cfg), cfg, load_tokenizer(sys.argv[3]))), flush=True)
"""


def test_two_processes_racing_for_one_part_build_it_once(tmp_path, shards, bundled_tokenizer):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, "-c", RACER, str(shards), str(tmp_path / "cache"), bundled_tokenizer.name_or_path]
    racers = [subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [r.communicate(timeout=300) for r in racers]
    assert all(r.returncode == 0 for r in racers), outs
    firsts = sorted(re.search(r"\): (.*?) in [0-9.]+ s at", out).group(1) for out, _ in outs)
    assert firsts == ["built", "built by another process (waited for it)"], outs
    parts_dir = tmp_path / "cache" / "parts"
    assert len([p for p in parts_dir.iterdir() if p.is_dir()]) == 1  # one part, no temporary folder left
    assert not list(parts_dir.glob("*.lock"))


def test_adding_files_rebuilds_only_the_parts_they_land_in(tmp_path, bundled_tokenizer, monkeypatch):
    """64 files in 8 parts; 2 more after the last (a corpus that grows): only the last part is built
    again (a fresh split of 66 files moved 4 boundaries: 5 parts rebuilt); then one between files
    of part 3: only part 3. The parts opened together still equal a one-process build."""
    shards = write_shards(tmp_path / "shards", n_files=64, docs_per_file=2)
    cfg = cfg_for(tmp_path, "data.prepare_parts=8")
    first, _ = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    built = []
    real = parts.sources.shard_documents
    monkeypatch.setattr(parts.sources, "shard_documents", lambda listed, *a, **k: built.append(listed[0].name) or real(listed, *a, **k))

    for name in ("shard-998.jsonl", "shard-999.jsonl"):
        (shards / name).write_text(json.dumps({"text": f"an added document {name}"}) + "\n")
    second, _ = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    assert built == ["shard-056.jsonl"]  # part 7 (shard-056 .. shard-063, and the two new ones)
    assert sum(a.path == b.path for a, b in zip(first.parts, second.parts)) == 7

    built.clear()
    (shards / "shard-026a.jsonl").write_text(json.dumps({"text": "an added document in part 3"}) + "\n")
    third, _ = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    assert built == ["shard-024.jsonl"]  # part 3 (shard-024 .. shard-031, and shard-026a)
    assert sum(a.path == b.path for a, b in zip(second.parts, third.parts)) == 7
    one, _ = ensure_store(Source.from_config(cfg_for(tmp_path)), cfg_for(tmp_path), bundled_tokenizer, False)
    assert third.num_documents == one.num_documents == 131
    assert np.array_equal(third.read(0, third.num_tokens), np.asarray(one.tokens))
    # Planned again with nothing changed, the layout is the same one: nothing is built.
    again, built_again = parts.ensure(Source.from_config(cfg), cfg, bundled_tokenizer, False)
    assert not built_again and again.path == third.path
