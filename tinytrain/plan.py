"""The plan: everything resolved for a run, printed for people and written as plan.json.

Built without allocating weights (parameter count on the meta device), so a login node can plan
a 32-GPU run. Field reference: README.md, "plan.json".
"""

from __future__ import annotations

import json
from pathlib import Path

from tinytrain.config.schema import PLANNING_MODES
from tinytrain.memory import activation_memory, model_state_memory, plan_memory
from tinytrain.model import AttentionChoice
from tinytrain.model_shape import ModelShape
from tinytrain.resolve import Resolved, devices_per_node
from tinytrain.slurm import current_task


def memory_section(cfg, resolved: Resolved, shape: ModelShape, params_total: int, attention: AttentionChoice) -> dict:
    par = cfg.parallel
    states = model_state_memory(
        par.strategy.value, params_total, resolved.world_size, par.tp, par.zero_stage, par.offload_optimizer, par.offload_params, shape.largest_layer_params
    )
    b = resolved.batch
    flash = attention.implementation == "flash_attention_2"
    acts = activation_memory(shape.layers, shape.hidden, shape.heads, b.seq_len, b.micro_batch_size, shape.vocab, par.tp, flash)
    return plan_memory(states, acts, resolved.hardware.memory_gb).to_dict()


def cluster_section(cfg) -> dict:
    task = current_task()
    if cfg.cluster.name == "slurm":
        source = f"allocation of Slurm job {task.job_id}" if task else "cluster.nodes x cluster.devices (no Slurm job here)"
    else:
        source = f"cluster={cfg.cluster.name}"
    return {"name": cfg.cluster.name, "nodes": cfg.cluster.nodes, "devices_per_node": devices_per_node(cfg), "source": source}


def build_plan(cfg, resolved: Resolved, params_total: int, attention: AttentionChoice, model_name: str, memory: dict, deepspeed: dict | None) -> dict:
    hw = resolved.hardware
    b = resolved.batch
    return {
        "model": {"name": model_name, "attention": attention.implementation, "attention_reason": attention.reason},
        "vocab": {
            "true": resolved.vocab.true,
            "padded": resolved.vocab.padded,
            "multiple": resolved.vocab.multiple,
            "tp": resolved.vocab.tp,
            "padding_rows": resolved.vocab.padding_rows,
        },
        "tokenizer": {"path": str(cfg.tokenizer.path), "fingerprint": resolved.tokenizer_fingerprint},
        "precision": resolved.precision.to_dict(),
        "hardware": {
            "gpu": None if hw.is_cpu else hw.name,
            "compute_capability": None if hw.is_cpu else ".".join(map(str, hw.compute_capability)),
            "memory_gb": hw.memory_gb,
            "source": "hardware.gpu" if (cfg.hardware.gpu and cfg.mode in PLANNING_MODES) else "detected",
        },
        "params": {"total": params_total},
        "cluster": cluster_section(cfg),
        "parallel": {"strategy": cfg.parallel.strategy.value, "tp": cfg.parallel.tp, "dp": b.data_parallel, "deepspeed_on_cpu": bool(deepspeed) and cfg.parallel.deepspeed_on_cpu and hw.is_cpu},
        "world_size": resolved.world_size,
        "batch": {
            "micro_batch_size": b.micro_batch_size,
            "accumulate_grad_batches": b.accumulate_grad_batches,
            "global_batch_size": b.global_batch_size,
            "seq_len": b.seq_len,
        },
        "tokens_per_step": b.tokens_per_step,
        "max_steps": cfg.trainer.max_steps,
        "total_tokens": b.tokens_per_step * cfg.trainer.max_steps,
        "memory_per_gpu": memory,
        "deepspeed": deepspeed,
    }


