"""Text generation from a trained model: `mode=generate` and the samples written at each
validation step (callbacks/samples.py) both call `generate()`.

A prompt goes through the run's chat template when the run fine-tuned (generate.chat=null), as a
served export would render it; generation stops at the run's turn-end tokens (EOS, `<|im_end|>`).
During training the tables are padded: logits of the padding rows are masked, never sampled.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from tinytrain.errors import ConfigError, Problem
from tinytrain.preflight.rope import reach

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 0.8
    top_p: float = 0.95


def read_prompts(prompts, prompts_file: str | None) -> list[str]:
    """generate.prompts plus generate.prompts_file (a line each, or JSON Lines with "prompt")."""
    found = [str(p) for p in prompts]
    if prompts_file:
        path = Path(prompts_file)
        if not path.is_file():
            raise ConfigError(Problem("generate.prompts_file", prompts_file, "no such file", "give a text file with one prompt per line, or JSON Lines with a \"prompt\" field"))
        for n, line in enumerate(prompt_file_text(path, prompts_file).splitlines(), 1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                try:
                    found.append(str(json.loads(line)["prompt"]))
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ConfigError(Problem("generate.prompts_file", prompts_file, f"line {n} is not JSON with a \"prompt\" field ({e})", "write one {\"prompt\": ...} object per line, or use a .txt file")) from e
            else:
                found.append(line)
    if not found:
        raise ConfigError(Problem("generate.prompts", [], "no prompts to generate from", "add 'generate.prompts=[\"Once upon a time\"]' or generate.prompts_file=<file>"))
    return found


def prompt_file_text(path: Path, value: str) -> str:
    """The prompts file as text; a binary or non-UTF-8 file named with the line that is not text."""
    key = "generate.prompts_file"
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(Problem(key, value, f"cannot be read ({e.strerror or e})", "give a readable text file with one prompt per line")) from e
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise ConfigError(Problem(key, value, f"is binary (a NUL byte on line {line}), not text", "give a UTF-8 text file with one prompt per line, or JSON Lines with a \"prompt\" field"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(Problem(key, value, f"line {line} is not UTF-8 ({e.reason} at byte {e.start})", "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)")) from e


def prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    """The prompt's ids: rendered by the tokenizer's chat template with the generation prompt, or
    plain text with BOS when the tokenizer adds it (export.served_tokenizer sets both up)."""
    if chat:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


class _MaskPadding:
    """A logits processor: padding rows (ids >= true vocab) can never be generated."""

    def __init__(self, true_vocab: int):
        self.true_vocab = true_vocab

    def __call__(self, input_ids, scores):
        scores[:, self.true_vocab :] = float("-inf")
        return scores


def positions_of(config) -> int | None:
    """The positions a model covers, its RoPE scaling included (preflight/rope.py reach: Qwen2.5
    adds YaRN x4 without raising max_position_embeddings); Gemma-3 scales its global layers'."""
    positions = getattr(config, "max_position_embeddings", None)
    scaling = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict) and isinstance(scaling.get("full_attention"), dict):
        scaling = scaling["full_attention"]
    if not isinstance(scaling, dict) or scaling.get("rope_type", "default") == "default":
        scaling = None
    return reach(positions, scaling) if positions else None


def within_positions(config, prompt_tokens: int, asked: int) -> int:
    """The new tokens a prompt leaves room for in the model's positions: past them transformers
    only warns, and an unbounded generate.max_new_tokens generated until it was killed."""
    positions = positions_of(config)
    if not positions or prompt_tokens + asked <= positions:
        return asked
    room = max(positions - prompt_tokens, 0)
    log.warning("generate: %d new tokens asked after a %d-token prompt, and the model has %d positions: %d generated", asked, prompt_tokens, positions, room)
    return room


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], *, chat: bool, sampling: Sampling, stop_ids: list[int], true_vocab: int | None = None, seed: int = 0) -> list[dict]:
    """One {prompt, completion, tokens, stopped} per prompt; `stopped`: ended at a turn-end token."""
    from transformers import LogitsProcessorList

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # sampled generations are reproducible and leave training's RNG alone
    processors = LogitsProcessorList([_MaskPadding(true_vocab)]) if true_vocab is not None and model.config.vocab_size > true_vocab else None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    results = []
    try:
        for prompt in prompts:
            ids = torch.tensor([prompt_ids(tokenizer, prompt, chat)], device=device)
            extra = {"temperature": sampling.temperature, "top_p": sampling.top_p} if sampling.do_sample else {}
            new_tokens = within_positions(model.config, ids.shape[1], sampling.max_new_tokens)
            if new_tokens < 1:
                results.append({"prompt": prompt, "completion": "", "tokens": 0, "stopped": False})
                continue
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                do_sample=sampling.do_sample,
                eos_token_id=stop_ids,
                pad_token_id=pad,
                use_cache=True,
                logits_processor=processors,
                **extra,
            )
            new = out[0, ids.shape[1] :].tolist()
            stopped = bool(new) and new[-1] in stop_ids
            results.append({"prompt": prompt, "completion": tokenizer.decode(new, skip_special_tokens=True), "tokens": len(new), "stopped": stopped})
    finally:
        torch.random.set_rng_state(generator_state)
        model.train(was_training)
    return results
