"""parallel.cp_kind=ring's engine, torch's context parallel (flex-attention path), on two CPU ranks over
gloo: tests/integration/ring_worker.py on a dp 1 x cp 2 x tp 1 mesh.

What runs on CPU in torch 2.13 is the forward: the group's loss and every token's logits over packed
documents (load-balanced shards, block mask from the position ids, labels sharded in the tokens'
order) equal those with whole sequences. The backward does not (flex attention has none on CPU), which is why the plan
refuses cp_kind=ring for training; the test records torch's error so it fails the day torch lands
the backward, and the gradients can be compared here (benchmarks/gpu_check.py part e does on GPUs).
"""

import pytest
import torch

from tests.conftest import run_ranks

pytestmark = pytest.mark.slow

NO_CPU_BACKWARD = "FlexAttention does not support backward on CPU"


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ring")
    # The CPU's ring on a GPU machine too; where there is no GPU the variable is left as the test zygote
    # has it, so the ranks fork from it instead of paying a fresh interpreter's imports.
    hide_gpus = {"CUDA_VISIBLE_DEVICES": ""} if torch.cuda.is_available() else {}
    run_ranks("tests.integration.ring_worker", ["2", str(out)], 2, {"OMP_NUM_THREADS": "1", **hide_gpus}, local_rank=True)
    return torch.load(out / "ring_cp2_world2.pt", weights_only=False)


def test_ring_forward_over_two_ranks_equals_whole_sequences(two_ranks):
    assert two_ranks["device"] == "cpu"
    for rank in two_ranks["ranks"]:
        assert rank["local_tokens"] == 128  # each rank holds half of the 256 tokens
        # Packed documents: the whole-sequence reference masks them apart, so equality is isolation
        # too. Every token's logits, gathered back into order, are compared besides the loss (a
        # causal-only block mask moves this random model's loss by ~1e-4 but its logits by ~1).
        assert rank["loss_gap"] < 1e-6 and rank["logits_gap"] < 1e-5, rank


def test_ring_backward_on_cpu_is_torch_s_missing_kernel(two_ranks):
    for rank in two_ranks["ranks"]:
        assert NO_CPU_BACKWARD in rank["backward"], f"torch now runs flex attention's backward on CPU ({rank['backward']}): compare gradients here and lift plan/parallel.py's RING_OFF"
