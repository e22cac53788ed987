"""Reading sources: text splitting, JSON Lines, Parquet, Hugging Face datasets, fingerprints, and
bad data (empty files, lines that are not JSON, missing fields, non-UTF-8 bytes) under both policies."""

import json

import pytest

from tinytrain.config.schema import BadRecordPolicy, DataSource, TextSplit
from tinytrain.data.bad_records import BadRecords
from tinytrain.data.sources import Source, documents, fingerprint, records
from tinytrain.errors import ConfigError


def source(kind, path, text_split=TextSplit.blank_lines, text_field="text", policy=BadRecordPolicy.error):
    return Source(kind, str(path), "data.path", text_split, text_field, "train", policy)


def read(src, policy=BadRecordPolicy.error):
    bad = BadRecords(policy)
    return list(documents(src, bad)), bad


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_text_file_splits_on_blank_lines(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("one\nstill one\n\n\ntwo\n  \nthree\r\n\r\nfour\n")
    docs, _ = read(source(DataSource.text, f))
    assert docs == ["one\nstill one", "two", "three", "four"]
    docs, _ = read(source(DataSource.text, f, TextSplit.file))
    assert docs == ["one\nstill one\n\n\ntwo\n  \nthree\r\n\r\nfour"]


def test_text_folder_is_read_recursively_in_order(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "a.txt").write_text("ay\n\nay two")
    (tmp_path / "sub" / "c.txt").write_text("sea")
    (tmp_path / "ignored.md").write_text("not text source")
    docs, _ = read(source(DataSource.text, tmp_path, TextSplit.file))
    assert docs == ["ay\n\nay two", "bee", "sea"]


def test_jsonl_text_field(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [{"text": "first", "id": 1}, {"text": ""}, {"text": "second"}])
    docs, _ = read(source(DataSource.jsonl, f))
    assert docs == ["first", "second"]  # empty documents carry no tokens and are dropped
    docs, _ = read(source(DataSource.jsonl, write_jsonl(tmp_path / "e.jsonl", [{"body": "x"}]), text_field="body"))
    assert docs == ["x"]


def test_parquet_and_hf_saved_dataset(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["p one", "p two"], "n": [1, 2]}), tmp_path / "d.parquet")
    docs, _ = read(source(DataSource.parquet, tmp_path / "d.parquet"))
    assert docs == ["p one", "p two"]
    datasets.Dataset.from_dict({"content": ["h one", "h two", "h three"]}).save_to_disk(str(tmp_path / "saved"))
    docs, _ = read(source(DataSource.hf, tmp_path / "saved", text_field="content"))
    assert docs == ["h one", "h two", "h three"]
    # a local folder of data files goes through datasets.load_dataset
    (tmp_path / "files").mkdir()
    write_jsonl(tmp_path / "files" / "part.jsonl", [{"text": "f one"}])
    docs, _ = read(source(DataSource.hf, tmp_path / "files"))
    assert docs == ["f one"]


def test_missing_column_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "d.parquet")
    with pytest.raises(ConfigError) as e:
        read(source(DataSource.parquet, tmp_path / "d.parquet"))
    assert "data.text_field" in str(e.value) and "columns: body" in str(e.value)


def test_fingerprint_follows_content_and_options(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("hello")
    src = source(DataSource.text, f)
    first = fingerprint(src)
    assert fingerprint(src) == first
    assert fingerprint(source(DataSource.text, f, TextSplit.file)) != first
    f.write_text("hello, changed")
    assert fingerprint(src) != first
    assert len(first) == 16
    # Another field of the same records is other text: two fields shared one token store (whichever
    # was built first), and a mixture of a file's titles and bodies trained twice on the titles.
    records = tmp_path / "r.jsonl"
    write_jsonl(records, [{"text": "a body", "title": "a title"}])
    assert fingerprint(source(DataSource.jsonl, records, text_field="title")) != fingerprint(source(DataSource.jsonl, records))


def test_pydoc_source_has_documents():
    docs, _ = read(Source(DataSource.pydoc, None, "data.path", TextSplit.blank_lines, "text", "train", BadRecordPolicy.error))
    assert len(docs) > 50 and all(d.strip() for d in docs)


# -- bad data ----------------------------------------------------------------------------------


def bad_jsonl(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(b'{"text": "good one"}\n{"text": broken\n{"title": "no text"}\n{"text": "bad \xff byte"}\n[1, 2]\n{"text": 3}\n{"text": "good two"}\n')
    return f


@pytest.mark.parametrize(
    "bad_line, needle",
    [
        (b'{"text": broken', "not JSON"),
        (b'{"title": "no text"}', "missing field 'text' (fields: title)"),
        (b'{"text": "bad \xff byte"}', "not UTF-8"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"text": 3}', "field 'text' is not a string"),
    ],
)
def test_each_bad_jsonl_line_is_named_with_file_and_line(tmp_path, bad_line, needle):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(b'{"text": "good"}\n\n' + bad_line + b"\n")  # the blank line still counts: the bad one is line 3
    with pytest.raises(ConfigError) as e:
        read(source(DataSource.jsonl, f))
    text = str(e.value)
    assert "bad.jsonl:3" in text and needle in text and "Fix:" in text and "data.bad_records=skip" in text, text


def test_skip_policy_counts_every_bad_line(tmp_path, caplog):
    docs, bad = read(source(DataSource.jsonl, bad_jsonl(tmp_path)), BadRecordPolicy.skip)
    assert docs == ["good one", "good two"]
    assert bad.total == 5
    assert bad.counts["not JSON"] == 1 and bad.counts["missing field 'text'"] == 1 and bad.counts["not UTF-8"] == 1
    assert "skipped 5 bad records" in bad.summary()
    assert "bad.jsonl:2" in caplog.text  # the first ones are logged with their location


def test_empty_files(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n\n")
    (tmp_path / "full.txt").write_text("words")
    with pytest.raises(ConfigError) as e:
        read(source(DataSource.text, tmp_path))
    assert "empty.txt" in str(e.value) and "empty file" in str(e.value)
    docs, bad = read(source(DataSource.text, tmp_path), BadRecordPolicy.skip)
    assert docs == ["words"] and bad.counts["empty file"] == 1
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="empty.jsonl: empty file"):
        read(source(DataSource.jsonl, tmp_path / "empty.jsonl"))


def test_non_utf8_text_file_names_line_and_byte(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("first line\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as e:
        read(source(DataSource.text, f))
    assert "latin1.txt:2" in str(e.value) and "not UTF-8" in str(e.value) and "byte 14" in str(e.value)


def test_records_refuse_document_sources(tmp_path):
    with pytest.raises(ConfigError, match="holds documents, not records"):
        list(records(source(DataSource.text, tmp_path), BadRecords(BadRecordPolicy.error)))


def test_unreachable_hub_name_is_a_config_error(monkeypatch):
    import datasets
    import huggingface_hub.constants

    # Offline mode answers at once; with retries against an unreachable hub this takes ~30 s.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as e:
        read(source(DataSource.hf, "nobody-xyz/no-such-dataset"))
    assert "hub name" in str(e.value) and "data.path='nobody-xyz/no-such-dataset'" in str(e.value)
