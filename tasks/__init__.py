"""Prefect tasks: thin, one concern each, over capture_core."""
