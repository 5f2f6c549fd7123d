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


@pytest.mark.integrity
def test_an_unreadable_version_source_names_the_option_and_makes_no_store(
    capsys: Any, tmp_path: Any
) -> None:
    """It told a gateway user to edit "the sink's settings" (a gateway has none), and it had
    made the store folder before it refused the command."""
    store = tmp_path / "new" / "store"
    code, err = run(
        capsys, "--engine", ENGINE, "--store", str(store),
        "--weight-version-source", str(tmp_path / "nope"),
    )  # fmt: skip
    assert code == 2 and "cannot be read" in err, err
    assert "sink's settings" not in err
    assert "start the gateway without --weight-version-source" in err, err
    assert not (tmp_path / "new").exists(), "a refused gateway made its store folder"


def test_a_store_folder_that_cannot_be_made_says_what_to_fix(capsys: Any, tmp_path: Any) -> None:
    """It was only `--store: [Errno 2] No such file or directory: '/proc/x'`."""
    code, err = run(capsys, "--engine", ENGINE, "--store", "/proc/tokcap-store")
    assert code == 2, err
    assert err.startswith("tokcap gateway: --store: the folder /proc/tokcap-store cannot be made")
    assert "create it first" in err, err


def test_a_port_in_use_leaves_no_store_folder(capsys: Any, tmp_path: Any) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        store = tmp_path / "store"
        code, err = run(capsys, "--engine", ENGINE, "--store", str(store), "--port", port)
    assert code == 2 and "--host/--port" in err, err
    assert not store.exists()


def test_the_help_uses_the_documented_placeholders_and_names_the_engine_key(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        main(["gateway", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    for shown in (
        "--engine URL", "--store URL", "--replica NAME", "--api-key KEY", "--max-body-bytes N",
        "--engine-timeout S", "--shutdown-grace S",
    ):  # fmt: skip
        assert shown in usage, shown
    assert "TOKCAP_ENGINE_API_KEY" in usage
