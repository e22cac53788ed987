"""The plan's host line (plan/host_memory.py): what each node's own memory holds at the build and
while training, against DeepSpeed's own estimator; the node's memory (MemAvailable and the Slurm
allocation); the refusal of a training run that cannot fit the node it starts on. (A real CPU
run's refusal is in tests/unit/test_bad_inputs.py; benchmarks/host_memory.py measures real runs
against the line.)"""

import pytest
from transformers import LlamaConfig

from tests.conftest import compose
from tinytrain.cli import run_stages
from tinytrain.cluster.node_memory import node_memory
from tinytrain.plan.host_memory import GIB, RUNTIME_BYTES, host_problem, plan_host, pretrained_bytes_per_param

P = 7_000_000_000
LARGEST_LAYER = 500_000_000


def gpu_host(*, world: int, per_node: int, offload_optimizer=False, offload_params=False, node_gib=None, **kw):
    args = dict(memory=None, params=P, trainable=P, world=world, ranks_per_node=per_node, on_gpu=True, pretrained=None, qlora=False, frozen_copy=False)
    args |= dict(offload_optimizer=offload_optimizer, offload_params=offload_params, save_host_bytes=0.0)
    if node_gib is not None:
        args["node"] = (node_gib * GIB, "the Slurm job's --mem")
    return plan_host(**{**args, **kw})


