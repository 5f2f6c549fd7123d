"""The deployment definitions (`prefect.yaml`), installed as `tokcap.deployments` package data."""
