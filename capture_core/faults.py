"""Moved to `capture_core.testing.faults`; this path keeps working for existing imports."""

from capture_core.testing.faults import CRASH_ENV, CRASH_POINTS, crash_point

__all__ = ["CRASH_ENV", "CRASH_POINTS", "crash_point"]
