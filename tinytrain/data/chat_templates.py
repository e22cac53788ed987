"""Chat templates: messages -> (text, character spans of the assistant turns to train on).

Named templates are rendered here, so their spans are exact. The tokenizer's own (Jinja) template is
rendered by transformers; its assistant spans are found by rendering the conversation turn by turn
(the prompt up to a reply, with the generation prompt, is a prefix of the text up to the end of it).
"""

from __future__ import annotations

from tinytrain.config.schema import ChatTemplate
from tinytrain.errors import ConfigError, Problem

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
ROLES = ("system", "user", "assistant")

Span = tuple[int, int]


def template_problems(template: ChatTemplate, tokenizer) -> list[Problem]:
    """What stops `template` from working with `tokenizer`, for validate and for the SFT builder."""
    if template == ChatTemplate.chatml:
        split = [m for m in CHATML_MARKERS if len(tokenizer.encode(m, add_special_tokens=False)) != 1]
        if split:
            return [
                Problem(
                    "data.chat_template",
                    "chatml",
                    f"{' and '.join(split)} must each be one special token, but the tokenizer at {tokenizer.name_or_path} splits them into pieces",
                    "add them to the tokenizer: 'tokenizer.add_special_tokens=[\"<|im_start|>\",\"<|im_end|>\"]' (or use data.chat_template=alpaca)",
                )
            ]
    if template == ChatTemplate.tokenizer and not getattr(tokenizer, "chat_template", None):
        return [Problem("data.chat_template", "tokenizer", f"the tokenizer at {tokenizer.name_or_path} has no chat_template", "use data.chat_template=chatml or alpaca")]
    return []


def render(messages: list[dict], template: ChatTemplate, tokenizer) -> tuple[str, list[Span]]:
    if template == ChatTemplate.chatml:
        return _render_turns(messages, chatml_turn)
    if template == ChatTemplate.alpaca:
        return _render_turns(messages, lambda role, content, last: alpaca_turn(role, content, last, tokenizer.eos_token))
    return _render_with_tokenizer(messages, tokenizer)


def chatml_turn(role: str, content: str, last: bool) -> tuple[str, str, str]:
    """(prompt part, trained part if assistant, trailing part) of one message."""
    return f"<|im_start|>{role}\n", f"{content}<|im_end|>", "\n"


def alpaca_turn(role: str, content: str, last: bool, eos: str) -> tuple[str, str, str]:
    """Alpaca's prompt layout (the instruction's input, if any, is part of the user message); the
    response ends with EOS so the model learns to stop."""
    gap = "" if last else "\n\n"
    if role == "system":
        return "", content, gap
    if role == "user":
        return "### Instruction:\n", content, gap
    return "### Response:\n", f"{content}{eos}", gap


def _render_turns(messages: list[dict], turn) -> tuple[str, list[Span]]:
    text, spans = "", []
    for i, m in enumerate(messages):
        head, body, tail = turn(m["role"], m["content"], i == len(messages) - 1)
        text += head
        if m["role"] == "assistant":
            spans.append((len(text), len(text) + len(body)))
        text += body + tail
    return text, spans


def _render_with_tokenizer(messages: list[dict], tokenizer) -> tuple[str, list[Span]]:
    def rendered(msgs, generation_prompt=False) -> str:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation_prompt) if msgs else ""

    text = rendered(messages)
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, upto = rendered(messages[:k], generation_prompt=True), rendered(messages[: k + 1])
        if not (upto.startswith(before) and text.startswith(upto)):
            raise ConfigError(
                Problem(
                    "data.chat_template",
                    "tokenizer",
                    "the tokenizer's chat template does not render a conversation turn by turn (an earlier prompt is not a prefix of a "
                    "later one), so assistant turns cannot be located for masking",
                    "use data.chat_template=chatml or alpaca",
                )
            )
        spans.append((len(before), len(upto)))
    return text, spans