@pytest.mark.parametrize("nodes", [1, 2])
def test_per_node_the_build_and_the_offload_are_deepspeeds_own_estimate(nodes):
    """DeepSpeed's estimator, its 1.5x buffer factor left out: a model built without zero.Init
    costs 4 B x params x GPUs per node (every rank's fp32 build); the offloaded states alone are its
    zero_init=True figure (16 B, 18 B with the parameters, x params / nodes); without zero.Init,
    the larger of the two. The plan adds each process's runtime and rank 0's export at the end."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    per_node, world = 8, 8 * nodes

    def zero3(**kw) -> int:
        return estimate_zero3_model_states_mem_needs(P, LARGEST_LAYER, num_gpus_per_node=per_node, num_nodes=nodes, additional_buffer_factor=1.0, **kw)[0]

    plain = gpu_host(world=world, per_node=per_node)
    optimizer = gpu_host(world=world, per_node=per_node, offload_optimizer=True)
    both = gpu_host(world=world, per_node=per_node, offload_optimizer=True, offload_params=True)
    assert per_node * plain.build_bytes == pytest.approx(zero3(cpu_offload=False, zero_init=False), rel=1e-9)
    assert per_node * optimizer.training_bytes == pytest.approx(zero3(cpu_offload=True, cpu_offload_params=False, zero_init=True), rel=1e-9)
    assert per_node * both.training_bytes == pytest.approx(zero3(cpu_offload=True, cpu_offload_params=True, zero_init=True), rel=1e-9)
    for host, offload_params in ((optimizer, False), (both, True)):
        without_zero_init = zero3(cpu_offload=True, cpu_offload_params=offload_params, zero_init=False)
        assert per_node * max(host.build_bytes, host.training_bytes) == pytest.approx(without_zero_init, rel=1e-9)
        assert host.peak_bytes == max(per_node * (RUNTIME_BYTES + host.build_bytes), per_node * (RUNTIME_BYTES + host.training_bytes) + 4 * P)
    if nodes == 1:  # DeepSpeed's zero2 estimator takes its offload's max() over all GPUs, not one node's
        assert per_node * max(optimizer.build_bytes, optimizer.training_bytes) == pytest.approx(estimate_zero2_model_states_mem_needs(P, per_node, 1, cpu_offload=True, additional_buffer_factor=1.0)[0], rel=1e-9)
    # Two ranks a node: the offloaded states (and rank 0's export) outgrow the build and set the peak.
    small = gpu_host(world=2, per_node=2, offload_optimizer=True, offload_params=True)
    assert small.peak_bytes == pytest.approx(2 * RUNTIME_BYTES + 18 * P + 4 * P, rel=1e-9) and 18 * P > 2 * 4 * P


def test_a_pretrained_model_is_built_in_its_checkpoints_dtype_and_a_reference_copy_doubles_it():
    assert pretrained_bytes_per_param(LlamaConfig(dtype="bfloat16")) == 2
    assert pretrained_bytes_per_param(LlamaConfig(dtype="float16")) == 2
    assert pretrained_bytes_per_param(LlamaConfig()) == 4  # no dtype saved: transformers' default, fp32
    bf16 = gpu_host(world=8, per_node=8, pretrained=LlamaConfig(dtype="bfloat16"))
    assert bf16.build_bytes == 2 * P and "16-bit" in bf16.build_what
    assert gpu_host(world=8, per_node=8, pretrained=LlamaConfig(dtype="bfloat16"), frozen_copy=True).build_bytes == 4 * P
    assert gpu_host(world=8, per_node=8, qlora=True).build_bytes == 0  # quantized onto the GPU as it loads


def test_the_node_is_its_total_memory_bounded_by_the_slurm_allocation(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32768000 kB\nMemFree:         1000000 kB\nMemAvailable:    2000000 kB\n")
    # The node's total, not what is free at the moment: another rank of the node may have built its model already.
    assert node_memory({}, meminfo) == (32768000 * 1024, "MemTotal")
    assert node_memory({"SLURM_MEM_PER_NODE": "16000"}, meminfo) == (16000 * 2**20, "the Slurm job's --mem")
    assert node_memory({"SLURM_MEM_PER_NODE": "64000"}, meminfo) == (32768000 * 1024, "MemTotal")  # the machine binds
    assert node_memory({"SLURM_MEM_PER_NODE": "0"}, meminfo)[1] == "MemTotal"  # --mem=0: all of the node
    assert node_memory({"SLURM_MEM_PER_CPU": "2000", "SLURM_CPUS_ON_NODE": "4"}, meminfo) == (8000 * 2**20, "the Slurm job's --mem-per-cpu")
    assert node_memory({"SLURM_MEM_PER_GPU": "1000", "SLURM_GPUS_ON_NODE": "8"}, meminfo) == (8000 * 2**20, "the Slurm job's --mem-per-gpu")
    assert node_memory({}, tmp_path / "absent") == (None, "unknown (no /proc/meminfo)")


def test_a_gpu_node_that_cannot_hold_the_build_or_the_offload_is_named_with_the_fix():
    build = gpu_host(world=8, per_node=8, node_gib=200)  # 8 x (26 GiB + 1 GiB)
    assert build.node_bytes == 200 * GIB and build.fits is False
    problem = host_problem(build, on_gpu=True, model_name="llama2_7b", parallel_name="zero2")
    assert problem.key == "cluster.devices" and problem.value == 8
    assert "the model built in fp32 on the CPU before it moves to the GPU (26.1 GiB each)" in problem.message and "--mem" in problem.fix
    # Two ranks a node: the build fits, ZeRO-3's offload of a 7B model over 2 ranks does not.
    offload = gpu_host(world=2, per_node=2, offload_optimizer=True, offload_params=True, node_gib=100)
    problem = host_problem(offload, on_gpu=True, model_name="llama2_7b", parallel_name="zero3_offload")
    assert problem.key == "parallel" and problem.value == "zero3_offload" and "DeepSpeed's offloaded optimizer and parameters take 58.7 GiB per rank" in problem.message
    assert host_problem(gpu_host(world=16, per_node=4, node_gib=200), on_gpu=True, model_name="m", parallel_name="zero2") is None  # 4 a node fit
    assert host_problem(gpu_host(world=8, per_node=8), on_gpu=True, model_name="m", parallel_name="zero2") is None  # planned elsewhere: printed, not refused


def test_the_plan_prints_the_line_and_compares_it_only_on_the_machine_that_trains(tmp_path):
    here = run_stages(compose(["mode=plan"]), tmp_path / "here")
    assert here.host.node_bytes is not None and here.host.fits is True and here.host.ranks_per_node == 1
    assert "host       per node: 1.2 GiB at peak (training and the export, 1 process); fits:" in here.render()
    elsewhere = run_stages(compose(["mode=plan", "model=llama2_7b", "hardware.gpu=A800", "cluster.devices=8", "parallel=zero3"]), tmp_path / "elsewhere")
    assert elsewhere.host.node_bytes is None and elsewhere.host.fits is None
    assert elsewhere.host.build_bytes == 4 * elsewhere.params and elsewhere.to_dict()["host_memory"]["peak_bytes"] == elsewhere.host.peak_bytes
    lines = elsewhere.render()
    assert "host       per node: 202.0 GiB at peak (the build, 8 processes); the node's memory is not known here (planned for another machine)" in lines
    assert "build    8 x (1 GiB runtime + 24.25 GiB: the model built in fp32 on the CPU before it moves to the GPU) = 202.0 GiB" in lines
