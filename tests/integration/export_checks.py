"""Checks shared by the tests of `mode=export`: the folder reloads in plain transformers with
len(tokenizer) rows and computes what the checkpoint's own weights compute."""

from __future__ import annotations

from pathlib import Path

import torch

PROBE = "<|im_start|>user\ndef main():\n    return 0<|im_end|>\n"


def assert_export_matches(export_dir: Path, state_dict: dict, run_overrides: list[str], true_vocab: int) -> None:
    """`state_dict`: the checkpoint's HF-model weights (`model.` prefix removed), padded or not."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.conftest import compose
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.plan.attention import AttentionChoice

    exported = AutoModelForCausalLM.from_pretrained(export_dir)
    assert exported.config.vocab_size == true_vocab and exported.config.use_cache is True
    assert exported.get_input_embeddings().weight.shape[0] == exported.get_output_embeddings().weight.shape[0] == true_vocab
    cfg = compose(run_overrides)
    tokenizer = load_from_config(cfg.tokenizer)
    rows = state_dict["model.embed_tokens.weight"].shape[0]
    model = build_model(cfg.model, hf_config(cfg.model, rows, tokenizer), AttentionChoice("sdpa", "test"))
    model.load_state_dict(state_dict, strict=True)
    ids = torch.tensor([AutoTokenizer.from_pretrained(export_dir).encode(PROBE, add_special_tokens=False)])
    assert ids.tolist()[0] == tokenizer.encode(PROBE, add_special_tokens=False)  # the export tokenizes as training did
    with torch.no_grad():
        ours = model(input_ids=ids).logits[..., :true_vocab]
        theirs = exported(input_ids=ids).logits
    # Not bit-equal where rows were padded: a matmul over more rows blocks its sums differently.
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


def checkpoint_weights(path: Path) -> dict:
    """A checkpoint file's weights; a sharded (fsdp_tp) folder's through DCP's own converter, not
    tinytrain's reader."""
    if path.is_dir():
        import tempfile

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(path, Path(tmp) / "full.pt")
            ckpt = torch.load(Path(tmp) / "full.pt", map_location="cpu", weights_only=False)
    else:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
