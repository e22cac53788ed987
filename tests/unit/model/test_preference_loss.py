"""Preference objectives against TRL's own code on the same batch: DPO and IPO through
DPOTrainer._compute_loss (trl 1.16 keeps its loss there; no dpo_loss function), the SimPO and
label-smoothed (conservative) DPO formulas through its CPOTrainer.cpo_loss, each trainer
instantiated minimally (the attributes its __init__ would set).

Two ways: (1) the whole path, TRL's fused log-prob head on the same tiny Llama policy and a
different reference (float64 weights; TRL's kernel computes in float32, so log-prob sums of ~60
are compared to 1e-6 relative to their size, the loss to 1e-6); (2) the objective alone on the
same log-probs: TRL's _compute_loss reads the policy's per-token log-probs from the model output
and the reference's from the batch (its precompute path), here both tinytrain's float64 values,
compared to 1e-6 over a range of beta. Plus: policy = reference gives ln 2 and zero rewards,
and the LoRA reference is the base with the adapters off.
"""

import copy
import json
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import compose
from tinytrain.data.bad_records import BadRecords
from tinytrain.data.preference import PreferenceCollator, PreferenceDataset, build_pairs
from tinytrain.data.sources import Source, records
from tinytrain.model.module import CausalLMModule
from tinytrain.model.module_spec import ModuleSpec, OptimizerSettings
from tinytrain.model.preference_loss import PreferenceObjective, kto_loss, preference_loss, sequence_logps
from tinytrain.model.reference import FrozenReference, adapters_disabled

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
PAIRS = [
    {"prompt": "Name a colour.", "chosen": "Blue, like the sky on a clear day.", "rejected": "Loud."},
    {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "It is probably five, or maybe six."},
    {"chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}], "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away."}]},
]
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(policy, reference, tinytrain batch, TRL inputs) in float64."""
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.plan.attention import AttentionChoice

    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    cfg = compose([*MODEL, "data=jsonl", "data.format=preference", f"data.path={path}", "data.chat_template=alpaca", "finetune.objective=dpo"])
    tok = load_from_config(cfg.tokenizer)
    bad = BadRecords(cfg.data.bad_records)
    pairs, _ = build_pairs(records(Source.from_config(cfg.data), bad), cfg.data, tok, bad)
    batch = PreferenceCollator(tok.eos_token_id)([PreferenceDataset(pairs)[i] for i in range(len(pairs))])
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(build_model(cfg.model, hf_config(cfg.model, len(tok), tok), AttentionChoice("sdpa", "test")).double().eval())
    # TRL's layout: completion_mask marks answer tokens (ours: the labels, shifted by one).
    completion = torch.zeros_like(batch["input_ids"])
    completion[:, 1:] = batch["labels"][:, :-1] != -100
    trl_inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "completion_mask": completion}
    return models[0], models[1], batch, trl_inputs, len(tok)


def close(ours: float, theirs: float) -> bool:
    return abs(ours - theirs) <= 1e-6 * max(1.0, abs(theirs))


def tinytrain_module(policy, reference, objective, vocab, adapters=False):
    trainer_cfg = compose(MODEL).trainer
    return CausalLMModule(policy, ModuleSpec(vocab, objective=objective, adapters=adapters, optimizer=OptimizerSettings.from_trainer(trainer_cfg)), reference and FrozenReference(reference))


def trl_dpo(policy, reference, inputs, loss_type, beta, precomputed=False):
    from accelerate import Accelerator
    from trl import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    trainer = DPOTrainer.__new__(DPOTrainer)
    trainer.accelerator = Accelerator(cpu=True)
    trainer.model, trainer.ref_model = copy.deepcopy(policy), copy.deepcopy(reference)
    if not precomputed:  # as DPOTrainer.__init__ patches them; GivenLogProbs answers like a patched model
        add_fused_lm_head(trainer.model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
        add_fused_lm_head(trainer.ref_model)
    trainer.args = SimpleNamespace(gradient_checkpointing_kwargs=None)
    trainer.beta, trainer.loss_types, trainer.loss_weights = beta, [loss_type], [1.0]
    trainer.f_divergence_type, trainer.ld_alpha, trainer.label_smoothing = "reverse_kl", None, 0.0
    trainer.use_weighting = trainer.aux_loss_enabled = False
    trainer.precompute_ref_logps = precomputed
    trainer._metrics, trainer._total_train_tokens, trainer._tp_size = {"train": defaultdict(list), "eval": defaultdict(list)}, 0, 1
    trainer.model.train()
    with torch.no_grad():
        loss = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
    return float(loss), {k: trainer._metrics["train"][k][-1] for k in METRICS}


def cpo_trainer(loss_type, beta, label_smoothing=0.0, simpo_gamma=0.5):
    from accelerate import Accelerator
    from trl.experimental.cpo import CPOTrainer

    trainer = CPOTrainer.__new__(CPOTrainer)
    trainer.accelerator = Accelerator(cpu=True)
    trainer.loss_type, trainer.beta, trainer.label_smoothing, trainer.simpo_gamma, trainer.alpha = loss_type, beta, label_smoothing, simpo_gamma, 0.0
    return trainer


def trl_sequence_logps(model, inputs, average):
    """TRL's get_batch_logps on the model's logits, with TRL's unshifted labels."""
    from trl.experimental.cpo import CPOTrainer

    labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
    with torch.no_grad():
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    return CPOTrainer.get_batch_logps(logits, labels, average_log_prob=average)


@pytest.mark.parametrize("name", ["dpo", "ipo"])
def test_dpo_and_ipo_match_trl_end_to_end(setup, name):
    policy, reference, batch, inputs, vocab = setup
    trl_loss, trl_metrics = trl_dpo(policy, reference, inputs, {"dpo": "sigmoid", "ipo": "ipo"}[name], 0.1)
    module = tinytrain_module(policy, reference, PreferenceObjective(name, 0.1), vocab)
    with torch.no_grad():
        loss, metrics = module.preference_step(batch)
    assert close(float(loss), trl_loss), (float(loss), trl_loss)
    for k in METRICS:
        assert close(float(metrics[k]), trl_metrics[k]), (k, float(metrics[k]), trl_metrics[k])
    assert trl_metrics["rewards/margins"] != 0  # policy and reference differ: the comparison is not of zeros


class GivenLogProbs(torch.nn.Module):
    """What TRL's fused head returns (FusedCausalLMOutput), holding given per-token log-probs."""

    def __init__(self, per_token: torch.Tensor):
        super().__init__()
        self.per_token = per_token

    def forward(self, **kwargs):
        from trl.trainer.utils import FusedCausalLMOutput

        zeros = torch.zeros_like(self.per_token)
        return FusedCausalLMOutput(loss=zeros.sum(), log_probs=self.per_token, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())


@pytest.mark.parametrize("name", ["dpo", "ipo"])
@pytest.mark.parametrize("beta", [0.05, 0.5, 2.0, 10.0])
def test_dpo_and_ipo_match_trl_on_the_same_log_probs(setup, name, beta):
    policy, reference, batch, inputs, vocab = setup
    labels = batch["labels"]
    with torch.no_grad():
        logits = policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        per_token = torch.log_softmax(logits[:, :-1, :vocab], -1).gather(-1, labels[:, :-1].clamp(min=0).unsqueeze(-1)).squeeze(-1) * (labels[:, :-1] != -100)
        ref = sequence_logps(reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, labels, vocab)[0]
    trl_loss, trl_metrics = trl_dpo(GivenLogProbs(per_token), None, {**inputs, "ref_chosen_logps": ref.chunk(2)[0], "ref_rejected_logps": ref.chunk(2)[1]}, {"dpo": "sigmoid", "ipo": "ipo"}[name], beta, precomputed=True)
    with torch.no_grad():
        loss, metrics = preference_loss(PreferenceObjective(name, beta), *sequence_logps(logits, labels, vocab), ref)
    assert abs(float(loss) - trl_loss) < 1e-6, (float(loss), trl_loss)
    for k in METRICS:
        assert abs(float(metrics[k]) - trl_metrics[k]) < 1e-6, (k, float(metrics[k]), trl_metrics[k])


def test_label_smoothed_dpo_matches_trls_conservative_loss(setup):
    """trl 1.16's DPO sigmoid loss has no label smoothing; its CPOTrainer keeps the conservative-DPO
    formula -(1-e) log s(b x) - e log s(-b x), here on the policy/reference log-ratios."""
    policy, reference, batch, inputs, vocab = setup
    ratios = trl_sequence_logps(policy, inputs, False) - trl_sequence_logps(reference, inputs, False)
    losses, _, _ = cpo_trainer("sigmoid", 0.5, label_smoothing=0.2).cpo_loss(*ratios.chunk(2))
    module = tinytrain_module(policy, reference, PreferenceObjective("dpo", 0.5, label_smoothing=0.2), vocab)
    with torch.no_grad():
        loss, _ = module.preference_step(batch)
    assert close(float(loss), float(losses.mean()))


def test_simpo_matches_trl(setup):
    """SimPO through TRL's CPOTrainer (loss_type=simpo): its preference loss and metrics (TRL adds
    cpo_alpha x an NLL term on top unless cpo_alpha=0, which pure SimPO is)."""
    policy, _, batch, inputs, vocab = setup
    trainer = cpo_trainer("simpo", 2.0, label_smoothing=0.1, simpo_gamma=0.7)
    chosen, rejected = trl_sequence_logps(policy, inputs, True).chunk(2)
    losses, chosen_rewards, rejected_rewards = trainer.cpo_loss(chosen, rejected)
    expected = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).double().mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "logps/chosen": chosen.mean(),
        "logps/rejected": rejected.mean(),
    }
    module = tinytrain_module(policy, None, PreferenceObjective("simpo", 2.0, label_smoothing=0.1, simpo_gamma=0.7), vocab)
    with torch.no_grad():
        loss, metrics = module.preference_step(batch)
    assert close(float(loss), float(losses.mean()))
    for k in METRICS:
        assert close(float(metrics[k]), float(expected[k])), k


