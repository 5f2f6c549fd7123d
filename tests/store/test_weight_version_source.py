"""Sink stamping: a store given the trainer's version source stamps puts that carry no version.

A put whose entry has no weight version records the source's current integer as its
`end_weight_version`; a local file is read again only when its stat changes, a URL at most
once per second (`version_source`). A source that cannot say refuses the put by name and the
call is reported lost: a version is never guessed. Real files, and a real S3 (moto) object.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from capture_core.config import TokenIdCaptureConfig
from capture_core.errors import CaptureConflictError, InvalidInputError, InvalidRecordError
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore, version_source
from capture_core.store.nemo_gym_store import NemoGymFileStore
from tests.support.backends import PROCESS_SHARED_BACKENDS, store_location


def call(call_id: str, **provenance: Any) -> TokenEntry:
    return TokenEntry(
        rollout_id="r1",
        model_call_id=call_id,
        prompt_token_ids=[1, 2, 3],
        generation_token_ids=[4, 5],
        generation_log_probs=[-0.5, -0.25],
        **provenance,
    )


def publish(path: Path, text: str) -> None:
    """Publish a version as a trainer should: a temporary file renamed over the old one."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def ends(store: Any) -> dict[str, int | None]:
    return {e.model_call_id: e.end_weight_version for e in store.freeze_now("r1").entries}


@pytest.fixture(params=PROCESS_SHARED_BACKENDS)
def root(request: pytest.FixtureRequest, tmp_path) -> tuple[str, dict[str, object]]:
    return store_location(request.param, request, tmp_path)


def test_a_file_updated_between_puts_stamps_each_put_with_the_version_then(root, tmp_path) -> None:
    url, options = root
    source = tmp_path / "weight_version"
    publish(source, "3\n")
    store = TokenCaptureStore(url, options, weight_version_source=source)
    store.put_now(call("c0"))
    publish(source, "4")
    store.put_now(call("c1"))
    store.put_now(call("c2", start_weight_version=2))  # the server said: not stamped
    store.put_now(call("c3", generation_weight_versions=[2, 3]))  # per token: not stamped
    read = {e.model_call_id: e for e in TokenCaptureStore(url, options).freeze_now("r1").entries}
    assert {name: e.end_weight_version for name, e in read.items()} == {
        "c0": 3,
        "c1": 4,
        "c2": None,
        "c3": None,
    }
    assert read["c2"].start_weight_version == 2
    assert read["c0"].start_weight_version is None, "the stamp is the end version only"


def test_a_local_source_is_read_again_only_when_its_stat_changes(tmp_path) -> None:
    path = tmp_path / "weight_version"
    path.write_text("3")
    source = version_source.WeightVersionSource(path)
    assert source.current() == 3
    before = os.stat(path)
    with open(path, "r+b") as handle:  # same inode, same size, then the same times
        handle.write(b"4")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert source.current() == 3, "an unchanged stat is not read again"
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert source.current() == 4


BAD_SOURCES = [
    ("empty", "", "holds '', not a weight version"),
    ("not a number", "step-7", "holds 'step-7', not a weight version"),
    ("negative", "-1", "holds '-1', not a weight version"),
    ("not an integer", "7.5", "holds '7.5', not a weight version"),
    ("two numbers", "7 8", "holds '7 8', not a weight version"),
    ("too long", "1" * 200, "not a weight version"),
    ("beyond 64 bits", str(2**63), f"holds '{2**63}', not a weight version"),
    ("beyond int32", str(2**31), f"holds '{2**31}', not a weight version"),
    ("missing", None, "cannot be read (FileNotFoundError"),
]


@pytest.mark.parametrize(("what", "text", "problem"), BAD_SOURCES, ids=[b[0] for b in BAD_SOURCES])
def test_a_source_that_cannot_say_refuses_the_put_by_name(
    tmp_path, what: str, text: str | None, problem: str
) -> None:
    path = tmp_path / "weight_version"
    if text is not None:
        path.write_text(text)
    store = TokenCaptureStore(tmp_path / "store", weight_version_source=path)
    with pytest.raises(InvalidRecordError) as raised:
        store.put_now(call("c0"))
    message = str(raised.value)
    assert message.startswith("rollout r1: call 'c0' was refused at put: end_weight_version "), (
        message
    )
    assert f"weight version source {path}" in message and problem in message, message
    assert "marked incomplete" in message
    snapshot = store.freeze_now("r1")
    assert snapshot.incomplete and not snapshot.entries, "lost, never stored with a guess"


def test_an_entry_with_its_own_version_is_stored_whatever_the_source_holds(tmp_path) -> None:
    store = TokenCaptureStore(tmp_path / "store", weight_version_source=tmp_path / "missing")
    store.put_now(call("c0", end_weight_version=9))
    assert ends(store) == {"c0": 9}


