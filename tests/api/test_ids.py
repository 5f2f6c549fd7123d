"""Rollout identity and the correlation prefix (docs/contract.md, Rollout identity)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from capture_core.ids import (
    index_value,
    maybe_rollout_id_from_run_body,
    rollout_capture_prefix,
    rollout_id_from_capture_prefix,
    validate_rollout_id,
)

UNSAFE_IDS = ["..", ".", "a/b", ".hidden", "", "ünï", "a b", "a\\b", "x\n", "-lead", "a" * 201]


@pytest.mark.parametrize("bad", UNSAFE_IDS)
def test_unsafe_ids_are_refused_not_sanitised(bad: str) -> None:
    with pytest.raises(ValueError, match="malformed rollout id"):
        validate_rollout_id(bad)


def test_explicit_id_wins_and_is_validated() -> None:
    body = {"_ng_rollout_id": "job.7_x-1", "_ng_task_index": 3, "_ng_rollout_index": 4}
    assert maybe_rollout_id_from_run_body(body) == "job.7_x-1"
    with pytest.raises(ValueError, match="malformed"):
        maybe_rollout_id_from_run_body({"_ng_rollout_id": "../etc"})


def test_derived_id_with_attempt_suffix() -> None:
    assert maybe_rollout_id_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 4}) == "3-4"
    body = {"_ng_task_index": 3, "_ng_rollout_index": 4, "_ng_attempt_index": 2}
    assert maybe_rollout_id_from_run_body(body) == "3-4-a2"
    assert maybe_rollout_id_from_run_body({**body, "_ng_attempt_index": 0}) == "3-4"


# (body, id NeMo Gym's writers key the capture by)
IDENTITY_GRID = [
    ({"_ng_rollout_id": "job-9"}, "job-9"),
    ({"_ng_rollout_id": "job-9", "_ng_attempt_index": 0}, "job-9"),
    ({"_ng_rollout_id": "job-9", "_ng_attempt_index": 1}, "job-9-a1"),
    ({"_ng_rollout_id": "job-9", "_ng_attempt_index": "2"}, "job-9-a2"),
    ({"_ng_rollout_id": "job-9", "_ng_attempt_index": 3.0}, "job-9-a3"),
    ({"_ng_rollout_id": "job-9", "_ng_task_index": 1, "_ng_rollout_index": 2}, "job-9"),
    ({"_ng_task_index": 3, "_ng_rollout_index": 4}, "3-4"),
    ({"_ng_task_index": "3", "_ng_rollout_index": "4"}, "3-4"),
    ({"_ng_task_index": "3", "_ng_rollout_index": 4}, "3-4"),
    ({"_ng_task_index": "03", "_ng_rollout_index": "4"}, "03-4"),
    ({"_ng_task_index": 3, "_ng_rollout_index": 4, "_ng_attempt_index": 1}, "3-4-a1"),
    ({"_ng_task_index": 3, "_ng_rollout_index": 4, "_ng_attempt_index": "1"}, "3-4-a1"),
    ({"_ng_task_index": 3, "_ng_rollout_index": 4, "_ng_attempt_index": 1.0}, "3-4-a1"),
    ({"_ng_task_index": 3, "_ng_rollout_index": 4, "_ng_attempt_index": "01"}, "3-4-a1"),
    ({"_ng_task_index": 3, "_ng_rollout_index": 4, "_ng_attempt_index": 0.0}, "3-4"),
    ({"_ng_task_index": 3, "_ng_rollout_index": 4, "_ng_attempt_index": "0"}, "3-4"),
    ({"_ng_task_index": 3, "_ng_rollout_index": 4, "_ng_attempt_index": None}, "3-4"),
    ({"_ng_task_index": 3, "_ng_attempt_index": 1}, None),
    ({"_ng_attempt_index": 1}, None),
]

# Golden: what NeMo Gym's `maybe_rollout_id_from_run_body` returns for bodies tokcap once
# refused. Gym formats the indices as they are and reads the attempt with `int()`.
NEMO_GYM_EDGE_IDENTITY = [
    ({"_ng_rollout_id": "r" * 250}, "r" * 250),
    ({"_ng_rollout_id": "a" * 198, "_ng_attempt_index": 1}, "a" * 198 + "-a1"),
    ({"_ng_task_index": True, "_ng_rollout_index": 0}, "True-0"),
    ({"_ng_task_index": 3, "_ng_rollout_index": 4, "_ng_attempt_index": -1}, "3-4"),
    ({"_ng_rollout_id": "job-9", "_ng_attempt_index": -1}, "job-9"),
    ({"_ng_rollout_id": "job-9", "_ng_attempt_index": 1.5}, "job-9-a1"),
    ({"_ng_rollout_id": "job-9", "_ng_attempt_index": True}, "job-9-a1"),
    ({"_ng_rollout_id": "job-9", "_ng_attempt_index": False}, "job-9"),
    ({"_ng_task_index": "3a", "_ng_rollout_index": 0}, "3a-0"),
    ({"_ng_task_index": 3.0, "_ng_rollout_index": 0}, "3.0-0"),
]


@pytest.mark.parametrize(("body", "expected"), NEMO_GYM_EDGE_IDENTITY)
def test_identity_edge_cases_match_nemo_gym(body: dict, expected: str) -> None:
    assert maybe_rollout_id_from_run_body(body) == expected


class _Plain:
    """Not a mapping and not a pydantic model, but it has the attributes."""

    _ng_rollout_id = "job-9"
    _ng_task_index = 3
    _ng_rollout_index = 4


@pytest.mark.parametrize("body", [_Plain(), None, "3-4", 7, ["_ng_rollout_id"]])
def test_a_body_that_is_neither_mapping_nor_model_has_no_id(body: object) -> None:
    assert maybe_rollout_id_from_run_body(body) is None


def test_a_model_s_capture_rollout_id_is_its_explicit_id() -> None:
    class Body(BaseModel):
        capture_rollout_id: str = "job-3"

    assert maybe_rollout_id_from_run_body(Body()) == "job-3"


def test_an_id_too_long_for_the_stores_is_refused_where_it_is_stored() -> None:
    long_id = "r" * 250
    assert rollout_id_from_capture_prefix(rollout_capture_prefix(long_id)) == long_id
    with pytest.raises(ValueError, match="at most 200 characters"):
        validate_rollout_id(long_id)


@pytest.mark.parametrize(("body", "expected"), IDENTITY_GRID)
def test_identity_matches_nemo_gym_writers(body: dict, expected: str | None) -> None:
    assert maybe_rollout_id_from_run_body(body) == expected


# Bodies NeMo Gym refuses too (it raises), or whose id is not a path segment: no writer can
# key a capture by such an id, so there is nothing to read (SPEC: a `ValueError`).
MALFORMED_BODIES = [
    {"_ng_rollout_id": "job-9", "_ng_attempt_index": "1.0"},
    {"_ng_rollout_id": "job-9", "_ng_attempt_index": "one"},
    {"_ng_rollout_id": "job-9", "_ng_attempt_index": float("nan")},
    {"_ng_rollout_id": "job-9", "_ng_attempt_index": float("inf")},
    {"_ng_rollout_id": "job-9", "_ng_attempt_index": [1]},
    {"_ng_rollout_id": 9},
    {"_ng_rollout_id": "../etc"},
    {"_ng_rollout_id": "x\n"},
    {"_ng_task_index": -1, "_ng_rollout_index": 0},
    {"_ng_task_index": " 3", "_ng_rollout_index": 0},
    {"_ng_task_index": "a/b", "_ng_rollout_index": 0},
]


@pytest.mark.parametrize("body", MALFORMED_BODIES)
def test_malformed_identity_is_a_value_error(body: dict) -> None:
    with pytest.raises(ValueError):
        maybe_rollout_id_from_run_body(body)


def test_pydantic_run_bodies() -> None:
    class Body(BaseModel):
        model_config = ConfigDict(extra="allow")

    body = Body.model_validate({"_ng_task_index": 5, "_ng_rollout_index": 6})
    assert maybe_rollout_id_from_run_body(body) == "5-6"


def test_correlation_prefix_round_trip() -> None:
    prefix = rollout_capture_prefix("3-4-a1")
    assert prefix == "/ng-rollout/3-4-a1/training-token-capture"
    assert rollout_id_from_capture_prefix(prefix) == "3-4-a1"
    assert rollout_id_from_capture_prefix(prefix + "/v1/responses") == "3-4-a1"
    assert rollout_id_from_capture_prefix("/ng-rollout/../training-token-capture") is None
    assert rollout_id_from_capture_prefix("/other/3-4/training-token-capture") is None
    with pytest.raises(ValueError):
        rollout_capture_prefix("a/b")


@pytest.mark.parametrize(
    ("text", "index"),
    [("3", 3), (" 4 ", 4), ("-2", -2), ("--3", None), ("²", None), ("٣", None), ("1" * 19, None)],
)
def test_an_index_written_as_text_is_ascii_digits_within_int64(
    text: str, index: int | None
) -> None:
    """A task index the trainer rows and the group planner read alike, never a crash."""
    assert index_value(text) == index