@pytest.mark.parametrize("name", ["dpo", "ipo"])
def test_policy_equal_to_reference_gives_the_known_start(setup, name):
    """Step 0: log-ratios are 0, so DPO's loss is ln 2 and IPO's (1/(2 beta))^2; every reward 0."""
    policy, _, batch, _, vocab = setup
    module = tinytrain_module(policy, copy.deepcopy(policy), PreferenceObjective(name, 0.1), vocab)
    with torch.no_grad():
        loss, metrics = module.preference_step(batch)
    assert float(loss) == pytest.approx(math.log(2) if name == "dpo" else 25.0, abs=1e-9)
    assert all(float(metrics[k]) == 0 for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"))


def test_sequence_logps_sum_the_answer_tokens_only():
    logits = torch.randn(2, 5, 12, dtype=torch.float64)
    logits[..., 10:] = 50.0  # padded vocab rows: sliced off, never probability mass
    labels = torch.tensor([[-100, 3, 4, -100, -100], [-100, -100, 7, -100, -100]])
    sums, counts = sequence_logps(logits, labels, true_vocab=10)
    logp = torch.log_softmax(logits[..., :10], -1)
    assert torch.allclose(sums, torch.stack([logp[0, 1, 3] + logp[0, 2, 4], logp[1, 2, 7]]))
    assert counts.tolist() == [2, 1]


def test_ipo_and_dpo_need_the_reference_simpo_does_not():
    logps, counts = torch.tensor([-3.0, -5.0]), torch.tensor([2, 2])
    loss, m = preference_loss(PreferenceObjective("simpo", 1.0, simpo_gamma=0.0), logps, counts, None)
    assert float(m["rewards/margins"]) == pytest.approx(1.0) and float(loss) == pytest.approx(-math.log(1 / (1 + math.exp(-1.0))))


def test_lora_reference_is_the_base_with_adapters_off(setup):
    """The reference under LoRA: peft's adapters switched off on the same model (no copy), then on again."""
    from tinytrain.model.lora import apply_adapters
    from tinytrain.plan.finetune import FinetunePlan

    base, _, batch, _, vocab = setup
    model = copy.deepcopy(base)
    plan = FinetunePlan("lora", 4, 8.0, 0.0, ("q_proj", "v_proj"), 0, (), "", 0, "fp64", "test")
    model = apply_adapters(model, plan)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # adapters that change the output
    module = tinytrain_module(model, None, PreferenceObjective("dpo", 0.1), vocab, adapters=True)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        expected = sequence_logps(base(**inputs).logits, batch["labels"], vocab)[0]
        adapted = module.sequence_logps(batch)[0]
        assert torch.allclose(module.reference_logps(batch), expected, atol=1e-9)
        assert not torch.allclose(adapted, expected)
        assert torch.equal(module.sequence_logps(batch)[0], adapted)  # the adapters are back on
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    with adapters_disabled(model):
        assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)


