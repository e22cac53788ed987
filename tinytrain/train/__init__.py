"""Build and fit: the Lightning Trainer, strategies (DDP, DeepSpeed, FSDP2 x TP), atomic
checkpoint writes, metrics.csv and wandb, the callbacks (guards, preemption, throughput,
data position, RNG state, step checkpoints), and the end of a run (final save, export, plot)."""
