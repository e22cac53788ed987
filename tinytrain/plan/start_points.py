"""Where a run starts: the checkpoint it continues from (`resume`) or the weights it starts from
(`checkpoint.init_from`), each checked against this run's plan before the model is built.

`resume`:

auto    the newest complete step checkpoint in `<run dir>/checkpoints` (a requeued job continues
        where it stopped), else a fresh start. Saves are atomic, so a file with a step name is
        complete; one that still does not load (a disk that filled up, a copy cut short) is
        skipped for the one before it, and the log says why. None loading is an error.
never   a fresh start; refused where the run directory already holds step checkpoints, because
        the new run's saves and pruning would mix with the old run's.
<path>  that checkpoint (an older one of this run, or another run's, continued here).

Lightning restores everything from it (weights, optimizer, scheduler, loss scale, loop counters)
plus tinytrain's callbacks: data position and RNG. Temp files of saves that were cut short are
removed by rank 0 of a training run (`resume.leftover_temp_files`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from tinytrain.checkpoint.files import step_checkpoints
from tinytrain.checkpoint.format import METADATA_VERSION, saved_layer_kinds, saved_shape, tinytrain_metadata
from tinytrain.checkpoint.resume import AUTO, NEVER, newest_loadable, read_state
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.families import family
from tinytrain.plan.layout_change import Layout, check_layout, converts, repads, saved_layout, weights_only
from tinytrain.plan.model_shape import ModelShape
from tinytrain.plan.vocab import VocabPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    step: int
    how: str  # "resume=auto" or "resume=<path>"
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # newer checkpoints that did not load, and why
    stage: str = "main"  # the trainer.stage that saved it (checkpoints from before stages: main)
    universal: str | None = None  # DeepSpeed on another dp size: the universal copy it resumes through (checkpoint/universal.py)
    saved_batch: tuple[int | None, int | None] = (None, None)  # its (micro batch, accumulation), where recorded
    saved_data_parallel: int | None = None  # its data-parallel size, where recorded (RunPlan.checkpoint_metadata)
    batch_change: str | None = None  # what this run's other batch layout does to the resume (batch_change_note)
    saved_numerics: dict | None = None  # its precision and fp8, where recorded (RunPlan.checkpoint_metadata)
    saved_finetune: dict | None = None  # its adapters (FinetunePlan.to_dict), None for full training
    numerics_change: str | None = None  # numerics_change_note
    saved_rate: dict | None = None  # {"schedule_step", "lr"}: the rate its next step would have taken, where recorded
    saved_metadata_version: int = METADATA_VERSION  # 0: an older tinytrain's, before it recorded its rate and version
    rate_change: str | None = None  # rate_change_note
    tokenizer_change: str | None = None  # saved under an older tinytrain's fingerprint of this tokenizer (tokenizer.earlier_fingerprints)

    def describe(self, run_dir: Path) -> str:
        shown = self.path.relative_to(run_dir) if self.path.is_relative_to(run_dir) else self.path
        return f"resuming from {shown} (step {self.step})"

    def to_dict(self) -> dict:
        return {"path": str(self.path), "step": self.step, "how": self.how, "stage": self.stage, "skipped": [f"{p.name}: {why}" for p, why in self.skipped], "universal": self.universal, "batch_change": self.batch_change, "numerics_change": self.numerics_change, "rate_change": self.rate_change, "tokenizer_change": self.tokenizer_change}


def saved_batch(ckpt: dict) -> tuple[int | None, int | None]:
    """(micro batch, gradient accumulation) a checkpoint was trained with, from its data position
    and train/callbacks/accumulation_change.py's record; None where it holds none."""
    callbacks = ckpt.get("callbacks") or {}
    position, accumulation = callbacks.get("DataPosition") or {}, callbacks.get("AccumulationChange") or {}
    micro = None if "ramp" in position else position.get("batch_size")  # a batch ramp's is not the micro batch
    return micro, accumulation.get("accumulate_grad_batches")


