"""Prefect flows and the `tokcap` command line."""
