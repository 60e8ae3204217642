"""Human-readable units for logs, reports and test reports."""

from __future__ import annotations


def human_bytes(n: int) -> str:
    """``1073741824`` -> ``1 GiB``; sizes that are not whole units stay in bytes."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def human_duration(seconds: float) -> str:
    """``42.3`` -> ``42 s``, ``250`` -> ``4 min 10 s``, ``7300`` -> ``2 h 1 min``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
