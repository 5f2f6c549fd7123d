"""The capture protocol: tokcap's layout on a byte store, and NeMo Gym's directory in place.

`CaptureStore` (base) is the one interface, with capability flags; `TokenCaptureStore`
(tokcap_store) and `NemoGymFileStore` (nemo_gym_store) implement it, and
`open_capture_store` (factory) picks one for a location. `WeightVersionSource`
(version_source) is the trainer's published weight version a store stamps on puts that carry
none. The store layer imports `storage`
and capture_core's vocabulary only; docs/store.md describes the guarantees.
"""

from capture_core.store.base import CaptureStore
from capture_core.store.factory import open_capture_store
from capture_core.store.nemo_gym_store import NemoGymFileStore
from capture_core.store.tokcap_store import TokenCaptureStore
from capture_core.store.version_source import WeightVersionSource

__all__ = [
    "CaptureStore",
    "NemoGymFileStore",
    "TokenCaptureStore",
    "WeightVersionSource",
    "open_capture_store",
]
