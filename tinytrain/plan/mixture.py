"""The plan of a weighted mixture (data.sources): per source, its share of the samples, what one
pass over it holds, and how much of it the run trains on: expected values, share x the sequences
of every step (each sample is drawn independently; the run's own draws are fixed by the seed).

With data.stages the shares change at named steps: each stage's shares are listed, and what a
source is expected to give over the run (drawn items, passes, the step its first pass ends) adds
up the stages.

The sizes come from the data as training builds it (each source's token store, built or reused as
mode=prepare would, or its SFT samples), so the table is what the run will see.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tinytrain.config.schema import Exhaustion
from tinytrain.errors import ConfigError, Problem


@dataclass(frozen=True)
class SourcePlan:
    name: str
    where: str
    weight: float  # as given
    share: float  # weight / sum of the weights: the probability that a sample comes from it
    items: int  # windows (pretraining), samples or packed rows (SFT) in one pass
    item_kind: str
    tokens: int  # training tokens in one pass
    drawn_items: float  # expected over the run: share x global batch x max_steps
    passes: float  # drawn_items / items: above 1, the source is repeated
    runs_out_step: int | None  # expected step at which its first pass ends (None: not within the run)


@dataclass(frozen=True)
class StagePlan:
    from_step: int
    to_step: int  # exclusive
    shares: dict[str, float]  # source name -> probability a sample of these steps comes from it
    given: bool  # a data.stages entry (False: the steps after the last, drawn by data.sources' weights)


@dataclass(frozen=True)
class MixturePlan:
    exhaustion: str
    sources: tuple[SourcePlan, ...]
    stop_step: int | None  # data.exhaustion=stop: the expected step the run ends at, if before max_steps
    stages: tuple[StagePlan, ...] = ()  # data.stages (empty without)

    def to_dict(self) -> dict:
        return {"exhaustion": self.exhaustion, "stop_step": self.stop_step, "sources": [asdict(s) for s in self.sources], "stages": [asdict(s) for s in self.stages]}


def mixture_plan(cfg, batch, run_data) -> MixturePlan | None:
    """The mixture table for a config with data.sources (None without), read from the run's data
    (a RunData: built here for `batch`, as training reads it)."""
    if not cfg.data.sources:
        return None
    data = run_data.build(batch)
    if cfg.data.exhaustion == Exhaustion.stop:
        first_step_problem(data.train_sampler, batch, [entry.path for entry in cfg.data.sources])
    from tinytrain.data.mixture import stage_weights

    return plan_mixture(data.parts, exhaustion=cfg.data.exhaustion.value, global_batch_size=batch.global_batch_size, max_steps=cfg.trainer.max_steps, stages=stage_weights(cfg.data))


def first_step_problem(sampler, batch, paths: list) -> None:
    """Under data.exhaustion=stop, a source the first optimizer step would already exhaust (the draws
    are fixed by the seed, so this is exact) leaves nothing to train."""
    k = sampler.first_exhausted(batch.accumulate_grad_batches * batch.data_parallel)
    if k is not None:
        raise ConfigError(
            Problem(
                f"data.sources[{k}].path",
                paths[k],
                f"mixture source {sampler.names[k]!r} holds {sampler.sizes[k]:,} training items, fewer than the first step draws from it ({batch.global_batch_size} sequences a step), and data.exhaustion=stop forbids repeating them",
                "use data.exhaustion=repeat, more data in the source, a smaller weight for it or a smaller batch",
            )
        )


def stage_plans(parts, max_steps: int, stages: list[tuple[int | None, list[float]]]) -> list[StagePlan]:
    """The run's steps cut by data.stages, each with its shares (one piece without stages)."""
    def shares(weights) -> dict[str, float]:
        return {p.name: w / sum(weights) for p, w in zip(parts, weights)}

    out, start = [], 0
    for until, weights in stages:
        end = max_steps if until is None else until
        out.append(StagePlan(start, end, shares(weights), True))
        start = end
    if start < max_steps:
        out.append(StagePlan(start, max_steps, shares([p.weight for p in parts]), False))
    return out


