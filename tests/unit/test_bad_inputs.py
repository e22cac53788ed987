"""An adversarial user's bad inputs: each exits 2 with one paragraph naming the key (or file), the
value and a fix, with no traceback, and before anything expensive (no weights, no training).

The CLI runs in-process (tinytrain.cli.main, as `python -m tinytrain` does) so the ~130 cases
share one interpreter's imports; tests/unit/test_cli_errors.py checks the same output through a
real subprocess. `{F}` in an argument is the folder of bad files made by the `bad` fixture.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.cli_in_process import run_in_process

# ~330 commands, about two minutes on one worker: started before the short unit modules, so it does not
# end the run alone while the other worker idles (tests/conftest.py orders the modules).
pytestmark = pytest.mark.long_module

SMALL_MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
FP16 = ["precision=fp16", "hardware.gpu=V100"]
SBATCH = ["mode=sbatch", "cluster=slurm", "cluster.nodes=1", "cluster.devices=1", "cluster.partition=gpu"]
ZERO2 = ["parallel=zero2", "hardware.gpu=A100"]

# name: (arguments, strings the message must contain: the key with its value first, then the fix)
CP2 = ["mode=plan", "parallel=zero2", "cluster.devices=2", "parallel.cp=2"]
LONG = ["mode=plan", "model=llama3_1_8b", "parallel=zero3", "cluster.devices=8", "hardware.gpu=H100", "trainer.micro_batch_size=1"]
EVALS = ["mode=plan", "eval.tasks=[tiny_mc]", "eval.include=[{F}/evals/tasks]"]
CASES = {
    # the hang watchdog (plan/watchdog.py)
    "hang timeout zero": (["mode=plan", "cluster.hang_timeout_s=0"], ["cluster.hang_timeout_s=0", "must be a number of seconds above 0", "cluster.hang_timeout_s=300", "cluster.watchdog=false"]),
    "startup timeout negative": (["mode=plan", "cluster.startup_timeout_s=-5"], ["cluster.startup_timeout_s=-5", "must be a number of seconds above 0"]),
    "slow phase timeout zero": (["mode=plan", "cluster.slow_phase_timeout_s=0"], ["cluster.slow_phase_timeout_s=0", "must be a number of seconds above 0"]),
    "hang timeout past the collective timeout's range": (["mode=plan", "cluster.hang_timeout_s=100000000000000", "cluster.startup_timeout_s=100000000000000", "cluster.slow_phase_timeout_s=100000000000000"], ["cluster.hang_timeout_s=100000000000000", "at most 2592000 (30 days)"]),
    "slow phases shorter than a step": (["mode=plan", "cluster.hang_timeout_s=300", "cluster.slow_phase_timeout_s=10"], ["cluster.slow_phase_timeout_s=10", "shorter than cluster.hang_timeout_s(300)", "cluster.slow_phase_timeout_s >= 300"]),
    "batch ramp longer than the run": (["mode=plan", "trainer.global_batch_size=32", "trainer.micro_batch_size=4", "trainer.batch_size_warmup.start=8", "trainer.batch_size_warmup.tokens=100000000"], ["trainer.batch_size_warmup.tokens=100000000", "still be growing at trainer.max_steps=250", "trainer.batch_size_warmup.tokens=256000"]),
    "startup shorter than a step": (["mode=plan", "cluster.hang_timeout_s=600", "cluster.startup_timeout_s=60"], ["cluster.startup_timeout_s=60", "shorter than cluster.hang_timeout_s(600)", "cluster.startup_timeout_s >= 600"]),
    "hang timeout a word": (["mode=plan", "cluster.hang_timeout_s=soon"], ["cluster.hang_timeout_s=soon", "Fix:"]),
    "straggler threshold zero": (["mode=plan", "cluster.straggler_threshold=0"], ["cluster.straggler_threshold=0.0", "must be above 0 and at most 10", "cluster.straggler_threshold=0.2"]),
    "straggler threshold huge": (["mode=plan", "cluster.straggler_threshold=50"], ["cluster.straggler_threshold=50.0", "must be above 0 and at most 10"]),
    "exclude outside slurm": (["mode=train", "cluster.on_bad_node=exclude"], ["cluster.on_bad_node='exclude'", "this is not a Slurm job", "cluster.on_bad_node=stop"]),
    "exclude outside slurm, mode=health": (["mode=health", "cluster.on_bad_node=exclude"], ["cluster.on_bad_node='exclude'", "this is not a Slurm job"]),
    "health check a word": (["mode=plan", "cluster.health_check=maybe"], ["cluster.health_check='maybe'", "must be auto, true or false"]),
    "health budget zero": (["mode=plan", "cluster.health_budget_s=0"], ["cluster.health_budget_s=0", "must be a positive number of seconds"]),
    "on bad node unknown": (["mode=plan", "cluster.on_bad_node=reboot"], ["cluster.on_bad_node=reboot", "stop, warn, exclude"]),
    "straggler interval zero": (["mode=plan", "cluster.straggler_every_n_steps=0"], ["cluster.straggler_every_n_steps=0", "must be >= 1"]),
    # host memory (plan/host_memory.py): a training run that cannot fit the node it starts on
    "CPU run over the job's host memory": (["mode=train", "model=tinyllama_1b"], ["model='tinyllama_1b'", "a CPU run holds its weights, gradients and optimizer state in host memory", "need 19.4 GiB", "it has 4.0 GiB (the Slurm job's --mem)", "Fix: a smaller model, fewer processes (cluster.devices)"]),
    "two CPU processes over the job's --mem-per-cpu": (["mode=train", "model=tinyllama_1b", "parallel=ddp", "cluster.devices=2"], ["model='tinyllama_1b'", "2 process(es) on this node need", "it has 4.0 GiB (the Slurm job's --mem-per-cpu)"]),
    # long context (parallel.cp, plan/context.py)
    "cp zero": (["mode=plan", "parallel.cp=0"], ["parallel.cp=0", "must be >= 1", "parallel.cp=1"]),
    "cp negative": (["mode=plan", "parallel.cp=-2"], ["parallel.cp=-2", "must be >= 1"]),
    "cp a word": (["mode=plan", "parallel.cp=two"], ["parallel.cp=two", "Fix:"]),
    "cp kind unknown": (["mode=plan", "parallel.cp_kind=spiral"], ["parallel.cp_kind=spiral", "auto, ulysses, ring"]),
    "cp kind without cp": (["mode=plan", "parallel.cp_kind=ulysses"], ["parallel.cp_kind='ulysses'", "parallel.cp=1 splits nothing", "parallel.cp=2"]),
    "cp with single": (["mode=plan", "parallel.cp=2"], ["parallel.cp=2", "parallel=single has no context parallelism", "it runs one process", "parallel=fsdp_tp|zero1|zero2"]),
    "cp with ddp": (["mode=plan", "parallel=ddp", "cluster.devices=2", "parallel.cp=2"], ["parallel.cp=2", "parallel=ddp has no context parallelism", "parallel=zero1"]),
    "ulysses under fsdp_tp with tp": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=4", "parallel.tp=2", "parallel.cp=2", "parallel.cp_kind=ulysses"], ["parallel.cp_kind='ulysses'", "Ulysses under fsdp_tp runs with tp 1 (this run: tp 2, parallel.cp=2)", "Fix: use parallel.cp_kind=auto (ring, which runs beside tp 2), or parallel.tp=1 with parallel.cp"]),
    # ring (torch's context parallel) is what auto picks where Ulysses cannot: whole 128-token blocks per rank
    "auto picks ring for fsdp_tp with tp": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=4", "parallel.tp=2", "parallel.cp=2"], ["data.seq_len=128", "multiple of parallel.cp(2) x 128 for ring (auto: ring, since Ulysses cannot: tp 2", "use data.seq_len=256"]),
    "auto picks ring for heads cp does not divide": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=4", "parallel.tp=1", "parallel.cp=4"], ["data.seq_len=128", "cp(4) does not divide num_heads(6)", "multiple of parallel.cp(4) x 128 for ring", "use data.seq_len=512"]),
    "ring with padded rows off its blocks": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=2", "parallel.tp=1", "parallel.cp=2", "parallel.cp_kind=ring", "data=alpaca", "data.seq_len=256"], ["data.pad_to_multiple_of=8", "multiple of parallel.cp(2) x 128 for ring", "use data.pad_to_multiple_of=256"]),
    "ring with a sequence off its blocks": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=2", "parallel.tp=1", "parallel.cp=2", "parallel.cp_kind=ring", "data.seq_len=384"], ["data.seq_len=384", "multiple of parallel.cp(2) x 128 for ring", "data.seq_len=256"]),
    "fsdp dp that leaves out cp": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=4", "parallel.tp=1", "parallel.cp=2", "parallel.dp=4"], ["parallel.dp=4", "dp(4) x tp(1) x cp(2) must equal the world size 4"]),
    # Gemma-2 resolves eager on a machine without flash-attn (its soft-capping has no SDPA path): the
    # ranks died with KeyError 'eager' in setup; ring's flex attention would drop the soft-capping.
    "gemma2 under ulysses without flash-attn": ([*CP2, "model.arch=gemma2", "model.sliding_window=16"], ["parallel.cp=2", "soft-capping is applied by flash-attn 2 alone", "by eager attention under Ulysses", "model.attention=flash_attention_2"]),
    # The plan checked the final micro batch: the warm-up's first steps paired each example with itself.
    "kto warm-up from micro batches of one": (["mode=plan", "experiment=dpo_smoke", "finetune.objective=kto", "data.path=${tt.asset:examples/kto_tiny.jsonl}", "data.group_by_length=false", "trainer.max_steps=12", "trainer.batch_size_warmup.start=1", "trainer.batch_size_warmup.tokens=2048"], ["trainer.batch_size_warmup.start=1", "gives micro batches of 1 example at first", "kto estimates its KL term", "Fix: use trainer.batch_size_warmup.start=2 or more"]),
    "kto warm-up at micro batch 2": (["mode=plan", "experiment=dpo_smoke", "finetune.objective=kto", "data.path=${tt.asset:examples/kto_tiny.jsonl}", "data.group_by_length=false", "trainer.max_steps=12", "trainer.micro_batch_size=2", "trainer.batch_size_warmup.start=1", "trainer.batch_size_warmup.tokens=2048"], ["trainer.batch_size_warmup.start=1", "kto estimates its KL term", "Fix: raise trainer.micro_batch_size to 3 or more (now 2"]),
    # Accepted before: the run waited for a rank nothing started, until the 30-minute startup watchdog.
    "torchrun's world not the plan's": (["parallel=ddp"], ["WORLD_SIZE=2", "plans a world of 1", "Fix: make the config's world the launcher's: cluster.nodes=1 cluster.devices=2"]),
    "a stray RANK beside WORLD_SIZE under Lightning's launcher": (["parallel=ddp", "cluster.devices=2"], ["RANK='0'", "without LOCAL_RANK", "Fix: start the ranks with torchrun"]),
    "a stray NODE_RANK on one node": (["parallel=ddp", "cluster.devices=2"], ["NODE_RANK='1'", "cluster.nodes=1 trains on this machine only", "Fix: unset NODE_RANK"]),
    "a stray MASTER_ADDR on one node": (["parallel=ddp", "cluster.devices=2"], ["MASTER_ADDR='10.255.255.1'", "is not an address of this machine", "Fix: unset MASTER_ADDR"]),
    "other nodes with nothing to start them": (["parallel=ddp", "cluster.nodes=2", "cluster.devices=1"], ["cluster.nodes=2", "nothing here starts them", "Fix: submit it to Slurm"]),
    "gemma2 under ring": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=2", "parallel.tp=1", "parallel.cp=2", "parallel.cp_kind=ring", "data.seq_len=256", "model.arch=gemma2", "model.sliding_window=16"], ["parallel.cp=2", "by ring's flex attention", "Fix: use parallel.cp=1"]),
    "cp ring under deepspeed": ([*CP2, "parallel.cp_kind=ring"], ["parallel.cp_kind='ring'", "does not run under parallel=zero2", "parallel.cp_kind=auto (ulysses here)"]),
    "cp larger than the world": (["mode=plan", "parallel=zero2", "cluster.devices=2", "parallel.cp=4", "data.seq_len=256", "model.num_heads=4", "model.num_kv_heads=4", "model.hidden_size=64"], ["parallel.cp=4", "tp(1) x cp(4) must divide the world size 2", "choose a cp that divides"]),
    "cp not dividing the world": (["mode=plan", "parallel=zero2", "cluster.devices=4", "parallel.cp=3", "model.num_heads=6", "model.num_kv_heads=3", "data.seq_len=252"], ["parallel.cp=3", "must divide the world size 4"]),
    "cp not dividing the heads": (["mode=plan", "parallel=zero2", "cluster.devices=4", "parallel.cp=4"], ["parallel.cp=4", "cp(4) must divide num_heads(6)", "Ulysses gives each rank whole heads", "use parallel.cp=2 (the cps that divide num_heads(6)"]),
    # The fix named a cp for the query heads alone (8 -> "a cp that divides 28" -> 14, which the world refuses):
    # it lists the cps that meet the kv heads and the world too.
    "cp that meets the heads but not the world": (["mode=plan", "model=qwen2_5_7b", "parallel=zero3", "cluster.devices=8", "parallel.cp=8", "hardware.gpu=H100-SXM"], ["parallel.cp=8", "cp(8) must divide num_heads(28)", "Fix: use parallel.cp=2 or 4 (the cps that divide num_heads(28), divide or are a multiple of num_kv_heads(4), and divide the world / tp (8))"]),
    "ulysses chosen under fsdp_tp with heads cp does not divide": (["mode=plan", "model=qwen2_5_7b", "parallel=fsdp_tp", "parallel.tp=1", "cluster.devices=8", "parallel.cp=8", "parallel.cp_kind=ulysses", "hardware.gpu=H100-SXM"], ["parallel.cp=8", "cp(8) must divide num_heads(28)", "Fix: use parallel.cp_kind=auto (ring, which splits any heads), or parallel.cp=2 or 4"]),
    "cp and kv heads not dividing": (["mode=plan", "parallel=zero2", "cluster.devices=6", "parallel.cp=3", "data.seq_len=252"], ["parallel.cp=3", "num_kv_heads(2)", "must divide one another"]),
    "cp not dividing the sequence": ([*CP2, "data.seq_len=255"], ["data.seq_len=255", "must be a multiple of parallel.cp(2)", "data.seq_len=254"]),
    "cp with eager attention": ([*CP2, "model.attention=eager"], ["model.attention='eager'", "cannot run under parallel.cp=2", "model.attention=auto"]),
    "cp with a padding multiple it does not divide": ([*CP2, "data=alpaca", "data.pad_to_multiple_of=3"], ["data.pad_to_multiple_of=3", "must be a multiple of parallel.cp(2)"]),
    "cp with preference tuning": ([*CP2, "data=preference", "finetune.objective=simpo"], ["finetune.objective='simpo'", "not built for parallel.cp=2", "parallel.cp=1"]),
    "checkpoint= given to a training run": (["mode=plan", "checkpoint=runs/old/checkpoints/final.ckpt"], ["checkpoint.path='runs/old/checkpoints/final.ckpt'", "mode=plan does not start from it", "Fix: start a new run from its weights with checkpoint.init_from=runs/old/checkpoints/final.ckpt"]),
    "a list written without brackets": (["mode=plan", "logger=wandb,tensorboard"], ["Ambiguous value for argument 'logger=wandb,tensorboard'", "To use it as a list, use key=[value1,value2]", "add --multirun"]),
    "a schema key removed with ~": (["mode=plan", "~trainer.lr"], ["~trainer.lr", "does not support deletion", "Fix: '~' removes a key, and tinytrain's keys are its schema's"]),
    "a config dir that is not there": (["--config-dir", "{F}/no_such_conf", "mode=plan"], ["--config-dir / hydra.searchpath", "no_such_conf' not found", "Fix: point it at an existing folder"]),
    "negative seed": (["mode=train", "seed=-1"], ["seed=-1", "must be between 0 and 4294967295", "Fix: use e.g. seed=1234"]),
    "a key given twice, the last wrong": (["mode=plan", "trainer.lr=1e-3", "trainer.lr=abc"], ["trainer.lr=abc: wrong value for 'trainer.lr'"]),
    "cp beside fsdp_tp's default tp on 2 GPUs": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=2", "parallel.cp=2"], ["parallel.cp=2", "tp(2) x cp(2) must divide the world size 2", "or keep cp 2 with parallel.tp=1"]),
    "cp with a tp that leaves no room": (["mode=plan", "parallel=zero2", "cluster.devices=2", "parallel.tp=2", "parallel.cp=2"], ["parallel.tp=2", "parallel=zero2 has no tensor parallelism"]),
    "deepspeed training on a CPU": (["parallel=zero2", "trainer.max_steps=1"], ["parallel='zero2'", "DeepSpeedStrategy runs only on CUDA GPUs", "or use parallel=ddp on CPU"]),
    "deepspeed context parallelism on a CPU": (["parallel=zero2", "cluster.devices=2", "parallel.cp=2", "model.num_heads=4", "model.num_kv_heads=2", "trainer.max_steps=1"], ["parallel='zero2'", "DeepSpeedStrategy runs only on CUDA GPUs", "or use parallel=fsdp_tp parallel.tp=1 on CPU"]),
    "context that does not fit names the cp that does": ([*LONG, "data.seq_len=65536"], ["data.seq_len=65536", "does not fit at parallel.cp=1", "the longest that fits is", "Fix: use parallel.cp="]),
    "context that does not fit on this world": ([*LONG, "data.seq_len=131072", "parallel.cp=2"], ["data.seq_len=131072", "does not fit at parallel.cp=2", "on 16 GPUs (tp 1 x cp 16 x dp 1; this run has 8)", "trainer.activation_checkpointing=full"]),
    "context that fits a cp larger than the world": ([*LONG, "data.seq_len=1572864", "model.max_position_embeddings=1572864", "parallel.cp=8", "trainer.activation_checkpointing=true"], ["data.seq_len=1572864", "does not fit at parallel.cp=8", "use parallel.cp=16 on 16 GPUs"]),
    "context whose next cp the kv heads refuse": ([*LONG, "model.num_heads=48", "model.num_kv_heads=12", "model.hidden_size=6144", "data.seq_len=524288", "model.max_position_embeddings=524288", "parallel.cp=4", "trainer.activation_checkpointing=full"], ["data.seq_len=524288", "does not fit at parallel.cp=4", "Fix: use data.seq_len <= 299008"]),
    "context that fits no cp the heads allow": ([*LONG, "data.seq_len=16777216", "model.max_position_embeddings=16777216", "parallel.cp=8", "trainer.activation_checkpointing=true"], ["data.seq_len=16777216", "does not fit at parallel.cp=8", "Fix: use data.seq_len <="]),
    "context only a sequence no cp splits keeps from fitting": (["mode=plan", "experiment=long_context", "hardware.gpu=A10", "cluster.devices=8", "data.seq_len=32767"], ["data.seq_len=32767", "does not fit at cp 1 (parallel.cp=null: the largest cp that splits it here)", "use data.seq_len=32768 with parallel.cp=4 (cp 4 splits a multiple of 4; 32767 it does not)", "or data.seq_len <= 14336"]),
    "context only a sequence ring's blocks do not split keeps from fitting": ([*LONG[:2], "parallel=fsdp_tp", "parallel.tp=1", "parallel.cp_kind=ring", "parallel.cp=null", *LONG[3:], "trainer.activation_checkpointing=full", "trainer.global_batch_size=8", "data.seq_len=100001"], ["data.seq_len=100001", "use data.seq_len=100096 with parallel.cp=2 (cp 2 splits a multiple of 256; 100001 it does not)"]),
    # The levers named a strategy finetune=qlora refuses (cp on zero*/fsdp_tp) and "data.seq_len <= 0" (the
    # longest was searched in steps of 1024 tokens); a run whose states fill the GPU blamed data.seq_len.
    "qlora context that does not fit names no strategy qlora refuses": (["mode=plan", "model.pretrained={F}/shape_7b", "finetune=qlora", "hardware.gpu=T4", "data.seq_len=4096", "trainer.micro_batch_size=2"], ["data.seq_len=4096", "does not fit at parallel.cp=1", "the longest that fits is 512", "Fix: use data.seq_len <= 512; or trainer.activation_checkpointing=full"]),
    "qlora whose 4-bit states fill the GPU": (["mode=plan", "model.pretrained={F}/shape_34b", "finetune=qlora", "hardware.gpu=T4", "trainer.micro_batch_size=1"], ["parallel='single'", "the model states alone take 17.7 GiB, at any data.seq_len", "Fix: no lever of this strategy is left: a GPU with more memory, or a smaller model"]),
    "states that fill the GPU at tp 8": (["mode=plan", "model=llama3_8b", "parallel=fsdp_tp", "parallel.tp=8", "cluster.devices=8", "hardware.gpu=T4", "trainer.micro_batch_size=1", "trainer.activation_checkpointing=full", "data.seq_len=512"], ["parallel='fsdp_tp'", "do not fit this GPU at any data.seq_len", "Fix: use 16 GPUs (cluster.devices or cluster.nodes; tp 8 x cp 1 x dp 2; this run has 8); or a GPU with more memory (hardware.gpu)"]),
    "lora context that does not fit names the strategies lora runs on": (["mode=plan", "model.pretrained={F}/shape_7b", "finetune=lora", "hardware.gpu=T4", "data.seq_len=4096", "trainer.micro_batch_size=1", "trainer.activation_checkpointing=full"], ["data.seq_len=4096", "Fix: use parallel.cp=2 with parallel=zero2|zero2_offload|zero3|zero3_offload on 2 GPUs"]),
    "cp with a batch warm-up": ([*CP2, "trainer.global_batch_size=32", "trainer.batch_size_warmup.start=8", "trainer.batch_size_warmup.tokens=4096"], ["trainer.batch_size_warmup.start=8", "Ulysses' attention is built for one micro batch size", "parallel.cp=1"]),
    "long-context recipe on V100s, 4 sequences a micro batch": (["mode=plan", "experiment=long_context", "hardware.gpu=V100", "cluster.devices=8", "trainer.micro_batch_size=4", "parallel.cp=8"], ["data.seq_len=32768", "does not fit at parallel.cp=8", "use parallel.cp=8 on 16 GPUs (tp 1 x cp 8 x dp 2; this run has 8)", "or data.seq_len <= 24576"]),
    # optimizers and objectives (issue 37)
    "optimizer unknown": (["mode=plan", "trainer.optimizer=sgd"], ["trainer.optimizer=sgd", "adamw, muon"]),
    "muon with lora trains no hidden matrix": (["mode=plan", "finetune=lora", "trainer.optimizer=muon"], ["trainer.optimizer='muon'", "trains none of them", "trainer.optimizer=adamw with LoRA"]),
    "muon resuming a deepspeed folder of another dp": (["mode=plan", "parallel=zero2", "hardware.gpu=A100", "trainer.optimizer=muon", "resume={F}/ds_two_ranks.ckpt"], ["resume='{F}/ds_two_ranks.ckpt'", "not Muon's momentum_buffer", "resume on the data-parallel size it was saved on"]),
    "muon momentum one": (["mode=plan", "trainer.optimizer=muon", "trainer.muon_momentum=1"], ["trainer.muon_momentum=1.0", "[0, 1)", "trainer.muon_momentum=0.95"]),
    # At micro batch 1 the fix said start=4 (the final batch itself), then "a start between 4 and 0, or raise
    # trainer.global_batch_size": neither helps, the ramp grows the micro batch.
    "batch warm-up at micro batch 1": (["mode=plan", "parallel=ddp", "cluster.devices=4", "trainer.micro_batch_size=1", "trainer.batch_size_warmup.start=2", "trainer.batch_size_warmup.tokens=10000"], ["trainer.batch_size_warmup.start=2", "at trainer.micro_batch_size=1 no start below the final global batch (4)", "Fix: raise trainer.micro_batch_size, e.g. trainer.micro_batch_size=2 trainer.batch_size_warmup.start=4 (final global batch 8)"]),
    "batch warm-up at micro batch 1 of a set global batch": (["mode=plan", "parallel=ddp", "cluster.devices=4", "trainer.micro_batch_size=1", "trainer.global_batch_size=4", "trainer.batch_size_warmup.start=4", "trainer.batch_size_warmup.tokens=10000"], ["trainer.batch_size_warmup.start=4", "no start below the final global batch (4)", "Fix: raise trainer.micro_batch_size, e.g. trainer.micro_batch_size=2 trainer.global_batch_size=8 trainer.batch_size_warmup.start=4"]),
    "batch warm-up start above the final batch": (["mode=plan", "trainer.batch_size_warmup.start=64", "trainer.batch_size_warmup.tokens=4096"], ["trainer.batch_size_warmup.start=64", "below the final global batch (8 = micro 8", "raise trainer.global_batch_size"]),
    "batch warm-up start not divisible by dp": (["mode=plan", "parallel=ddp", "cluster.devices=2", "trainer.global_batch_size=32", "trainer.batch_size_warmup.start=3", "trainer.batch_size_warmup.tokens=4096"], ["trainer.batch_size_warmup.start=3", "not a multiple of data_parallel(2) x accumulate_grad_batches(2) = 4", "trainer.batch_size_warmup.start=4"]),
    "batch warm-up without a length": (["mode=plan", "trainer.global_batch_size=32", "trainer.batch_size_warmup.start=8"], ["trainer.batch_size_warmup.tokens=0", "needs a length in tokens", "trainer.batch_size_warmup.tokens="]),
    # counted in tokens, 40 steps ramping from 8 to 32 sequences train 21.5 final batches: a decay of 36 fit max_steps, not them
    "WSD decay longer than a ramped run's tokens": (["mode=plan", "trainer.global_batch_size=32", "trainer.batch_size_warmup.start=8", "trainer.batch_size_warmup.tokens=65536", "trainer.max_steps=40", "trainer.warmup_steps=2", "trainer.lr_schedule=wsd", "trainer.decay_steps=36"], ["trainer.decay_steps=36", "21.5 of trainer.max_steps=40", "use a decay of 1 to 19 steps"]),
    "batch warm-up with length-grouped batches": (["mode=plan", "data=alpaca", "trainer.global_batch_size=32", "trainer.batch_size_warmup.start=8", "trainer.batch_size_warmup.tokens=4096"], ["data.group_by_length=true", "a batch warm-up changes it", "data.group_by_length=false"]),
    "orpo with label smoothing": (["mode=plan", "experiment=dpo_smoke", "finetune.objective=orpo", "finetune.label_smoothing=0.1"], ["finetune.label_smoothing=0.1", "orpo has no label smoothing", "finetune.label_smoothing=0"]),
    "orpo with a precomputed reference": (["mode=plan", "experiment=dpo_smoke", "finetune.objective=orpo", "finetune.precompute_reference=true"], ["finetune.precompute_reference=true", "orpo is reference-free"]),
    "kto record without a label": (["mode=prepare", "experiment=dpo_smoke", "finetune.objective=kto", "data.path={F}/kto_no_label.jsonl", "data.cache_dir={F}/cache"], ["kto_no_label.jsonl", "missing field 'label'", "data.bad_records=skip"]),
    "kto records all one label": (["mode=prepare", "experiment=dpo_smoke", "finetune.objective=kto", "data.path={F}/kto_all_true.jsonl", "data.cache_dir={F}/cache"], ["kto_all_true.jsonl", "all 20 KTO examples are label=true", "add records of the other label"]),
    "kto micro batch of one": (["mode=plan", "experiment=dpo_smoke", "finetune.objective=kto", "trainer.micro_batch_size=1"], ["trainer.micro_batch_size=1", "KL term", "trainer.micro_batch_size=2"]),
    "kto micro batch auto over one example a rank": (["mode=plan", "experiment=dpo_smoke", "finetune.objective=kto", "hardware.gpu=A100", "trainer.micro_batch_size=auto", "trainer.global_batch_size=1"], ["trainer.global_batch_size=1", "kto needs micro batches of 2 or more", "trainer.global_batch_size=2"]),
    "kto weight zero": (["mode=plan", "experiment=dpo_smoke", "finetune.objective=kto", "finetune.undesirable_weight=0"], ["finetune.undesirable_weight=0.0", "positive and finite", "finetune.undesirable_weight=1.0"]),
    # throughput levers (issue 34)
    "checkpointing mode unknown": (["mode=plan", "trainer.activation_checkpointing=partial"], ["trainer.activation_checkpointing='partial'", "names no mode (the modes are none, full, selective, auto; true/false still mean full/none)", "Fix: use one of none, full, selective, auto"]),
    "checkpointing mode a number": (["mode=plan", "trainer.activation_checkpointing=2"], ["trainer.activation_checkpointing=2", "names no mode"]),
    "checkpointing mode null": (["mode=plan", "trainer.activation_checkpointing=null"], ["trainer.activation_checkpointing=null", "names no mode"]),
    "checkpointing mode a list": (["mode=plan", "trainer.activation_checkpointing=[full]"], ["trainer.activation_checkpointing=['full']", "names no mode"]),
    "compile mode unknown": (["mode=plan", "trainer.compile=layers"], ["trainer.compile='layers'", "names no mode (the modes are none, blocks, model; true/false still mean model/none)", "Fix: use one of none, blocks, model"]),
    "compile mode a number": (["mode=plan", "trainer.compile=1"], ["trainer.compile=1", "names no mode"]),
    "compile mode null": (["mode=plan", "trainer.compile=null"], ["trainer.compile=null", "names no mode"]),
    "compile the whole model under fsdp_tp": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=2", "trainer.compile=model"], ["trainer.compile='model'", "cannot run under parallel=fsdp_tp: FSDP2 gathers each block's weights", "Fix: use trainer.compile=blocks"]),
    "compile the old true under fsdp_tp": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=2", "trainer.compile=true"], ["trainer.compile='model'", "cannot run under parallel=fsdp_tp", "trainer.compile=blocks"]),
    "profile window beyond the run": (["mode=plan", "trainer.profile=true", "trainer.max_steps=4"], ["trainer.profile_start=3", "the profiled steps 3-5 end beyond trainer.max_steps(4)", "Fix: use trainer.profile_start <= 1"]),
    "profile steps zero": (["mode=plan", "trainer.profile=true", "trainer.profile_steps=0"], ["trainer.profile_steps=0", "must be >= 1"]),
    "profile start negative": (["mode=plan", "trainer.profile=true", "trainer.profile_start=-1"], ["trainer.profile_start=-1", "must be >= 0"]),
    "micro batch auto with no GPU named": (["mode=plan", "trainer.micro_batch_size=auto", "trainer.global_batch_size=64"], ["trainer.micro_batch_size='auto'", "this run has no GPU to fit (a CPU)", "Fix: name the GPU the run trains on (e.g. hardware.gpu=H100"]),
    "micro batch auto training on a CPU with a GPU named": (["trainer.micro_batch_size=auto", "trainer.global_batch_size=64", "hardware.gpu=H100"], ["trainer.micro_batch_size='auto'", "a CPU: hardware.gpu=H100 plans for that GPU in mode=plan", "Fix: run it on the GPU node"]),
    "micro batch auto without a global batch": (["mode=plan", "hardware.gpu=H100", "trainer.micro_batch_size=auto"], ["trainer.micro_batch_size='auto'", "trainer.global_batch_size is not set", "Fix: set trainer.global_batch_size"]),
    "micro batch auto with a fixed accumulation": (["mode=plan", "hardware.gpu=H100", "trainer.micro_batch_size=auto", "trainer.global_batch_size=64", "trainer.accumulate_grad_batches=2"], ["trainer.accumulate_grad_batches=2", "is what trainer.micro_batch_size=auto decides"]),
    "micro batch a word": (["mode=plan", "trainer.micro_batch_size=big"], ["trainer.micro_batch_size='big'", "must be a positive integer or auto"]),
    "fp8 on a CPU": (["mode=plan", "precision.fp8=true"], ["precision.fp8=true", "float8 matmuls need compute capability >= 8.9", "this run has no GPU", "Fix: use precision.fp8=false"]),
    "fp8 on an A100": (["mode=plan", "hardware.gpu=A100", "precision.fp8=true"], ["precision.fp8=true", "A100 (compute capability 8.0) has less", "Fix: use precision.fp8=false"]),
    "fp8 on a V100": (["mode=plan", "hardware.gpu=V100", "precision=fp16", "precision.fp8=true"], ["precision.fp8=true", "V100 (compute capability 7.0) has less"]),
    "fp8 under fsdp_tp": (["mode=plan", "hardware.gpu=H100", "parallel=fsdp_tp", "cluster.devices=2", "precision.fp8=true"], ["precision.fp8=true", "torchao's float8 parallel styles", "Fix: use precision.fp8=false"]),
    "fp8 a word": (["mode=plan", "precision.fp8=maybe"], ["precision.fp8='maybe'", "must be false, true or auto", "Fix: use precision.fp8=auto"]),
    "compile backend unknown": (["mode=plan", "trainer.compile=blocks", "trainer.compile_backend=turbo"], ["trainer.compile_backend='turbo'", "is not a torch.compile backend (this torch has", "inductor", "Fix: use trainer.compile_backend=inductor"]),
    # model sizes
    "hidden size zero": (["mode=plan", "model.hidden_size=0"], ["model.hidden_size=0", "positive", "Fix: use e.g. model.hidden_size=192"]),
    "hidden size negative": (["mode=plan", "model.hidden_size=-64"], ["model.hidden_size=-64", "positive"]),
    "hidden size not an integer": (["mode=plan", "model.hidden_size=1.5"], ["model.hidden_size=1.5", "hidden_size", "Fix:"]),
    "hidden size a word": (["mode=plan", "model.hidden_size=big"], ["model.hidden_size=big", "Integer"]),
    "layers zero": (["mode=plan", "model.num_layers=0"], ["model.num_layers=0", "positive"]),
    "layers negative": (["mode=plan", "model.num_layers=-1"], ["model.num_layers=-1", "positive"]),
    "heads zero": (["mode=plan", "model.num_heads=0"], ["model.num_heads=0", "positive"]),
    "kv heads zero": (["mode=plan", "model.num_kv_heads=0"], ["model.num_kv_heads=0", "positive"]),
    "kv heads negative": (["mode=plan", "model.num_kv_heads=-2"], ["model.num_kv_heads=-2", "positive"]),
    "intermediate size zero": (["mode=plan", "model.intermediate_size=0"], ["model.intermediate_size=0", "positive"]),
    "max positions zero": (["mode=plan", "model.max_position_embeddings=0"], ["model.max_position_embeddings=0", "positive"]),
    "heads not dividing hidden": (["mode=plan", "model.num_heads=5"], ["model.num_heads=5", "must divide hidden_size(192)", "Fix: pick a head count"]),
    "kv heads not dividing heads": (["mode=plan", "model.num_kv_heads=4"], ["model.num_kv_heads=4", "must divide num_heads(6)"]),
    "rope theta zero": (["mode=plan", "model.rope_theta=0"], ["model.rope_theta=0.0", "positive"]),
    "rms norm eps negative": (["mode=plan", "model.rms_norm_eps=-1"], ["model.rms_norm_eps=-1.0", "positive"]),
    "initializer range zero": (["mode=plan", "model.initializer_range=0"], ["model.initializer_range=0.0", "positive"]),
    "vocab multiple zero": (["mode=plan", "model.vocab_multiple=0"], ["model.vocab_multiple=0", ">= 1"]),
    "vocab multiple negative": (["mode=plan", "model.vocab_multiple=-64"], ["model.vocab_multiple=-64", ">= 1"]),
    "vocab size below the tokenizer": (["mode=plan", "model.vocab_size=10"], ["model.vocab_size=10", "len(tokenizer) is 4096", "remove the override"]),
    "seq len zero": (["mode=plan", "data.seq_len=0"], ["data.seq_len=0", ">= 2"]),
    "seq len negative": (["mode=plan", "data.seq_len=-256"], ["data.seq_len=-256", ">= 2"]),
    "seq len huge": (["mode=plan", "data.seq_len=100000000"], ["data.seq_len=100000000", "max_position_embeddings(1024)"]),
    "tp not dividing heads": (["mode=plan", "parallel=fsdp_tp", "cluster.devices=4", "parallel.tp=4"], ["parallel.tp=4", "tp(4) must divide num_heads(6)"]),
    "tp zero": (["mode=plan", "parallel=fsdp_tp", "parallel.tp=0"], ["parallel.tp=0", ">= 1"]),
    "tp without tensor parallelism": (["mode=plan", "parallel.tp=2"], ["parallel.tp=2", "no tensor parallelism", "parallel=fsdp_tp"]),
    "dp x tp not the world": (["mode=plan", "parallel=fsdp_tp", "parallel.tp=2", "parallel.dp=3", "cluster.devices=2"], ["parallel.dp=3", "world size 2"]),
    "unknown model option": (["mode=plan", "model=tinylama_1b"], ["model=tinylama_1b", "Did you mean 'tinyllama_1b'"]),
    "unknown architecture": (["mode=plan", "model.arch=gpt2"], ["model.arch=gpt2", "expected one of [llama, qwen2, mistral, gemma2, phi3, qwen3, gemma3_text]"]),
    "sliding window pattern off gemma3": (["mode=plan", "model.sliding_window_pattern=6"], ["model.sliding_window_pattern=6", "only model.arch=gemma3_text has it", "Fix: use model.sliding_window_pattern=null"]),
    "sliding window pattern zero": (["mode=plan", "model=gemma3_1b", "model.sliding_window_pattern=0"], ["model.sliding_window_pattern=0", "must be a positive integer", "Fix:"]),
    "local rope base negative": (["mode=plan", "model=gemma3_1b", "model.rope_local_theta=-1"], ["model.rope_local_theta=-1.0", "must be positive", "Fix:"]),
    "unknown attention": (["mode=plan", "model.attention=flash3"], ["model.attention=flash3", "expected one of"]),
    # cluster
    "nodes zero": (["mode=plan", "cluster.nodes=0"], ["cluster.nodes=0", ">= 1", "cluster.nodes=1"]),
    "nodes negative": (["mode=plan", "cluster.nodes=-2"], ["cluster.nodes=-2", ">= 1"]),
    "devices zero": (["mode=plan", "cluster.devices=0"], ["cluster.devices=0", ">= 1"]),
    "devices negative": (["mode=plan", "parallel=ddp", "cluster.devices=-1"], ["cluster.devices=-1", ">= 1"]),
    "nodes a word": (["mode=plan", "cluster.nodes=two"], ["cluster.nodes=two", "Integer"]),
    "single with two devices": (["mode=plan", "cluster.devices=2"], ["parallel='single'", "runs one process", "parallel=ddp"]),
    "sbatch time a word": ([*SBATCH, "cluster.time=banana"], ["cluster.time='banana'", "not a Slurm time limit", "HH:MM:SS"]),
    "sbatch time of four fields": ([*SBATCH, "cluster.time=1:2:3:4"], ["cluster.time='1:2:3:4'", "not a Slurm time limit"]),
    "sbatch time with two day parts": ([*SBATCH, "cluster.time=1-2-3"], ["cluster.time='1-2-3'", "not a Slurm time limit"]),
    "sbatch signal delay over sbatch's largest": ([*SBATCH, "cluster.time=UNLIMITED", "cluster.signal_delay_s=100000"], ["cluster.signal_delay_s=100000", "must be 0 to 65535"]),
    "sbatch time four fields": ([*SBATCH, "cluster.time=1:2:3:4"], ["cluster.time='1:2:3:4'", "not a Slurm time limit"]),
    "sbatch time empty": ([*SBATCH, "cluster.time=''"], ["cluster.time=''", "not a Slurm time limit"]),
    "sbatch signal after the limit": ([*SBATCH, "cluster.time=5", "cluster.signal_delay_s=600"], ["cluster.signal_delay_s=600", "not shorter than cluster.time=5 (300 s)"]),
    "sbatch signal negative": ([*SBATCH, "cluster.signal_delay_s=-5"], ["cluster.signal_delay_s=-5", "must be 0 to 65535"]),
    "sbatch cpus zero": ([*SBATCH, "cluster.cpus_per_task=0"], ["cluster.cpus_per_task=0", ">= 1"]),
    "sbatch without slurm": (["mode=sbatch"], ["cluster='local'", "cluster=slurm"]),
    # batch
    "micro batch zero": (["mode=plan", "trainer.micro_batch_size=0"], ["trainer.micro_batch_size=0", ">= 1"]),
    "micro batch negative": (["mode=plan", "trainer.micro_batch_size=-1"], ["trainer.micro_batch_size=-1", ">= 1"]),
    "cp null with a batch no cp lays out": (["mode=plan", "experiment=long_context", "hardware.gpu=H100", "cluster.devices=6", "trainer.global_batch_size=5"], ["trainer.global_batch_size=5", "data_parallel(6) = 6", "use a multiple of 6"]),
    "cp null choosing a cp the batch does not divide": (["mode=plan", "experiment=long_context", "hardware.gpu=H100", "cluster.devices=8", "trainer.global_batch_size=4", "data.seq_len=32767"], ["trainer.global_batch_size=4", "data_parallel(8) = 8 (parallel.cp=null: 1, the smallest cp whose estimate fits", "use a multiple of 8"]),
    "global batch zero": (["mode=plan", "trainer.global_batch_size=0"], ["trainer.global_batch_size=0", ">= 1", "null to derive it"]),
    "global batch negative": (["mode=plan", "trainer.global_batch_size=-8"], ["trainer.global_batch_size=-8", ">= 1"]),
    "global batch not divisible by dp": (["mode=plan", "parallel=ddp", "cluster.devices=2", "trainer.global_batch_size=15"], ["trainer.global_batch_size=15", "micro_batch_size(8) x data_parallel(2) = 16"]),
    "global batch below micro": (["mode=plan", "trainer.global_batch_size=4"], ["trainer.global_batch_size=4", "not a multiple of"]),
    "accumulation zero": (["mode=plan", "trainer.accumulate_grad_batches=0"], ["trainer.accumulate_grad_batches=0", ">= 1"]),
    "accumulation negative": (["mode=plan", "trainer.accumulate_grad_batches=-1"], ["trainer.accumulate_grad_batches=-1", ">= 1"]),
    "accumulation against global": (["mode=plan", "trainer.accumulate_grad_batches=2", "trainer.global_batch_size=8"], ["trainer.accumulate_grad_batches=2", "disagrees with global_batch_size(8)"]),
    # optimizer and schedule
    "lr zero": (["mode=plan", "trainer.lr=0"], ["trainer.lr=0.0", "positive"]),
    "data stage naming an unknown source": (["mode=plan", "data=mixture", "data.stages=[{until_step: 100, weights: {web: 1}}]"], ["data.stages[0].weights.web=1.0", "names no mixture source (the sources are tinyshakespeare, alpaca_instructions)", "Fix: use one of those names"]),
    "data stages out of order": (["mode=plan", "data=mixture", "data.stages=[{until_step: 100, weights: {tinyshakespeare: 1}}, {until_step: 50, weights: {tinyshakespeare: 1}}]"], ["data.stages[1].until_step=50", "after the previous stage's end (step 100)", "Fix: list the stages by until_step"]),
    "data stage beyond max_steps": (["mode=plan", "data=mixture", "data.stages=[{until_step: 300, weights: {tinyshakespeare: 1}}]"], ["data.stages[0].until_step=300", "beyond trainer.max_steps(250)", "Fix: use a step up to 250"]),
    "data stage drawing nothing": (["mode=plan", "data=mixture", "data.stages=[{until_step: 100, weights: {tinyshakespeare: 0}}]"], ["data.stages[0].weights=", "draws from no source", "Fix: give at least one source a positive weight"]),
    "learning rate nan": (["mode=plan", "trainer.lr=nan"], ["trainer.lr=nan", "must be positive and finite", "Fix: use e.g. trainer.lr=3e-4"]),
    "learning rate infinite": (["mode=plan", "trainer.lr=inf"], ["trainer.lr=inf", "must be positive and finite"]),
    "clipping nan": (["mode=plan", "trainer.grad_clip=nan"], ["trainer.grad_clip=nan", "must be a finite number >= 0", "Fix: use 0 for no clipping"]),
    "wsd decay of no steps": (["mode=plan", "trainer.lr_schedule=wsd", "trainer.max_steps=4", "trainer.warmup_steps=0", "trainer.decay_fraction=0.1"], ["trainer.decay_fraction=0.1", "a decay of 0 steps", "a trainer.decay_fraction larger than 0.1"]),
    "decay steps on a constant schedule": (["mode=plan", "trainer.lr_schedule=constant", "trainer.decay_steps=10"], ["trainer.decay_steps=10", "constant holds its rate after the warm-up", "Fix: set trainer.lr_schedule=wsd"]),
    "odd head width": (["mode=plan", "model.head_dim=7"], ["model.head_dim=7", "RoPE rotates pairs", "Fix: use an even model.head_dim"]),
    "odd derived head width": (["mode=plan", "model.hidden_size=198"], ["model.hidden_size=198", "heads 33 wide", "Fix: use an even model.head_dim"]),
    "data stage weight infinite": (["mode=plan", "data=mixture", "data.stages=[{until_step: 100, weights: {tinyshakespeare: inf}}]"], ["data.stages[0].weights.tinyshakespeare=inf", "must be a finite number >= 0", "Fix: use e.g. 0.3"]),
    "data stage weight not a number": (["mode=plan", "data=mixture", "data.stages=[{until_step: 100, weights: {tinyshakespeare: abc}}]"], ["data.stages=[{until_step: 100, weights: {tinyshakespeare: abc}}]: wrong value for 'weights.tinyshakespeare'", "could not be converted to Float"]),
    "data stages without a mixture": (["mode=plan", "data.stages=[{until_step: 100, weights: {a: 1}}]"], ["data.stages=", "data.sources names no mixture", "Fix: add data.sources"]),
    "average more checkpoints than are kept": (["mode=plan", "checkpoint.average_last=5"], ["checkpoint.average_last=5", "at most the checkpoint.keep_last(3)", "Fix: raise checkpoint.keep_last to at least 5 (checkpoint.keep_last=5: the run keeps what it averages), or average fewer: checkpoint.average_last=3"]),
    # "use 2 to 2" at keep_last 1, which was refused again: the key to raise is keep_last.
    "average more checkpoints than the one kept": (["mode=plan", "checkpoint.keep_last=1", "checkpoint.average_last=3"], ["checkpoint.average_last=3", "at most the checkpoint.keep_last(1)", "Fix: raise checkpoint.keep_last to at least 3 (checkpoint.keep_last=3: the run keeps what it averages), or checkpoint.average_last=null for no average"]),
    "average of one checkpoint": (["mode=plan", "checkpoint.average_last=1"], ["checkpoint.average_last=1", "at least 2", "Fix: use checkpoint.average_last=2 (up to checkpoint.keep_last=3)"]),
    # It trained, checkpointed and exported, then exited 2 at the average (a bug hunt's find).
    "average of lora checkpoints": (["mode=plan", "finetune=lora", "checkpoint.average_last=2"], ["checkpoint.average_last=2", "hold LoRA adapters", "Fix: use checkpoint.average_last=null with LoRA"]),
    "wsd decay longer than the run": (["mode=plan", "trainer.lr_schedule=wsd", "trainer.decay_steps=240"], ["trainer.decay_steps=240", "a decay of 240 steps does not fit", "max_steps(250) - trainer.warmup_steps(25) = 225", "Fix: use a decay of 1 to 225 steps"]),
    "wsd decay fraction above 1": (["mode=plan", "trainer.lr_schedule=wsd", "trainer.decay_fraction=1.5"], ["trainer.decay_fraction=1.5", "must be in (0, 1]", "Fix:"]),
    "wsd decay fraction into the warm-up": (["mode=plan", "trainer.lr_schedule=wsd", "trainer.decay_fraction=0.95"], ["trainer.decay_fraction=0.95", "does not fit", "raise trainer.max_steps"]),
    "decay steps without wsd": (["mode=plan", "trainer.decay_steps=20"], ["trainer.decay_steps=20", "only trainer.lr_schedule=wsd", "Fix: set trainer.lr_schedule=wsd"]),
    "unknown schedule": (["mode=plan", "trainer.lr_schedule=triangle"], ["trainer.lr_schedule=triangle", "expected one of"]),
    "lr negative": (["mode=plan", "trainer.lr=-1e-3"], ["trainer.lr=-0.001", "positive"]),
    "lr a word": (["mode=plan", "trainer.lr=fast"], ["trainer.lr=fast", "trainer.lr"]),
    "beta above one": (["mode=plan", "trainer.betas=[0.9,1.5]"], ["trainer.betas=[0.9, 1.5]", "[0, 1)"]),
    "beta exactly one": (["mode=plan", "trainer.betas=[1.0,0.95]"], ["trainer.betas=[1.0, 0.95]", "[0, 1)"]),
    "beta negative": (["mode=plan", "trainer.betas=[-0.1,0.95]"], ["trainer.betas=[-0.1, 0.95]", "[0, 1)"]),
    "three betas": (["mode=plan", "trainer.betas=[0.9,0.95,0.99]"], ["trainer.betas=[0.9, 0.95, 0.99]", "two values"]),
    "one beta": (["mode=plan", "trainer.betas=[0.9]"], ["trainer.betas=[0.9]", "two values"]),
    "adam eps negative": (["mode=plan", "trainer.eps=-1e-8"], ["trainer.eps=-1e-08", "positive"]),
    "adam eps zero": (["mode=plan", "trainer.eps=0"], ["trainer.eps=0.0", "positive"]),
    "weight decay negative": (["mode=plan", "trainer.weight_decay=-0.1"], ["trainer.weight_decay=-0.1", ">= 0"]),
    "grad clip negative": (["mode=plan", "trainer.grad_clip=-1"], ["trainer.grad_clip=-1.0", ">= 0", "0 for no clipping"]),
    "warmup beyond steps": (["mode=plan", "trainer.warmup_steps=500"], ["trainer.warmup_steps=500", "below trainer.max_steps(250)"]),
    "warmup equal to steps": (["mode=plan", "trainer.warmup_steps=250"], ["trainer.warmup_steps=250", "below trainer.max_steps(250)"]),
    "warmup negative": (["mode=plan", "trainer.warmup_steps=-1"], ["trainer.warmup_steps=-1", ">= 0"]),
    "min lr ratio above one": (["mode=plan", "trainer.min_lr_ratio=2"], ["trainer.min_lr_ratio=2.0", "between 0 and 1"]),
    "min lr ratio negative": (["mode=plan", "trainer.min_lr_ratio=-0.1"], ["trainer.min_lr_ratio=-0.1", "between 0 and 1"]),
    "max steps zero": (["mode=plan", "trainer.max_steps=0"], ["trainer.max_steps=0", ">= 1"]),
    "max steps negative": (["mode=plan", "trainer.max_steps=-5"], ["trainer.max_steps=-5", ">= 1"]),
    "val batches negative": (["mode=plan", "trainer.val_batches=-1"], ["trainer.val_batches=-1", ">= 0"]),
    "val interval zero": (["mode=plan", "trainer.val_every_n_steps=0"], ["trainer.val_every_n_steps=0", ">= 1"]),
    "log interval zero": (["mode=plan", "trainer.log_every_n_steps=0"], ["trainer.log_every_n_steps=0", ">= 1"]),
    "checkpoint interval zero": (["mode=plan", "trainer.checkpoint_every_n_steps=0"], ["trainer.checkpoint_every_n_steps=0", ">= 1"]),
    "loss chunk negative": (["mode=plan", "trainer.loss_chunk_tokens=-5"], ["trainer.loss_chunk_tokens=-5", ">= 0"]),
    "keep no checkpoint": (["mode=plan", "checkpoint.keep_last=0"], ["checkpoint.keep_last=0", "resuming needs a checkpoint"]),
    # precision and the loss-scale policy
    "unknown precision": (["mode=plan", "precision=fp8"], ["precision=fp8", "Available: auto, bf16, fp16, fp32"]),
    "bf16 on a V100": (["mode=plan", "hardware.gpu=V100", "precision=bf16"], ["V100", "precision=fp16"]),
    "min scale above the initial scale": (["mode=plan", *FP16, "precision.loss_scale.min_scale=1e9"], ["precision.loss_scale.min_scale=1000000000.0", "above the initial scale 2^16 = 65536"]),
    "min scale zero": (["mode=plan", *FP16, "precision.loss_scale.min_scale=0"], ["precision.loss_scale.min_scale=0.0", "positive"]),
    "min scale negative": (["mode=plan", *FP16, "precision.loss_scale.min_scale=-1"], ["precision.loss_scale.min_scale=-1.0", "positive"]),
    "scale window zero": (["mode=plan", *FP16, "precision.loss_scale.window=0"], ["precision.loss_scale.window=0", ">= 1"]),
    "scale window negative": (["mode=plan", *FP16, "precision.loss_scale.window=-10"], ["precision.loss_scale.window=-10", ">= 1"]),
    "hysteresis zero": (["mode=plan", *FP16, "precision.loss_scale.hysteresis=0"], ["precision.loss_scale.hysteresis=0", ">= 1"]),
    "scale power negative": (["mode=plan", *FP16, "precision.loss_scale.initial_scale_power=-3"], ["precision.loss_scale.initial_scale_power=-3", "between 0 and 32"]),
    "scale power huge": (["mode=plan", *FP16, "precision.loss_scale.initial_scale_power=200"], ["precision.loss_scale.initial_scale_power=200", "between 0 and 32"]),
    "unknown gpu": (["mode=plan", "hardware.gpu=V1000"], ["hardware.gpu='V1000'", "unknown GPU", "V100"]),
    # runtime guards
    "guard skips negative": (["mode=plan", "guard.max_consecutive_skips=-1"], ["guard.max_consecutive_skips=-1", ">= 0"]),
    "loader workers beyond any node": (["mode=plan", "data.num_workers=100000"], ["data.num_workers=100000", "on every rank", "data.num_workers=4"]),
    "tokenize workers beyond any node": (["mode=plan", "data.tokenize_workers=1000"], ["data.tokenize_workers=1000", "null (one per core)"]),
    "rms norm eps infinite": (["mode=plan", "model.rms_norm_eps=inf"], ["model.rms_norm_eps=inf", "positive and finite"]),
    "rms norm eps huge": (["mode=plan", "model.rms_norm_eps=1e3"], ["model.rms_norm_eps=1000.0", "1e-5 or 1e-6"]),
    "rope theta infinite": (["mode=plan", "model.rope_theta=inf"], ["model.rope_theta=inf", "positive and finite"]),
    "run root under an unexpanded home": (["mode=plan", "run.root='~/runs'", "run.name=a"], ["run.root='~/runs'", "${oc.env:HOME}/runs"]),
    "data path under an unexpanded home": (["mode=plan", "data.path='~/corpus.txt'"], ["data.path='~/corpus.txt'", "data.path=${oc.env:HOME}/corpus.txt"]),
    "export dir under an unexpanded home": (["mode=export", "checkpoint=final", "export.dir='~/models/base'"], ["export.dir='~/models/base'", "nothing expands"]),
    "precision value set by hand": (["mode=plan", "precision.value=16-mixed"], ["precision.value='16-mixed'", "precision=bf16|fp16|fp32|auto"]),
    "guard halvings zero": (["mode=plan", "guard.loss_scale_halvings=0"], ["guard.loss_scale_halvings=0", ">= 1"]),
    "guard spike factor below one": (["mode=plan", "guard.grad_spike_factor=0.5"], ["guard.grad_spike_factor=0.5", "above 1"]),
    "guard spike warmup negative": (["mode=plan", "guard.grad_spike_warmup=-1"], ["guard.grad_spike_warmup=-1", ">= 0"]),
    "guard unknown policy": (["mode=plan", "guard.nonfinite=ignore"], ["guard.nonfinite=ignore", "expected one of [skip, stop]"]),
    "preflight unknown level": (["mode=plan", "preflight.vocab=maybe"], ["preflight.vocab=maybe", "expected one of [error, warn, off]"]),
    # deepspeed_overrides against parallel=
    "override changes the zero stage": (["mode=plan", *ZERO2, "+parallel.deepspeed_overrides.zero_optimization.stage=3"], ["parallel.deepspeed_overrides.zero_optimization.stage=3", "contradicts parallel=zero2", "parallel=zero3"]),
    "override under a non-deepspeed strategy": (["mode=plan", "+parallel.deepspeed_overrides.zero_optimization.stage=3"], ["parallel.deepspeed_overrides=", "parallel=single does not run DeepSpeed"]),
    "override under ddp": (["mode=plan", "parallel=ddp", "+parallel.deepspeed_overrides.gradient_clipping=0.5"], ["parallel.deepspeed_overrides=", "parallel=ddp does not run DeepSpeed"]),
    "override adds optimizer offload": (["mode=plan", *ZERO2, "+parallel.deepspeed_overrides.zero_optimization.offload_optimizer.device=cpu"], ["parallel.deepspeed_overrides.zero_optimization.offload_optimizer=", "parallel=zero2_offload"]),
    "override adds parameter offload": (["mode=plan", "parallel=zero3", "hardware.gpu=A100", "+parallel.deepspeed_overrides.zero_optimization.offload_param.device=cpu"], ["zero_optimization.offload_param=", "parallel=zero3_offload"]),
    "override DeepSpeed rejects": (["mode=plan", *ZERO2, "+parallel.deepspeed_overrides.train_micro_batch_size_per_gpu=3"], ["parallel.deepspeed_overrides.train_micro_batch_size_per_gpu=3", "DeepSpeed rejects"]),
    "override enabling fp16 under bf16": (["mode=plan", *ZERO2, "+parallel.deepspeed_overrides.fp16.enabled=true"], ["parallel.deepspeed_overrides.fp16.enabled=true", "cannot be simultaneously enabled"]),
    # the run directory
    "run name with dot dot": (["mode=plan", "run.root={F}/runs", "run.name=../escape"], ["run.name='../escape'", "must name a folder under run.root", "run.root=<folder>"]),
    "run name with dot dot inside": (["mode=plan", "run.root={F}/runs", "run.name=a/../../escape"], ["run.name='a/../../escape'", "must name a folder under run.root"]),
    "run name absolute": (["mode=plan", "run.root={F}/runs", "run.name=/tmp/elsewhere"], ["run.name='/tmp/elsewhere'", "must name a folder under run.root"]),
    "run name in the home folder": (["mode=plan", "run.root={F}/runs", "run.name='~/elsewhere'"], ["run.name='~/elsewhere'", "must name a folder under run.root"]),
    "run name dot dot alone": (["mode=plan", "run.root={F}/runs", "run.name=.."], ["run.name='..'", "must name a folder under run.root"]),
    "run name dot": (["mode=plan", "run.root={F}/runs", "run.name=."], ["run.name='.'", "must name a folder under run.root"]),
    "run name empty": (["mode=plan", "run.root={F}/runs", "run.name=''"], ["run.name=''", "must name a folder under run.root"]),
    "run root is a file": (["mode=plan", "run.root={F}/a_file", "run.name=x"], ["hydra.run.dir", "{F}/a_file/x", "Not a directory", "Fix: choose a writable folder"]),
    "run dir is a file": (["mode=plan", "hydra.run.dir={F}/a_file"], ["hydra.run.dir", "{F}/a_file", "File exists", "Fix:"]),
    # unknown keys and options
    "unknown nested key": (["mode=plan", "+trainer.lrr=1"], ["trainer.lrr=1", "not a tinytrain config key", "did you mean trainer.lr?"]),
    "unknown deeper key": (["mode=plan", "+model.foo.bar=1"], ["model.foo=", "not a tinytrain config key", "hidden_size"]),
    "unknown top-level key": (["mode=plan", "+lr=1"], ["lr=1", "not a tinytrain config key"]),
    "misspelled nested key": (["mode=plan", "trainer.warmup=3"], ["trainer.warmup=3", "Did you mean 'warmup_steps'"]),
    "misspelled model key": (["mode=plan", "model.hiden_size=128"], ["model.hiden_size=128", "Did you mean 'hidden_size'"]),
    "plus on an existing key": (["mode=plan", "+trainer.lr_schedule=wsd"], ["+trainer.lr_schedule=wsd", "trainer.lr_schedule is already a config key", "Fix: drop the '+': trainer.lr_schedule=wsd"]),
    "misspelled key in a mixture source": (["mode=plan", "data=mixture", "data.sources=[{path:{F}/good.txt,wieght:1}]"], ["'wieght' is not a key of a data.sources entry", "Did you mean 'weight'", "Valid keys there: path, weight, source, text_field, name"]),
    "unknown logger in a list": (["mode=plan", "logger=[csv,mlflow]"], ["logger=mlflow", "Available: csv, tensorboard, wandb"]),
    "unknown experiment": (["mode=plan", "experiment=smok"], ["experiment='smok'", "available: dpo_smoke, long_context, smoke, tinyllama_pretrain"]),
    "unknown mode": (["mode=plna"], ["mode=plna", "expected one of [train, plan, prepare, sbatch, export, generate, eval, average, health, doctor]"]),
    "unparsable override": (["tokenizer.add_special_tokens=[<|x|>]"], ["could not parse", "add_special_tokens"]),
    # special tokens
    "special token empty": (["mode=plan", 'tokenizer.add_special_tokens=[""]'], ["tokenizer.add_special_tokens=['']", "blank token"]),
    "special token blank": (["mode=plan", 'tokenizer.add_special_tokens=[" "]'], ["tokenizer.add_special_tokens=[' ']", "blank token"]),
    "special token twice": (["mode=plan", 'tokenizer.add_special_tokens=["<a>","<a>"]'], ["tokenizer.add_special_tokens=['<a>', '<a>']", "more than once"]),
    "special token already in the vocab": (["mode=plan", 'tokenizer.add_special_tokens=["the"]'], ["tokenizer.add_special_tokens=['the']", "already an ordinary token"]),
    "chatml markers missing": (["mode=plan", "data=chat"], ["data.chat_template='chatml'", "tokenizer.add_special_tokens"]),
    # wandb
    "wandb project empty": (["mode=plan", "logger=wandb", "logger.wandb_project=''"], ["logger.wandb_project=''", "is empty"]),
    "wandb mode invalid": (["mode=plan", "logger=wandb"], ["WANDB_MODE='ofline'", "not a wandb mode", "WANDB_MODE=offline"]),
    # Hydra's command line: '~' on the root, a group set to null, a ${...} that does not resolve (tracebacks, exit 1)
    "top-level key removed": (["mode=plan", "~seed"], ["seed=null: was removed with '~seed'", "drop '~seed'"]),
    "settings group removed": (["mode=plan", "~run"], ["'~run'", "drop '~run'"]),
    "config group set to null": (["mode=plan", "model=null"], ["model=null: a config group takes one of its options", "tinyllama_1b"]),
    "interpolation to no key": (["mode=plan", "trainer.lr=${oops}"], ["trainer.lr=${oops}: cannot resolve trainer.lr", "Interpolation key 'oops' not found"]),
    "interpolation of the wrong type": (["mode=plan", "trainer.max_steps=${oc.env:TT_UNSET_VAR,abc}"], ["cannot resolve trainer.max_steps", "could not be converted to Integer"]),
    "a config's variable of the wrong type": (["mode=plan", "cluster=slurm"], ["cluster.nodes: cannot resolve it", "SLURM_NNODES", "Value 'abc'"]),
    "interpolation to an unset variable": (["mode=plan", "run.name=${oc.env:TT_UNSET_VAR}"], ["run.name=${oc.env:TT_UNSET_VAR}", "TT_UNSET_VAR' not found"]),
    "rank variable that is no number": (["mode=plan"], ["LOCAL_RANK='x'", "is not a rank", "unset LOCAL_RANK"]),
    "wandb online without a key": (["logger=wandb"], ["logger='wandb'", "no API key", "WANDB_MODE=offline"]),
    # tokenizer
    "tokenizer missing": (["mode=plan", "tokenizer=hf", "tokenizer.path={F}/no_tokenizer"], ["tokenizer.path='{F}/no_tokenizer'", "no such file or folder"]),
    "tokenizer folder without files": (["mode=plan", "tokenizer=hf", "tokenizer.path={F}/empty_dir"], ["tokenizer.path='{F}/empty_dir'", "folder has no tokenizer.json"]),
    "tokenizer.json corrupt in a folder": (["mode=plan", "tokenizer=hf", "tokenizer.path={F}/corrupt_tokenizer"], ["tokenizer.path='{F}/corrupt_tokenizer'", "could not load tokenizer folder"]),
    "tokenizer.json corrupt as a file": (["mode=plan", "tokenizer=hf", "tokenizer.path={F}/tokenizer.json"], ["tokenizer.path='{F}/tokenizer.json'", "could not load tokenizer file"]),
    "tokenizer.model random bytes": (["mode=plan", "tokenizer=llama2", "tokenizer.path={F}/random/tokenizer.model"], ["tokenizer.path='{F}/random/tokenizer.model'", "not a SentencePiece model"]),
    "tokenizer.model missing": (["mode=plan", "tokenizer=llama2", "tokenizer.path={F}/missing/tokenizer.model"], ["tokenizer.path='{F}/missing/tokenizer.model'", "no such file"]),
    # data
    "text file missing": (["mode=plan", "data=text", "data.path={F}/missing.txt"], ["data.path='{F}/missing.txt'", "no such file or folder"]),
    "text file empty": (["mode=plan", "data=text", "data.path={F}/empty.txt"], ["data.path='{F}/empty.txt'", "is empty"]),
    "text folder of empty files": (["mode=plan", "data=text", "data.path={F}/empty_texts"], ["data.path='{F}/empty_texts'", "holds only empty files"]),
    "text folder without text files": (["mode=plan", "data=text", "data.path={F}/empty_dir"], ["data.path='{F}/empty_dir'", "folder holds no readable shard (read: .txt, .txt.gz"]),
    "text not UTF-8": (["mode=prepare", "data=text", "data.path={F}/latin1.txt"], ["{F}/latin1.txt:1", "not UTF-8", "convert the file to UTF-8"]),
    "glob matching nothing": (["mode=plan", "data=jsonl", "data.path={F}/shards/*.jsonl.zst"], ["data.path='{F}/shards/*.jsonl.zst'", "the glob matches no files", "quote it"]),
    "unknown compression suffix": (["mode=plan", "data=jsonl", "data.path={F}/shard.jsonl.bz2"], ["data.path='{F}/shard.jsonl.bz2'", "compression .bz2 is not read", "recompress it as .gz or .zst"]),
    "unknown compression in a folder": (["mode=plan", "data=jsonl", "data.path={F}/mixed_codecs"], ["data.path='{F}/mixed_codecs'", "b.jsonl.xz: compression .xz is not read"]),
    "folder without a readable shard": (["mode=plan", "data=jsonl", "data.path={F}/no_shards"], ["data.path='{F}/no_shards'", "folder holds no readable shard"]),
    "truncated zstd shard": (["mode=prepare", "data=jsonl", "data.text_field=text", "data.path={F}/cut.jsonl.zst"], ["{F}/cut.jsonl.zst:", "damaged compressed shard", "truncated", "download or copy the shard again"]),
    "truncated gzip shard": (["mode=prepare", "data=jsonl", "data.text_field=text", "data.path={F}/cut.json.gz"], ["{F}/cut.json.gz:", "damaged compressed shard", "EOFError", "bad_records=skip"]),
    "prepare part out of range": (["mode=prepare", "data=text", "data.path={F}/empty_texts/../lines.txt", "data.prepare_parts=1", "data.prepare_part=1"], ["data.prepare_part=1", "out of range", "between 0 and 0"]),
    "prepare part outside mode=prepare": (["mode=plan", "data=text", "data.path={F}/lines.txt", "data.prepare_part=0"], ["data.prepare_part=0", "it is for mode=prepare"]),
    "more parts than shard files": (["mode=plan", "data=text", "data.path={F}/lines.txt", "data.prepare_parts=3"], ["data.prepare_parts=3", "has 1 shard file(s)", "data.prepare_parts<=1"]),
    "parts for SFT data": (["mode=plan", "data=alpaca", "data.prepare_parts=2"], ["data.prepare_parts=2", "SFT data is not a token store"]),
    "store with a missing part": (["mode=plan", "data.store={F}/cache/stores/half"], ["data.store='{F}/cache/stores/half'", "part(s) 1 of 2 not built", "data.prepare_part=1"]),
    "store part deleted after the build": (["mode=plan", "data.store={F}/parted/stores/built"], ["data.store='{F}/parted/stores/built'", "part(s) 1 of 2 deleted since the store was built", "Fix: build it again: python -m tinytrain mode=prepare data.source=text data.path={F}/parted_text ", "data.cache_dir={F}/parted ", "data.prepare_parts=2 data.prepare_part=1"]),
    "validation file missing": (["mode=plan", "data=text", "data.path={F}/good.txt", "data.val_path={F}/missing_val.txt"], ["data.val_path='{F}/missing_val.txt'", "no such file"]),
    "val fraction zero": (["mode=plan", "data.val_fraction=0"], ["data.val_fraction=0.0", "between 0 and 1"]),
    "val fraction above one": (["mode=plan", "data.val_fraction=1.5"], ["data.val_fraction=1.5", "between 0 and 1"]),
    "pydoc with a validation path": (["mode=plan", "data.val_path=x.txt"], ["data.val_path='x.txt'", "remove data.val_path"]),
    "token store missing": (["mode=plan", "data.store={F}/empty_dir"], ["data.store='{F}/empty_dir'", "not a token store"]),
    "workers negative": (["mode=plan", "data.num_workers=-1"], ["data.num_workers=-1", ">= 0"]),
    "tokenize workers negative": (["mode=plan", "data.tokenize_workers=-2"], ["data.tokenize_workers=-2", ">= 0"]),
    "pad multiple zero": (["mode=plan", "data.pad_to_multiple_of=0"], ["data.pad_to_multiple_of=0", ">= 1"]),
    "jsonl file missing": (["mode=plan", "data=jsonl", "data.path={F}/missing.jsonl"], ["data.path='{F}/missing.jsonl'", "no such file"]),
    "jsonl line not JSON": (["mode=prepare", "data=jsonl", "data.path={F}/broken.jsonl"], ["{F}/broken.jsonl:2", "bad_records=skip"]),
    "SFT record without output": (["mode=prepare", "data=alpaca", "data.path={F}/no_output.jsonl"], ["{F}/no_output.jsonl:1", "missing field 'output'"]),
    "SFT responses mostly empty": (["mode=prepare", "data=alpaca", "data.path={F}/empty_outputs.jsonl"], ["data.path='{F}/empty_outputs.jsonl'", "19 of 20 examples have an empty response", "fill in the responses"]),
    "chat record without messages": (["mode=prepare", "data=chat", 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]', "data.path={F}/no_messages.jsonl"], ["{F}/no_messages.jsonl:1", "messages"]),
    "SFT from a text source": (["mode=plan", "data=text", "data.path={F}/good.txt", "data.format=instruction"], ["data.format='instruction'", "data.source=jsonl"]),
    # weighted mixtures (data.sources)
    "mixture weight zero": (["mode=plan", "data=mixture", "data.sources=[{path:{F}/good.txt,weight:0}]"], ["data.sources[0].weight=0.0", "must be a positive number", "Fix: use e.g. weight: 0.7"]),
    "mixture weight negative": (["mode=plan", "data=mixture", "data.sources=[{path:{F}/good.txt,weight:1},{path:{F}/good.txt,weight:-0.5,name:b}]"], ["data.sources[1].weight=-0.5", "must be a positive number"]),
    "mixture weight infinite": (["mode=plan", "data=mixture", "data.sources=[{path:{F}/good.txt,weight:inf}]"], ["data.sources[0].weight=inf", "must be a positive number"]),
    "mixture weight a word": (["mode=plan", "data=mixture", "data.sources=[{path:{F}/good.txt,weight:heavy}]"], ["data.sources=[{path:{F}/good.txt,weight:heavy}]", "wrong value for 'weight'", "could not be converted to Float"]),
    "mixture weight missing": (["mode=plan", "data=mixture", "data.sources=[{path:{F}/good.txt}]"], ["data.sources[0].weight=null", "every mixture source needs a weight"]),
    "mixture path missing": (["mode=plan", "data=mixture", "data.sources=[{weight:1}]"], ["data.sources[0].path=null", "every mixture source needs a file or folder"]),
    "mixture source not found": (["mode=plan", "data=mixture", "data.sources=[{path:{F}/missing.txt,weight:1}]"], ["data.sources[0].path='{F}/missing.txt'", "no such file or folder"]),
    "mixture source empty": (["mode=plan", "data=mixture", "data.sources=[{path:{F}/good.txt,weight:1},{path:{F}/empty.txt,weight:1}]"], ["data.sources[1].path='{F}/empty.txt'", "is empty"]),
    "mixture source of blank lines": (["mode=plan", "data=mixture", "data.cache_dir={F}/cache", "data.sources=[{path:{F}/blank.txt,weight:1},{path:{F}/good.txt,weight:1}]"], ["{F}/blank.txt", "empty file"]),
    "mixture next to data.path": (["mode=plan", "data=text", "data.sources=[{path:{F}/good.txt,weight:1}]"], ["data.path=", "ambiguous", "data.path=null"]),
    "mixture next to data.val_path": (["mode=plan", "data=mixture", "data.val_path={F}/good.txt", "data.sources=[{path:{F}/good.txt,weight:1}]"], ["data.val_path='{F}/good.txt'", "splits validation off each source"]),
    "mixture names repeated": (["mode=plan", "data=mixture", "data.sources=[{path:{F}/good.txt,weight:1},{path:{F}/good.txt,weight:2}]"], ["data.sources[1].name='good'", "data.sources[0] has this name too"]),
    "mixture SFT from a text source": (["mode=plan", "data=mixture", "data.format=instruction", "data.sources=[{path:{F}/good.txt,weight:1}]"], ["data.sources[0].source='text'", "SFT records"]),
    "mixture source too small for the first step": (["mode=plan", "data=mixture", "data.exhaustion=stop", "data.seq_len=8", "data.cache_dir={F}/cache", "data.sources=[{path:{F}/lines.txt,weight:1},{path:{F}/few.txt,weight:100}]"], ["data.sources[1].path='{F}/few.txt'", "mixture source 'few' holds 2 training items, fewer than the first step draws from it (8 sequences a step)", "data.exhaustion=repeat"]),
    "mixture unknown exhaustion": (["mode=plan", "data=mixture", "data.exhaustion=drop"], ["data.exhaustion=drop", "expected one of [repeat, stop]"]),
    # checkpoints and resuming
    "init_from missing": (["mode=plan", "checkpoint.init_from={F}/missing.ckpt"], ["checkpoint.init_from='{F}/missing.ckpt'", "no such checkpoint file"]),
    "init_from a folder": (["mode=plan", "checkpoint.init_from={F}/empty_dir"], ["checkpoint.init_from='{F}/empty_dir'", "no such checkpoint file"]),
    "init_from a text file": (["mode=plan", "checkpoint.init_from={F}/good.txt"], ["checkpoint.init_from='{F}/good.txt'", "not a PyTorch checkpoint file"]),
    "init_from a tensor, not a dict": (["mode=plan", "checkpoint.init_from={F}/tensor.ckpt"], ["checkpoint.init_from='{F}/tensor.ckpt'", "not a dict"]),
    "init_from without tinytrain metadata": (["mode=plan", "checkpoint.init_from={F}/plain_dict.ckpt"], ["checkpoint.init_from='{F}/plain_dict.ckpt'", "no tinytrain metadata"]),
    "init_from another model size": (["mode=plan", "checkpoint.init_from={F}/small_model.ckpt"], ["checkpoint.init_from='{F}/small_model.ckpt'", "another model size: num_layers 2, hidden_size 64", "this run's model: num_layers 4, hidden_size 192", "model.* overrides"]),
    "init_from a DeepSpeed folder missing a shard": (["mode=plan", "checkpoint.init_from={F}/ds_missing.ckpt"], ["checkpoint.init_from='{F}/ds_missing.ckpt'", "DeepSpeed save over 2 data-parallel rank(s)", "checkpoint/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt is missing", "2 of the 3 files are there", "Fix: copy the whole step folder again"]),
    "resume a DeepSpeed folder missing a shard": (["mode=plan", "parallel=zero2", "hardware.gpu=A100", "resume={F}/ds_missing.ckpt"], ["resume='{F}/ds_missing.ckpt'", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt is missing"]),
    "resume missing": (["mode=plan", "resume={F}/missing.ckpt"], ["resume='{F}/missing.ckpt'", "neither auto, never"]),
    "resume from a text file": (["mode=plan", "resume={F}/good.txt"], ["resume='{F}/good.txt'", "not a PyTorch checkpoint file"]),
    "init_from a newer tinytrain's checkpoint": (["mode=plan", "checkpoint.init_from={F}/newer.ckpt"], ["checkpoint.init_from='{F}/newer.ckpt'", "was saved by tinytrain 9.9 (checkpoint metadata version 99; this tinytrain reads up to 1)", "Fix: upgrade tinytrain"]),
    "resume from a newer tinytrain's checkpoint": (["mode=plan", "resume={F}/newer.ckpt"], ["resume='{F}/newer.ckpt'", "was saved by tinytrain 9.9", "Fix: upgrade tinytrain"]),
    "resume from another model size": (["mode=plan", "resume={F}/small_model.ckpt"], ["resume='{F}/small_model.ckpt'", "another model size"]),
    "resume a word": (["mode=plan", "resume=latest"], ["resume='latest'", "resume=auto"]),
    "pretrained folder missing": (["mode=plan", "model.pretrained={F}/missing_model"], ["model.pretrained='{F}/missing_model'", "no config.json"]),
    "pretrained config.json broken": (["mode=plan", "model.pretrained={F}/broken_model"], ["model.pretrained='{F}/broken_model'", "cannot read its config.json"]),
    "pretrained config.json without a model type": (["mode=plan", "model.pretrained={F}/typeless_model"], ["model.pretrained='{F}/typeless_model'", "cannot read its config.json"]),
    "pretrained config.json with a field of the wrong type": (["mode=plan", "model.pretrained={F}/mistyped_model"], ["model.pretrained='{F}/mistyped_model'", "cannot read its config.json", "hidden_size"]),
    # finetune=lora|qlora
    "lora without a base model": (["mode=plan", "finetune=lora"], ["model.pretrained=null", "finetune=lora adapts a base model", "Fix: set model.pretrained="]),
    # qlora quantizes its base while loading a Hugging Face folder: the fix named checkpoint.init_from, which qlora refuses.
    "qlora without a base model": (["mode=plan", "finetune=qlora"], ["model.pretrained=null", "finetune=qlora adapts a base model and model.pretrained names none", "Fix: set model.pretrained=<Hugging Face folder> (a tinytrain checkpoint: export it with mode=export, then model.pretrained=<its hf_export folder>), or use finetune=full"]),
    "lora rank zero": (["mode=plan", "finetune=lora", "finetune.rank=0"], ["finetune.rank=0", ">= 1", "finetune.rank=16"]),
    "lora alpha zero": (["mode=plan", "finetune=lora", "finetune.alpha=0"], ["finetune.alpha=0.0", "positive", "finetune.alpha=32"]),
    "lora dropout one": (["mode=plan", "finetune=lora", "finetune.dropout=1"], ["finetune.dropout=1.0", "[0, 1)"]),
    "lora target module twice": (["mode=plan", "finetune=lora", "finetune.target_modules=[q_proj,q_proj]"], ["finetune.target_modules=['q_proj', 'q_proj']", "names a projection more than once", "finetune.target_modules=[q_proj]"]),
    "lora unknown target module": (["mode=plan", "finetune=lora", "finetune.target_modules=[q_proj,qkv_proj]"], ["finetune.target_modules=['q_proj', 'qkv_proj']", "unknown projection(s) qkv_proj", "Fix: pick from q_proj"]),
    "lora under fsdp_tp": (["mode=plan", "finetune=lora", "parallel=fsdp_tp", "cluster.devices=2", "parallel.tp=2"], ["parallel='fsdp_tp'", "peft does not shard them", "Fix: use parallel=ddp, zero2 or zero3"]),
    "lora under zero1": (["mode=plan", "finetune=lora", "parallel=zero1", "hardware.gpu=A100"], ["parallel='zero1'", "ZeRO-1 checkpoints leave the frozen base out", "Fix: use parallel=zero2"]),
    "qlora under deepspeed": (["mode=plan", "finetune=qlora", *ZERO2], ["parallel='zero2'", "finetune=qlora runs on single or ddp", "Fix: use parallel=single or parallel=ddp"]),
    "qlora trained on a CPU": (["finetune=qlora"], ["finetune='qlora'", "needs a CUDA GPU", "Fix: plan it here with mode=plan", "finetune=lora"]),
    "dpo beta infinite": (["mode=plan", "experiment=dpo_smoke", "finetune.beta=inf"], ["finetune.beta=inf", "must be positive and finite", "Fix: use e.g. finetune.beta=0.1"]),
    "dpo beta nan": (["mode=plan", "experiment=dpo_smoke", "finetune.beta=nan"], ["finetune.beta=nan", "must be positive and finite"]),
    "simpo gamma infinite": (["mode=plan", "experiment=dpo_smoke", "finetune.objective=simpo", "finetune.simpo_gamma=inf"], ["finetune.simpo_gamma=inf", "finite"]),
    "lora alpha infinite": (["mode=plan", "finetune=lora", "finetune.alpha=inf"], ["finetune.alpha=inf", "positive and finite"]),
    "too_long skip drops every preference pair": (["mode=prepare", "experiment=dpo_smoke", "data.path={F}/long_pairs.jsonl", "data.seq_len=16", "data.too_long=skip", "data.cache_dir={F}/cache"], ["no usable preference pairs", "20 skipped as longer than 16", "raise data.seq_len (now 16; the longest pair skipped has", "keeps every pair", "data.too_long=truncate"]),
    "unknown finetune option": (["mode=plan", "finetune=dora"], ["finetune=dora", "full, lora, qlora"]),
    # downstream evaluation (eval.tasks, issue 36): lm-eval resolves the names before any weights
    "eval task unknown": ([*EVALS, "eval.tasks=[tiny_mcq]"], ["eval.tasks='tiny_mcq'", "is no lm-eval task, group or tag", "did you mean 'tiny_mc'?"]),
    "eval include folder empty": ([*EVALS[:2], "eval.include=[{F}/evals/empty]"], ["eval.include[0]='{F}/evals/empty'", "holds no task YAML", "Fix: write the task's YAML there"]),
    "eval include folder missing": ([*EVALS[:2], "eval.include=[{F}/evals/none]"], ["eval.include[0]='{F}/evals/none'", "no such folder"]),
    "eval task data file missing": ([*EVALS, "eval.tasks=[tiny_missing]"], ["eval.tasks='tiny_missing'", "its data file", "does not exist", "Fix: give it local data"]),
    "eval task data on an unreachable hub": ([*EVALS, "eval.tasks=[tiny_hub]"], ["eval.tasks='tiny_hub'", "hub dataset 'nobody/no_such_dataset'", "the hub is not reachable", "Fix:"]),
    "eval task template names a missing field": ([*EVALS, "eval.tasks=[tiny_undefined]"], ["eval.tasks='tiny_undefined'", "tiny_undefined.yaml does not render its first document: UndefinedError: 'quest' is undefined", "Fix: name the data's fields"]),
    "eval task data file broken": ([*EVALS, "eval.tasks=[tiny_broken_data]"], ["eval.tasks='tiny_broken_data'", "broken.jsonl", "does not load: ArrowInvalid: JSON parse error", "Fix: correct the data file"]),
    "eval task YAML that does not parse": ([*EVALS[:1], "eval.tasks=[tiny_unparsed]", "eval.include=[{F}/evals/unparsed]"], ["eval.tasks='tiny_unparsed'", "lm-eval skipped {F}/evals/unparsed/tiny_unparsed.yaml, which names it: it does not load (ScannerError: while scanning a quoted scalar", "Fix: correct that YAML"]),
    "eval task output type misspelt": ([*EVALS, "eval.tasks=[tiny_typo]"], ["eval.tasks='tiny_typo'", "tiny_typo.yaml says output_type: multiple_choise, which is none of lm-eval's (loglikelihood, multiple_choice", "Fix: set output_type: multiple_choice"]),
    "eval generation task inline": ([*EVALS, "eval.tasks=[tiny_gen]"], ["eval.tasks='tiny_gen'", "is a generate_until task", "inline scoring serves log-likelihood", "Fix: drop it from eval.tasks"]),
    "eval limit zero": ([*EVALS, "eval.limit=0"], ["eval.limit=0", "must be >= 1"]),
    "eval every zero steps": ([*EVALS, "eval.every_n_steps=0"], ["eval.every_n_steps=0", "must be >= 1"]),
    "eval every steps at the end only": ([*EVALS, "eval.every_n_steps=10", "eval.at=end"], ["eval.every_n_steps=10", "contradicts eval.at=end", "Fix:"]),
    "eval job account with a newline": ([*EVALS, "eval.where=slurm", "cluster.account='acct\n#SBATCH --nodes=64'"], ["cluster.account='acct\\n#SBATCH --nodes=64'", "holds a newline or other control character", "Fix: use the account's name"]),
    "eval every steps off the checkpoints on slurm": ([*EVALS, "eval.where=slurm", "eval.every_n_steps=30"], ["eval.every_n_steps=30", "eval.where=slurm scores saved checkpoints", "Fix: use a multiple of 100"]),
    "eval job account with a space": ([*EVALS, "eval.where=slurm", "cluster.account='acct --nodes=64'"], ["cluster.account='acct --nodes=64'", "holds whitespace", "Fix: use the account's name"]),
    "eval job time Slurm cannot read": ([*EVALS, "eval.where=slurm", "cluster.time=1h"], ["cluster.time='1h'", "is not a Slurm time limit (each eval job asks for it)", "Fix: use minutes"]),
    "eval with context parallelism": ([*EVALS, "parallel=zero2", "cluster.devices=2", "parallel.cp=2", "parallel.deepspeed_on_cpu=true"], ["eval.tasks=['tiny_mc']", "does not split sequences over parallel.cp=2"]),
    "eval of a run without checkpoints": (["mode=eval", "checkpoint.path={F}/evals/empty_run", *EVALS[1:]], ["checkpoint.path='{F}/evals/empty_run'", "holds no checkpoint to score", "Fix: train the run first"]),
    "eval of a run without tasks": (["mode=eval", "checkpoint.path={F}/evals/empty_run"], ["eval.tasks=[]", "neither eval.tasks nor the run's config names any", "Fix: add eval.tasks="]),
    "eval old key": (["mode=plan", "eval.lm_eval_tasks=[tiny_mc]"], ["eval.lm_eval_tasks=['tiny_mc']", "is renamed eval.tasks", "Fix: use eval.tasks="]),
}
ENV = {
    "wandb mode invalid": {"WANDB_MODE": "ofline"},
    "rank variable that is no number": {"LOCAL_RANK": "x", "WORLD_SIZE": "2"},
    "a stray RANK beside WORLD_SIZE under Lightning's launcher": {"RANK": "0", "WORLD_SIZE": "2"},
    "a stray NODE_RANK on one node": {"NODE_RANK": "1"},
    "a stray MASTER_ADDR on one node": {"MASTER_ADDR": "10.255.255.1"},
    "torchrun's world not the plan's": {"TORCHELASTIC_RUN_ID": "t1", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"},
    "a config's variable of the wrong type": {"SLURM_NNODES": "abc"},
    "eval task data on an unreachable hub": {"HF_HUB_OFFLINE": "1"},
    "CPU run over the job's host memory": {"SLURM_MEM_PER_NODE": "4096"},
    "two CPU processes over the job's --mem-per-cpu": {"SLURM_MEM_PER_CPU": "2048", "SLURM_CPUS_ON_NODE": "2"},
}


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """A folder of bad files: the `{F}` of the cases."""
    import torch

    f = tmp_path_factory.mktemp("bad_inputs")
    (f / "a_file").write_text("a regular file where a folder should be\n")
    (f / "empty.txt").write_text("")
    (f / "blank.txt").write_text("\n  \n\n")
    (f / "lines.txt").write_text("\n\n".join(f"Line number {i} of a longer text." for i in range(30)))
    (f / "few.txt").write_text("\n\n".join(f"A short document, number {i}." for i in range(3)))
    (f / "empty_texts").mkdir()
    (f / "empty_texts" / "a.txt").write_text("")
    (f / "empty_dir").mkdir()
    (f / "good.txt").write_text("A document.\n\nAnother document.\n")
    (f / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    shard = "".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(2000)).encode()
    import gzip

    import zstandard

    packed = zstandard.ZstdCompressor().compress(shard)
    (f / "cut.jsonl.zst").write_bytes(packed[: len(packed) // 2])
    packed = gzip.compress(shard)
    (f / "cut.json.gz").write_bytes(packed[: len(packed) // 2])
    (f / "shard.jsonl.bz2").write_bytes(b"BZh9")
    (f / "mixed_codecs").mkdir()
    (f / "mixed_codecs" / "a.jsonl").write_text('{"text": "fine"}\n')
    (f / "mixed_codecs" / "b.jsonl.xz").write_bytes(b"\xfd7zXZ")
    (f / "cache" / "stores" / "half").mkdir(parents=True)
    (f / "cache" / "parts" / "aaaa").mkdir(parents=True)
    (f / "cache" / "parts" / "aaaa" / "meta.json").write_text("{}")
    (f / "cache" / "stores" / "half" / "parts.json").write_text(json.dumps({"parts": [{"index": 0, "key": "aaaa"}, {"index": 1, "key": "bbbb"}]}))
    (f / "no_shards").mkdir()
    (f / "no_shards" / "README.md").write_text("shards go here\n")
    (f / "broken.jsonl").write_text('{"instruction": "q", "output": "a"}\n{"instruction": \n')
    (f / "corrupt_tokenizer").mkdir()
    (f / "corrupt_tokenizer" / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    (f / "tokenizer.json").write_text('{"broken": ')
    (f / "random").mkdir()
    (f / "random" / "tokenizer.model").write_bytes(bytes(range(256)) * 8)
    records = [{"instruction": f"question {i}", "input": "", "output": "" if i else "yes"} for i in range(20)]
    (f / "empty_outputs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (f / "no_output.jsonl").write_text(json.dumps({"instruction": "q"}) + "\n")
    pairs = [{"prompt": f"question {i} " + "word " * 30, "chosen": "yes " * 10, "rejected": "no " * 10} for i in range(20)]
    (f / "long_pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    (f / "no_messages.jsonl").write_text(json.dumps({"conversation": []}) + "\n")
    unpaired = [{"prompt": f"question {i}", "completion": f"answer {i}", "label": i % 2 == 0} for i in range(20)]
    (f / "kto_no_label.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "label" or i != 3}) + "\n" for i, r in enumerate(unpaired)))
    (f / "kto_all_true.jsonl").write_text("".join(json.dumps({**r, "label": True}) + "\n" for r in unpaired))
    (f / "broken_model").mkdir()
    (f / "broken_model" / "config.json").write_text("{not json")
    (f / "typeless_model").mkdir()
    (f / "typeless_model" / "config.json").write_text('{"hidden_size": 64}')
    (f / "mistyped_model").mkdir()  # a traceback from transformers' strict config fields
    (f / "mistyped_model" / "config.json").write_text('{"model_type": "llama", "hidden_size": "64"}')
    # Shapes of a 7B and a 34B Llama, config.json alone (planning reads no weights).
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096).save_pretrained(f / "shape_7b")
    LlamaConfig(hidden_size=8192, intermediate_size=22016, num_hidden_layers=48, num_attention_heads=64, num_key_value_heads=8, vocab_size=32000, max_position_embeddings=16384).save_pretrained(f / "shape_34b")
    torch.save(torch.zeros(3), f / "tensor.ckpt")
    torch.save({"state_dict": {}}, f / "plain_dict.ckpt")
    small_model_checkpoint(f / "small_model.ckpt")
    newer = torch.load(f / "small_model.ckpt", weights_only=True)
    newer["tinytrain"] |= {"metadata_version": 99, "tinytrain_version": "9.9"}  # as a later tinytrain would write it
    torch.save(newer, f / "newer.ckpt")
    parted_store(f)
    # A ZeRO-2 bf16 step folder of 2 ranks whose rank 1 partition was not copied.
    (f / "ds_missing.ckpt" / "checkpoint").mkdir(parents=True)
    meta = torch.load(f / "small_model.ckpt", weights_only=True)["tinytrain"]
    torch.save({"global_step": 4, "tinytrain": meta, "dp_world_size": 2, "mp_world_size": 1}, f / "ds_missing.ckpt" / "checkpoint" / "mp_rank_00_model_states.pt")
    torch.save({}, f / "ds_missing.ckpt" / "checkpoint" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    # The same folder whole, its metadata saying so: a ZeRO-2 save over 2 data-parallel ranks.
    shutil.copytree(f / "ds_missing.ckpt", f / "ds_two_ranks.ckpt")
    layout = {"format": "deepspeed", "strategy": "deepspeed", "world": 2, "dp": 2, "tp": 1, "zero_stage": 2}
    torch.save({"global_step": 4, "tinytrain": {**meta, "layout": layout}, "dp_world_size": 2, "mp_world_size": 1}, f / "ds_two_ranks.ckpt" / "checkpoint" / "mp_rank_00_model_states.pt")
    torch.save({}, f / "ds_two_ranks.ckpt" / "checkpoint" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")
    eval_tasks(f / "evals")
    return f


def eval_tasks(f: Path) -> None:
    """`{F}/evals/tasks`: lm-eval task YAMLs (one good, one whose data file is gone, one on the hub,
    one generation task, one whose template names a field its data lacks, one whose data has a broken
    line, one with a misspelt output_type); `{F}/evals/unparsed`: a YAML that does not parse;
    `{F}/evals/empty`: a folder without any; `{F}/evals/empty_run`: a run folder without checkpoints."""
    (f / "tasks").mkdir(parents=True)
    (f / "empty").mkdir()
    (f / "empty_run" / "checkpoints").mkdir(parents=True)  # a run folder that saved nothing
    (f / "empty_run" / "config_resolved.yaml").write_text("{}\n")
    (f / "tasks" / "mc.jsonl").write_text(json.dumps({"q": "a", "choices": [" b", " c"], "answer": 0}) + "\n")
    body = "doc_to_text: '{{{{q}}}}'\ndoc_to_target: '{{{{answer}}}}'\n"
    for name, data, output in (("tiny_mc", f"json\ndataset_kwargs:\n  data_files:\n    test: {f / 'tasks' / 'mc.jsonl'}", "multiple_choice\ndoc_to_choice: '{{{{choices}}}}'"), ("tiny_missing", f"json\ndataset_kwargs:\n  data_files:\n    test: {f / 'gone.jsonl'}", "multiple_choice\ndoc_to_choice: '{{{{choices}}}}'"), ("tiny_hub", "nobody/no_such_dataset", "loglikelihood"), ("tiny_gen", f"json\ndataset_kwargs:\n  data_files:\n    test: {f / 'tasks' / 'mc.jsonl'}", "generate_until")):
        (f / "tasks" / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: {data}\ntest_split: test\noutput_type: {output}\n" + body.format())
    (f / "tasks" / "broken.jsonl").write_text(json.dumps({"q": "a", "choices": [" b", " c"], "answer": 0}) + "\n{broken json\n")
    mc = "output_type: multiple_choice\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\ntest_split: test\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: "
    (f / "tasks" / "tiny_undefined.yaml").write_text(f"task: tiny_undefined\ndoc_to_text: '{{{{quest}}}}'\n{mc}{f / 'tasks' / 'mc.jsonl'}\n")
    (f / "tasks" / "tiny_typo.yaml").write_text(f"task: tiny_typo\ndoc_to_text: '{{{{q}}}}'\n{mc.replace('multiple_choice', 'multiple_choise')}{f / 'tasks' / 'mc.jsonl'}\n")
    (f / "unparsed").mkdir()
    (f / "unparsed" / "tiny_unparsed.yaml").write_text("task: tiny_unparsed\ndataset_path: json\ndoc_to_text: \"{{q}}\n  doc_to_choice: [unclosed\n")
    (f / "tasks" / "tiny_broken_data.yaml").write_text(f"task: tiny_broken_data\ndoc_to_text: '{{{{q}}}}'\n{mc}{f / 'tasks' / 'broken.jsonl'}\n")


def parted_store(f: Path) -> None:
    """`{F}/parted/stores/built`: a token store of 2 parts, part 1 deleted after the build."""
    from tests.conftest import compose
    from tinytrain.data import parts
    from tinytrain.data.sources import Source
    from tinytrain.data.tokenizer import load_from_config

    (f / "parted_text").mkdir()
    for i in range(2):
        (f / "parted_text" / f"{i}.txt").write_text(f"Document {i} of a corpus in parts.\n")
    cfg = compose(["data=text", f"data.path={f / 'parted_text'}", f"data.cache_dir={f / 'parted'}", "data.prepare_parts=2", "data.tokenize_workers=0"])
    store, _ = parts.ensure(Source.from_config(cfg.data), cfg.data, load_from_config(cfg.tokenizer), progress=False)
    store.path.rename(store.path.with_name("built"))
    shutil.rmtree(store.parts[1].path)


def small_model_checkpoint(path) -> None:
    """A checkpoint as tinytrain saves it (Lightning's state_dict of the module, tinytrain's vocab
    metadata) of a smaller model than the default `tiny`, with the same tokenizer."""
    import torch

    from tests.conftest import compose
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, model_config
    from tinytrain.plan.planner import make_plan

    cfg = compose(SMALL_MODEL)
    tokenizer = load_from_config(cfg.tokenizer)
    plan = make_plan(cfg, tokenizer, Path(path).parent / "small_run")
    model = build_model(cfg.model, model_config(cfg.model, plan.vocab.padded, tokenizer), plan.attention)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "tinytrain": plan.checkpoint_metadata(), "global_step": 4}, path)


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for var in ("HYDRA_FULL_ERROR", "TINYTRAIN_TRACEBACK", "WANDB_MODE", "WANDB_API_KEY", "SLURM_JOB_ID", "SLURM_PROCID", "MASTER_ADDR", "NODE_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))  # no wandb key from the user's ~/.netrc
    return monkeypatch


def test_the_suite_is_adversarial_enough():
    assert len(CASES) >= 120


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_naming_key_value_and_fix(name, bad, clean_env, tmp_path):
    args, needles = CASES[name]
    for var, value in ENV.get(name, {}).items():
        clean_env.setenv(var, value)
    args = [a.replace("{F}", str(bad)) for a in args]
    if not any(a.startswith(("hydra.run.dir=", "run.root=")) for a in args):
        args.append(f"hydra.run.dir={tmp_path / 'run'}")
    code, err = run_in_process(args)
    assert code == 2, err
    assert "Traceback" not in err
    assert "Fix:" in err, err
    for needle in needles:
        assert needle.replace("{F}", str(bad)) in err, (needle, err)
    # Refused before anything is written: no plan, no checkpoint, nothing outside the run directory.
    assert not (tmp_path / "run" / "plan.json").exists()
    assert not (bad / "escape").exists() and not (bad / "runs" / "a").exists()



@pytest.mark.parametrize(
    ("env", "bad"),
    [({}, "trainer.lr=-1"), ({"LOCAL_RANK": "x", "WORLD_SIZE": "2"}, "trainer.lr=-1"), ({}, "~seed"), ({}, "trainer.lr=${oops}")],
    ids=["a bad key", "a rank that is no number", "a removed key", "an interpolation to no key"],
)
def test_a_refused_command_leaves_no_run_directory(env, bad, clean_env, tmp_path):
    """Refusals before the run lock (the rank, a removed key) or inside the job (a ${...}) came
    before, or around, the unused directory's removal."""
    for var, value in env.items():
        clean_env.setenv(var, value)
    code, err = run_in_process(["mode=plan", bad, f"run.root={tmp_path / 'runs'}"])
    assert code == 2 and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_multirun_s_run_name_that_leaves_run_root_writes_nothing(clean_env, tmp_path):
    """hydra.sweep.dir did not go through run.name's check: multirun.yaml and a job's directory were
    written outside run.root before the refusal."""
    code, err = run_in_process(["-m", "mode=plan", f"run.root={tmp_path / 'runs' / 'sub'}", "run.name=../../escaped"])
    assert code == 2 and "run.name='../../escaped': must name a folder under run.root" in err, err
    assert list(tmp_path.iterdir()) == []



