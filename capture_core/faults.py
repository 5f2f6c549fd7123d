"""Moved to `capture_core.testing.faults`; this path keeps working for existing imports."""

from capture_core.testing import faults as _moved
from capture_core.testing.faults import *  # noqa: F403

__all__ = _moved.__all__
