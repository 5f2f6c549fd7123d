"""One rollout's build result, typed; the seed functions' dict is made from it at the boundary.

Every build result is made here, by one of four constructors: a projected trajectory (masked
or not), a failed build, an unusable record (masked before any build) and a redundant capture
(a record that already carries token ids). Internal readers use attributes; `to_dict` gives
exactly the dict NeMo Gym's seed functions return, with its key sets and key order, and
`record_metrics` what a finalized record carries under `_ng_token_capture`. A key is absent
from the dict exactly when its attribute is `None` (or `False`, for the flags).
`from_dict` reads such a dict back, so the dict-taking seed functions share this logic.
With `all_traces` delivery a build carries the checked `training_traces` envelope instead
of a rebuilt response, and its metrics count traces, owned calls and tokens trained.
An unmasked delivery also carries its `token_provenance` (the record key; not in the dict).
This module imports only `chain`, `terminal`, `trace_envelope` and `traces`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capture_core.builder.chain import BuildOutput
from capture_core.builder.terminal import NOT_ATTRIBUTED, TerminalMetric, blocking_reason
from capture_core.builder.trace_envelope import ALL_TRACES, ENVELOPE_KEY
from capture_core.builder.traces import TraceBuild

MASK_SAMPLE_KEY = "mask_sample"
TOKEN_CAPTURE_KEY = "_ng_token_capture"
"""The record key a finalized record carries its build metrics (and any error) under."""
SNAPSHOT_KEY = "_capture_snapshot"
REDUNDANT_CAPTURE_KEY = "_redundant_capture"
TERMINAL_METRIC = "terminal_attribution"
INCOMPLETE_METRIC = "capture_incomplete"
ARRIVED_MASKED = (
    "the record arrived masked (mask_sample: true): it is not trained, so it carries no "
    "envelope and its capture is kept as evidence"
)
INCOMPLETE_REASON = (
    "capture incomplete: a call was lost, never finished, or captured twice differently"
)


def incomplete_reason(reasons: tuple[str, ...] = ()) -> str:
    """Why an incomplete capture masks: the snapshot's own reasons, else the generic one."""
    return f"capture incomplete: {'; '.join(reasons)}" if reasons else INCOMPLETE_REASON


@dataclass(frozen=True, slots=True)
class SnapshotIdentity:
    """The frozen snapshot a build consumed; retirement names exactly this one.

    Values are kept as the source gave them (another library's snapshot type may differ).
    """

    snapshot_id: Any
    version: Any

    def as_dict(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "version": self.version}


@dataclass(frozen=True, slots=True)
class ChainCounts:
    """The counts of a build that produced chains, under NeMo Gym's metric names."""

    chains: int
    """Chains built: the main one and every branch."""
    roots: int
    """Roots that are not quarantined (a resolved retry of the first call is not a root)."""
    quarantined_calls: int
    quarantined_fraction: float
    """Quarantined calls over all calls, to four places."""
    delivered_fraction: float
    """Generated tokens of the main chain over all generated tokens, to four places."""
    generated_tokens_captured: int
    generated_tokens_delivered: int
    empty_generation_calls: int
    """How many calls generated no token (the notes list their ids)."""

    @classmethod
    def of(cls, n_calls: int, built: BuildOutput) -> ChainCounts:
        notes = built.notes
        quarantined = len(built.quarantined)
        return cls(
            chains=notes.chains,
            roots=notes.roots,
            quarantined_calls=quarantined,
            quarantined_fraction=round(quarantined / n_calls, 4) if n_calls else 0.0,
            delivered_fraction=notes.delivered_fraction,
            generated_tokens_captured=notes.generated_tokens_captured,
            generated_tokens_delivered=notes.generated_tokens_delivered,
            empty_generation_calls=len(notes.empty_generation_calls),
        )


_COUNT_NAMES = tuple(f.name for f in dataclasses.fields(ChainCounts))


@dataclass(frozen=True, slots=True)
class TraceCounts:
    """The counts of an `all_traces` build: what the envelope trains and what it left out."""

    traces: int
    """Rows of the envelope (each one training row)."""
    owned_calls: int
    """Calls owned by a span: each trains exactly once."""
    tokens_trained: int
    generated_tokens_captured: int
    excluded_calls: Mapping[str, int]
    """Calls left out, per reason (`traces.EXCLUSION_REASONS`)."""

    @classmethod
    def of(cls, built: TraceBuild) -> TraceCounts:
        return cls(
            traces=built.traces,
            owned_calls=built.owned_calls,
            tokens_trained=built.tokens_trained,
            generated_tokens_captured=built.tokens_captured,
            excluded_calls=built.excluded_counts(),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "delivery": ALL_TRACES,
            "traces": self.traces,
            "owned_calls": self.owned_calls,
            "tokens_trained": self.tokens_trained,
            "generated_tokens_captured": self.generated_tokens_captured,
            "excluded_calls": dict(self.excluded_calls),
        }

    @classmethod
    def from_dict(cls, metrics: Mapping[str, Any]) -> TraceCounts | None:
        if metrics.get("delivery") != ALL_TRACES:
            return None
        excluded = metrics.get("excluded_calls")
        return cls(
            traces=int(metrics.get("traces") or 0),
            owned_calls=int(metrics.get("owned_calls") or 0),
            tokens_trained=int(metrics.get("tokens_trained") or 0),
            generated_tokens_captured=int(metrics.get("generated_tokens_captured") or 0),
            excluded_calls=dict(excluded) if isinstance(excluded, Mapping) else {},
        )


