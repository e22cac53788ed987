"""Data: sources -> (pretraining) token store + packed windows, or (SFT) templated, masked samples
-> collation -> resumable sampler -> loaders. One concern per module; see datamodule.py for the flow.

Kept free of imports: tokenize_worker.py runs in spawned processes that should start quickly.
"""
