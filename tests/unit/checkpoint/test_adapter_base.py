"""The base an exported LoRA adapter names (checkpoint/lora_weights.py portable_base)."""

import logging

from tinytrain.checkpoint.lora_weights import portable_base


def test_an_init_from_checkpoint_base_is_named_by_its_run_s_export(tmp_path, caplog):
    """A LoRA run from checkpoint.init_from=<run>/checkpoints/final.ckpt wrote that .ckpt as the
    adapter's base_model_name_or_path: a file peft cannot load as a base."""
    base_run = tmp_path / "sft"
    (base_run / "checkpoints").mkdir(parents=True)
    (base_run / "hf_export").mkdir()
    (base_run / "hf_export" / "config.json").write_text("{}")
    final = base_run / "checkpoints" / "final.ckpt"
    step = base_run / "checkpoints" / "step0000004.ckpt"
    final.write_bytes(b"weights")
    step.write_bytes(b"weights")
    adapter = tmp_path / "lora" / "hf_export" / "adapter"
    assert portable_base(str(final), adapter) == "../../../sft/hf_export"
    caplog.set_level(logging.WARNING)
    assert portable_base(str(step), adapter) == "../../../sft/checkpoints/step0000004.ckpt"  # not the export's weights
    assert "is a tinytrain checkpoint peft cannot load: export it (mode=export checkpoint=" in caplog.text
    hf_folder = tmp_path / "models" / "base"
    hf_folder.mkdir(parents=True)
    (hf_folder / "config.json").write_text("{}")
    assert portable_base(str(hf_folder), adapter) == "../../../models/base"
    assert portable_base("TinyLlama/TinyLlama-1.1B-Chat-v1.0", adapter) == "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
