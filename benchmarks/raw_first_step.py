"""Baseline for benchmarks/startup.py: the raw PyTorch loop's path to its first optimizer step.

Builds the same tiny Llama from the same bundled tokenizer on the same pydoc corpus as the
default `python -m tinytrain` run, takes one AdamW step, and prints the seconds since the OS
created the process, measured the way tinytrain's log line measures it.
"""

import time

import psutil
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from tinytrain.config.resolvers import ASSETS
from tinytrain.data.corpus import pydoc_documents

tok = PreTrainedTokenizerFast.from_pretrained(str(ASSETS / "bundled_tokenizer"))
ids = []
for doc in tok(pydoc_documents(), add_special_tokens=False)["input_ids"]:
    ids += doc + [tok.eos_token_id]
data = torch.tensor(ids[: 8 * 257]).view(8, 257)
config = LlamaConfig(vocab_size=len(tok), hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=1024, use_cache=False)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
loss = torch.nn.functional.cross_entropy(model(input_ids=data[:, :-1]).logits.flatten(0, 1), data[:, 1:].flatten())
loss.backward()
opt.step()
print(f"first optimizer step done {time.time() - psutil.Process().create_time():.2f} s after process start")