# What an adapter checkpoint's parameters and model depend on (dropout does not change either).
ADAPTER_KEYS = ("method", "rank", "alpha", "target_modules", "trainable_token_ids")


def finetune_change_problem(resume: ResumePoint | None, adapters) -> Problem | None:
    """A run resumes only under the adapters its checkpoint was trained with: another rank, targets
    or trainable rows died loading the state (size mismatch, missing keys, other parameter groups),
    another alpha silently made another model of the same weights. `adapters`: this run's
    FinetunePlan, or None (full training)."""
    if resume is None:
        return None
    saved, ours = resume.saved_finetune, adapters.to_dict() if adapters else None

    def described(f: dict | None) -> dict | None:
        return None if f is None else {k: sorted(f[k]) if isinstance(f[k], list) else f[k] for k in ADAPTER_KEYS}

    before, now = described(saved), described(ours)
    if before == now:
        return None
    if before is None or now is None:
        what = f"full training, this run finetune={now['method']}" if before is None else f"finetune={before['method']}, this run full training"
        why = f"was trained with {what}"
    else:
        why = "was trained with " + ", ".join(f"finetune.{k}={before[k]}" for k in ADAPTER_KEYS if before[k] != now[k]) + "; this run has " + ", ".join(f"{now[k]}" for k in ADAPTER_KEYS if before[k] != now[k])
    return Problem("resume", str(resume.path), f"{why}: its weights and optimizer state hold those adapters", "resume with the settings it was trained with (finetune.* in the run's config_resolved.yaml), or start a new run from its weights: run.name=<new> checkpoint.init_from=<this checkpoint>")


def numerics_change_note(resume: ResumePoint, precision: str, fp8: bool) -> str | None:
    """The precision or float8 a resumed run changes (None: the same, or not recorded). Allowed (a
    checkpoint holds full-precision weights and moments), but the loss may move at the change."""
    saved = resume.saved_numerics
    if not saved:
        return None
    on = {True: "on", False: "off"}
    changed = [f"{what} {old} -> {new}" for what, old, new in (("precision", saved["precision"], precision), ("fp8", on[saved["fp8"]], on[fp8])) if old != new]
    return f"{', '.join(changed)} since the checkpoint: the weights and optimizer state carry over; the loss may move at the change" if changed else None


def rate_change_note(resume: ResumePoint, schedule, lr: float) -> str | None:
    """The learning rate this run's schedule gives the resumed step, where it is not the one the
    checkpoint's run would have trained it at (another trainer.lr, max_steps, warm-up or decay in
    the same stage): the schedule is this run's, read at the checkpoint's position on it."""
    saved = resume.saved_rate
    if not saved:
        if resume.saved_metadata_version == 0 and resume.step > 0:  # said once, not silently skipped
            return f"the checkpoint was saved by an older tinytrain, before checkpoints recorded their rate: whether this run's schedule gives step {resume.step} another rate than the checkpoint's run would have is not checked"
        return None
    new = lr * schedule.multiplier(saved["schedule_step"])
    if abs(new - saved["lr"]) <= 1e-3 * max(abs(saved["lr"]), 1e-12):
        return None
    return (
        f"the rate at step {resume.step}: {saved['lr']:.3e} -> {new:.3e} since the checkpoint: the rate is this run's schedule (trainer.lr, max_steps, "
        "warm-up, decay) at the checkpoint's place on it, so it jumps there; the checkpoint's own settings continue without one"
    )


