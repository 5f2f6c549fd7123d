"""The `token_id_capture` settings block, and loading a configured sink or source class.

Unknown keys are refused, so a misspelt setting cannot silently disable masking.
An enabled, rebuilding configuration needs a location or a sink; a local location is absolute.
`dir` falls back to the top-level `model_call_capture_dir`.
Locations are local paths or fsspec URLs (`s3://bucket/prefix`).
This module does not import Prefect or any storage backend.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from capture_core.records import describe_validation_error
from capture_core.storage import url_scheme

CONFIG_KEY = "token_id_capture"
FALLBACK_DIR_KEY = "model_call_capture_dir"


class TokenIdCaptureConfig(BaseModel):
    """Settings of token-id capture and finalization."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    all_agents: bool = False
    dir: str | None = None
    sink: str | None = None
    sink_kwargs: dict[str, Any] = Field(default_factory=dict)
    rebuild_response: bool = True
    max_mask_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    mask_fraction_min_samples: int = Field(default=50, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _accept_a_whole_configuration(cls, data: Any) -> Any:
        """NeMo Gym validates the whole configuration: take its block and the fallback dir."""
        if isinstance(data, Mapping) and (CONFIG_KEY in data or FALLBACK_DIR_KEY in data):
            return _block_of(data)
        return data

    @model_validator(mode="after")
    def _check_location(self) -> TokenIdCaptureConfig:
        if self.enabled and self.rebuild_response and not (self.dir or self.sink):
            raise ValueError(
                "token_id_capture is enabled with rebuild_response but has neither `dir` nor "
                "`sink`; set `dir` (an absolute path or a URL) or `sink` (module.path:ClassName)"
            )
        if self.dir and url_scheme(self.dir) is None and not os.path.isabs(self.dir):
            raise ValueError(
                f"token_id_capture.dir {self.dir!r} is relative; use an absolute path or a URL"
            )
        return self

    @classmethod
    def from_global(cls, global_config: Mapping[str, Any] | None) -> TokenIdCaptureConfig:
        """Read the block from a whole configuration; a missing block means disabled."""
        try:
            return cls.model_validate(_block_of(global_config or {}))
        except ValidationError as exc:
            raise ValueError(
                f"invalid {CONFIG_KEY} configuration: {describe_validation_error(exc)}"
            ) from exc

    @property
    def token_id_capture(self) -> TokenIdCaptureConfig:
        """The block, where NeMo Gym's code reads `config.token_id_capture.<key>`."""
        return self

    def resolved_dir(self) -> str | Path | None:
        """The configured location, enabled or not: a `Path` locally, else the URL."""
        if not self.dir:
            return None
        return self.dir if url_scheme(self.dir) is not None else Path(self.dir)

    def location(self) -> str | Path | None:
        """The enabled store location: a `Path` for local disk, the URL string otherwise."""
        return self.resolved_dir() if self.enabled else None

    def build_sink(self) -> Any:
        """The configured `sink` class; `None` when capture is off or the store at `dir` is used."""
        from capture_core.protocols import TokenSink

        if not self.enabled or not self.sink:
            return None
        return load_capture_class(self.sink, self.sink_kwargs, TokenSink)


TokenIdCaptureSettings = TokenIdCaptureConfig


def _block_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `token_id_capture` block of a whole configuration, with `dir` resolved."""
    block = dict(config.get(CONFIG_KEY) or {})
    if not block.get("dir") and config.get(FALLBACK_DIR_KEY):
        block["dir"] = os.fspath(config[FALLBACK_DIR_KEY])
    if block.get("dir") is not None:
        block["dir"] = os.fspath(block["dir"])
    return block


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
    settings = token_id_capture_config(global_config_dict)
    if not settings.enabled:
        return False
    if settings.all_agents:
        return True
    entry = (global_config_dict or {}).get(agent_name) if agent_name else None
    agents = entry.get("responses_api_agents") if isinstance(entry, Mapping) else None
    if not isinstance(agents, Mapping):
        return False
    return any(
        bool(agent.get(CONFIG_KEY, False))
        for agent in agents.values()
        if isinstance(agent, Mapping)
    )


def load_capture_class(spec: str, kwargs: Mapping[str, Any] | None, protocol: type) -> Any:
    """Build `module.path:ClassName(**kwargs)` and check that it satisfies `protocol`.

    Each failure (bad spec, import, missing class, construction, wrong protocol) raises a
    `ValueError` that names the class and what to fix.
    """
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f"capture class {spec!r} must look like 'module.path:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"cannot import module {module_name!r} for capture class {spec!r}: {exc}; "
            "install the package that provides it"
        ) from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} has no class {class_name!r} (from {spec!r})")
    try:
        instance = cls(**dict(kwargs or {}))
    except Exception as exc:
        raise ValueError(
            f"cannot construct {spec} with keyword arguments {sorted(kwargs or {})}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(instance, protocol):
        raise ValueError(
            f"{spec} does not satisfy {protocol.__name__}: it needs the methods "
            f"{sorted(_protocol_methods(protocol))}"
        )
    return instance


def _protocol_methods(protocol: type) -> set[str]:
    return {
        name
        for name in vars(protocol)
        if not name.startswith("_") and callable(vars(protocol)[name])
    }


def build_configured_sink(config: TokenIdCaptureConfig) -> Any:
    """The configured store: the `sink` class with `sink_kwargs`, or a store at `dir`."""
    from capture_core.protocols import TokenSink
    from capture_core.store import TokenCaptureStore

    if config.sink:
        return load_capture_class(config.sink, config.sink_kwargs, TokenSink)
    if config.dir:
        return TokenCaptureStore(config.dir)
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
