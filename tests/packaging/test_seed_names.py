"""Every name of NeMo Gym's two seed pages (`delivery`, `consumer`) exists here, as it is there.

The pages list functions (underscore names included) and module data; code written against
NeMo Gym imports them by these paths. Each function keeps the seed's parameters, in the
seed's order and with its defaults; anything tokcap adds comes after them and is optional.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import pytest

from capture_core import consumer, delivery
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity
CASE = "a name of NeMo Gym's seed pages missing from its module"

_EMPTY = inspect.Parameter.empty

# (module, name, seed parameters as (name, default), async) for every function of the pages.
SEED_FUNCTIONS: list[tuple[Any, str, list[tuple[str, Any]], bool]] = [
    (delivery, "_unusable", [("result", _EMPTY), ("error", _EMPTY), ("message", _EMPTY)], False),
    (delivery, "capture_build_can_retire", [("built", _EMPTY)], False),
    (
        delivery,
        "finalize_rollout_token_capture",
        [("result", _EMPTY), ("source", _EMPTY)],
        True,
    ),
    (
        delivery,
        "retire_rollout_token_capture",
        [("rollout_id", _EMPTY), ("source", _EMPTY), ("built", _EMPTY)],
        True,
    ),
    (delivery, "rollout_carries_token_ids", [("result", _EMPTY)], False),
    (
        consumer,
        "_assemble",
        [("rollout_id", _EMPTY), ("entries", _EMPTY), ("builder", _EMPTY), ("model", _EMPTY)],
        False,
    ),
    (
        consumer,
        "_failed_build",
        [("rollout_id", _EMPTY), ("builder", _EMPTY), ("error", _EMPTY), ("n_calls", 0)],
        False,
    ),
    (
        consumer,
        "clear_token_captures_for_rollouts",
        [("records", _EMPTY), ("token_capture_dirs", _EMPTY)],
        False,
    ),
    (consumer, "token_id_capture_dirs_from_config", [("global_config_dict", _EMPTY)], False),
    (
        consumer,
        "trajectories_for_rollout",
        [
            ("rollout_id", _EMPTY),
            ("token_capture_dirs", _EMPTY),
            ("builder", "prefix_merging"),
            ("model", ""),
        ],
        False,
    ),
    (
        consumer,
        "trajectories_from_source",
        [("rollout_id", _EMPTY), ("source", _EMPTY), ("builder", "prefix_merging"), ("model", "")],
        True,
    ),
]

SEED_DATA = [
    (delivery, "MASK_SAMPLE_KEY", "mask_sample"),
    (delivery, "TOKEN_CAPTURE_KEY", "_ng_token_capture"),
    (delivery, "_REDUNDANT_CAPTURE_KEY", "_redundant_capture"),
]


@pytest.mark.parametrize(
    ("module", "name", "params", "is_async"),
    SEED_FUNCTIONS,
    ids=[f"{m.__name__.rsplit('.', 1)[1]}.{n}" for m, n, _, _ in SEED_FUNCTIONS],
)
def test_each_seed_function_keeps_its_signature(
    module: Any, name: str, params: list[tuple[str, Any]], is_async: bool
) -> None:
    function = getattr(module, name)
    signature = list(inspect.signature(function).parameters.values())
    assert [(p.name, p.default) for p in signature[: len(params)]] == params
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    assert all(p.kind in positional for p in signature[: len(params)])
    assert all(p.default is not _EMPTY for p in signature[len(params) :]), "extras are optional"
    assert inspect.iscoroutinefunction(function) is is_async
    record_case(CASE)


@pytest.mark.parametrize(("module", "name", "value"), SEED_DATA, ids=[n for _, n, _ in SEED_DATA])
def test_each_seed_data_name_has_its_value(module: Any, name: str, value: str) -> None:
    assert getattr(module, name) == value
    record_case(CASE)


def test_the_consumer_logger_is_the_modules_own() -> None:
    assert isinstance(consumer.logger, logging.Logger)
    assert consumer.logger.name == "capture_core.consumer"
