"""The base of the error family and bad input, which the contract's own rules raise.

Standard library only, so ``mnnvl.contract.nccl`` (applied in the worker) refuses a bad
profile or a forbidden variable with the same ``SpecError`` (exit 2) as the launcher side.
The rest of the family is in ``mnnvl.errors``.
"""

from __future__ import annotations

from mnnvl.contract import exit_codes


class MnnvlError(Exception):
    """Base of every error this product raises on purpose. ``leftovers`` names what a
    teardown that could not finish may have left, ``cleanup`` the command that removes it."""

    exit_code = exit_codes.UNEXPECTED
    leftovers: tuple[str, ...] = ()
    cleanup = ""


class SpecError(MnnvlError, ValueError):
    """Bad input, found before anything was created. The message names the field."""

    exit_code = exit_codes.BAD_INPUT

    def __init__(self, field: str, message: str) -> None:
        self.field, self.detail = field, message
        super().__init__(f"{field}: {message}")
