"""Sample generations at each validation step: a few prompts (generate.sample_prompts), greedy, through
the run's chat template when it fine-tunes, appended to samples.jsonl (and a wandb table under
logger=wandb). A resumed run drops the rows of steps after its checkpoint (they are generated again). What a loss number cannot show: whether the model stops at the turn end, repeats
itself, or has learnt the format.

Rank 0 generates with the model it holds; under DeepSpeed and fsdp_tp that model is partitioned
(generating would need every rank), so there samples are skipped and the log says so once.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning.pytorch as pl

from tinytrain.checkpoint.export import served_tokenizer
from tinytrain.config.schema import DataFormat
from tinytrain.model.generation import Sampling, generate
from tinytrain.train.jsonl_rows import drop_after

log = logging.getLogger(__name__)


class SampleGenerations(pl.Callback):
    def __init__(self, path: Path, *, prompts: list[str], max_new_tokens: int, tokenizer, chat: bool, stop_ids: list[int], true_vocab: int, sharded: bool):
        self.path = path
        self.prompts = list(prompts)
        self.sampling = Sampling(max_new_tokens=max_new_tokens)
        self.tokenizer = tokenizer
        self.chat = chat
        self.stop_ids = stop_ids
        self.true_vocab = true_vocab
        self.sharded = sharded
        self.said_skipped = False
        self.table = None  # the wandb table, logged incrementally: each validation adds its own rows

    def on_train_start(self, trainer, pl_module):
        if trainer.is_global_zero and trainer.global_step:  # a resumed run: its later samples come again
            dropped = drop_after(self.path, trainer.global_step)
            if dropped:
                log.info("samples.jsonl: %d row(s) of steps after step %d dropped: those steps are trained again", dropped, trainer.global_step)

    def on_validation_end(self, trainer, pl_module):
        if not self.prompts or trainer.sanity_checking or not trainer.is_global_zero:
            return
        if self.sharded:
            if not self.said_skipped:
                log.info("samples: skipped under a sharded strategy (DeepSpeed, fsdp_tp); mode=generate on a checkpoint gives them")
                self.said_skipped = True
            return
        import torch

        # Eager under trainer.compile: each new length and cache state would recompile the blocks'
        # graph (dynamo's recompile limit is soon hit); the training step's graphs stay as they are.
        with torch.inference_mode(False), torch.no_grad(), torch.compiler.set_stance("force_eager"):
            results = generate(pl_module.model, self.tokenizer, self.prompts, chat=self.chat, sampling=self.sampling, stop_ids=self.stop_ids, true_vocab=self.true_vocab)
        step = trainer.global_step
        with self.path.open("a", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps({"step": step, **r}, ensure_ascii=False) + "\n")
        for logger in trainer.loggers:
            if hasattr(logger, "log_table"):  # WandbLogger
                self.log_to_wandb(logger, [[step, r["prompt"], r["completion"]] for r in results], step)

    def log_to_wandb(self, logger, rows: list[list], step: int) -> None:
        """One table for the run, logged incrementally: each validation sends its own rows (logging the
        whole table each time wrote every earlier row again, a quadratic total over a long run)."""
        import wandb

        if self.table is None:
            self.table = wandb.Table(columns=["step", "prompt", "completion"], log_mode="INCREMENTAL")
        for row in rows:
            self.table.add_data(*row)
        # Lightning logs optimizer step k as k - 1: the table sits in val_loss's row (as evals do).
        logger.log_metrics({"samples": self.table}, step=max(step - 1, 0))


def sample_callback(cfg, plan, run_dir: Path, tokenizer) -> list:
    """The callback for this run ([] when generate.sample_prompts is empty)."""
    g = cfg.generate
    if not g.sample_prompts:
        return []
    spec = plan.export  # the served model's template, stops and BOS
    served = served_tokenizer(tokenizer, spec)
    chat = DataFormat(cfg.data.format) != DataFormat.text if g.chat is None else bool(g.chat)
    stops = [served.convert_tokens_to_ids(t) for t in spec.turn_end]
    sharded = not plan.parallel.row.rank0_holds_model
    return [SampleGenerations(run_dir / "samples.jsonl", prompts=list(g.sample_prompts), max_new_tokens=g.sample_max_new_tokens, tokenizer=served, chat=chat, stop_ids=stops, true_vocab=plan.vocab.true, sharded=sharded)]