def batch_change_note(resume: ResumePoint, micro_batch: int, accumulation: int, grouped: bool, data_parallel: int = 1) -> str | None:
    """What a resume under another micro batch, accumulation or data-parallel size does (None: the
    same, or unknown). The schedule and Lightning's step count follow the optimizer step; the data
    position is kept in samples (data/sampler.py resized_position), except where length grouping
    cuts an epoch's batches by their size. A global batch that changes is said with its size."""
    micro, acc = resume.saved_batch
    dp = resume.saved_data_parallel
    given = (("micro batch", micro, micro_batch), ("accumulation", acc, accumulation), ("data parallel", dp, data_parallel))
    changed = [f"{what} {old} -> {new}" for what, old, new in given if old is not None and old != new]
    if not changed:
        return None
    if None not in (micro, acc, dp) and micro * acc * dp != micro_batch * accumulation * data_parallel:
        changed.append(f"so the global batch {micro * acc * dp} -> {micro_batch * accumulation * data_parallel} sequences per step")
    data = "its data restarts the epoch (data.group_by_length cuts an epoch's batches by their size)" if grouped and micro not in (None, micro_batch) else "its data continues at the checkpoint's sample"
    # trainer.val_batches counts micro batches: of another size they hold other sequences.
    validation = f"; validation reads trainer.val_batches micro batches of {micro_batch}, so val_loss is over other sequences from here" if micro not in (None, micro_batch) else ""
    return f"{', '.join(changed)} since the checkpoint: the schedule continues at step {resume.step}, {data}{validation}"


def checkpoint_metadata(vocab: VocabPlan, tokenizer_fingerprint: str, model_name: str, stage: str = "main") -> dict:
    """What every tinytrain checkpoint carries (under "tinytrain"), checked here when a run
    resumes from it or starts from its weights."""
    import tinytrain

    return {
        "metadata_version": METADATA_VERSION,
        "tinytrain_version": tinytrain.__version__,
        "true_vocab": vocab.true,
        "padded_vocab": vocab.padded,
        "vocab_multiple": vocab.multiple,
        "tp": vocab.tp,
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "model": model_name,
        "stage": stage,
    }


@dataclass(frozen=True)
class InitPoint:
    """checkpoint.init_from: weights (not optimizer state) from another run's checkpoint."""

    path: str
    saved: dict  # its tinytrain metadata: true_vocab, tp, tokenizer fingerprint, model
    tokenizer_change: str | None = None  # saved under an older tinytrain's fingerprint of this tokenizer

    def to_dict(self) -> dict:
        return {"path": self.path, **self.saved, "tokenizer_change": self.tokenizer_change}


def init_point(path: str | None, vocab: VocabPlan, fingerprint: str, allow_tokenizer_change: bool, shape: ModelShape | None = None, earlier: dict[str, str] | None = None) -> InitPoint | None:
    """`earlier`: the fingerprints older tinytrains recorded for this run's tokenizer, with what
    changed since (tokenizer.earlier_fingerprints): the same tokenizer, not another."""
    if not path:
        return None
    # read_state: a file, a sharded folder (shapes only) or a DeepSpeed folder (its client state).
    meta = check_compatible(read_state(Path(path), "checkpoint.init_from"), path, vocab, fingerprint, allow_tokenizer_change, shape, earlier)
    return InitPoint(path, meta, (earlier or {}).get(meta["tokenizer_fingerprint"]))


