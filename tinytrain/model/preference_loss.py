"""Preference objectives on sequence log-probs: DPO (sigmoid, optional label smoothing), IPO and
SimPO, with the metrics TRL logs under the same names and meanings.

A batch is 2B rows, the B chosen answers first, then the B rejected ones (data/preference.py).
`sequence_logps` sums each row's log-probs over its labelled (answer) tokens; the objectives take
those sums, the answer lengths and, for DPO and IPO, the reference's sums:

  dpo    -(1 - e) log s(b D) - e log s(-b D),  D = (pi_c - ref_c) - (pi_r - ref_r)   (cDPO for e > 0)
  ipo    (D_c / n_c - D_r / n_r - 1 / (2 b))^2, per-token log-ratios as TRL computes them
  simpo  -(1 - e) log s(b (pi_c / n_c - pi_r / n_r) - g) - e log s(-(...)),  no reference
  orpo   NLL(chosen) - b log s(log odds(p_c) - log odds(p_r)),  p = exp(pi / n) the mean per-token
         probability, odds(p) = p / (1 - p); no reference. The NLL is TRL's: over the chosen row's
         prompt and answer (every non-padding token after the first), as TRL's ORPOTrainer computes it.

KTO (unpaired, `kto_loss`): a batch is B completions then their B KL rows (each prompt with the
previous example's completion, TRL's mismatched pairs); with r = pi - ref per completion and the KL
estimate z = max(0, mean over the batch (and the data-parallel ranks) of pi_KL - ref_KL), detached,
desirable ones lose dw (1 - s(b (r - z))) and undesirable ones uw (1 - s(b (z - r))), averaged over
the batch's examples, as TRL's KTOTrainer computes them.

Rewards are b x the log-ratio (dpo, ipo) or b x the mean per-token log-prob (simpo as TRL's
CPOTrainer logs it, orpo as its ORPOTrainer does); logps/* are the sums (dpo, ipo) or the means
(simpo, orpo) the loss saw. orpo adds TRL's nll_loss, log_odds_ratio and log_odds_chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE = -100
REFERENCE_FREE = ("simpo", "orpo")
UNPAIRED = ("kto",)  # objectives on {prompt, completion, label} records
MEAN_LOGPS = ("simpo", "orpo")  # objectives on the mean per-token log-prob, not the sum


@dataclass(frozen=True)
class PreferenceObjective:
    name: str  # dpo | ipo | simpo
    beta: float
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5
    desirable_weight: float = 1.0  # kto
    undesirable_weight: float = 1.0  # kto

    @property
    def needs_reference(self) -> bool:
        return self.name not in REFERENCE_FREE


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, true_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of log p(label) over each row's labelled tokens, their count). Labels are pre-shifted
    (labels[t] is the token after t); padded vocab rows are sliced off, as the SFT loss does."""
    logits = logits[..., :true_vocab]
    logits = logits.float() if logits.dtype != torch.float64 else logits
    mask = labels != IGNORE
    picked = torch.gather(logits, -1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    per_token = picked - torch.logsumexp(logits, dim=-1)
    return (per_token * mask).sum(-1), mask.sum(-1)


def full_sequence_nll(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor, true_vocab: int) -> torch.Tensor:
    """Mean next-token cross-entropy over every non-padding token after the first (prompt and
    answer): ORPO's NLL term as TRL computes it."""
    targets = input_ids[:, 1:].masked_fill(attention_mask[:, 1:] == 0, IGNORE)
    logits = logits[:, :-1, :true_vocab]
    return F.cross_entropy(logits.reshape(-1, true_vocab).float(), targets.reshape(-1), ignore_index=IGNORE)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, without cancellation (branch at -ln 2, as TRL's)."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def _smoothed_sigmoid_loss(logits: torch.Tensor, smoothing: float) -> torch.Tensor:
    return -(1 - smoothing) * F.logsigmoid(logits) - smoothing * F.logsigmoid(-logits)


def data_parallel_sum(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over every rank (as TRL gathers its KL estimate and metrics); itself on one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        t = t.clone()
        torch.distributed.all_reduce(t)
    return t


# What kto_loss logs: the chosen side's, the rejected side's and the margin only in a step that has them.
KTO_METRICS = ("kl", "rewards/chosen", "logps/chosen", "rewards/rejected", "logps/rejected", "rewards/margins")


def kto_loss(beta: float, desirable_weight: float, undesirable_weight: float, logps: torch.Tensor, ref_logps: torch.Tensor, kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor, desirable: torch.Tensor, reduce=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KTO's loss (mean over the batch's examples) and TRL's metrics from (B,) log-prob sums of the
    completions, the reference's, the KL rows' (policy, reference) and the labels. `reduce(t)`:
    the sum of `t` over the data-parallel ranks (identity on one), as TRL gathers its metrics and KL."""
    reduce = reduce or (lambda t: t)
    world = float(reduce(torch.ones((), dtype=logps.dtype, device=logps.device)))
    kl = (reduce((kl_logps - ref_kl_logps).mean().detach()) / world).clamp(min=0)
    ratio = logps - ref_logps
    chosen, rejected = desirable, ~desirable
    losses = torch.cat([desirable_weight * (1 - torch.sigmoid(beta * (ratio[chosen] - kl))), undesirable_weight * (1 - torch.sigmoid(beta * (kl - ratio[rejected])))])
    rewards = beta * ratio.detach()
    # Sums and counts over the ranks: every rank logs the same values, so the keys agree everywhere.
    sums = reduce(torch.stack([rewards[chosen].sum(), logps.detach()[chosen].sum(), chosen.sum().to(logps.dtype), rewards[rejected].sum(), logps.detach()[rejected].sum(), rejected.sum().to(logps.dtype)]))
    metrics = {"kl": kl}
    if sums[2] > 0:
        metrics |= {"rewards/chosen": sums[0] / sums[2], "logps/chosen": sums[1] / sums[2]}
    if sums[5] > 0:
        metrics |= {"rewards/rejected": sums[3] / sums[5], "logps/rejected": sums[4] / sums[5]}
    if sums[2] > 0 and sums[5] > 0:
        metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    return losses.nanmean(), metrics


def preference_loss(objective: PreferenceObjective, logps: torch.Tensor, counts: torch.Tensor, ref_logps: torch.Tensor | None, nll: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The batch's loss (mean over pairs) and TRL's metrics, from (2B,) policy log-prob sums,
    answer token counts, (dpo, ipo) the reference's sums and (orpo) the chosen rows' NLL."""
    b = objective.beta
    chosen, rejected = logps.chunk(2)
    n_chosen, n_rejected = counts.to(logps.dtype).clamp(min=1).chunk(2)
    extra = {}
    if objective.name == "orpo":
        chosen_avg, rejected_avg = chosen / n_chosen, rejected / n_rejected
        log_odds = (chosen_avg - rejected_avg) - (log1mexp(chosen_avg) - log1mexp(rejected_avg))
        ratio = F.logsigmoid(log_odds)
        losses = nll - b * ratio
        chosen_rewards, rejected_rewards = b * chosen_avg.detach(), b * rejected_avg.detach()
        logged_chosen, logged_rejected = chosen_avg, rejected_avg
        extra = {"nll_loss": nll.detach(), "log_odds_ratio": ratio.detach().mean(), "log_odds_chosen": log_odds.detach().mean()}
    elif objective.name == "simpo":
        chosen_avg, rejected_avg = chosen / n_chosen, rejected / n_rejected
        losses = _smoothed_sigmoid_loss(b * (chosen_avg - rejected_avg) - objective.simpo_gamma, objective.label_smoothing)
        chosen_rewards, rejected_rewards = b * chosen_avg.detach(), b * rejected_avg.detach()
        logged_chosen, logged_rejected = chosen_avg, rejected_avg
    else:
        ref_chosen, ref_rejected = ref_logps.to(logps.dtype).chunk(2)
        chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
        if objective.name == "dpo":
            losses = _smoothed_sigmoid_loss(b * (chosen_ratio - rejected_ratio), objective.label_smoothing)
        elif objective.name == "ipo":
            losses = (chosen_ratio / n_chosen - rejected_ratio / n_rejected - 1 / (2 * b)) ** 2
        else:
            raise ValueError(f"unknown preference objective {objective.name!r}")
        chosen_rewards, rejected_rewards = b * chosen_ratio.detach(), b * rejected_ratio.detach()
        logged_chosen, logged_rejected = chosen, rejected
    metrics = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).to(logps.dtype).mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "logps/chosen": logged_chosen.detach().mean(),
        "logps/rejected": logged_rejected.detach().mean(),
        **extra,
    }
    return losses.mean(), metrics