def plan_mixture(parts, *, exhaustion: str, global_batch_size: int, max_steps: int, stages: list[tuple[int | None, list[float]]] = ()) -> MixturePlan:
    """`parts`: the DataModule's MixtureParts; `stages`: data.stages as data/mixture.py's stage_weights.
    Under data.exhaustion=stop the drawn items and passes count the steps up to the stop."""
    pieces = stage_plans(parts, max_steps, list(stages))
    total = sum(p.weight for p in parts)
    runs_out = {p.name: drawn_by(p, pieces, global_batch_size, max_steps)[1] for p in parts}
    ends = [step for step in runs_out.values() if step is not None and step < max_steps]
    stop = min(ends) if exhaustion == "stop" and ends else None
    sources = []
    for p in parts:
        drawn = drawn_by(p, pieces, global_batch_size, stop if stop is not None else max_steps)[0]
        out = runs_out[p.name]
        sources.append(SourcePlan(p.name, p.where, p.weight, p.weight / total, p.items, p.item_kind, p.tokens, drawn, drawn / p.items, out if out is not None and out < max_steps else None))
    return MixturePlan(exhaustion, tuple(sources), stop, tuple(pieces) if stages else ())


def drawn_by(part, pieces, global_batch_size: int, until: int) -> tuple[float, int | None]:
    """(items of `part` expected drawn in the steps before `until`, the step its first pass ends or None)."""
    drawn, runs_out = 0.0, None
    for piece in pieces:
        steps = max(0, min(piece.to_step, until) - piece.from_step)
        per_step = piece.shares[part.name] * global_batch_size
        if runs_out is None and per_step > 0 and drawn + per_step * steps > part.items:
            runs_out = piece.from_step + math.floor((part.items - drawn) / per_step)
        drawn += per_step * steps
    return drawn, runs_out


def render(mixture: dict, max_steps: int) -> list[str]:
    """The plan's mixture lines, from plan.json's `data_mixture`."""
    kind = mixture["sources"][0]["item_kind"]
    rows = [("source", "weight", "share", "tokens/pass", f"{kind}/pass", f"{kind} drawn (expected)", "passes", "first pass ends")]
    for s in mixture["sources"]:
        ends = f"step ~{s['runs_out_step']:,}" if s["runs_out_step"] is not None else "after the run"
        rows.append((s["name"], f"{s['weight']:g}", f"{100 * s['share']:.1f}%", f"{s['tokens']:,}", f"{s['items']:,}", f"{s['drawn_items']:,.0f}", f"{s['passes']:.2f}", ends))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    if mixture["exhaustion"] == "stop":
        then = f"the run stops near step {mixture['stop_step']:,}, before a source repeats" if mixture["stop_step"] is not None else "no source runs out within the run"
    else:
        then = "a source that runs out starts another pass"
    lines = [f"mixture    {len(mixture['sources'])} sources over {max_steps:,} steps, data.exhaustion={mixture['exhaustion']}: {then}"]
    lines += ["           " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    return lines + render_stages(mixture.get("stages") or [], [s["name"] for s in mixture["sources"]])


def render_stages(stages: list[dict], names: list[str]) -> list[str]:
    """Each data stage's steps and shares (the weight column above is data.sources')."""
    if not stages:
        return []
    rows = [("stage", "steps", *names)]
    for i, st in enumerate(stages):
        label = f"data.stages[{i}]" if st["given"] else "data.sources"
        rows.append((label, f"{st['from_step']:,}-{st['to_step']:,}", *(f"{100 * st['shares'][n]:.1f}%" for n in names)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [f"stages     {sum(st['given'] for st in stages)} data stage(s): the share of each source by step (drawn, passes and first pass above add them up)"]
    return lines + ["           " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
