"""The training module as an lm-eval model: log-likelihoods of lm-eval's requests from the weights
in memory, scored as lm-eval's own `hf` model scores an export (lm_eval/models/huggingface.py), so
inline scores equal lm_eval's on the exported checkpoint.

Imported only when eval.tasks is set (it subclasses lm-eval's TemplateLM at import).

Every rank runs lm-eval over all the requests (its rank 0 of 1: each makes the same requests), and
this class splits them over the data-parallel ranks itself: rank r of dp scores every dp-th one, the
tensor-parallel ranks of a group the same ones. ZeRO-3 and FSDP gather weights inside each forward,
so every rank runs the same number of forwards: the shards are padded with one-token batches to the
longest one, and the scores are gathered back to every rank in the requests' order.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from lm_eval import utils
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import _add_special_kwargs, has_bos_prefix


class TrainingModuleLM(TemplateLM):
    def __init__(self, module, tokenizer, *, true_vocab: int, max_length: int, batch_size: int, dp_rank: int, dp_size: int, forward_context=nullcontext):
        super().__init__()
        self.module = module
        self.tokenizer = tokenizer  # the served tokenizer: the export's, with its BOS decision
        self.true_vocab = true_vocab  # logits of the padded vocab rows are dropped, as the export has none
        self.max_length = max_length
        self.batch_size = batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.forward_context = forward_context
        self.forwards = 0  # this rank's forward passes, padding included (equal on every rank)

    # -- what lm-eval's hf model does with a tokenizer (HFLM with add_bos_token unset) ----------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        return self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.tokenizer.eos_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        special = _add_special_kwargs(add_special_tokens, None)
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        return self.tokenizer.encode(string, **special)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owners = [], []
        for i, (string,) in enumerate(req.args for req in requests):
            rolling = utils.get_rolling_token_windows(token_list=self.tok_encode(string), prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1)
            for window in map(utils.make_disjoint_window, rolling):
                windows.append(((None,) + window))
                owners.append(i)
        scores = self._loglikelihood_tokens(windows)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owners, scores):
            totals[i] += logprob
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError("inline scoring serves log-likelihood tasks; the plan refuses generation tasks (plan/evals.py)")

    # -- the scoring, split over the data-parallel ranks ------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None) -> list[tuple[float, bool]]:
        mine = list(range(self.dp_rank, len(requests), self.dp_size))
        mine.sort(key=lambda i: -len(requests[i][1]) - len(requests[i][2]))  # similar lengths share a batch
        batches = [mine[k : k + self.batch_size] for k in range(0, len(mine), self.batch_size)]
        scored = {}
        for batch in batches:
            scored.update(zip(batch, self.score_batch([requests[i] for i in batch])))
        for _ in range(self.most_batches(len(batches)) - len(batches)):
            self.forward(torch.tensor([[self.prefix_token_id]]))  # padding: the other ranks' gathers need this rank
        if torch.distributed.is_initialized():
            scored = gather_dicts(scored)
        return [scored[i] for i in range(len(requests))]

    def score_batch(self, rows) -> list[tuple[float, bool]]:
        """lm-eval's hf scoring: the input is context + continuation without its last token (cut to
        max_length from the left), right-padded; the continuation's log-probs are summed and it is
        greedy when every token is the argmax."""
        inputs = [torch.tensor((ctx + cont)[-(self.max_length + 1) :][:-1], dtype=torch.long) for _, ctx, cont in rows]
        longest = max(len(x) for x in inputs)
        padded = torch.stack([F.pad(x, (0, longest - len(x))) for x in inputs])  # causal: the padding after a row is never attended to
        logprobs = F.log_softmax(self.forward(padded).float(), dim=-1)
        out = []
        for i, ((_, _, cont), x) in enumerate(zip(rows, inputs)):
            cont_t = torch.tensor(cont, dtype=torch.long, device=logprobs.device)
            picked = logprobs[i, len(x) - len(cont) : len(x)]
            greedy = bool((picked.argmax(dim=-1) == cont_t).all())
            out.append((float(picked.gather(1, cont_t.unsqueeze(-1)).sum()), greedy))
        return out

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        device = next(self.module.parameters()).device
        with self.forward_context():
            logits = self.module(input_ids=input_ids.to(device))
        return logits[..., : self.true_vocab]

    def most_batches(self, n: int) -> int:
        if not torch.distributed.is_initialized():
            return n
        count = torch.tensor([n], device=next(self.module.parameters()).device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        return int(count.item())


def gather_dicts(part: dict) -> dict:
    parts = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(parts, part)
    return {k: v for p in parts for k, v in p.items()}


