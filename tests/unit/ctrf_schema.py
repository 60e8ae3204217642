"""A JSON Schema (draft 7) for CTRF reports, written from the CTRF specification.

Sources: https://ctrf.io/docs/specification/overview (root: ``reportFormat`` "CTRF",
``specVersion`` SemVer, ``results``), .../results (``tool``, ``summary``, ``tests``),
.../summary (the eight required counters and times, integers), .../test (``name``,
``status`` of passed|failed|skipped|pending|other, ``duration`` in ms, optional ``message``,
``rawStatus``, ``suite``), and the official schema's structure
(github.com/ctrf-io/ctrf, ``schema/ctrf.schema.json``: ``tool`` and ``summary`` allow no
other properties). Only what our report uses is constrained beyond the required fields.
"""

from __future__ import annotations

from typing import Any

STATUSES = ["passed", "failed", "skipped", "pending", "other"]
_INT = {"type": "integer"}
_STR = {"type": "string"}

SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["reportFormat", "specVersion", "results"],
    "properties": {
        "reportFormat": {"const": "CTRF"},
        "specVersion": {"type": "string", "pattern": r"^[0-9]+\.[0-9]+\.[0-9]+$"},
        "timestamp": {"type": "string", "format": "date-time"},
        "generatedBy": _STR,
        "extra": {"type": "object"},
        "results": {
            "type": "object",
            "required": ["tool", "summary", "tests"],
            "properties": {
                "tool": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "version": _STR,
                        "extra": {"type": "object"},
                    },
                    "additionalProperties": False,
                },
                "summary": {
                    "type": "object",
                    "required": [
                        "tests",
                        "passed",
                        "failed",
                        "skipped",
                        "pending",
                        "other",
                        "start",
                        "stop",
                    ],
                    "properties": {
                        key: _INT
                        for key in (
                            "tests",
                            "passed",
                            "failed",
                            "skipped",
                            "pending",
                            "other",
                            "flaky",
                            "suites",
                            "start",
                            "stop",
                            "duration",
                        )
                    }
                    | {"extra": {"type": "object"}},
                    "additionalProperties": False,
                },
                "tests": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "status", "duration"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "status": {"enum": STATUSES},
                            "duration": _INT,
                            "message": _STR,
                            "rawStatus": _STR,
                            "suite": {"type": "array", "minItems": 1, "items": _STR},
                        },
                    },
                },
            },
        },
    },
}
