"""S3 batch deletes: a per-key failure inside a 200 reply is an error, never a success.

A loopback endpoint answers DeleteObjects the way S3 does when some keys cannot be deleted
(200, with `Error` elements); the store must raise, naming the keys, and a drop must not
claim it retired anything that is still there. Batches also go against the real moto server.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from capture_core.errors import CaptureStoreError
from capture_core.storage import FsspecStore
from capture_core.store import TokenCaptureStore
from tests.store.test_torn_puts import turns
from tests.support.reliability_figures import record_case
from tests.support.servers import FAKE_AWS_ENV

pytestmark = pytest.mark.integrity

RESULT_OPEN = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b'<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
)
PARTIAL_FAILURE = (
    RESULT_OPEN
    + b"<Deleted><Key>prefix/r1/e/b</Key></Deleted>"
    + b"<Error><Key>prefix/r1/e/a</Key><Code>AccessDenied</Code><Message>Access Denied</Message>"
    + b"</Error></DeleteResult>"
)
# A 200 reply that accounts for one of the two keys asked: neither deleted nor failed.
SILENT_OMISSION = RESULT_OPEN + b"<Deleted><Key>prefix/r1/e/b</Key></Deleted></DeleteResult>"


@pytest.fixture(params=[PARTIAL_FAILURE])
def partial_delete_endpoint(request) -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    reply = request.param

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_per_key_delete_error_in_a_200_reply_raises(partial_delete_endpoint, monkeypatch):
    endpoint, seen = partial_delete_endpoint
    for name, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    store = FsspecStore("s3://bucket/prefix", {"endpoint_url": endpoint})
    with pytest.raises(
        CaptureStoreError, match=r"refused to delete 1 of 2 .*prefix/r1/e/a.*Access"
    ):
        store.delete(["r1/e/a", "r1/e/b"])
    assert len(seen) == 1 and "delete" in seen[0], "one batch request for both keys"
    record_case("S3 batch delete reports per-key failures with 200", records_lost=0)


@pytest.mark.parametrize("partial_delete_endpoint", [SILENT_OMISSION], indirect=True)
def test_a_key_the_batch_reply_does_not_account_for_raises(partial_delete_endpoint, monkeypatch):
    endpoint, seen = partial_delete_endpoint
    for name, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    store = FsspecStore("s3://bucket/prefix", {"endpoint_url": endpoint})
    with pytest.raises(CaptureStoreError, match=r"1 of 2 .*prefix/r1/e/a.*not in the reply"):
        store.delete(["r1/e/a", "r1/e/b"])
    assert store.delete_each(["r1/e/a", "r1/e/b"]).keys() == {"r1/e/a"}
    assert len(seen) == 2, "one batch request per call"
    record_case("S3 batch delete reply silently omits a key", records_lost=0)


def test_drop_on_s3_deletes_in_batches_and_verifies(s3_url: str, s3_options) -> None:
    store = TokenCaptureStore(s3_url, s3_options)
    for item in turns("big", 30):
        store.put_now(item)
    snapshot = store.freeze_now("big")
    assert store.drop_now("big", snapshot.snapshot_id, snapshot.version)
    assert store.byte_store.list_prefix("big") == ["big/FROZEN", "big/RETIRED"]
