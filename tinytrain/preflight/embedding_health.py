"""Untrained embedding rows (the Yi-6B case) and their fix.

A special or added token whose input-embedding or lm_head row is far smaller than the rest was
never trained: in fp16 such rows drive the loss scale to its floor. Detected by comparing each
row's norm with the median row norm; fixed by rewriting the row with the mean of the trained
rows (plus, for `noisy_mean`, small noise), logged row by row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

# A row is untrained when its norm is below this fraction of the median row norm.
RELATIVE_NORM_THRESHOLD = 0.1


@dataclass(frozen=True)
class UntrainedRow:
    token_id: int
    token: str
    table: str  # "input embeddings" | "lm_head"
    norm: float
    median: float

    def describe(self) -> str:
        return f"{self.token!r} (id {self.token_id}) {self.table} row norm {self.norm:.2e} vs median {self.median:.2e}"


def candidate_token_ids(tokenizer, added_tokens) -> dict[int, str]:
    """Special tokens, added tokens and the tokens a chat template uses. The pad token is left
    out: it is never a target, and transformers initialises its row to zero on purpose."""
    ids = {tid: tok for tok, tid in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids) if tok != tokenizer.pad_token or tok == tokenizer.eos_token}
    for tok in added_tokens:
        ids[tokenizer.convert_tokens_to_ids(tok)] = tok
    return {tid: tok for tid, tok in ids.items() if tid is not None and tid >= 0}


def find_untrained(tables: dict[str, torch.Tensor], candidates: dict[int, str], true_vocab: int) -> list[UntrainedRow]:
    found = []
    for name, weight in tables.items():
        norms = weight[:true_vocab].float().norm(dim=1)
        median = float(norms.median())
        for tid, tok in sorted(candidates.items()):
            if tid < true_vocab and float(norms[tid]) < RELATIVE_NORM_THRESHOLD * median:
                found.append(UntrainedRow(tid, tok, name, float(norms[tid]), median))
    return found


def vocab_tables(model) -> dict[str, torch.Tensor]:
    tables = {"input embeddings": model.get_input_embeddings().weight}
    out = model.get_output_embeddings()
    if out is not None and out.weight is not tables["input embeddings"]:
        tables["lm_head"] = out.weight
    return tables


@torch.no_grad()
def fix_rows(tables: dict[str, torch.Tensor], rows: list[UntrainedRow], *, true_vocab: int, noisy: bool, seed: int = 0) -> None:
    """Rewrite each untrained row with the mean of the other real rows (+ noise of 1/10 their std)."""
    g = torch.Generator().manual_seed(seed)
    bad = {(r.table, r.token_id) for r in rows}
    for name, weight in tables.items():
        ids = sorted(tid for table, tid in bad if table == name)
        if not ids:
            continue
        keep = torch.ones(true_vocab, dtype=torch.bool)
        keep[ids] = False
        trained = weight[:true_vocab][keep].float()
        mean, std = trained.mean(0), trained.std(0)
        for tid in ids:
            row = mean + (0.1 * std * torch.randn(mean.shape, generator=g) if noisy else 0)
            weight[tid] = row.to(weight.dtype)
            log.warning("rewrote %s row of %r (id %d) with the %s of the trained rows", name, next(r.token for r in rows if r.token_id == tid), tid, "noisy mean" if noisy else "mean")


@torch.no_grad()
def reinit_rows(tables: dict[str, torch.Tensor], *, true_vocab: int, noisy: bool, seed: int = 0) -> None:
    """Every token's row rewritten with the mean of the table's rows (+ noise of 1/10 their std), as
    an added token's: the model was trained with another tokenizer, so row i belongs to another
    token than id i (model.tokenizer_change=allow)."""
    g = torch.Generator().manual_seed(seed)
    for name, weight in tables.items():
        rows = weight[:true_vocab].float()
        mean, std = rows.mean(0), rows.std(0)
        new = mean.expand_as(rows) + (0.1 * std * torch.randn(rows.shape, generator=g) if noisy else 0)
        weight[:true_vocab] = new.to(weight.dtype)
        log.warning("re-initialised all %d %s rows with the %s of the pretrained rows (model.tokenizer_change=allow)", true_vocab, name, "noisy mean" if noisy else "mean")
