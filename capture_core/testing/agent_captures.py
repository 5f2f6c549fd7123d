"""Seeded synthetic captures of realistic agent rollouts, with the chain that was scored.

A rollout is a multi-turn tool-using chain; options add auxiliary calls (their own roots),
sub-agent forks, retries of middle calls and of the final call (some giving the same answer
from different tokens), a later call that continues the scored conversation (a summary or a
memory update), and lost calls.
The finished record carries a scored response whose `id` and model-authored items match
the terminal call, shaped as different harnesses return it (merged transcript, final turn,
chat dialect, with or without the served id), and sometimes an explicit or declared terminal.
With `parent_fields` every entry carries the writer-recorded parent of NeMo Gym 0.7.0.
Everything is deterministic for a seed. This module imports only `capture_core.records`,
`capture_core.testing.seeded_writer` (the calls' entries) and `capture_core.testing.synthetic`
(the vocabulary size).
"""

from __future__ import annotations

import hashlib
import json
import random
from array import array
from dataclasses import dataclass, field
from typing import Any

from capture_core.records import TokenEntry
from capture_core.testing.seeded_writer import SeededWriter, assistant_message
from capture_core.testing.synthetic import VOCAB


@dataclass(frozen=True)
class CaptureMix:
    """How many turns a rollout takes (both ends included) and the probability of each
    shape in it; the defaults are a busy agent harness."""

    turns: tuple[int, int] = (2, 12)
    auxiliary: float = 0.35
    subagent: float = 0.25
    mid_retry: float = 0.25
    identical_mid_retry: float = 0.06
    final_retry: float = 0.2
    identical_final_retry: float = 0.04
    same_answer_final_retry: float = 0.05
    continuation: float = 0.12
    submit_output: float = 0.5
    lost_call: float = 0.06
    explicit: float = 0.15
    declared: float = 0.15


@dataclass
class AgentRollout:
    """One generated rollout: what was captured, what was lost, the record, the truth."""

    rollout_id: str
    entries: list[TokenEntry]
    lost_call_ids: list[str]
    record: dict[str, Any]
    scored_chain: list[TokenEntry]
    shapes: list[str] = field(default_factory=list)
    decidable: bool = True

    @property
    def healthy(self) -> bool:
        """A rollout whose capture lost no call."""
        return not self.lost_call_ids

    @property
    def deliverable(self) -> bool:
        """Healthy, and the capture and record single out the scored chain (`_decidable`)."""
        return self.healthy and self.decidable


def _digest(tokens: list[int]) -> str:
    return hashlib.sha256(array("q", tokens).tobytes()).hexdigest()


class _Session(SeededWriter):
    """Serves calls for one rollout and records them as a model server's writer would."""

    def __init__(self, rollout_id: str, rng: random.Random, parent_fields: bool) -> None:
        super().__init__(rollout_id, rng)
        self.parent_fields = parent_fields
        self.submit_output = 0.0

    def tokens(self, n: int) -> list[int]:
        return self.rng.choices(range(VOCAB), k=n)

    def serve(
        self,
        prompt: list[int],
        parent: TokenEntry | None,
        items: list[dict[str, Any]],
        *,
        like: TokenEntry | None = None,
    ) -> TokenEntry:
        """One served call; `like` makes an identical retry (same tokens, new served id)."""
        self.tick()
        gen = list(like.generation_token_ids) if like else self.tokens(self.rng.randint(8, 40))
        lps = list(like.generation_log_probs) if like else self.log_probs(gen)
        items = [dict(i) for i in (like.output_items if like else items)]
        extra: dict[str, Any] = {}
        if self.parent_fields:
            extra = {
                "parent_call_id": parent.model_call_id if parent else None,
                "parent_resolution": "resolved" if parent else "root",
                "cum_len": len(prompt) + len(gen),
                "digest": _digest(prompt + gen),
            }
        return self.record(self.call_id(), prompt, gen, lps, items, **extra)


def _tool_call(session: _Session, name: str) -> dict[str, Any]:
    args = {"query": session.words("q"), "limit": session.rng.randint(1, 9)}
    return {
        "type": "function_call",
        "call_id": f"fc_{session.rng.getrandbits(32):08x}",
        "name": name,
        "arguments": json.dumps(args, separators=(",", ":")),
    }


def _turn_items(session: _Session, final: bool) -> list[dict[str, Any]]:
    if final and session.rng.random() < 0.3:
        return [assistant_message(session.words("done")), _tool_call(session, "submit")]
    if final:
        return [assistant_message(session.words("answer"))]
    items = [_tool_call(session, session.rng.choice(["search", "read", "run"]))]
    if session.rng.random() < 0.5:
        items.insert(0, assistant_message(session.words("thinking")))
    if session.rng.random() < 0.3:
        items.insert(0, {"type": "reasoning", "summary": []})
    return items


