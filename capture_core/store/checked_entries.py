"""The entries the capture store takes and gives: checked at a put, built from sealed bytes.

A put stores an entry as it is at the put (`storable_entry`): every token rule is checked
again on copies, so what is stored is what was checked. A read builds the entry of sealed
bytes without a second pass over every token (`construct_sealed_entry`) when every field is
exactly what validation gives it (`as_validated`), and validates it in full otherwise; a put
validates in full in the same case, so it stores the entry a reader would read (other
systems' provenance names mapped, a field of another type converted or refused). Both apply
the rules of `records`, the one place they are written. This module imports only `errors`
and `records` from the project.
"""

from __future__ import annotations

from array import array
from typing import Any, NamedTuple

from pydantic import ValidationError

from capture_core.errors import InvalidRecordError
from capture_core.records import (
    TokenEntry,
    check_entry_consistency,
    check_token_ids,
    coerce_token_entry,
    describe_validation_error,
    entry_fields,
)
from capture_core.records.provenance import RUNS_KEY, input_names_to_map
from capture_core.records.token_values import TOKEN_ID_FIELDS, token_id_array

# The Python type validation gives each field (`response_id` also non-empty; `None` where
# it is the field's default, as validation keeps it). A field of any other type is
# validated, never trusted: validation may convert it or refuse it by name.
_NONE = type(None)
_EXACT_TYPES: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "rollout_id": (str,),
    "model_call_id": (str,),
    "model": (str,),
    "prompt_token_ids": (list,),
    "generation_token_ids": (list,),
    "generation_log_probs": (list,),
    "output_items": (list,),
    "token_item_index": (int, _NONE),
    "response_id": (str, _NONE),
    "created_at": (float,),
    "start_weight_version": (int, _NONE),
    "end_weight_version": (int, _NONE),
    RUNS_KEY: (list, _NONE),  # its items: `check_entry_consistency` (`check_provenance`)
    "weight_version_label": (str, _NONE),
    "replica": (str, _NONE),
}
_REQUIRED_FIELDS = tuple(
    name for name, info in TokenEntry.model_fields.items() if info.is_required()
)


def as_validated(fields: dict[str, Any]) -> bool:
    """Whether validation would take `fields` as they are: every required field there, each
    of exactly the type validation gives it, no other system's provenance name to map. Else
    only validation says what they read as (or refuses them), at a read as at a put."""
    if any(name not in fields for name in _REQUIRED_FIELDS) or input_names_to_map(fields):
        return False  # validation maps other systems' provenance names
    for name, value in fields.items():
        kinds = _EXACT_TYPES.get(name)
        if kinds is None:
            if name.startswith("_"):
                return False  # `model_construct`'s own parameter, or a name pydantic keeps
        elif type(value) not in kinds:
            return False
    if fields.get("response_id") == "":
        return False
    return all(type(item) is dict for item in fields.get("output_items", ()))


def construct_sealed_entry(fields: dict[str, Any]) -> TokenEntry | None:
    """The `TokenEntry` of fields read from sealed bytes, built without a second pass over
    every token; `None` when a field is not exactly what validation yields (then validate).

    A seal proves the bytes are the ones a writer stored from a validated entry, so their
    token lists already passed validation; the scalar types (`as_validated`) and the
    cross-field rules (`check_entry_consistency`) are checked again. Never for bytes no seal
    covers.
    """
    if not as_validated(fields):
        return None
    entry = _constructed(fields)
    try:
        check_entry_consistency(entry)
    except (ValueError, TypeError):
        return None
    return entry


def _plain_default(info: Any) -> Any:
    """A field's default when it is one immutable value, shared by every entry; else
    `_FACTORY` (a default factory, or a value `get_default` would copy)."""
    if info.default_factory is None and type(info.default) in (type(None), int, float, str):
        return info.default
    return _FACTORY


_FACTORY = object()
_FIELDS: tuple[tuple[str, Any, Any], ...] = tuple(
    (name, info, _plain_default(info)) for name, info in TokenEntry.__pydantic_fields__.items()
)
# `_constructed` is `model_construct` without its alias lookups: none of these fields has one.
_CONSTRUCT_EXACT = (
    all(info.alias is None and info.validation_alias is None for _name, info, _d in _FIELDS)
    and not TokenEntry.__pydantic_post_init__
    and not TokenEntry.__pydantic_root_model__
    and TokenEntry.model_config.get("extra") == "allow"
)


