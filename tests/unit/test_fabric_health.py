"""Fabric health (``healthMask`` of nvmlGpuFabricInfo) and registration waits, on fake NVML.

Masks are built from nvidia-ml-py's own ``NVML_GPU_FABRIC_HEALTH_MASK_*`` constants, so the
decoding is checked against NVML's definition, not against a copy of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mnnvl.errors import SpecError
from mnnvl.inputs.spec import VerifyConfig
from mnnvl.runtime import fabric_health, nvml
from mnnvl.runtime.verdict import judge
from tests.unit.fake_pynvml import FakeGpu, FakeNvml, gb200, h200
from tests.unit.test_baselines import sweep

pynvml = pytest.importorskip("pynvml")


def mask(**fields: int) -> int:
    """``mask(DEGRADED_BW=TRUE)`` from pynvml's shift constants."""
    value = 0
    for name, field_value in fields.items():
        value |= field_value << getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{name}")
    return value


TRUE = 1  # NVML_GPU_FABRIC_HEALTH_MASK_*_TRUE (the same value for every tri-state field)


@pytest.fixture
def imex(tmp_path: Path) -> str:
    path = tmp_path / "channel0"
    path.write_text("")
    return str(path)


def summaries(gpus: list[FakeGpu], imex: str) -> list[dict[str, Any]]:
    fake = FakeNvml(gpus)
    out = []
    for rank, gpu in enumerate(gpus):
        summary = nvml.check_gpus([gpu.uuid], nvml=fake, imex_path=imex)
        summary.update(rank=rank, host=f"worker-{rank}")
        out.append(summary)
    return out


def test_decoding_follows_nvmls_field_layout() -> None:
    assert pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE == TRUE
    value = mask(
        DEGRADED_BW=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE,
        ROUTE_RECOVERY=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE,
        ROUTE_UNHEALTHY=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE,
        ACCESS_TIMEOUT_RECOVERY=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_TRUE,
        INCORRECT_CONFIGURATION=(
            pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS
        ),
        GFM_STATE=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_GFM_STATE_CONNECTED,
    )
    assert fabric_health.decode_health_mask(value) == {
        "degraded_bw": "TRUE",
        "route_recovery": "FALSE",
        "route_unhealthy": "FALSE",
        "access_timeout_recovery": "TRUE",
        "incorrect_configuration": "INSUFFICIENT_NVLINKS",
        "partition_assigned": "NOT_SUPPORTED",
        "gfm_state": "CONNECTED",
    }
    for name, (shift, width) in fabric_health.HEALTH_FIELDS.items():
        key = name.upper()
        assert shift == getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{key}")
        assert width == getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_{key}")


def test_v3_fabric_info_gives_the_mask_and_the_health_summary(imex: str) -> None:
    gpu = gb200("GPU-0")
    gpu.health_mask = mask(DEGRADED_BW=TRUE)
    gpu.health_summary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
    fabric = summaries([gpu], imex)[0]["gpus"][0]["fabric"]
    assert fabric["health"]["degraded_bw"] == "TRUE"
    assert fabric["health_summary"] == "LIMITED_CAPACITY"


def test_a_driver_without_v3_falls_back_to_v2_and_still_decodes_the_mask(imex: str) -> None:
    gpu = gb200("GPU-0")
    gpu.fabric_versions = (2,)
    gpu.health_mask = mask(ROUTE_UNHEALTHY=TRUE)
    fabric = summaries([gpu], imex)[0]["gpus"][0]["fabric"]
    assert fabric["state"] == "COMPLETED" and fabric["health"]["route_unhealthy"] == "TRUE"
    assert fabric["health_summary"] is None


@pytest.mark.parametrize(
    ("field", "words"),
    [
        ("DEGRADED_BW", "degraded bandwidth"),
        ("ROUTE_UNHEALTHY", "unhealthy route"),
    ],
)
def test_degraded_or_unhealthy_fabric_fails_naming_gpu_and_node(
    imex: str, field: str, words: str
) -> None:
    sick = gb200("GPU-1")
    sick.health_mask = mask(**{field: TRUE})
    verdict = judge(VerifyConfig(), summaries([gb200("GPU-0"), sick], imex), sweep(800.0), 2)
    assert verdict["verdict"] == "FAIL"
    (reason,) = [r for r in verdict["reasons"] if words in r]
    assert reason.startswith("rank 1 on worker-1 NVIDIA GB200 (GPU-1)")
    assert f"NVML_GPU_FABRIC_HEALTH_MASK_{field}_TRUE" in reason
    health = next(c for c in verdict["checks"] if c["name"] == "fabric health")
    assert health["status"] == "FAIL"


