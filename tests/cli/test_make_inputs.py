"""`tokcap make-inputs`: seeded captures in a store and rollout files, ready to finalize or submit.

Each command runs as a real `tokcap` subprocess (no Prefect server: the command needs none);
what it wrote is read back from the store and the folder, and finalized by a real run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import orjson
import pytest

from capture_core.ids import maybe_rollout_id_from_run_body as rollout_id_of
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.trace_shapes import SHAPES, episode
from tests.support.pipeline_helpers import dest_records, run_cli, with_storage_options
from tokcap.flows.demo import DEFAULT_ROLLOUTS


def make_inputs(
    store: str, out: str, *extra: str, options: dict | None = None
) -> subprocess.CompletedProcess:
    args = ["make-inputs", "--store", store, "--out", out, *extra]
    return run_cli(with_storage_options(args, options), None)


def records_of(folder: Path) -> dict[str, list[dict]]:
    """Each rollout file's records, by file name."""
    return {
        path.name: [orjson.loads(line) for line in path.read_bytes().splitlines()]
        for path in sorted(folder.glob("*.jsonl"))
    }


def tree(root: Path) -> list[tuple[str, bytes]]:
    """Every file below `root` with its content."""
    return sorted(
        (str(p.relative_to(root)), p.read_bytes()) for p in root.rglob("*") if p.is_file()
    )


def printed_prefix(stdout: str) -> str:
    return re.search(r"^rollout ids: (\S+)-<task>-<rollout>", stdout, re.MULTILINE).group(1)


def test_it_writes_sized_files_and_their_captures_and_says_what_to_run(tmp_path: Path) -> None:
    store, out = str(tmp_path / "store"), tmp_path / "out"
    done = make_inputs(store, str(out), "--rollouts", "12", "--files", "3", "--seed", "5")
    assert done.returncode == 0, done.stderr
    prefix = printed_prefix(done.stdout)
    files = records_of(out)
    assert sorted(files) == [f"{prefix}-0{n}.jsonl" for n in (1, 2, 3)]
    assert [len(records) for records in files.values()] == [4, 4, 4]
    ids = [rollout_id_of(r) for records in files.values() for r in records]
    assert len(set(ids)) == 12 and all(i.startswith(f"{prefix}-") for i in ids)
    captures = TokenCaptureStore(store)
    assert all(captures.read_entries(rollout_id) for rollout_id in ids), "every id captured"
    first = out / f"{prefix}-01.jsonl"
    assert f"tokcap finalize --rollouts {first} --store {store} --dest DEST" in done.stdout
    assert f"tokcap submit --inbox INBOX {out}/{prefix}-*.jsonl" in done.stdout


def test_each_invocation_makes_new_ids_so_its_files_can_be_submitted(tmp_path: Path) -> None:
    store, inbox = str(tmp_path / "store"), str(tmp_path / "inbox")
    runs = [make_inputs(store, str(tmp_path / "out"), "--rollouts", "3") for _ in range(2)]
    assert [run.returncode for run in runs] == [0, 0], runs[-1].stderr
    first, second = (printed_prefix(run.stdout) for run in runs)
    assert first != second
    files = sorted((tmp_path / "out").glob("*.jsonl"))
    ids = [rollout_id_of(r) for records in records_of(tmp_path / "out").values() for r in records]
    assert len(files) == 2 and len(set(ids)) == 6
    submitted = run_cli(["submit", "--inbox", inbox, *map(str, files)], "")
    assert submitted.returncode == 3, submitted.stderr  # placed; no server to announce them
    assert len(re.findall(r"^run id: ", submitted.stdout, re.MULTILINE)) == 2


@pytest.mark.integrity
def test_it_refuses_a_file_or_a_capture_already_there_and_writes_nothing(tmp_path: Path) -> None:
    from tests.support.reliability_figures import record_case

    store, out = str(tmp_path / "store"), tmp_path / "out"
    assert make_inputs(store, str(out), "--rollouts", "4", "--id-prefix", "fixed").returncode == 0
    before = (tree(Path(store)), records_of(out))
    again = make_inputs(store, str(out), "--rollouts", "4", "--id-prefix", "fixed")
    assert again.returncode == 2
    assert f"{out}/fixed-01.jsonl already exists; nothing was written" in again.stderr
    other_out = make_inputs(store, str(tmp_path / "o2"), "--rollouts", "4", "--id-prefix", "fixed")
    assert other_out.returncode == 2
    assert "already holds a capture of rollout fixed-0-0; nothing was written" in other_out.stderr
    assert not (tmp_path / "o2").exists() or not list((tmp_path / "o2").glob("*.jsonl"))
    assert (tree(Path(store)), records_of(out)) == before
    record_case("make-inputs asked to write over existing captures or files")


