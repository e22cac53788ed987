"""A SentencePiece tokenizer.model (Llama-2's) encodes exactly as the sentencepiece library does:
on every line of tinyshakespeare, on crafted edge strings, in the token store, in SFT samples and
in the exported tokenizer. BOS follows the tokenizer family (tokenizer.add_bos)."""

import json

import pytest

from tests.conftest import LLAMA2_TOKENIZER, SHARED_DATA, compose, needs_llama2
from tinytrain.data.bos_policy import resolve_add_bos
from tinytrain.data.tokenizer import SENTENCEPIECE_PROBES, load_tokenizer
from tinytrain.errors import ConfigError

pytestmark = needs_llama2

EDGE = [
    *SENTENCEPIECE_PROBES,
    "a  b",  # sentencepiece [263, 29871, 289]; transformers' own conversion [263, 259, 29890]
    " a",
    "   ",
    " ",
    "",
    "x" + " " * 17 + "y",  # a whitespace run longer than the longest whitespace piece (16)
    " " * 40,
    "\t\t  \n\n\t ",
    "First Citizen:\n  Before we proceed any further,  hear me speak.",
    "Ελληνικά κείμενα  και  κενά",
    "ثلاث كلمات عربية",
    "한국어   텍스트",
    "mixed\u3000ideographic space",
    "0123456789 1,234.56",
]
# In a document, control-token text is text (sentencepiece's reading); SFT templates and served
# chat prompts put real special tokens there on purpose, so only the token store reads it so.
LITERAL = "a document quoting <s> and </s>"


@pytest.fixture(scope="module")
def spm():
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(LLAMA2_TOKENIZER))


@pytest.fixture(scope="module")
def llama2():
    return load_tokenizer(str(LLAMA2_TOKENIZER))


def test_every_tinyshakespeare_line_and_edge_string(llama2, spm):
    lines = (SHARED_DATA / "tinyshakespeare.txt").read_text().split("\n")
    texts = EDGE + lines
    ours = llama2(texts, add_special_tokens=False)["input_ids"]
    theirs = spm.encode(texts)
    mismatched = [t for t, a, b in zip(texts, ours, theirs) if a != b]
    assert not mismatched, f"{len(mismatched)} of {len(texts)} differ, e.g. {mismatched[:3]}"
    assert llama2.encode("a  b", add_special_tokens=False) == [263, 29871, 289]
    # Decoding gives the text back, spaces included.
    for text in EDGE[:12]:
        assert llama2.decode(llama2.encode(text, add_special_tokens=False)) == text


@pytest.mark.parametrize("workers", [0, 1])
def test_token_store_holds_sentencepiece_ids_with_bos(tmp_path, llama2, spm, workers):
    from tinytrain.data.sources import Source, documents
    from tinytrain.data.store import ensure_store

    text = (SHARED_DATA / "tinyshakespeare.txt").read_text()[:120_000] + "\n\n" + LITERAL + "\n"
    (tmp_path / "shakespeare.txt").write_text(text)
    cfg = compose(["tokenizer=llama2", "data=text", f"data.path={tmp_path / 'shakespeare.txt'}", f"data.cache_dir={tmp_path / 'cache'}", f"data.tokenize_workers={workers}"])
    add_bos, _ = resolve_add_bos(cfg.tokenizer, cfg.data, llama2)
    cfg.data.prepend_bos = add_bos
    src = Source.from_config(cfg.data)
    store, _ = ensure_store(src, cfg.data, llama2, progress=False)
    docs = list(documents(src, None))
    assert store.num_documents == len(docs) > 100
    expected = [[1, *ids, 2] for ids in spm.encode(docs)]
    got = [store.tokens[store.offsets[d] : store.offsets[d + 1]].tolist() for d in range(len(docs))]
    assert got == expected and docs[-1] == LITERAL


