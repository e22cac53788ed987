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
MEAN_LOGPS = ("simpo", "orpo")  # objectives on the mean per-token log-prob, not the sum


@dataclass(frozen=True)
class PreferenceObjective:
    name: str  # dpo | ipo | simpo
    beta: float
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5

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
