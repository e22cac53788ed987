"""A training run reads values back from the device only once per optimizer step, however many
micro batches the step accumulates: on a GPU each read (`.item()`, `float(t)`, `nonzero`, ...)
makes the host wait for every queued kernel, so one per micro batch would stop the host from
queueing the next micro batch's work while the device runs this one's (tests/host_reads.py counts
them on a CPU, where they cost nothing).

The same run (packed pretraining windows) with 2 and with 4 micro batches per optimizer step, on
one process and under DeepSpeed (whose engine accumulates: Lightning calls the optimizer-step hooks
with every micro batch there): the reads tinytrain's own code asks for (the innermost frame outside
torch is in `tinytrain/`) come to the same count. The collators' (called by the data loader, on its
CPU tensors) are left out; so are transformers' (one per forward: whether the position ids hold
packed rows, as in a plain training loop over the same model) and Lightning's."""

import collections
import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow

STEPS = 3
RUN = ["experiment=smoke", f"trainer.max_steps={STEPS}", "trainer.val_every_n_steps=1000", "trainer.log_every_n_steps=1000", "trainer.progress_bar=false", "trainer.plot=false", "trainer.micro_batch_size=1"]
STRATEGIES = {"single": [], "zero2": ["parallel=zero2", "parallel.deepspeed_on_cpu=true"]}
# Lightning's precision plugin runs the hooks between a step's backward and its update there
# (on_before_optimizer_step, then the module's gradient clipping).
BEFORE_UPDATE = "lightning/pytorch/plugins/precision/"
EVALUATION_LOOP = "lightning/pytorch/loops/evaluation_loop.py"


def tinytrain_reads(tmp_path, strategy: str, accumulation: int, *extra: str) -> list[tuple[str, ...]]:
    name = "_".join([strategy, str(accumulation), *extra]).replace("=", "-")
    run_dir, out = tmp_path / name, tmp_path / f"{name}.json"
    args = [*RUN, *STRATEGIES[strategy], f"trainer.global_batch_size={accumulation}", *extra]
    result = run_cli(args, run_dir, env={"TT_TEST_HOST_READS": str(out)}, module="tests.integration.host_reads_cli")
    assert result.returncode == 0, result.stderr[-3000:]
    return [tuple(chain) for chain in json.loads(out.read_text())]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_micro_batches_inside_an_accumulation_read_nothing_back(tmp_path, strategy):
    two, four = (tinytrain_reads(tmp_path, strategy, accumulation) for accumulation in (2, 4))
    sites = {accumulation: collections.Counter(chain[0] for chain in chains) for accumulation, chains in ((2, two), (4, four))}
    assert sum(sites[2].values()) >= STEPS  # the count sees tinytrain's reads (once per step: the loss's, the norm's)
    assert sites[4] == sites[2], f"reads per site with 4 micro batches per step {dict(sites[4])}, with 2 {dict(sites[2])}"
    if strategy == "single":
        # And in the training loop all of them come between the backward and the update, where the
        # host waits for the backward anyway (the non-finite guard): none after the update is
        # queued, which would hold the next step's work back (the end-of-run summary reads the last
        # step's losses after the loop). DeepSpeed's engine measures the norm inside its step.
        # (The last step's validation, whose reads test_validation_batches_read_nothing_back counts, aside.)
        in_loop = [chain for chain in two if any(frame.startswith("lightning/pytorch/loops/") for frame in chain) and not any(frame.startswith(EVALUATION_LOOP) for frame in chain)]
        assert in_loop and all(any(frame.startswith(BEFORE_UPDATE) for frame in chain) for chain in in_loop), [chain[:3] for chain in in_loop]


def test_validation_batches_read_nothing_back(tmp_path):
    # Each batch's loss is weighed by its labelled tokens, counted on the device (the epoch's mean
    # is Lightning's, on the device too); the samples generated at the epoch's end read their tokens.
    def validation_sites(batches: int) -> collections.Counter:
        chains = tinytrain_reads(tmp_path, "single", 2, f"trainer.val_batches={batches}", f"trainer.val_every_n_steps={STEPS}")
        return collections.Counter(chain[0] for chain in chains if any(frame.startswith(EVALUATION_LOOP) for frame in chain))

    two, four = validation_sites(2), validation_sites(4)
    assert four == two, f"reads per site with 4 validation batches {dict(four)}, with 2 {dict(two)}"