def resolve_resume(
    value: str,
    checkpoint_dir: Path,
    vocab: VocabPlan,
    fingerprint: str,
    model_name: str,
    shape: ModelShape | None = None,
    layout: Layout | None = None,
    earlier: dict[str, str] | None = None,
    *,
    parallel: str | None = None,
) -> ResumePoint | None:
    """Which checkpoint this run continues from (None: a fresh start). Raises ConfigError naming
    `resume`. `layout`: the run's; a checkpoint of another layout resumes or is refused (layout_change.py),
    naming `parallel` (the run's parallel option).
    `earlier`: older tinytrains' fingerprints of this run's tokenizer (as init_point's)."""
    existing = step_checkpoints(checkpoint_dir)
    if value == NEVER:
        if existing:
            raise ConfigError(
                Problem(
                    "resume",
                    value,
                    f"{checkpoint_dir} already holds checkpoints of an earlier run (newest {existing[0][1].name}); a fresh start there would mix the two runs",
                    "give the new run its own directory (run.name=<new> or hydra.run.dir=<new>), delete that folder, or continue it with resume=auto",
                )
            )
        return None
    if value == AUTO:
        found = newest_loadable(checkpoint_dir)
        if found is None:
            return None
        path, ckpt, skipped = found
        how = "resume=auto"
    else:
        path = Path(value).absolute()
        ckpt, skipped, how = read_state(path), [], f"resume={value}"
    meta = check_resumable(ckpt, str(path), vocab, fingerprint, model_name, shape, layout, earlier, given=None if value == AUTO else value, parallel=parallel)
    step = int(ckpt["global_step"])
    unreadable = {p for p, _ in skipped}
    newer = [p.name for s, p in existing if s > step and p != path and p not in unreadable]
    if newer:
        raise ConfigError(
            Problem(
                "resume",
                value,
                f"continues from step {step}, but {checkpoint_dir} holds later checkpoints ({', '.join(sorted(newer))}) that this run's saves would mix with",
                "move those checkpoints away (or delete them), or continue in a new directory: run.name=<new>",
            )
        )
    universal = None
    if layout is not None and converts(saved_layout(path, ckpt), layout):
        from tinytrain.checkpoint.files import universal_path

        universal = str(universal_path(path))
    return ResumePoint(path, step, how, skipped, meta.get("stage", "main"), universal, saved_batch=saved_batch(ckpt), saved_data_parallel=(meta.get("batch") or {}).get("data_parallel"), saved_numerics=meta.get("numerics"), saved_rate=meta.get("rate"), saved_finetune=meta.get("finetune"), saved_metadata_version=meta.get("metadata_version", 0), tokenizer_change=(earlier or {}).get(meta["tokenizer_fingerprint"]))


def other_tokenizer(meta: dict, fingerprint: str, vocab: VocabPlan) -> str:
    return f"saved with another tokenizer (fingerprint {meta['tokenizer_fingerprint']}, {meta['true_vocab']} tokens) than this run's (fingerprint {fingerprint}, {vocab.true} tokens)"


def check_shape(ckpt: dict, path: str, key: str, shape: ModelShape | None) -> None:
    """A checkpoint of another model size would fail deep inside load_state_dict ("size mismatch"):
    compare the sizes while planning."""
    if shape is None or not isinstance(ckpt.get("state_dict"), dict):
        return
    if ckpt["state_dict"] and not any(k.endswith("embed_tokens.weight") for k in ckpt["state_dict"]):
        # Not a whole model's weights: it failed as a KeyError once training had started.
        raise ConfigError(Problem(key, path, "holds no embedding table (embed_tokens.weight) among its weights: not a whole model", "use a checkpoint saved by tinytrain (a step or final checkpoint of a run)"))
    ours = {"num_layers": shape.layers, "hidden_size": shape.hidden, "intermediate_size": shape.intermediate, "key/value width (num_kv_heads x head dim)": shape.kv_heads * shape.head_dim}
    saved = saved_shape(ckpt["state_dict"])
    differ = [name for name in saved if saved[name] != ours[name]]
    if differ:
        theirs = ", ".join(f"{n} {saved[n]}" for n in differ)
        this = ", ".join(f"{n} {ours[n]}" for n in differ)
        raise ConfigError(
            Problem(key, path, f"holds another model size: {theirs} (this run's model: {this})", "use the model settings it was trained with (model= and the model.* overrides in its run's config_resolved.yaml), or another checkpoint")
        )
    check_layer_kinds(ckpt["state_dict"], path, key, shape)