def test_sft_samples_are_sentencepiece_ids(llama2, spm):
    from tinytrain.data.bad_records import BadRecords
    from tinytrain.data.chat_templates import render
    from tinytrain.data.sft import build_samples, conversations
    from tinytrain.data.sources import Source, records

    cfg = compose(["tokenizer=llama2", "data=alpaca", "data.seq_len=2048", "data.prepend_bos=true"]).data
    bad = BadRecords(cfg.bad_records, "data.path")
    samples, counts = build_samples(records(Source.from_config(cfg), bad), cfg, llama2, bad)
    texts = [render(c, cfg.chat_template, llama2)[0] for r, w in records(Source.from_config(cfg), bad) for c in conversations(r, w, cfg.format, bad)]
    assert counts.truncated == 0 and len(samples) == len(texts) > 150
    assert all(t.endswith("</s>") for t in texts)
    for sample, text in zip(samples, texts):
        assert sample.input_ids.tolist() == [1, *spm.encode(text[: -len("</s>")]), 2]


def test_export_tokenizer_encodes_as_sentencepiece_and_adds_bos(tmp_path, llama2, spm):
    from transformers import AutoTokenizer

    from tinytrain.checkpoint.export import ExportSpec, served_tokenizer

    served_tokenizer(llama2, ExportSpec(add_bos=True, turn_end=["</s>"])).save_pretrained(tmp_path)
    served = AutoTokenizer.from_pretrained(tmp_path)
    for text in EDGE:
        assert served(text).input_ids == [1, *spm.encode(text)], text


def test_bos_policy_per_family(llama2, bundled_tokenizer):
    on, why = resolve_add_bos(compose(["tokenizer=llama2"]).tokenizer, compose().data, llama2)
    assert on and "SentencePiece" in why
    off, why = resolve_add_bos(compose().tokenizer, compose().data, bundled_tokenizer)
    assert not off and "does not add BOS" in why
    forced, why = resolve_add_bos(compose(["tokenizer=llama2", "tokenizer.add_bos=false"]).tokenizer, compose().data, llama2)
    assert not forced and why == "tokenizer.add_bos=false"


def test_bos_in_the_plan(tmp_path, capsys):
    """The decision travels in the plan and config_resolved.yaml; the config itself is not written
    to, and is read-only once planned (a stage writing into it fails loudly)."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import ReadonlyConfigError

    from tinytrain.cli import run_stages

    cfg = compose(["mode=plan", "tokenizer=llama2"])
    run_stages(cfg, tmp_path / "run")
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["tokenizer"]["add_bos"] is True and "bos        on: SentencePiece" in capsys.readouterr().out
    resolved = yaml.safe_load((tmp_path / "run" / "config_resolved.yaml").read_text())
    assert resolved["tokenizer"]["add_bos"] is True and resolved["data"]["prepend_bos"] is True
    assert cfg.tokenizer.add_bos is None and cfg.data.prepend_bos is False and OmegaConf.is_readonly(cfg)
    with pytest.raises(ReadonlyConfigError):
        cfg.trainer.max_steps = 1


def test_llama2_yaml_comment_override_parses():
    from tests.conftest import CONF_DIR

    comment = next(line for line in (CONF_DIR / "tokenizer" / "llama2.yaml").read_text().splitlines() if "add_special_tokens=" in line)
    import shlex

    overrides = shlex.split(comment.lstrip("# "))[3:]  # after "python -m tinytrain"
    cfg = compose(overrides)
    assert list(cfg.tokenizer.add_special_tokens) == ["<|im_start|>", "<|im_end|>"]


def test_bos_on_a_tokenizer_without_one_names_the_key(bundled_tokenizer):
    import copy

    tok = copy.deepcopy(bundled_tokenizer)
    tok.bos_token = None
    with pytest.raises(ConfigError) as e:
        resolve_add_bos(compose(["tokenizer.add_bos=true"]).tokenizer, compose().data, tok)
    assert "tokenizer.add_bos" in str(e.value.render())
