"""Proof under faults: injected S3 faults, racing writers, bad input, and no leaked secrets."""

from __future__ import annotations

import asyncio
import multiprocessing
import os

import orjson
import pytest

from capture_core.delivery import finalize_rollout_token_capture, retire_rollout_token_capture
from capture_core.errors import StoreUnavailableError
from capture_core.records import TokenEntry
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import rollout_record
from tests.conftest import make_bucket
from tests.support import workers
from tests.support.backends import PROCESS_SHARED_BACKENDS
from tests.support.fault_proxy import FaultPlan, fault_proxy
from tests.support.pipeline_helpers import (
    dest_records,
    finalize_args,
    make_batch,
    rollout_ids,
    run_cli,
    write_rollouts,
)
from tests.support.reliability_figures import record_figure
from tokcap.flows.finalize import RunFailedError, finalize_run, retire_uploaded
from tokcap.flows.retrigger import retrigger_failed

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]


def test_ten_percent_faults_complete_or_retrigger_without_loss(tmp_path, s3_options) -> None:
    reference_store = str(tmp_path / "ref-store")
    reference = make_batch(TokenCaptureStore(reference_store), 12, masked={5})
    ref_rollouts = write_rollouts(str(tmp_path / "ref.jsonl"), reference)
    finalize_run(ref_rollouts, reference_store, str(tmp_path / "ref-dest"), "faults", batch_size=4)
    expected = dest_records(str(tmp_path / "ref-dest"), "faults")

    bucket = make_bucket(s3_options)
    plan = FaultPlan(rate=0.10, seed=7, operations=("read", "list", "write", "delete"))
    with fault_proxy(str(s3_options["endpoint_url"]), plan) as proxy:
        options = {"endpoint_url": proxy}
        store, dest = f"s3://{bucket}/store", f"s3://{bucket}/dest"
        plan.rate = 0.0
        records = make_batch(TokenCaptureStore(store, options), 12, masked={5})
        rollouts = write_rollouts(f"s3://{bucket}/in.jsonl", records, options)
        plan.rate = 0.10
        attempts = 1
        try:
            finalize_run(rollouts, store, dest, "faults", batch_size=4, storage_options=options)
        except RunFailedError:
            while attempts < 4:
                attempts += 1
                try:
                    retrigger_failed(dest, "faults", store, storage_options=options)
                    break
                except RunFailedError:
                    continue
        plan.rate = 0.0
        got = dest_records(dest, "faults", options)
        assert rollout_ids(got) == [f"7-{i}" for i in range(12)], "nothing lost or duplicated"
        assert got == expected
        byte_store = TokenCaptureStore(store, options).byte_store
        for i in range(12):
            keys = byte_store.list_prefix(f"7-{i}")
            assert (f"7-{i}/RETIRED" in keys) is (i != 5)
            assert any("/e/" in k for k in keys) is (i == 5)
    assert sum(plan.injected.values()) > 0
    record_figure("faults_injected", sum(plan.injected.values()))
    record_figure("fault_runs_survived", 1)
    record_figure("records_lost", 12 - len(got))


def _late_writer(
    root: str, options: dict, worker: int, rollouts: list[str], queue, taken, barrier
) -> dict:
    """Write each rollout's calls, announcing it complete 1-3 calls early, then write the rest
    as soon as the finalizer has taken it, so the rest races its freeze: every rollout races,
    not only the first ones the finalizer takes before the writers get ahead of it."""
    store = TokenCaptureStore(root, options)
    barrier.wait(timeout=120)
    outcome = {}
    for position, rollout_id in enumerate(rollouts):
        entries = workers.chain_entries(rollout_id, calls=4)
        early = 1 + position % 3
        for entry in entries[:early]:
            store.put_now(entry)
        queue.put(rollout_id)
        outcome[rollout_id] = "accepted"
        if taken.get(timeout=300) != rollout_id:
            raise AssertionError(f"writer {worker}: the finalizer took another rollout")
        for entry in entries[early:]:
            try:
                store.put_now(entry)
            except Exception as exc:
                outcome[rollout_id] = type(exc).__name__
                break
    return outcome


