"""Tasks over a run's row consumers: whether a consumer acknowledged a batch's rows part.

Retirement after consumption asks this before retiring a batch; the logic lives in
`capture_core.rows.row_cursor`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capture_core.rows.row_cursor import Cursor
from capture_core.run.receipt import HandoffReceipt
from capture_core.run.run_layout import RunLayout
from capture_core.storage import open_byte_store
from tokcap.tasks.common import tokcap_task


@tokcap_task("check-acknowledged", "check consumer {consumer} acknowledged batch {receipt.batch}")
def acknowledged(
    dest: str,
    receipt: HandoffReceipt,
    consumer: str,
    storage_options: Mapping[str, Any] | None = None,
) -> bool:
    """Whether `consumer` acknowledged the receipt's rows part at the digest it certifies.

    An ack of other bytes raises (it counts for nothing); a batch without rows is never
    acknowledged.
    """
    layout = RunLayout(open_byte_store(dest, storage_options), receipt.run_id)
    return Cursor(layout, consumer, token="").acknowledged(receipt) is not None
