"""Agent rollouts through `tokcap gateway` in front of a real vLLM engine, with the OpenAI SDK,
then `tokcap clear` before dispatch and `tokcap finalize --rows parquet` under both
deliveries: every sampled token is delivered exactly as the engine returned it to the client.

Four rollouts of three turns each with a tool defined: two unstreamed, two streamed with the
same request seeds, so the streamed ones must equal the unstreamed ones token for token. The
trainer's weight version (`--weight-version-source`, a file) changes before every turn.
The toy model writes no tool call by itself: the harness appends one to its first answer and
sends the tool's result; the last turn names the tool, so the engine forces a parsed call.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.support.gateway_process import GatewayProcess
from tests.support.openai_rollouts import Call, Rollout, run_rollout, single_token_words
from tests.support.pipeline_helpers import dest_records, finalize_args, run_cli
from tests.support.vllm_engine import VllmEngine

pytestmark = pytest.mark.usefixtures("prefect_api")

LOGPROB_TOLERANCE = 1e-4
SEEDS = {"plain-0": 11, "plain-1": 23, "streamed-0": 11, "streamed-1": 23}
RUNS = {"main_chain": "main", "all_traces": "traces"}


def publish(path: str, version: int) -> None:
    """Write the trainer's version as a trainer does: a temporary file renamed over it."""
    with open(path + ".tmp", "w") as f:
        f.write(f"{version}\n")
    os.replace(path + ".tmp", path)


def write_jsonl(path: str, records: list[dict[str, Any]]) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(record) + "\n" for record in records)
    return path


class Finalized:
    """The rollouts as the client saw them, and what finalize delivered of them per run."""

    def __init__(
        self, rollouts: dict[str, Rollout], dest: str, engine_url: str, stopped: int
    ) -> None:
        self.rollouts, self.dest, self.engine_url = rollouts, dest, engine_url
        self.gateway_exit = stopped

    def records(self, delivery: str) -> dict[str, dict[str, Any]]:
        found = dest_records(self.dest, RUNS[delivery])
        return {record["_ng_rollout_id"]: record for record in found}

    def rows(self, delivery: str) -> list[dict[str, Any]]:
        parts = sorted(glob.glob(os.path.join(self.dest, RUNS[delivery], "rows", "*.parquet")))
        assert parts, f"no rows parts for {delivery}"
        return [row for part in parts for row in pq.read_table(part).to_pylist()]


