"""A training run reads values back from the device only once per optimizer step, however many
micro batches the step accumulates: on a GPU each read (`.item()`, `float(t)`, `nonzero`, ...)
makes the host wait for every queued kernel, so one per micro batch would stop the host from
queueing the next micro batch's work while the device runs this one's (tests/host_reads.py counts
them on a CPU, where they cost nothing).

The same run (packed pretraining windows) with 2 and with 4 micro batches per optimizer step: the
reads tinytrain's own code asks for (the innermost frame outside torch is in `tinytrain/`) come to
the same count. The collators' (called by the data loader, on its CPU tensors) are left out;
so are transformers' (one per forward: whether the position ids hold packed rows, as in a plain
training loop over the same model) and Lightning's."""

import collections
import itertools

import pytest

from tests.cli_in_process import run_in_process
from tests.host_reads import HostReads

pytestmark = pytest.mark.slow

# Lightning's precision plugin runs the hooks between a step's backward and its update there
# (on_before_optimizer_step, then the module's gradient clipping).
BEFORE_UPDATE = "lightning/pytorch/plugins/precision/"

STEPS = 3
RUN = ["experiment=smoke", f"trainer.max_steps={STEPS}", "trainer.val_every_n_steps=1000", "trainer.log_every_n_steps=1000", "trainer.progress_bar=false", "trainer.plot=false", "trainer.micro_batch_size=1"]


def asked_by_tinytrain(chain: tuple[str, ...]) -> bool:
    """A read asked for in tinytrain's code, not by a collator the data loader called (the
    outermost of the innermost run of tinytrain frames is then in tinytrain/data/)."""
    ours = list(itertools.takewhile(lambda frame: frame.startswith("tinytrain/"), chain))
    return bool(ours) and not ours[-1].startswith("tinytrain/data/")


def tinytrain_reads(tmp_path, name: str, accumulation: int) -> tuple[collections.Counter, list[tuple[str, ...]]]:
    with HostReads(sites=True) as reads:
        code, err = run_in_process([*RUN, f"trainer.global_batch_size={accumulation}", f"hydra.run.dir={tmp_path / name}"])
    assert code == 0, err[-3000:]
    ours = [chain for chain in reads.sites if asked_by_tinytrain(chain)]
    return collections.Counter(chain[0] for chain in ours), ours


def test_micro_batches_inside_an_accumulation_read_nothing_back(tmp_path):
    two, two_chains = tinytrain_reads(tmp_path, "two", 2)
    four, _ = tinytrain_reads(tmp_path, "four", 4)
    assert sum(two.values()) > 0  # the count sees tinytrain's reads (the guards' and the loss's, once per step)
    assert four == two, f"reads per site with 4 micro batches per step {dict(four)}, with 2 {dict(two)}"
    # And in the training loop all of them come between the backward and the update, where the host
    # waits for the backward anyway: none after the update is queued, which would hold the next
    # step's work back (the end-of-run summary reads the last step's losses after the loop).
    in_loop = [chain for chain in two_chains if any(frame.startswith("lightning/pytorch/loops/") for frame in chain)]
    assert in_loop and all(any(frame.startswith(BEFORE_UPDATE) for frame in chain) for chain in in_loop), [chain[:3] for chain in in_loop]
