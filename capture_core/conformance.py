"""Moved to `capture_core.testing.conformance`; this path keeps working for existing imports."""

from capture_core.testing.conformance import (
    CAPABILITY,
    CHECKS,
    ConformanceError,
    applies,
    check_conformance,
    run_check,
    run_conformance,
)

__all__ = [
    "CAPABILITY",
    "CHECKS",
    "ConformanceError",
    "applies",
    "check_conformance",
    "run_check",
    "run_conformance",
]