def test_a_url_source_on_s3_stamps_puts_and_is_fetched_at_most_once_a_second(
    s3_url: str, s3_options: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options)
    location = s3_url.rsplit("/", 1)[0] + "/trainer/weight_version"
    fs.pipe(location, b"11\n")
    store = TokenCaptureStore(s3_url, s3_options, weight_version_source=location)
    store.put_now(call("c0"))
    fs.pipe(location, b"12")
    monkeypatch.setattr(version_source, "URL_REFRESH_SECONDS", 3600.0)
    store.put_now(call("c1"))  # fetched less than the refresh interval ago: not again
    monkeypatch.setattr(version_source, "URL_REFRESH_SECONDS", 0.0)
    deadline = time.monotonic() + 30
    while store.weight_version_source.current() != 12:
        assert time.monotonic() < deadline, "the updated version was never read"
    store.put_now(call("c2"))
    assert ends(store) == {"c0": 11, "c1": 11, "c2": 12}


def test_an_unreadable_url_source_refuses_the_put(s3_url: str, s3_options) -> None:
    location = s3_url.rsplit("/", 1)[0] + "/trainer/never-written"
    store = TokenCaptureStore(s3_url, s3_options, weight_version_source=location)
    with pytest.raises(InvalidRecordError, match=f"weight version source {location} cannot be"):
        store.put_now(call("c0"))
    assert store.freeze_now("r1").incomplete


def test_sink_kwargs_configure_the_source_as_nemo_gym_passes_them(tmp_path) -> None:
    source = tmp_path / "weight_version"
    publish(source, "21")
    config = TokenIdCaptureConfig.from_global(
        {
            "token_id_capture": {
                "enabled": True,
                "sink": "capture_core.store:TokenCaptureStore",
                "sink_kwargs": {
                    "root": str(tmp_path / "store"),
                    "weight_version_source": str(source),
                },
            }
        }
    )
    sink = config.build_sink()
    sink.put_now(call("c0"))
    assert ends(TokenCaptureStore(tmp_path / "store")) == {"c0": 21}


def test_a_nemo_gym_directory_opened_with_a_source_stamps_its_lines(tmp_path) -> None:
    gym = tmp_path / "gym"
    gym.mkdir()
    NemoGymFileStore(gym).put_now(call("c0"))  # the directory is NeMo Gym's now
    source = tmp_path / "weight_version"
    publish(source, "5")
    store = TokenCaptureStore(gym, weight_version_source=source)
    assert isinstance(store, NemoGymFileStore)
    store.put_now(call("c1"))
    assert b'"end_weight_version":5' in (gym / "r1.tokens.jsonl").read_bytes().splitlines()[1]
    assert ends(store) == {"c0": None, "c1": 5}


def test_stores_with_a_source_pickle_and_compare_with_it(tmp_path) -> None:
    source = tmp_path / "weight_version"
    store = TokenCaptureStore(tmp_path / "store", weight_version_source=source)
    copy = pickle.loads(pickle.dumps(store))
    assert copy == store and copy.weight_version_source.location == str(source)
    assert store != TokenCaptureStore(tmp_path / "store")
    gym = NemoGymFileStore(tmp_path / "gym", weight_version_source=source)
    assert pickle.loads(pickle.dumps(gym)) == gym != NemoGymFileStore(tmp_path / "gym")


@pytest.mark.parametrize("kind", ["tokcap", "nemo_gym"])
def test_a_retried_put_stamped_after_an_update_is_the_same_call(kind: str, root, tmp_path) -> None:
    """A writer retries a put whose first try landed; the version moved meanwhile. The retry
    is a no-op (the first stamp stands), not a conflict that masks the rollout; a different
    payload under the same call id still conflicts."""
    if kind == "nemo_gym" and "://" in root[0]:
        pytest.skip("NeMo Gym's file store is a local directory")
    source = tmp_path / "weight_version"
    publish(source, "5")
    if kind == "tokcap":
        store: Any = TokenCaptureStore(root[0], root[1], weight_version_source=source)
    else:
        (tmp_path / "gym").mkdir()
        store = NemoGymFileStore(tmp_path / "gym", weight_version_source=source)
    store.put_now(call("c0"))
    publish(source, "6")
    store.put_now(call("c0"))
    with pytest.raises(CaptureConflictError):
        store.put_now(call("c0").model_copy(update={"generation_log_probs": [-0.5, -0.5]}))
    snapshot = store.freeze_now("r1")
    assert [e.end_weight_version for e in snapshot.entries] == [5]
    assert snapshot.incomplete, "the different payload still marks the rollout"


def test_a_relative_source_path_is_refused_by_name(tmp_path) -> None:
    with pytest.raises(InvalidInputError, match="'weight_version' is a relative path"):
        TokenCaptureStore(tmp_path / "store", weight_version_source="weight_version")
