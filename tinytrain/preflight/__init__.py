"""Checks that stop known-bad runs before any step: special tokens, pretrained vocab and
positions, untrained embedding rows (and their fix), fp16 risks, token ids in the data."""
