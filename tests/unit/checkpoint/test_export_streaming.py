"""The export of a sharded (fsdp_tp) checkpoint folder streams: one weight read at a time, written
and dropped before the next is read, the optimizer state never read, and the folder is the one
save_pretrained writes from the whole weights, to the byte. The folder is a DCP save of a 2-layer
model written in-process (the 2-rank runs of tests/integration/test_sharded_checkpoints.py and
test_tensor_parallel.py export real ones)."""

from __future__ import annotations

import json
import weakref

import pytest
import torch

from tests.conftest import compose
from tinytrain.checkpoint import sharded
from tinytrain.checkpoint.export import ExportSpec, export_checkpoint, export_state_dict
from tinytrain.config.dtype import Dtype

SMALL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
PAD = 60  # padding rows, as a tp run saves its vocab tables


def sharded_folder(path, tokenizer, tied: bool):
    """A DCP folder as fsdp_tp writes it: `state_dict.model.<name>` (vocab rows padded) and Adam moments."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    from tinytrain.model.build import hf_config

    cfg = compose([*SMALL, f"model.tie_word_embeddings={str(tied).lower()}"])
    config = hf_config(cfg.model, len(tokenizer) + PAD, tokenizer)
    torch.manual_seed(0)
    weights = AutoModelForCausalLM.from_config(config).state_dict()
    moments = {name: {"exp_avg": torch.randn_like(w), "exp_avg_sq": torch.rand_like(w)} for name, w in weights.items()}
    state = {"state_dict": {"model." + k: v for k, v in weights.items()}, "optimizer_0": {"state": moments}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    return config


class Reads:
    """Wraps the folder reader: how many earlier weights are still alive at each read (a tensor dies
    with its last reference: no cycles, no gc needed), which names."""

    def __init__(self, monkeypatch):
        self.alive, self.names, self.most_alive = [], [], 0
        read = sharded.read_tensors

        def counted(folder, wanted, key, index=None):
            self.most_alive = max(self.most_alive, sum(ref() is not None for ref in self.alive))
            got = read(folder, wanted, key, index)
            self.names += list(wanted)
            self.alive += [weakref.ref(t) for t in got.values() if t is not None]
            return got

        monkeypatch.setattr(sharded, "read_tensors", counted)


@pytest.mark.parametrize("tied, dtype", [(False, Dtype.fp32), (True, Dtype.bf16)])
def test_a_sharded_folder_exports_one_tensor_at_a_time_to_the_same_bytes(bundled_tokenizer, tmp_path, monkeypatch, tied, dtype):
    folder = tmp_path / "step0000004.ckpt"
    config = sharded_folder(folder, bundled_tokenizer, tied)
    true_vocab, spec = len(bundled_tokenizer), ExportSpec(dtype)
    # The whole-weights path (save_pretrained): what the folder must hold.
    whole = {k: v.clone() for k, v in sharded.consolidated_weights(folder, "export").items()}
    export_state_dict(whole, model_config=config, tokenizer=bundled_tokenizer, true_vocab=true_vocab, out_dir=tmp_path / "whole", spec=spec)

    reads = Reads(monkeypatch)
    export_checkpoint(folder, model_config=config, tokenizer=bundled_tokenizer, true_vocab=true_vocab, out_dir=tmp_path / "streamed", spec=spec)
    assert reads.most_alive <= 1  # the weight being written when the next is read at most (was: every earlier one)
    assert reads.names and not [n for n in reads.names if not n.startswith("state_dict.")]  # no optimizer state read
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert sorted(p.name for p in (tmp_path / "streamed").iterdir()) == names and "model.safetensors" in names
    for name in names:
        assert (tmp_path / "streamed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert json.loads((tmp_path / "streamed" / "config.json").read_text())["vocab_size"] == true_vocab


def test_a_model_over_the_shard_size_is_split_with_an_index(bundled_tokenizer, tmp_path, monkeypatch):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tinytrain.checkpoint import stream_export
    from tinytrain.checkpoint.weight_files import weight_problems

    folder = tmp_path / "step0000004.ckpt"
    config = sharded_folder(folder, bundled_tokenizer, tied=False)
    true_vocab = len(bundled_tokenizer)
    export_checkpoint(folder, model_config=config, tokenizer=bundled_tokenizer, true_vocab=true_vocab, out_dir=tmp_path / "one")
    monkeypatch.setattr(stream_export, "MAX_SHARD_SIZE", 400_000)
    export_checkpoint(folder, model_config=config, tokenizer=bundled_tokenizer, true_vocab=true_vocab, out_dir=tmp_path / "split")
    index = json.loads((tmp_path / "split" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and weight_problems(tmp_path / "split") == []
    one = load_file(tmp_path / "one" / "model.safetensors")
    split = {k: v for f in files for k, v in load_file(tmp_path / "split" / f).items()}
    assert split.keys() == one.keys() and all(torch.equal(split[k], one[k]) for k in one)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "split")
    assert torch.equal(reloaded.get_output_embeddings().weight, one["lm_head.weight"])
