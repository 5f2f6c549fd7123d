"""Functions run in separate processes by the concurrency and crash tests."""

from __future__ import annotations

from typing import Any

from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore


def shared_entry(rollout_id: str, call: int) -> TokenEntry:
    """The same payload whichever process writes it (identical duplicates)."""
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=f"shared-{call}",
        prompt_token_ids=list(range(call, call + 50)),
        generation_token_ids=[call] * 20,
        generation_log_probs=[-0.5] * 20,
    )


def own_entry(rollout_id: str, worker: int, call: int) -> TokenEntry:
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=f"w{worker}-{call}",
        prompt_token_ids=[worker, call],
        generation_token_ids=[7],
        generation_log_probs=[-1.0],
    )


def put_overlapping(
    root: str,
    options: dict[str, Any],
    worker: int,
    rollouts: list[str],
    shared_calls: int,
    own_calls: int,
    barrier: Any,
) -> list[str]:
    """Put shared and worker-unique entries; return the errors seen (none expected)."""
    store = TokenCaptureStore(root, options)
    errors = []
    barrier.wait(timeout=120)
    for rollout_id in rollouts:
        for call in range(shared_calls):
            try:
                store.put_now(shared_entry(rollout_id, call))
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        for call in range(own_calls):
            try:
                store.put_now(own_entry(rollout_id, worker, call))
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    store.close_now()
    return errors


def freeze_together(
    root: str, options: dict[str, Any], rollout_id: str, barrier: Any
) -> tuple[str, int]:
    store = TokenCaptureStore(root, options)
    barrier.wait(timeout=120)
    snapshot = store.freeze_now(rollout_id)
    return snapshot.snapshot_id, snapshot.version


def chain_entries(rollout_id: str, calls: int) -> list[TokenEntry]:
    """A linear chain: each call's prompt extends the previous call's prompt and generation."""
    entries, prompt = [], [1, 2, 3]
    for call in range(calls):
        gen = [100 + call, 200 + call]
        entries.append(
            TokenEntry(
                rollout_id=rollout_id,
                model_call_id=f"c{call}",
                prompt_token_ids=list(prompt),
                generation_token_ids=gen,
                generation_log_probs=[-0.5, -0.25],
                created_at=float(call),
            )
        )
        prompt = prompt + gen + [7]
    return entries


def inbox_pass(arguments: str) -> None:
    """One `finalize_inbox` pass with JSON `arguments` (its `FileSettings`); prints its report
    as JSON.

    Run as `python -c` by tests that pause and resume a pass (SIGSTOP, SIGCONT).
    """
    import orjson

    from tokcap.flows.inbox import FileSettings, finalize_inbox

    report = finalize_inbox(FileSettings(**orjson.loads(arguments)))
    print(orjson.dumps(report.model_dump()).decode(), flush=True)


def retire_batch(arguments: str) -> None:
    """`retire_receipt` of a receipt over a capture store and destination, from JSON
    `arguments` (`store`, `dest`, `options`, `receipt`); prints the outcome as JSON.

    Run as `python -c` by the tests that kill a batch retirement at its crash points.
    """
    import asyncio

    import orjson

    from capture_core.run.receipt import HandoffReceipt
    from capture_core.run.retirement import retire_receipt
    from capture_core.storage import open_byte_store

    given = orjson.loads(arguments)
    store = TokenCaptureStore(given["store"], given["options"])
    dest = open_byte_store(given["dest"], given["options"])
    receipt = HandoffReceipt.model_validate(given["receipt"])
    outcome = asyncio.run(retire_receipt(receipt, store, dest))
    print(outcome.model_dump_json(), flush=True)
