"""The training step-time split: warm-up steps left out also after a resume, phases by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mnnvl.inputs.spec import TrainConfig
from mnnvl.runtime import metrics
from mnnvl.runtime.parallel import DistInfo
from mnnvl.runtime.train import Trainer

torch.set_num_threads(1)


def trainer(info: DistInfo, ckpt: Path, steps: int) -> Trainer:
    cfg = TrainConfig(
        model="tiny",
        steps=steps,
        warmup_steps=1,
        log_every=1,
        checkpoint_dir=str(ckpt),
        allow_local_checkpoint=True,
    )
    return Trainer(cfg, info)


def test_resumed_run_leaves_its_own_first_steps_out_of_the_split(
    gloo_one_rank: None, tmp_path: Path
) -> None:
    info = DistInfo(rank=0, world_size=1, device=torch.device("cpu"))
    first = trainer(info, tmp_path, steps=6)
    first.run()
    assert first.split.steps == 4  # steps 3..6: steps 1 and 2 compile and warm up
    again = trainer(info, tmp_path, steps=10)
    again.resume()
    assert again.start_step == 6
    again.run()
    # Steps 7 and 8 are this process's warm-up; 9 and 10 are measured.
    assert again.split.steps == 2


def test_each_phase_is_timed_under_its_own_name(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 1.0, 3.0, 6.0])
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
    split = metrics.StepSplit(torch.device("cpu"), skip_first=0)
    split.begin()
    for phase in split.PHASES:
        split.mark(phase)
    split.collect()
    summary = split.summary(step_ms=7000.0)
    assert summary is not None
    assert (summary["forward"], summary["backward"], summary["optimizer"]) == (1e3, 2e3, 3e3)
    assert summary["other"] == 1e3


@pytest.mark.parametrize("marks", [["backward"], ["forward", "optimizer"], ["fwd"]])
def test_a_phase_marked_out_of_order_or_unknown_is_refused(marks: list[str]) -> None:
    split = metrics.StepSplit(torch.device("cpu"), skip_first=0)
    split.begin()
    with pytest.raises(ValueError, match="phase"):
        for phase in marks:
            split.mark(phase)
