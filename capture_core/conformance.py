"""Moved to `capture_core.testing.conformance`; this path keeps working for existing imports."""

from capture_core.testing import conformance as _moved
from capture_core.testing.conformance import *  # noqa: F403

__all__ = _moved.__all__
