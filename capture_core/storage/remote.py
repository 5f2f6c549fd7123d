"""`FsspecStore`: the byte store on any fsspec filesystem (S3 and S3-compatible, memory, others).

Creates use `pipe_file(mode="create")`, which S3 sends as a conditional `If-None-Match: *` PUT.
`memory://` lives inside one process, so a process lock makes its create atomic for every client.
Any other filesystem's create is check-then-write: it is refused, never emulated.
S3 clients are built without a listing cache and with deliberate, bounded retries.
Backend exceptions are translated here, so no caller catches botocore.
`s3fs` and `botocore` are imported only when an S3 URL is opened.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import fsspec

from capture_core.errors import (
    CaptureStoreError,
    InvalidInputError,
    LocationMissingError,
    StoreUnavailableError,
)
from capture_core.storage.base import ByteStore, check_key, check_new_object, is_reserved
from capture_core.storage.endpoints import is_connection_error, unreachable_message
from capture_core.storage.locations import S3_PROTOCOLS, is_s3, refuse_misspelled, url_scheme
from capture_core.storage.options import S3_CLIENT_RETRIES, s3_options

_MEMORY_CREATE_LOCK = threading.Lock()
ATOMIC_CREATE_PROTOCOLS = (*S3_PROTOCOLS, "memory")
S3_DELETE_BATCH = 1000  # the most keys one S3 DeleteObjects request takes


def filesystem_for(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem and path of a URL, with the deliberate S3 defaults applied."""
    refuse_misspelled(url)
    options = dict(storage_options or {})
    s3 = is_s3(url)
    fs, path = fsspec.core.url_to_fs(url, **(s3_options(options) if s3 else options))
    if s3:
        fs.retries = S3_CLIENT_RETRIES
    return fs, path


