"""Representative builds through the seed functions, and the dicts they returned when recorded.

Each case runs a seed function (`assemble`, `trajectories_from_source`,
`finalize_rollout_token_capture`) on a fixed in-memory snapshot and yields the build dict and,
for finalize, the record it rewrote. `tests/support/build_result_golden.json` holds what these cases
returned before the build result became a typed model; `tests/builder/test_build_result.py` checks
that they still return exactly that. A deliberate change to a build dict regenerates it:
`.venv/bin/python -m tests.support.build_result_cases --write`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from capture_core.builder.snapshot import assemble
from capture_core.builder.terminal import TerminalInputs
from capture_core.consumer import trajectories_from_source
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.protocols import TokenCaptureSnapshot
from capture_core.records import TokenEntry
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.token_calls import token_call

GOLDEN = Path(__file__).with_name("build_result_golden.json")
SMALL = RolloutShape(turns=3, prompt_tokens=6, generated_tokens=3, tool_tokens=2)


class FixedSource:
    """A source that freezes to one fixed snapshot, or raises `failure` when it has one."""

    def __init__(self, snapshot: Any = None, failure: Exception | None = None) -> None:
        self.snapshot, self.failure = snapshot, failure

    async def freeze(self, rollout_id: str) -> Any:
        if self.failure is not None:
            raise self.failure
        return self.snapshot

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return True

    async def close(self) -> None:
        return None


class Unreadable:
    rollout_id = "3-4"
    entries = None
    incomplete = True


def snapshot(
    entries: list[TokenEntry], incomplete: bool = False, reasons: tuple[str, ...] = ()
) -> TokenCaptureSnapshot:
    return TokenCaptureSnapshot("3-4", tuple(entries), incomplete, "snap-1", len(entries), reasons)


def rollout(**shape: Any) -> list[TokenEntry]:
    return synthetic_rollout("3-4", RolloutShape(**{**SMALL.__dict__, **shape}))


def from_source(source: FixedSource, builder: str = "prefix_merging") -> dict:
    return {"built": asyncio.run(trajectories_from_source("3-4", source, builder))}


def finalize(record: dict, source: FixedSource) -> dict:
    built = asyncio.run(finalize_rollout_token_capture(record, source))
    return {"built": built, "record": record}


def terminal_record(call_id: str) -> dict:
    return {**rollout_record(3, 4), "_ng_terminal_model_call_id": call_id}


def twin_calls() -> list[TokenEntry]:
    """A rollout with two different calls named `call-00001`: an ambiguous terminal."""
    entries = rollout()
    return [*entries, entries[1].model_copy(update={"generation_token_ids": [9, 9, 9]})]


def unchecked() -> TokenEntry:
    """An entry built without validation: two generated tokens, one log prob."""
    return TokenEntry.model_construct(
        rollout_id="3-4",
        model_call_id="c",
        prompt_token_ids=[1],
        generation_token_ids=[2, 3],
        generation_log_probs=[-0.1],
    )


def call(call_id: str, prompt: list[int], generation: list[int], created_at: float) -> TokenEntry:
    """A call of rollout `3-4` with no content items (projected as a token-only item)."""
    return token_call(call_id, prompt, generation, rollout_id="3-4", created_at=created_at)


def one_sequence_split(base: list[int], same_prompt: bool) -> list[TokenEntry]:
    """Two calls after `base` with one prompt-plus-generation (one prompt, or split two ways)
    and a child extending both: the child's parent is ambiguous."""
    second = call("call-b", [*base, 9], [4, 5], 2.0)
    if not same_prompt:
        second = call("call-b", [*base, 9, 4], [5], 2.0)
    return [
        call("call-a", [*base, 9], [4, 5], 1.0),
        second,
        call("call-c", [*base, 9, 4, 5, 6], [7], 3.0),
    ]


def carrying_record() -> dict:
    record = rollout_record(3, 4)
    carried = {"prompt_token_ids": [7], "generation_token_ids": [1], "generation_log_probs": [-1]}
    record["response"]["output"][0].update(carried)
    return record


