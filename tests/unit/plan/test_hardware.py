import pytest

from tinytrain.plan.hardware import (
    GPUS,
    gpu_from_device_name,
    known_gpu_names,
    lookup_gpu,
)


@pytest.mark.parametrize(
    "device_name, expected",
    [
        ("NVIDIA A800-SXM4-80GB", "A800"),
        ("NVIDIA A100-SXM4-40GB", "A100-40G"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("Tesla T4", "T4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H800", "H800"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 3090", "RTX3090"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
    ],
)
def test_device_names_map_to_table(device_name, expected):
    assert gpu_from_device_name(device_name, (0, 0)).name == expected


def test_unknown_gpu_keeps_its_capability_and_has_no_peak():
    g = gpu_from_device_name("NVIDIA Future 9000", (10, 0))
    assert g.compute_capability == (10, 0) and g.bf16 and g.peak_bf16_tflops is None
    old = gpu_from_device_name("Quadro P6000", (6, 1))
    assert not old.bf16


def test_table_is_consistent():
    for g in GPUS.values():
        assert g.bf16 == (g.compute_capability >= (8, 0)), g.name
        assert g.peak_fp16_tflops and g.memory_gb > 0
        assert (g.peak_bf16_tflops is not None) == g.bf16


def test_lookup_is_case_insensitive_with_aliases():
    assert lookup_gpu("a800").name == "A800"
    assert lookup_gpu("h100").name == "H100-SXM"
    assert lookup_gpu("nope") is None
    assert "V100" in known_gpu_names()
