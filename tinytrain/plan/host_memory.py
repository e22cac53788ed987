"""Host memory per node: what the ranks of one node hold in the machine's own memory.

GPU memory has its line (plan/memory.py); host memory is where a run dies without one: every rank
builds the whole model on its CPU before the strategy moves or shards it (fp32 from the model
group, the checkpoint's dtype from model.pretrained; twice with a frozen preference reference),
so 8 ranks of a 7B model hold 8 x 28 GB at once, the figure DeepSpeed's own estimator gives for a
model built without `deepspeed.zero.Init` (`estimate_zero3_model_states_mem_needs(...,
zero_init=False)`: 4 B x params x GPUs per node). While training, the host holds what DeepSpeed
offloads (the fp32 master weights, gradients and Adam moments: 16 B per trainable parameter over
the ranks; ZeRO-3's 16-bit parameters, 2 B more), an async sharded save's staged copy, and on a
CPU run everything (the memory line's states and activations). Each process adds its own
footprint (imports, data loader, tokenizer; a GPU rank its CUDA context): RUNTIME_BYTES.

Where the plan is made on the machine that trains (mode=train, or mode=plan of this machine's own
run), the node's memory is known: MemTotal, bounded by the job's Slurm allocation. A run
whose exact part (the build, the offloaded states, a CPU run's states) does not fit is refused
before its data is built: the kernel's OOM killer would end it without a word. What only the
activation estimate pushes over is a warning.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.errors import Problem

GIB = 1024**3
# A training process's own footprint: 0.7 GiB peak RSS for the default CPU run (3M parameters,
# benchmarks/host_memory.py), most of it imports; a GPU rank's CUDA context adds to it.
RUNTIME_BYTES = 1 * GIB
ELSEWHERE = "not known here (planned for another machine)"
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


@dataclass(frozen=True)
class HostMemoryPlan:
    ranks_per_node: int
    build_bytes: float  # per rank: the model as built on the CPU
    build_what: str
    training_bytes: float  # per rank, on the host while training
    training_what: str
    export_bytes: float  # rank 0 at the end of the run: the final weights, the training state still held
    exact_bytes: float  # per node: what does not depend on the activation estimate
    peak_bytes: float  # per node: the larger of ranks x (runtime + build) and ranks x (runtime + training) + export
    node_bytes: int | None  # the node's memory where the plan runs on it, else None
    node_source: str

    @property
    def fits(self) -> bool | None:
        return None if self.node_bytes is None else self.peak_bytes <= self.node_bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "fits": self.fits}


def pretrained_bytes_per_param(pretrained) -> int:
    """transformers loads model.pretrained in its checkpoint's dtype (dtype="auto")."""
    dtype = getattr(pretrained, "dtype", None) or getattr(pretrained, "torch_dtype", None)
    return DTYPE_BYTES.get(str(dtype).removeprefix("torch."), 4)


def build_cost(params: int, *, pretrained, qlora: bool, frozen_copy: bool, on_gpu: bool) -> tuple[float, str]:
    """Bytes one rank builds on its CPU, and what they are."""
    if qlora and on_gpu:
        return 0.0, "QLoRA's base is quantized onto the GPU as it loads"
    per = pretrained_bytes_per_param(pretrained) if pretrained is not None else 4
    what = f"model.pretrained in its {per * 8}-bit dtype" if pretrained is not None else "the model built in fp32"
    copies = 2 if frozen_copy else 1
    if frozen_copy:
        what += " and its frozen reference copy"
    return float(params * per * copies), what + (" on the CPU before it moves to the GPU" if on_gpu else "")


def offloaded_bytes(params: int, trainable: int, world: int, *, offload_optimizer: bool, offload_params: bool) -> float:
    """DeepSpeed's offload per rank: fp32 master weights, gradients and Adam moments of the
    trainable parameters (4 + 4 + 8 B over the ranks), plus ZeRO-3's 16-bit parameters (2 B)."""
    total = 16.0 * trainable / world if offload_optimizer else 0.0
    return total + (2.0 * params / world if offload_params else 0.0)


def moments(ranks: int, build: float, training: float, export: float) -> tuple[float, float]:
    """Per node, the two moments the line compares: the build (every process holds its own), and
    training to the end (rank 0's export on top of what the processes still hold)."""
    return ranks * (RUNTIME_BYTES + build), ranks * (RUNTIME_BYTES + training) + export


