"""The built wheel in a fresh virtualenv outside the repository is all a machine needs.

The wheel is built once per session from a copy of the source tree. The fresh virtualenv gets
tokcap only from the wheel (`--no-deps`); its third-party dependencies are seen through a
`.pth` line naming this environment's site-packages, so the test downloads nothing, and
`pip check` proves the wheel's declared requirements are met. Set
`TOKCAP_WHEEL_TEST_FULL_INSTALL=1` to install them from the package index instead (about 90 s).
Every command runs in an empty directory, against the session's Prefect test server.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client

from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import REPO, dest_records, make_batch, write_rollouts
from tests.support.servers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

FULL_INSTALL_ENV = "TOKCAP_WHEEL_TEST_FULL_INSTALL"
NOT_SOURCE = shutil.ignore_patterns(
    ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
)


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtualenv with tokcap installed from its freshly built wheel, and nothing else."""
    base = tmp_path_factory.mktemp("wheel")
    source, wheels, venv = base / "source", base / "wheels", base / "venv"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)], base, env)
    (wheel,) = wheels.glob("tokcap-*.whl")
    python = venv / "bin" / "python"
    if os.environ.get(FULL_INSTALL_ENV):
        run([sys.executable, "-m", "venv", str(venv)], base, env)
        constraints = ["-c", f"{REPO}/.ci/constraints.txt"]
        run([str(python), "-m", "pip", "install", "-q", *constraints, str(wheel)], base, env, 900)
    else:
        run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base, env)
        run([*pip, "--python", str(python), "install", "-q", "--no-deps", str(wheel)], base, env)
        (purelib,) = (venv / "lib").glob("python3*/site-packages")
        (purelib / "_tokcap_test_dependencies.pth").write_text("\n".join(site.getsitepackages()))
    yield venv


@pytest.fixture()
def elsewhere(tmp_path: Path, fresh_venv: Path, prefect_api: str) -> tuple[Path, dict[str, str]]:
    """An empty working directory and an environment with the fresh virtualenv first."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{fresh_venv / 'bin'}{os.pathsep}{env['PATH']}"
    env["PREFECT_API_URL"] = prefect_api
    return cwd, env


@pytest.fixture()
def prefect_project(elsewhere: tuple[Path, dict[str, str]]) -> tuple[Path, dict[str, str]]:
    """A working folder laid out as Prefect users lay theirs: own `flows/`, `tasks/`, `tasks.py`."""
    cwd, env = elsewhere
    for package in ("flows", "tasks"):
        (cwd / package).mkdir()
        (cwd / package / "__init__.py").write_text(f'OWNER = "the project\'s {package}"\n')
    (cwd / "flows" / "inbox.py").write_text('OWNER = "the project\'s flows.inbox"\n')
    (cwd / "tasks.py").write_text('OWNER = "the project\'s tasks.py"\n')
    return cwd, env


def test_the_wheel_installs_no_top_level_flows_or_tasks(
    fresh_venv: Path, prefect_project: tuple[Path, dict[str, str]]
) -> None:
    """The project's own names stay the project's, and tokcap's stay reachable beside them."""
    cwd, env = prefect_project
    python = str(fresh_venv / "bin" / "python")
    (purelib,) = (fresh_venv / "lib").glob("python3*/site-packages")
    assert not (purelib / "flows").exists() and not (purelib / "tasks").exists()
    assert (purelib / "tokcap" / "flows" / "inbox.py").is_file()
    code = (
        "import flows.inbox, tasks, tokcap.flows.inbox as f, tokcap.tasks.receipts as r; "
        "print(flows.inbox.OWNER); print(tasks.OWNER); print(f.__file__); print(r.__file__)"
    )
    lines = run([python, "-c", code], cwd, env).stdout.splitlines()
    assert lines[:2] == ["the project's flows.inbox", "the project's tasks"]
    assert all(line.startswith(str(purelib)) for line in lines[2:]), lines


def test_the_wheel_carries_the_code_and_its_declared_requirements_are_met(
    fresh_venv: Path, elsewhere: tuple[Path, dict[str, str]]
) -> None:
    cwd, env = elsewhere
    python = str(fresh_venv / "bin" / "python")
    where = run(
        [
            python,
            "-c",
            "import capture_core, tokcap.tasks as t, tokcap.flows as f; "
            "print(f.__file__, t.__file__)",
        ],
        cwd,
        env,
    )
    assert all(path.startswith(str(fresh_venv)) for path in where.stdout.split()), where.stdout
    run([python, "-m", "pip", "check"], cwd, env)
    located = run(["tokcap", "deployments"], cwd, env).stdout.strip()
    assert located.startswith(str(fresh_venv))
    assert Path(located).read_text() == Path(REPO, "deployments", "prefect.yaml").read_text()


def test_installed_tokcap_runs_the_demo_and_a_finalize_from_any_directory(
    tmp_path: Path, elsewhere: tuple[Path, dict[str, str]]
) -> None:
    cwd, env = elsewhere
    demo = run(["tokcap", "demo", "--workdir", str(tmp_path / "demo")], cwd, env)
    assert any(line.split() == ["handed", "off", "7"] for line in demo.stdout.splitlines())
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), make_batch(TokenCaptureStore(store), 3))
    locations = ["--rollouts", rollouts, "--store", store, "--dest", dest]
    run(["tokcap", "finalize", *locations, "--run-id", "from-wheel"], cwd, env)
    assert len(dest_records(dest, "from-wheel")) == 3


