"""What is on disk: tinytrain's checkpoint files (names, atomic rename, pruning), their contents
(vocab rows, metadata), loading without running pickled code, resume housekeeping, the run
directory's lock, pretrained Hugging Face folders and the HF export."""
