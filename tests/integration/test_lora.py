"""finetune=lora end to end on every strategy that runs it (single, ddp over gloo, DeepSpeed ZeRO-2
and ZeRO-3 on its CPU accelerator): a ChatML fine-tune of a tiny 'pretrained' Llama whose tokenizer
gains <|im_start|> and <|im_end|>. Each variant trains 6 steps and checks that the loss falls, that
nothing but the adapters and the two new tokens' rows moved (the checkpoint's base equals the
pretrained folder), that the export's merged model computes what the base plus peft's adapter
folder computes, and that a run resumed from step 3 equals the uninterrupted one.
"""

import importlib.util

import pytest
import torch

from tests.conftest import DEEPSPEED_ON_CPU, LEVERS, assert_checkpoint_size_estimated, compose, metrics_rows, run_cli

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
CHATML = 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'
BASE_VOCAB, TRUE_VOCAB = 4096, 4098  # the base knows the bundled tokenizer; the run adds two tokens
# ZeRO-3 stands for DeepSpeed (partitioned parameters are the harder case; LoRA under ZeRO-2 trains
# in tests/integration/test_preference.py): the suite's time goes to what adds coverage.
# single takes the throughput levers (selective checkpointing through peft's layers, compiled blocks).
VARIANTS = {"single": LEVERS, "ddp": ["parallel=ddp", "cluster.devices=2"], "zero3": ["parallel=zero3", *DEEPSPEED_ON_CPU, *LEVERS]}
COMPARED = ("loss", "lr", "grad_norm", "val_loss")
PROBE = "<|im_start|>user\nHow do I reverse a list?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    """A tiny 'pretrained' Llama folder with the bundled tokenizer's 4096 rows (no ChatML tokens)."""
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.plan.attention import AttentionChoice

    cfg = compose(MODEL)
    tok = load_from_config(cfg.tokenizer)
    torch.manual_seed(0)
    model = build_model(cfg.model, hf_config(cfg.model, BASE_VOCAB, tok), AttentionChoice("sdpa", "test"))
    folder = tmp_path_factory.mktemp("base") / "tiny_base"
    model.save_pretrained(folder)
    return folder


def run_args(base, variant) -> list[str]:
    return [
        "experiment=smoke",
        *MODEL,
        "data=chat",
        CHATML,
        "data.seq_len=64",
        f"model.pretrained={base}",
        "finetune=lora",
        "finetune.rank=8",
        "trainer.max_steps=6",
        "trainer.warmup_steps=1",
        "trainer.lr=1e-2",
        "trainer.log_every_n_steps=1",
        "trainer.checkpoint_every_n_steps=3",
        "trainer.val_every_n_steps=3",
        "trainer.progress_bar=false",
        "trainer.plot=false",
        "generate.sample_prompts=[]",
        "export.dtype=fp32",
        *VARIANTS[variant],
    ]


def final_weights(run_dir) -> dict:
    """The HF-model weights of final.ckpt (a DeepSpeed folder: as consolidated for the export)."""
    ckpts = run_dir / "checkpoints"
    path = ckpts / "final.consolidated.ckpt" if (ckpts / "final.ckpt").is_dir() else ckpts / "final.ckpt"
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    assert ckpt["tinytrain"]["finetune"]["trainable_token_ids"] == [BASE_VOCAB, BASE_VOCAB + 1]
    return {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}


def only_adapters_and_new_rows_trained(weights: dict, base) -> None:
    from safetensors.torch import load_file

    from tinytrain.checkpoint.lora_weights import base_weights

    original = load_file(base / "model.safetensors")
    trained = base_weights(weights)
    assert set(original) <= set(trained)
    for name, w in original.items():
        # Frozen: bit for bit the base (the vocab tables' 4096 old rows too, under a gradient mask).
        assert torch.equal(trained[name][: w.shape[0]], w), name
    for table in ("model.embed_tokens.weight", "lm_head.weight"):  # saved with the two new rows (DeepSpeed's shards: padded)
        assert trained[table].shape[0] >= TRUE_VOCAB
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert len(lora_b) == 2 * 7 and all(v.abs().sum() > 0 for v in lora_b)  # every adapter learned


