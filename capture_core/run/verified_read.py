"""Reading a handed-off part back only as its receipt certifies it: size and sha256 first.

`verify_part` re-reads a receipt's parts before retirement; `verified_bytes` returns a
part's bytes and `verified_decode` decodes them while their digest is computed beside it,
so bytes other than the certified ones are never returned or decoded into a result. A
missing or different part raises `PartMismatchError` naming the part, its run and what
follows for the caller. This module does not import Prefect.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent import futures
from typing import TypeVar

from capture_core.errors import PartMismatchError
from capture_core.run.receipt import HandoffReceipt
from capture_core.storage import ByteStore

T = TypeVar("T")
DIGEST_BESIDE_BYTES = 1 << 20
"""Parts at least this large are hashed on a thread beside their decode; a smaller one is
hashed first (well under a millisecond), since starting a thread costs a small part more."""


def verify_part(dest: ByteStore, receipt: HandoffReceipt) -> bytes:
    """Re-read the receipt's part, check its size and sha256 against the receipt, return it.

    A receipt that pins a rows part has it verified the same way first: retirement waits
    for both parts. A transient read failure propagates (retry it); a missing or different
    part raises `PartMismatchError` naming it, because it is not what the receipt certifies.
    """
    if receipt.rows is not None:
        verified_bytes(dest, receipt, receipt.rows.key, receipt.rows.bytes, receipt.rows.sha256)
    return verified_bytes(dest, receipt, receipt.part_key, receipt.bytes, receipt.sha256)


RETIRED_NOTHING = (
    "nothing of this batch was retired now, its captures are kept. Restore the part from a "
    "copy with that digest, then retire again"
)


def verified_bytes(
    dest: ByteStore,
    receipt: HandoffReceipt,
    key: str,
    size: int,
    sha256: str,
    consequence: str = RETIRED_NOTHING,
) -> bytes:
    """The bytes of part `key` when they are the `size` and `sha256` its receipt certifies;
    else `PartMismatchError` naming the part, the run and `consequence`."""
    stored = dest.get(key)
    digest = None if stored is None else hashlib.sha256(stored).hexdigest()
    if stored is not None and len(stored) == size and digest == sha256:
        return stored
    raise _part_mismatch(dest, receipt, key, stored, digest, size, sha256, consequence)


def verified_decode(
    dest: ByteStore,
    receipt: HandoffReceipt,
    key: str,
    size: int,
    sha256: str,
    decode: Callable[[bytes], T],
    consequence: str = RETIRED_NOTHING,
) -> T:
    """`decode` of part `key`'s bytes when they are the `size` and `sha256` its receipt
    certifies; else `PartMismatchError` as `verified_bytes` raises it.

    The digest is computed on a thread of its own while `decode` runs (hashlib releases the
    GIL), so a reader with a free core waits for the longer of the two, not their sum. What
    `decode` returns, or the `Exception` it raises, counts only once the digest agrees: bytes
    other than the certified ones are never returned, and their decode error is never the
    one reported. An interrupt (`KeyboardInterrupt`, `SystemExit`) is raised as it is. A
    part of the wrong size is refused before anything decodes it; one smaller than
    `DIGEST_BESIDE_BYTES` is verified first, then decoded on the calling thread.
    """
    stored = dest.get(key)
    if stored is None or len(stored) != size:
        digest = None if stored is None else hashlib.sha256(stored).hexdigest()
        raise _part_mismatch(dest, receipt, key, stored, digest, size, sha256, consequence)
    if size < DIGEST_BESIDE_BYTES:
        if (digest := hashlib.sha256(stored).hexdigest()) != sha256:
            raise _part_mismatch(dest, receipt, key, stored, digest, size, sha256, consequence)
        return decode(stored)

    def mismatch(digest: str) -> PartMismatchError:
        return _part_mismatch(dest, receipt, key, stored, digest, size, sha256, consequence)

    with futures.ThreadPoolExecutor(1, thread_name_prefix="tokcap-digest") as digesting:
        hashing = digesting.submit(lambda: hashlib.sha256(stored).hexdigest())
        try:
            decoded = decode(stored)
        except Exception:
            if (digest := hashing.result()) != sha256:
                raise mismatch(digest) from None
            raise
        if (digest := hashing.result()) != sha256:
            raise mismatch(digest)
    return decoded


def _part_mismatch(
    dest: ByteStore,
    receipt: HandoffReceipt,
    key: str,
    stored: bytes | None,
    digest: str | None,
    size: int,
    sha256: str,
    consequence: str,
) -> PartMismatchError:
    found = "is missing" if stored is None else f"has {len(stored)} bytes, sha256 {digest}"
    return PartMismatchError(
        f"batch {receipt.batch} of run {receipt.run_id}: part {dest.url}/{key} {found}, but "
        f"its receipt certifies {size} bytes, sha256 {sha256}; {consequence}"
    )
