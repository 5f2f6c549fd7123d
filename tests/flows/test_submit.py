"""`tokcap submit` and `submit_files`: create-only placement into the inbox, the event that
announces each file, and the `run id:` line per file. The runs the event triggers are
tests/test_events.py."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from capture_core.run.inbox import run_id_for_file
from capture_core.storage import open_byte_store
from tests.support.pipeline_helpers import run_cli, write_rollouts
from tests.support.reliability_figures import record_case
from tests.support.servers import free_port, wait_until
from tokcap.flows.cli.events import NOT_ANNOUNCED_EXIT
from tokcap.flows.submit import SUBMITTED, SubmitRefusedError, place_file, submit_files

LINE = b'{"_ng_task_index": 1, "_ng_rollout_index": 0}\n'


def source(tmp_path: Path, name: str, data: bytes = LINE) -> str:
    path = tmp_path / "out" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def test_a_file_is_placed_once_and_the_same_content_again_is_accepted(locations) -> None:
    options = locations["options"]
    path = write_rollouts(locations["rollouts"], [orjson.loads(LINE)] * 3, options)
    data = open_byte_store(path.rsplit("/", 1)[0], options).get("rollouts.jsonl")
    url, placed = place_file(path, locations["inbox"], options)
    assert placed and url == f"{locations['inbox']}/rollouts.jsonl"
    assert open_byte_store(locations["inbox"], options).get("rollouts.jsonl") == data
    assert place_file(path, locations["inbox"], options) == (url, False)


@pytest.mark.integrity
def test_other_content_under_a_submitted_name_is_refused_naming_it(tmp_path: Path) -> None:
    inbox = str(tmp_path / "inbox")
    first = source(tmp_path, "batch.jsonl")
    url, _ = place_file(first, inbox)
    other = tmp_path / "elsewhere" / "batch.jsonl"
    other.parent.mkdir()
    other.write_bytes(LINE * 2)
    with pytest.raises(SubmitRefusedError, match=r"inbox/batch\.jsonl already holds other"):
        place_file(str(other), inbox)
    assert Path(url).read_bytes() == LINE, "the submitted file is untouched"
    record_case("other content submitted under a name already in the inbox")


@pytest.mark.parametrize(
    ("name", "data", "why"),
    [("notes.txt", LINE, r"\*\.jsonl"), ("empty.jsonl", b"", "is empty")],
)
def test_a_file_the_inbox_would_not_take_is_refused(tmp_path, name, data, why) -> None:
    with pytest.raises(SubmitRefusedError, match=why):
        place_file(source(tmp_path, name, data), str(tmp_path / "inbox"))
    assert not (tmp_path / "inbox" / name).exists()


def test_submit_announces_each_file_to_the_server(tmp_path: Path, prefect_api: str) -> None:
    from prefect.client.orchestration import get_client

    inbox = str(tmp_path / "inbox")
    (result,) = submit_files(inbox, [source(tmp_path, "announced.jsonl")])
    assert result.announced and result.run_id == run_id_for_file(result.url)

    def received() -> list[dict]:
        body = {"filter": {"event": {"name": [SUBMITTED]}}, "limit": 50}
        with get_client(sync_client=True) as client:
            events = client.request("POST", "/events/filter", json=body).json()["events"]
        return [e for e in events if e["id"] == result.event_id]

    wait_until(lambda: bool(received()), 60, "the submitted event in the server's events")
    (event,) = received()
    assert event["payload"] == {"rollouts": result.url, "run_id": result.run_id, "inbox": inbox}
    assert event["resource"]["tokcap.inbox"] == inbox


def test_tokcap_submit_prints_one_run_id_line_per_file(tmp_path: Path) -> None:
    inbox = str(tmp_path / "inbox")
    files = [source(tmp_path, "a.jsonl"), source(tmp_path, "b.jsonl", LINE * 2)]
    done = run_cli(["submit", "--inbox", inbox, *files], "")
    assert done.returncode == NOT_ANNOUNCED_EXIT, "placed, not announced: a harness can tell"
    expected = [f"run id: {run_id_for_file(f'{inbox}/{n}')}" for n in ("a.jsonl", "b.jsonl")]
    assert done.stdout.splitlines() == expected
    assert "not announced" in done.stderr, "without a server it says the event was not sent"
    refused = run_cli(["submit", "--inbox", inbox, source(tmp_path / "x", "a.jsonl", LINE * 5)], "")
    assert refused.returncode == 2 and f"{inbox}/a.jsonl" in refused.stderr


@pytest.mark.integrity
@pytest.mark.parametrize(
    ("rollouts", "run_id", "why"),
    [
        ("/data/elsewhere/a.jsonl", None, "is not a file of the inbox"),
        ("/data/inbox/sub/a.jsonl", None, "is not a file of the inbox"),
        ("/data/inbox-other/a.jsonl", None, "is not a file of the inbox"),
        ("/data/inbox/a.jsonl", "a-0000000000", "is not the run of"),
    ],
)
def test_a_file_run_refuses_an_event_naming_another_file_or_run(rollouts, run_id, why) -> None:
    from tokcap.flows.inbox import check_inbox_file

    with pytest.raises(ValueError, match=why):
        check_inbox_file(rollouts, run_id or run_id_for_file(rollouts), "/data/inbox")
    check_inbox_file("/data/inbox/a.jsonl", run_id_for_file("/data/inbox/a.jsonl"), "/data/inbox")
    record_case("an event naming a file outside the inbox or another run id")


def flow_run_events(flow_run_id: object) -> list[str]:
    """The names of the events the server recorded for one flow run."""
    from prefect.client.orchestration import get_client

    body = {"filter": {"resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}}, "limit": 50}
    with get_client(sync_client=True) as client:
        page = client.request("POST", "/events/filter", json=body).json()
    return [event["event"] for event in page["events"]]


@pytest.mark.integrity
@pytest.mark.usefixtures("prefect_api")
def test_a_refused_event_ends_refused_which_the_retrigger_does_not_expect(tmp_path) -> None:
    """The retrigger automation re-runs `prefect.flow-run.Failed` runs from their parameters,
    without the inbox check; a refused event's run must end in a state it does not expect,
    having written nothing."""
    from tokcap.flows.inbox import REFUSED, FileSettings, finalize_inbox_file

    outside = write_rollouts(str(tmp_path / "elsewhere" / "a.jsonl"), [orjson.loads(LINE)])
    dest = tmp_path / "dest"
    settings = FileSettings(
        inbox=str(tmp_path / "inbox"), store=str(tmp_path / "store"), dest=str(dest)
    )
    state = finalize_inbox_file(outside, run_id_for_file(outside), settings, return_state=True)
    assert state.is_failed() and state.name == REFUSED, state
    assert "is not a file of the inbox" in (state.message or "")
    assert not dest.exists() or not any(dest.iterdir()), "nothing was finalized"
    flow_run_id = state.state_details.flow_run_id
    wait_until(
        lambda: "prefect.flow-run.Refused" in flow_run_events(flow_run_id),
        60,
        "the server to record the run's final state as an event",
        0.5,
    )
    assert "prefect.flow-run.Failed" not in flow_run_events(flow_run_id)
    record_case("a refused event is not retriggered from its parameters")


def test_a_file_whose_event_no_server_took_is_placed_and_said_so(tmp_path: Path) -> None:
    inbox = str(tmp_path / "inbox")
    nobody = f"http://127.0.0.1:{free_port()}/api"
    done = run_cli(["submit", "--inbox", inbox, source(tmp_path, "late.jsonl")], nobody)
    assert done.returncode == NOT_ANNOUNCED_EXIT == 3, done.stderr
    assert done.stdout.splitlines() == [f"run id: {run_id_for_file(f'{inbox}/late.jsonl')}"]
    assert "late.jsonl not announced: the server did not take the event" in done.stderr
    assert "scheduled pass finalizes it" in done.stderr
    assert Path(inbox, "late.jsonl").read_bytes() == LINE