class FsspecStore(ByteStore):
    """A byte store at an fsspec URL; `storage_options` go to the filesystem constructor."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self._options = dict(storage_options or {})
        protocol = url_scheme(url) if "::" not in url else None
        if protocol not in ATOMIC_CREATE_PROTOCOLS:
            raise InvalidInputError(
                f"storage at {url} cannot be used: tokcap needs an atomic create-only write "
                f"and only {', '.join(ATOMIC_CREATE_PROTOCOLS)} URLs and local paths provide "
                "one here (elsewhere a create is check-then-write, so two writers could "
                "overwrite each other); use a local path or an S3-compatible endpoint"
            )
        self.fs, root = filesystem_for(self.url, self._options)
        self._root = root.rstrip("/")
        self._is_s3 = protocol in S3_PROTOCOLS

    def __reduce__(self) -> tuple[type[FsspecStore], tuple[str, dict[str, Any]]]:
        return (FsspecStore, (self.url, self._options))

    def _path(self, key: str) -> str:
        return f"{self._root}/{check_key(key)}"

    def _relative(self, path: str) -> str:
        return path[len(self._root) + 1 :] if path.startswith(self._root + "/") else path

    def _translate(self, exc: Exception, what: str) -> Exception:
        if isinstance(exc, (FileNotFoundError, FileExistsError, CaptureStoreError)):
            return exc
        if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            return PermissionError(
                f"no usable credentials for {self.url} while trying to {what}; set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an AWS profile), or pass "
                "key/secret storage options"
            )
        if is_connection_error(exc):
            if self._is_s3:
                return StoreUnavailableError(
                    unreachable_message(self.url, what, exc, self._options)
                )
            return StoreUnavailableError(
                f"storage at {self.url} is unreachable while trying to {what}: "
                f"{type(exc).__name__}: {exc}; check the endpoint and network, then retry"
            )
        if isinstance(exc, PermissionError):
            return PermissionError(
                f"storage at {self.url} refused to {what}: {exc}; check the credentials "
                "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or storage options) and permissions"
            )
        if isinstance(exc, OSError):
            return StoreUnavailableError(f"storage at {self.url} failed to {what}: {exc}")
        return CaptureStoreError(
            f"storage at {self.url} failed to {what}: {type(exc).__name__}: {exc}"
        )

    def probe(self, must_exist: bool) -> None:
        if self._is_s3:
            bucket = self._root.split("/", 1)[0]
            try:
                self.fs.call_s3("head_bucket", Bucket=bucket)
            except FileNotFoundError as exc:
                raise LocationMissingError(
                    f"bucket {bucket!r} of {self.url} does not exist; create it or fix the URL"
                ) from exc
            except Exception as exc:
                raise self._translate(exc, f"reach bucket {bucket!r}") from exc
        elif must_exist and not self.fs.exists(self._root):
            raise LocationMissingError(f"store root {self.url} does not exist")

    def get(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(self._path(key))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._translate(exc, f"read {key}") from exc

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        if len(keys) < 2:
            return super().get_many(keys)
        paths = [self._path(key) for key in keys]
        try:
            found = self.fs.cat(paths, on_error="return")
        except Exception as exc:
            raise self._translate(exc, f"read {len(keys)} objects") from exc
        out: dict[str, bytes | None] = {}
        for key, path in zip(keys, paths, strict=True):
            value = found.get(path, found.get(self.fs._strip_protocol(path)))
            if isinstance(value, FileNotFoundError):
                out[key] = None
            elif isinstance(value, Exception):
                raise self._translate(value, f"read {key}") from value
            else:
                out[key] = value
        return out

    def create(self, key: str, data: bytes) -> bool:
        path = f"{self._root}/{check_new_object(key, data)}"
        try:
            if self._is_s3:
                self.fs.pipe_file(path, data, mode="create")
            else:
                with _MEMORY_CREATE_LOCK:
                    self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        except Exception as exc:
            raise self._translate(exc, f"create {key}") from exc
        return True

    def replace(self, key: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(self._path(key), data)
        except Exception as exc:
            raise self._translate(exc, f"write {key}") from exc

    def exists(self, key: str) -> bool:
        try:
            return bool(self.fs.exists(self._path(key)))
        except Exception as exc:
            raise self._translate(exc, f"check {key}") from exc

    def list_prefix(self, prefix: str) -> list[str]:
        try:
            found = self.fs.find(self._path(prefix))
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._translate(exc, f"list {prefix}") from exc
        keys = (self._relative(path) for path in found)
        return sorted(k for k in keys if not any(is_reserved(part) for part in k.split("/")))

    def list_children(self, prefix: str) -> list[str]:
        path = self._path(prefix) if prefix else self._root
        try:
            found = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._translate(exc, f"list {prefix or 'the root'}") from exc
        names = {p.rstrip("/").rsplit("/", 1)[-1] for p in found} - {""}
        return sorted(name for name in names if not is_reserved(name))

    def delete(self, keys: Iterable[str], *, durable: bool = True) -> None:
        keys = list(keys)
        if not self._is_s3:
            self._delete_one_by_one([self._path(key) for key in keys])
            return
        failed = self.delete_each(keys, durable=durable)
        if failed:
            shown = "; ".join(f"{self._path(key)} ({why})" for key, why in list(failed.items())[:5])
            more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
            raise CaptureStoreError(
                f"storage at {self.url} refused to delete {len(failed)} of {len(keys)} objects: "
                f"{shown}{more}; check delete permissions (s3:DeleteObject), then retry"
            )

    def _delete_one_by_one(self, paths: list[str]) -> None:
        try:
            for path in paths:
                if self.fs.exists(path):
                    self.fs.rm_file(path)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._translate(exc, f"delete {len(paths)} objects") from exc

    def delete_each(self, keys: Iterable[str], *, durable: bool = True) -> dict[str, str]:
        """On S3, batches of up to 1,000 keys, each key's result checked (`_delete_s3_batch`)."""
        if not self._is_s3:
            return super().delete_each(keys, durable=durable)
        paths = {self._path(key): key for key in keys}
        failed: dict[str, str] = {}
        batch: list[str] = []
        for path in paths:
            batch.append(path)
            if len(batch) == S3_DELETE_BATCH:
                failed.update(self._delete_s3_batch(batch))
                batch = []
        if batch:
            failed.update(self._delete_s3_batch(batch))
        return {paths[path]: why for path, why in failed.items()}

    def _delete_s3_batch(self, paths: list[str]) -> dict[str, str]:
        """One DeleteObjects request; return each path it did not delete, with why.

        S3 answers 200 and reports each key in `Deleted` or `Errors`; s3fs drops both, so the
        request is sent here and the reply compared with what was asked: a key in neither
        list was not deleted. A key that did not exist counts as deleted.
        """
        bucket = self._root.split("/", 1)[0]
        objects = [{"Key": path.split("/", 1)[1]} for path in paths]
        try:
            reply = self.fs.call_s3(
                "delete_objects", Bucket=bucket, Delete={"Objects": objects, "Quiet": False}
            )
        except Exception as exc:
            raise self._translate(exc, f"delete {len(paths)} objects") from exc
        done = {f"{bucket}/{item.get('Key')}" for item in reply.get("Deleted") or ()}
        errors: dict[str, str] = {}
        for error in reply.get("Errors") or ():
            path = f"{bucket}/{error.get('Key')}"
            if error.get("Code") == "NoSuchKey":
                done.add(path)
            else:
                errors[path] = f"{error.get('Code')}: {error.get('Message')}"
        missing = {
            path: "not in the reply, neither deleted nor failed"
            for path in paths
            if path not in done and path not in errors
        }
        return {**errors, **missing}
