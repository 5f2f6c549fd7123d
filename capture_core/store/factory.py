"""`open_capture_store`: the one way to open a capture location that may be NeMo Gym's directory.

A local directory in NeMo Gym's file-store layout opens as `NemoGymFileStore`, in place;
any other location (local, `memory://`, S3) as `TokenCaptureStore`.
A directory holding both layouts raises `MixedLayoutError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from capture_core.store.base import CaptureStore
from capture_core.store.nemo_gym_store import nemo_gym_store_for
from capture_core.store.parent_index import DEFAULT_MAX_BYTES
from capture_core.store.tokcap_store import TokenCaptureStore


def open_capture_store(
    location: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    parent_index_bytes: int = DEFAULT_MAX_BYTES,
    weight_version_source: str | os.PathLike[str] | None = None,
) -> CaptureStore:
    """The capture store at `location`: NeMo Gym's directory in place, else tokcap's layout;
    either stamps puts from `weight_version_source` when given (`version_source`)."""
    found = nemo_gym_store_for(location, weight_version_source)
    if found is not None:
        return found
    return TokenCaptureStore(location, storage_options, parent_index_bytes, weight_version_source)
