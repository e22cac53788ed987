"""Preflight: checks that stop known-bad runs before any step (and in mode=plan).

Each check has a name, a severity and a switch: `preflight.<name>=error|warn|off`. Errors are
collected and raised together; warnings are printed with the plan and kept in plan.json.
Checks that need weights (untrained embedding rows) run on a pretrained folder or checkpoint's
vocab tables only; a model trained from scratch has no untrained rows to find.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from tinytrain.checkpoint.pretrained import pretrained_tables
from tinytrain.config.schema import DataFormat
from tinytrain.errors import ConfigError, Problem
from tinytrain.preflight import rope
from tinytrain.preflight.embedding_health import (
    UntrainedRow,
    candidate_token_ids,
    find_untrained,
)

log = logging.getLogger(__name__)

# Models whose fp16 training is known to diverge without packing (TinyLlama: NaN grad_norm).
FP16_FRAGILE = ("tinyllama",)


@dataclass(frozen=True)
class Finding:
    check: str
    severity: str  # "error" | "warn"
    key: str
    value: object
    message: str
    fix: str

    def render(self) -> str:
        return f"[{self.check}] {self.key}={self.value!r}: {self.message}. Fix: {self.fix}"


def _level(cfg, check: str) -> str:
    return getattr(cfg.preflight, check).value


def finding(cfg, check: str, key: str, value, message: str, fix: str) -> Finding | None:
    level = _level(cfg, check)
    if level == "off":
        return None
    return Finding(check, level, key, value, message, f"{fix} (or relax with preflight.{check}=warn|off)")


def special_token_findings(cfg, tokenizer, rows: int) -> list[Finding]:
    out = []
    for name, tid in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids):
        if tid is None or not 0 <= tid < rows:
            out.append(finding(cfg, "special_tokens", "tokenizer.path", str(cfg.tokenizer.path), f"special token {name!r} has id {tid}, outside the {rows} embedding rows", "use a tokenizer whose special tokens are in its vocabulary"))
    return [f for f in out if f]


def pretrained_findings(cfg, tokenizer, *, saved: int, weight_rows: int | None) -> list[Finding]:
    """A pretrained model's config vocab (`saved`, from its config.json) vs its weight shapes vs
    the tokenizer; positions vs seq_len."""
    out = []
    n = len(tokenizer)
    path = cfg.model.pretrained
    if weight_rows is not None and weight_rows != saved:
        out.append(finding(cfg, "pretrained_vocab", "model.pretrained", path, f"config.json says vocab_size {saved} but the embedding has {weight_rows} rows", "re-export the model so config and weights agree"))
    rows = weight_rows or saved
    if rows < n:
        log.info("pretrained embedding has %d rows for %d tokens: %d new rows will be mean-initialised", rows, n, n - rows)
    return [f for f in out if f]


def hf_rope_scaling(hf_config) -> dict | None:
    """A transformers config's RoPE scaling in model.rope_scaling's form (None: plain RoPE)."""
    rope = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    rope = dict(rope.get("full_attention", rope))  # Gemma-3: per layer kind; the global layers' reach furthest
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    rope.pop("rope_theta", None)
    return None if rope_type == "default" else {"rope_type": rope_type, **rope}


def positions_reached(cfg, hf_config=None) -> int:
    """The positions the model covers, as position_findings reads them (with the scaling)."""
    m = cfg.model
    if hf_config is None:
        return rope.reach(m.max_position_embeddings, dict(m.rope_scaling) if m.rope_scaling else None)
    scaling = m.rope_scaling or hf_rope_scaling(hf_config)
    return rope.reach(hf_config.max_position_embeddings, dict(scaling) if scaling else None)


def positions_scaled(cfg, hf_config=None) -> bool:
    """Whether positions_reached counts a RoPE scaling (model.rope_scaling or the pretrained model's)."""
    return bool(cfg.model.rope_scaling or (hf_config is not None and hf_rope_scaling(hf_config)))


def position_findings(cfg, hf_config=None) -> list[Finding]:
    """data.seq_len against the positions the model covers (with model.rope_scaling, or a pretrained
    model's own scaling), and the scaling against the context a pretrained model was trained at."""
    m = cfg.model
    if hf_config is None:
        problems = rope.position_problems(cfg.data.seq_len, max_positions=m.max_position_embeddings, scaling=m.rope_scaling, trained_context=None, source="model.max_position_embeddings")
    else:
        own = hf_rope_scaling(hf_config)
        max_pos = hf_config.max_position_embeddings
        trained = own.get("original_max_position_embeddings", max_pos) if own else max_pos
        scaling = m.rope_scaling or own
        problems = rope.position_problems(cfg.data.seq_len, max_positions=max_pos, scaling=scaling, trained_context=trained if m.rope_scaling else None, source="the pretrained model's max_position_embeddings")
    out = [finding(cfg, "positions", p.key, p.value, p.message, p.fix) for p in problems]
    return [f for f in out if f]


def untrained_findings(cfg, rows, used_ids: set[int]) -> tuple[list[Finding], str]:
    """Findings for untrained rows and the fix policy to apply ('mean', 'noisy_mean' or '')."""
    if not rows:
        return [], ""
    policy = cfg.model.untrained_tokens.value
    if policy == "auto":
        policy = "mean" if any(r.token_id in used_ids for r in rows) else "warn"
    listing = "; ".join(r.describe() for r in rows)
    if policy in ("mean", "noisy_mean"):
        log.warning("untrained embedding rows found, fixing with model.untrained_tokens=%s: %s", policy, listing)
        return [], policy
    f = finding(
        cfg,
        "untrained_embeddings",
        "model.untrained_tokens",
        policy,
        f"untrained rows for tokens the run uses or may emit: {listing}",
        "set model.untrained_tokens=mean (rewrite them with the mean of trained rows) before fine-tuning",
    )
    if f and policy == "error":
        f = Finding(f.check, "error", f.key, f.value, f.message, f.fix)
    return ([f] if f else []), ""


def packs(data_cfg) -> bool:
    """Pretraining always packs documents into rows; SFT packs when data.pack=true."""
    return data_cfg.format == DataFormat.text or data_cfg.pack


def precision_findings(cfg, fp16: bool, unfixed_untrained: list, packed: bool) -> list[Finding]:
    if not fp16:
        return []
    out = []
    if unfixed_untrained:
        tokens = ", ".join(repr(r.token) for r in unfixed_untrained)
        out.append(finding(cfg, "precision_risk", "precision", "fp16", f"fp16 with untrained embedding rows ({tokens}) drives the loss scale to its minimum (the Yi-6B failure)", "set model.untrained_tokens=mean, or train in bf16 on a GPU with compute capability >= 8.0, or fp32"))
    name = cfg.model.name.lower()
    if any(m in name for m in FP16_FRAGILE) and not packed:
        f = finding(cfg, "precision_risk", "precision", "fp16", f"model={cfg.model.name} is known to give NaN grad_norm in fp16 without packing", "pack the data (data.pack=true), or use bf16 / fp32")
        out.append(f and Finding(f.check, "warn", f.key, f.value, f.message, f.fix))
    return [f for f in out if f]


def data_findings(cfg, stores, true_vocab: int) -> list[Finding]:
    """Every token id in the data must index a real embedding row (a store from another
    tokenizer is refused earlier, by fingerprint)."""
    out = []
    for store in stores:
        top = store.max_token_id()
        if top >= true_vocab:
            out.append(finding(cfg, "data_vocab", "data", str(store.path), f"token id {top} in the data is not below len(tokenizer) {true_vocab}", "rebuild the token store with this run's tokenizer (mode=prepare)"))
    return [f for f in out if f]


def memory_findings(cfg, memory, gpu_name: str, fix: str) -> list[Finding]:
    """The plan's per-GPU estimate against the GPU's memory (`memory`: plan/memory.py MemoryPlan;
    `fix`: the levers left, plan/memory.py levers_fix): a run that does not fit would spend its
    start on building and loading the model, then die of an out-of-memory error in its first step."""
    if memory.fits is not False:
        return []
    message = f"the plan's estimate is {memory.total_gib:.1f} GiB per GPU, {memory.total_gib / memory.gpu_memory_gib:.2f}x the {memory.gpu_memory_gib:.1f} GiB of the {gpu_name}: the first step would run out of memory"
    if memory.states_overflow:  # no shorter sequence or smaller micro batch helps
        message += f"; the model states alone take {memory.params_gib + memory.grads_gib + memory.optimizer_gib + memory.reference_gib:.1f} GiB, at any data.seq_len"
    found = finding(cfg, "memory", "parallel", cfg.parallel.name, message, fix)
    return [found] if found else []


def report(findings: list[Finding]) -> list[dict]:
    """Raise one error for all error findings; log the warnings; return all for plan.json."""
    errors = [f for f in findings if f.severity == "error"]
    for f in findings:
        if f.severity == "warn":
            log.warning("preflight: %s", f.render())
    if errors:
        raise ConfigError([Problem(f.key, f.value, f"[preflight {f.check}] {f.message}", f.fix) for f in errors])
    return [asdict(f) for f in findings]


@dataclass(frozen=True)
class PreflightReport:
    """What the planning-time checks found (as plan.json shows them), the untrained rows found in
    pretrained weights and the fix chosen for them ("mean", "noisy_mean", or "": left alone)."""

    findings: list[dict] = field(default_factory=list)
    untrained: list[UntrainedRow] = field(default_factory=list)
    fix: str = ""

    @property
    def rows_to_fix(self) -> list[UntrainedRow]:
        return self.untrained if self.fix else []

    @property
    def unfixed_rows(self) -> list[UntrainedRow]:
        """Rows left as they are: the loss-scale guard names them if fp16 collapses."""
        return [] if self.fix else self.untrained

    def to_dict(self) -> dict:
        return {"findings": self.findings, "untrained_rows": [r.describe() for r in self.untrained], "fix": self.fix or None}


def run(cfg, tokenizer, *, padded_vocab: int, fp16: bool, pretrained_config=None) -> PreflightReport:
    """Every planning-time check (raises one ConfigError for all errors). `pretrained_config`: the
    transformers config of model.pretrained, whose vocab and positions are checked against the
    weights, the tokenizer and data.seq_len. The data's own check runs once it is built
    (`data_findings`)."""
    findings = special_token_findings(cfg, tokenizer, padded_vocab)
    tables = {}
    if cfg.model.pretrained:
        tables = pretrained_tables(cfg.model.pretrained)
        rows = tables["input embeddings"].shape[0] if "input embeddings" in tables else None
        findings += pretrained_findings(cfg, tokenizer, saved=pretrained_config.vocab_size, weight_rows=rows)
    findings += position_findings(cfg, pretrained_config)
    untrained, fix = [], ""
    if tables:
        candidates = candidate_token_ids(tokenizer, cfg.tokenizer.add_special_tokens)
        untrained = find_untrained(tables, candidates, min(len(tokenizer), min(t.shape[0] for t in tables.values())))
        used = {tokenizer.convert_tokens_to_ids(t) for t in cfg.tokenizer.add_special_tokens} | {tokenizer.eos_token_id}
        found, fix = untrained_findings(cfg, untrained, used)
        findings += found
    report_so_far = PreflightReport(untrained=untrained, fix=fix)
    findings += precision_findings(cfg, fp16, report_so_far.unfixed_rows, packed=packs(cfg.data))
    return PreflightReport(report(findings), untrained, fix)
