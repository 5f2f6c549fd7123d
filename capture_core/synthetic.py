"""Moved to `capture_core.testing.synthetic`; this path keeps working for existing imports."""

from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout

__all__ = ["RolloutShape", "rollout_record", "synthetic_rollout"]
