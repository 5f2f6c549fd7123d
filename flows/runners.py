"""Task runners for finalize batches: the default threads, or a Dask cluster (prefect-dask)."""

from __future__ import annotations

from typing import Any


def task_runner_from_spec(spec: str | None) -> Any:
    """`None`: Prefect's default; `dask`: a local cluster; `dask=ADDRESS`: an existing one."""
    if not spec:
        return None
    kind, _, address = spec.partition("=")
    if kind != "dask":
        raise ValueError(f"unknown task runner {spec!r}; use dask or dask=tcp://scheduler:8786")
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as exc:
        raise ValueError(
            "the dask task runner needs prefect-dask: pip install -e '.[dask]'"
        ) from exc
    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": 2,
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": None,
        }
    )
