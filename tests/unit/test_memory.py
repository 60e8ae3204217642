"""The per-GPU state estimate that refuses a model which cannot fit, and the OOM line."""

from __future__ import annotations

import pytest

from mnnvl.errors import SpecError
from mnnvl.runtime.memory import check_fits, oom_message
from mnnvl.runtime.model import preset

H200_GIB = 139.8  # what torch reports as one H200's total memory


def test_the_8b_preset_on_one_h200_is_refused_with_the_estimate() -> None:
    with pytest.raises(SpecError) as info:
        check_fits("8b", preset("8b"), world_size=1, compute_bytes=2, reshard=False,
                   device_gib=H200_GIB)  # fmt: skip
    assert info.value.exit_code == 2
    assert "~134.6 GiB per GPU" in str(info.value) and "more GPUs" in str(info.value)


def test_the_8b_preset_on_two_h200s_fits() -> None:
    need = check_fits("8b", preset("8b"), world_size=2, compute_bytes=2, reshard=False,
                      device_gib=H200_GIB)  # fmt: skip
    assert 70 < need < 80


def test_an_oom_is_one_line_with_the_configuration_and_the_levers() -> None:
    line = oom_message(
        "8b", batch_size=4, seq_len=8192, world_size=1, peak_gib=134.2, device_gib=H200_GIB
    )
    assert "\n" not in line
    for part in ("model 8b", "batch size 4", "sequence length 8192", "world size 1", "134.2 GiB"):
        assert part in line
    assert "--batch-size" in line and "--activation-checkpointing" in line