def registered() -> dict:
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        return {f"{flows[d.flow_id]}/{d.name}": d for d in client.read_deployments()}


def test_installed_tokcap_deploys_the_shipped_deployments_and_a_worker_runs_them(
    tmp_path: Path, fresh_venv: Path, prefect_project: tuple[Path, dict[str, str]]
) -> None:
    """The worker runs in a Prefect project's folder (own `flows/`, `tasks/`, `tasks.py`)."""
    cwd, env = prefect_project
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), make_batch(TokenCaptureStore(store), 3))
    env = {**env, "TOKCAP_INBOX": str(tmp_path / "inbox"), "TOKCAP_STORE": store}
    env["TOKCAP_DEST"] = dest
    prefect = [str(fresh_venv / "bin" / "python"), "-m", "prefect"]
    run(
        [*prefect, "work-pool", "create", "tokcap-process", "--type", "process", "--overwrite"],
        cwd,
        env,
    )
    located = run(["tokcap", "deployments"], cwd, env).stdout.strip()
    run([*prefect, "--no-prompt", "deploy", "--all", "--prefect-file", located], cwd, env)

    deployments = registered()
    shipped = {
        "finalize-inbox/inbox": "tokcap.flows.inbox:finalize_inbox",
        "finalize-inbox-file/inbox-file": "tokcap.flows.inbox:finalize_inbox_file",
        "finalize-run/finalize-run": "tokcap.flows.finalize:finalize_run",
        "finalize-run/finalize-run-strict": "tokcap.flows.finalize:finalize_run",
        "dispatch-clear/dispatch-clear": "tokcap.flows.clear:dispatch_clear",
        "sweep-retired/sweep-retired": "tokcap.flows.sweep:sweep_retired_captures",
        "retire-uploaded/retire-uploaded": "tokcap.flows.finalize:retire_uploaded",
        "retrigger-failed/retrigger-failed": "tokcap.flows.retrigger:retrigger_failed",
    }
    assert {name: deployments[name].entrypoint for name in shipped} == shipped
    assert all(not deployments[name].pull_steps for name in shipped), "no path to a checkout"
    inbox = deployments["finalize-inbox/inbox"]
    assert [s.schedule.cron for s in inbox.schedules] == ["*/10 * * * *"]
    settings = inbox.parameters["settings"]
    assert settings["store"] == store and settings["dest"] == dest
    sweep = deployments["sweep-retired/sweep-retired"]
    assert [s.schedule.cron for s in sweep.schedules] == ["17 3 * * *"]
    assert sweep.parameters == {"store": store, "older_than": "2d"}

    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run_from_deployment(
            deployments["finalize-run/finalize-run"].id,
            parameters={"rollouts": rollouts, "run_id": "deployed"},
        )
    worker = [*prefect, "worker", "start", "--pool", "tokcap-process", "--run-once"]
    output = run(worker, cwd, env).stdout
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run.id).state
    assert state is not None and state.is_completed(), output[-3000:]
    assert len(dest_records(dest, "deployed")) == 3


def test_installed_tokcap_serves_the_scheduled_inbox(
    tmp_path: Path, elsewhere: tuple[Path, dict[str, str]]
) -> None:
    cwd, env = elsewhere
    inbox = str(tmp_path / "served-inbox")
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    locations = ["--inbox", inbox, "--store", store, "--dest", dest]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        served = subprocess.Popen(
            ["tokcap", "serve", *locations, "--cron", "*/5 * * * *"],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def inbox_cron() -> list[str]:
        assert served.poll() is None, f"serve exited: {log.read_text()[-2000:]}"
        found = registered().get("finalize-inbox/inbox")
        if found is None or found.parameters.get("settings", {}).get("inbox") != inbox:
            return []
        return [s.schedule.cron for s in found.schedules]

    try:
        wait_until(lambda: inbox_cron() == ["*/5 * * * *"], 120, "serve to register", 0.5)
    finally:
        served.terminate()
        served.wait(timeout=60)


def test_every_docs_reference_the_output_prints_resolves_in_the_installed_wheel(
    fresh_venv: Path, elsewhere: tuple[Path, dict[str, str]]
) -> None:
    """The wheel has no `docs/` beside the user's files: each `tokcap docs TOPIC#SECTION` the
    product prints (`tests/cli/test_docs_command.py` walks them) prints from the package."""
    from tests.cli.test_docs_command import docs_references

    cwd, env = elsewhere
    references = docs_references()
    code = (
        "import sys; from tokcap.flows.cli.docs import page, PACKAGE; import importlib; "
        "print(importlib.import_module(PACKAGE).__file__); "
        "[print(r, len(page(r))) for r in sys.argv[1:]]"
    )
    python = str(fresh_venv / "bin" / "python")
    lines = run([python, "-c", code, *references], cwd, env).stdout.splitlines()
    assert lines[0].startswith(str(fresh_venv)), lines[0]
    printed = dict(line.rsplit(" ", 1) for line in lines[1:])
    assert sorted(printed) == references and all(int(n) > 0 for n in printed.values())
    section = run(["tokcap", "docs", "mask-reasons#lost-call"], cwd, env).stdout
    assert section.startswith("## lost call\n"), section[:200]