CASES: dict[str, Callable[[], dict]] = {
    "ok": lambda: from_source(FixedSource(snapshot(rollout()))),
    "masked_two_roots": lambda: from_source(FixedSource(snapshot(rollout(auxiliary_call=True)))),
    "masked_unresolved_retry": lambda: {
        "built": assemble("3-4", rollout(retried_turn=2), "prefix_merging", "").to_dict()
    },
    "resolved_retry": lambda: from_source(FixedSource(snapshot(rollout(retried_turn=1)))),
    "error_empty": lambda: from_source(FixedSource(snapshot([]))),
    "incomplete": lambda: from_source(FixedSource(snapshot(rollout(), True, ("lost c1",)))),
    "incomplete_empty": lambda: from_source(FixedSource(snapshot([], True, ("lost c1",)))),
    "unreadable": lambda: from_source(FixedSource(Unreadable())),
    "freeze_failed": lambda: from_source(FixedSource(failure=OSError("disk gone"))),
    "per_request": lambda: from_source(FixedSource(snapshot(rollout())), "per_request"),
    "invalid_entry": lambda: {
        "built": assemble("3-4", [unchecked()], "prefix_merging", "").to_dict()
    },
    "terminal_delivered": lambda: finalize(
        terminal_record("call-00002"), FixedSource(snapshot(rollout(auxiliary_call=True)))
    ),
    "terminal_not_captured": lambda: {
        "built": assemble("3-4", rollout(), "prefix_merging", "m", TerminalInputs("nope")).to_dict()
    },
    "terminal_broken": lambda: {
        "built": assemble(
            "3-4", twin_calls(), "prefix_merging", "", TerminalInputs("call-00001")
        ).to_dict()
    },
    "finalize_ok": lambda: finalize(rollout_record(3, 4), FixedSource(snapshot(rollout()))),
    "finalize_masked": lambda: finalize(
        rollout_record(3, 4), FixedSource(snapshot(rollout(auxiliary_call=True)))
    ),
    "finalize_incomplete": lambda: finalize(
        rollout_record(3, 4), FixedSource(snapshot(rollout(), True, ("lost c1",)))
    ),
    "finalize_empty": lambda: finalize(rollout_record(3, 4), FixedSource(snapshot([]))),
    "redundant": lambda: finalize(carrying_record(), FixedSource(snapshot(rollout()))),
    "redundant_unfrozen": lambda: finalize(carrying_record(), FixedSource(failure=OSError("x"))),
    "unusable_no_key": lambda: finalize({"reward": 1.0}, FixedSource(snapshot(rollout()))),
    "unusable_malformed_id": lambda: finalize(
        {"_ng_rollout_id": "a/b", "reward": 0.0}, FixedSource(snapshot(rollout()))
    ),
    "ambiguous_duplicates": lambda: from_source(
        FixedSource(snapshot(one_sequence_split([1, 2], same_prompt=True)))
    ),
    "ambiguous_split": lambda: from_source(
        FixedSource(snapshot(one_sequence_split([1, 2], same_prompt=False)))
    ),
    "ambiguous_beside_sub_agent": lambda: from_source(
        FixedSource(snapshot([call("call-s", [50], [51], 0.5), *one_sequence_split([1, 2], True)]))
    ),
    "ambiguous_beside_clean_chain": lambda: finalize(
        rollout_record(3, 4),
        FixedSource(snapshot([call("call-r", [1], [2], 0.5), *one_sequence_split([1, 2], False)])),
    ),
    "unusable_freeze_failed": lambda: finalize(
        rollout_record(3, 4), FixedSource(failure=OSError("disk gone"))
    ),
}


def run_cases() -> dict[str, dict]:
    """Every case's output as JSON-ready data (orjson round trip: what the golden file holds)."""
    return {name: orjson.loads(orjson.dumps(case())) for name, case in CASES.items()}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.support.build_result_cases --write")
    GOLDEN.write_bytes(orjson.dumps(run_cases(), option=orjson.OPT_INDENT_2) + b"\n")
    print(f"wrote {len(CASES)} cases to {GOLDEN}")