def _serve_turn(
    session: _Session, prompt: list[int], parent: TokenEntry | None, final: bool, retry: str
) -> tuple[TokenEntry, list[TokenEntry]]:
    """The kept call of a turn and its abandoned retries.

    `retry`: "" (none), "diverse", "identical" (same tokens), "same_answer" (same
    model-authored items from other tokens, as when only the reasoning differed).
    """
    attempts = [session.serve(prompt, parent, _turn_items(session, final))]
    if retry == "diverse":
        attempts += [session.serve(prompt, parent, _turn_items(session, final))]
    elif retry == "same_answer":
        attempts += [session.serve(prompt, parent, attempts[0].output_items)]
    elif retry == "identical":
        attempts += [session.serve(prompt, parent, [], like=attempts[0])]
    kept = session.rng.choice(attempts)
    return kept, [a for a in attempts if a is not kept]


def _subagent(session: _Session, base: TokenEntry) -> None:
    """A sub-agent forked from `base`'s context: one to three calls off the main path."""
    parent = base
    prompt = base.prompt_token_ids + base.generation_token_ids + session.tokens(12)
    for _ in range(session.rng.randint(1, 3)):
        parent = session.serve(prompt, parent, [assistant_message(session.words("sub-agent"))])
        prompt = prompt + parent.generation_token_ids + session.tokens(session.rng.randint(5, 30))


def _auxiliary(session: _Session, label: str) -> None:
    session.serve(
        session.tokens(session.rng.randint(20, 80)), None, [assistant_message(session.words(label))]
    )


def _final_retry_kind(rng: random.Random, mix: CaptureMix) -> str:
    """ "" (no retry of the final call), "diverse", "identical" or "same_answer"."""
    draw = rng.random()
    for kind, weight in (
        ("identical", mix.identical_final_retry),
        ("same_answer", mix.same_answer_final_retry),
        ("diverse", mix.final_retry),
    ):
        if draw < weight:
            return kind
        draw -= weight
    return ""


def _continuation(session: _Session, terminal: TokenEntry) -> None:
    """A later call on the scored conversation's whole context: it extends the terminal."""
    prompt = terminal.prompt_token_ids + terminal.generation_token_ids + session.tokens(15)
    label = session.rng.choice(["summary", "memory"])
    session.serve(prompt, terminal, [assistant_message(session.words(label))])


def _main_chain(session: _Session, mix: CaptureMix, shapes: list[str]) -> list[TokenEntry]:
    rng = session.rng
    turns = rng.randint(*mix.turns)
    mid_retry = rng.randrange(turns - 1) if turns > 1 and rng.random() < mix.mid_retry else None
    identical_mid = mid_retry is not None and rng.random() < mix.identical_mid_retry / mix.mid_retry
    fork_at = rng.randrange(turns - 1) if turns > 1 and rng.random() < mix.subagent else None
    final_retry = _final_retry_kind(rng, mix)
    prompt = session.tokens(rng.randint(60, 200))
    chain: list[TokenEntry] = []
    for turn in range(turns):
        final = turn == turns - 1
        retry = ""
        if turn == mid_retry:
            retry = "identical" if identical_mid else "diverse"
            shapes.append(f"{retry}_mid_retry")
        if final and final_retry:
            retry = final_retry
            shapes.append(f"{retry}_final_retry")
        kept, _abandoned = _serve_turn(session, prompt, chain[-1] if chain else None, final, retry)
        chain.append(kept)
        if turn == fork_at:
            shapes.append("subagent")
            _subagent(session, kept)
        prompt = prompt + kept.generation_token_ids + session.tokens(rng.randint(10, 60))
    return chain


def _transcript(session: _Session, chain: list[TokenEntry]) -> list[dict[str, Any]]:
    """The merged conversation a harness returns: user turn, each call's items, tool results.

    Tool-call arguments are re-serialised with other spacing, as a harness log would.
    A final tool call (a submit) is sometimes followed by its output: the harness ran it.
    """
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "task"}]
    for n, entry in enumerate(chain):
        for item in entry.output_items:
            copied = dict(item)
            if copied.get("type") == "function_call":
                copied["arguments"] = json.dumps(json.loads(copied["arguments"]), indent=1)
            items.append(copied)
            ran = n < len(chain) - 1 or session.rng.random() < session.submit_output
            if copied.get("type") == "function_call" and ran:
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": copied["call_id"],
                        "output": session.words("result"),
                    }
                )
    return items


