"""Every argument is checked before any Prefect server starts: one line, and no server.

Each command runs as a new user's `tokcap` subprocess: no `PREFECT_API_URL`, an empty
`PREFECT_HOME`. Had the CLI started its temporary server, that server's log would exist
under `PREFECT_HOME` (`tokcap.flows.temporary_server`); that it does not is the proof.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from capture_core.run.rollout_io import plan_rollout_file
from capture_core.run.run_layout import RunLayout, RunManifest
from capture_core.storage import open_byte_store
from tests.support.pipeline_helpers import finalize_args, finalize_args_for, receipt_args, run_cli
from tests.support.reliability_figures import record_case
from tests.support.servers import free_port
from tokcap.flows.temporary_server import LOG_NAME


def run_without_server(args: list[str], home: str) -> subprocess.CompletedProcess:
    """`tokcap ARGS` as a new user runs it: no Prefect settings, `home` as `PREFECT_HOME`."""
    return run_cli(args, None, env={"PREFECT_HOME": home})


def assert_refused_without_server(
    result: subprocess.CompletedProcess, home: str, code: int, *expected: str
) -> str:
    """The command exited `code` with one stderr line holding `expected`, and no server ran."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr[-2000:]
    assert len(lines) == 1, result.stderr[-2000:]
    assert all(text in lines[0] for text in expected), lines[0]
    assert result.stdout == ""
    assert not os.path.exists(os.path.join(home, LOG_NAME)), "a temporary server was started"
    assert "temporary" not in result.stderr
    return lines[0]


def claim_earlier_run(inputs: dict[str, str], run_id: str, batch_size: int) -> None:
    """Record `run_id`'s manifest at the destination, as an earlier finalize did."""
    plan = plan_rollout_file(inputs["rollouts"], batch_size)
    manifest = RunManifest(
        run_id=run_id,
        rollouts=plan.url,
        rollouts_sha256=plan.sha256,
        rollouts_fingerprint=plan.fingerprint,
        store=inputs["store"],
        builder="prefix_merging",
        batch_size=batch_size,
        batches=len(plan.batches),
    )
    assert RunLayout(open_byte_store(inputs["dest"]), run_id).claim(manifest)


@pytest.mark.integrity
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            finalize_args("{rollouts}", "s4://bucket/x", "{dest}", "r"),
            ["tokcap finalize: --store s4://bucket/x is neither a URL nor a path", "s4://;"],
        ),
        (
            finalize_args("{rollouts}", "{store}", "http://example.com/x", "r"),
            ["tokcap finalize: --dest: ", "http://example.com/x cannot be used"],
        ),
        (
            finalize_args("{rollouts}", "nosuchmod.x:Cls", "{dest}", "r"),
            ["--store: cannot import module 'nosuchmod.x'", "install the package"],
        ),
        (
            finalize_args("nope://bucket/in.jsonl", "{store}", "{dest}", "r"),
            ["--rollouts nope://bucket/in.jsonl is neither", "no filesystem knows the protocol"],
        ),
        (
            finalize_args("{rollouts}", "{store}", "{store}/dest", "r"),
            ["--store", "--dest", "one lies inside the other"],
        ),
        (
            ["clear", "--rollouts", "{rollouts}", "--store", "s4://bucket/x"],
            ["tokcap clear: --store s4://bucket/x is neither", "the protocol s4://; give a"],
        ),
        (
            ["sweep", "--store", "nosuchmod.x:Cls"],
            ["tokcap sweep: --store: cannot import module 'nosuchmod.x'"],
        ),
        (
            receipt_args("retire", "http://example.com/x", "r", "{store}"),
            ["tokcap retire: --dest: ", "http://example.com/x cannot be used"],
        ),
    ],
)
def test_a_bad_location_is_refused_in_one_line_before_any_server(
    run_inputs, tmp_path, args: list[str], expected: list[str]
) -> None:
    record_case("a bad store, dest or rollouts location or source class starts no server")
    home = str(tmp_path / "prefect-home")
    result = run_without_server([a.format(**run_inputs) for a in args], home)
    assert_refused_without_server(result, home, 2, *expected)


@pytest.mark.integrity
def test_a_reused_run_id_with_other_settings_is_refused_before_any_server(
    run_inputs, tmp_path
) -> None:
    record_case("a reused run id with other settings starts no server")
    claim_earlier_run(run_inputs, "reuse", batch_size=2)
    home = str(tmp_path / "prefect-home")
    args = finalize_args_for(run_inputs, "reuse", "--batch-size", "3", "--rows", "parquet")
    result = run_without_server(args, home)
    line = assert_refused_without_server(
        result, home, 2, "tokcap finalize: --run-id: run id reuse", "batch size 2 is now 3"
    )
    assert "rows none is now parquet" in line and "pick a new run id" in line
    assert "input digest" not in line, "the same input is not reported as changed"


def test_a_reused_run_id_with_other_input_is_refused_before_any_server(
    run_inputs, tmp_path
) -> None:
    claim_earlier_run(run_inputs, "moved", batch_size=2)
    with open(run_inputs["rollouts"], "ab") as f:
        f.write(b'{"_ng_task_index": 9, "_ng_rollout_index": 9}\n')
    home = str(tmp_path / "prefect-home")
    result = run_without_server(finalize_args_for(run_inputs, "moved", "--batch-size", "2"), home)
    assert_refused_without_server(result, home, 2, "--run-id: run id moved", "input digest")


