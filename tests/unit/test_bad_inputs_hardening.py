"""Security and fault hardening (issue 28), as an attacker or a careless user would try it: each
case exits 2 with one paragraph naming the key (or file), the value and a fix, no traceback, before
any model is loaded, and no code from a generated script or a model folder ever runs.

Same harness as tests/unit/test_bad_inputs.py (the CLI in-process); `{H}` is the folder the `hard`
fixture fills: a tiny model saved as an export, broken copies of it, a model folder with its own
code, a run whose checkpoint is of another model size.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from tests.unit.test_bad_inputs import SBATCH, SMALL_MODEL, run_in_process, small_model_checkpoint

GEN = ["mode=generate", "checkpoint.path={H}/export", "generate.prompts=[hello]"]
EVAL = ["mode=eval", "checkpoint.path={H}/export"]
SHAPE_CKPT = "checkpoint.path={H}/shape_run/checkpoints/step0000004.ckpt"
LONGROPE = "{rope_type:longrope,short_factor:[1.0,1.0],long_factor:[1.0,1.0],original_max_position_embeddings:512}"
MARKER = "REMOTE_CODE_RAN"
# A multirun through submitit's Slurm launcher; nothing may be made under {H}/sweep.
SWEEP = ["-m", "hydra/launcher=submitit_slurm", "hydra.sweep.dir={H}/sweep", "mode=plan"]

# name: (arguments, strings the message must contain)
CASES = {
    # 1. generated scripts carry data (more in tests/unit/cluster/test_sbatch_injection.py)
    "sbatch account smuggling an option": ([*SBATCH, "cluster.account='acct --nodes=64'"], ["cluster.account='acct --nodes=64'", "whitespace", "Fix: use the account's name"]),
    "sbatch account as an option": ([*SBATCH, "cluster.account='--nodes=64'"], ["cluster.account='--nodes=64'", "starts with '-'"]),
    "sbatch run name with a newline": ([*SBATCH, "run.name='a\necho PWNED'"], ["run.name='a\\necho PWNED'", "cannot be a Slurm job name", "newline"]),
    "sbatch partition with a newline": ([*SBATCH, "cluster.partition='gpu\necho PWNED'"], ["cluster.partition='gpu\\necho PWNED'", "newline"]),
    "sbatch partition with command substitution": ([*SBATCH, "cluster.partition='$(id)'"], ["cluster.partition='$(id)'", "not a Slurm name"]),
    "sbatch override with a newline": ([*SBATCH, "+logger.wandb_tags=['x\necho PWNED']"], ["logger.wandb_tags=", "out of its comment line", "on one line"]),
    "sbatch run directory with a space": ([*SBATCH, "hydra.run.dir='{H}/my run'"], ["hydra.run.dir='{H}/my run'", "whitespace", "without spaces"]),
    # issue 31: the sweep launcher's values reach a Slurm script too (more in tests/unit/cluster/test_launcher_values.py)
    "sweep partition with a newline": ([*SWEEP, "hydra.launcher.partition='gpu\necho PWNED #'"], ["hydra.launcher.partition='gpu\\necho PWNED #'", "newline", "Fix: use the partition's name"]),
    "sweep preset partition with a newline": (["-m", "hydra/launcher=slurm_a800", "hydra.sweep.dir={H}/sweep", "hydra.launcher.partition='a800\nrm -rf x'"], ["hydra.launcher.partition='a800\\nrm -rf x'", "newline"]),
    "sweep account smuggling an option": ([*SWEEP, "hydra.launcher.account='acct --nodes=64'"], ["hydra.launcher.account='acct --nodes=64'", "whitespace", "Fix: use the account's name"]),
    "sweep qos as an option": ([*SWEEP, "hydra.launcher.qos='--nodes=64'"], ["hydra.launcher.qos='--nodes=64'", "starts with '-'"]),
    "sweep comment with a newline": ([*SWEEP, "hydra.launcher.comment='lr\necho PWNED'"], ["hydra.launcher.comment='lr\\necho PWNED'", "cannot go into an #SBATCH line", "Fix: write hydra.launcher.comment as one word"]),
    "sweep constraint with a space": ([*SWEEP, "hydra.launcher.constraint='a100 --nodes=64'"], ["hydra.launcher.constraint='a100 --nodes=64'", "whitespace"]),
    "sweep job name with a newline": ([*SWEEP, "hydra.launcher.name='grid\necho PWNED'"], ["hydra.launcher.name='grid\\necho PWNED'", "cannot be a Slurm job name"]),
    "sweep setup line with a newline": ([*SWEEP, "hydra.launcher.setup=['module load cuda\necho PWNED']"], ["hydra.launcher.setup[0]='module load cuda\\necho PWNED'", "newline", "one line"]),
    "sweep srun argument with a newline": ([*SWEEP, "+hydra.launcher.srun_args=['--cpu-bind=none\necho PWNED']"], ["hydra.launcher.srun_args[0]=", "newline"]),
    "sweep additional parameter smuggling an option": ([*SWEEP, "+hydra.launcher.additional_parameters.mail-type='END --nodes=64'"], ["hydra.launcher.additional_parameters.mail-type='END --nodes=64'", "whitespace"]),
    "sweep folder with a space": ([*SWEEP, "hydra.launcher.submitit_folder='{H}/my sweep/%j'"], ["hydra.launcher.submitit_folder='{H}/my sweep/%j'", "whitespace", "Fix: choose a folder path"]),
    # 2. no code from a model folder
    "pretrained folder with its own code": (["mode=plan", "model.pretrained={H}/remote_model"], ["model.trust_remote_code=false", "model.pretrained={H}/remote_model needs the folder's own Python code", "config.json: AutoConfig -> evil.EvilConfig", "model.trust_remote_code=true"]),
    "tokenizer folder with its own code": (["mode=plan", "tokenizer=hf", "tokenizer.path={H}/remote_tokenizer"], ["tokenizer.path='{H}/remote_tokenizer'", "custom tokenizer code", "never runs"]),
    "generate from a folder with its own code": (["mode=generate", "checkpoint.path={H}/remote_model", "generate.prompts=[hi]"], ["model.trust_remote_code=false", "checkpoint.path={H}/remote_model"]),
    "eval of a folder with its own code": (["mode=eval", "checkpoint.path={H}/remote_model"], ["model.trust_remote_code=false"]),
    # 3. incomplete exports named
    "generate from an export without weights": ([*GEN[:1], "checkpoint.path={H}/config_only", *GEN[2:]], ["checkpoint.path='{H}/config_only'", "not a complete Hugging Face model folder", "no weights", "export it again"]),
    "generate from an export cut short": ([*GEN[:1], "checkpoint.path={H}/cut_export", *GEN[2:]], ["checkpoint.path='{H}/cut_export'", "model.safetensors", "cut short"]),
    "generate from an export whose copy was killed": ([*GEN[:1], "checkpoint.path={H}/gone", *GEN[2:]], ["checkpoint.path='{H}/gone'", "does not exist", "gone.tmp-4242 next to it is an export that was interrupted", "export again"]),
    "generate from an export missing a shard": ([*GEN[:1], "checkpoint.path={H}/missing_shard", *GEN[2:]], ["checkpoint.path='{H}/missing_shard'", "model-00002-of-00002.safetensors", "missing"]),
    "eval of an export without weights": (["mode=eval", "checkpoint.path={H}/config_only"], ["checkpoint.path='{H}/config_only'", "no weights"]),
    "generate from a folder without a tokenizer": ([*GEN[:1], "checkpoint.path={H}/no_tokenizer", *GEN[2:]], ["checkpoint.path='{H}/no_tokenizer'", "a tokenizer (tokenizer.json or tokenizer.model)"]),
    "eval of a folder without a tokenizer": (["mode=eval", "checkpoint.path={H}/no_tokenizer"], ["checkpoint.path='{H}/no_tokenizer'", "a tokenizer"]),
    # 5. output modes validated before any model is loaded
    "generate max new tokens zero": ([*GEN, "generate.max_new_tokens=0"], ["generate.max_new_tokens=0", ">= 1", "generate.max_new_tokens=64"]),
    "generate max new tokens negative": ([*GEN, "generate.max_new_tokens=-5"], ["generate.max_new_tokens=-5", ">= 1"]),
    "generate temperature negative": ([*GEN, "generate.do_sample=true", "generate.temperature=-1"], ["generate.temperature=-1.0", "finite number >= 0"]),
    "generate temperature zero while sampling": ([*GEN, "generate.do_sample=true", "generate.temperature=0"], ["generate.temperature=0.0", "generate.do_sample=false for greedy"]),
    "generate temperature infinite": ([*GEN, "generate.do_sample=true", "generate.temperature=inf"], ["generate.temperature=inf", "finite"]),
    "generate top_p above one": ([*GEN, "generate.do_sample=true", "generate.top_p=1.5"], ["generate.top_p=1.5", "in (0, 1]"]),
    "generate top_p zero": ([*GEN, "generate.do_sample=true", "generate.top_p=0"], ["generate.top_p=0.0", "in (0, 1]"]),
    "generate top_p negative": ([*GEN, "generate.top_p=-0.5"], ["generate.top_p=-0.5", "in (0, 1]"]),
    "generate binary prompts file": ([*GEN[:2], "generate.prompts_file={H}/prompts.bin"], ["generate.prompts_file='{H}/prompts.bin'", "is binary (a NUL byte on line 2)"]),
    "generate prompts file not UTF-8": ([*GEN[:2], "generate.prompts_file={H}/prompts_latin1.txt"], ["generate.prompts_file='{H}/prompts_latin1.txt'", "line 2 is not UTF-8", "iconv"]),
    "generate empty prompt": ([*GEN[:2], "generate.prompts=['']"], ["generate.prompts[0]=''", "is blank"]),
    "generate every problem at once": ([*GEN, "generate.do_sample=true", "generate.max_new_tokens=0", "generate.temperature=-1", "generate.top_p=2"], ["3 configuration errors", "generate.max_new_tokens=0", "generate.temperature=-1.0", "generate.top_p=2.0"]),
    "eval batches zero": ([*EVAL, "eval.batches=0"], ["eval.batches=0", ">= 1, or null for the run's own validation batches"]),
    "eval lm-eval limit zero": ([*EVAL, "eval.limit=0"], ["eval.limit=0", ">= 1"]),
    "eval lm-eval include missing": ([*EVAL, "eval.include=[{H}/no_tasks]"], ["eval.include[0]='{H}/no_tasks'", "no such folder"]),
    "eval old lm-eval key": ([*EVAL, "eval.lm_eval_limit=3"], ["eval.lm_eval_limit=3", "is renamed eval.limit", "use eval.limit="]),
    "eval data missing": ([*EVAL, "data=text", "data.path={H}/missing.txt"], ["data.path='{H}/missing.txt'", "no such file or folder"]),
    "export dir is a file": (["mode=export", SHAPE_CKPT, "export.dir={H}/a_file"], ["export.dir='{H}/a_file'", "is a file; an export is a folder"]),
    "export dir holds other files": (["mode=export", SHAPE_CKPT, "export.dir={H}/not_an_export"], ["export.dir='{H}/not_an_export'", "not an export", "an export replaces the whole folder"]),
    "export dir under a file": (["mode=export", SHAPE_CKPT, "export.dir={H}/a_file/out"], ["export.dir='{H}/a_file/out'", "is a file, so no folder can be made there"]),
    "training export dir is a file": (["mode=plan", "export.dir={H}/a_file"], ["export.dir='{H}/a_file'", "is a file"]),
    "training export dir holds other files": (["mode=plan", "export.dir={H}/not_an_export"], ["export.dir='{H}/not_an_export'", "not an export"]),
    "training samples of zero tokens": (["mode=plan", "generate.sample_max_new_tokens=0"], ["generate.sample_max_new_tokens=0", ">= 1 while generate.sample_prompts is set", "generate.sample_prompts=[]"]),
    "training samples of negative tokens": (["mode=plan", "generate.sample_max_new_tokens=-1"], ["generate.sample_max_new_tokens=-1", ">= 1"]),
    "training sample prompt blank": (["mode=plan", "generate.sample_prompts=['','x']"], ["generate.sample_prompts[0]=''", "is blank"]),
    # Samples past the model's positions generated until the run was killed, before its last checkpoint.
    "training samples beyond the positions": (["mode=plan", "generate.sample_max_new_tokens=1000000000000"], ["generate.sample_max_new_tokens=1000000000000", "is not below the model's 1024 positions"]),
    "checkpoint write speed zero": (["mode=plan", "checkpoint.write_gbps=0"], ["checkpoint.write_gbps=0.0", "must be a finite number above 0", "checkpoint.write_gbps=2.0"]),
    "checkpoint write speed nan": (["mode=plan", "checkpoint.write_gbps=nan"], ["checkpoint.write_gbps=nan", "must be a finite number above 0"]),
    "checkpoint save share negative": (["mode=plan", "checkpoint.max_save_share=-1"], ["checkpoint.max_save_share=-1.0", "must be a finite number above 0"]),
    "resume empty": (["mode=plan", "resume=''"], ["resume=''", "is neither auto, never, nor an existing checkpoint"]),
    "initializer range above 1": (["mode=plan", "model.initializer_range=2"], ["model.initializer_range=2.0", "must be at most 1"]),
    "one process on two nodes": (["mode=plan", "cluster.nodes=2", "cluster.devices=1"], ["runs one process but the cluster has 2", "use parallel=ddp, or cluster.nodes=1"]),
    # 7. the smaller cases
    "export of a checkpoint of another model size": (["mode=export", SHAPE_CKPT, "export.dir={H}/shape_export"], ["checkpoint.path=", "step0000004.ckpt", "holds another model size: num_layers 2, hidden_size 64", "this run's model: num_layers 4, hidden_size 192"]),
    "eval of a checkpoint of another model size": (["mode=eval", SHAPE_CKPT], ["holds another model size"]),
    "rope factor infinite": (["mode=plan", "model.rope_scaling={rope_type:linear,factor:inf}"], ["model.rope_scaling.factor=inf", "finite number >= 1"]),
    "rope low frequency factor nan": (["mode=plan", "model.rope_scaling={rope_type:llama3,factor:8.0,low_freq_factor:nan,high_freq_factor:4.0,original_max_position_embeddings:1024}"], ["model.rope_scaling.low_freq_factor=nan", "not finite"]),
    "rope high frequency factor infinite": (["mode=plan", "model.rope_scaling={rope_type:llama3,factor:8.0,low_freq_factor:1.0,high_freq_factor:inf,original_max_position_embeddings:1024}"], ["model.rope_scaling.high_freq_factor=inf", "not finite"]),
    "longrope factor lists too short": (["mode=plan", f"model.rope_scaling={LONGROPE}"], ["model.rope_scaling.short_factor=[1.0, 1.0]", "has 2 factors", "head_dim / 2 = 16", "model.rope_scaling.long_factor"]),
    "pretrained weights cut short": (["mode=plan", "model.pretrained={H}/cut_export"], ["model.pretrained='{H}/cut_export'", "its weights are not whole", "cut short", "download or copy the model again"]),
    "pretrained weights pickling a callable": (["mode=plan", "model.pretrained={H}/pickled_bin", *SMALL_MODEL], ["model.pretrained='{H}/pickled_bin'", "pytorch_model.bin holds something other than tensors (it pickles posix.system)", "Fix: convert the weights to safetensors from a trusted source"]),
    "pretrained weights a stub": (["mode=plan", "model.pretrained={H}/stub_weights"], ["model.pretrained='{H}/stub_weights'", "shorter than a safetensors header"]),
    # artifacts from elsewhere: weights read from outside the folder (it trained on them), a pipe
    # (the plan hung), headers that are not a table or whose bytes cannot hold a shape (tracebacks)
    "pretrained index naming files outside": (["mode=plan", "model.pretrained={H}/escaping_index"], ["model.pretrained='{H}/escaping_index'", "its weight_map names files outside the folder (../export/model.safetensors)"]),
    "pretrained weights a pipe": (["mode=plan", "model.pretrained={H}/pipe_weights"], ["model.pretrained='{H}/pipe_weights'", "model.safetensors: not a regular file"]),
    "pretrained weights header a list": (["mode=plan", "model.pretrained={H}/list_header"], ["model.pretrained='{H}/list_header'", "its header is a JSON list, not a table of tensors"]),
    "pretrained weights shape beyond its bytes": (["mode=plan", "model.pretrained={H}/huge_shape"], ["model.pretrained='{H}/huge_shape'", "is declared F32 [1000000000000, 64] in bytes", "which do not hold it"]),
    "add_bos false beside prepend_bos true": (["mode=plan", "tokenizer.add_bos=false", "data.prepend_bos=true"], ["tokenizer.add_bos=false", "contradicts data.prepend_bos=true", "data.prepend_bos=false"]),
    "too_long skip drops every sample": (["mode=prepare", "data=alpaca", "data.path={H}/long.jsonl", "data.seq_len=16", "data.too_long=skip"], ["no usable samples", "20 skipped as longer than 16", "raise data.seq_len (the shortest sample skipped has", "data.too_long=truncate"]),
    # issue 31: a pretrained model trained with another tokenizer
    "pretrained model of another tokenizer": (["mode=plan", "model.pretrained={H}/other_tokenizer"], ["model.pretrained='{H}/other_tokenizer'", "ships its own tokenizer, {H}/other_tokenizer (its own tokenizer) (vocab fingerprint", "64 tokens), not this run's tokenizer.path=", "4096 tokens): every token id would read another token's embedding row", "Fix: train with the model's tokenizer (tokenizer=hf tokenizer.path={H}/other_tokenizer), or set model.tokenizer_change=allow"]),
    "another tokenizer under lora": (["mode=plan", "model.pretrained={H}/other_tokenizer", "model.tokenizer_change=allow", "finetune=lora"], ["model.tokenizer_change='allow'", "finetune=lora keeps them frozen", "Fix: use finetune=full"]),
    "unknown tokenizer change": (["mode=plan", "model.tokenizer_change=keep"], ["model.tokenizer_change=keep", "expected one of [refuse, allow]"]),
    # issue 31: accepted but wrong
    "simpo gamma nan": (["mode=plan", "experiment=dpo_smoke", "finetune.objective=simpo", "finetune.simpo_gamma=nan"], ["finetune.simpo_gamma=nan", "must be a finite number", "Fix: use e.g. finetune.simpo_gamma=0.5"]),
    "simpo gamma infinite": (["mode=plan", "experiment=dpo_smoke", "finetune.objective=simpo", "finetune.simpo_gamma=-inf"], ["finetune.simpo_gamma=-inf", "must be a finite number"]),
    # 6. what used to fail with an OSError blamed on the run directory (more below)
    "training from a pretrained folder without weights": (["model.pretrained={H}/config_only", *SMALL_MODEL], ["model.pretrained='{H}/config_only'", "has a config.json but no weights", "copy the model's weight files"]),
}


@pytest.fixture(scope="module")
def hard(tmp_path_factory, bundled_tokenizer):
    """`{H}`: a complete export of a tiny model, and broken variants of it."""
    from omegaconf import OmegaConf

    from tests.conftest import compose, save_fresh_model
    from tinytrain.plan.planner import make_plan

    h = tmp_path_factory.mktemp("hardening")
    export = save_fresh_model(h / "export", SMALL_MODEL, bundled_tokenizer)
    bundled_tokenizer.save_pretrained(export)
    shutil.copytree(export, h / "remote_model")
    config = json.loads((export / "config.json").read_text())
    (h / "remote_model" / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}}))
    (h / "remote_model" / "evil.py").write_text(f"open({str(h / MARKER)!r}, 'w').write('ran')\n")
    shutil.copytree(export, h / "remote_tokenizer")
    tok_config = json.loads((export / "tokenizer_config.json").read_text())
    (h / "remote_tokenizer" / "tokenizer_config.json").write_text(json.dumps({**tok_config, "tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}}))
    (h / "remote_tokenizer" / "evil.py").write_text(f"open({str(h / MARKER)!r}, 'w').write('ran')\n")
    (h / "config_only").mkdir()
    shutil.copy(export / "config.json", h / "config_only")
    shutil.copytree(export, h / "cut_export")
    weights = h / "cut_export" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (h / "gone.tmp-4242").mkdir()
    shutil.copy(export / "config.json", h / "gone.tmp-4242")
    shutil.copytree(export, h / "missing_shard")
    (h / "missing_shard" / "model.safetensors").rename(h / "missing_shard" / "model-00001-of-00002.safetensors")
    shard_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}
    (h / "missing_shard" / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": shard_map}))
    save_fresh_model(h / "no_tokenizer", SMALL_MODEL, bundled_tokenizer)
    other = other_tokenizer()
    save_fresh_model(h / "other_tokenizer", SMALL_MODEL, other)
    other.save_pretrained(h / "other_tokenizer")
    shutil.copytree(export, h / "stub_weights")
    (h / "stub_weights" / "model.safetensors").write_bytes(b"\x10\x00")
    shutil.copytree(export, h / "escaping_index")
    (h / "escaping_index" / "model.safetensors").unlink()
    escaping = {"model.embed_tokens.weight": "../export/model.safetensors", "lm_head.weight": "../export/model.safetensors"}
    (h / "escaping_index" / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": escaping}))
    shutil.copytree(export, h / "pipe_weights")
    (h / "pipe_weights" / "model.safetensors").unlink()
    os.mkfifo(h / "pipe_weights" / "model.safetensors")
    for name, header in (("list_header", lambda _: []), ("huge_shape", lambda hd: {**hd, "model.embed_tokens.weight": {**hd["model.embed_tokens.weight"], "shape": [10**12, 64]}})):
        shutil.copytree(export, h / name)
        raw = (export / "model.safetensors").read_bytes()
        length = int.from_bytes(raw[:8], "little")
        text = json.dumps(header(json.loads(raw[8 : 8 + length]))).encode()
        (h / name / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + length :])
    shutil.copytree(export, h / "pickled_bin")  # weights beside a pickled os.system, as a hostile .bin
    from safetensors.torch import load_file

    weights = load_file(h / "pickled_bin" / "model.safetensors")
    (h / "pickled_bin" / "model.safetensors").unlink()
    torch.save({**weights, "evil": os.system}, h / "pickled_bin" / "pytorch_model.bin")
    (h / "a_file").write_text("a regular file where a folder should be\n")
    (h / "not_an_export").mkdir()
    (h / "not_an_export" / "notes.txt").write_text("the user's own files\n")
    (h / "good.txt").write_text("A document.\n\nAnother document.\n")
    (h / "prompts.bin").write_bytes(b"first prompt\n\x00\x01\x02binary\n")
    (h / "prompts_latin1.txt").write_bytes("first\ncaf\xe9\n".encode("latin-1"))
    records = [{"instruction": f"question {i} " + "word " * 40, "input": "", "output": "answer " * 10} for i in range(20)]
    (h / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    # A run of the default model whose checkpoints/ holds a checkpoint of a smaller one (copied between runs).
    run = h / "shape_run"
    cfg = compose([])
    plan = make_plan(cfg, bundled_tokenizer, run)
    run.mkdir()
    (run / "config_resolved.yaml").write_text(OmegaConf.to_yaml(plan.resolved_config(cfg)))
    (run / "checkpoints").mkdir()
    small_model_checkpoint(run / "checkpoints" / "step0000004.ckpt")
    return h


def other_tokenizer():
    """A 64-token word-level tokenizer: not the bundled one the cases train with."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", *(f"word{i}" for i in range(61))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for var in ("HYDRA_FULL_ERROR", "TINYTRAIN_TRACEBACK", "WANDB_MODE", "WANDB_API_KEY", "SLURM_JOB_ID", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    return monkeypatch


def test_the_hardening_suite_is_large_enough():
    assert len(CASES) >= 50


@pytest.mark.parametrize("name", list(CASES))
def test_hardening_case_exits_2_naming_key_value_and_fix(name, hard, clean_env, tmp_path, capfd):
    args, needles = CASES[name]
    args = [a.replace("{H}", str(hard)) for a in args]
    if not any(a.startswith("hydra.run.dir=") for a in args):
        args.append(f"hydra.run.dir={tmp_path / 'run'}")
    code, err = run_in_process(args)
    assert code == 2, err
    assert "Traceback" not in err and "Fix:" in err, err
    assert "cannot create the run directory" not in err, err
    for needle in needles:
        assert needle.replace("{H}", str(hard)) in err, (needle, err)
    # Refused before anything was written or run: no plan, no job script, no output, no foreign code.
    assert not any((tmp_path / "run" / f).exists() for f in ("plan.json", "job.sbatch", "eval.json"))
    assert not list(hard.rglob("generations-*.jsonl")) and not list(tmp_path.rglob("generations-*.jsonl"))
    assert not (hard / MARKER).exists()
    assert not (hard / "shape_export").exists() and not (hard / "sweep").exists() and not (hard / "my sweep").exists()
    # Never transformers' interactive "Do you wish to run the custom code? [y/N]".
    assert "[y/N]" not in capfd.readouterr().out


def test_trusting_remote_code_is_passed_to_transformers(hard, monkeypatch):
    """model.trust_remote_code=true lifts the refusal and reaches the load (here: AutoConfig)."""
    from tests.conftest import compose
    from tinytrain.checkpoint import pretrained
    from tinytrain.plan import input_safety

    cfg = compose([f"model.pretrained={hard / 'remote_model'}", "model.trust_remote_code=true"])
    assert input_safety.pretrained_problems(cfg) == []
    seen = {}

    class Stop(Exception):
        pass

    def from_pretrained(path, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", from_pretrained)
    with pytest.raises(Stop):
        pretrained.pretrained_config(cfg.model.pretrained, cfg.model.trust_remote_code)
    assert seen == {"trust_remote_code": True}


def test_trusting_remote_code_names_the_files_that_will_run_before_the_load(hard, monkeypatch, caplog):
    """Issue 31: model.trust_remote_code=true runs the folder's code; one line, before transformers
    is called, names the .py files that will run."""
    from tinytrain.checkpoint import pretrained, remote_code

    monkeypatch.setattr(remote_code, "_announced", set())
    before_load = []

    class Stop(Exception):
        pass

    def from_pretrained(path, **kwargs):
        before_load.extend(r.getMessage() for r in caplog.records)
        raise Stop

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", from_pretrained)
    with caplog.at_level("WARNING"), pytest.raises(Stop):
        pretrained.pretrained_config(str(hard / "remote_model"), True)
    lines = [m for m in before_load if "trust_remote_code=true" in m]
    assert len(lines) == 1, before_load
    assert f"model.pretrained={hard / 'remote_model'}: evil.py (from auto_map; the folder's .py files: evil.py)" in lines[0]
    assert not (hard / MARKER).exists()


ADDED = 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'
SAME = "model.pretrained's own tokenizer is the run's"


@pytest.mark.parametrize(
    "model, extra, status",
    [
        ("export", [], SAME),
        ("export", [ADDED], SAME),  # tokens added after the model's own: its rows keep their ids
        ("no_tokenizer", [], "model.pretrained's tokenizer could not be checked against the run's"),
        ("other_tokenizer", ["model.tokenizer_change=allow"], "model.pretrained was trained with"),
    ],
)
def test_the_plan_names_both_tokenizers(model, extra, status, hard, clean_env, tmp_path):
    """Issue 31: the printed plan and plan.json say whether model.pretrained's own tokenizer is the
    run's, could not be checked (no tokenizer in the folder), or differs under model.tokenizer_change=allow."""
    code, err = run_in_process(["mode=plan", f"model.pretrained={hard / model}", *extra, f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 0, err
    from tinytrain.plan.run_plan import render

    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    match = plan["tokenizer"]["pretrained"]
    assert match["status"] == {"export": "same", "no_tokenizer": "unchecked", "other_tokenizer": "differs"}[model]
    assert match["reinit_rows"] == (model == "other_tokenizer")
    assert "bundled_tokenizer" in match["configured"] and f"{4098 if extra == [ADDED] else 4096} tokens" in match["configured"]
    line = next(x for x in render(plan).splitlines() if "model.pretrained" in x and "tokenizer" in x and not x.startswith("model "))  # not the model line naming the folder
    assert status in line and match["configured"] in line
    if model == "other_tokenizer":
        assert f"{hard / model} (its own tokenizer) (vocab fingerprint" in line and "64 tokens" in line and "every embedding row is re-initialised" in line
    if extra == [ADDED]:
        assert "ids 0-4095 are the same tokens; the run adds 2 token(s) after them" in line
    if model == "no_tokenizer":
        assert "its folder has no tokenizer" in line


def test_another_tokenizer_allowed_reinitialises_every_embedding_row(hard, tmp_path):
    """model.tokenizer_change=allow: no row of the pretrained table is reused by id; every token's
    row is the mean of the pretrained rows (as an added token's)."""
    import torch
    from safetensors.torch import load_file

    from tests.conftest import compose
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.plan.planner import make_plan
    from tinytrain.train.fit import build_module

    cfg = compose([f"model.pretrained={hard / 'other_tokenizer'}", "model.tokenizer_change=allow", *SMALL_MODEL])
    tokenizer = load_from_config(cfg.tokenizer)
    plan = make_plan(cfg, tokenizer, tmp_path / "run")
    assert plan.pretrained_tokenizer.reinit_rows
    rows = build_module(cfg, plan, tokenizer).model.get_input_embeddings().weight[: len(tokenizer)]
    pretrained = load_file(hard / "other_tokenizer" / "model.safetensors")["model.embed_tokens.weight"]
    assert not torch.equal(rows[:64], pretrained.to(rows.dtype))
    assert torch.allclose(rows, rows[0].expand_as(rows))


def test_an_os_error_names_its_file_operation_and_override(tmp_path):
    """Not the run directory: the file that failed, the call and the tinytrain function making it,
    the override that named the path, and a fix for that errno."""
    from tinytrain.checkpoint.files import fsync_directory
    from tinytrain.config.friendly_errors import friendly_message

    missing = tmp_path / "gone" / "checkpoints"
    with pytest.raises(OSError) as e:
        fsync_directory(missing)
    message = friendly_message(e.value, [f"hydra.run.dir={tmp_path / 'gone'}"])
    assert f"fsync_directory (tinytrain/checkpoint/files.py) failed on {missing} (from hydra.run.dir={tmp_path / 'gone'}): No such file or directory" in message
    assert f"Fix: check that {missing} exists" in message and "cannot create the run directory" not in message


def test_a_small_disk_during_a_store_build_names_the_store_and_the_disk(small_disk, clean_env, tmp_path):
    text = tmp_path / "big.txt"
    text.write_text("\n\n".join(f"Document {i}: " + "some words of text " * 20 for i in range(400)))
    code, err = run_in_process(["mode=prepare", "data=text", f"data.path={text}", f"data.cache_dir={small_disk / 'cache'}", "data.tokenize_workers=0", f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 2 and "Traceback" not in err, err
    assert "cannot create the run directory" not in err, err
    assert f"tinytrain: build (tinytrain/data/store.py) failed on {small_disk / 'cache' / 'stores'}/." in err, err
    assert f"(from data.cache_dir={small_disk / 'cache'}): No space left on device" in err
    assert "Fix: free space on the disk holding" in err
    assert not [p for p in (small_disk / "cache" / "stores").iterdir() if ".tmp-" in p.name]  # the partial store is removed


def test_a_truncated_reference_cache_is_named_and_rebuilt(tmp_path, caplog):
    """finetune.precompute_reference: a cache file cut short (a copy, a full disk) is a miss named in
    the log (numpy's BadZipFile used to end the run), and the scoring pass writes it again."""
    import logging

    import numpy as np

    from tinytrain.data.reference_cache import ReferenceCache

    class Pairs(list):
        ref_logps = None

    train, val = Pairs(range(6)), Pairs(range(2))
    train.ref_logps, val.ref_logps = np.ones((6, 2)), np.zeros((2, 2))
    cache = ReferenceCache(tmp_path, "k" * 32)
    cache.save(train, val)
    cache.path.write_bytes(cache.path.read_bytes()[: cache.path.stat().st_size // 2])
    fresh_train, fresh_val = Pairs(range(6)), Pairs(range(2))
    with caplog.at_level(logging.WARNING, logger="tinytrain.data.reference_cache"):
        assert cache.load_into(fresh_train, fresh_val) is False
    assert f"reference log-probs {cache.path} do not read" in caplog.text and "computing them again" in caplog.text
    cache.save(train, val)  # what PrecomputeReference does on the miss
    assert cache.load_into(fresh_train, fresh_val) and (fresh_train.ref_logps == 1).all()
