import shutil

import pytest

from tests.conftest import LLAMA2_TOKENIZER, needs_llama2
from tinytrain.data.tokenizer import (
    check_tokenizer_path,
    fingerprint,
    load_tokenizer,
    tokenizer_kind,
)
from tinytrain.errors import ConfigError


def test_bundled_tokenizer(bundled_tokenizer):
    assert len(bundled_tokenizer) == 4096
    assert bundled_tokenizer.eos_token == "</s>" and bundled_tokenizer.pad_token == "<pad>"
    text = "def f(x):\n    return x + 1"
    assert bundled_tokenizer.decode(bundled_tokenizer.encode(text, add_special_tokens=False)) == text


def test_bundled_tokenizer_is_reproducible(tmp_path, bundled_tokenizer):
    from tinytrain.data.bundled_tokenizer import build

    rebuilt = load_tokenizer(str(build(tmp_path / "tok")))
    assert fingerprint(rebuilt) == fingerprint(bundled_tokenizer)


def test_added_special_tokens_count_and_change_fingerprint(bundled_tokenizer):
    path = bundled_tokenizer.name_or_path
    chat = load_tokenizer(path, ("<|im_start|>", "<|im_end|>"))
    assert len(chat) == 4098 and chat.vocab_size == 4096  # vocab_size ignores added tokens
    assert chat.convert_tokens_to_ids("<|im_end|>") == 4097
    assert chat.encode("<|im_start|>user", add_special_tokens=False)[0] == 4096
    assert fingerprint(chat) != fingerprint(bundled_tokenizer)


def test_missing_path_names_key_and_fix(tmp_path):
    problem = check_tokenizer_path(str(tmp_path / "nope"))
    assert problem.key == "tokenizer.path" and "tokenizer=llama2" in problem.fix
    empty = tmp_path / "empty"
    empty.mkdir()
    assert tokenizer_kind(str(empty)) == "missing"
    with pytest.raises(ConfigError):
        load_tokenizer(str(empty))


@needs_llama2
def test_llama2_sentencepiece_matches_sentencepiece():
    tok = load_tokenizer(str(LLAMA2_TOKENIZER))
    assert len(tok) == 32000
    assert tok.encode("Hello world", add_special_tokens=False) == [15043, 3186]
    assert tok.eos_token == "</s>"


@needs_llama2
def test_llama2_model_file_under_another_name(tmp_path):
    # LlamaTokenizer(vocab_file=...) would silently give a 3-token tokenizer for this file.
    renamed = tmp_path / "llama.model"
    shutil.copy(LLAMA2_TOKENIZER, renamed)
    tok = load_tokenizer(str(renamed))
    assert len(tok) == 32000 and tok.encode("Hello world", add_special_tokens=False) == [15043, 3186]


@needs_llama2
def test_llama2_folder_and_chat_tokens():
    tok = load_tokenizer(str(LLAMA2_TOKENIZER.parent), ("<|im_start|>", "<|im_end|>"))
    assert len(tok) == 32002
