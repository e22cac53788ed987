"""Tells the hang watchdog (cluster/watchdog.py) what this rank is doing: a beat per training
batch and per validation batch, and the phase whose limit applies (the first step, validation,
inline evals and checkpoint saves are allowed longer than a step). Inline evals declare their phase
themselves (callbacks/evals.py): Lightning has no hook around them."""

from __future__ import annotations

import lightning.pytorch as pl


class Heartbeat(pl.Callback):
    def __init__(self, watched, compiling: bool):
        self.watched = watched  # cluster.watched_rank.WatchedRank
        self.first = "compile" if compiling else "first_step"
        self.stepped = False

    def setup(self, trainer, pl_module, stage):
        self.watched.beat(phase="startup")  # rendezvous done; op builds and the model's setup follow

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.watched.beat(trainer.global_step + 1, "train" if self.stepped else self.first)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.stepped = True
        self.watched.beat(trainer.global_step)

    def on_validation_start(self, trainer, pl_module):
        self.watched.beat(phase="validation")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.watched.beat()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        # Called as the save starts; the next batch's beat ends the phase.
        self.watched.beat(phase="checkpoint")
