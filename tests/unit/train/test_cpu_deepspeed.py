"""parallel.deepspeed_on_cpu (the tests' DeepSpeed on its CPU accelerator): DeepSpeed's CPU backend
would compile its shared-memory all-reduce (inference only) when deepspeed.comm starts; the strategy
and Ulysses under fsdp_tp mark it unavailable first (tinytrain/cluster/deepspeed_comm.py), so no
process pays the build."""

from tinytrain.cluster.deepspeed_comm import skip_shared_memory_all_reduce


def test_the_shared_memory_all_reduce_is_not_built(monkeypatch, tmp_path):
    import deepspeed.ops
    from deepspeed.comm.torch import build_shm_op

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # a build would land here
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", True)
    skip_shared_memory_all_reduce()
    assert build_shm_op() is None
    assert list(tmp_path.iterdir()) == []