def check_layer_kinds(state_dict: dict, path: str, key: str, shape: ModelShape) -> None:
    """A checkpoint of another model family of the same sizes (a llama run's weights for
    model.arch=qwen3: no q/k norms) failed in load_state_dict with missing keys, after the plan."""
    saved = saved_layer_kinds(state_dict)
    ours = {"qkv_bias": shape.qkv_bias, "qk_norm": shape.qk_norm, "norms_per_layer": shape.norms_per_layer, "projections": sorted(family(shape.arch).projections)}
    what = {"qkv_bias": "q/k/v biases", "qk_norm": "q/k head norms", "norms_per_layer": "norms per layer", "projections": "projections"}
    differ = [name for name in saved if saved[name] != ours[name]]
    if differ:
        said = lambda kinds: ", ".join(f"{what[n]} {kinds[n] if not isinstance(kinds[n], bool) else 'yes' if kinds[n] else 'none'}" for n in differ)  # noqa: E731
        raise ConfigError(
            Problem(key, path, f"holds another model family's layers: {said(saved)} (this run's model.arch={shape.arch.value}: {said(ours)})", "use the model.arch (and model.attention_bias) it was trained with, as its run's config_resolved.yaml says, or another checkpoint")
        )


def same_tokenizer(meta: dict, fingerprint: str, earlier: dict[str, str] | None) -> bool:
    return meta["tokenizer_fingerprint"] == fingerprint or meta["tokenizer_fingerprint"] in (earlier or {})


def check_compatible(ckpt: dict, path: str, vocab: VocabPlan, fingerprint: str, allow_tokenizer_change: bool, shape: ModelShape | None = None, earlier: dict[str, str] | None = None) -> dict:
    """Weights for a new run (checkpoint.init_from): any tp, and another tokenizer when allowed."""
    meta = tinytrain_metadata(ckpt, path, "checkpoint.init_from")
    check_shape(ckpt, path, "checkpoint.init_from", shape)
    if not same_tokenizer(meta, fingerprint, earlier) and not allow_tokenizer_change:
        raise ConfigError(
            Problem(
                "checkpoint.init_from",
                path,
                other_tokenizer(meta, fingerprint, vocab),
                "use the checkpoint's tokenizer, or set checkpoint.allow_tokenizer_change=true to keep rows by id and mean-initialise new ones",
            )
        )
    return meta


def check_resumable(
    ckpt: dict,
    path: str,
    vocab: VocabPlan,
    fingerprint: str,
    model_name: str,
    shape: ModelShape | None = None,
    layout: Layout | None = None,
    earlier: dict[str, str] | None = None,
    *,
    given: str | None = None,
    parallel: str | None = None,
) -> dict:
    """A run continuing from its checkpoint (`resume`): optimizer state included, so the same
    tokenizer and model, a layout it can load under (layout_change.py), and the same padded vocab
    unless that change re-pads the vocab rows of the weights and moments. `given`: resume=<path> as
    the user wrote it (None under resume=auto); `parallel`: the run's parallel option."""
    meta = tinytrain_metadata(ckpt, path, "resume")
    fresh = weights_only(path, given)
    if not same_tokenizer(meta, fingerprint, earlier):
        raise ConfigError(Problem("resume", path, other_tokenizer(meta, fingerprint, vocab), f"resume with the tokenizer it was trained with, {fresh} (checkpoint.allow_tokenizer_change=true for another tokenizer)"))
    if meta["model"] != model_name:
        raise ConfigError(Problem("resume", path, f"saved by model={meta['model']}, this run is model={model_name}", f"give a different run its own directory (run.name=<new>), {fresh}"))
    check_shape(ckpt, path, "resume", shape)
    saved = check_layout(Path(path), ckpt, layout, resume=given, parallel=parallel) if layout is not None else None
    if meta["padded_vocab"] != vocab.padded and not (saved is not None and repads(saved, layout)):
        raise ConfigError(
            Problem(
                "resume",
                path,
                f"saved with vocab padded to {meta['padded_vocab']} (multiple {meta['vocab_multiple']} x tp {meta['tp']}); this run pads to {vocab.padded} (multiple {vocab.multiple} x tp {vocab.tp}), and the optimizer state cannot be re-padded",
                f"resume with the same parallel.tp and model.vocab_multiple, {fresh}",
            )
        )
    return meta
