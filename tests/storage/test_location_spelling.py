"""Locations that look like a URL with a slash missing, and S3 endpoints that do not answer.

`s3:/bucket` has no `://`, so it used to be read as a relative local path and fail far from
the typo (`/cwd/s3:/bucket/captures is not a directory`). An unreachable endpoint used to say
only botocore's `Could not connect to the endpoint URL`.
"""

from __future__ import annotations

import pytest

from capture_core.errors import InvalidInputError, StoreUnavailableError, is_transient
from capture_core.run.rollout_io import open_rollout_file
from capture_core.storage import filesystem_for, misspelled_url, open_byte_store
from tests.support.servers import free_port


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("s3:/bucket/captures", "s3://bucket/captures"),
        ("s3:bucket/captures", "s3://bucket/captures"),
        ("S3:/bucket", "s3://bucket"),
        ("memory:/x", "memory://x"),
        ("file:/tmp/x", "file:///tmp/x"),
    ],
)
def test_a_url_missing_a_slash_is_refused_with_the_url_it_meant(typed: str, meant: str) -> None:
    assert misspelled_url(typed) == meant
    with pytest.raises(InvalidInputError, match=f"did you mean {meant}\\?"):
        open_byte_store(typed)
    with pytest.raises(InvalidInputError, match="did you mean"):
        filesystem_for(typed)


@pytest.mark.integrity
@pytest.mark.parametrize(
    ("typed", "meant"),
    [("S3://b/p", "s3://b/p"), ("S3A://b/p", "s3a://b/p"), ("File:///tmp/x", "file:///tmp/x")],
)
def test_a_known_protocol_in_capitals_is_refused_with_the_url_it_meant(
    typed: str, meant: str
) -> None:
    """`S3://b/p` once got `FsspecStore`'s explanation about atomic writes."""
    assert misspelled_url(typed) == meant
    for opening in (open_byte_store, filesystem_for, open_rollout_file):
        with pytest.raises(InvalidInputError) as refused:
            opening(typed)
        assert str(refused.value) == (
            f"{typed} is neither a URL nor a path tokcap can use: did you mean {meant}?"
        )


@pytest.mark.integrity
@pytest.mark.parametrize("typed", ["s4://bucket/x", "s4:/bucket/x", "S4://b", "gs3://b/p"])
def test_every_unknown_protocol_is_refused_alike_not_as_a_filesystem_without_atomic_writes(
    typed: str,
) -> None:
    """`s4://` once got `FsspecStore`'s explanation about atomic writes, `s4:/` became a path."""
    scheme = typed.split(":", 1)[0]
    expected = f"no filesystem knows the protocol {scheme}://; give a local path or an s3:// URL"
    for opening in (open_byte_store, filesystem_for, open_rollout_file):
        with pytest.raises(InvalidInputError) as refused:
            opening(typed)
        assert str(refused.value) == (
            f"{typed} is neither a URL nor a path tokcap can use: {expected} (s3://bucket/prefix)"
        )


@pytest.mark.parametrize(
    "location",
    ["s3://bucket/x", "/data/store", "simplecache::s3://b/p", "mymodule:Source", "data:v1"],
)
def test_urls_paths_chains_and_class_specs_are_not_typos(location: str) -> None:
    assert misspelled_url(location) is None


def test_an_unreachable_endpoint_names_it_what_to_check_and_the_setting() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    options = {"endpoint_url": endpoint, "key": "k", "secret": "s"}
    with pytest.raises(StoreUnavailableError) as unreachable:
        open_rollout_file("s3://bucket/in.jsonl", options)
    message = str(unreachable.value)
    assert is_transient(unreachable.value), "retrying later may work"
    assert f"the S3 endpoint {endpoint} did not answer" in message, message
    assert "check that it is running and reachable from this machine" in message, message
    assert "set by the endpoint_url storage option (--storage-option endpoint_url=" in message
    with pytest.raises(StoreUnavailableError, match=f"S3 endpoint {endpoint} did not answer"):
        open_byte_store("s3://bucket/x", options).probe(must_exist=True)


def test_an_endpoint_from_the_environment_is_named_as_such(monkeypatch) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    with pytest.raises(StoreUnavailableError) as unreachable:
        open_rollout_file("s3://bucket/in.jsonl", {"key": "k", "secret": "s"})
    assert f"S3 endpoint {endpoint} did not answer" in str(unreachable.value)
    assert "AWS_ENDPOINT_URL_S3" in str(unreachable.value)
