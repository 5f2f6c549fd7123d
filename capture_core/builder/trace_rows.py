"""Row assembly for multi-trace delivery: the owned calls laid out as training rows.

With `prefix_merging` a row is a root-to-leaf path of the kept calls, depth first with
children in call order, and it owns the calls no earlier row holds; with `per_request` each
kept call is a row of its own. A row's tokens are its leaf's prompt plus generation, each
owner's generation is a span with its sampling-time log probs and a loss mask of 1, and
everything else is context (log prob 0, mask 0). Which calls are kept is decided before
(`traces`); `trace_envelope.check_envelope` verifies the rows against the capture after.
This module imports only `forest`, `records` and `trace_envelope`; nothing here recurses.
"""

from __future__ import annotations

from typing import Any

from capture_core.builder.forest import CallForest
from capture_core.builder.trace_envelope import ZERO_LOG_PROB
from capture_core.records import TokenEntry

Row = tuple[list[int], list[int]]
"""A row's path (call positions, root to leaf) and its owners (the calls it trains)."""
_ZERO, _OFF, _ON = [ZERO_LOG_PROB], [0], [1]


def merged_rows(forest: CallForest, kept: list[int], excluded: dict[int, str]) -> list[Row]:
    """Every root-to-leaf path of the kept calls, depth first, children in call order, each
    with its owners: the calls no earlier row holds (the path below where it branches).

    Every kept call's parent is kept too (the caller checks it), so the paths are whole.
    """
    parent, children = forest.parent, forest.children
    # Positions are in call order and children are linked in position order: no sort.
    stack = [(root, 0) for root in reversed(kept) if parent[root] is None]
    rows: list[Row] = []
    path: list[int] = []
    owned = 0  # how much of `path` an earlier row holds
    while stack:
        node, depth = stack.pop()
        del path[depth:]
        if depth < owned:
            owned = depth
        while True:  # down the first child to a leaf; later children wait on the stack
            path.append(node)
            below = children.get(node)
            if below and excluded:
                below = [kid for kid in below if kid not in excluded]
            if not below:
                break
            if len(below) > 1:
                stack += [(kid, len(path)) for kid in reversed(below[1:])]
            node = below[0]
        rows.append((path.copy(), path[owned:]))
        owned = len(path)
    return rows


def trace_row(rollout_id: str, calls: list[TokenEntry], ids: list[str], row: Row) -> dict[str, Any]:
    """One row of the envelope: the path's tokens, with the owners' generations as its spans
    (`ids`: the call ids by position)."""
    path, owners = row
    # Each prompt on a path extends the call before it, so the row is the leaf's
    # prompt plus generation (`check_envelope` verifies every span against its call).
    leaf_call = calls[path[-1]]
    tokens = leaf_call.prompt_token_ids + leaf_call.generation_token_ids
    n = len(tokens)
    logprobs, mask = _ZERO * n, _OFF * n
    spans = []
    for i in owners:  # in path order, so spans come in position order
        call = calls[i]
        start = len(call.prompt_token_ids)
        end = start + len(call.generation_token_ids)
        logprobs[start:end] = call.generation_log_probs
        mask[start:end] = _ON * (end - start)
        spans.append({"model_call_id": ids[i], "start": start, "end": end})
    return {
        "trace_id": f"{rollout_id}:{ids[path[-1]]}",
        "model_call_ids": list(map(ids.__getitem__, path)),
        "token_ids": tokens,
        "generation_logprobs": logprobs,
        "loss_mask": mask,
        "sampled_spans": spans,
    }