def plan_host(
    *,
    memory,
    params: int,
    trainable: int,
    world: int,
    ranks_per_node: int,
    on_gpu: bool,
    pretrained,
    qlora: bool,
    frozen_copy: bool,
    offload_optimizer: bool,
    offload_params: bool,
    save_host_bytes: float,
    node: tuple[int | None, str] = (None, ELSEWHERE),
) -> HostMemoryPlan:
    """`memory`: the plan's MemoryPlan (per GPU; on a CPU run, per process); `node`: node_memory()
    where the plan runs on the machine that trains."""
    build, build_what = build_cost(params, pretrained=pretrained, qlora=qlora, frozen_copy=frozen_copy, on_gpu=on_gpu)
    if on_gpu:
        offload = offloaded_bytes(params, trainable, world, offload_optimizer=offload_optimizer, offload_params=offload_params)
        exact_training = training = offload + save_host_bytes
        parts = (["DeepSpeed's offloaded " + ("optimizer and parameters" if offload_params else "optimizer")] if offload else []) + (["the checkpoint save's host copy"] if save_host_bytes else [])
        training_what = " + ".join(parts) or "nothing beyond the process"
    else:
        states = (memory.params_gib + memory.grads_gib + memory.optimizer_gib + memory.reference_gib) * GIB
        exact_training = states + save_host_bytes
        # The states and the activations (counted in the run's own dtype: plan/activations.py)
        # summed, not the step's peak (plan/step_peak.py): glibc's heap keeps what the activations
        # and the gradients each held at their turn, and a process's resident size follows it
        # (benchmarks/README.md: 150M parameters read 1.02x the sum).
        training = states + memory.activations_gib * GIB + save_host_bytes
        training_what = "the whole run on the CPU: the memory line's states and activations"
    node_bytes, node_source = node
    export = 4.0 * params  # rank 0 loads the final fp32 weights from the checkpoint to export them
    return HostMemoryPlan(
        ranks_per_node=ranks_per_node,
        build_bytes=build,
        build_what=build_what,
        training_bytes=training,
        training_what=training_what,
        export_bytes=export,
        exact_bytes=max(moments(ranks_per_node, build, exact_training, export)),
        peak_bytes=max(moments(ranks_per_node, build, training, export)),
        node_bytes=node_bytes,
        node_source=node_source,
    )


def host_problem(host: HostMemoryPlan, *, on_gpu: bool, model_name: str, parallel_name: str) -> Problem | None:
    """A run whose exact host memory does not fit the node it runs on, named by what to change."""
    if host.node_bytes is None or host.exact_bytes <= host.node_bytes:
        return None
    need = f"{host.ranks_per_node} process(es) on this node need {host.exact_bytes / GIB:.1f} GiB of host memory before any activation, and it has {host.node_bytes / GIB:.1f} GiB ({host.node_source})"
    if not on_gpu:
        return Problem(
            "model",
            model_name,
            f"a CPU run holds its weights, gradients and optimizer state in host memory, and rank 0 the final weights again to export them: {need}",
            "a smaller model, fewer processes (cluster.devices), or plan it for GPUs (mode=plan hardware.gpu=H100 ...)",
        )
    if host.build_bytes >= host.training_bytes:
        return Problem(
            "cluster.devices",
            host.ranks_per_node,
            f"every rank holds {host.build_what} ({host.build_bytes / GIB:.1f} GiB each): {need}",
            "ask the job for more host memory (Slurm --mem, hydra.launcher.mem_gb) or run fewer ranks per node on more nodes",
        )
    return Problem(
        "parallel",
        parallel_name,
        f"{host.training_what} take {host.training_bytes / GIB:.1f} GiB per rank: {need}",
        "offload less (parallel=zero3 where the GPUs hold it: see the memory line), spread over more nodes, or ask for more host memory (Slurm --mem)",
    )


def render(h: dict) -> list[str]:
    n, runtime = h["ranks_per_node"], f"{RUNTIME_BYTES / GIB:.0f} GiB runtime"
    at_build, at_end = moments(n, h["build_bytes"], h["training_bytes"], h["export_bytes"])
    head = f"host       per node: {h['peak_bytes'] / GIB:.1f} GiB at peak ({'the build' if at_build >= at_end else 'training and the export'}, {n} process{'es' if n > 1 else ''})"
    detail = [
        f"           build    {n} x ({runtime} + {h['build_bytes'] / GIB:.2f} GiB: {h['build_what']}) = {at_build / GIB:.1f} GiB",
        f"           training {n} x ({runtime} + {h['training_bytes'] / GIB:.2f} GiB: {h['training_what']}) + {h['export_bytes'] / GIB:.2f} GiB of rank 0's export (the final fp32 weights) = {at_end / GIB:.1f} GiB",
    ]
    if h["node_bytes"] is None:
        return [f"{head}; the node's memory is {h['node_source']}", *detail]
    avail = f"{h['node_bytes'] / GIB:.1f} GiB ({h['node_source']})"
    if h["fits"]:
        return [f"{head}; fits: {avail}", *detail]
    if h["exact_bytes"] > h["node_bytes"]:
        return [f"{head}; does NOT fit: {h['exact_bytes'] / GIB:.1f} GiB before any activation, {avail}: a run is refused", *detail]
    warning = "           warning: over this node's memory by the activation estimate alone: the kernel may kill the run; lower trainer.micro_batch_size or data.seq_len, or set trainer.activation_checkpointing=full"
    return [f"{head}; {avail}", *detail, warning]
