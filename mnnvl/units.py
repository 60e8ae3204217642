"""Human-readable units for logs, reports and test reports."""

from __future__ import annotations


def human_bytes(n: int) -> str:
    """``1073741824`` -> ``1 GiB``; sizes that are not whole units stay in bytes."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"
