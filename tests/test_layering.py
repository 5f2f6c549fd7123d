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


def test_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from prefect import flow\n    import tests.servers\n")
    assert imported_packages(module) == {"prefect", "tests"}
