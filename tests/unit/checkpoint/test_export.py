"""The Hugging Face export has exactly len(tokenizer) rows, and the model computes the same."""

import torch

from tests.conftest import compose
from tinytrain.checkpoint.export import export_state_dict
from tinytrain.data.tokenizer import load_tokenizer
from tinytrain.model.build import hf_config


def test_export_unpads_to_true_vocab(tmp_path, bundled_tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = load_tokenizer(bundled_tokenizer.name_or_path, ("<|im_start|>", "<|im_end|>"))
    n = len(tok)  # 4098 -> padded 4160
    cfg = compose(["model.num_layers=1"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(cfg.model, 4160, tok), attn_implementation="sdpa")
    ids = torch.tensor([tok.encode("<|im_start|>user def f(): pass<|im_end|>", add_special_tokens=False)])
    with torch.no_grad():
        before = model(input_ids=ids).logits[..., :n]

    export_state_dict(dict(model.state_dict()), model_config=model.config, tokenizer=tok, true_vocab=n, out_dir=tmp_path / "hf")

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert reloaded.config.vocab_size == n
    assert reloaded.get_input_embeddings().weight.shape[0] == n
    assert reloaded.get_output_embeddings().weight.shape[0] == n
    assert len(AutoTokenizer.from_pretrained(tmp_path / "hf")) == n
    with torch.no_grad():
        after = reloaded(input_ids=ids).logits
    torch.testing.assert_close(after, before)

