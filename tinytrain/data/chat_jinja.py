"""The training chat templates as the Jinja `chat_template` an exported tokenizer carries, so
`tokenizer.apply_chat_template` (and every server built on it) renders the text tinytrain trained on.
tests/unit/test_export_chat.py renders conversations both ways and compares them.

The turn-end token is what generation must stop at: `<|im_end|>` for ChatML, EOS for Alpaca.
"""

from __future__ import annotations

from tinytrain.config.schema import ChatTemplate
from tinytrain.data.chat_templates import ALPACA_PREAMBLE, ALPACA_PREAMBLE_INPUT

# `bos` is "{{ bos_token }}" when the run puts BOS before every sample (tokenizer.add_bos), else "".
CHATML = (
    "{BOS}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
    "{% if message.get('input') %}{{ '\\n\\n' + message['input'] }}{% endif %}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Stanford Alpaca's prompt: the preamble (the system message replaces it), "### Instruction:",
# "### Input:" when the first user turn has one, "### Response:" followed directly by the response
# and EOS. A user message's `input` key carries Alpaca's input; without it there is none.
ALPACA = (
    "{BOS}{% set first_user = (messages | selectattr('role', 'equalto', 'user') | list | first) %}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% elif first_user is defined and first_user.get('input') %}{{ PREAMBLE_INPUT }}"
    "{% else %}{{ PREAMBLE }}{% endif %}"
    "{{ '\\n\\n' }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "{{ '### Instruction:\\n' + message['content'] + '\\n\\n' }}"
    "{% if message.get('input') %}{{ '### Input:\\n' + message['input'] + '\\n\\n' }}{% endif %}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '### Response:' + message['content'] + eos_token }}{% if not loop.last %}{{ '\\n\\n' }}{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Response:' }}{% endif %}"
)


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def jinja_template(template: ChatTemplate, own: str | None, add_bos: bool) -> str | None:
    """The Jinja text for `template`; `own` is the tokenizer's own template (data.chat_template=tokenizer)."""
    bos = "{{ bos_token }}" if add_bos else ""
    if template == ChatTemplate.chatml:
        return CHATML.replace("{BOS}", bos)
    if template == ChatTemplate.alpaca:
        return ALPACA.replace("{BOS}", bos).replace("PREAMBLE_INPUT", _quote(ALPACA_PREAMBLE_INPUT)).replace("PREAMBLE", _quote(ALPACA_PREAMBLE))
    return own


def turn_end_tokens(template: ChatTemplate, tokenizer) -> list[str]:
    """The tokens a served model stops at: EOS, plus `<|im_end|>` for ChatML."""
    ends = [tokenizer.eos_token]
    if template == ChatTemplate.chatml:
        ends.append("<|im_end|>")
    return ends