def test_incorrect_configuration_fails_with_its_name(imex: str) -> None:
    sick = gb200("GPU-1")
    code = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS
    sick.health_mask = mask(INCORRECT_CONFIGURATION=code)
    verdict = judge(VerifyConfig(), summaries([gb200("GPU-0"), sick], imex), sweep(800.0), 2)
    assert verdict["verdict"] == "FAIL"
    assert any("incorrect configuration (INSUFFICIENT_NVLINKS" in r for r in verdict["reasons"])


def test_recovered_route_is_a_named_warning_not_a_failure(imex: str) -> None:
    healed = gb200("GPU-1")
    healed.health_mask = mask(ROUTE_RECOVERY=TRUE, DEGRADED_BW=2)  # degraded_bw FALSE
    verdict = judge(VerifyConfig(), summaries([gb200("GPU-0"), healed], imex), sweep(800.0), 2)
    assert verdict["verdict"] == "PASS", verdict["reasons"]
    (warn,) = [r for r in verdict["reasons"] if r.startswith("WARN:")]
    assert "rank 1 on worker-1" in warn and "recovered a route" in warn


def test_health_of_a_single_host_fabric_is_reported_not_judged(imex: str) -> None:
    # A host's own fabric manager (COMPLETED, clusterUuid zero, as on an HGX H200) is no
    # multi-node fabric: its health fields are named as warnings, the run is not failed.
    code = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NO_PARTITION
    gpus = [h200(f"GPU-{i}", fabric_state=3) for i in range(2)]
    gpus[1].health_mask = mask(INCORRECT_CONFIGURATION=code)
    verdict = judge(VerifyConfig(), summaries(gpus, imex), sweep(340.0), 2)
    assert verdict["verdict"] == "PASS", verdict["reasons"]
    assert any(r.startswith("WARN:") and "NO_PARTITION" in r for r in verdict["reasons"])


class Clock:
    """Fake time: ``sleep`` advances it and lets the fabric finish registering."""

    def __init__(self, gpu: FakeGpu, completes_at: float | None) -> None:
        self.now, self.gpu, self.completes_at = 0.0, gpu, completes_at

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.completes_at is not None and self.now >= self.completes_at:
            self.gpu.fabric_state = 3


def wait(gpu: FakeGpu, imex: str, clock: Clock, wait_s: float) -> dict[str, Any]:
    fake = FakeNvml([gpu])
    summary = fabric_health.wait_for_fabric(
        lambda: nvml.check_gpus([gpu.uuid], nvml=fake, imex_path=imex),
        wait_s,
        clock=clock,
        sleep=clock.sleep,
    )
    summary.update(rank=0, host="worker-0")
    return summary


def test_fabric_still_registering_is_waited_for_until_completed(imex: str) -> None:
    gpu = gb200("GPU-1")
    gpu.fabric_state = 2  # IN_PROGRESS
    clock = Clock(gpu, completes_at=7.0)
    late = wait(gpu, imex, clock, wait_s=60.0)
    assert late["gpus"][0]["fabric"]["state"] == "COMPLETED"
    assert 7.0 <= late["fabric_waited_s"] < 60.0
    other = summaries([gb200("GPU-0")], imex)[0]
    verdict = judge(VerifyConfig(), [other, late], sweep(800.0), 2)
    assert verdict["verdict"] == "PASS", verdict["reasons"]


def test_fabric_that_never_completes_fails_after_the_wait(imex: str) -> None:
    gpu = gb200("GPU-1")
    gpu.fabric_state = 1  # NOT_STARTED
    clock = Clock(gpu, completes_at=None)
    stuck = wait(gpu, imex, clock, wait_s=30.0)
    assert clock.now == pytest.approx(30.0)  # waited the whole budget, no longer
    verdict = judge(VerifyConfig(), [summaries([gb200("GPU-0")], imex)[0], stuck], sweep(800), 2)
    assert verdict["verdict"] == "FAIL"
    assert any(
        "registration is NOT_STARTED after waiting 30 s (--fabric-wait-s)" in r
        for r in verdict["reasons"]
    )


def test_a_fabric_wait_out_of_range_is_bad_input() -> None:
    with pytest.raises(SpecError, match="fabric_wait_s"):
        VerifyConfig(fabric_wait_s=-1.0)