@dataclass(frozen=True, slots=True)
class BuildMetrics:
    """A build's metrics: always `n_calls`; counts only when chains were built.

    `terminal` is the `terminal_attribution` block (on every build, failed ones included;
    not on an unusable record). `error` is set only on an unusable record, whose metrics are
    what the record carries.
    """

    n_calls: int
    counts: ChainCounts | None = None
    terminal: TerminalMetric | None = None
    capture_incomplete: bool = False
    error: str | None = None
    traces: TraceCounts | None = None

    def as_dict(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {"n_calls": self.n_calls}
        if self.counts is not None:
            counts = self.counts
            metrics.update({name: getattr(counts, name) for name in _COUNT_NAMES})
        if self.traces is not None:
            metrics.update(self.traces.as_dict())
        if self.terminal is not None:
            metrics[TERMINAL_METRIC] = self.terminal.as_dict()
        if self.capture_incomplete:
            metrics[INCOMPLETE_METRIC] = True
        if self.error is not None:
            metrics["error"] = self.error
        return metrics

    @classmethod
    def from_dict(cls, metrics: Mapping[str, Any]) -> BuildMetrics:
        counts = None
        if "chains" in metrics:
            counts = ChainCounts(**{name: metrics.get(name, 0) for name in _COUNT_NAMES})
        terminal = metrics.get(TERMINAL_METRIC)
        return cls(
            n_calls=metrics.get("n_calls", 0),
            counts=counts,
            terminal=TerminalMetric.from_dict(terminal) if isinstance(terminal, Mapping) else None,
            capture_incomplete=bool(metrics.get(INCOMPLETE_METRIC)),
            error=metrics.get("error"),
            traces=TraceCounts.from_dict(metrics),
        )


@dataclass(frozen=True, slots=True)
class BuildResult:
    """What building one rollout gave; see the module docstring for the four kinds.

    `rollout_id` and `builder` are `None` only on unusable and redundant results, and
    `unresolved_retries` is set only on a projected trajectory. `incomplete_reasons` holds
    an incomplete snapshot's reasons for `mask_reason`; the dict carries only
    `capture_incomplete` (NeMo Gym's keys), so a dict read back gives the generic reason.
    """

    rebuilt_response: dict[str, Any] | None
    mask_sample: bool
    rollout_id: str | None = None
    builder: str | None = None
    error: str | None = None
    unresolved_retries: tuple[str, ...] | None = None
    redundant_capture: bool = False
    metrics: BuildMetrics | None = None
    snapshot: SnapshotIdentity | None = None
    training_traces: dict[str, Any] | None = None
    incomplete_reasons: tuple[str, ...] = ()
    token_provenance: dict[str, Any] | None = dataclasses.field(default=None, compare=False)
    """The record key `token_provenance` of an unmasked delivery (`builder.token_provenance`);
    a masked build has none. Not in the seed dict, so not compared: a build read back from
    its dict equals the build."""

    @classmethod
    def trajectory(
        cls,
        rollout_id: str,
        builder: str,
        response: dict[str, Any],
        masked: bool,
        built: BuildOutput,
        n_calls: int,
        terminal: TerminalMetric,
        provenance: dict[str, Any] | None = None,
    ) -> BuildResult:
        """A projected main chain; `masked` when the strict policy keeps it from training."""
        metrics = BuildMetrics(n_calls, ChainCounts.of(n_calls, built), terminal)
        retries = tuple(built.notes.unresolved_retries)
        return cls(
            response,
            masked,
            rollout_id,
            builder,
            unresolved_retries=retries,
            metrics=metrics,
            token_provenance=None if masked else provenance,
        )

    @classmethod
    def failed(
        cls,
        rollout_id: str,
        builder: str,
        error: str,
        *,
        n_calls: int = 0,
        terminal: TerminalMetric | None = None,
    ) -> BuildResult:
        """A build that produced nothing to deliver: masked, with its error."""
        metrics = BuildMetrics(n_calls, terminal=terminal or TerminalMetric.of(NOT_ATTRIBUTED))
        return cls(None, True, rollout_id, builder, error=error, metrics=metrics)

    @classmethod
    def traced(cls, built: TraceBuild, provenance: dict[str, Any] | None = None) -> BuildResult:
        """An `all_traces` build: its checked envelope (and the envelope's `provenance`), or
        masked with the reason it has none."""
        metrics = BuildMetrics(
            built.n_calls,
            terminal=TerminalMetric.of(built.attribution),
            traces=TraceCounts.of(built),
        )
        if built.envelope is None:
            return cls(
                None, True, built.rollout_id, built.builder, error=built.error, metrics=metrics
            )
        return cls(
            None,
            False,
            built.rollout_id,
            built.builder,
            metrics=metrics,
            training_traces=built.envelope,
            token_provenance=provenance,
        )

    @classmethod
    def unusable(cls, error: str) -> BuildResult:
        """A record masked before any build (no rollout id, a capture that cannot be read)."""
        return cls(None, True, error=error, metrics=BuildMetrics(0, error=error))

    @classmethod
    def redundant(cls, snapshot: SnapshotIdentity) -> BuildResult:
        """A record that already carries token ids; its frozen capture may retire later."""
        return cls(None, False, redundant_capture=True, snapshot=snapshot)

    def of_snapshot(
        self, snapshot: SnapshotIdentity, incomplete: bool, reasons: tuple[str, ...] = ()
    ) -> BuildResult:
        """This build as made from `snapshot`; an incomplete snapshot masks it (no envelope),
        for `reasons`."""
        if not incomplete:
            return dataclasses.replace(self, snapshot=snapshot)
        metrics = self.metrics or BuildMetrics(0)
        return dataclasses.replace(
            self,
            mask_sample=True,
            metrics=dataclasses.replace(metrics, capture_incomplete=True),
            snapshot=snapshot,
            training_traces=None,
            incomplete_reasons=reasons,
            token_provenance=None,
        )

    def of_masked_record(self) -> BuildResult:
        """This build for a record that arrived masked: masked too, so it carries no envelope
        and never retires; its error says why, unless it has one of its own."""
        if self.mask_sample:
            return self
        error = self.error or ARRIVED_MASKED
        return dataclasses.replace(
            self, mask_sample=True, training_traces=None, error=error, token_provenance=None
        )

    @property
    def can_retire(self) -> bool:
        """Whether this build consumed a frozen snapshot and delivered (or needed) no tokens."""
        if self.mask_sample or self.snapshot is None:
            return False
        delivered = self.rebuilt_response is not None or self.training_traces is not None
        return delivered or self.redundant_capture

    def mask_reason(self) -> str | None:
        """The one reason a masked build gives in logs, ledgers and reports; else `None`.

        The root cause comes first: an incomplete capture (a lost call) explains whatever
        the build then failed at (a broken chain, a contradicted lineage), so it wins over
        the build's error.
        """
        if not self.mask_sample:
            return None
        metrics = self.metrics or BuildMetrics(0)
        if metrics.capture_incomplete:
            return incomplete_reason(self.incomplete_reasons)
        if self.error:
            return self.error
        blocked = blocking_reason(metrics.terminal)
        if blocked:
            return blocked
        if self.unresolved_retries:
            return f"unresolved retries {list(self.unresolved_retries)}"
        counts = metrics.counts
        roots, chains = (counts.roots, counts.chains) if counts else (None, None)
        return f"{roots} roots and {chains} chains (need one of each)"

    def record_metrics(self) -> dict[str, Any]:
        """What a finalized record carries under `_ng_token_capture`: metrics and any error."""
        metrics = self.metrics.as_dict() if self.metrics is not None else {}
        if self.error:
            metrics["error"] = self.error
        return metrics

    def to_dict(self) -> dict[str, Any]:
        """The seed functions' dict: NeMo Gym's keys, in NeMo Gym's order."""
        built: dict[str, Any] = {}
        if self.rollout_id is not None:
            built["rollout_id"] = self.rollout_id
        if self.builder is not None:
            built["builder"] = self.builder
        built["rebuilt_response"] = self.rebuilt_response
        built[MASK_SAMPLE_KEY] = self.mask_sample
        if self.error is not None:
            built["error"] = self.error
        if self.unresolved_retries is not None:
            built["unresolved_retries"] = list(self.unresolved_retries)
        if self.redundant_capture:
            built[REDUNDANT_CAPTURE_KEY] = True
        if self.metrics is not None:
            built["metrics"] = self.metrics.as_dict()
        if self.snapshot is not None:
            built[SNAPSHOT_KEY] = self.snapshot.as_dict()
        if self.training_traces is not None:
            built[ENVELOPE_KEY] = self.training_traces
        return built

    @classmethod
    def from_dict(cls, built: Mapping[str, Any]) -> BuildResult:
        """Read a seed function's dict back; unknown keys are ignored, absent ones are `None`."""
        metrics, snapshot = built.get("metrics"), built.get(SNAPSHOT_KEY)
        retries = built.get("unresolved_retries")
        envelope = built.get(ENVELOPE_KEY)
        return cls(
            rebuilt_response=built.get("rebuilt_response"),
            mask_sample=bool(built.get(MASK_SAMPLE_KEY)),
            rollout_id=built.get("rollout_id"),
            builder=built.get("builder"),
            error=built.get("error"),
            unresolved_retries=None if retries is None else tuple(retries),
            redundant_capture=bool(built.get(REDUNDANT_CAPTURE_KEY)),
            metrics=BuildMetrics.from_dict(metrics) if isinstance(metrics, Mapping) else None,
            snapshot=(
                SnapshotIdentity(snapshot.get("snapshot_id"), snapshot.get("version"))
                if isinstance(snapshot, Mapping) and snapshot
                else None
            ),
            training_traces=envelope if isinstance(envelope, dict) else None,
        )
