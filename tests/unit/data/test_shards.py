"""Shards as corpora ship them: a folder mixing .txt, .jsonl(.gz/.zst), .json.gz and .parquet read in
path order, globs, text streamed across reads, and damaged compressed shards named by file and line."""

import gzip
import json
import re

import pytest
import zstandard

from tinytrain.config.schema import BadRecordPolicy, DataSource, TextSplit
from tinytrain.data import shards
from tinytrain.data.bad_records import BadRecords
from tinytrain.data.sources import Source, documents, fingerprint, records
from tinytrain.errors import ConfigError


def source(path, kind=DataSource.jsonl, split=TextSplit.blank_lines):
    return Source(kind, str(path), "data.path", split, "text", "train", BadRecordPolicy.error)


def jsonl(texts) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


def read(src, policy=BadRecordPolicy.error):
    bad = BadRecords(policy)
    return list(documents(src, bad)), bad


@pytest.fixture
def mixed(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "c").mkdir()
    (tmp_path / "a.jsonl").write_bytes(jsonl(["a1", "a2"]))
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(jsonl(["b1"])))
    (tmp_path / "c" / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl(["d1", "d2"])))
    (tmp_path / "e.json.gz").write_bytes(gzip.compress(jsonl(["e1"])))
    pq.write_table(pa.table({"text": ["f1", "f2", "f3"]}), tmp_path / "f.parquet", row_group_size=2)
    (tmp_path / "g.txt").write_text("g1\n\ng2\n")
    (tmp_path / "h.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"h1\n\nh2"))
    (tmp_path / "README.md").write_text("not a shard")
    (tmp_path / ".a.jsonl.tmp").write_text("{half a")
    (tmp_path / "c" / ".ipynb_checkpoints").mkdir()  # a copy in a hidden folder: read twice before
    (tmp_path / "c" / ".ipynb_checkpoints" / "d-checkpoint.jsonl").write_bytes(jsonl(["d1", "d2"]))
    return tmp_path


def test_a_folder_of_mixed_formats_is_read_in_path_order(mixed):
    docs, bad = read(source(mixed))
    assert docs == ["a1", "a2", "b1", "d1", "d2", "e1", "f1", "f2", "f3", "g1", "g2", "h1", "h2"] and bad.total == 0


def test_a_glob_picks_its_shards_and_the_fingerprint_follows_them(mixed):
    docs, _ = read(source(f"{mixed}/**/*.jsonl*"))
    assert docs == ["a1", "a2", "b1", "d1", "d2"]
    before = fingerprint(source(f"{mixed}/**/*.jsonl*"))
    (mixed / "c" / "z.jsonl").write_bytes(jsonl(["z"]))
    assert fingerprint(source(f"{mixed}/**/*.jsonl*")) != before


def test_sft_records_refuse_a_text_shard_among_them(mixed):
    with pytest.raises(ConfigError, match="g.txt is text: it holds documents, not records"):
        list(records(source(mixed), BadRecords(BadRecordPolicy.error)))


@pytest.mark.parametrize("suffix", [".txt", ".txt.zst"])
def test_text_splits_like_the_whole_file_when_streamed_a_few_bytes_at_a_time(tmp_path, monkeypatch, suffix):
    text = "one\nstill one\n\n\ntwo\n  \nthree\r\n\r\nfour\n\n \t\n\nfive " + "x" * 50 + "\n\n\n"
    f = tmp_path / f"t{suffix}"
    f.write_bytes(zstandard.ZstdCompressor().compress(text.encode()) if suffix.endswith(".zst") else text.encode())
    expected = [b.strip() for b in re.split(r"\n[ \t]*\r?\n", text) if b.strip()]
    for size in (1, 2, 3, 5, 7, 64):
        monkeypatch.setattr(shards, "READ_BYTES", size)
        assert read(source(f, DataSource.text))[0] == expected, size


def test_text_is_read_in_bounded_pieces(tmp_path, monkeypatch):
    """Never one read of the whole file: every read asks for READ_BYTES at most."""
    f = tmp_path / "big.txt"
    f.write_text("\n\n".join(f"document {i}" for i in range(5000)))
    asked = []
    real = shards.open_binary

    def spying(path, fmt):
        stream = real(path, fmt)
        read_ = stream.read1

        def read_some(n=-1):
            asked.append(n)
            return read_(n)

        stream.read1 = read_some
        return stream

    monkeypatch.setattr(shards, "open_binary", spying)
    monkeypatch.setattr(shards, "READ_BYTES", 4096)
    docs, _ = read(source(f, DataSource.text))
    assert len(docs) == 5000 and len(asked) > 10 and all(0 < n <= 4096 for n in asked)


def test_zstd_frames_are_read_one_after_another(tmp_path):
    f = tmp_path / "frames.jsonl.zst"
    f.write_bytes(b"".join(zstandard.ZstdCompressor().compress(jsonl([f"frame {i}"])) for i in range(3)))
    assert read(source(f))[0] == ["frame 0", "frame 1", "frame 2"]


@pytest.mark.parametrize("suffix", [".jsonl.zst", ".json.gz", ".txt.zst", ".txt.gz"])
def test_a_truncated_shard_is_named_and_skip_keeps_what_came_before(tmp_path, suffix):
    """A text shard of under a read (1 MiB) cut short kept no document: the read that met the damage
    dropped what it had gathered."""
    texts = [f"document number {i} " * 8 for i in range(3000)]
    text = suffix.startswith(".txt")
    raw = "\n\n".join(texts).encode() if text else jsonl(texts)
    packed = gzip.compress(raw) if suffix.endswith(".gz") else zstandard.ZstdCompressor().compress(raw)
    f = tmp_path / f"cut{suffix}"
    f.write_bytes(packed[: len(packed) * 2 // 3])
    kind = DataSource.text if text else DataSource.jsonl
    with pytest.raises(ConfigError) as e:
        read(source(f, kind))
    assert f"cut{suffix}" in str(e.value) and "damaged compressed shard" in str(e.value) and "Fix:" in str(e.value)
    docs, bad = read(source(f, kind), BadRecordPolicy.skip)
    assert bad.counts["damaged compressed shard"] == 1
    assert 0 < len(docs) < len(texts) and docs == [t.strip() if text else t for t in texts[: len(docs)]]
    if kind == DataSource.jsonl:
        assert re.search(rf"cut{re.escape(suffix)}:\d+", str(e.value))  # the line reached


def test_a_damaged_parquet_file_is_named(tmp_path):
    f = tmp_path / "bad.parquet"
    f.write_bytes(b"PAR1 not really")
    with pytest.raises(ConfigError, match="bad.parquet: not a Parquet file"):
        read(source(f, DataSource.parquet))
