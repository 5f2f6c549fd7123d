"""One run's layout at the destination, and the bookkeeping files it owns.

Under `<dest>/<run_id>/`: `run.json` (the manifest), `ledger.jsonl` (each rollout's fate),
`summary.json` (the ledger's counts, so runs are listed without reading ledgers),
`records/` (the handed-off part files), `rows/` (their trainer rows, Parquet or Arrow,
when the run writes them), `consumers/<name>/` (each row consumer's acknowledgements),
`receipts/` (the upload task's persisted results), `attempts/` (the inbox claims),
`input-seen.json` (the last input fingerprint the inbox found with the manifest's digest)
and `set-aside/` (evidence of handoffs that were never recorded). This module is the only
one that spells those names.
The manifest binds a run id to one input (by digest) and its settings, create-only, so a run
id cannot silently mix two inputs; retrigger and status read it back. It never holds storage
options or credentials. This module does not import Prefect.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import BaseModel, Field, model_validator

from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.errors import InvalidInputError, RunIdInUseError, UnreadableManifestError
from capture_core.ids import validate_rollout_id
from capture_core.run.rollout_io import split_lines
from capture_core.run.task_groups import DEFAULT_MAX_GROUP_SIZE
from capture_core.storage import ByteStore

MANIFEST = "run.json"
LEDGER = "ledger.jsonl"
SUMMARY = "summary.json"
RECORDS = "records"
ROWS = "rows"
ROW_FORMATS = ("none", "parquet", "arrow")
ROW_SUFFIXES = {"parquet": ".parquet", "arrow": ".arrow"}
"""The file suffix of a rows part in each format that writes one."""
CONSUMERS = "consumers"
RECEIPTS = "receipts"
ATTEMPTS = "attempts"
INPUT_SEEN = "input-seen.json"
SET_ASIDE = "set-aside"


def validate_run_id(run_id: str) -> str:
    """Run ids follow the rollout-id rules: they are path segments under the destination."""
    try:
        return validate_rollout_id(run_id)
    except ValueError as exc:
        raise InvalidInputError(str(exc).replace("rollout id", "run id")) from exc


def run_location(dest: str, run_id: str, *parts: str) -> str:
    """The path or URL of a run's item under the destination location `dest`."""
    return "/".join([dest.rstrip("/"), run_id, *parts])


def part_key(run_id: str, index: int, sha256: str) -> str:
    """The part file of batch `index` of the input whose batch digest is `sha256`."""
    return f"{run_id}/{RECORDS}/part-{index:05d}-{sha256[:16]}.jsonl"


def rows_key(run_id: str, index: int, sha256: str, rows: str = "parquet") -> str:
    """The trainer-rows part of batch `index` in format `rows`, beside its records part."""
    return f"{run_id}/{ROWS}/part-{index:05d}-{sha256[:16]}{ROW_SUFFIXES[rows]}"


def is_rows_key(key: str, run_id: str, index: int, sha256: str) -> bool:
    """Whether `key` is the rows part of batch `index`, in any format that writes one."""
    return any(key == rows_key(run_id, index, sha256, rows) for rows in ROW_SUFFIXES)


def row_format(key: str) -> str:
    """The format a rows part's key names by its suffix (`parquet` or `arrow`)."""
    for rows, suffix in ROW_SUFFIXES.items():
        if key.endswith(suffix):
            return rows
    suffixes = ", ".join(ROW_SUFFIXES.values())
    raise InvalidInputError(f"{key!r} is not a rows part: its name ends in none of {suffixes}")


def ack_key(run_id: str, consumer: str, rows_part: str) -> str:
    """Consumer `consumer`'s acknowledgement of the rows part whose key is `rows_part`."""
    name = rows_part.rsplit("/", 1)[-1]
    for suffix in ROW_SUFFIXES.values():
        name = name.removesuffix(suffix)
    return f"{run_id}/{CONSUMERS}/{consumer}/{name}.ack"


def consumers_prefix(run_id: str) -> str:
    return f"{run_id}/{CONSUMERS}"