def test_a_local_multirun_of_jobs_with_several_ranks_is_refused_and_a_plan_sweep_is_not(clean_env, tmp_path):
    """Lightning started rank 1 with the whole multirun's command line: it ran a multirun of its own."""
    code, err = run_in_process(["-m", "trainer.lr=1e-3,2e-3", "cluster.devices=2", "parallel=ddp", f"run.root={tmp_path / 'runs'}"])
    assert code == 2 and "cluster.devices=2: gives each job of a local multirun 2 ranks" in err, err
    assert not list((tmp_path / "runs").rglob("plan.json"))
    code, err = run_in_process(["-m", "mode=plan", "trainer.lr=1e-3,2e-3", "cluster.devices=2", "parallel=ddp", "hardware.gpu=A800", f"run.root={tmp_path / 'plans'}"])
    assert code == 0, err


@pytest.fixture
def read_only_root(tmp_path):
    """A folder this process cannot write to: a read-only tmpfs as root (root ignores modes), else mode 0555."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    from tests.conftest import mounted_tmpfs

    with mounted_tmpfs(folder, "ro,size=1m"):
        yield folder


def test_an_unwritable_run_root_is_named(read_only_root, clean_env):
    code, err = run_in_process(["mode=plan", f"run.root={read_only_root}", "run.name=x"])
    assert code == 2 and "Traceback" not in err, err
    assert f"hydra.run.dir: cannot create the run directory {read_only_root / 'x'}" in err
    assert "Fix: choose a writable folder with run.root=<folder>" in err


def test_a_run_directory_on_a_disk_turned_read_only_is_named(clean_env, tmp_path):
    """The run directory exists (a run to resume) on a disk since remounted read-only: Hydra's log
    handler failed to open tinytrain.log and the user got its traceback (exit 1)."""
    import subprocess

    from tests.conftest import mounted_tmpfs

    if os.geteuid() != 0:
        pytest.skip("remounting a tmpfs read-only needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    with mounted_tmpfs(disk, "size=1m"):
        (disk / "runs" / "b").mkdir(parents=True)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        code, err = run_in_process(["mode=plan", f"run.root={disk / 'runs'}", "run.name=b"])
    assert code == 2 and "Traceback" not in err, err
    assert f"hydra.run.dir: cannot write its log in the run directory {disk / 'runs' / 'b' / 'tinytrain.log'}: Read-only file system" in err


def test_every_problem_is_reported_at_once(clean_env, tmp_path):
    code, err = run_in_process(["mode=plan", "model.hidden_size=0", "trainer.lr=-1", "cluster.nodes=0", "guard.loss_scale_halvings=0", f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 2, err
    assert "4 configuration errors" in err
    for key in ("model.hidden_size=0", "trainer.lr=-1.0", "cluster.nodes=0", "guard.loss_scale_halvings=0"):
        assert key in err


# auto at micro batch 4 chooses full: neither none nor selective fits an 8B layer's 8192 tokens
AUTO_CHOOSING_FULL = ["model=llama3_1_8b", "cluster.devices=8", "hardware.gpu=H100", "data.seq_len=8192", "trainer.micro_batch_size=4", "trainer.global_batch_size=64", "trainer.activation_checkpointing=auto"]


@pytest.mark.parametrize(("args", "mode"), [(["trainer.activation_checkpointing=none"], "none"), (["trainer.activation_checkpointing=selective"], "selective"), (["trainer.activation_checkpointing=full"], "full"), (AUTO_CHOOSING_FULL, "full")], ids=["none", "selective", "full", "auto choosing full"])
def test_compiled_blocks_at_tp2_plan_in_every_checkpointing_mode(args, mode, clean_env, tmp_path):
    """Every mode, auto's choice of full among them, plans compiled at tp > 1, as each trains there
    (tests/integration/test_tensor_parallel.py): a block checkpointed whole has its checkpoint around
    the compiled forward (model/compile.py), where with transformers 5.23 full was refused."""
    code, err = run_in_process(["mode=plan", "parallel=fsdp_tp", "parallel.tp=2", "cluster.devices=2", "trainer.compile=blocks", *args, f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["fast_paths"]["activation_checkpointing"] == mode


@pytest.mark.parametrize("args", [["mode=plan", "run.name=sweep-x1/run7"], ["mode=plan", "trainer.val_batches=0"], ["mode=plan", "guard.max_consecutive_skips=0"], ["mode=plan", "trainer.grad_clip=0"], ["mode=plan", "trainer.weight_decay=0"]])
def test_edge_values_that_mean_something_are_accepted(args, clean_env, tmp_path):
    """A run in a sub-folder of run.root (a wandb sweep's); 0 meaning "no validation", "stop at the
    first non-finite step", "no clipping", "no decay"."""
    run_dir = tmp_path / "runs" / "sweep-x1" / "run7" if "run.name=sweep-x1/run7" in args else tmp_path / "run"
    location = [f"run.root={tmp_path / 'runs'}"] if "run.name=sweep-x1/run7" in args else [f"hydra.run.dir={run_dir}"]
    code, err = run_in_process([*args, *location])
    assert code == 0, err
    assert (run_dir / "plan.json").exists()