@pytest.mark.integrity
@pytest.mark.parametrize("which", ["store", "dest"])
def test_a_missing_bucket_is_refused_in_one_line_before_any_server(
    run_inputs, tmp_path, s3_options, which: str
) -> None:
    """A missing bucket is the argument's fault (exit 2): the run can only work once the
    bucket exists or the URL names the right one."""
    record_case("a missing S3 bucket starts no server and leaves no Failed run")
    locations = {**run_inputs, which: f"s3://no-such-bucket-{which}/x"}
    options = [f"--storage-option=endpoint_url={s3_options['endpoint_url']}"]
    options += ["--storage-option=key=testing", "--storage-option=secret=testing"]
    home = str(tmp_path / "prefect-home")
    result = run_without_server(finalize_args_for(locations, "r", *options), home)
    assert_refused_without_server(
        result, home, 2, f"--{which}: bucket 'no-such-bucket-{which}'", "create it or fix the URL"
    )


@pytest.mark.parametrize("which", ["dest", "rollouts"])
def test_an_unreachable_endpoint_fails_in_one_line_before_any_server(
    run_inputs, tmp_path, which: str
) -> None:
    """Unreachable storage may come back (exit 1, not a usage error), but no server starts;
    the line names the endpoint, what to check and the setting that chose it."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    locations = {**run_inputs, which: f"s3://b/{which}"}
    options = [f"--storage-option=endpoint_url={endpoint}", "--storage-option=key=k"]
    home = str(tmp_path / "prefect-home")
    result = run_without_server(
        finalize_args_for(locations, "r", *options, "--storage-option=secret=s"), home
    )
    assert_refused_without_server(
        result,
        home,
        1,
        f"tokcap finalize: --{which}: ",
        f"the S3 endpoint {endpoint} did not answer",
        "check that it is running and reachable from this machine",
        "then retry",
        "set by the endpoint_url storage option",
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            finalize_args("{rollouts}", "s3:/bucket/captures", "{dest}", "r"),
            "tokcap finalize: --store s3:/bucket/captures is neither a URL nor a path tokcap can "
            "use: did you mean s3://bucket/captures?",
        ),
        (
            finalize_args("{rollouts}", "{store}", "s3:bucket/dest", "r"),
            "did you mean s3://bucket/dest?",
        ),
        (["submit", "--inbox", "s3:/b/inbox", "{rollouts}"], "did you mean s3://b/inbox?"),
        (
            finalize_args("{rollouts}", "s4://bucket/captures", "{dest}", "r"),
            "tokcap finalize: --store s4://bucket/captures is neither a URL nor a path tokcap can "
            "use: no filesystem knows the protocol s4://; give a local path or an s3:// URL",
        ),
        (finalize_args("{rollouts}", "{store}", "s4:/b/dest", "r"), "the protocol s4://"),
        (finalize_args("s5://b/in.jsonl", "{store}", "{dest}", "r"), "the protocol s5://"),
        (["submit", "--inbox", "sx://b/inbox", "{rollouts}"], "the protocol sx://"),
    ],
)
def test_a_url_missing_a_slash_is_refused_with_the_url_it_meant(
    run_inputs, tmp_path, args: list[str], expected: str
) -> None:
    home = str(tmp_path / "prefect-home")
    argv = [a.format(**run_inputs) for a in args]
    result = run_cli(argv, None, env={"PREFECT_HOME": home}, cwd=str(tmp_path))  # typo: a path
    assert_refused_without_server(result, home, 2, expected)
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "store"], "nothing written"


@pytest.mark.parametrize("command", ["finalize", "clear"])
def test_an_unreachable_prefect_api_url_is_one_line_naming_it_and_what_to_check(
    run_inputs, tmp_path, command: str
) -> None:
    """It was Prefect's bare `RuntimeError: Failed to reach API at ...`, exit 1."""
    api_url = f"http://127.0.0.1:{free_port()}/api"
    home = str(tmp_path / "prefect-home")
    if command == "finalize":
        args = finalize_args_for(run_inputs, "unreached")
    else:
        args = ["clear", "--rollouts", run_inputs["rollouts"], "--store", run_inputs["store"]]
    result = run_cli(args, api_url, env={"PREFECT_HOME": home})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3, result.stderr[-2000:]
    assert len(lines) == 1 and result.stdout == "", result.stderr[-2000:]
    assert lines[0].startswith(
        f"tokcap {command}: the Prefect API at {api_url} (PREFECT_API_URL) cannot be reached ("
    ), lines[0]
    assert "check that its server runs and that the URL, ending in /api, is right" in lines[0]
    assert "RuntimeError" not in result.stderr
    assert not os.path.exists(run_inputs["dest"]), "nothing ran"
    assert not os.path.exists(os.path.join(home, LOG_NAME)), "no temporary server either"


def test_deployments_check_against_an_unreachable_api_is_one_line_naming_it(tmp_path) -> None:
    """It was `tokcap deployments failed: ConnectError: ...`, exit 1."""
    api_url = f"http://127.0.0.1:{free_port()}/api"
    result = run_cli(["deployments", "--check"], api_url, env={"PREFECT_HOME": str(tmp_path)})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3, result.stderr[-2000:]
    assert len(lines) == 1 and result.stdout == "", result.stderr[-2000:]
    assert lines[0].startswith(
        f"tokcap deployments: the Prefect API at {api_url} (PREFECT_API_URL) cannot be reached ("
    ), lines[0]
    assert "ConnectError" not in lines[0]
