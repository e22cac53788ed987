"""mode=export | generate | eval: from a saved checkpoint (or an export), without retraining; and
mode=doctor, a report of the machine for a bug report; mode=health, the health check alone.

    python -m tinytrain mode=export checkpoint=runs/x/checkpoints/step0000100.ckpt [export.dir=...]
    python -m tinytrain mode=generate checkpoint=runs/x/hf_export 'generate.prompts=["Once upon"]'
    python -m tinytrain mode=eval checkpoint=runs/x/checkpoints/final.ckpt [data=... data.path=...]
    python -m tinytrain mode=eval checkpoint=runs/x [eval.tasks=[...]]   # every checkpoint not yet in evals.csv

The model, tokenizer, chat template and precision are the checkpoint's run's (saved_run.py);
generate appends to generations-<checkpoint>.jsonl beside the checkpoint it read; eval writes to
this invocation's run directory (hydra.run.dir).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig, read_write

from tinytrain.checkpoint.average import resolve_paths
from tinytrain.checkpoint.export import export_spec, served_tokenizer
from tinytrain.cluster.overrides import DATA_BUILD_SETTINGS, data_keys_given
from tinytrain.config.schema import DataFormat, Mode
from tinytrain.data.bos_policy import resolve_add_bos, with_bos
from tinytrain.data.datamodule import DataModule
from tinytrain.errors import ConfigError, Problem, raise_if_any
from tinytrain.model.generation import Sampling, read_prompts
from tinytrain.model.generation import generate as generate_texts
from tinytrain.outputs import backfill, saved_run, validate_modes
from tinytrain.plan import micro_batch
from tinytrain.train import run_end

log = logging.getLogger(__name__)


def run(cfg, run_dir: Path, data_overridden: bool = False) -> dict:
    raise_if_any(validate_modes.problems(cfg, run_dir, data_overridden))  # before any checkpoint or model is read
    return MODES[cfg.mode](cfg, run_dir, data_overridden)


def export(cfg, run_dir: Path, _data_overridden: bool = False) -> dict:
    saved = saved_run.load(cfg.checkpoint.path, run_dir, cfg.model.trust_remote_code)
    if saved.is_hf_folder:
        raise ConfigError(Problem("checkpoint.path", str(saved.checkpoint), "is already a Hugging Face folder", "export a checkpoint: <run>/checkpoints/step<N>.ckpt, final.ckpt or a DeepSpeed folder"))
    if saved.finetune and importlib.util.find_spec("peft") is None:  # it failed writing the export, after the merge
        raise ConfigError(Problem("checkpoint.path", str(saved.checkpoint), "holds LoRA adapters, exported as the merged model and peft's adapter folder, and peft is not installed here", "pip install 'tinytrain-llm[lora]'"))
    model = saved_run.run_model(saved, cfg.export.dtype.value)
    spec = model.spec
    out = Path(cfg.export.dir) if cfg.export.dir else saved.default_export_dir()
    run_end.export(saved.checkpoint, model, out)  # as the end of training does
    print(f"exported {saved.checkpoint} -> {out} ({len(saved.tokenizer)} vocab rows, {spec.dtype.value}, stops at {', '.join(spec.turn_end)}{', chat template ' + str(saved.train_cfg.data.chat_template.value) if spec.chat_template else ''})")
    return {"export_dir": str(out)}


def average(cfg, run_dir: Path, _data_overridden: bool = False) -> dict:
    """The mean weights of checkpoint.average (or the run's newest checkpoint.average_last step
    checkpoints) as a checkpoint beside them, exported as mode=export would (checkpoint/average.py)."""

    paths = resolve_paths(list(cfg.checkpoint.average), cfg.checkpoint.average_last, run_dir)
    out = run_end.average(paths, paths[0].parent)  # as checkpoint.average_last at the end of training
    saved = saved_run.load(str(out), run_dir, cfg.model.trust_remote_code)
    export_dir = Path(cfg.export.dir) if cfg.export.dir else saved.default_export_dir()
    run_end.export(out, saved_run.run_model(saved, cfg.export.dtype.value), export_dir)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) -> {out} and {export_dir}")
    return {"checkpoint": str(out), "export_dir": str(export_dir), "averaged": [str(p) for p in paths]}


def inference_setup(saved):
    """(tokenizer with the run's chat template and BOS, stop ids, chat by default) for generation."""
    if saved.is_hf_folder:
        tok = saved.tokenizer
        from transformers import GenerationConfig

        try:
            eos = GenerationConfig.from_pretrained(str(saved.checkpoint)).eos_token_id
        except OSError:
            eos = tok.eos_token_id
        stops = eos if isinstance(eos, list) else [eos]
        return tok, stops, bool(getattr(tok, "chat_template", None))

    spec = export_spec(saved.train_cfg, saved.tokenizer)
    tok = served_tokenizer(saved.tokenizer, spec)
    return tok, [tok.convert_tokens_to_ids(t) for t in spec.turn_end], saved.is_sft


def generate(cfg, run_dir: Path, _data_overridden: bool = False) -> dict:
    g = cfg.generate
    prompts = read_prompts(g.prompts, g.prompts_file)  # before any weights are read
    saved = saved_run.load(cfg.checkpoint.path, run_dir, cfg.model.trust_remote_code)
    tok, stops, chat_default = inference_setup(saved)
    chat = chat_default if g.chat is None else g.chat
    if chat and not getattr(tok, "chat_template", None):
        raise ConfigError(Problem("generate.chat", True, f"{saved.checkpoint} has no chat template (its run pretrained)", "leave generate.chat unset (null) or false"))
    out = generations_file(saved)
    if not os.access(out if out.exists() else out.parent, os.W_OK):  # said before the model is built and run
        raise ConfigError(Problem(saved_run.KEY, str(saved.checkpoint), f"its generations are appended to {out}, which is not writable", "make that folder writable, or copy the checkpoint (or export) elsewhere and generate from the copy"))
    model = saved_run.hf_model(saved, cfg.model.trust_remote_code)
    results = generate_texts(model, tok, prompts, chat=chat, sampling=Sampling(g.max_new_tokens, g.do_sample, g.temperature, g.top_p), stop_ids=stops, seed=cfg.seed)
    with out.open("a", encoding="utf-8") as f:  # appended: earlier prompts' generations are kept
        for r in results:
            f.write(json.dumps({"checkpoint": str(saved.checkpoint), "chat": chat, "do_sample": g.do_sample, **r}, ensure_ascii=False) + "\n")
    for r in results:
        print(f"### {r['prompt']}\n{r['completion']}\n")
    print(f"{len(results)} generation(s) ({'sampled' if g.do_sample else 'greedy'}, {'chat template' if chat else 'plain text'}) appended to {out}")
    return {"generations": results, "file": str(out)}


def generations_file(saved) -> Path:
    """Beside what was read: generations-<checkpoint>.jsonl in the checkpoint's run directory (or
    beside an export from elsewhere), not in a new run folder of this invocation."""
    name = saved.checkpoint.name.removesuffix(".ckpt")
    return (saved.run_dir or saved.checkpoint.parent) / f"generations-{name}.jsonl"


def evaluate(cfg, run_dir: Path, data_overridden: bool) -> dict:
    """Token-weighted mean loss and perplexity over the held-out split of the run's data (or the
    data config given on the command line) -> eval.json."""
    from tinytrain.model.module import causal_lm_loss

    if cfg.checkpoint.path and backfill.is_run_folder(Path(cfg.checkpoint.path)):
        return backfill.backfill(cfg, Path(cfg.checkpoint.path), run_dir, lm_eval)
    saved = saved_run.load(cfg.checkpoint.path, run_dir, cfg.model.trust_remote_code)
    if saved.train_cfg is None and not data_overridden:
        raise ConfigError(Problem("data", None, f"{saved.checkpoint} has no run config to take the data from", "name the data: data=text data.path=<file> (the whole file is scored)"))
    data_cfg = cfg.data if data_overridden or saved.train_cfg is None else saved.train_cfg.data
    if not data_overridden and saved.train_cfg is not None:  # where and how to build the run's data, as given
        for key in set(data_keys_given()) & set(DATA_BUILD_SETTINGS):
            data_cfg[key] = cfg.data[key]
    if saved.train_cfg is not None:
        add_bos = bool(saved.train_cfg.data.prepend_bos)  # the run's BOS decision
    else:
        add_bos, _ = resolve_add_bos(cfg.tokenizer, data_cfg, saved.tokenizer)
    data_cfg = with_bos(scored_whole(data_cfg) if data_overridden else data_cfg, add_bos)
    per_batch, limit, limit_source = eval_batches(cfg, saved.train_cfg if not data_overridden else None)
    data = DataModule(data_cfg, saved.tokenizer, per_batch, cfg.seed, progress=False, validation_only=True)
    model = saved_run.hf_model(saved, cfg.model.trust_remote_code)
    model.config.use_cache = False  # packed rows: per-document position ids keep documents apart only without the cache
    true_vocab = len(saved.tokenizer)
    total, tokens, batches = 0.0, 0, 0
    with torch.no_grad():
        for batch in data.val_dataloader():
            if limit is not None and batches >= limit:
                break
            batch = scored_rows(batch, preference=data_cfg.format == DataFormat.preference)
            inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
            logits = model(**inputs, use_cache=False).logits
            n = int((batch["labels"] != -100).sum())
            total += float(causal_lm_loss(logits, batch["labels"], true_vocab)) * n
            tokens += n
            batches += 1
    if tokens == 0:
        raise ConfigError(Problem("data", str(data_cfg.path), "the held-out split has no labelled tokens", "use more data or a larger data.val_fraction"))
    loss = total / tokens
    result = {
        "checkpoint": str(saved.checkpoint),
        "data": data_cfg.name,
        "data_path": None if data_cfg.path is None else str(Path(data_cfg.path).absolute() if Path(data_cfg.path).exists() else data_cfg.path),  # the file scored (a hub name as given)
        "split": "whole" if data_overridden and data_cfg.val_path == data_cfg.path else "validation",
        "batches": batches,
        "tokens": tokens,
        "loss": loss,
        "perplexity": math.exp(loss),
    }
    if cfg.eval.tasks:
        result["lm_eval"] = lm_eval(cfg, cfg.eval, saved, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    answers = PREFERRED if data_cfg.format == DataFormat.preference else ""
    if answers:
        result["scored"] = answers.strip(" ,")
    split = f"{data_cfg.val_path}" if data_overridden and data_cfg.val_path else f"the {data_cfg.name} held-out split"
    print(f"eval {saved.checkpoint}: loss {loss:.6f}, perplexity {math.exp(loss):.2f} over {tokens:,} tokens{answers} ({batches} batches of {per_batch} of {split}, {limit_source}); written to {run_dir / 'eval.json'}")
    return result


def scored_whole(data_cfg):
    """A data config named on eval's command line: its file is scored whole (as data.val_path, the
    validation set), not the held-out split a training run would split off it; data.val_path, where
    given, is scored instead. A mixture keeps its held-out split."""
    if data_cfg.val_path or not data_cfg.path or data_cfg.sources:
        return data_cfg
    settings = copy.deepcopy(data_cfg)
    with read_write(settings):
        settings.val_path = settings.path
    return settings


# What mode=eval scores of a preference split: next-token loss is a language model's measure of the
# answers it should give; a preference run's val_loss is its objective's loss, not this.
PREFERRED = ", the held-out preferred answers (chosen, or KTO's desirable completions; the run's val_loss is its preference loss)"


def scored_rows(batch: dict, preference: bool) -> dict:
    """The rows whose next-token loss mode=eval reports: every row of a text or SFT batch; of a
    preference batch (data/preference.py: B chosen rows, then B rejected) the chosen ones; of a KTO
    batch (data/unpaired.py: B examples, then B KL rows pairing a prompt with another's completion)
    the desirable examples."""
    rows = {k: v for k, v in batch.items() if torch.is_tensor(v) and v.dim()}
    if "kto_labels" in batch:
        keep = torch.zeros(2 * len(batch["kto_labels"]), dtype=torch.bool)
        keep[: len(batch["kto_labels"])] = batch["kto_labels"].bool()
    elif preference:
        keep = torch.arange(len(batch["input_ids"])) < len(batch["input_ids"]) // 2
    else:
        return batch
    return {k: v[keep] for k, v in rows.items() if v.shape[0] == len(keep)}  # the per-row tensors


def eval_batches(cfg, train_cfg) -> tuple[int, int | None, str]:
    """(micro batch, batches, why): the run's own validation batches (its micro batch and
    trainer.val_batches), so a checkpoint's eval reproduces the val_loss it logged; eval.batches
    overrides the count; data named on the command line (train_cfg None) is read whole.
    trainer.micro_batch_size=auto was a training decision (plan/micro_batch.py): eval then reads one
    sequence at a time."""
    own = train_cfg.trainer if train_cfg is not None else cfg.trainer
    per_batch = micro_batch.configured(own.micro_batch_size) or 1
    if cfg.eval.batches is not None:
        return per_batch, cfg.eval.batches, f"eval.batches={cfg.eval.batches}"
    if train_cfg is None:
        return per_batch, None, "all of it"
    if own.val_batches:
        return per_batch, own.val_batches, f"the run's validation batches: trainer.val_batches={own.val_batches}"
    return per_batch, None, "all of it: the run did not validate"


def lm_eval(cfg, ev, saved, run_dir: Path) -> dict:
    """lm-evaluation-harness tasks (ev: eval.tasks, eval.include, eval.limit) on the export through
    lm-eval's own hf model (a checkpoint is exported to <run_dir>/lm_eval_export first)."""
    import lm_eval

    from tinytrain.plan import eval_tasks
    from tinytrain.train.callbacks.evals import BOOTSTRAP_ITERS, without_environment_report

    folder = saved.checkpoint
    if not saved.is_hf_folder:
        folder = run_dir / "lm_eval_export"
        export_cfg = cfg.copy()
        export_cfg.export.dir = str(folder)
        export_cfg.checkpoint.path = str(saved.checkpoint)
        export(export_cfg, run_dir)
    resolved = eval_tasks.resolve(tuple(ev.tasks), tuple(ev.include))
    tasks = eval_tasks.task_manager(tuple(ev.include), resolved.builtin)
    # model_args as a dict: lm-eval splits a string's on ',' and '=' (a folder named
    # "m,trust_remote_code=True" set that argument; any comma in the run dir broke the eval).
    with without_environment_report():  # only the scores are kept
        out = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(folder), "trust_remote_code": bool(cfg.model.trust_remote_code)}, tasks=list(ev.tasks), task_manager=tasks, limit=ev.limit, device="cpu", bootstrap_iters=BOOTSTRAP_ITERS, log_samples=False)
    return out["results"]


def doctor(cfg, run_dir: Path, _data_overridden: bool = False) -> dict:
    """Versions, devices, the Slurm allocation, network and distributed variables (cluster/doctor.py) -> doctor.txt."""
    from tinytrain.cluster import doctor as checkup

    text = checkup.report()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "doctor.txt").write_text(text)
    print(text + f"\nwritten to {run_dir / 'doctor.txt'}")
    return {"report": text}


def health(cfg, run_dir: Path, _data_overridden: bool = False) -> dict:
    """The health check alone on every rank of the configured world (train/health_check.py) -> health.json."""
    from tinytrain.train.health_check import run_health

    return run_health(cfg, run_dir)


# The output modes, one function each: (cfg, run_dir, whether the command line names data; only
# eval reads it). A new output mode is a Mode member and a row here (the cli dispatches through it).
MODES: dict[Mode, Callable[[DictConfig, Path, bool], dict]] = {
    Mode.export: export,
    Mode.generate: generate,
    Mode.eval: evaluate,
    Mode.average: average,
    Mode.doctor: doctor,
    Mode.health: health,
}
