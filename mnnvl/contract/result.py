"""The worker's result line and its schema: rank 0 of an entry point ends with ``RESULT {json}``.

One definition for the writer (``mnnvl.runtime.train``/``verify``, or a user's own program run
by ``launch``) and every reader (the launcher step reading pod 0's log, the reports,
benchmarks and tests). Standard library only.
"""

from __future__ import annotations

import json
from typing import Any

RESULT_PREFIX = "RESULT "

PASS, FAIL, NOT_JUDGED = "PASS", "FAIL", "NOT_JUDGED"
VERDICTS = (PASS, FAIL, NOT_JUDGED)


def verdict_accepted(verdict: str, allow_unjudged: bool) -> bool:
    """The accept rule of a verification, for the worker's exit code and the launcher's step:
    PASS always; NOT_JUDGED (no threshold could be applied) only where the caller allowed it."""
    return verdict == PASS or (verdict == NOT_JUDGED and allow_unjudged)


# The keys the launcher side (steps, KFP metrics, reports) reads from each kind of result; a
# user's own program (``launch``) may print any JSON object.
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "train": ("final_loss", "tokens_per_s", "mfu", "steps", "world_size", "wall_s"),
    "verify": (
        "verdict",
        "threshold_gbps",
        "peak_busbw_gbps",
        "judged_busbw_gbps",
        "sizes",
        "world_size",
        "backend",
        "reasons",
    ),
}
# A one-rank sweep moves no data: its rows' algbw_gbps is null and busbw_gbps 0.
SIZE_ROW_KEYS = ("bytes", "time_us", "algbw_gbps", "busbw_gbps", "correct")
ONE_RANK = "n/a: one rank"  # what the reports show for the bandwidth of such a row


def emit_result(result: dict[str, Any]) -> None:
    """Print the result line (one line of compact JSON) and flush it."""
    print(RESULT_PREFIX + json.dumps(result, separators=(",", ":")), flush=True)


def parse_result(text: str) -> dict[str, Any] | None:
    """The last result line of ``text``, or None; ``ValueError`` when its JSON is broken."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith(RESULT_PREFIX):
            try:
                result = json.loads(line[len(RESULT_PREFIX) :])
            except ValueError as e:
                raise ValueError(f"the RESULT line is not valid JSON ({e}): {line[:200]}") from e
            return result if isinstance(result, dict) else {"value": result}
    return None


def schema_problems(result: dict[str, Any]) -> list[str]:
    """What a ``train``/``verify`` result lacks for the launcher side ([] when it is whole)."""
    kind = result.get("kind")
    problems = [f"missing {k}" for k in REQUIRED_KEYS.get(str(kind), ()) if k not in result]
    if kind == "verify":
        if result.get("verdict") not in VERDICTS:
            problems.append(f"verdict {result.get('verdict')!r} is not one of {VERDICTS}")
        for i, row in enumerate(result.get("sizes") or []):
            problems += [f"sizes[{i}] missing {k}" for k in SIZE_ROW_KEYS if k not in row]
    return problems