class RunManifest(BaseModel):
    """What a run finalizes and how.

    `rollouts_fingerprint` (see `rollout_io.file_fingerprint`) lets the inbox see an
    unchanged file without reading it; the digest alone binds the run to its input.
    `rows` is the trainer-row format written beside each part (`none`, `parquet` or `arrow`);
    `retire_after_consumer` names the row consumer whose acknowledgements gate retirement.
    Both are settings of the run: a re-claim with other values is refused.
    `started_at` (seconds since the epoch) is when the run id was first claimed; it orders
    the runs of a destination, is never compared, and manifests from before it have none.
    """

    run_id: str
    rollouts: str
    rollouts_sha256: str
    rollouts_fingerprint: str | None = None
    store: str
    builder: str
    batch_size: int
    batches: int
    max_mask_fraction: float | None = None
    mask_fraction_min_samples: int = 50
    rows: str = "none"
    retire_after_consumer: str | None = None
    delivery: str = MAIN_CHAIN
    """Written only when it is not the default, so a default run's manifest is unchanged;
    so are `rows`, `retire_after_consumer`, `group_by` and `max_group_size`."""
    group_by: str | None = None
    """`task`: no batch splits a task's rollouts (`task_groups`); it shapes the batches."""
    max_group_size: int = DEFAULT_MAX_GROUP_SIZE
    """The group cap the run was planned with: a retrigger plans with it again. It refuses
    input but never shapes a batch, so a re-run with another cap is not refused."""
    started_at: float | None = None

    def encoded(self) -> bytes:
        body = self.model_dump()
        defaults = {
            "delivery": MAIN_CHAIN,
            "rows": "none",
            "retire_after_consumer": None,
            "group_by": None,
            "max_group_size": DEFAULT_MAX_GROUP_SIZE,
            "started_at": None,
        }
        for name, default in defaults.items():
            if body[name] == default:
                del body[name]
        return _encode(body)


class RolloutFigures(BaseModel):
    """What finalizing found of one input line: the rollout, its mask and its delivery figures.

    A batch's outcome and the run ledger's line carry these under the same names, so the
    ledger copies them whole (`figures`) rather than field by field.
    """

    rollout_id: str | None = None
    line: int
    masked: bool = False
    mask_reason: str | None = None
    delivered_fraction: float | None = None
    terminal_method: str | None = None
    terminal_abstentions: list[str] = Field(default_factory=list)
    traces: int | None = None
    """`all_traces` builds: the rollout's training rows, owned calls and tokens trained."""
    owned_calls: int | None = None
    tokens_trained: int | None = None
    weight_versions: list[int] | None = None
    """Records carrying `token_provenance` (`version_tally`): [min, max] sampling version of
    their generated tokens (null: none known), tokens per version and of unknown version."""
    weight_version_tokens: dict[str, int] | None = None
    unknown_version_tokens: int | None = None

    def figures(self) -> dict[str, Any]:
        """These fields alone, by name, to build another model that carries them."""
        return {name: getattr(self, name) for name in RolloutFigures.model_fields}


