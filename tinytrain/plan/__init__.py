"""The planning stage: validate the config, then decide every derived value once (hardware,
precision, vocab, layout and batch, attention, shape, memory, fast paths, DeepSpeed config,
where the run starts, preflight findings) into one frozen RunPlan. No weights, no Lightning."""