def _constructed(fields: dict[str, Any]) -> TokenEntry:
    """`TokenEntry.model_construct(set(fields), **fields)`, the same object (its `__dict__` in
    field order with the defaults of fields not given, its fields set, its extras in their
    order), built without the per-field alias lookups and default copies: a read builds one
    per stored entry. Falls back to `model_construct` should the model ever gain an alias."""
    if not _CONSTRUCT_EXACT:
        return TokenEntry.model_construct(set(fields), **fields)
    values = dict(fields)
    own: dict[str, Any] = {}
    for name, info, default in _FIELDS:
        if name in values:
            own[name] = values.pop(name)
        elif default is not _FACTORY:
            own[name] = default
        elif not info.is_required():
            own[name] = info.get_default(call_default_factory=True, validated_data=own)
    entry = TokenEntry.__new__(TokenEntry)
    object.__setattr__(entry, "__dict__", own)
    object.__setattr__(entry, "__pydantic_fields_set__", set(fields))
    object.__setattr__(entry, "__pydantic_extra__", values)
    object.__setattr__(entry, "__pydantic_private__", None)
    return entry


class StorableEntry(NamedTuple):
    """An entry as a put stores it (`storable_entry`), with its prompt as it was checked."""

    entry: TokenEntry
    prompt_ids: array | None
    """The prompt ids the check read, packed (`token_id_array`), when the entry was ours:
    its stored digest is taken from them, so a prompt changed after the check fails its
    digest when read (the rollout masks) instead of being stored unchecked."""
    stamped: bool = False
    """Whether the store stamped `end_weight_version` from its version source: a retry of the
    same put may be stamped with a later version and is still the same call."""


def storable_entry(entry: Any) -> StorableEntry:
    """The entry a put stores, validated as it is at the put, whatever happened to it before.

    A `TokenEntry` of ours was validated when built, but its lists may have changed since (a
    writer appending a -100 pad and a log prob), so every token rule is checked again: ids,
    one finite float32 log prob per generated id, the weight-version rules
    (`check_token_ids`, `check_entry_consistency`). The generated ids, log probs and
    per-token versions are copied first and the
    copies are checked and stored; the prompt is read once, into `prompt_ids`. So what is
    stored is what was checked, even if the caller changes its entry meanwhile.
    Our entry whose fields a reader would not take as they are once checked (`as_validated`:
    another system's provenance name among its extras, a field assigned a value of another
    type) is then validated in full like anything else, from the fields it has set, so what
    is stored is what a reader reads: names mapped (or two that disagree refused by name),
    types converted or refused.
    Anything else is validated in full by `coerce_token_entry`, into lists of its own.
    Raises `InvalidRecordError` naming the field (and the call, when it could be read).
    """
    if type(entry) is TokenEntry:
        checked = _checked_copy(entry)
        if as_validated(entry_fields(checked.entry)):
            return checked
        entry = _set_fields(checked.entry)
    try:
        return StorableEntry(coerce_token_entry(entry), None)
    except ValidationError as exc:
        raise InvalidRecordError(describe_validation_error(exc)) from exc


def _checked_copy(entry: TokenEntry) -> StorableEntry:
    """Our entry with copies of its generated lists, every token rule checked on them."""
    copies = {
        name: value.copy()
        for name in ("generation_token_ids", "generation_log_probs", RUNS_KEY)
        if type(value := getattr(entry, name)) is list
    }
    record = entry.model_copy(update=copies)
    prompt_ids = token_id_array(record.prompt_token_ids)
    check_token_ids(record, TOKEN_ID_FIELDS if prompt_ids is None else TOKEN_ID_FIELDS[1:])
    check_entry_consistency(record)
    return StorableEntry(record, prompt_ids)


def _set_fields(entry: TokenEntry) -> dict[str, Any]:
    """The fields an entry was given, read or assigned, and its extras: validating them gives
    the entry a reader reads, with the same fields set (so its wire form is unchanged)."""
    fields = {
        name: value for name, value in entry.__dict__.items() if name in entry.model_fields_set
    }
    return {**fields, **(entry.__pydantic_extra__ or {})}
