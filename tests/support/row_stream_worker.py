"""A trainer reading a whole destination through `RowStream`, run as a real subprocess.

`python -m tests.support.row_stream_worker DEST NAME LOG [ENDPOINT_URL]`: streams every part
present (`follow=False`), appends `yield <key>` and `acked <key>` lines to LOG (each fsynced)
and acknowledges each part after "training" on it. With `TOKCAP_KILL_BETWEEN` set it
SIGKILLs itself after the first yield, before acknowledging (the trainer died mid-step).
"""

from __future__ import annotations

import os
import signal
import sys

from capture_core.dataset import RowStream
from tests.support.row_consumer_worker import log


def main(dest: str, name: str, path: str, endpoint: str | None = None) -> int:
    options = {"endpoint_url": endpoint} if endpoint else None
    stream = RowStream(dest, name, storage_options=options, follow=False)
    for part in stream:
        log(path, f"yield {part.key}")
        if os.environ.get("TOKCAP_KILL_BETWEEN"):
            os.kill(os.getpid(), signal.SIGKILL)
        stream.ack(part.key)
        log(path, f"acked {part.key}")
    log(path, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