class LedgerLine(RolloutFigures):
    """One rollout's fate in a run.

    `kept` says the capture was deliberately not retired (it changed since it was frozen);
    a later retirement never clears its reason. Lines written before `kept` existed are read
    with it derived from their error text, the way they were interpreted then.
    `awaiting_consumer` names the row consumer whose acknowledgement its retirement waits for.
    `earlier` marks a rollout whose batch an earlier run (or pass) of this run id handed off;
    `retired_earlier` one whose retirement an earlier run (or pass) recorded;
    `gated` one finalized but not handed off because the mask gate stopped the run there;
    `not_started` an input line the run never finalized (it stopped first). They are
    written only when set, so other ledgers are unchanged.
    """

    finalized: bool
    handed_off: bool
    retired: bool = False
    kept: bool = False
    error: str | None = None
    awaiting_consumer: str | None = None
    earlier: bool = False
    retired_earlier: bool = False
    gated: bool = False
    not_started: bool = False

    @model_validator(mode="before")
    @classmethod
    def _legacy_kept(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kept" not in data:
            data = {**data, "kept": "kept" in (data.get("error") or "")}
        return data


TRACE_COUNTS = ("traces", "owned_calls", "tokens_trained")
VERSION_FIGURES = ("weight_versions", "weight_version_tokens", "unknown_version_tokens")
FLAGS_WHEN_SET = ("earlier", "retired_earlier", "gated", "not_started")


def _unset(line: LedgerLine) -> set[str]:
    absent = {n for n in TRACE_COUNTS if getattr(line, n) is None}
    if line.weight_version_tokens is None:  # no provenance key: `weight_versions` null says more
        absent |= set(VERSION_FIGURES)
    return absent | {n for n in FLAGS_WHEN_SET if not getattr(line, n)}


def encode_ledger(lines: list[LedgerLine]) -> bytes:
    """One JSON line per rollout; trace counts only where a build counted them, version
    figures only where the record carried provenance, the `earlier`, `retired_earlier`,
    `gated` and `not_started` flags only where set."""
    return b"".join(orjson.dumps(line.model_dump(exclude=_unset(line))) + b"\n" for line in lines)


class RunLayout:
    """Every key of one run under a destination byte store, and its manifest and ledger."""

    def __init__(self, dest: ByteStore, run_id: str) -> None:
        self.dest = dest
        self.run_id = validate_run_id(run_id)
        self.manifest_key = self.key(MANIFEST)
        self.ledger_key = self.key(LEDGER)
        self.summary_key = self.key(SUMMARY)
        self.receipts_prefix = self.key(RECEIPTS)
        self.attempts_prefix = self.key(ATTEMPTS)

    def key(self, *parts: str) -> str:
        return "/".join([self.run_id, *parts])

    def receipt_key(self, name: str) -> str:
        return self.key(RECEIPTS, name)

    def set_aside_prefix(self, name: str) -> str:
        """Where the evidence of receipt `name`'s unrecorded handoffs is kept."""
        return self.key(SET_ASIDE, name)

    def set_aside(self, name: str, found: bytes, part_key: str | None, reason: str) -> str:
        """Keep an unreadable receipt's bytes, and a copy of the part it names, as evidence;
        then remove the receipt, unless it changed meanwhile. The part itself stays.

        Each setting-aside gets its own numbered folder, written create-only before anything
        is removed, so a crash in between leaves the evidence and the receipt as it was.
        Returns the folder's key.
        """
        prefix = self.set_aside_prefix(name)
        folder = f"{prefix}/{len(self.dest.list_children(prefix)):04d}"
        note = {
            "receipt": self.receipt_key(name),
            "receipt_bytes": len(found),
            "receipt_base64": base64.b64encode(found).decode(),
            "part": part_key,
            "reason": reason,
        }
        self.dest.create(f"{folder}/note.json", _encode(note))
        part = None if part_key is None else self.dest.get(part_key)
        if part_key is not None and part:
            self.dest.create(f"{folder}/{part_key.rsplit('/', 1)[-1]}", part)
        if self.dest.get(self.receipt_key(name)) == found:  # a concurrent pass may have won
            self.dest.delete([self.receipt_key(name)])
        return folder

    def attempt_key(self, number: int, kind: str) -> str:
        """An inbox claim marker: `attempts/NNNN.claim`, `.beat` or `.end`."""
        return self.key(ATTEMPTS, f"{number:04d}.{kind}")

    def read_input_seen(self, sha256: str) -> str | None:
        """The fingerprint the inbox last found with input digest `sha256`, if any.

        It only spares a read: anything unreadable there reads as nothing seen.
        """
        data = self.dest.get(self.key(INPUT_SEEN))
        try:
            seen = orjson.loads(data) if data is not None else None
        except orjson.JSONDecodeError:
            return None
        if not isinstance(seen, dict) or seen.get("sha256") != sha256:
            return None
        fingerprint = seen.get("fingerprint")
        return fingerprint if isinstance(fingerprint, str) else None

    def record_input_seen(self, fingerprint: str, sha256: str) -> None:
        """Remember that the input under `fingerprint` has digest `sha256`: not read again."""
        self.dest.replace(
            self.key(INPUT_SEEN), _encode({"fingerprint": fingerprint, "sha256": sha256})
        )

    def create_attempt(self, number: int, kind: str, body: dict[str, Any]) -> bool:
        """Create an inbox marker create-only; `False` when it already exists."""
        return self.dest.create(self.attempt_key(number, kind), _encode(body))

    def replace_attempt(self, number: int, kind: str, body: dict[str, Any]) -> None:
        self.dest.replace(self.attempt_key(number, kind), _encode(body))

    def read_attempt(self, number: int, kind: str) -> dict[str, Any] | None:
        data = self.dest.get(self.attempt_key(number, kind))
        return None if data is None else orjson.loads(data)

    def attempt_numbers(self) -> list[int]:
        """The numbers of every claim (attempt) made on the run, ascending."""
        numbers = []
        for key in self.dest.list_prefix(self.attempts_prefix):
            stem, _, kind = key.rsplit("/", 1)[-1].partition(".")
            if kind == "claim" and stem.isdigit():
                numbers.append(int(stem))
        return sorted(numbers)

    def claim(self, manifest: RunManifest) -> bool:
        """Record the manifest; `False` when this run id already holds the same input.

        Raises `RunIdInUseError` naming each changed setting when the run id was used for
        another input, batch size or builder.
        """
        if self.dest.create(self.manifest_key, manifest.encoded()):
            return True
        self.refuse_other_settings(self.read_manifest(), manifest.model_dump())
        return False

    def refuse_other_settings(self, recorded: RunManifest | None, claim: Mapping[str, Any]) -> None:
        """Raise `RunIdInUseError` naming each setting of `claim` (manifest fields; the input
        digest and settings it leaves out are not compared) that differs from `recorded`.

        The CLI calls this on the manifest before any flow starts; `claim` after its create.
        """
        changed = _changed_settings(recorded, claim)
        if changed:
            raise RunIdInUseError(
                f"run id {self.run_id} at {self.dest.url} was used for other input or "
                f"settings: {'; '.join(changed)}. Rerun with the original input and settings, "
                "or pick a new run id"
            )

    def read_manifest(self) -> RunManifest | None:
        """The manifest, or `None` when there is none; `UnreadableManifestError` naming it
        when the object there is not a manifest."""
        data = self.dest.get(self.manifest_key)
        if data is None:
            return None
        try:
            return RunManifest.model_validate(orjson.loads(data))
        except ValueError as exc:  # not JSON, or not a manifest
            first_line = str(exc).partition("\n")[0][:160]
            detail = f"{type(exc).__name__}: {first_line}"
            raise UnreadableManifestError(
                f"manifest {self.dest.url}/{self.manifest_key} exists but cannot be read "
                f"({detail}). It binds run {self.run_id} to its input and settings: restore "
                "it (from a backup or an earlier object version), then run again; do not "
                "delete it (a new manifest would let other input finish under this run's "
                "receipts). To finalize the input anyway, use a new run id (in an inbox: "
                "publish the file under a new name)"
            ) from exc

    def read_ledger(self) -> list[LedgerLine] | None:
        data = self.dest.get(self.ledger_key)
        if data is None:
            return None
        return [
            LedgerLine.model_validate(orjson.loads(line))
            for line in split_lines([data])
            if line.strip()
        ]

    def write_ledger(self, lines: list[LedgerLine]) -> None:
        self.dest.replace(self.ledger_key, encode_ledger(lines))

    def mark_retired(self, rollout_ids: list[str]) -> int:
        """Record retirements done outside a finalize run; a kept line keeps its reason."""
        ledger = self.read_ledger()
        if ledger is None:
            return 0
        retired = set(rollout_ids)
        for line in ledger:
            if line.rollout_id in retired:
                line.retired = True
                line.awaiting_consumer = None
                if not line.kept:
                    line.error = None
        self.write_ledger(ledger)
        return len(retired)


def _encode(body: dict[str, Any]) -> bytes:
    """The one encoding of the run's JSON objects: keys sorted, so equal content is equal bytes."""
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


RUN_SETTINGS = ("batch_size", "builder", "delivery", "rows", "retire_after_consumer", "group_by")


def _changed_settings(existing: RunManifest | None, new: Mapping[str, Any]) -> list[str]:
    """What differs between a run's recorded manifest and a new claim, in words."""
    if existing is None:
        return [f"the recorded {MANIFEST} is unreadable"]
    changed = []
    digest = new.get("rollouts_sha256")
    if digest is not None and existing.rollouts_sha256 != digest:
        changed.append(
            f"input digest {existing.rollouts_sha256[:12]} ({existing.rollouts}) is now "
            f"{digest[:12]} ({new.get('rollouts')})"
        )
    for name in (name for name in RUN_SETTINGS if name in new):
        old, now = getattr(existing, name), new[name]
        if old != now:
            changed.append(f"{name.replace('_', ' ')} {old} is now {now}")
    return changed


def read_manifest(dest: ByteStore, run_id: str) -> RunManifest | None:
    """The run's manifest, or `None` when the run id was never claimed at `dest`."""
    return RunLayout(dest, run_id).read_manifest()


def read_ledger(dest: ByteStore, run_id: str) -> list[LedgerLine] | None:
    """The run's ledger, or `None` when the run wrote none yet."""
    return RunLayout(dest, run_id).read_ledger()
