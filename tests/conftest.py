"""Shared fixtures: config composition through Hydra's compose API, and the CLI in a subprocess."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_in_process import kept_environment
from tests.zygote import Zygote

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "tinytrain" / "conf"
SHARED_DATA = REPO.parent / "shared" / "data"
LLAMA2_TOKENIZER = SHARED_DATA / "llama2-tokenizer" / "tokenizer.model"

# DeepSpeed's compiled CPU ops (cpu_adam for the offload layouts, ~45-100 s on 2 cores; its
# shared-memory all-reduce is not built: cluster/deepspeed_comm.py) are built on
# first use into the venv, once per fresh venv (a CI run), and reused by every later test process,
# which inherits this.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
# This machine has no model or dataset hub: every test, and every process it starts, is offline, so a
# library that looks for the hub fails at once instead of retrying, and commands that ask for it
# explicitly (the lm-eval runs) have the zygote's environment (tests/zygote.py): no fresh interpreter.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Under pytest-xdist each worker (and every training process its tests start, which inherit this)
# gets one torch thread: with torch's default of a thread per core, two workers' runs on 2 cores
# oversubscribe them and OpenMP's waiting threads spin on cores the other worker needs (1.46x
# slower side by side in benchmarks/xdist_threads.py; the suite took 34 min instead of 13). Set
# before any test module imports torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# parallel=zero* through Lightning's DeepSpeedStrategy on DeepSpeed's CPU accelerator, two ranks over gloo.
DEEPSPEED_ON_CPU = ["cluster.devices=2", "parallel.deepspeed_on_cpu=true"]
# The throughput levers each strategy's CLI run takes once (issue 34). aot_eager: dynamo's graphs
# and AOT autograd's joint graph, as under inductor, without generating code (CI's time).
LEVERS = ["trainer.activation_checkpointing=selective", "trainer.compile=blocks", "trainer.compile_backend=aot_eager"]

needs_llama2 = pytest.mark.skipif(not LLAMA2_TOKENIZER.exists(), reason=f"../shared/data/llama2-tokenizer absent (looked at {LLAMA2_TOKENIZER})")


def compose(overrides: list[str] | tuple[str, ...] = ()):
    """The config `python -m tinytrain <overrides>` would run, composed in-process."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from tinytrain.config.resolvers import register_resolvers
    from tinytrain.config.schema import register_schemas

    register_resolvers()
    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def plan(overrides: list[str] | tuple[str, ...], run_dir: Path) -> dict:
    """plan.json's content for `python -m tinytrain mode=plan <overrides>`, planned in-process into
    run_dir (the cli's stages; plan.json and config_resolved.yaml are written there too)."""
    from tinytrain.cli import run_stages

    with kept_environment():
        return run_stages(compose(["mode=plan", *overrides]), run_dir).to_dict()


ZYGOTE = Zygote()


@pytest.fixture(autouse=True)
def _environment_kept_per_test():
    """What a test's in-process runs (or the libraries they import) set in os.environ ends with it."""
    with kept_environment():
        yield


@pytest.fixture(autouse=True, scope="module")
def _environment_kept_per_module():
    """As _environment_kept_per_test, for what a module's shared fixtures set."""
    with kept_environment():
        yield


def cli_env(env: dict | None) -> dict:
    """This process's environment for a CLI run, with `env` on top."""
    return {**os.environ, **(env or {})}


def local_ranks(args: list[str]) -> int:
    """The processes a command's cluster.devices starts on this host (1 where the args leave it to a preset)."""
    devices = [a.split("=", 1)[1] for a in args if a.startswith("cluster.devices=")]
    return int(devices[-1]) if devices and devices[-1].isdigit() else 1


