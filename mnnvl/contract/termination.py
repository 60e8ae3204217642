"""What a worker pod says about its own failure, handed to the driver through the container's
termination message (``terminationMessagePath``), so the driver reads it from pod status
without reading logs (standard library only).

The launcher (``mnnvl.runtime.launch``) writes one JSON object to ``TERMINATION_PATH`` before
it exits non-zero; the kubelet copies the file's first 4096 bytes into
``status.containerStatuses[].state.terminated.message`` (the API's limit per container). The
driver (``mnnvl.driver.gang``) parses it with :func:`parse`; a message that is not ours (a
user's own command, an old image) parses to ``None`` and the driver falls back to the exit
code alone.

Fields (every one optional but ``v``):
- ``v``: the format's version (1).
- ``verdict``: ``"retry"`` (a restart may clear it) or ``"stop"`` (no restart can change it:
  the program or module is missing, bad input, CUDA out of memory, a checkpoint that does not
  fit the model, the same error twice at the same step).
- ``reason``: a short machine-readable cause, :func:`mnnvl.contract.exit_codes.reason` of the
  pod's exit code: the classification table's (``"module-not-found"``, ``"program-not-found"``,
  ``"checkpoint-mismatch"``, ``"out-of-memory"``, ``"collective-timeout"``, ``"stalled"``, ...),
  else ``"crashed"`` or ``"killed"`` (a signal); hardware evidence is in the fields below.
- ``rank``: the global rank that failed first (the launcher saw it die first).
- ``local_rank``, ``gpu``: its local rank and the GPU it used (index or UUID) when known.
- ``exit_code``: that worker's exit code as a shell reports it (128 + N for signal N).
- ``step``: the last step (or sweep size) that worker reported done.
- ``error``: the worker's own words: its last lines (truncated to fit).
- ``nvlink``: per-GPU NVLink error counter deltas since the attempt started,
  ``{gpu: {"crc": n, "replay": n, "recovery": n}}``; only GPUs with a non-zero delta.
- ``fabric``: NVML fabric state/health words of a GPU that is not healthy (``{gpu: text}``).
- ``ecc``: per-GPU uncorrectable ECC errors or retired pages since the start (``{gpu: n}``).
- ``xid``: Xid events seen (``[[gpu, xid], ...]``) where readable.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# Kubernetes' default ``terminationMessagePath``; the Job builder sets it explicitly and names
# it in ``TERMINATION_PATH_ENV`` so the simulator's kubelet can point each pod at its own file.
TERMINATION_PATH = "/dev/termination-log"
TERMINATION_PATH_ENV = "MNNVL_TERMINATION_MESSAGE_PATH"
MAX_BYTES = 4096  # the kubelet keeps at most this much of the file
VERSION = 1

RETRY = "retry"
STOP = "stop"


@dataclass
class Evidence:
    """One failed attempt of one pod, as its launcher saw it."""

    verdict: str = RETRY
    reason: str = ""
    rank: int | None = None
    local_rank: int | None = None
    gpu: str | None = None
    exit_code: int | None = None
    step: str | None = None
    error: str = ""
    nvlink: dict[str, dict[str, int]] = field(default_factory=dict)
    fabric: dict[str, str] = field(default_factory=dict)
    ecc: dict[str, int] = field(default_factory=dict)
    xid: list[list[Any]] = field(default_factory=list)

    @property
    def hardware(self) -> bool:
        """Fabric or NVLink evidence: the node is suspect at its first failure."""
        return bool(self.nvlink or self.fabric or self.ecc or self.xid)

    def to_message(self) -> str:
        """The JSON text, at most ``MAX_BYTES`` bytes: ``error`` is cut from its start first."""
        body = {k: v for k, v in asdict(self).items() if v not in (None, "", {}, [])}
        body["v"] = VERSION
        text = json.dumps(body, separators=(",", ":"), sort_keys=True)
        excess = len(text.encode()) - MAX_BYTES
        if excess > 0:  # keep the error's last words: the cause is at the end of a traceback
            body["error"] = "…" + self.error.encode()[excess + 8 :].decode(errors="ignore")
            text = json.dumps(body, separators=(",", ":"), sort_keys=True)
        return text


def parse(message: str | None) -> Evidence | None:
    """The evidence in a container's termination message, or None when it holds none of ours."""
    if not message:
        return None
    try:
        body = json.loads(message)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        return None
    known = set(Evidence.__dataclass_fields__)
    return Evidence(**{k: v for k, v in body.items() if k in known})
