"""`tokcap demo`: the whole pipeline on the embedded default (local store, temporary server).

It captures a realistic synthetic batch (clean multi-turn rollouts, a retried call, a lost
call, an auxiliary call, a record that already carries token ids, a stale earlier attempt),
runs the dispatch-time clear, finalize, durable handoff and retire, and prints the summary.
"""

from __future__ import annotations

import os
import shutil
import time

import orjson

from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout

DEMO_ROLLOUTS: list[tuple[str, RolloutShape, str]] = [
    ("0-0", RolloutShape(turns=6), "clean 6-turn agent episode"),
    ("0-1", RolloutShape(turns=4), "clean 4-turn agent episode"),
    ("0-2", RolloutShape(turns=8, prompt_tokens=256), "clean 8-turn episode, long prompt"),
    ("1-0", RolloutShape(turns=5, retried_turn=2), "a retried call the builder resolves"),
    ("1-1", RolloutShape(turns=4), "a lost call (model server restarted): masked"),
    ("1-2", RolloutShape(turns=3, auxiliary_call=True), "an auxiliary summariser call: masked"),
    ("1-3", RolloutShape(turns=2), "record already carries token ids: left unchanged"),
]


def _record(rollout_id: str) -> dict:
    task, rollout = (int(part) for part in rollout_id.split("-"))
    return rollout_record(task, rollout, reward=1.0 if rollout_id != "1-1" else 0.0)


def write_inputs(workdir: str) -> tuple[str, str, list[dict]]:
    """Capture the demo batch into `<workdir>/store`; return store, rollouts file, records."""
    store_root = os.path.join(workdir, "store")
    shutil.rmtree(
        store_root, ignore_errors=True
    )  # the demo's own store; earlier runs' outputs stay
    store = TokenCaptureStore(store_root)
    stale = synthetic_rollout("0-0", RolloutShape(turns=2), seed=99)
    for entry in stale:
        store.put_now(entry.model_copy(update={"model_call_id": "stale-" + entry.model_call_id}))
    records = [_record(rollout_id) for rollout_id, _shape, _why in DEMO_ROLLOUTS]
    carried = next(r for r in records if r["_ng_task_index"] == 1 and r["_ng_rollout_index"] == 3)
    carried["response"]["output"][0].update(
        prompt_token_ids=[1, 2, 3], generation_token_ids=[4, 5], generation_log_probs=[-0.1, -0.2]
    )
    rollouts = os.path.join(workdir, "rollouts.jsonl")
    with open(rollouts, "wb") as f:
        f.write(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return store_root, rollouts, records


def capture_batch(store_root: str) -> None:
    """What the model servers write while the fresh batch of rollouts runs."""
    store = TokenCaptureStore(store_root)
    for rollout_id, shape, _why in DEMO_ROLLOUTS:
        entries: list[TokenEntry] = synthetic_rollout(rollout_id, shape)
        for entry in entries:
            store.put_now(entry)
        if rollout_id == "1-1":
            store.mark_incomplete_now(rollout_id, "call-00004", reason="model server restarted")


def run_demo(workdir: str, api_url: str | None = None) -> int:
    """Run the demo in `workdir` against `api_url` (`None`: the CLI's temporary server)."""
    from flows.clear import dispatch_clear
    from flows.cli_output import print_summary
    from flows.finalize import finalize_run
    from flows.runners import run_flow, script, ui_hint

    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    run_id = time.strftime("demo-%Y%m%d-%H%M%S")
    store_root, rollouts, _records = write_inputs(workdir)
    dest = os.path.join(workdir, "dest")
    print(f"tokcap demo in {workdir}: {len(DEMO_ROLLOUTS)} rollouts")
    for rollout_id, _shape, why in DEMO_ROLLOUTS:
        print(f"  {rollout_id}: {why}")
    store = TokenCaptureStore(store_root)
    stale = [rollout_id for rollout_id, _, _ in DEMO_ROLLOUTS if store.read_entries(rollout_id)]
    cleared = run_flow(dispatch_clear, rollouts=rollouts, store=store_root)
    removed = [rollout_id for rollout_id in stale if not store.read_entries(rollout_id)]
    print(
        f"dispatch-time clear of {cleared.cleared} rollout ids: {len(removed)} held a stale "
        f"capture from an earlier attempt, now removed ({', '.join(removed) or 'none'})"
    )
    capture_batch(store_root)
    summary = run_flow(
        finalize_run, rollouts=rollouts, store=store_root, dest=dest, run_id=run_id, batch_size=4
    )
    print(f"\nrun {run_id}")
    print_summary(summary)
    print(
        f"\nWatch it in the Prefect UI: {ui_hint(api_url)}.\n"
        f"Inspect it here: {script('tokcap')} status --dest {dest} --run-id {run_id}"
    )
    return 0
