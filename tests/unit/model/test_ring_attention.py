"""The dp x cp x tp mesh ring attention runs on (model/ring_attention.py): tp innermost, cp next, dp
outermost; the ring check itself is tests/integration/test_ring_attention.py."""

import pytest

from tinytrain.model.ring_attention import MESH_DIMS, mesh_shape


@pytest.mark.parametrize("world, cp, tp, shape", [(2, 2, 1, (1, 2, 1)), (4, 2, 2, (1, 2, 2)), (8, 2, 2, (2, 2, 2)), (16, 4, 2, (2, 4, 2))])
def test_the_mesh_is_dp_by_cp_by_tp(world, cp, tp, shape):
    assert mesh_shape(world, cp=cp, tp=tp) == shape and MESH_DIMS == ("dp", "cp", "tp")


def test_a_world_the_split_does_not_divide_is_named():
    with pytest.raises(ValueError, match=r"cp\(4\) x tp\(2\) must divide the world size 12"):
        mesh_shape(12, cp=4, tp=2)
