"""`tokcap gateway` checks its arguments before it starts: a usage error names the option
(exit 2), and nothing is served."""

from __future__ import annotations

from typing import Any

import pytest

from tokcap.flows.cli.main import main

ENGINE = "http://127.0.0.1:9"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["gateway", *args])
    captured = capsys.readouterr()
    assert captured.out == ""  # never the listening line
    return code, captured.err


def test_an_engine_that_is_no_url_is_refused(capsys: Any, tmp_path: Any) -> None:
    code, err = run(capsys, "--engine", "localhost:8000", "--store", str(tmp_path))
    assert code == 2 and "--engine" in err and "http" in err


def test_an_engine_url_ending_in_v1_is_refused(capsys: Any, tmp_path: Any) -> None:
    code, err = run(capsys, "--engine", "http://127.0.0.1:8000/v1/", "--store", str(tmp_path))
    assert code == 2 and "--engine" in err and "'http://127.0.0.1:8000'" in err


@pytest.mark.parametrize("port", ["70000", "-1", "eighty"])
def test_a_port_that_is_no_port_is_refused(capsys: Any, tmp_path: Any, port: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["gateway", "--engine", ENGINE, "--store", str(tmp_path), "--port", port])
    assert exit_.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_a_store_that_cannot_be_written_is_refused(capsys: Any, tmp_path: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, err = run(capsys, "--engine", ENGINE, "--store", str(blocker / "store"))
    assert code == 2 and "--store" in err


def test_a_version_source_that_cannot_be_read_is_refused(capsys: Any, tmp_path: Any) -> None:
    source = tmp_path / "weight_version"
    source.write_text("not a version")
    code, err = run(
        capsys, "--engine", ENGINE, "--store", str(tmp_path / "s"),
        "--weight-version-source", str(source),
    )  # fmt: skip
    assert code == 2 and "--weight-version-source" in err and "not a weight version" in err


def test_another_host_needs_a_key(capsys: Any, tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("TOKCAP_GATEWAY_API_KEY", raising=False)
    code, err = run(capsys, "--engine", ENGINE, "--store", str(tmp_path), "--host", "10.1.2.3")
    assert code == 2 and "--host" in err and "--api-key" in err
