"""Runs the generated DeepSpeed config for one parallel option through deepspeed.initialize on CPU.

Usage: python -m tests.integration.deepspeed_worker <parallel option> <out.json>
A separate process per option: deepspeed.initialize sets up global distributed state.
"""

import json
import os
import sys

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ.setdefault("MASTER_PORT", "29611")


def main(option: str, out_path: str) -> None:
    import deepspeed
    import torch

    from tests.conftest import compose
    from tinytrain import deepspeed_config
    from tinytrain.fast_paths import select_fast_paths
    from tinytrain.model import choose_attention, flash_attn_installed, hf_config
    from tinytrain.module import causal_lm_loss
    from tinytrain.resolve import resolve
    from tinytrain.tokenizer import load_from_config
    from tinytrain.train import build_module

    cfg = compose(["mode=plan", f"parallel={option}", "model.num_layers=2", "trainer.micro_batch_size=2", "data.seq_len=32", "trainer.lr=1e-2"])
    tokenizer = load_from_config(cfg.tokenizer)
    resolved = resolve(cfg, tokenizer)
    ds_config = deepspeed_config.build(cfg.parallel, resolved.batch, resolved.precision, cfg.trainer.grad_clip)
    torch.manual_seed(0)
    attention = choose_attention(cfg.model.attention, flash_attn_installed(), resolved.hardware)
    fast = select_fast_paths(cfg.trainer, cfg.parallel.strategy, False, resolved.vocab.padded)
    module = build_module(cfg, resolved, tokenizer, hf_config(cfg.model, resolved.vocab.padded, tokenizer), attention, fast)
    optimizer = module.configure_optimizers()["optimizer"]  # DeepSpeedCPUAdam when offloading

    deepspeed.init_distributed(dist_backend="gloo")
    engine, optimizer, _, _ = deepspeed.initialize(model=module.model, optimizer=optimizer, config=ds_config)
    batch = torch.randint(0, resolved.vocab.true, (2, 33))
    losses = []
    for _ in range(8):
        logits = engine(input_ids=batch[:, :-1], use_cache=False).logits
        loss = causal_lm_loss(logits, batch[:, 1:], resolved.vocab.true)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    result = {
        "losses": losses,
        "zero_stage": engine.zero_optimization_stage(),
        "offload": engine.zero_offload_optimizer() is not None and bool(engine.zero_offload_optimizer()),
        "optimizer": type(engine.basic_optimizer).__name__,
        "config": ds_config,
    }
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
