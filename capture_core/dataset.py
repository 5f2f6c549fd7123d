"""The trainer's side of tokcap: verified, resumable rows, one run or every run at a place.

`RowConsumer(dest, run_id, name)` reads one run's rows parts; `RowStream(dest, name)` reads
every run a destination receives as one stream, following runs as they land, split across
`world_size` ranks (`capture_core.rows.stream`). Both verify each part against its batch's
receipt before yielding it and acknowledge create-only, so each part is consumed exactly
once per consumer name across crashes. `staleness_mask` and the corrections
(`weight_lag`, `truncated_importance_weights`, `importance_mask`) turn a part's versions and
log probs into what an asynchronous trainer applies. The mechanics live in
`capture_core.rows`; this module is their public face (docs/dataset.md).
"""

from __future__ import annotations

from capture_core.errors import (
    AlreadyAcknowledgedError,
    PartMismatchError,
    RowsNotWrittenError,
    UnreadableAcknowledgementError,
)
from capture_core.rows.corrections import (
    importance_mask,
    importance_ratio,
    truncated_importance_weights,
    weight_lag,
)
from capture_core.rows.row_consumer import (
    UNKNOWN_VERSION_POLICIES,
    RowConsumer,
    RowPart,
    stale_token_count,
    staleness_mask,
    unknown_version_count,
)
from capture_core.rows.stream import RowStream, WorldSizeChangedError

__all__ = [
    "UNKNOWN_VERSION_POLICIES",
    "AlreadyAcknowledgedError",
    "PartMismatchError",
    "RowConsumer",
    "RowPart",
    "RowStream",
    "RowsNotWrittenError",
    "UnreadableAcknowledgementError",
    "WorldSizeChangedError",
    "importance_mask",
    "importance_ratio",
    "stale_token_count",
    "staleness_mask",
    "truncated_importance_weights",
    "unknown_version_count",
    "weight_lag",
]