def run_cli(args: list[str], run_dir: Path | None, env: dict | None = None, timeout: int = 600, module: str = "tinytrain") -> subprocess.CompletedProcess:
    """`python -m tinytrain args...` from the repo root, writing into run_dir (`module`: the same CLI
    with test instruments, tests.integration.instrumented_cli). run_dir None: the directory is the
    command's own (args name run.root, or it lands in the repository's runs/)."""
    full_env = cli_env(env)
    args = [*args, f"hydra.run.dir={run_dir}"] if run_dir is not None else list(args)
    if ZYGOTE.serves(full_env):  # forked from a process that imported torch and Lightning once, as are the ranks it starts
        return ZYGOTE.run(module, args, REPO, full_env, timeout, spare_ranks=local_ranks(args) - 1)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(args: list[str], run_dir: Path, env: dict | None = None, module: str = "tinytrain", new_session: bool = False, stdout: Path | None = None, stderr: Path | None = None):
    """`python -m module args...` started in the background from the repo root, writing into run_dir,
    its output appended to run_dir/out.log (or written to `stdout`, and `stderr` apart where given):
    a subprocess.Popen, or its stand-in for a child of the zygote (pid, poll, wait, send_signal, kill;
    tests/zygote.py). new_session: a session of its own, so a killpg reaches the ranks it starts
    (spares forked beside the command where served: they keep the zygote's command line, so a test
    finds them by their heartbeats' pids)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    full_env = cli_env(env)
    argv = [*args, f"hydra.run.dir={run_dir}"]
    append = stdout is None
    stdout = stdout or run_dir / "out.log"
    if ZYGOTE.serves(full_env):
        return ZYGOTE.popen(module, argv, REPO, full_env, stdout, stderr, append=append, new_session=new_session, spare_ranks=local_ranks(args) - 1)
    with stdout.open("a" if append else "w") as out, contextlib.ExitStack() as files:
        err = files.enter_context(stderr.open("w")) if stderr else subprocess.STDOUT
        return subprocess.Popen([sys.executable, "-m", module, *argv], cwd=REPO, env=full_env, stdout=out, stderr=err, start_new_session=new_session)


def run_ranks(module: str, args: list[str], world: int, env: dict | None = None, timeout: int = 600, local_rank: bool = False) -> list[str]:
    """`python -m module args` as ranks 0..world-1 of one gloo world on this host, all at once
    (forked from the zygote where the environment allows), asserting that every rank exited 0:
    each rank's output (stdout and stderr together). local_rank: LOCAL_RANK set beside RANK."""
    import tempfile

    base = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **(env or {})}
    logs = Path(tempfile.mkdtemp(prefix="ranks-"))
    procs = []
    for rank in range(world):
        rank_env = {**base, "RANK": str(rank), **({"LOCAL_RANK": str(rank)} if local_rank else {})}
        log = logs / f"rank{rank}.log"
        if ZYGOTE.serves(rank_env):
            procs.append(ZYGOTE.popen(module, args, REPO, rank_env, log))
        else:
            with log.open("w") as out:
                procs.append(subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=rank_env, stdout=out, stderr=subprocess.STDOUT))
    try:
        for proc in procs:
            proc.wait(timeout=timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outputs = [(logs / f"rank{rank}.log").read_text(errors="replace") for rank in range(world)]
    shutil.rmtree(logs, ignore_errors=True)
    assert all(proc.returncode == 0 for proc in procs), "\n".join(o[-3000:] for o in outputs)
    return outputs


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a rendezvous or a daemon binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_rows(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.csv, as the strings written."""
    with (run_dir / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def logged(run_dir: Path, key: str) -> list[float]:
    """Every value of one metric, in the order logged."""
    return [float(r[key]) for r in metrics_rows(run_dir) if r.get(key)]


def write_untrained_chat_rows_model(folder: Path, overrides: list[str], common_direction_std: float = 0.0) -> Path:
    """A tiny 'pretrained' Llama (+ its tokenizer) whose <|im_start|>/<|im_end|> rows were never
    trained: both embedding tables' rows for them scaled by 1e-4 (the Yi-6B case). Trained tables
    share a common direction (their mean row is far from 0); `common_direction_std` > 0 adds one,
    which the mean-row fix relies on."""
    import torch

    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.plan.attention import AttentionChoice

    cfg = compose([*overrides, 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'])
    tok = load_from_config(cfg.tokenizer)
    torch.manual_seed(0)
    model = build_model(cfg.model, hf_config(cfg.model, len(tok), tok), AttentionChoice("sdpa", "test"))
    untrained = [tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")]
    common = torch.randn(cfg.model.hidden_size) * common_direction_std if common_direction_std else None
    with torch.no_grad():
        for table in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            if common is not None:
                table += common
            table[untrained] *= 1e-4
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def save_fresh_model(folder: Path, overrides: list[str], tokenizer) -> Path:
    """A freshly initialised model of `overrides`' shape (seed 0), saved as a pretrained folder."""
    import torch

    from tinytrain.model.build import build_model, hf_config
    from tinytrain.plan.attention import AttentionChoice

    cfg = compose(overrides)
    torch.manual_seed(0)
    build_model(cfg.model, hf_config(cfg.model, len(tokenizer), tokenizer), AttentionChoice("sdpa", "test")).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def bundled_tokenizer():
    from tinytrain.data.tokenizer import load_tokenizer

    return load_tokenizer(str(REPO / "tinytrain" / "assets" / "bundled_tokenizer"))


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, options: str):
    """A tmpfs mounted on `folder` (root only) for the block; skips the test where mounting fails."""
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}) here: {r.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KB tmpfs (root only; skipped otherwise): a disk that a test's writes fill."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    folder = tmp_path / "small_disk"
    folder.mkdir()
    with mounted_tmpfs(folder, "size=64k"):
        yield folder


def pytest_sessionfinish(session):
    """Under pytest-xdist: a worker hands its zygote's counts to the controller's summary."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["zygote"] = json.dumps([ZYGOTE.forked, ZYGOTE.fresh, ZYGOTE.fresh_because])


ZYGOTE_COUNTS_OF_WORKERS: list[list] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    if "zygote" in getattr(node, "workeroutput", {}):
        ZYGOTE_COUNTS_OF_WORKERS.append(json.loads(node.workeroutput["zygote"]))


def pytest_terminal_summary(terminalreporter):
    """How many commands were forked from the zygotes, and what sent the others to a fresh interpreter."""
    counts = ZYGOTE_COUNTS_OF_WORKERS or [[ZYGOTE.forked, ZYGOTE.fresh, ZYGOTE.fresh_because]]
    forked, fresh = sum(c[0] for c in counts), sum(c[1] for c in counts)
    because: dict[str, int] = {}
    for c in counts:
        for key, n in c[2].items():
            because[key] = because.get(key, 0) + n
    if forked or fresh:
        reasons = ", ".join(f"{k} ({n})" for k, n in sorted(because.items(), key=lambda kv: -kv[1]))
        terminalreporter.write_line(f"test zygote: {forked} commands forked, {fresh} in fresh interpreters" + (f" (their environment differed in {reasons})" if reasons else ""))


def pytest_collection_modifyitems(config, items):
    """Longest first: under pytest-xdist (make test) a worker left alone with a long test at the
    end leaves the other core idle. Stable: modules keep their order within each class."""
    def cost(item) -> int:
        for rank, marker in enumerate(("longest", "slow", "long_module")):
            if item.get_closest_marker(marker):
                return rank
        return 3

    items.sort(key=cost)


def assert_checkpoint_size_estimated(run_dir: Path, name: str = "step0000004.ckpt", within: float = 0.10) -> None:
    """plan.json's size of one step checkpoint (tinytrain/plan/checkpoint_cost.py) against the
    checkpoint the run wrote (a file, or a folder of shards), within `within` of the real size."""
    import json

    plan = json.loads((run_dir / "plan.json").read_text())
    path = run_dir / "checkpoints" / name
    actual = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    estimate = plan["checkpoint"]["step_bytes"]
    assert abs(estimate - actual) <= within * actual, f"parallel={plan['parallel']['strategy']} {plan['precision']['value']}: estimated {estimate:,} B, wrote {actual:,} B"
