"""Captured model calls as versioned records.

A `TokenEntry` holds one model call's exact prompt ids, generated ids and log probs.
Its field names and meaning match NeMo Gym's `TokenEntry`, so either side reads the other.
Readers refuse records whose schema version is newer than theirs.
Unknown extra fields are kept and round-trip unchanged.
The package's modules: `token_values` (what a token id and a storable log prob are),
`served` (token arrays in served payloads). This module holds the record itself and the
public names NeMo Gym's `token_id_capture` records module has.
It does not import the store, the builder or Prefect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictInt,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from capture_core.errors import InvalidRecordError, WrongTypeError
from capture_core.records.provenance import (
    LABEL_FIELD,
    PROVENANCE_FIELDS,
    SERVED_METADATA,
    canonical_provenance,
    check_provenance,
    served_label,
)
from capture_core.records.served import (
    carries_tokens,
    extract_token_fields,
    response_to_output_items,
    strip_token_fields,
    token_carriers,
)
from capture_core.records.token_values import (
    MAX_TOKEN_ID,
    TOKEN_FIELDS,
    TOKEN_ID_FIELDS,
    all_finite,
    are_token_ids,
    first_non_id,
)

_SET_ONLY = ("response_id", *PROVENANCE_FIELDS)
"""Fields NeMo Gym's seed `TokenEntry` does not have: a dump holds them only when they were
set (given, read or assigned), even to `None` (NeMo Gym 0.7.0 writes `"response_id": null`),
never as an unset default, which that revision would keep as an extra field."""

# Schema changelog (older versions are read; newer ones are refused):
#   0: NeMo Gym's pre-release records, same fields and meaning.
#   1: first version (prompt, generation, log probs, optional routed experts, content items).
TOKEN_ENTRY_RECORD_SCHEMA_VERSION = 1


class TokenEntry(BaseModel):
    """One captured model call, schema version 1.

    `output_items` is the call's assistant content with token arrays stripped.
    `token_item_index` names the output item that originally carried the arrays.
    `created_at` is diagnostic and breaks ties when choosing the main chain.
    `response_id` is the id of the response the model server served for this call (as in
    NeMo Gym 0.7.0 records); terminal attribution joins the scored response to it. It is
    optional evidence: a value that is not a non-empty string reads as `None`, so it never
    fails the record.
    The weight-version provenance fields (`start_weight_version`, `end_weight_version`,
    `generation_weight_versions`, `weight_version_label`, `replica`: `records.provenance`)
    are tokcap's, after NeMo Gym's, and appear in a dump only when set. Other systems'
    names for them are accepted on input and mapped to these (`canonical_provenance`).
    Fields are in NeMo Gym's order. `model_dump()` returns every field of NeMo Gym's seed
    `TokenEntry`, defaults included, as NeMo Gym's does; `response_id` (which that revision
    lacks, and would keep as an extra) and the provenance fields only when set, so a seed
    entry dumped, read by tokcap and dumped again is the entry it was, both ways (`_SET_ONLY`).
    What a store writes is `wire_dump()`: `schema_version`,
    every field that was set (given, read, or assigned) and the extras, never an optional
    field left at its default unset, so a NeMo Gym entry read and written back is the entry
    it was.
    """

    model_config = ConfigDict(extra="allow")

    schema_version: int = TOKEN_ENTRY_RECORD_SCHEMA_VERSION
    rollout_id: str
    model_call_id: str
    model: str = ""
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: Any = None
    output_items: list[dict[str, Any]] = Field(default_factory=list)
    token_item_index: int | None = None
    response_id: str | None = None
    created_at: float = 0.0
    start_weight_version: StrictInt | None = None
    end_weight_version: StrictInt | None = None
    generation_weight_versions: list[StrictInt] | None = None
    weight_version_label: str | None = None
    replica: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _newer_schema_refused_aliases_mapped(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            check_schema_version(data.get("schema_version"))
            return canonical_provenance(data)
        return data

    @field_validator("prompt_token_ids", "generation_token_ids")
    @classmethod
    def _vocabulary_ids(cls, ids: list[int]) -> list[int]:
        if not are_token_ids(ids):
            low, high = min(ids), max(ids)
            what = f"the negative id {low}" if low < 0 else f"{high}, beyond the largest id"
            raise InvalidRecordError(
                f"holds {what}; token ids index the vocabulary, so capture the ids the model "
                f"server returned (0 to {MAX_TOKEN_ID})"
            )
        return ids

    @field_validator("response_id", mode="before")
    @classmethod
    def _served_id_or_none(cls, value: Any) -> str | None:
        return value if isinstance(value, str) and value else None

    @model_validator(mode="after")
    def _check_consistency(self) -> TokenEntry:
        check_entry_consistency(self)
        return self

    @model_serializer(mode="wrap")
    def _newer_fields_only_when_set(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = dump(self)
        for name in _SET_ONLY:
            if data.get(name, 0) is None and name not in self.model_fields_set:
                del data[name]
        return data

    def wire_dump(self) -> dict[str, Any]:
        """The JSON fields a store writes: unset optional fields are left out, nothing else."""
        data = self.model_dump(mode="json")
        for name in _OPTIONAL_FIELDS.difference(self.model_fields_set):
            data.pop(name, None)
        return data


_OPTIONAL_FIELDS = frozenset(
    name
    for name, info in TokenEntry.model_fields.items()
    if not info.is_required() and name != "schema_version"
)


def check_schema_version(version: Any) -> None:
    """Refuse records newer than this reader: new fields may change what the ids mean."""
    if isinstance(version, int) and version > TOKEN_ENTRY_RECORD_SCHEMA_VERSION:
        raise InvalidRecordError(
            f"token record schema_version {version} is newer than this reader supports "
            f"({TOKEN_ENTRY_RECORD_SCHEMA_VERSION}); upgrade tokcap before reading it "
            "(new fields may change what the token ids mean)"
        )


def check_entry_consistency(entry: TokenEntry) -> None:
    """The cross-field rules: schema version, one finite float32 log prob per generated id
    (`all_finite`), a valid carrier index. The per-id rules are `check_token_ids`."""
    check_schema_version(entry.schema_version)
    if entry.schema_version < 0:
        raise InvalidRecordError(
            f"token record schema_version {entry.schema_version} is invalid; versions start at 0"
        )
    for field in ("generation_token_ids", "generation_log_probs"):
        value = getattr(entry, field)
        if type(value) is not list:  # reassigned after validation
            raise InvalidRecordError(
                f"call {entry.model_call_id!r}: {field} is a {type(value).__name__}, not a "
                "list; store the generated ids and one finite float log prob per id as lists"
            )
    n_ids, n_lps = len(entry.generation_token_ids), len(entry.generation_log_probs)
    if n_ids != n_lps:
        raise InvalidRecordError(
            f"call {entry.model_call_id!r}: generation_token_ids has {n_ids} ids but "
            f"generation_log_probs has {n_lps} values; capture one log prob per generated token"
        )
    try:
        finite = all_finite(entry.generation_log_probs)
    except TypeError:  # a value reassigned after validation that is no number
        finite = False
    if not finite:
        raise InvalidRecordError(
            f"call {entry.model_call_id!r}: generation_log_probs holds a NaN or infinite value, "
            "one beyond float32's range (magnitude above 3.4e38; trainer rows store float32) "
            "or one that is no number; store finite float log probs float32 holds (clip -inf "
            "to a large negative number such as -1e4)"
        )
    check_provenance(entry)
    index = entry.token_item_index
    if index is not None and not 0 <= index < len(entry.output_items):
        raise InvalidRecordError(
            f"call {entry.model_call_id!r}: token_item_index {index} does not index "
            f"output_items (length {len(entry.output_items)}); set it to the carrier "
            "item's position or leave it unset"
        )


def check_token_ids(entry: TokenEntry, fields: tuple[str, ...] = TOKEN_ID_FIELDS) -> None:
    """Refuse, by call and field, a prompt or generation that is not a list of token ids."""
    for field in fields:
        ids = getattr(entry, field)
        if are_token_ids(ids):
            continue
        raise InvalidRecordError(
            f"call {entry.model_call_id!r}: {field} {first_non_id(ids)}; token ids index the "
            "vocabulary, so store exactly the ids the model server returned (integers 0 or "
            "more), never pads such as -100 (the trainer pads, where the loss mask is 0)"
        )


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem, without echoing (possibly huge) token arrays back."""
    parts = []
    for error in exc.errors(include_input=False, include_url=False):
        where = ".".join(str(p) for p in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def check_response_token_arrays(response: Mapping[str, Any]) -> None:
    """Validate every item of a response that carries token arrays as a captured call is.

    A finished record may already carry arrays (one item per call of a delivered chain), on
    Responses `output` items or Chat messages (`token_carriers`, both kinds); each carrier
    needs all three arrays, one finite log prob per generated id and non-negative integer
    ids (the `TokenEntry` rules). Raises `ValueError` naming the first bad item by where it
    sits (`response.output[0]`).
    """
    for where, item in token_carriers(response):
        if not carries_tokens(item):
            continue
        arrays = {field: item.get(field) for field in TOKEN_FIELDS}
        try:
            TokenEntry(rollout_id="record", model_call_id=where, **arrays)
        except ValidationError as exc:
            raise InvalidRecordError(f"{where}: {describe_validation_error(exc)}") from None


def coerce_token_entry(entry: Any) -> TokenEntry:
    """Validate a `TokenEntry`, a NeMo Gym entry (anything with `model_dump()`) or a mapping.

    Foreign objects and mappings are fully re-validated, so they cannot bypass the checks.
    Our own `TokenEntry` was validated when built; its cross-field rules are checked again
    (fields may have been reassigned since) without re-parsing every token id.
    """
    if type(entry) is TokenEntry:
        check_entry_consistency(entry)
        return entry
    if hasattr(entry, "model_dump"):
        return TokenEntry.model_validate(entry.model_dump())
    if isinstance(entry, Mapping):
        return TokenEntry.model_validate(dict(entry))
    raise WrongTypeError(
        f"expected a TokenEntry, an object with model_dump() or a mapping, got {type(entry)!r}"
    )


def entry_fields(entry: TokenEntry) -> dict[str, Any]:
    """Every field of an entry, extras included, without copying the token lists."""
    return {**entry.__dict__, **(entry.__pydantic_extra__ or {})}


def token_entry_from_response(
    rollout_id: str,
    model_call_id: str,
    response: Mapping[str, Any],
    *,
    model: str = "",
    created_at: float = 0.0,
) -> TokenEntry | None:
    """Build the capture record of one served call, or `None` when it carries no tokens.

    The response's `id` is recorded as `response_id` (it is what the harness keeps); a
    response without one leaves the field unset, so it is not written. The engine's label
    in the response's `metadata.weight_version` (SGLang) is recorded as
    `weight_version_label`: a label, never taken for a trainer version.
    """
    fields = extract_token_fields(response)
    if fields is None:
        return None
    output_items, token_item_index = strip_token_fields(response_to_output_items(response))
    served_id = response.get("id")
    if isinstance(served_id, str) and served_id:
        fields["response_id"] = served_id
    label = served_label(response.get(SERVED_METADATA))
    if label is not None:
        fields[LABEL_FIELD] = label
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=model_call_id,
        model=model or str(response.get("model") or ""),
        output_items=output_items,
        token_item_index=token_item_index,
        created_at=created_at,
        **fields,
    )
