"""mode=export | generate | eval on the checkpoints of a real chat fine-tune (ChatML, tiny Llama),
and the sample generations written while it trained. (fsdp_tp and DeepSpeed step checkpoints are
exported in test_tensor_parallel.py and test_deepspeed.py, beside the runs that make them.)"""

import importlib.util
import json
import math

import pytest

from tests.conftest import logged, run_cli
from tests.integration.export_checks import assert_export_matches, checkpoint_weights

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
RUN = ["experiment=smoke", *MODEL, "data=chat", 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]', "trainer.progress_bar=false", "trainer.plot=false", "trainer.lr=1e-2"]
TRUE_VOCAB = 4098


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("chat") / "run"
    r = run_cli(RUN, run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return run_dir


def test_samples_at_each_validation(chat_run):
    rows = [json.loads(line) for line in (chat_run / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["prompt"]) for r in rows] == [(4, "The meaning of"), (4, "def main("), (8, "The meaning of"), (8, "def main(")]
    assert all(0 < r["tokens"] <= 32 and isinstance(r["completion"], str) for r in rows)


def test_export_of_a_step_checkpoint(chat_run, tmp_path):
    from transformers import AutoTokenizer, GenerationConfig

    step = chat_run / "checkpoints" / "step0000004.ckpt"
    out = tmp_path / "exported"
    r = run_cli(["mode=export", f"checkpoint={step}", f"export.dir={out}"], tmp_path / "cli")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"exported {step} -> {out} (4098 vocab rows, fp32, stops at </s>, <|im_end|>, chat template chatml)" in r.stdout
    assert_export_matches(out, checkpoint_weights(step), RUN, TRUE_VOCAB)
    served = AutoTokenizer.from_pretrained(out)
    rendered = served.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert GenerationConfig.from_pretrained(out).eos_token_id == [served.eos_token_id, served.convert_tokens_to_ids("<|im_end|>")]


def test_generate_from_checkpoint_and_export_agree(chat_run, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is a list?\nHow do I sort?\n")
    r = run_cli(["mode=export", "checkpoint=last"], chat_run)  # the newest step checkpoint, step 8
    assert r.returncode == 0, r.stderr[-3000:]
    outputs = []
    for name, source in (("ckpt", chat_run / "checkpoints" / "step0000008.ckpt"), ("hf", chat_run / "hf_export-step0000008")):
        r = run_cli(["mode=generate", f"checkpoint={source}", f"generate.prompts_file={prompts}", "generate.max_new_tokens=6", f"run.root={tmp_path / name}"], None)
        assert r.returncode == 0, r.stderr[-3000:]
        # Beside the checkpoint read, in its run; the invocation's new run folder, left with Hydra's
        # record and the log alone, is removed (outputs/unused_run_dir.py), with the run.root made for it.
        rows = [json.loads(line) for line in (chat_run / f"generations-{source.name.removesuffix('.ckpt')}.jsonl").read_text().splitlines()]
        assert not (tmp_path / name).exists()
        assert [row["prompt"] for row in rows] == ["What is a list?", "How do I sort?"] and all(row["chat"] for row in rows)
        outputs.append([(row["completion"], row["tokens"]) for row in rows])
    assert outputs[0] == outputs[1]


def test_eval_reproduces_the_validation_loss(chat_run, tmp_path):
    # `checkpoint=final` is looked up in the run of hydra.run.dir; eval.json is written there.
    r = run_cli(["mode=eval", "checkpoint=final"], chat_run)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((chat_run / "eval.json").read_text())
    # final.ckpt holds the weights the last validation (step 8) measured, on the same held-out split.
    assert result["loss"] == pytest.approx(logged(chat_run, "val_loss")[-1], rel=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"])) and result["tokens"] > 0
    # Where and how to build the run's data (the fix a refusal of its recorded cache folder names)
    # still scores the run's data: data.cache_dir had it score the default corpus (pydoc) silently.
    r = run_cli(["mode=eval", "checkpoint=final", f"data.cache_dir={tmp_path / 'elsewhere'}", "data.tokenize_workers=0"], chat_run)
    assert r.returncode == 0, r.stderr[-3000:]
    rebuilt = json.loads((chat_run / "eval.json").read_text())
    assert rebuilt["data"] == "chat" and rebuilt["loss"] == pytest.approx(result["loss"], rel=1e-6)
    assert (tmp_path / "elsewhere").is_dir()  # built there
    # On a file the command line names: all of it, not the held-out split a training run takes.
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: a list holds items in order, and sorted() returns a new one." for i in range(80)))
    r = run_cli(["mode=eval", f"checkpoint={chat_run / 'hf_export'}", "data=text", f"data.path={text}", "data.seq_len=32", f"data.cache_dir={tmp_path / 'cache'}"], tmp_path / "eval_text")
    assert r.returncode == 0, r.stderr[-3000:]
    other = json.loads((tmp_path / "eval_text" / "eval.json").read_text())
    assert other["data"] == "text" and other["split"] == "whole" and other["loss"] != result["loss"] and other["data_path"] == str(text)
    from transformers import AutoTokenizer

    # Every window of 32 tokens; 5% of them before (data.val_fraction).
    tokens = len(AutoTokenizer.from_pretrained(chat_run / "hf_export")(text.read_text())["input_ids"])
    assert other["tokens"] > 0.9 * tokens, (other, tokens)
    assert f"of {text}, all of it" in r.stdout


LM_EVAL_TASK = """task: tinytrain_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
"""


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval not installed (pip install -e '.[eval]')")
def test_lm_eval_local_task_on_the_export(chat_run, tmp_path):
    rows = [
        {"question": "What reverses a list in place?", "choices": ["my_list.reverse()", "banana"], "label": 0},
        {"question": "What returns the number of items?", "choices": ["elephant", "len()"], "label": 1},
        {"question": "What maps keys to values?", "choices": ["a dictionary", "a river"], "label": 0},
    ]
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tasks" / "tinytrain_local.yaml").write_text(LM_EVAL_TASK.format(data=tmp_path / "tasks" / "data.jsonl"))
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    args = ["mode=eval", "checkpoint=final", "eval.tasks=[tinytrain_local]", f"eval.include=[{tmp_path / 'tasks'}]", "eval.batches=1"]
    r = run_cli(args, chat_run, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((chat_run / "eval.json").read_text())["lm_eval"]["tinytrain_local"]
    assert result["sample_len"] == 3 and 0.0 <= result["acc,none"] <= 1.0
    assert (chat_run / "lm_eval_export" / "config.json").is_file()  # a checkpoint is exported for lm-eval first


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["mode=export"], "checkpoint.path"),
        (["mode=generate", "checkpoint=final"], "generate.prompts"),
        (["mode=average", "checkpoints=[a.ckpt]"], "checkpoint.average=['a.ckpt']: needs two or more checkpoints"),
        (["mode=average", "checkpoint.average_last=3"], "checkpoint.average_last=3"),
    ],
)
def test_errors_name_the_key_and_the_fix(args, says, tmp_path):
    r = run_cli([*args, f"run.root={tmp_path}"], None)
    assert r.returncode == 2 and says in r.stderr, r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # no runs/<timestamp>/ folder left for a refused command


def test_average_of_copies_of_one_checkpoint_gives_its_logits_and_of_two_their_mean(chat_run, tmp_path):
    """mode=average: k copies of one checkpoint average back to it exactly (float64 sums), and its
    export computes that checkpoint's logits; two checkpoints average to their element-wise mean."""
    import torch

    step4, step8 = (chat_run / "checkpoints" / f"step000000{n}.ckpt" for n in (4, 8))
    r = run_cli(["mode=average", f"checkpoints=[{step4},{step4},{step4}]", f"export.dir={tmp_path / 'copies'}"], tmp_path / "cli")
    assert r.returncode == 0, r.stderr[-3000:]
    averaged = chat_run / "checkpoints" / "average-k3-step0000004.ckpt"
    assert f"averaged 3 checkpoints (step0000004.ckpt, step0000004.ckpt, step0000004.ckpt) -> {averaged}" in r.stdout
    weights, original = checkpoint_weights(averaged), checkpoint_weights(step4)
    assert weights.keys() == original.keys() and all(torch.equal(weights[k], original[k]) for k in original)
    assert_export_matches(tmp_path / "copies", original, RUN, TRUE_VOCAB)
    # The run's newest two step checkpoints (step 4 and step 8), named by the run.
    r = run_cli(["mode=average", "checkpoint.average_last=2", "export.dir=" + str(tmp_path / "two")], chat_run)
    assert r.returncode == 0, r.stderr[-3000:]
    mean = checkpoint_weights(chat_run / "checkpoints" / "average-k2-step0000008.ckpt")
    later = checkpoint_weights(step8)
    for k in original:
        torch.testing.assert_close(mean[k], ((original[k].double() + later[k].double()) / 2).float(), rtol=0, atol=0)
    assert not torch.equal(mean["lm_head.weight"], later["lm_head.weight"])
    assert_export_matches(tmp_path / "two", mean, RUN, TRUE_VOCAB)


def test_average_last_at_the_end_and_a_refusal_of_checkpoints_of_another_shape(chat_run, tmp_path):
    """A run with checkpoint.average_last=2 averages its last two step checkpoints when it ends;
    a checkpoint of that (smaller) run does not average with chat_run's: exit 2 with the fix."""
    import torch

    other = tmp_path / "other"
    r = run_cli([*RUN, "model.hidden_size=32", "trainer.max_steps=4", "trainer.warmup_steps=1", "trainer.checkpoint_every_n_steps=2", "trainer.val_every_n_steps=4", "checkpoint.average_last=2", "generate.sample_prompts=[]"], other)
    assert r.returncode == 0, r.stderr[-3000:]
    averaged = other / "checkpoints" / "average-k2-step0000004.ckpt"
    assert f"averaged the last 2 step checkpoints (step0000002.ckpt, step0000004.ckpt) -> {averaged} and {other / 'hf_export-average-k2-step0000004'}" in r.stdout
    two, four, mean = (checkpoint_weights(other / "checkpoints" / name) for name in ("step0000002.ckpt", "step0000004.ckpt", averaged.name))
    for k in mean:
        torch.testing.assert_close(mean[k], ((two[k].double() + four[k].double()) / 2).float(), rtol=0, atol=0)
    assert_export_matches(other / "hf_export-average-k2-step0000004", mean, [*RUN, "model.hidden_size=32"], TRUE_VOCAB)
    theirs = other / "checkpoints" / "step0000002.ckpt"
    r = run_cli(["mode=average", f"checkpoints=[{chat_run / 'checkpoints' / 'step0000004.ckpt'},{theirs}]"], tmp_path / "cli")
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"checkpoint.average='{theirs}': holds another model shape: " in r.stderr and "Fix: average checkpoints of one run" in r.stderr
    assert "Traceback" not in r.stderr


def test_export_of_a_run_that_scaled_rope_equals_its_end_of_run_export(tmp_path, bundled_tokenizer):
    """mode=export of a fine-tune with model.rope_scaling builds the run's model config (it took
    the pretrained folder's unscaled RoPE before, and rewrote hf_export with it)."""
    from tests.conftest import save_fresh_model

    shape = [*MODEL, "model.max_position_embeddings=256"]
    base = save_fresh_model(tmp_path / "base", shape, bundled_tokenizer)
    run_dir = tmp_path / "run"
    scaling = "model.rope_scaling={rope_type:linear,factor:2.0,original_max_position_embeddings:256}"
    r = run_cli(["experiment=smoke", *MODEL, f"model.pretrained={base}", scaling, "trainer.max_steps=2", "trainer.warmup_steps=1", "trainer.progress_bar=false", "trainer.plot=false", "generate.sample_prompts=[]"], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    trained = json.loads((run_dir / "hf_export" / "config.json").read_text())
    assert trained["rope_parameters"]["rope_type"] == "linear"
    assert trained["max_position_embeddings"] == 512  # the extended context, x2 (it said the base's 256)
    r = run_cli(["mode=export", f"checkpoint={run_dir / 'checkpoints' / 'final.ckpt'}", f"export.dir={tmp_path / 'again'}"], tmp_path / "cli")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == trained


def test_eval_reads_the_validation_batches_of_a_pretraining_run(tmp_path):
    """A pretraining run whose held-out split (130 windows) is larger than what it validates on
    (trainer.val_batches=2 of micro batch 4): mode=eval on final reads the same batches and weighs
    them the same way (issue 36: it read the whole split, 6.8174 against a logged 6.7783)."""
    run_dir = tmp_path / "pretrain"
    r = run_cli(["experiment=smoke", *MODEL, "data.seq_len=32", "trainer.micro_batch_size=4", "trainer.max_steps=4", "trainer.progress_bar=false", "trainer.plot=false", "trainer.export=false"], run_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli(["mode=eval", "checkpoint=final", "trainer.micro_batch_size=16"], run_dir)  # the run's micro batch counts, not this one
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["batches"] == 2 and "the run's validation batches: trainer.val_batches=2" in r.stdout
    assert result["loss"] == pytest.approx(logged(run_dir, "val_loss")[-1], rel=1e-6)
    r = run_cli(["mode=eval", "checkpoint=final", "eval.batches=5"], run_dir)
    assert r.returncode == 0 and json.loads((run_dir / "eval.json").read_text())["batches"] == 5
