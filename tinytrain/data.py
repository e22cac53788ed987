"""Data for the foundation slice: documents -> token stream -> fixed windows.

Documents are tokenized in fast-tokenizer batches, each followed by EOS, and concatenated.
Windows of seq_len tokens carry labels already shifted by one (labels[t] is the token after
input_ids[t]), so the loss needs no shift. The split into train and validation is by
document, seeded, so no document is in both.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from tinytrain.config.schema import DataSource
from tinytrain.corpus import pydoc_documents
from tinytrain.errors import ConfigError, Problem

log = logging.getLogger(__name__)


def load_documents(data_cfg) -> list[str]:
    if data_cfg.source == DataSource.pydoc:
        return pydoc_documents()
    path = Path(data_cfg.path)
    files = sorted(path.glob("*.txt")) if path.is_dir() else [path]
    docs: list[str] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(Problem("data.path", str(f), f"not UTF-8 text (byte {e.start})", "convert the file to UTF-8")) from e
        if path.is_dir():
            docs.append(text)
        else:
            docs += [block.strip() for block in text.split("\n\n")]
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise ConfigError(Problem("data.path", str(path), "holds no text", "point data.path at a non-empty text file"))
    return docs


def split_documents(docs: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(docs) * val_fraction))
    val_ids = set(order[:n_val])
    return [d for i, d in enumerate(docs) if i not in val_ids], [d for i, d in enumerate(docs) if i in val_ids]


def tokenize_stream(docs: list[str], tokenizer, batch_size: int = 256) -> torch.Tensor:
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for start in range(0, len(docs), batch_size):
        for doc_ids in tokenizer(docs[start : start + batch_size], add_special_tokens=False)["input_ids"]:
            ids.extend(doc_ids)
            ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


class TokenWindows(Dataset):
    """Non-overlapping windows of seq_len inputs over a token stream, labels shifted by one."""

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        self.tokens = tokens
        self.seq_len = seq_len
        self.n = (len(tokens) - 1) // seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        chunk = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1]
        return {"input_ids": chunk[:-1], "labels": chunk[1:]}


def check_token_ids(tokens: torch.Tensor, true_vocab: int, where: str) -> None:
    """Every token id must index a real (unpadded) embedding row."""
    top = int(tokens.max())
    if top >= true_vocab:
        raise ConfigError(Problem("data", where, f"token id {top} >= len(tokenizer) {true_vocab}", "re-tokenize the data with this run's tokenizer"))


class TokenDataModule:
    """Builds train/val windows once and hands out loaders (a LightningDataModule subclass is
    created lazily in `as_lightning` so this module imports without Lightning)."""

    def __init__(self, data_cfg, tokenizer, micro_batch_size: int, seed: int, true_vocab: int):
        docs = load_documents(data_cfg)
        train_docs, val_docs = split_documents(docs, data_cfg.val_fraction, seed)
        train_tokens = tokenize_stream(train_docs, tokenizer)
        val_tokens = tokenize_stream(val_docs, tokenizer)
        check_token_ids(train_tokens, true_vocab, "train")
        self.train = TokenWindows(train_tokens, data_cfg.seq_len)
        self.val = TokenWindows(val_tokens, data_cfg.seq_len)
        if len(self.train) == 0 or len(self.val) == 0:
            raise ConfigError(
                Problem("data.seq_len", data_cfg.seq_len, f"longer than the data ({len(train_tokens)} train / {len(val_tokens)} validation tokens)", "use a shorter data.seq_len or more data")
            )
        self.micro_batch_size = micro_batch_size
        self.num_workers = data_cfg.num_workers
        self.seed = seed
        log.info("data: %d documents -> %d train tokens (%d windows of %d), %d validation tokens", len(docs), len(train_tokens), len(self.train), data_cfg.seq_len, len(val_tokens))

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.train, batch_size=self.micro_batch_size, shuffle=True, drop_last=True, generator=g, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.micro_batch_size, shuffle=False, drop_last=False, num_workers=self.num_workers)
