"""What one gateway runs with: the engine, the limits, the keys, where versions come from.

Settings are checked once, when built, so a gateway never starts with a setting it would
refuse later. Keys are kept out of `repr` (they must never reach a log line).
This module imports only `errors`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from capture_core.errors import InvalidInputError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""A request body larger than this is refused with 413 (a long agent conversation is a few MB)."""
DEFAULT_MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""An engine answer (a streamed one summed over its events) larger than this fails the call."""
DEFAULT_ENGINE_TIMEOUT = 600.0
"""Seconds an engine may take to answer (or between two streamed events) before the call is lost."""
DEFAULT_SHUTDOWN_GRACE = 30.0
"""Seconds a stopping gateway lets calls in flight finish before it cuts them (recorded lost,
cause `gateway_shutdown`)."""
API_KEY_ENV = "TOKCAP_GATEWAY_API_KEY"
"""The environment variable a gateway's own key may come from instead of `--api-key`."""
ENGINE_API_KEY_ENV = "TOKCAP_ENGINE_API_KEY"
"""The environment variable holding the engine's own key, sent as `Authorization: Bearer`."""


def is_loopback(host: str) -> bool:
    """Whether `host` is only reachable from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def shown_url(url: str) -> str:
    """`url` as messages, logs and captures name it: without the user and password an
    `http://user:pass@host` URL carries (they are the engine's key)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"


@dataclass(frozen=True)
class GatewaySettings:
    """One gateway's settings.

    `engine` is the engine's base URL (its `/v1/...` paths are appended). `replica` names the
    serving instance on every captured call (default: the engine URL). `weight_version_source`
    is where the trainer publishes its version (docs/async.md): read at admission as
    `start_weight_version` and at completion as `end_weight_version`. `engine_labels_are_versions`
    says the engine's per-token version labels are trainer versions (integers); otherwise they
    are kept as `weight_version_label`. A host other than loopback requires `api_key`.
    """

    engine: str
    host: str = DEFAULT_HOST
    port: int = 0
    replica: str | None = None
    weight_version_source: str | None = None
    engine_labels_are_versions: bool = False
    api_key: str | None = field(default=None, repr=False)
    engine_api_key: str | None = field(default=None, repr=False)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    engine_timeout: float = DEFAULT_ENGINE_TIMEOUT
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE

    def __post_init__(self) -> None:
        if not self.engine.startswith(("http://", "https://")):
            raise InvalidInputError(
                f"engine {shown_url(self.engine)!r} is not an http(s) URL; give the engine's "
                "base URL, such as http://127.0.0.1:8000"
            )
        object.__setattr__(self, "engine", self.engine.rstrip("/"))
        if self.engine.endswith("/v1"):
            raise InvalidInputError(
                f"engine {self.engine_shown!r} ends in /v1, so calls would go to /v1/v1/...; "
                f"give the engine's base URL, {self.engine_shown.removesuffix('/v1')!r}"
            )
        if not is_loopback(self.host) and not self.api_key:
            raise InvalidInputError(
                f"host {self.host} is reachable from other machines, and whoever reaches a "
                "gateway can write training tokens under any rollout id; give an API key "
                f"(--api-key or {API_KEY_ENV}) or listen on 127.0.0.1"
            )
        if not 0 <= self.port <= 65535:
            raise InvalidInputError(f"port {self.port} is not a TCP port (0-65535; 0 picks one)")
        for name in ("max_body_bytes", "max_answer_bytes"):
            if getattr(self, name) <= 0:
                raise InvalidInputError(f"{name} must be a positive number of bytes")
        if self.engine_timeout <= 0:
            raise InvalidInputError("engine_timeout must be a positive number of seconds")
        if self.shutdown_grace <= 0:
            raise InvalidInputError("shutdown_grace must be a positive number of seconds")

    @property
    def engine_shown(self) -> str:
        """The engine URL as messages, logs and captures name it (`shown_url`)."""
        return shown_url(self.engine)

    @property
    def replica_name(self) -> str:
        """The `replica` every captured call records."""
        return self.replica or self.engine_shown
