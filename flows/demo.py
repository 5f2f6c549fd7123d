"""`tokcap demo`: the whole pipeline on the embedded default (local store, temporary server).

It captures a realistic synthetic batch and runs the dispatch-time clear, finalize, durable
handoff and retire, then prints the summary. The first rollouts are scripted, one per case
worth seeing (clean multi-turn rollouts, a retried call, a lost call, an auxiliary call the
scored chain leaves out, a record that already carries token ids, a stale earlier attempt);
each record's scored response is its final call's output, so terminal attribution names the
call that earned the reward. With `--rollouts N` the rest come from the seeded agent-capture
generator (`capture_core.testing.agent_captures`: auxiliary calls, sub-agent forks, retries,
lost calls, responses as different harnesses return them).
"""

from __future__ import annotations

import os
import re
import shutil
import time

import orjson

from capture_core.operator.mask_reasons import reason_kind, witness_words
from capture_core.run.run_layout import LedgerLine, read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.agent_captures import AgentRollout, agent_rollout, write_capture
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout

SCRIPTED: list[tuple[str, RolloutShape, str]] = [
    ("0-0", RolloutShape(turns=6), "clean 6-turn agent episode"),
    ("0-1", RolloutShape(turns=4), "clean 4-turn agent episode"),
    ("0-2", RolloutShape(turns=8, prompt_tokens=256), "clean 8-turn episode, long prompt"),
    ("1-0", RolloutShape(turns=5, retried_turn=2), "a retried call the builder resolves"),
    ("1-1", RolloutShape(turns=4), "a lost call (model server restarted): masked"),
    (
        "1-2",
        RolloutShape(turns=3, auxiliary_call=True),
        "an auxiliary summariser call: left out, the scored chain delivered",
    ),
    ("1-3", RolloutShape(turns=2), "record already carries token ids: left unchanged"),
]
DEFAULT_ROLLOUTS = len(SCRIPTED)
LOST_CALL = ("1-1", "call-00004")  # began on a model server that restarted: never captured
GENERATED_TASKS_FROM = 2  # generated rollouts are `2-0`, `2-1`, ...: after the scripted ids
GENERATED_PER_TASK = 8


def scripted_rollout(rollout_id: str, shape: RolloutShape) -> AgentRollout:
    """A scripted case; the record's scored response is its final call's output."""
    entries = synthetic_rollout(rollout_id, shape)
    chain = [e for e in entries if re.fullmatch(r"call-\d+", e.model_call_id)]  # no retry, aux
    task, rollout = (int(part) for part in rollout_id.split("-"))
    record = rollout_record(task, rollout, reward=0.0 if rollout_id == LOST_CALL[0] else 1.0)
    record["response"]["output"] = [dict(item) for item in chain[-1].output_items]
    if rollout_id == "1-3":
        record["response"]["output"][0].update(
            prompt_token_ids=[1, 2, 3],
            generation_token_ids=[4, 5],
            generation_log_probs=[-0.1, -0.2],
        )
    lost = [LOST_CALL[1]] if rollout_id == LOST_CALL[0] else []
    return AgentRollout(rollout_id, entries, lost, record, scored_chain=chain)


def demo_rollouts(count: int = DEFAULT_ROLLOUTS, seed: int = 0) -> list[AgentRollout]:
    """`count` rollouts: the scripted cases first, then seeded agent-capture rollouts."""
    rollouts = [scripted_rollout(rid, shape) for rid, shape, _why in SCRIPTED[:count]]
    for i in range(count - len(rollouts)):
        task = GENERATED_TASKS_FROM + i // GENERATED_PER_TASK
        rollouts.append(agent_rollout(task, i % GENERATED_PER_TASK, seed=seed))
    return rollouts


def write_inputs(workdir: str, rollouts: list[AgentRollout]) -> tuple[str, str]:
    """Write the rollout file and a fresh `<workdir>/store` holding a stale capture of the
    first rollout id (an earlier attempt); return the store and the rollout file."""
    store_root = os.path.join(workdir, "store")
    shutil.rmtree(store_root, ignore_errors=True)  # the demo's own store; outputs stay
    store = TokenCaptureStore(store_root)
    for entry in synthetic_rollout(rollouts[0].rollout_id, RolloutShape(turns=2), seed=99):
        store.put_now(entry.model_copy(update={"model_call_id": "stale-" + entry.model_call_id}))
    path = os.path.join(workdir, "rollouts.jsonl")
    with open(path, "wb") as f:
        f.write(b"".join(orjson.dumps(r.record) + b"\n" for r in rollouts))
    return store_root, path