def merged_export_equals_base_plus_adapter(run_dir, base) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = run_dir / "hf_export"
    merged = AutoModelForCausalLM.from_pretrained(export).eval()
    assert merged.config.vocab_size == TRUE_VOCAB and merged.get_output_embeddings().weight.shape[0] == TRUE_VOCAB
    assert not any("lora" in k for k in merged.state_dict())
    tok = AutoTokenizer.from_pretrained(export)
    ids = torch.tensor([tok.encode(PROBE, add_special_tokens=False)])
    assert BASE_VOCAB in ids and BASE_VOCAB + 1 in ids  # the probe goes through the trained rows
    user_base = AutoModelForCausalLM.from_pretrained(base)
    user_base.resize_token_embeddings(len(tok))  # as the adapter folder's README says
    adapted = PeftModel.from_pretrained(user_base, export / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
        base_logits = AutoModelForCausalLM.from_pretrained(base)(input_ids=ids.clamp(max=BASE_VOCAB - 1)).logits
    assert not torch.allclose(merged(input_ids=ids.clamp(max=BASE_VOCAB - 1)).logits[..., :BASE_VOCAB], base_logits, atol=1e-3)  # it did learn


def rows_from(run_dir, first_step: int) -> list[tuple[str, dict]]:
    return [(r["step"], {k: r[k] for k in COMPARED if r.get(k)}) for r in metrics_rows(run_dir) if int(r["step"]) >= first_step]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lora_trains_exports_and_resumes(variant, base_model, tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(run_args(base_model, variant), run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "finetune   lora: rank 8, alpha 32" in r.stdout and "2 token(s) added beyond the base's 4096 rows (<|im_start|>, <|im_end|>)" in r.stdout
    losses = [float(row["loss"]) for row in metrics_rows(run_dir) if row.get("loss")]
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    # plan.json's step checkpoint counts the adapters beside the base's weights (6% short without them).
    assert_checkpoint_size_estimated(run_dir, "step0000003.ckpt", within=0.10 if variant.startswith("zero") else 0.03)
    weights = final_weights(run_dir)
    only_adapters_and_new_rows_trained(weights, base_model)
    merged_export_equals_base_plus_adapter(run_dir, base_model)

    # A run continued from the step-3 checkpoint logs what the uninterrupted one did, and ends with its weights.
    resumed = tmp_path / "resumed"
    step3 = run_dir / "checkpoints" / "step0000003.ckpt"
    if variant == "single":  # mode=export of a step checkpoint: the adapters from its metadata, merged
        r = run_cli(["mode=export", f"checkpoint={step3}"], tmp_path / "export")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert (run_dir / "hf_export-step0000003" / "adapter" / "adapter_model.safetensors").is_file()
        assert (run_dir / "hf_export-step0000003" / "model.safetensors").is_file()
        # Without peft (an install without the lora extra): named before anything is written (it failed mid-export, exit 1).
        from tests.cli_in_process import run_in_process

        with pytest.MonkeyPatch.context() as patch:
            find_spec = importlib.util.find_spec
            patch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a))
            code, err = run_in_process(["mode=export", f"checkpoint={step3}", f"export.dir={tmp_path / 'no_peft'}", f"hydra.run.dir={tmp_path / 'export_no_peft'}"])
        assert code == 2 and "peft is not installed here. Fix: pip install 'tinytrain-llm[lora]'" in err, err
        assert not (tmp_path / "no_peft").exists()
        # Other adapters than the checkpoint's: refused in the plan (it died loading the state with
        # a size mismatch after the data was built; another alpha silently made another model).
        r = run_cli([*run_args(base_model, variant), f"resume={step3}", "finetune.rank=4", "finetune.alpha=8"], tmp_path / "other_adapters")
        assert r.returncode == 2 and "was trained with finetune.rank=8, finetune.alpha=32.0; this run has 4, 8.0" in r.stderr, r.stderr[-2000:]
    r = run_cli([*run_args(base_model, variant), f"resume={step3}", "trainer.export=false"], resumed)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert rows_from(resumed, 3) == rows_from(run_dir, 3)
    if variant.startswith("zero"):  # the export consolidates final.ckpt; here do it for the comparison
        from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

        convert_zero_checkpoint_to_fp32_state_dict(str(resumed / "checkpoints" / "final.ckpt"), str(resumed / "checkpoints" / "final.consolidated.ckpt"))
    again = final_weights(resumed)
    assert again.keys() == weights.keys()
    assert all(torch.equal(again[k], weights[k]) for k in weights)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None, reason="QLoRA needs a CUDA GPU and bitsandbytes (pip install -e '.[qlora]')")
@pytest.mark.timeout(900)
def test_qlora_trains_exports_and_resumes_on_a_gpu(base_model, tmp_path):
    """The same fine-tune on a 4-bit NF4 base in bf16: checkpoints leave the quantized projections
    out, the export merges the adapters into the full-precision base."""
    args = [a.replace("finetune=lora", "finetune=qlora") for a in run_args(base_model, "single")] + ["precision=bf16"]
    run_dir = tmp_path / "run"
    r = run_cli(args, run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "finetune   qlora: rank 8" in r.stdout and "frozen in nf4" in r.stdout
    losses = [float(row["loss"]) for row in metrics_rows(run_dir) if row.get("loss")]
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    weights = final_weights(run_dir)
    assert not any(".base_layer." in k for k in weights)  # the 4-bit base is not in the checkpoint
    assert all(v.abs().sum() > 0 for k, v in weights.items() if "lora_B" in k)
    merged_export_equals_base_plus_adapter(run_dir, base_model)

    resumed = tmp_path / "resumed"
    r = run_cli([*args, f"resume={run_dir / 'checkpoints' / 'step0000003.ckpt'}", "trainer.export=false"], resumed)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    later = [float(row["loss"]) for row in metrics_rows(resumed) if row.get("loss")]
    assert later == pytest.approx(losses[3:], rel=1e-3)  # GPU kernels are not bitwise deterministic
    again = final_weights(resumed)
    assert again.keys() == weights.keys()
    for k in weights:
        torch.testing.assert_close(again[k].float(), weights[k].float(), rtol=1e-2, atol=1e-3)
