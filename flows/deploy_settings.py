"""The inbox settings an operator sets at deploy time: `TOKCAP_*` environment variables.

The shipped `prefect.yaml` fills the inbox deployments' settings from them
(`{{ $TOKCAP_ROWS }}` ...), as it fills the inbox from `TOKCAP_INBOX`; an unset one keeps
the shipped default. `tokcap deploy`, `tokcap deployments --show` and `tokcap serve` check
them first and refuse a bad value, naming the variable and what it allows, and any
`TOKCAP_*` name tokcap does not read (`READ_VARIABLES`), naming the closest one, so a typo
never deploys another setting; a run deployed by plain `prefect deploy` refuses a bad value
when it starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from difflib import get_close_matches
from typing import Any

from pydantic import ValidationError

from capture_core.builder.trace_envelope import DELIVERIES
from capture_core.gateway.settings import API_KEY_ENV, ENGINE_API_KEY_ENV
from capture_core.run.concurrency import STORE_CONCURRENCY_ENV
from capture_core.run.crash_points import CRASH_ENV
from capture_core.run.retry_delays import RETRY_DELAYS_ENV
from capture_core.run.run_layout import ROW_FORMATS
from capture_core.run.task_groups import GROUP_BY
from tokcap.flows.file_settings import LEASE_ALLOWED, LEASE_WHY, FileSettings

SETTING_VARIABLES = {
    "TOKCAP_ROWS": "rows",
    "TOKCAP_DELIVERY": "delivery",
    "TOKCAP_GROUP_BY": "group_by",
    "TOKCAP_RETIRE_AFTER_CONSUMER": "retire_after_consumer",
    "TOKCAP_BATCH_SIZE": "batch_size",
    "TOKCAP_MAX_GROUP_SIZE": "max_group_size",
    "TOKCAP_MAX_ATTEMPTS": "max_attempts",
    "TOKCAP_CLAIM_LEASE_SECONDS": "claim_lease_seconds",
}  # each variable and the `FileSettings` field it sets
ALLOWED = {
    "rows": " or ".join(ROW_FORMATS),
    "delivery": " or ".join(DELIVERIES),
    "group_by": " or ".join(GROUP_BY),
    "retire_after_consumer": (
        "a consumer name (letters, digits, '.', '_', '-'), with rows parquet or arrow"
    ),
    "batch_size": "a whole number above 0",
    "max_group_size": "a whole number above 0",
    "max_attempts": "a whole number above 0",
    "claim_lease_seconds": f"{LEASE_ALLOWED} ({LEASE_WHY})",
}
LOCATIONS = ("TOKCAP_INBOX", "TOKCAP_STORE", "TOKCAP_DEST")
READ_VARIABLES = (
    *SETTING_VARIABLES,
    *LOCATIONS,
    STORE_CONCURRENCY_ENV,
    RETRY_DELAYS_ENV,
    API_KEY_ENV,
    ENGINE_API_KEY_ENV,
    "TOKCAP_POOL",
    CRASH_ENV,
)  # every `TOKCAP_*` variable tokcap reads
TEST_HOOKS = (CRASH_ENV,)
"""Read by tokcap for its crash tests only (it kills the process): never named to users."""
SHOWN_VARIABLES = tuple(name for name in READ_VARIABLES if name not in TEST_HOOKS)
"""The variables an error names as those tokcap reads."""
VARIABLE_USES = {"TOKCAP_POOL": "the work pool the shipped worker image serves"}
"""What a variable shown without a page of its own sets, said beside its name."""
TEST_SUITE_VARIABLES = (
    "TOKCAP_TEST_WORKER",
    "TOKCAP_TEST_ENGINE_URL",
    "TOKCAP_ENGINE_CACHE",
    "TOKCAP_RELIABILITY_FIGURES",
    "TOKCAP_WHEEL_TEST_FULL_INSTALL",
    "TOKCAP_KILL_BETWEEN",
)  # set by tokcap's own test suite and benches around the commands; tokcap ignores them
PLACEHOLDER = re.compile(r'"\{\{\s*\$([A-Z_]+)\s*\}\}"')


class SettingVariableError(ValueError):
    """A `TOKCAP_*` setting variable holds a value its setting does not allow."""


def deployed_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """Each setting a variable of `env` sets, checked, by field; the default where unset.
    A `TOKCAP_*` name tokcap does not read (TOKCAP_ROW) is refused, never ignored."""
    _check_names(env)
    given = {
        SETTING_VARIABLES[name]: text for name, text in env.items() if name in SETTING_VARIABLES
    }
    for variable, field in SETTING_VARIABLES.items():
        if env.get(variable, "") != "":
            _check(variable, field, env[variable])
    settings = FileSettings.model_validate({"inbox": "-", "store": "-", "dest": "-", **given})
    if settings.retire_after_consumer is not None and settings.rows == "none":
        raise SettingVariableError(
            "TOKCAP_RETIRE_AFTER_CONSUMER needs trainer rows for the consumer to acknowledge: "
            "also set TOKCAP_ROWS=parquet (or arrow)"
        )
    return {field: getattr(settings, field) for field in SETTING_VARIABLES.values()}


def _check_names(env: Mapping[str, str]) -> None:
    """Refuse a `TOKCAP_*` name tokcap does not read, naming the closest one it does: a
    misspelled setting would otherwise deploy its default in silence."""
    for name in sorted(env):
        if name.startswith("TOKCAP_") and name not in (*READ_VARIABLES, *TEST_SUITE_VARIABLES):
            raise SettingVariableError(
                f"{name} is no tokcap variable: did you mean {closest_variable(name)}? "
                f"tokcap reads {shown_variables()}; rename or unset {name}"
            )


def shown_variables() -> str:
    """`SHOWN_VARIABLES` in one line, each with what it sets where `VARIABLE_USES` says."""
    return ", ".join(
        f"{name} ({VARIABLE_USES[name]})" if name in VARIABLE_USES else name
        for name in SHOWN_VARIABLES
    )


def closest_variable(name: str) -> str:
    """The variable tokcap reads that `name` most likely meant: among those sharing a word
    with it (TOKCAP_LEASE, TOKCAP_CLAIM_LEASE_SECONDS) if any, the closest spelling."""
    words = set(name.split("_")) - {"TOKCAP"}
    sharing = [known for known in SHOWN_VARIABLES if words & set(known.split("_"))]
    return get_close_matches(name, sharing or SHOWN_VARIABLES, n=1, cutoff=0)[0]


def _check(variable: str, field: str, text: str) -> None:
    """Refuse `text` for `field`, naming the variable and what it allows."""
    try:
        FileSettings.model_validate({"inbox": "-", "store": "-", "dest": "-", field: text})
    except ValidationError:
        raise SettingVariableError(
            f"{variable}={text!r} is not a {field} setting: use {ALLOWED[field]}, "
            f"or leave {variable} unset for the shipped default"
        ) from None


def placeholder_values(env: Mapping[str, str]) -> dict[str, Any]:
    """The value each setting variable's placeholder takes, typed (a number, None), checked."""
    settings = deployed_settings(env)
    return {variable: settings[field] for variable, field in SETTING_VARIABLES.items()}


def deploy_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with every setting variable spelled out as `prefect deploy` will fill it, so the
    deployments record each setting, defaults included; a None setting is left empty."""
    values = placeholder_values(env)
    text = {k: "" if v is None else str(v) for k, v in values.items()}
    return {**env, **text}


def shown_file(text: str, env: Mapping[str, str]) -> str:
    """The `prefect.yaml` text with each setting variable's placeholder replaced by the value
    this environment deploys (locations are left as placeholders)."""
    values = placeholder_values(env)

    def shown(match: re.Match[str]) -> str:
        name = match.group(1)
        return json.dumps(values[name]) if name in values else match.group(0)

    return PLACEHOLDER.sub(shown, text)