def _chat_choice(terminal: TokenEntry) -> dict[str, Any]:
    text = "".join(
        part["text"]
        for item in terminal.output_items
        if item.get("type") == "message"
        for part in item["content"]
    )
    calls = [
        {"type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in terminal.output_items
        if i.get("type") == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return {"index": 0, "message": message, "finish_reason": "stop"}


def _scored_response(session: _Session, chain: list[TokenEntry]) -> dict[str, Any]:
    """The response the verifier scored, as one of several harness shapes returns it."""
    rng, terminal = session.rng, chain[-1]
    kind = rng.random()
    served_id = terminal.response_id or ""
    response_id = served_id if kind < 0.55 else ("" if kind < 0.8 else f"resp_minted_{kind:.6f}")
    shape = rng.random()
    if shape < 0.15:
        return {"id": response_id, "object": "chat.completion", "choices": [_chat_choice(terminal)]}
    output = (
        _transcript(session, chain) if shape < 0.6 else [dict(i) for i in terminal.output_items]
    )
    return {"id": response_id, "model": "policy", "object": "response", "output": output}


def agent_rollout(
    task_index: int,
    rollout_index: int,
    *,
    seed: int = 0,
    parent_fields: bool = False,
    mix: CaptureMix | None = None,
) -> AgentRollout:
    """One rollout's capture and finished record; the same seed gives the same rollout.

    `parent_fields` changes only the writer's extra fields, never the tokens or the shapes.
    """
    mix = mix or CaptureMix()
    rollout_id = f"{task_index}-{rollout_index}"
    rng = random.Random(f"{seed}:{rollout_id}")
    session = _Session(rollout_id, rng, parent_fields)
    shapes: list[str] = []
    if rng.random() < mix.auxiliary:
        shapes.append("auxiliary")
        _auxiliary(session, "title")
    session.submit_output = mix.submit_output
    chain = _main_chain(session, mix, shapes)
    if rng.random() < mix.continuation:
        shapes.append("continuation")
        _continuation(session, chain[-1])
    if "auxiliary" in shapes and rng.random() < 0.5:
        _auxiliary(session, "summary")
    record: dict[str, Any] = {
        "_ng_task_index": task_index,
        "_ng_rollout_index": rollout_index,
        "reward": round(rng.random(), 3),
        "response": _scored_response(session, chain),
    }
    witness = rng.random()
    if witness < mix.explicit:
        record["_ng_terminal_model_call_id"] = chain[-1].model_call_id
    elif witness < mix.explicit + mix.declared:
        record["terminal_response_id"] = chain[-1].response_id
    decidable = _decidable(record, chain, shapes)
    lost: list[str] = []
    if rng.random() < mix.lost_call:
        victim = rng.choice(session.entries)
        lost.append(victim.model_call_id)
        shapes.append("lost_call")
    entries = [e for e in session.entries if e.model_call_id not in lost]
    return AgentRollout(rollout_id, entries, lost, record, chain, shapes or ["plain"], decidable)


def _decidable(record: dict[str, Any], chain: list[TokenEntry], shapes: list[str]) -> bool:
    """Whether anything in the capture or the record tells the scored chain from the others.

    Not for a same-answer retry of the final call (same parent and items, other tokens)
    with no terminal named and no served id: both attempts fit all the evidence alike (a
    later call extending one is no evidence), and the truth is the generator's coin flip.
    """
    if "same_answer_final_retry" not in shapes:
        return True
    named = "_ng_terminal_model_call_id" in record or "terminal_response_id" in record
    return named or record["response"].get("id") == chain[-1].response_id


def agent_rollouts(
    n: int, *, seed: int = 0, parent_fields: bool = False, mix: CaptureMix | None = None
) -> list[AgentRollout]:
    """`n` rollouts of one seed (task index = position // 8, rollout index = position % 8)."""
    return [
        agent_rollout(i // 8, i % 8, seed=seed, parent_fields=parent_fields, mix=mix)
        for i in range(n)
    ]


def write_capture(store: Any, rollout: AgentRollout) -> None:
    """Capture a rollout as a model server would: an intent per call, then its entry.

    A lost call leaves its intent without an entry, which makes the snapshot incomplete.
    """
    for call_id in rollout.lost_call_ids:
        store.begin_call_now(rollout.rollout_id, call_id)
    for entry in rollout.entries:
        store.begin_call_now(rollout.rollout_id, entry.model_call_id)
        store.put_now(entry)


def delivered_tokens(output: list[dict[str, Any]]) -> list[tuple[list, list, list]]:
    """The token arrays of every generated item of a response's output, in order."""
    return [
        (item["prompt_token_ids"], item["generation_token_ids"], item["generation_log_probs"])
        for item in output
        if item.get("generation_token_ids")
    ]


def scored_tokens(rollout: AgentRollout) -> list[tuple[list, list, list]]:
    """What a correct delivery carries: the scored chain's arrays, root to terminal."""
    return [
        (e.prompt_token_ids, e.generation_token_ids, e.generation_log_probs)
        for e in rollout.scored_chain
    ]
