"""The training entry's NVLink fabric probe: NVML's real call signatures, the GPU found by UUID."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pynvml
import pytest
import torch

from mnnvl.runtime import devices, parallel
from tests.unit.fake_pynvml import CLUSTER_A, FakeNvml, gb200, h200


def test_fake_nvml_has_the_real_signatures() -> None:
    fake = FakeNvml([])
    calls = [n for n in dir(fake) if n.startswith("nvml") and callable(getattr(fake, n))]
    assert "nvmlDeviceGetGpuFabricInfo" in calls
    for name in calls:
        real = list(inspect.signature(getattr(pynvml, name)).parameters)
        assert list(inspect.signature(getattr(fake, name)).parameters) == real, name


@pytest.fixture
def cuda_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch reports CUDA device 0 as the GPU whose UUID ends in -b (without the GPU- prefix,
    as torch prints it), the second GPU NVML lists: CUDA_VISIBLE_DEVICES renumbered it."""
    props = SimpleNamespace(uuid="fab-b")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)


def test_training_probe_reads_the_fabric_of_its_own_gpu_by_uuid(cuda_uuid: None) -> None:
    nvml = FakeNvml([gb200("GPU-fab-a", clique=7), gb200("GPU-fab-b", clique=9)])
    found = parallel.fabric_identity(torch.device("cuda", 0), nvml_module=nvml)
    assert found == f"{CLUSTER_A.hex()}/9"
    assert nvml.initialised == 0  # NVML shut down again


def test_training_probe_reads_no_fabric_on_h200(cuda_uuid: None) -> None:
    nvml = FakeNvml([h200("GPU-fab-a"), h200("GPU-fab-b")])
    assert parallel.fabric_identity(torch.device("cuda", 0), nvml_module=nvml) is None


def test_training_probe_on_cpu_reads_no_fabric() -> None:
    assert parallel.fabric_identity(torch.device("cpu"), nvml_module=FakeNvml([])) is None


def test_without_a_torch_uuid_the_nvml_id_follows_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert devices.nvml_ids(torch.device("cuda", 1)) == [5]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-x,GPU-y")
    assert devices.nvml_ids(torch.device("cuda", 0)) == ["GPU-x"]