def test_the_same_seed_gives_the_same_rollouts(tmp_path: Path) -> None:
    def made(name: str, seed: str) -> dict[str, list[dict]]:
        where = tmp_path / name
        args = ("--rollouts", "10", "--seed", seed, "--id-prefix", "p")
        assert make_inputs(str(where / "store"), str(where / "out"), *args).returncode == 0
        return records_of(where / "out")

    first, again, other = made("a", "3"), made("b", "3"), made("c", "4")
    assert first == again
    assert first["p-01.jsonl"][:DEFAULT_ROLLOUTS] == other["p-01.jsonl"][:DEFAULT_ROLLOUTS]
    assert first != other, "the seeded agent rollouts after the scripted cases differ"


def test_all_traces_inputs_have_the_multi_trace_episode_shapes(tmp_path: Path) -> None:
    store, out = str(tmp_path / "store"), tmp_path / "out"
    args = ("--rollouts", "16", "--delivery", "all_traces", "--id-prefix", "t", "--seed", "2")
    done = make_inputs(store, str(out), *args)
    assert done.returncode == 0, done.stderr
    assert "--delivery all_traces" in done.stdout
    captures = TokenCaptureStore(store)
    for index in (0, 1, 9):
        expected = episode(index, SHAPES[index % len(SHAPES)], seed=2)
        stored = captures.read_entries(f"t-{expected.rollout_id}")
        assert sorted(e.generation_token_ids for e in stored) == sorted(
            e.generation_token_ids for e in expected.entries
        )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--rollouts", "2", "--files", "3"], "--files 3 is more than --rollouts 2"),
        (["--rollouts", "2", "--id-prefix", "../x"], "--id-prefix: "),
        (["--rollouts", "0"], "--rollouts: 0 is not at least 1"),
    ],
)
def test_bad_arguments_exit_2_in_one_line(tmp_path: Path, extra: list[str], expected: str) -> None:
    done = make_inputs(str(tmp_path / "store"), str(tmp_path / "out"), *extra)
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert not (tmp_path / "store").exists() and not (tmp_path / "out").exists()


def test_the_out_folder_must_not_overlap_the_store(tmp_path: Path) -> None:
    done = make_inputs(
        str(tmp_path / "store"), str(tmp_path / "store" / "files"), "--rollouts", "2"
    )
    assert done.returncode == 2 and "--out" in done.stderr and "--store" in done.stderr


def test_it_writes_to_s3(s3_options: dict, s3_endpoint: str) -> None:
    from tests.conftest import make_bucket

    bucket = make_bucket(s3_options)
    store, out = f"s3://{bucket}/captures", f"s3://{bucket}/inputs"
    options = {"endpoint_url": s3_endpoint}
    done = make_inputs(store, out, "--rollouts", "5", "--files", "2", options=options)
    assert done.returncode == 0, done.stderr
    prefix = printed_prefix(done.stdout)
    folder = open_byte_store(out, s3_options)
    assert folder.list_children("") == [f"{prefix}-01.jsonl", f"{prefix}-02.jsonl"]
    assert TokenCaptureStore(store, s3_options).read_entries(f"{prefix}-0-0")
    assert "(with the same --storage-option values)" in done.stdout


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("delivery", ["main_chain", "all_traces"])
def test_the_inputs_finalize_as_printed(tmp_path: Path, prefect_api: str, delivery: str) -> None:
    store, out, dest = str(tmp_path / "store"), tmp_path / "out", str(tmp_path / "dest")
    made = make_inputs(store, str(out), "--rollouts", "16", "--delivery", delivery)
    assert made.returncode == 0, made.stderr
    command = next(line for line in made.stdout.splitlines() if " finalize --rollouts " in line)
    args = command.split(" finalize ", 1)[1].replace("DEST", dest).split()
    done = run_cli(["finalize", *args], prefect_api)
    assert done.returncode == 0, done.stderr[-2000:]
    run_id = args[args.index("--run-id") + 1]
    records = dest_records(dest, run_id)
    assert len(records) == 16
    assert any(r.get("mask_sample") for r in records), "the lost-call shapes are masked"
    if delivery == "all_traces":
        assert sum("training_traces" in r for r in records) >= 12
    else:
        assert re.search(r"^handed off\s+16$", done.stdout, re.MULTILINE)