@pytest.fixture(scope="module")
def finalized(
    engine: VllmEngine, prefect_api: str, tmp_path_factory: pytest.TempPathFactory
) -> Finalized:
    work = tmp_path_factory.mktemp("real-engine-rollouts")
    store, dest = str(work / "store"), str(work / "dest")
    os.makedirs(store)
    version_file = str(work / "weight_version")
    publish(version_file, 0)
    dispatch = write_jsonl(str(work / "dispatch.jsonl"), [{"_ng_rollout_id": r} for r in SEEDS])
    cleared = run_cli(["clear", "--rollouts", dispatch, "--store", store], prefect_api)
    assert cleared.returncode == 0, cleared.stderr[-2000:]
    words = single_token_words(engine.url, engine.model)
    rollouts: dict[str, Rollout] = {}
    with GatewayProcess(engine.url, store, "--weight-version-source", version_file) as gateway:
        for index, (rollout_id, seed) in enumerate(SEEDS.items()):

            def before_turn(turn: int, index: int = index) -> int:
                version = 10 * (index + 1) + turn
                publish(version_file, version)
                return version

            rollouts[rollout_id] = run_rollout(
                gateway.session(rollout_id),
                rollout_id,
                engine.model,
                words,
                seed,
                streamed=rollout_id.startswith("streamed"),
                before_turn=before_turn,
            )
        stopped = gateway.stop()
    records = [rollout.record() for rollout in rollouts.values()]
    records_file = write_jsonl(str(work / "rollouts.jsonl"), records)
    for delivery, run_id in RUNS.items():
        # The first run leaves the captures in place (its consumer never acknowledges), so the
        # second finalizes the same captures with the other delivery.
        keep = ["--retire-after-consumer", "trainer"] if delivery == "main_chain" else []
        args = finalize_args(records_file, store, dest, run_id, "--delivery", delivery)
        done = run_cli([*args, "--rows", "parquet", *keep], prefect_api, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return Finalized(rollouts, dest, engine.url, stopped)


def assert_logprobs_close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    worst = max((abs(g - w) for g, w in zip(got, want, strict=True)), default=0.0)
    assert worst <= LOGPROB_TOLERANCE, f"log probs differ by {worst}"


def generated_positions(calls: list[Call]) -> dict[int, tuple[int, float, int | None]]:
    """Position in the last call's sequence -> (id, log prob, version) of each sampled token."""
    positions = {}
    for call in calls:
        start = len(call.prompt_token_ids)
        for offset, (token, logprob) in enumerate(zip(call.token_ids, call.logprobs, strict=True)):
            positions[start + offset] = (token, logprob, call.version)
    return positions


def said(message: dict[str, Any]) -> tuple[str, list[str]]:
    """A message's text and the tools it calls. Not the call ids (made up per call) nor the
    arguments: unstreamed, vLLM's parser re-serializes them (`18.2e413877170` becomes
    `Infinity`), streamed it passes the sampled text on."""
    return message["content"], [call["function"]["name"] for call in message.get("tool_calls", [])]


def test_the_engine_gave_each_call_exact_ids_and_the_last_turn_a_parsed_tool_call(
    finalized: Finalized,
) -> None:
    for rollout in finalized.rollouts.values():
        assert len(rollout.calls) == 3
        for call in rollout.calls:
            assert call.token_ids and len(call.token_ids) == len(call.logprobs)
        for earlier, later in itertools.pairwise(rollout.calls):
            sequence = earlier.prompt_token_ids + earlier.token_ids
            assert later.prompt_token_ids[: len(sequence)] == sequence, "turns extend"
        tool_calls = rollout.response["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in tool_calls] == ["get_weather"]


def test_through_the_gateway_the_client_gets_what_the_engine_answers_directly(
    finalized: Finalized, engine: VllmEngine
) -> None:
    words = single_token_words(engine.url, engine.model)
    direct = run_rollout(
        engine.url + "/v1", "direct", engine.model, words, SEEDS["plain-0"], streamed=False
    )
    for a, b in zip(direct.calls, finalized.rollouts["plain-0"].calls, strict=True):
        assert (a.prompt_token_ids, a.token_ids) == (b.prompt_token_ids, b.token_ids)
        assert_logprobs_close(b.logprobs, a.logprobs)


def test_the_gateway_exits_0_on_sigterm_after_its_calls(finalized: Finalized) -> None:
    assert finalized.gateway_exit == 0


def test_streamed_calls_equal_unstreamed_calls_with_the_same_seed(finalized: Finalized) -> None:
    for index in range(2):
        plain = finalized.rollouts[f"plain-{index}"].calls
        streamed = finalized.rollouts[f"streamed-{index}"].calls
        for a, b in zip(plain, streamed, strict=True):
            assert a.prompt_token_ids == b.prompt_token_ids
            assert a.token_ids == b.token_ids
            assert_logprobs_close(b.logprobs, a.logprobs)
            assert said(a.message) == said(b.message)


def test_main_chain_delivers_every_sampled_token_as_the_engine_returned_it(
    finalized: Finalized,
) -> None:
    records = finalized.records("main_chain")
    assert set(records) == set(SEEDS)
    for rollout_id, rollout in finalized.rollouts.items():
        record = records[rollout_id]
        assert not record.get("mask_sample"), record.get("_ng_token_capture")
        items = [i for i in record["response"]["output"] if i.get("generation_token_ids")]
        assert [i["generation_token_ids"] for i in items] == [c.token_ids for c in rollout.calls]
        for item, call in zip(items, rollout.calls, strict=True):
            assert_logprobs_close(item["generation_log_probs"], call.logprobs)
        assert items[-1]["prompt_token_ids"] == rollout.calls[-1].prompt_token_ids
        provenance = record["token_provenance"]
        stamped = [provenance["calls"][call_id] for call_id in provenance["chain"]]
        assert [(s["start_weight_version"], s["end_weight_version"]) for s in stamped] == [
            (c.version, c.version) for c in rollout.calls
        ]
        assert {s["replica"] for s in stamped} == {finalized.engine_url}
        assert record["reward"] == 1.0


def test_all_traces_delivers_every_sampled_call_once_as_the_engine_returned_it(
    finalized: Finalized,
) -> None:
    records = finalized.records("all_traces")
    for rollout_id, rollout in finalized.rollouts.items():
        record = records[rollout_id]
        assert not record.get("mask_sample"), record.get("_ng_token_capture")
        spans = []
        for trace in record["training_traces"]["traces"]:
            for span in trace["sampled_spans"]:
                start, end = span["start"], span["end"]
                logprobs = trace["generation_logprobs"][start:end]
                spans.append((trace["token_ids"][:start], trace["token_ids"][start:end], logprobs))
        assert len(spans) == len(rollout.calls), "every sampled call owned exactly once"
        for (prompt, generated, logprobs), call in zip(spans, rollout.calls, strict=True):
            assert prompt == call.prompt_token_ids and generated == call.token_ids
            assert_logprobs_close(logprobs, call.logprobs)
        assert record["response"] == rollout.response, "the harness's response stays as written"


@pytest.mark.parametrize("delivery", list(RUNS))
def test_trainer_rows_hold_the_engines_tokens_and_the_stamped_versions(
    finalized: Finalized, delivery: str
) -> None:
    rows = {row["rollout_id"]: row for row in finalized.rows(delivery)}
    assert set(rows) == set(SEEDS), "one row per rollout: its calls extend one another"
    for rollout_id, rollout in finalized.rollouts.items():
        row, last = rows[rollout_id], rollout.calls[-1]
        assert row["token_ids"] == last.prompt_token_ids + last.token_ids
        sampled = generated_positions(rollout.calls)
        assert [p for p, m in enumerate(row["loss_mask"]) if m] == sorted(sampled)
        for position, (token, logprob, version) in sampled.items():
            assert row["token_ids"][position] == token
            assert abs(row["generation_logprobs"][position] - logprob) <= LOGPROB_TOLERANCE
            assert row["weight_version"][position] == version
        unsampled = {
            row["weight_version"][p] for p in range(len(row["token_ids"])) if p not in sampled
        }
        assert unsampled == {-1}
        assert (row["min_weight_version"], row["max_weight_version"]) == (
            rollout.calls[0].version,
            rollout.calls[-1].version,
        )
        assert row["replicas"] == [finalized.engine_url]
    for index in range(2):
        plain, streamed = rows[f"plain-{index}"], rows[f"streamed-{index}"]
        for column in ("token_ids", "loss_mask", "generation_logprobs"):
            assert plain[column] == streamed[column], column
