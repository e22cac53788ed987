"""Shared set-up for the benchmarks: compose a config and resolve it the way `python -m tinytrain` does."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "tinytrain" / "conf"


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from tinytrain.config.resolvers import register_resolvers
    from tinytrain.config.schema import register_schemas

    register_resolvers()
    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def setup(overrides: list[str]):
    """(cfg, tokenizer, plan, model_config) for a run: tinytrain's own planning stage."""
    import tempfile

    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import model_config
    from tinytrain.plan.planner import make_plan
    from tinytrain.plan.validate import validate

    cfg = compose(overrides)
    validate(cfg)
    tokenizer = load_from_config(cfg.tokenizer)
    with tempfile.TemporaryDirectory() as run_dir:
        plan = make_plan(cfg, tokenizer, Path(run_dir))
    return cfg, tokenizer, plan, model_config(cfg.model, plan.vocab.padded, tokenizer)


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def synthetic_batches(n: int, vocab: int, micro: int, seq: int) -> list[dict]:
    """n batches' worth of random token rows (throughput does not depend on the text)."""
    import torch

    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, vocab, (n * micro, seq + 1), generator=g)
    return [{"input_ids": row[:-1], "labels": row[1:]} for row in data]


def packed_batches(n: int, vocab: int, micro: int, seq: int, mean_document: int = 512) -> list[dict]:
    """As synthetic_batches, with each row packed from several documents (lengths drawn around
    `mean_document`, the last one cut at the row's end): position ids restart per document and
    the label of a document's last token is masked, as tinytrain's packed windows are."""
    import torch

    g = torch.Generator().manual_seed(0)
    rows = []
    for row in synthetic_batches(n, vocab, micro, seq):
        lengths, left = [], seq
        while left > 0:
            lengths.append(min(left, int(torch.randint(mean_document // 4, 2 * mean_document, (1,), generator=g))))
            left -= lengths[-1]
        positions = torch.cat([torch.arange(length) for length in lengths])
        labels = row["labels"].clone()
        labels[torch.tensor(lengths).cumsum(0)[:-1] - 1] = -100  # no document predicts the next one's first token
        rows.append({**row, "labels": labels, "position_ids": positions})
    return rows


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def raw_inputs(model, batch: dict, device) -> dict:
    """The model's inputs as a raw loop would pass them: packed rows (position ids) go to a varlen
    kernel as one flattened row with their boundaries, as transformers' DataCollatorWithFlattening
    makes them; SDPA and eager take the position ids and mask across documents themselves."""
    if "position_ids" not in batch:
        return {"input_ids": batch["input_ids"].to(device), "use_cache": False}
    from tinytrain.model.packed_attention import flatten_for_flash, takes_boundaries

    input_ids, position_ids = batch["input_ids"].to(device), batch["position_ids"].to(device)
    if takes_boundaries(model):
        return {**flatten_for_flash(input_ids, position_ids, batch.get("cu_seq_lens"), batch.get("max_length")), "use_cache": False}
    return {"input_ids": input_ids, "position_ids": position_ids, "use_cache": False}


def raw_steps(model, optimizer, loader, true_vocab: int, grad_clip: float, warmup: int, autocast_dtype=None, scheduler=None, accumulation: int = 1) -> list[float]:
    """A raw PyTorch loop: forward, loss, backward (`accumulation` micro batches, each loss divided
    by it, nothing read back between them), clip, step; seconds per step after warm-up."""
    import time

    import torch

    from tinytrain.model.module import causal_lm_loss

    device = next(model.parameters()).device
    times, last = [], None
    for i, batch in enumerate(loader):
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model(**raw_inputs(model, batch, device)).logits
            loss = causal_lm_loss(logits, batch["labels"].to(device), true_vocab)
        (loss / accumulation).backward()
        if (i + 1) % accumulation:
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        now = time.perf_counter()
        if last is not None:
            times.append(now - last)
        last = now
    return times[warmup:]


def tinytrain_steps(cfg, tokenizer, plan, loader, warmup: int, extra_callbacks=(), watched: bool = False) -> list[float]:
    """The real tinytrain path (build_module + build_trainer) over `loader`; seconds per step.
    `watched`: with this rank's hang watchdog (its process, heartbeats) as `mode=train` runs it."""
    import tempfile
    import time

    import lightning.pytorch as pl
    import torch

    from tinytrain.train.fit import build_module
    from tinytrain.train.trainer import build_trainer, quiet_lightning

    class StepTimer(pl.Callback):
        def __init__(self):
            self.times, self.last, self.step = [], None, 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == self.step:  # inside a gradient accumulation: not a step's end
                return
            self.step = trainer.global_step
            _sync(pl_module.device)
            now = time.perf_counter()
            if self.last is not None:
                self.times.append(now - self.last)
            self.last = now

    quiet_lightning()
    torch.manual_seed(cfg.seed)
    module = build_module(cfg, plan, tokenizer)
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as run_dir:
        watch = None
        if watched:
            from tinytrain.cluster.watched_rank import WatchedRank

            watch = WatchedRank(Path(run_dir), 0, 1, plan.watchdog.limits())
        trainer = build_trainer(cfg, plan, Path(run_dir), extra_callbacks=[*extra_callbacks, timer], watched=watch).trainer
        trainer.fit(module, train_dataloaders=loader)
        if watch is not None:
            watch.finish()
    return timer.times[warmup:]
