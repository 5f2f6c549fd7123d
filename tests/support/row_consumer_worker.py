"""A trainer-like row consumer run as a real subprocess by the crash tests.

`python -m tests.support.row_consumer_worker DEST RUN_ID NAME LOG [ENDPOINT_URL]`: iterates the
consumer, appends `start <token>`, `yield <key> <rows>` and `acked <key>` lines to LOG (each
fsynced), and acknowledges each part after "training" on it. With `TOKCAP_KILL_BETWEEN`
set it SIGKILLs itself after the first yield, before acknowledging (the trainer died
mid-step); `TOKCAP_CRASH_AT` (`before-ack`, `after-ack`) kills it inside the ack.
"""

from __future__ import annotations

import os
import signal
import sys

from capture_core.dataset import RowConsumer


def log(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def main(dest: str, run_id: str, name: str, path: str, endpoint: str | None = None) -> int:
    options = {"endpoint_url": endpoint} if endpoint else None
    consumer = RowConsumer(dest, run_id, name, storage_options=options)
    log(path, f"start {consumer.cursor.token}")
    for part in consumer:
        tokens = sum(len(ids) for ids in part.table.column("token_ids").to_pylist())
        log(path, f"yield {part.key} {part.table.num_rows} {tokens}")
        if os.environ.get("TOKCAP_KILL_BETWEEN"):
            os.kill(os.getpid(), signal.SIGKILL)
        consumer.ack(part.key)
        log(path, f"acked {part.key}")
    log(path, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
