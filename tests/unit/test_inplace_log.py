"""The line rank 0's launcher logs per in-place restart is the one the driver reads: each
becomes a record with how it restarted and what it cost, in order with recreated gangs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from mnnvl.driver.inplace import InPlaceLog, merged, restarts_words
from mnnvl.runtime.inplace import LINE

FAILED_AT = 1_796_307_084.28


def launcher_line(n: int = 1) -> str:
    return "2026-12-03 14:11:24,335 " + LINE.format(
        n=n, max=3, pod="train-1-abcde", node="node-b", rank=1, exit_code=137,
        reason="killed", step="step 15", at=FAILED_AT, ready_s=0.25,
    )  # fmt: skip


def test_an_in_place_restart_from_rank_0s_log_is_a_record_with_its_cost() -> None:
    log = InPlaceLog()
    log.line("[rank0] INFO mnnvl.runtime.train: step 15 loss 5.9 lr 0.001")
    log.line(launcher_line())
    log.line("[rank0] INFO mnnvl.runtime.checkpoint: resumed from /ckpt/r/step-10 (step 10)")
    log.line("[rank0] INFO mnnvl.runtime.train: step 11 loss 6.1 lr 0.001")
    (record,) = log.records()
    assert {k: record[k] for k in ("how", "pod", "node", "rank", "exit_code", "reason")} == {
        "how": "in-place",
        "pod": "train-1-abcde",
        "node": "node-b",
        "rank": 1,
        "exit_code": 137,
        "reason": "killed",
    }
    assert record["at"] == FAILED_AT and record["restart_s"] == 0.25
    assert record["steps_lost"] == 5  # the failed rank's step 15 less the checkpoint's 10
    assert record["recovery_s"] >= 0.25
    assert restarts_words(0, len(log)) == "restarts 1 (1 in place)"


@dataclass
class Recreated:
    """As ``mnnvl.driver.attempts.Restart``: when the driver saw the pod fail, and its record."""

    seen: float  # monotonic

    def record(self) -> dict[str, Any]:
        return {"how": "recreated", "pod": "train-0-xyz", "exit_code": 3}


def test_restarts_are_listed_in_the_order_they_happened_with_how() -> None:
    log = InPlaceLog()
    log.line(launcher_line())
    later = Recreated(seen=time.monotonic() + 1)
    both = merged([later], log)
    assert [(r["n"], r["how"]) for r in both] == [(1, "in-place"), (2, "recreated")]