def capture_batch(store_root: str, rollouts: list[AgentRollout]) -> None:
    """What the model servers write while the batch runs: an intent per call, then its
    entry; a lost call leaves only its intent (`write_capture`)."""
    store = TokenCaptureStore(store_root)
    for rollout in rollouts:
        write_capture(store, rollout)


def demo_batch_size(count: int) -> int:
    """Batches of 4 for a small demo; about 8 batches for a large one."""
    return max(4, -(-count // 8))


def describe(rollouts: list[AgentRollout]) -> list[str]:
    """One line per scripted case, one for the generated rest."""
    lines = [f"  {rid}: {why}" for rid, _shape, why in SCRIPTED[: len(rollouts)]]
    generated = len(rollouts) - len(lines)
    if generated:
        lines.append(
            f"  {generated} more from the seeded agent-capture generator (auxiliary calls, "
            "sub-agent forks, retries, lost calls)"
        )
    return lines


def case_fate(line: LedgerLine | None) -> str:
    """What the run did with one rollout, in words, from its ledger line."""
    if line is None:
        return "not in the run's ledger"
    if not line.handed_off:
        return f"not handed off: {line.error or 'its batch failed'}"
    if line.masked:
        kind = reason_kind(line.mask_reason)
        return f"handed off masked ({kind.title}; trainers skip it), capture kept as evidence"
    if line.delivered_fraction is None and line.terminal_method is None:
        fate = "handed off unchanged (it already carried token ids)"
    else:
        fate = "handed off with its rebuilt tokens"
        if line.terminal_method and line.terminal_method != "none":
            fate += f", scored call found by {witness_words(line.terminal_method)}"
        if line.delivered_fraction is not None and line.delivered_fraction < 1:
            share = f"{100 * line.delivered_fraction:.0f}%"
            fate += f", {share} of its generated tokens (calls off the scored chain left out)"
    return fate + (", capture retired" if line.retired else ", capture kept")


def case_outcomes(rollouts: list[AgentRollout], ledger: list[LedgerLine]) -> list[str]:
    """One line per scripted case: its description, then what happened to it."""
    by_id = {line.rollout_id: line for line in ledger}
    return [
        f"  {rid} {why} -> {case_fate(by_id.get(rid))}"
        for rid, _shape, why in SCRIPTED[: len(rollouts)]
    ]


def run_demo(workdir: str, api_url: str | None = None, count: int = DEFAULT_ROLLOUTS) -> int:
    """Run the demo of `count` rollouts in `workdir` against `api_url` (`None`: the CLI's
    temporary server)."""
    from tokcap.flows.clear import dispatch_clear
    from tokcap.flows.cli.output import print_summary
    from tokcap.flows.finalize import finalize_run
    from tokcap.flows.runners import run_flow, script, ui_hint

    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    run_id = time.strftime("demo-%Y%m%d-%H%M%S")
    rollouts = demo_rollouts(count)
    store_root, rollouts_file = write_inputs(workdir, rollouts)
    dest = os.path.join(workdir, "dest")
    print(f"tokcap demo in {workdir}: {len(rollouts)} rollouts")
    print("\n".join(describe(rollouts)))
    store = TokenCaptureStore(store_root)
    stale = [r.rollout_id for r in rollouts if store.read_entries(r.rollout_id)]
    cleared = run_flow(dispatch_clear, rollouts=rollouts_file, store=store_root)
    removed = [rollout_id for rollout_id in stale if not store.read_entries(rollout_id)]
    print(
        f"dispatch-time clear of {cleared.cleared} rollout ids: {len(removed)} held a stale "
        f"capture from an earlier attempt, now removed ({', '.join(removed) or 'none'})"
    )
    capture_batch(store_root, rollouts)
    summary = run_flow(
        finalize_run,
        rollouts=rollouts_file,
        store=store_root,
        dest=dest,
        run_id=run_id,
        batch_size=demo_batch_size(len(rollouts)),
    )
    print()
    print_summary(summary)
    print("\nWhat happened to each scripted case:")
    print("\n".join(case_outcomes(rollouts, read_ledger(open_byte_store(dest), run_id) or [])))
    print(
        f"\nWatch it in the Prefect UI: {ui_hint(api_url)}.\n"
        f"Inspect it here: {script('tokcap')} status --dest {dest} --run-id {run_id}"
    )
    return 0