def _human(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def render_plan(plan: dict) -> str:
    v, p, b, hw = plan["vocab"], plan["precision"], plan["batch"], plan["hardware"]
    where = hw["gpu"] or "cpu"
    if hw["compute_capability"]:
        where += f" (compute capability {hw['compute_capability']}, {hw['memory_gb']} GB, from {hw['source']})"
    lines = [
        f"model      {plan['model']['name']}: {_human(plan['params']['total'])} parameters ({plan['params']['total']:,})",
        f"attention  {plan['model']['attention']}: {plan['model']['attention_reason']}",
        f"vocab      {v['true']} -> {v['padded']} (multiple {v['multiple']} x tp {v['tp']}; {v['padding_rows']} padding rows, masked out of the loss)",
        f"tokenizer  {plan['tokenizer']['path']} (fingerprint {plan['tokenizer']['fingerprint']})",
        *([f"bos        {'on' if plan['tokenizer']['add_bos'] else 'off'}: {plan['tokenizer']['add_bos_reason']}"] if "add_bos" in plan["tokenizer"] else []),
        f"hardware   {where}",
        f"precision  {p['value']}: {p['reason']}",
    ]
    if p["loss_scale"]:
        ls = p["loss_scale"]
        lines.append(
            f"loss scale dynamic: start 2^{ls['initial_scale_power']}, grow after {ls['window']} clean steps, "
            f"hysteresis {ls['hysteresis']}, minimum {ls['min_scale']}"
        )
    c = plan["cluster"]
    lines += [
        f"cluster    {c['name']}: {c['nodes']} node(s) x {c['devices_per_node']} device(s) per node, from {c['source']}",
        f"parallel   {plan['parallel']['strategy']}: world size {plan['world_size']} = tp {plan['parallel']['tp']} x dp {plan['parallel']['dp']}",
        f"batch      micro {b['micro_batch_size']} x accumulation {b['accumulate_grad_batches']} x dp {plan['parallel']['dp']} = {b['global_batch_size']} sequences of {b['seq_len']}",
        f"tokens     {_human(plan['tokens_per_step'])} per step, {_human(plan['total_tokens'])} over {plan['max_steps']} steps",
    ]
    m = plan["memory_per_gpu"]
    lines.append(
        f"memory     per GPU: params {m['params_gib']:.2f} + grads {m['grads_gib']:.2f} + optimizer {m['optimizer_gib']:.2f} "
        f"+ activations ~{m['activations_gib']:.2f} = {m['total_gib']:.2f} GiB; {m['note']}"
    )
    if plan.get("fast_paths"):
        f = plan["fast_paths"]
        on = [k for k in ("fused_adamw", "compile", "activation_checkpointing", "liger") if f[k]] + ([f"chunked loss ({f['loss_chunk_tokens']} tokens)"] if f["loss_chunk_tokens"] else [])
        lines.append(f"fast paths {', '.join(on) if on else 'none beyond ' + plan['model']['attention']}; loss: {f['reasons']['loss_chunk_tokens']}; liger: {f['reasons']['liger']}")
    pf = plan.get("preflight")
    if pf:
        warnings = [f for f in pf["findings"] if f["severity"] == "warn"]
        fixed = f"; untrained rows fixed with {pf['fix']}: {'; '.join(pf['untrained_rows'])}" if pf["fix"] else ""
        lines.append(f"preflight  {'ok' if not warnings else str(len(warnings)) + ' warning(s): ' + ' | '.join(w['message'] for w in warnings)}{fixed}")
    if plan.get("init_from"):
        i = plan["init_from"]
        lines.append(f"init from  {i['path']}: {i['true_vocab']} rows saved with tp {i['tp']} -> re-padded to {v['padded']} for tp {v['tp']}")
    if plan.get("resume"):
        r = plan["resume"]
        lines.append(f"resume     {r['how']}: {r['path']} (step {r['step']}); weights, optimizer, schedule, loss scale, data position and RNG from it")
    if plan["deepspeed"]:
        ds = plan["deepspeed"]
        zero = ds["zero_optimization"]
        offload = [k.removeprefix("offload_") for k in ("offload_optimizer", "offload_param") if k in zero]
        dtype = "bf16" if "bf16" in ds else "fp16" if "fp16" in ds else "fp32"
        on_cpu = " (on DeepSpeed's CPU accelerator: parallel.deepspeed_on_cpu, for tests only)" if plan["parallel"]["deepspeed_on_cpu"] else ""
        lines.append(f"deepspeed  ZeRO stage {zero['stage']}{' offload ' + '+'.join(offload) if offload else ''}, {dtype}, written to deepspeed_config.json{on_cpu}")
    return "\n".join(lines)


def write_plan(plan: dict, run_dir: Path) -> Path:
    path = run_dir / "plan.json"
    path.write_text(json.dumps(plan, indent=2) + "\n")
    return path
