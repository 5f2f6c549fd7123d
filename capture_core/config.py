"""The `token_id_capture` settings, and loading a configured sink or source class.

`TokenIdCaptureSettings` is the block (`TOKEN_ID_CAPTURE_BLOCK`); `TokenIdCaptureConfig` a
whole configuration as capture reads it, as NeMo Gym names and shapes them.

Unknown keys in the block are refused, so a misspelt setting cannot silently disable masking.
An enabled, rebuilding configuration needs a location or a sink; a local location is absolute.
`dir` falls back to the top-level `model_call_capture_dir`.
Locations are local paths or fsspec URLs (`s3://bucket/prefix`).
It imports `storage` only to read location strings, which loads fsspec (never s3fs), and
the store only when `build_configured_sink` opens one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from capture_core.protocols import TokenSink, load_capture_class
from capture_core.records import describe_validation_error
from capture_core.storage import url_scheme

TOKEN_ID_CAPTURE_BLOCK = "token_id_capture"
FALLBACK_DIR_KEY = "model_call_capture_dir"


def _location_text(value: Any) -> Any:
    """A location as text: a `Path` (or any path-like) becomes its string."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


class TokenIdCaptureSettings(BaseModel):
    """The `token_id_capture` block; unknown keys are refused (a typo must not disable masks)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    all_agents: bool = False
    dir: str | None = None
    sink: str | None = None
    sink_kwargs: dict[str, Any] = Field(default_factory=dict)
    rebuild_response: bool = True
    max_mask_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    mask_fraction_min_samples: int = Field(default=50, ge=1)
    delivery: Literal["main_chain", "all_traces"] = "main_chain"
    """`main_chain` rebuilds `response.output`; `all_traces` adds `training_traces`."""

    _text_dir = field_validator("dir", mode="before")(_location_text)


class TokenIdCaptureConfig(BaseModel):
    """A whole configuration as capture reads it: the block and the top-level fallback `dir`.

    Other top-level keys belong to the rest of the configuration and are ignored, as in
    NeMo Gym. An enabled, rebuilding configuration needs a location or a sink; a local
    location is absolute.
    """

    model_config = ConfigDict(extra="ignore")

    token_id_capture: TokenIdCaptureSettings = Field(default_factory=TokenIdCaptureSettings)
    model_call_capture_dir: str | None = None

    _text_dir = field_validator("model_call_capture_dir", mode="before")(_location_text)

    @model_validator(mode="after")
    def _check_location(self) -> TokenIdCaptureConfig:
        block, location = self.token_id_capture, self._location_text()
        if block.enabled and block.rebuild_response and not (location or block.sink):
            raise ValueError(
                "token_id_capture is enabled with rebuild_response but has neither `dir` nor "
                "`sink`; set `dir` (an absolute path or a URL) or `sink` (module.path:ClassName)"
            )
        if location and url_scheme(location) is None and not os.path.isabs(location):
            raise ValueError(
                f"token_id_capture.dir {location!r} is relative; use an absolute path or a URL"
            )
        return self

    @classmethod
    def from_global(cls, global_config: Mapping[str, Any] | None) -> TokenIdCaptureConfig:
        """Read a whole configuration; a missing block means disabled. Errors name the block."""
        try:
            return cls.model_validate(dict(global_config or {}))
        except ValidationError as exc:
            raise ValueError(
                f"invalid {TOKEN_ID_CAPTURE_BLOCK} configuration: {describe_validation_error(exc)}"
            ) from exc

    @property
    def enabled(self) -> bool:
        return self.token_id_capture.enabled

    @property
    def delivery(self) -> str:
        """The configured delivery, for `finalize_rollout_token_capture(..., delivery=)`."""
        return self.token_id_capture.delivery

    def _location_text(self) -> str | None:
        return self.token_id_capture.dir or self.model_call_capture_dir or None

    def resolved_dir(self) -> str | Path | None:
        """The configured location, enabled or not: a `Path` locally, else the URL."""
        location = self._location_text()
        if not location:
            return None
        return location if url_scheme(location) is not None else Path(location)

    def location(self) -> str | Path | None:
        """The enabled store location: a `Path` for local disk, the URL string otherwise."""
        return self.resolved_dir() if self.enabled else None

    def build_sink(self) -> Any:
        """The configured `sink` class; `None` when capture is off or the store at `dir` is used."""
        block = self.token_id_capture
        if not block.enabled or not block.sink:
            return None
        return load_capture_class(block.sink, block.sink_kwargs, TokenSink)


def token_id_capture_config(global_config_dict: Mapping[str, Any] | None) -> TokenIdCaptureConfig:
    """Read the capture settings out of a whole configuration (NeMo Gym's name)."""
    return TokenIdCaptureConfig.from_global(global_config_dict)


def token_id_capture_enabled_for_agent(
    global_config_dict: Mapping[str, Any] | None, agent_name: str | None
) -> bool:
    """Whether one configured agent's calls are captured.

    True when capture is enabled and either `all_agents` is set or the agent's server entry
    has a `responses_api_agents` config with `token_id_capture: true`.
    """
    settings = token_id_capture_config(global_config_dict).token_id_capture
    if not settings.enabled:
        return False
    if settings.all_agents:
        return True
    entry = (global_config_dict or {}).get(agent_name) if agent_name else None
    agents = entry.get("responses_api_agents") if isinstance(entry, Mapping) else None
    if not isinstance(agents, Mapping):
        return False
    return any(
        bool(agent.get(TOKEN_ID_CAPTURE_BLOCK, False))
        for agent in agents.values()
        if isinstance(agent, Mapping)
    )


def build_configured_sink(config: TokenIdCaptureConfig) -> Any:
    """The configured store: the `sink` class with `sink_kwargs`, or a store at `dir`."""
    from capture_core.store import open_capture_store

    block, location = config.token_id_capture, config.resolved_dir()
    if block.sink:
        return load_capture_class(block.sink, block.sink_kwargs, TokenSink)
    if location is not None:
        return open_capture_store(location)
    raise ValueError("token_id_capture has no `sink` and no `dir`; nothing to build")


SECRET_OPTION_WORDS = ("key", "secret", "token", "password", "credential")
PUBLIC_OPTION_KEYS = {"endpoint_url", "region_name", "anon", "use_ssl", "requester_pays"}


def public_storage_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Refuse credentials in storage options that would be stored as flow parameters.

    Flow parameters are kept by the Prefect API and shown in its UI, so secrets travel only
    through the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN).
    """
    found = sorted(_secret_paths(dict(options or {})))
    if found:
        raise ValueError(
            f"storage options {found} look like credentials; pass them through the environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or an AWS profile, "
            "never as flow parameters, which the Prefect UI shows"
        )
    return dict(options or {})


def _secret_paths(options: Mapping[str, Any], prefix: str = "") -> list[str]:
    found = []
    for key, value in options.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found.extend(_secret_paths(value, path + "."))
        elif key not in PUBLIC_OPTION_KEYS and any(w in key.lower() for w in SECRET_OPTION_WORDS):
            found.append(path)
    return found
