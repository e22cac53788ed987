"""A run's process group is destroyed when the run ends normally (tinytrain/cluster/process_group.py):
left to interpreter exit, Gloo's threads can abort a finished run with SIGABRT."""

import torch.distributed as dist

from tinytrain.cluster import process_group


def test_a_run_that_made_a_group_destroys_it_and_one_that_did_not_is_left_alone(tmp_path):
    assert not dist.is_initialized() and process_group.release() is False
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert process_group.release() is True
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
