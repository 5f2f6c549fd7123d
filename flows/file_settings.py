"""`FileSettings`: the inbox's settings, one object for a pass and for the run of each file.

The shipped `prefect.yaml` fills several of them from `TOKCAP_*` environment variables
(`tokcap.flows.deploy_settings`), and `prefect deploy` fills a `{{ $NAME }}` placeholder as
text: an unset variable as "" and a number as its digits. So an empty text means the
field's default, the numeric fields' schema also admits text (Prefect checks a deployment's
parameters against it), and every value is checked when a run starts, naming the setting.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from capture_core.builder.trace_envelope import DELIVERIES, MAIN_CHAIN
from capture_core.config import public_storage_options
from capture_core.rows.row_cursor import validate_consumer_name
from capture_core.run.capture_source import check_separate_locations
from capture_core.run.inbox import MIN_CLAIM_LEASE_SECONDS, RENEWALS_PER_LEASE
from capture_core.run.run_layout import ROW_FORMATS
from capture_core.run.task_groups import DEFAULT_MAX_GROUP_SIZE, GROUP_BY, group_by_setting

DEPLOYED_FIELDS = (
    "rows",
    "delivery",
    "group_by",
    "retire_after_consumer",
    "batch_size",
    "max_group_size",
    "max_attempts",
    "claim_lease_seconds",
)  # the settings prefect.yaml fills from the environment; "" there means the default

LEASE_ALLOWED = f"a finite number of seconds, at least {MIN_CLAIM_LEASE_SECONDS:g}"
LEASE_WHY = (
    f"a claim is renewed {RENEWALS_PER_LEASE} times per lease, so a shorter lease lapses while "
    "its pass still works and another pass could finalize the file too, and one that never "
    "lapses keeps a crashed pass's file from every retrigger"
)


def _or_text(kind: str) -> WithJsonSchema:
    """A number's schema that also admits its text, as `prefect deploy` fills it."""
    return WithJsonSchema({"anyOf": [{"type": kind}, {"type": "string"}]})


class FileSettings(BaseModel):
    """The inbox's settings: one object for a pass and for the run of each of its files.

    A pass hands its settings whole to each file's run (`fan_out`), so both finalize a file
    the same way and agree on its claim's lease and attempts.
    """

    inbox: str = Field(description="Folder URL of the rollout files to finalize.")
    store: str = Field(description="Capture store: a path or URL, or a module.path:ClassName.")
    dest: str = Field(description="Destination of the runs' records, receipts and ledgers.")
    batch_size: Annotated[int, _or_text("integer")] = Field(
        500, gt=0, description="Rollouts per batch of each file's run."
    )
    max_mask_fraction: float | None = Field(
        None, description="A file's run stops handing off above this masked fraction."
    )
    max_attempts: Annotated[int, _or_text("integer")] = Field(
        3, gt=0, description="Failed attempts after which a file is given up."
    )
    storage_options: dict[str, Any] | None = Field(
        None, description="Public fsspec options of inbox, store and destination."
    )
    source_kwargs: dict[str, Any] | None = Field(
        None, description="Arguments of a module.path:ClassName store."
    )
    claim_lease_seconds: Annotated[float, _or_text("number")] = Field(
        300.0,
        description="How long a file's claim outlives the pass that stopped renewing it "
        f"(finite, at least {MIN_CLAIM_LEASE_SECONDS:g} s).",
    )
    delivery: str = Field(MAIN_CHAIN, description="main_chain, or all_traces for envelopes.")
    rows: str = Field("none", description="parquet or arrow: trainer rows beside each part.")
    retire_after_consumer: str | None = Field(
        None, description="The row consumer whose acknowledgement retirement waits for."
    )
    group_by: str | None = Field(None, description="task: no batch splits a task's rollouts.")
    max_group_size: Annotated[int, _or_text("integer")] = Field(
        DEFAULT_MAX_GROUP_SIZE, gt=0, description="Most rollouts of one task with group_by."
    )

    @model_validator(mode="before")
    @classmethod
    def _unset_means_default(cls, data: Any) -> Any:
        """A deployed setting filled from an unset variable ("") keeps its default."""
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if not (k in DEPLOYED_FIELDS and v == "")}

    @field_validator("rows", "delivery", "group_by")
    @classmethod
    def _one_of_its_choices(cls, value: str | None, info: ValidationInfo) -> str | None:
        what, allowed = {
            "rows": ("rows format", ROW_FORMATS),
            "delivery": ("delivery", DELIVERIES),
            "group_by": ("group_by", GROUP_BY),
        }[str(info.field_name)]
        if value is not None and value not in allowed:
            raise ValueError(f"unknown {what} {value!r}; use one of {', '.join(allowed)}")
        return group_by_setting(value) if info.field_name == "group_by" else value

    @field_validator("claim_lease_seconds")
    @classmethod
    def _lease(cls, seconds: float) -> float:
        """A lease that never lapses holds a dead pass's file forever; one shorter than the
        floor lapses while its pass still works, so another pass takes the file too."""
        if not math.isfinite(seconds) or seconds < MIN_CLAIM_LEASE_SECONDS:
            raise ValueError(f"claim_lease_seconds {seconds!r} is not {LEASE_ALLOWED}: {LEASE_WHY}")
        return seconds

    @field_validator("retire_after_consumer")
    @classmethod
    def _consumer_name(cls, name: str | None) -> str | None:
        return None if name is None else validate_consumer_name(name)

    def checked(self) -> FileSettings:
        """These settings with public storage options only, once inbox, store and destination
        are found separate (raises otherwise)."""
        options = public_storage_options(self.storage_options)
        check_separate_locations({"inbox": self.inbox, "store": self.store, "dest": self.dest})
        return self.model_copy(update={"storage_options": options})