ORPO_METRICS = (*METRICS, "nll_loss", "log_odds_ratio", "log_odds_chosen")


def trl_orpo(policy, batch, beta):
    """TRL's ORPOTrainer.get_batch_loss_metrics on our batch in its layout (unshifted labels)."""
    from accelerate import Accelerator
    from trl.experimental.orpo import ORPOTrainer

    trainer = ORPOTrainer.__new__(ORPOTrainer)
    trainer.accelerator = Accelerator(cpu=True)
    trainer.beta, trainer.is_encoder_decoder, trainer.padding_value, trainer.aux_loss_enabled = beta, False, 0, False
    trainer.label_pad_token_id = -100
    half = batch["input_ids"].shape[0] // 2
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 1:] = batch["labels"][:, :-1]
    trl_batch = {}
    for side, rows in (("chosen", slice(0, half)), ("rejected", slice(half, None))):
        trl_batch |= {f"{side}_input_ids": batch["input_ids"][rows], f"{side}_attention_mask": batch["attention_mask"][rows], f"{side}_labels": labels[rows]}
    with torch.no_grad():
        loss, metrics = trainer.get_batch_loss_metrics(policy, trl_batch)
    return float(loss), metrics


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_orpo_matches_trl_end_to_end(setup, beta):
    """ORPO (no reference): loss, nll_loss, log_odds_* and the rewards equal TRL's ORPOTrainer's."""
    policy, _, batch, _, vocab = setup
    trl_loss, trl_metrics = trl_orpo(policy, batch, beta)
    module = tinytrain_module(policy, None, PreferenceObjective("orpo", beta), vocab)
    with torch.no_grad():
        loss, metrics = module.preference_step(batch)
    assert abs(float(loss) - trl_loss) <= 1e-5 * abs(trl_loss), (float(loss), trl_loss)
    for k in ORPO_METRICS:
        assert abs(float(metrics[k]) - trl_metrics[k]) <= 1e-5 * max(1.0, abs(trl_metrics[k])), (k, float(metrics[k]), trl_metrics[k])


