"""The export serves as the chat model that was trained: its Jinja chat template renders what
training rendered, generation through transformers.pipeline stops at the turn end, and the folder
has the cache on, the requested dtype and readable files."""

import json
import stat

import pytest
import torch

from tests.conftest import compose
from tinytrain.checkpoint.export import ExportSpec, export_spec, export_state_dict
from tinytrain.config.schema import ChatTemplate
from tinytrain.data.chat_jinja import jinja_template
from tinytrain.data.chat_templates import render
from tinytrain.data.tokenizer import load_tokenizer
from tinytrain.model.build import hf_config

CHATML = ("<|im_start|>", "<|im_end|>")
CONVERSATIONS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4."}, {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6."}],
    [{"role": "user", "content": "Add the numbers.", "input": "2 and 3"}, {"role": "assistant", "content": "5"}],
]


@pytest.fixture(scope="module")
def chat_tok(bundled_tokenizer):
    return load_tokenizer(bundled_tokenizer.name_or_path, CHATML)


def jinja_render(tok, template: ChatTemplate, messages, add_bos=False, generation_prompt=False):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = jinja_template(template, None, add_bos)
    return t.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


@pytest.mark.parametrize("template", [ChatTemplate.chatml, ChatTemplate.alpaca])
def test_jinja_template_renders_what_training_rendered(template, chat_tok):
    for messages in CONVERSATIONS:
        trained, spans = render(messages, template, chat_tok)
        assert jinja_render(chat_tok, template, messages) == trained
        # The generation prompt is the text up to the last assistant reply.
        prompt = jinja_render(chat_tok, template, messages[:-1], generation_prompt=True)
        assert prompt == trained[: spans[-1][0]]
    assert jinja_render(chat_tok, template, CONVERSATIONS[0], add_bos=True).startswith("<s>")


def memorized_chat_model(tok, messages, steps=150):
    """A tiny Llama trained (in this test) on one ChatML conversation until it repeats it."""
    cfg = compose(["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"])
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_config(cfg.model, len(tok), tok), attn_implementation="sdpa")
    text, _ = render(messages, ChatTemplate.chatml, tok)
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, f"the test model did not memorise its conversation (loss {loss.item():.3f})"
    return model


def test_pipeline_chat_stops_at_turn_end(tmp_path, chat_tok):
    from transformers import AutoTokenizer, pipeline

    messages = CONVERSATIONS[0]
    model = memorized_chat_model(chat_tok, messages)
    spec = export_spec(compose(["data=chat"]), chat_tok)
    assert spec.turn_end == ["</s>", "<|im_end|>"] and spec.dtype == "fp32"
    out = export_state_dict(dict(model.state_dict()), model_config=model.config, tokenizer=chat_tok, true_vocab=len(chat_tok), out_dir=tmp_path / "hf", spec=spec)

    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    assert config["use_cache"] is True and generation.get("use_cache", True) is True
    assert generation["eos_token_id"] == [chat_tok.eos_token_id, chat_tok.convert_tokens_to_ids("<|im_end|>")]
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name
    served = AutoTokenizer.from_pretrained(out)
    assert "<|im_end|>" in served.all_special_tokens
    assert served.chat_template == (out / "chat_template.jinja").read_text()  # the file docs/export.md names

    chat = pipeline("text-generation", model=str(out), tokenizer=served, device="cpu")
    max_new = 24
    result = chat([messages[:1]], max_new_tokens=max_new, do_sample=False)[0][0]["generated_text"]
    reply = result[-1]
    assert reply["role"] == "assistant" and reply["content"].strip() == "hello there"
    # The same prompt through generate: it ends with <|im_end|>, well before max_new_tokens.
    prompt = served.apply_chat_template(messages[:1], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    new = chat.model.generate(**prompt, max_new_tokens=max_new, do_sample=False)[0, prompt["input_ids"].shape[1] :]
    assert served.convert_ids_to_tokens(new.tolist())[-1] == "<|im_end|>" and len(new) < max_new


@pytest.mark.parametrize(("requested", "precision", "dtype"), [("auto", "bf16-mixed", torch.bfloat16), ("auto", "16-mixed", torch.float16), ("fp32", "bf16-mixed", torch.float32)])
def test_export_dtype(tmp_path, bundled_tokenizer, requested, precision, dtype):
    from transformers import AutoModelForCausalLM

    cfg = compose(["model.num_layers=1", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2"])
    cfg.precision.value = precision
    tok = bundled_tokenizer
    model = AutoModelForCausalLM.from_config(hf_config(cfg.model, 4160, tok))
    spec = export_spec(cfg, tok, requested)
    assert spec.chat_template is None and spec.turn_end == ["</s>"]  # a pretraining run
    out = export_state_dict(dict(model.state_dict()), model_config=model.config, tokenizer=tok, true_vocab=len(tok), out_dir=tmp_path / "hf", spec=spec)
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.get_input_embeddings().weight.dtype == dtype
    assert reloaded.config.vocab_size == len(tok)


def test_export_adds_bos_when_trained_with_it(tmp_path, bundled_tokenizer):
    from transformers import AutoTokenizer

    served = ExportSpec(add_bos=True)
    from tinytrain.checkpoint.export import served_tokenizer

    tok = served_tokenizer(bundled_tokenizer, served)
    tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    ids = reloaded("def f").input_ids
    assert ids[0] == bundled_tokenizer.bos_token_id and ids[1:] == bundled_tokenizer.encode("def f", add_special_tokens=False)
    assert bundled_tokenizer("def f").input_ids[0] != bundled_tokenizer.bos_token_id  # the original is untouched
