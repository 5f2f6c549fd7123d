"""The deployment definitions (`prefect.yaml`), installed as `flows.deployments` package data."""