def test_orpo_at_step_zero_is_its_definition():
    """Equal chosen and rejected mean log-probs: log odds 0, so the odds-ratio term is log(1/2) and
    the loss is NLL + beta ln 2; rewards are beta x the mean log-probs."""
    logps, counts = torch.tensor([-6.0, -3.0]), torch.tensor([4, 2])  # means -1.5 and -1.5
    nll = torch.tensor(2.0)
    loss, metrics = preference_loss(PreferenceObjective("orpo", 0.25), logps, counts, None, nll)
    assert float(loss) == pytest.approx(2.0 + 0.25 * math.log(2))
    assert float(metrics["log_odds_chosen"]) == pytest.approx(0.0)
    assert float(metrics["log_odds_ratio"]) == pytest.approx(-math.log(2))
    assert float(metrics["rewards/chosen"]) == pytest.approx(0.25 * -1.5)
    assert float(metrics["nll_loss"]) == 2.0


KTO_METRICS = ("kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected")


def kto_rows(prompts, completions):
    """Right-padded rows of prompt + completion token ids, their attention and completion masks."""
    width = max(len(p) + len(c) for p, c in zip(prompts, completions))
    ids, attention, completion = (torch.zeros(len(prompts), width, dtype=torch.long) for _ in range(3))
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        attention[i, : len(p) + len(c)] = 1
        completion[i, len(p) : len(p) + len(c)] = 1
    return ids, attention, completion


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 1.33)])
def test_kto_matches_trl_end_to_end(setup, weights):
    """KTO on four unpaired examples (three desirable): loss, kl and TRL's metrics against
    KTOTrainer._compute_loss on the same policy, reference and batch (KL rows: each prompt with the
    previous example's completion, as TRL's collator cycles them)."""
    from accelerate import Accelerator
    from trl import KTOTrainer
    from trl.trainer.utils import add_fused_lm_head

    policy, reference, _, _, vocab = setup
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (5, 3, 7, 4)]
    completions = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (4, 6, 2, 5)]
    labels = torch.tensor([True, False, True, True])
    ids, attention, completion = kto_rows(prompts, completions)
    kl_ids, kl_attention, kl_completion = kto_rows(prompts, completions[-1:] + completions[:-1])

    trainer = KTOTrainer.__new__(KTOTrainer)
    trainer.accelerator = Accelerator(cpu=True)
    trainer.model, trainer.ref_model = copy.deepcopy(policy), copy.deepcopy(reference)
    add_fused_lm_head(trainer.model, outputs=("log_probs", "entropy", "mean_logits"))
    add_fused_lm_head(trainer.ref_model)
    trainer.args = SimpleNamespace(gradient_checkpointing_kwargs=None)
    trainer.beta, trainer.loss_type, (trainer.desirable_weight, trainer.undesirable_weight) = 0.1, "kto", weights
    trainer.calculate_KL, trainer.precompute_ref_logps, trainer.aux_loss_enabled = True, False, False
    trainer._metrics, trainer._total_train_tokens, trainer._tp_size = {"train": defaultdict(list), "eval": defaultdict(list)}, 0, 1
    trainer.model.train()
    inputs = {"input_ids": ids, "attention_mask": attention, "completion_mask": completion, "KL_input_ids": kl_ids, "KL_attention_mask": kl_attention, "KL_completion_mask": kl_completion, "label": labels}
    with torch.no_grad():
        trl_loss = float(trainer._compute_loss(trainer.model, inputs, return_outputs=False))
    trl_metrics = {k: trainer._metrics["train"][k][-1] for k in KTO_METRICS}

    def logps(model, rows, mask, comp):
        labels_ = torch.full_like(rows, -100)
        labels_[:, :-1] = rows[:, 1:].masked_fill(comp[:, 1:] == 0, -100)
        with torch.no_grad():
            return sequence_logps(model(input_ids=rows, attention_mask=mask).logits, labels_, vocab)[0]

    loss, metrics = kto_loss(0.1, *weights, logps(policy, ids, attention, completion), logps(reference, ids, attention, completion), logps(policy, kl_ids, kl_attention, kl_completion), logps(reference, kl_ids, kl_attention, kl_completion), labels)
    assert abs(float(loss) - trl_loss) <= 1e-5 * abs(trl_loss), (float(loss), trl_loss)
    for k in KTO_METRICS:
        assert abs(float(metrics[k]) - trl_metrics[k]) <= 1e-5 * max(1.0, abs(trl_metrics[k])), (k, float(metrics[k]), trl_metrics[k])
    assert trl_metrics["rewards/margins"] != 0


def test_kto_at_step_zero_is_its_definition():
    """Policy = reference: every log-ratio and the KL estimate are 0, so each example loses
    weight x (1 - s(0)) = weight / 2 and every reward is 0."""
    logps = torch.tensor([-5.0, -7.0, -2.0])
    kl = torch.tensor([-9.0, -4.0, -6.0])
    desirable = torch.tensor([True, False, False])
    loss, metrics = kto_loss(0.1, 1.0, 1.5, logps, logps.clone(), kl, kl.clone(), desirable)
    assert float(loss) == pytest.approx((0.5 + 0.75 + 0.75) / 3)
    assert float(metrics["kl"]) == 0 and float(metrics["rewards/margins"]) == 0
    assert float(metrics["logps/rejected"]) == pytest.approx(-4.5)
