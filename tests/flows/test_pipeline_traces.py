"""`all_traces` through the pipeline: parts, retirement, ledger, report, status, the CLI flag.

Flows run against the session's real Prefect server, on local disk and S3 (moto).
"""

from __future__ import annotations

import orjson
import pytest

from capture_core.builder.trace_envelope import ENVELOPE_KEY, check_envelope, trained_tokens
from capture_core.errors import RunIdInUseError
from capture_core.rows.trainer_rows import read_rows
from capture_core.run.run_layout import read_ledger, read_manifest
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import rollout_record
from capture_core.testing.trace_shapes import episode, write_episode
from tests.support.attempts import write_mixed_attempts
from tests.support.pipeline_helpers import (
    dest_records,
    finalize_args_for,
    finalize_locations,
    rollout_ids,
    run_cli,
    write_rollouts,
)
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.usefixtures("prefect_api")

SHAPES = ("thinking", "compaction", "subagent", "fork", "parallel", "abandoned", "lost")


def _episodes(store: TokenCaptureStore) -> list:
    eps = [episode(i, shape, seed=9) for i, shape in enumerate(SHAPES)]
    for ep in eps:
        write_episode(store, ep)
    return eps


def test_all_traces_run_hands_off_checked_envelopes_and_retires_them(locations) -> None:
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    eps = _episodes(store)
    write_rollouts(locations["rollouts"], [ep.record for ep in eps], options)
    summary = finalize_locations(locations, "traces-1", batch_size=3, delivery="all_traces")
    assert (summary.rollouts, summary.handed_off, summary.masked) == (7, 7, 1)
    assert summary.mask_reasons == {"capture incomplete": 1}
    out = dest_records(locations["dest"], "traces-1", options)
    assert rollout_ids(out) == [ep.rollout_id for ep in eps]
    for ep, record in zip(eps, out, strict=True):
        assert record["response"] == ep.record["response"], "the response is kept as it was"
        if ep.healthy:
            check_envelope(record[ENVELOPE_KEY], ep.rollout_id)
            assert trained_tokens(record[ENVELOPE_KEY]) == ep.sampled_tokens()
        else:
            assert record["mask_sample"] is True and ENVELOPE_KEY not in record
        kept = store.byte_store.list_prefix(ep.rollout_id)
        assert any("/e/" in key for key in kept) is (not ep.healthy), "only evidence stays"
    ledger = read_ledger(open_byte_store(locations["dest"], options), "traces-1")
    expected = [
        (len(r[ENVELOPE_KEY]["traces"]), trained_tokens(r[ENVELOPE_KEY]))
        if ENVELOPE_KEY in r
        else (0, 0)
        for r in out
    ]
    assert [(line.traces, line.tokens_trained) for line in ledger] == expected
    assert summary.delivery == "all_traces"
    assert summary.tokens_trained == sum(ep.sampled_tokens() for ep in eps)
    assert summary.traces == sum(t for t, _ in expected)
    manifest = read_manifest(open_byte_store(locations["dest"], options), "traces-1")
    assert manifest is not None and manifest.delivery == "all_traces"
    with pytest.raises(RunIdInUseError, match="delivery all_traces is now main_chain"):
        finalize_locations(locations, "traces-1", batch_size=3)


@pytest.mark.integrity
@pytest.mark.parametrize("rows", ["none", "parquet"])
def test_a_stale_attempt_is_masked_and_kept_beside_a_cleared_one_that_trains(
    locations, rows: str
) -> None:
    """Rollout 8-1 holds an earlier attempt that was never finalized nor cleared beside this
    attempt's calls; the sub-agent episode was dispatched after its clear. The first masks,
    naming the clear, has no rows and keeps its capture; the second trains and retires."""
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    write_mixed_attempts(store, "8-1", shared_first_prompt=True)
    cleared = episode(2, "subagent", seed=9)
    write_episode(store, cleared)
    write_rollouts(locations["rollouts"], [rollout_record(8, 1), cleared.record], options)
    run_id = f"stale-{rows}"
    summary = finalize_locations(locations, run_id, batch_size=2, delivery="all_traces", rows=rows)
    assert (summary.rollouts, summary.handed_off, summary.masked) == (2, 2, 1)
    assert summary.mask_reasons == {"no dispatch-time clear recorded": 1}
    stale, fresh = dest_records(locations["dest"], run_id, options)
    assert stale["mask_sample"] is True and ENVELOPE_KEY not in stale
    assert stale["reward"] == rollout_record(8, 1)["reward"]
    assert trained_tokens(fresh[ENVELOPE_KEY]) == cleared.sampled_tokens()
    assert len(store.read_entries("8-1")) == 6, "the stale capture stays as evidence"
    assert store.read_entries(cleared.rollout_id) == [], "the cleared attempt retired"
    dest = open_byte_store(locations["dest"], options)
    parts = dest.list_prefix(f"{run_id}/rows")
    assert (len(parts) > 0) is (rows == "parquet")
    rows_read = [read_rows(dest.get(key) or b"").to_pylist() for key in parts]
    trained = {row["rollout_id"] for part in rows_read for row in part}
    assert "8-1" not in trained and (trained == {cleared.rollout_id}) is (rows == "parquet")
    record_case(f"all_traces pipeline, rows {rows}: a stale attempt never trains nor retires")


def test_cli_delivery_flag_and_status(run_inputs, prefect_api: str) -> None:
    store = TokenCaptureStore(run_inputs["store"])
    eps = _episodes(store)[:3]
    write_rollouts(run_inputs["rollouts"], [ep.record for ep in eps])
    args = finalize_args_for(run_inputs, "cli-traces", "--delivery", "all_traces")
    done = run_cli(args, prefect_api)
    assert done.returncode == 0, done.stderr
    assert "delivery" in done.stdout and "tokens trained" in done.stdout
    status = run_cli(
        ["status", "--dest", run_inputs["dest"], "--run-id", "cli-traces"], prefect_api
    )
    assert status.returncode == 0, status.stderr
    assert "delivery all_traces" in status.stdout
    trained = sum(ep.sampled_tokens() for ep in eps)
    assert any(line.split()[-1] == str(trained) for line in status.stdout.splitlines())
    as_json = run_cli(
        ["status", "--dest", run_inputs["dest"], "--run-id", "cli-traces", "--json"], prefect_api
    )
    report = orjson.loads(as_json.stdout)
    assert report["summary"]["delivery"] == "all_traces"
    assert report["summary"]["tokens_trained"] == trained


def test_default_run_manifest_and_ledger_carry_no_trace_fields(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    ep = episode(0, "plain", seed=9)
    write_episode(TokenCaptureStore(store_root), ep)
    rollouts = write_rollouts(str(tmp_path / "r.jsonl"), [ep.record])
    locations = {"rollouts": rollouts, "store": store_root, "dest": dest, "options": None}
    summary = finalize_locations(locations, "plain-1")
    assert summary.delivery == "main_chain" and summary.traces == 0
    byte_store = open_byte_store(dest)
    assert b"delivery" not in (byte_store.get("plain-1/run.json") or b"")
    assert b"traces" not in (byte_store.get("plain-1/ledger.jsonl") or b"")
    (record,) = dest_records(dest, "plain-1")
    assert ENVELOPE_KEY not in record
