"""Moved to `capture_core.testing.synthetic`; this path keeps working for existing imports."""

from capture_core.testing import synthetic as _moved
from capture_core.testing.synthetic import *  # noqa: F403

__all__ = _moved.__all__
