"""Chat templates: messages -> (text, character spans of the assistant turns to train on).

Named templates are rendered here, so their spans are exact. The tokenizer's own (Jinja) template is
rendered by transformers; its assistant spans are found by rendering the conversation turn by turn
(the prompt up to a reply, with the generation prompt, is a prefix of the text up to the end of it).
"""

from __future__ import annotations

from tinytrain.config.schema import ChatTemplate, DataFormat
from tinytrain.data.tokenizer import check_tokenizer_path, load_from_config
from tinytrain.errors import ConfigError, Problem

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
# Stanford Alpaca's prompt (tatsu-lab/stanford_alpaca, train.py PROMPT_DICT), with and without an input.
ALPACA_PREAMBLE = "Below is an instruction that describes a task. Write a response that appropriately completes the request."
ALPACA_PREAMBLE_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request."
)
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
    if template == ChatTemplate.alpaca:
        return render_alpaca(messages, tokenizer.eos_token)
    messages = [joined_input(m) for m in messages]
    if template == ChatTemplate.chatml:
        return _render_turns(messages, chatml_turn)
    return _render_with_tokenizer(messages, tokenizer)


def joined_input(message: dict) -> dict:
    """An instruction's input joined to its user message, for templates without an input section."""
    if not message.get("input"):
        return {"role": message["role"], "content": message["content"]}
    return {"role": message["role"], "content": f"{message['content']}\n\n{message['input']}"}


def chatml_turn(role: str, content: str, last: bool) -> tuple[str, str, str]:
    """(prompt part, trained part if assistant, trailing part) of one message."""
    return f"<|im_start|>{role}\n", f"{content}<|im_end|>", "\n"


def render_alpaca(messages: list[dict], eos: str) -> tuple[str, list[Span]]:
    """Stanford Alpaca's prompt: its preamble (a system message replaces it), "### Instruction:",
    "### Input:" when the user message carries an `input`, then "### Response:" directly followed
    by the response and EOS (so the model learns to stop). chat_jinja.ALPACA renders the same."""
    first_user = next((m for m in messages if m["role"] == "user"), {})
    if messages and messages[0]["role"] == "system":
        text = messages[0]["content"]
    else:
        text = ALPACA_PREAMBLE_INPUT if first_user.get("input") else ALPACA_PREAMBLE
    text += "\n\n"
    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "user":
            text += f"### Instruction:\n{m['content']}\n\n"
            if m.get("input"):
                text += f"### Input:\n{m['input']}\n\n"
        elif m["role"] == "assistant":
            text += "### Response:"
            spans.append((len(text), len(text) + len(m["content"]) + len(eos)))
            text += m["content"] + eos + ("" if i == len(messages) - 1 else "\n\n")
    return text, spans


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


def chat_template_problems(cfg) -> list[Problem]:
    """ChatML needs its markers as special tokens; `tokenizer` needs the tokenizer to have a
    template. Checked on the loaded tokenizer (some ship the markers already)."""
    if cfg.data.format == DataFormat.text or check_tokenizer_path(str(cfg.tokenizer.path)) is not None:
        return []
    try:
        tokenizer = load_from_config(cfg.tokenizer)
    except ConfigError:
        return []  # the tokenizer's own problem is reported when it loads
    return template_problems(cfg.data.chat_template, tokenizer)
