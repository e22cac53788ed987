"""Every shipped sbatch script, and one written by mode=sbatch, runs unmodified on a real Slurm
and its training finishes.

Only what a CPU machine needs changes, and only the way a user would change it: sbatch options on
the command line (two tasks of one core; one node for the multi-node scripts) and tinytrain
overrides after the script (tiny run, `parallel=ddp` where a script asks for DeepSpeed, which needs
CUDA). The scripts' GPU requests stay: the test cluster's node has 8 fake GPUs.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_cli
from tests.integration.slurm_jobs import (
    BUNDLED_TOKENIZER,
    CPU_TASKS,
    SHORT_RUN,
    finish,
    job_env,
    submit,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SLURM_DIR = REPO / "slurm"

# Per script: sbatch options and tinytrain overrides on top of CPU_TASKS and SHORT_RUN.
SCRIPT_ARGS = {
    "single_node.sbatch": ([], []),
    "multi_node.sbatch": (["--nodes=1"], ["parallel=ddp"]),
    # TinyLlama's recipe on the tiny model with the bundled tokenizer and the pydoc corpus; bf16 stays.
    "a800_pretrain.sbatch": (["--nodes=1"], ["parallel=ddp", "model=tiny", "tokenizer=bundled", f"tokenizer.path={BUNDLED_TOKENIZER}", "data=pydoc", "data.path=null"]),
    # The fine-tuning recipe on a small pretrained folder and generated instructions; fp16 stays.
    "v100_finetune.sbatch": ([], ["parallel=ddp", "model.pretrained={pretrained}", "tokenizer.path={pretrained}", "data.path={instructions}"]),
}
# What each script asks for and keeps on the CPU.
PRECISION = {"single_node.sbatch": "32-true", "multi_node.sbatch": "32-true", "a800_pretrain.sbatch": "bf16-mixed", "v100_finetune.sbatch": "16-mixed"}


def scripts() -> list[str]:
    return sorted(p.name for p in SLURM_DIR.glob("*.sbatch"))


@pytest.fixture(scope="module")
def pretrained_tiny(tmp_path_factory):
    """A small Llama saved as a Hugging Face folder (weights + tokenizer), for the fine-tuning script."""
    import torch

    from tests.conftest import compose
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.plan.attention import AttentionChoice

    cfg = compose(["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128", "model.max_position_embeddings=256"])
    tok = load_from_config(cfg.tokenizer)
    torch.manual_seed(0)
    model = build_model(cfg.model, hf_config(cfg.model, len(tok), tok), AttentionChoice("sdpa", "test"))
    folder = tmp_path_factory.mktemp("pretrained_tiny")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def instructions(tmp_path_factory):
    path = tmp_path_factory.mktemp("sft") / "instructions.jsonl"
    records = [{"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"{i} + {i + 1} = {2 * i + 1}"} for i in range(64)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_every_script_is_covered():
    assert set(scripts()) == set(SCRIPT_ARGS)


@pytest.mark.parametrize("script", sorted(SCRIPT_ARGS))
def test_script_trains_on_slurm(script, slurm, pretrained_tiny, instructions, tmp_path):
    options, overrides = SCRIPT_ARGS[script]
    overrides = [o.format(pretrained=pretrained_tiny, instructions=instructions) for o in overrides]
    job_id = submit(slurm, SLURM_DIR / script, [*CPU_TASKS, *options], [*SHORT_RUN, *overrides], tmp_path)
    done = finish(slurm, job_id, tmp_path)
    # Both tasks ran Hydra and trained in one run directory, named by the job.
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [f"slurm-{job_id}"]
    assert "restart 0" in done.log
    assert "cluster    slurm: 1 node(s) x 2 device(s) per node, from allocation of Slurm job" in done.log
    assert "world size 2 = tp 1 x dp 2" in done.log
    assert "(first step) ->" in done.log
    assert sorted(done.losses()) == list(range(6))
    plan = json.loads((done.run_dir / "plan.json").read_text())
    assert plan["precision"]["value"] == PRECISION[script]


def test_script_rendered_by_mode_sbatch_trains_on_slurm(slurm, tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(["mode=sbatch", "cluster=slurm", "cluster.devices=2", "cluster.cpus_per_task=1", "cluster.partition=debug", "parallel=ddp", *SHORT_RUN], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "note: planned for cpu (no GPU here, no hardware.gpu): name the job's GPU" in r.stdout  # the job asks for GPUs
    job_id = slurm.sbatch(run_dir / "job.sbatch", env=job_env())
    done = finish(slurm, job_id, tmp_path, run_dir=run_dir)
    assert "world size 2 = tp 1 x dp 2" in done.log and "(first step) ->" in done.log
    assert "on localhost (rank 0 at 127.0.0.1)" in done.log  # MASTER_ADDR: the node's NodeAddr
    assert sorted(done.losses()) == list(range(6))
