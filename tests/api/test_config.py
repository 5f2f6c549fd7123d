"""The token_id_capture settings block and configured capture classes (docs/nemo-gym.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from capture_core.config import (
    TOKEN_ID_CAPTURE_BLOCK,
    TokenIdCaptureConfig,
    TokenIdCaptureSettings,
    build_configured_sink,
    token_id_capture_config,
    token_id_capture_enabled_for_agent,
)
from capture_core.consumer import token_id_capture_dirs_from_config
from capture_core.protocols import TokenSink, TokenSource, load_capture_class
from capture_core.store import TokenCaptureStore


def test_disabled_or_missing_block_means_no_location(tmp_path) -> None:
    assert token_id_capture_dirs_from_config({}) == []
    assert token_id_capture_dirs_from_config(None) == []
    off = {"token_id_capture": {"enabled": False, "dir": str(tmp_path)}}
    assert token_id_capture_dirs_from_config(off) == []


def test_enabled_location_is_a_path_or_a_url(tmp_path) -> None:
    local = {"token_id_capture": {"enabled": True, "dir": str(tmp_path)}}
    assert token_id_capture_dirs_from_config(local) == [Path(tmp_path)]
    remote = {"token_id_capture": {"enabled": True, "dir": "s3://bucket/captures"}}
    assert token_id_capture_dirs_from_config(remote) == ["s3://bucket/captures"]


def test_dir_falls_back_to_model_call_capture_dir(tmp_path) -> None:
    config = {"model_call_capture_dir": tmp_path, "token_id_capture": {"enabled": True}}
    assert token_id_capture_dirs_from_config(config) == [Path(tmp_path)]


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(
        ValueError, match="invalid token_id_capture configuration: token_id_capture.max_mask_frac"
    ):
        TokenIdCaptureConfig.from_global({"token_id_capture": {"max_mask_frac": 0.1}})


def test_enabled_rebuilding_config_needs_a_location_or_sink() -> None:
    with pytest.raises(ValueError, match="neither `dir` nor `sink`"):
        TokenIdCaptureConfig.from_global({"token_id_capture": {"enabled": True}})
    ok = {"enabled": True, "rebuild_response": False}
    assert TokenIdCaptureConfig.from_global({"token_id_capture": ok}).location() is None


def test_local_location_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="relative; use an absolute path or a URL"):
        TokenIdCaptureConfig.from_global({"token_id_capture": {"enabled": True, "dir": "caps"}})


def test_mask_fraction_bounds_and_defaults() -> None:
    config = TokenIdCaptureConfig.from_global({"token_id_capture": {"max_mask_fraction": 0.2}})
    block = config.token_id_capture
    assert block.mask_fraction_min_samples == 50 and block.max_mask_fraction == 0.2
    with pytest.raises(ValueError, match="max_mask_fraction"):
        TokenIdCaptureConfig.from_global({"token_id_capture": {"max_mask_fraction": 1.5}})


def test_configured_sink_class_is_built_with_its_kwargs(tmp_path) -> None:
    block = {
        "enabled": True,
        "sink": "capture_core.store:TokenCaptureStore",
        "sink_kwargs": {"root": str(tmp_path)},
    }
    sink = build_configured_sink(TokenIdCaptureConfig.from_global({"token_id_capture": block}))
    assert isinstance(sink, TokenCaptureStore) and isinstance(sink, TokenSink)
    assert sink.root == str(tmp_path)


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        ("no_colon", {}, "must look like 'module.path:ClassName'"),
        ("not_a_module_xyz:Thing", {}, "cannot import module 'not_a_module_xyz'"),
        ("capture_core.store:Missing", {}, "has no class 'Missing'"),
        ("capture_core.store:TokenCaptureStore", {"bogus": 1}, "cannot construct"),
        ("collections:OrderedDict", {}, "does not satisfy TokenSource"),
    ],
)
def test_capture_class_errors_name_the_class_and_the_fix(
    spec: str, kwargs: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_capture_class(spec, kwargs, TokenSource)


def test_nemo_gym_config_names_read_a_whole_configuration(tmp_path) -> None:
    whole = {
        "policy_model_name": "p",
        "model_call_capture_dir": str(tmp_path),
        "token_id_capture": {"enabled": True, "sink": "capture_core.store:TokenCaptureStore"},
    }
    config = TokenIdCaptureConfig.model_validate(whole)
    assert config == token_id_capture_config(whole) == TokenIdCaptureConfig.from_global(whole)
    assert config.enabled and config.token_id_capture.sink == whole["token_id_capture"]["sink"]
    assert config.resolved_dir() == Path(tmp_path)
    with pytest.raises(ValueError, match="cannot construct"):
        config.build_sink()
    assert TokenIdCaptureConfig.model_validate({"token_id_capture": {}}).build_sink() is None
    assert isinstance(config.token_id_capture, TokenIdCaptureSettings)
    assert config.model_call_capture_dir == str(tmp_path)


def test_nemo_gym_names_the_block_and_its_whole_configuration(tmp_path) -> None:
    """NeMo Gym's meaning: the block's key, the block model, the whole-configuration model."""
    assert TOKEN_ID_CAPTURE_BLOCK == "token_id_capture"
    block = TokenIdCaptureSettings(enabled=True, dir=tmp_path)
    assert block.dir == str(tmp_path) and block.mask_fraction_min_samples == 50
    with pytest.raises(ValueError, match="token_id_capture"):
        TokenIdCaptureSettings.model_validate({TOKEN_ID_CAPTURE_BLOCK: {"enabled": True}})
    whole = TokenIdCaptureConfig(token_id_capture=block)
    assert whole.enabled and whole.resolved_dir() == Path(tmp_path)
    other_parts = {"policy_model_name": "p", "agents": {"simple": {}}}
    assert TokenIdCaptureConfig.model_validate(other_parts).enabled is False
    assert token_id_capture_dirs_from_config(other_parts) == []


def test_capture_per_agent_follows_all_agents_or_the_agent_flag() -> None:
    agent = {"responses_api_agents": {"simple": {"token_id_capture": True}}}
    on = {"token_id_capture": {"enabled": True, "rebuild_response": False}, "a": agent}
    assert token_id_capture_enabled_for_agent(on, "a")
    assert not token_id_capture_enabled_for_agent(on, "b")
    everyone = {**on, "token_id_capture": {**on["token_id_capture"], "all_agents": True}}
    assert token_id_capture_enabled_for_agent(everyone, "b")
    assert not token_id_capture_enabled_for_agent({"a": agent}, "a")


def test_a_configured_nemo_gym_dir_builds_its_file_store(tmp_path) -> None:
    from capture_core.store.nemo_gym_store import NemoGymFileStore
    from tests.support.gym_file_writer import GymWriter, entry_payload

    GymWriter(str(tmp_path)).put(entry_payload("1-1", 0))
    config = TokenIdCaptureConfig.from_global({"token_id_capture": {"dir": str(tmp_path)}})
    assert isinstance(build_configured_sink(config), NemoGymFileStore)
