"""trainer.optimizer=muon: the split, the update against PyTorch's own Muon + AdamW, exact resume."""

import copy
from types import SimpleNamespace

import pytest
import torch

from tinytrain.config.schema import OptimizerName
from tinytrain.model import optimizers


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))


def trainer(name=OptimizerName.muon, lr=1e-2, ns_dtype="bfloat16"):
    return SimpleNamespace(optimizer=name, lr=lr, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1, muon_momentum=0.95, muon_ns_dtype=ns_dtype)


def fill_grads(model, seed):
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = tiny_llama()
    groups = optimizers.optimizer_groups(model, trainer())
    muon = {id(p) for g in groups if g["use_muon"] for p in g["params"]}
    for name, p in model.named_parameters():
        expected = p.ndim == 2 and "embed_tokens" not in name and "lm_head" not in name
        assert (id(p) in muon) == expected, name
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(p.numel() for p in model.parameters())


def test_one_rank_update_equals_pytorchs_muon_and_adamw():
    """Three steps of trainer.optimizer=muon against torch.optim.Muon (match_rms_adamw, Nesterov)
    on the hidden matrices and torch.optim.AdamW on the rest, with the same gradients."""
    ours, ref = tiny_llama(), tiny_llama()
    t = trainer()
    opt = optimizers.build(optimizers.optimizer_groups(ours, t), t, cpu_adam=False, fused_adamw=False, deepspeed=False)
    hidden = [p for p in ref.parameters() if optimizers.hidden_matrix(ref, p)]
    rest = [p for p in ref.parameters() if not optimizers.hidden_matrix(ref, p)]
    ref_groups = optimizers.adamw_groups(ref, rest, t.weight_decay, True)
    ref_muon = torch.optim.Muon(hidden, lr=t.lr, weight_decay=t.weight_decay, momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw")
    ref_adamw = torch.optim.AdamW(ref_groups, lr=t.lr, betas=(0.9, 0.95), eps=1e-8)
    for step in range(3):
        fill_grads(ours, step)
        fill_grads(ref, step)
        opt.step()
        ref_muon.step()
        ref_adamw.step()
    for (name, a), b in zip(ours.named_parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    # The Muon matrices moved by ~0.2 sqrt(max(A, B)) x lr x RMS 1 per step: far more than 1e-6.
    assert not torch.allclose(ours.model.layers[0].mlp.up_proj.weight, tiny_llama().model.layers[0].mlp.up_proj.weight, atol=1e-3)


def test_state_dict_round_trip_continues_exactly():
    """Save after two steps, load into a fresh optimizer, step again: the same weights as unbroken."""
    t = trainer()
    a = tiny_llama()
    opt_a = optimizers.build(optimizers.optimizer_groups(a, t), t, cpu_adam=False, fused_adamw=False, deepspeed=False)
    for step in range(2):
        fill_grads(a, step)
        opt_a.step()
    b = copy.deepcopy(a)
    opt_b = optimizers.build(optimizers.optimizer_groups(b, t), t, cpu_adam=False, fused_adamw=False, deepspeed=False)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    assert any("momentum_buffer" in s for s in opt_b.state.values()) and any("exp_avg" in s for s in opt_b.state.values())
    for o, m in ((opt_a, a), (opt_b, b)):
        fill_grads(m, 7)
        o.step()
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(x, y), name


def test_deepspeed_groups_apply_the_same_rate_and_decay():
    """DeepSpeed scales a Muon update by sqrt(max(1, rows/cols)) and decays by group lr x wd: each
    shape's group lr and weight decay make that 0.2 sqrt(max(rows, cols)) x lr and lr x wd."""
    model = tiny_llama()
    t = trainer()
    for g in optimizers.optimizer_groups(model, t, deepspeed=True):
        if not g["use_muon"]:
            assert g["lr_scale"] == 1.0
            continue
        rows, cols = g["params"][0].shape
        assert all(tuple(p.shape) == (rows, cols) for p in g["params"])
        applied = g["lr_scale"] * max(1.0, rows / cols) ** 0.5
        assert applied == pytest.approx(0.2 * max(rows, cols) ** 0.5)
        assert g["lr_scale"] * g["weight_decay"] == pytest.approx(t.weight_decay)


def test_deepspeed_muon_update_has_torchs_direction():
    """DeepSpeed's EMA momentum is (1 - beta) x torch's summed one; Newton-Schulz normalises it away."""
    from deepspeed.runtime.zero.muon.original_muon import muon_update
    from torch.optim._muon import _zeropower_via_newtonschulz

    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(48, 32, generator=g) for _ in range(3)]
    ours_m, torch_m = torch.zeros(48, 32), torch.zeros(48, 32)
    for grad in grads:
        ds = muon_update(grad.clone(), ours_m, beta=0.95, ns_method="standard") / max(1.0, 48 / 32) ** 0.5
        torch_m.mul_(0.95).add_(grad)
        ref = _zeropower_via_newtonschulz(grad + 0.95 * torch_m, (3.4445, -4.775, 2.0315), 5, 1e-7).float()
        # both in bf16: agreement to bf16's precision, not to the last bit
        assert (ds - ref).abs().max() < 0.05
        assert torch.nn.functional.cosine_similarity(ds.flatten(), ref.flatten(), dim=0) > 0.999


def test_newton_schulz_in_bf16_is_torchs_to_the_bit():
    from torch.optim._muon import _zeropower_via_newtonschulz

    from tinytrain.model.gathered_muon import newton_schulz

    g = torch.Generator().manual_seed(0)
    for shape in ((48, 32), (32, 48), (40, 40)):
        x = torch.randn(shape, generator=g)
        kept = x.clone()
        ours = newton_schulz(x, (3.4445, -4.775, 2.0315), 5, 1e-7, torch.bfloat16)
        assert torch.equal(ours, _zeropower_via_newtonschulz(x, (3.4445, -4.775, 2.0315), 5, 1e-7))
        assert torch.equal(x, kept)  # the input (a momentum buffer without Nesterov) is left alone
        assert newton_schulz(x, (3.4445, -4.775, 2.0315), 5, 1e-7, torch.float32).dtype == torch.float32
        assert torch.equal(x, kept)


def test_fp32_newton_schulz_is_gathered_muon_with_torchs_state():
    """Under 32-true (ns_dtype float32) the Muon half is GatheredMuon: torch's update with fp32
    Newton-Schulz, close to torch's bf16 one, with the same state names (checkpoints load either way)."""
    from tinytrain.model.gathered_muon import GatheredMuon

    fp32, bf16 = tiny_llama(), tiny_llama()
    opts = {}
    for model, dtype in ((fp32, "float32"), (bf16, "bfloat16")):
        t = trainer(ns_dtype=dtype)
        opts[dtype] = optimizers.build(optimizers.optimizer_groups(model, t), t, cpu_adam=False, fused_adamw=False, deepspeed=False)
        for step in range(2):
            fill_grads(model, step)
            opts[dtype].step()
    assert isinstance(opts["float32"].inner[0], GatheredMuon) and type(opts["bfloat16"].inner[0]) is torch.optim.Muon
    a, b = fp32.model.layers[0].mlp.up_proj.weight, bf16.model.layers[0].mlp.up_proj.weight
    assert 0 < (a - b).abs().max() < 1e-3  # bf16's rounding, on updates of ~0.2 sqrt(48) x 1e-2
    assert opts["float32"].state_dict()["state"].keys() == opts["bfloat16"].state_dict()["state"].keys()
    assert {k for s in opts["float32"].state.values() for k in s} == {k for s in opts["bfloat16"].state.values() for k in s}