@pytest.mark.parametrize("backend", PROCESS_SHARED_BACKENDS)
def test_racing_writers_and_finalizer_never_let_a_late_write_go_unnoticed(
    backend: str, tmp_path, request: pytest.FixtureRequest
) -> None:
    if backend == "local":
        root, options, per_writer = str(tmp_path / "store"), {}, 25
    else:
        s3 = request.getfixturevalue("s3_options")
        root, options, per_writer = f"s3://{make_bucket(s3)}/store", dict(s3), 8
    ctx = multiprocessing.get_context("spawn")
    plan = {w: [f"{w}-{i}" for i in range(per_writer)] for w in range(8)}
    store = TokenCaptureStore(root, options)
    builds = {}
    with ctx.Manager() as manager, ctx.Pool(8) as pool:
        queue, barrier = manager.Queue(), manager.Barrier(8)
        taken = {w: manager.Queue() for w in plan}
        pending = [
            pool.apply_async(_late_writer, (root, options, w, ids, queue, taken[w], barrier))
            for w, ids in plan.items()
        ]
        for _ in range(8 * per_writer):
            rollout_id = queue.get(timeout=300)
            task, index = rollout_id.split("-")
            taken[int(task)].put(rollout_id)  # the writer's late calls now race this freeze
            record = rollout_record(int(task), int(index))
            built = asyncio.run(finalize_rollout_token_capture(record, store))
            retired = asyncio.run(retire_rollout_token_capture(rollout_id, store, built))
            builds[rollout_id] = (built, retired)
        outcomes = {k: v for p in pending for k, v in p.get(timeout=300).items()}
    silent, kinds = [], {"complete": 0, "late write refused": 0, "retirement refused": 0}
    for rollout_id, (built, retired) in builds.items():
        assert not built["mask_sample"] or not retired, "a masked build was retired"
        if built["metrics"]["n_calls"] == 4:
            kinds["complete"] += 1
        elif outcomes[rollout_id] != "accepted":
            kinds["late write refused"] += 1
        elif not retired:
            kinds["retirement refused"] += 1
        else:
            silent.append(rollout_id)
    assert silent == [], "a write accepted after freeze went unnoticed"
    assert sum(kinds.values()) == len(builds) == 8 * per_writer
    assert kinds["late write refused"] + kinds["retirement refused"] > 0, kinds
    record_figure("racing_rollouts_checked", len(builds))
    record_figure(
        "racing_late_writes_caught", kinds["late write refused"] + kinds["retirement refused"]
    )


def test_non_utf8_and_huge_inputs(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    store = TokenCaptureStore(store_root)
    huge = TokenEntry(
        rollout_id="9-0",
        model_call_id="big",
        prompt_token_ids=list(range(2_000_000)),
        generation_token_ids=[1, 2],
        generation_log_probs=[-0.1, -0.2],
    )
    store.put_now(huge)
    records = [rollout_record(9, 0)]
    rollouts = write_rollouts(
        str(tmp_path / "in.jsonl"), records, extra_lines=[b'{"_ng_rollout_id": "\xff\xfe"}\n']
    )
    with pytest.raises(RunFailedError, match=r"1 malformed input line \(") as failed:
        finalize_run(rollouts, store_root, dest, "odd")
    summary = failed.value.summary
    assert summary.handed_off == 1 and summary.malformed_lines == 1 and summary.retired == 1
    out = dest_records(dest, "odd")
    assert len(out[0]["response"]["output"][0]["prompt_token_ids"]) == 2_000_000
    record_figure("bad_inputs_tried", 2)


def test_path_escaping_and_malformed_ids_are_masked_not_followed(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    os.makedirs(store_root)
    outside = tmp_path / "outside"
    outside.mkdir()
    records = [
        {"_ng_rollout_id": "../outside"},
        {"_ng_rollout_id": "a/b"},
        {"_ng_task_index": -1, "_ng_rollout_index": 0},
    ]
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    summary = finalize_run(rollouts, store_root, dest, "ids")
    assert summary.masked == 3 and summary.handed_off == 3
    assert list(outside.iterdir()) == [] and os.listdir(store_root) == []
    record_figure("bad_inputs_tried", 3)


def test_store_root_that_is_a_file_and_wrong_credentials(tmp_path, s3_options) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), [rollout_record(1, 1)])
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        finalize_run(rollouts, str(not_a_dir), str(tmp_path / "dest"), "r")
    bucket = make_bucket(s3_options)
    plan = FaultPlan(rejected_key="WRONGKEY")
    with fault_proxy(str(s3_options["endpoint_url"]), plan) as proxy:
        store = TokenCaptureStore(
            f"s3://{bucket}/x", {"endpoint_url": proxy, "key": "WRONGKEY", "secret": "nope"}
        )
        with pytest.raises(PermissionError, match="refused to .*check the credentials"):
            store.freeze_now("r1")
    dead = TokenCaptureStore("s3://b/x", {"endpoint_url": "http://127.0.0.1:9"})
    with pytest.raises(StoreUnavailableError):
        dead.put_now(workers.own_entry("r1", 0, 0))
    record_figure("bad_inputs_tried", 3)


