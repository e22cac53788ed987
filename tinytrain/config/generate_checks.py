"""The generate.* settings, checked before any model is loaded: mode=generate's sampling, and
the samples a training run generates at each validation step (checked before step 1, not at the
first validation after compute was spent)."""

from __future__ import annotations

import math

from tinytrain.errors import Problem


def sampling_problems(g) -> list[Problem]:
    """mode=generate: generate.max_new_tokens, temperature, top_p."""
    problems = []
    if g.max_new_tokens < 1:
        problems.append(Problem("generate.max_new_tokens", g.max_new_tokens, "must be >= 1 (tokens generated per prompt)", "use e.g. generate.max_new_tokens=64"))
    t = g.temperature
    if not math.isfinite(t) or t < 0:
        problems.append(Problem("generate.temperature", t, "must be a finite number >= 0 (logits are divided by it)", "use e.g. generate.temperature=0.8, or generate.do_sample=false for greedy"))
    elif g.do_sample and t == 0:
        problems.append(Problem("generate.temperature", t, "is 0 with generate.do_sample=true: sampling divides by it", "use generate.do_sample=false for greedy decoding, or a temperature above 0 (e.g. 0.8)"))
    if not (math.isfinite(g.top_p) and 0 < g.top_p <= 1):
        problems.append(Problem("generate.top_p", g.top_p, "must be in (0, 1] (the probability mass sampled from; 1 keeps every token)", "use e.g. generate.top_p=0.95, or 1.0 for no nucleus cut"))
    return problems


def training_sample_problems(g, max_positions: int | None = None) -> list[Problem]:
    """generate.sample_prompts / sample_max_new_tokens, generated at every validation step;
    `max_positions`: the model's (model.max_position_embeddings), None when a pretrained model's
    own decides (model/generation.py caps each sample at it)."""
    if not g.sample_prompts:
        return []
    problems = []
    if g.sample_max_new_tokens < 1:
        problems.append(Problem("generate.sample_max_new_tokens", g.sample_max_new_tokens, "must be >= 1 while generate.sample_prompts is set", "use e.g. generate.sample_max_new_tokens=32, or generate.sample_prompts=[] to turn samples off"))
    elif max_positions and g.sample_max_new_tokens >= max_positions:
        problems.append(Problem("generate.sample_max_new_tokens", g.sample_max_new_tokens, f"is not below the model's {max_positions} positions (model.max_position_embeddings), which a prompt and its sample share", f"use fewer (e.g. generate.sample_max_new_tokens={min(32, max_positions // 2)})"))
    blank = [i for i, p in enumerate(g.sample_prompts) if not str(p).strip()]
    if blank:
        problems.append(Problem(f"generate.sample_prompts[{blank[0]}]", g.sample_prompts[blank[0]], "is blank: there is nothing to continue", "give each prompt some text, or generate.sample_prompts=[] to turn samples off"))
    return problems
