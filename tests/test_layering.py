"""The layering contract, checked over every module's imports (see docs/architecture.md).

capture_core imports no Prefect, tasks or flows; tasks import no flows; nothing in the
product imports tests or bench.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "capture_core": {"prefect", "prefect_dask", "tasks", "flows", "tests", "bench"},
    "tasks": {"flows", "tests", "bench"},
    "flows": {"tests", "bench"},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level package of every absolute import in a module, wherever it appears."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def modules(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_one_way(layer: str) -> None:
    found = modules(layer)
    assert found, f"no modules found under {layer}/"
    crossings = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & FORBIDDEN[layer])
        for path in found
    }
    assert {path: bad for path, bad in crossings.items() if bad} == {}


def test_every_package_is_checked_and_shipped() -> None:
    """Sub-packages are layers' modules too: the check walks them and the wheel lists them."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for layer in FORBIDDEN:
        for init in (ROOT / layer).rglob("__init__.py"):
            package = ".".join(init.parent.relative_to(ROOT).parts)
            assert f'"{package}"' in pyproject, f"{package} is missing from pyproject packages"
    checked = {str(path.relative_to(ROOT)) for layer in FORBIDDEN for path in modules(layer)}
    for module in ("capture_core/storage/base.py", "capture_core/testing/contracts.py"):
        assert module in checked


def test_storage_imports_nothing_above_it() -> None:
    """The storage package sits beneath the capture protocol: of capture_core it imports only
    itself and the errors, so any module can use it without an import cycle."""
    storage = ROOT / "capture_core" / "storage"
    for path in storage.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        imported = {
            node.module
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.ImportFrom) and node.module
        }
        above = {
            m
            for m in imported
            if m.startswith("capture_core.")
            and not m.startswith(("capture_core.storage", "capture_core.errors"))
        }
        assert above == set(), f"{path.name} imports {above}"


def test_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from prefect import flow\n    import tests.servers\n")
    assert imported_packages(module) == {"prefect", "tests"}