def test_planted_secret_never_appears_in_outputs(tmp_path, s3_options, prefect_api: str) -> None:
    secret = "PLANTED-SECRET-7f3a9c"
    bucket = make_bucket(s3_options)
    endpoint = str(s3_options["endpoint_url"])
    store, dest = f"s3://{bucket}/store", f"s3://{bucket}/dest"
    make_batch(TokenCaptureStore(store, {"endpoint_url": endpoint}), 3, masked={1})
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), [rollout_record(7, i) for i in range(3)])
    creds = [
        "--storage-option",
        f"endpoint_url={endpoint}",
        "--storage-option",
        "key=testing",
        "--storage-option",
        f"secret={secret}",
    ]
    env = {"AWS_SECRET_ACCESS_KEY": "", "AWS_ACCESS_KEY_ID": ""}
    done = run_cli(
        finalize_args(rollouts, store, dest, "secret-run", *creds),
        prefect_api,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    texts = [done.stdout, done.stderr]
    byte_store = open_byte_store(dest, {"endpoint_url": endpoint})
    texts += [
        (byte_store.get(k) or b"").decode("utf-8", "replace")
        for k in byte_store.list_prefix("secret-run")
    ]
    texts.append(_prefect_api_dump())
    assert all(secret not in text for text in texts)
    assert any("ledger" in text or "handed_off" in text for text in texts[2:])
    record_figure("secret_checks", len(texts))


def _prefect_api_dump() -> str:
    """Flow-run parameters, artifacts, logs and blocks from the Prefect API, as one text."""
    from prefect.client.orchestration import get_client

    async def dump() -> str:
        async with get_client() as client:
            runs = await client.read_flow_runs()
            artifacts = await client.read_artifacts()
            logs = await client.read_logs()
            blocks = await client.read_block_documents(include_secrets=True)
        parts = [orjson.dumps(r.parameters, default=str).decode() for r in runs]
        parts += [str(a.data) for a in artifacts] + [log.message for log in logs]
        parts += [orjson.dumps(b.data, default=str).decode() for b in blocks]
        return "\n".join(parts)

    return asyncio.run(dump())


def test_an_s3_outage_at_retirement_is_one_line_naming_the_command_that_completes_it(
    tmp_path, s3_options
) -> None:
    """Every delete fails once the parts are handed off: the run fails with one line for the
    three batches' retirements, counts the rollouts left unretired, keeps their captures and
    names `tokcap retire`; that command, run once S3 is back, retires all of them."""
    bucket = make_bucket(s3_options)
    plan = FaultPlan(rate=0.0, kinds=("503",), operations=("delete",))
    with fault_proxy(str(s3_options["endpoint_url"]), plan) as proxy:
        options = {"endpoint_url": proxy}
        store, dest = f"s3://{bucket}/store", f"s3://{bucket}/dest"
        records = make_batch(TokenCaptureStore(store, options), 6)
        rollouts = write_rollouts(f"s3://{bucket}/in.jsonl", records, options)
        plan.rate = 1.0
        with pytest.raises(RunFailedError) as failed:
            finalize_run(rollouts, store, dest, "outage", batch_size=2, storage_options=options)
        plan.rate = 0.0
        assert plan.injected["delete:503"] > 0
        retirement = [line for line in failed.value.failures if "retirement" in line]
        assert len(retirement) == 1 and retirement[0].startswith("batches 0-2: "), retirement
        message = str(failed.value)
        assert "6 handed-off rollouts left unretired" in message, message
        command = f"tokcap retire --dest {dest} --run-id outage --store {store}"
        assert command in message and "--storage-option" in message, message
        assert len(dest_records(dest, "outage", options)) == 6, "every record was handed off"
        byte_store = TokenCaptureStore(store, options).byte_store
        assert all(byte_store.list_prefix(f"7-{i}") for i in range(6)), "captures kept"
        counts = retire_uploaded(dest, "outage", store, storage_options=options)
        assert counts["retired"] + counts["retired_earlier"] == 6, counts
        for i in range(6):
            keys = byte_store.list_prefix(f"7-{i}")
            assert f"7-{i}/RETIRED" in keys and not any("/e/" in k for k in keys), keys
