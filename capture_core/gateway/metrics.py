"""What an operator watches: calls, capture write latency, lost calls by cause, engine
errors and bytes captured, in Prometheus' text format (`GET /metrics`).

Each gateway keeps its own registry, so two gateways in one process (tests) never share
counts. Lost-call causes are a closed set (`CAUSES`), so a label never grows unbounded.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CAUSES = (
    "client_disconnected",
    "engine_error",
    "engine_timeout",
    "engine_unreachable",
    "engine_dropped",
    "unusable_answer",
    "answer_too_large",
    "store_failed",
    "version_source",
    "unobserved_path",
    "gateway_shutdown",
)
"""Why a call was lost; each is also the `cause` of its log line."""
CONTENT_TYPE = CONTENT_TYPE_LATEST


class GatewayMetrics:
    """The gateway's counters and histogram, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "tokcap_gateway_calls",
            "Model calls by dialect and outcome (captured, lost, refused, forwarded).",
            ["dialect", "outcome"],
            registry=self.registry,
        )
        self.lost = Counter(
            "tokcap_gateway_lost_calls",
            "Calls recorded lost (their rollouts are masked), by cause.",
            ["cause"],
            registry=self.registry,
        )
        self.engine_errors = Counter(
            "tokcap_gateway_engine_errors",
            "Engine answers that were errors, timeouts, refused connections or dropped streams.",
            ["kind"],
            registry=self.registry,
        )
        self.write_seconds = Histogram(
            "tokcap_gateway_capture_write_seconds",
            "Seconds to write one captured call durably to the store.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.bytes_stored = Counter(
            "tokcap_gateway_captured_bytes",
            "Bytes of the engine answers captured (the store's compact encoding is smaller).",
            registry=self.registry,
        )
        for cause in CAUSES:
            self.lost.labels(cause=cause)

    def exposition(self) -> bytes:
        """Every metric in Prometheus' text format."""
        return generate_latest(self.registry)
