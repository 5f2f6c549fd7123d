"""The layering contract, checked over every module's imports (see docs/architecture.md).

Every import counts, also one inside a function. capture_core's layers point one way:
storage imports no other layer; store imports storage; builder imports neither; run may
import builder, store and storage; each may use the vocabulary (records, ids, protocols,
errors). No layer imports the seed API (consumer, delivery, config, dataset, the package
root) or the test kit. capture_core imports no Prefect, tasks or flows; tasks import no
flows; nothing in the product imports tests or bench. No import circle anywhere.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
while not (ROOT / "pyproject.toml").exists():
    ROOT = ROOT.parent
PRODUCT = ("capture_core", "tasks", "flows")
FORBIDDEN = {
    "capture_core": {"prefect", "prefect_dask", "tasks", "flows", "tests", "bench"},
    "tasks": {"flows", "tests", "bench"},
    "flows": {"tests", "bench"},
}
VOCABULARY = {"records", "ids", "protocols", "errors"}
LAYERS = {"storage", "store", "builder", "run"}
API = {"consumer", "delivery", "config", "dataset", ""}  # "" is the package root
MAY_IMPORT = {
    "storage": {"storage", "errors"},
    "store": {"store", "storage"} | VOCABULARY,
    "builder": {"builder"} | VOCABULARY,
    "run": {"run", "builder", "store", "storage"} | VOCABULARY,
    **{name: VOCABULARY for name in VOCABULARY},
}


def module_name(path: Path) -> str:
    inside = path.is_relative_to(ROOT)
    parts = list((path.relative_to(ROOT) if inside else Path(path.name)).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> dict[str, Path]:
    """Every module of capture_core, tasks and flows, by dotted name."""
    return {
        module_name(path): path
        for layer in PRODUCT
        for path in sorted((ROOT / layer).rglob("*.py"))
    }


INSTALLED = {"tokcap.flows": "flows", "tokcap.tasks": "tasks"}


def folder_name(module: str) -> str:
    """The repository name of an imported module: `tokcap.flows.x` is the folder `flows.x`."""
    for installed, folder in INSTALLED.items():
        if module == installed or module.startswith(installed + "."):
            return folder + module[len(installed) :]
    return module


def imports_of(path: Path, known: set[str] | None = None) -> set[str]:
    """Every module a file imports, wherever the import is (function bodies included).

    `from package import name` names the submodule when `name` is one of `known`, else
    the package; a relative import is resolved against the file's own package. Installed
    names are given as the folders they come from (`tokcap.flows.x` as `flows.x`).
    """
    return {folder_name(name) for name in _spelled_imports(path, known or set())}


def _spelled_imports(path: Path, known: set[str]) -> set[str]:
    """The imports as the file spells them; the repository uses no relative import."""
    own = module_name(path).split(".")
    package = own if path.name == "__init__.py" else own[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                dotted = f"{base}.{alias.name}"
                found.add(dotted if folder_name(dotted) in known else base)
    return found


def imported_packages(path: Path) -> set[str]:
    """Top-level package of every import in a module, wherever it appears."""
    return {name.split(".")[0] for name in imports_of(path)}


def part_of(module: str) -> str | None:
    """The capture_core layer, vocabulary module or API module a module belongs to."""
    if module == "capture_core":
        return ""
    if not module.startswith("capture_core."):
        return None
    return module.split(".")[1]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_one_way(layer: str) -> None:
    found = sorted((ROOT / layer).rglob("*.py"))
    assert found, f"no modules found under {layer}/"
    crossings = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & FORBIDDEN[layer])
        for path in found
    }
    assert {path: bad for path, bad in crossings.items() if bad} == {}


def test_capture_core_layers_point_one_way() -> None:
    """Each layer imports only what sits beneath it, never the seed API or the test kit."""
    modules = product_modules()
    crossings: dict[str, list[str]] = {}
    for module, path in modules.items():
        part = part_of(module)
        if part not in MAY_IMPORT:
            continue
        bad = sorted(
            name
            for name in imports_of(path, set(modules))
            if name.startswith("capture_core") and part_of(name) not in MAY_IMPORT[part]
        )
        if bad:
            crossings[module] = bad
    assert crossings == {}


def test_every_module_of_capture_core_has_a_place() -> None:
    """The top level holds only the seed API and its vocabulary; the rest lives in a layer."""
    top = {p.stem for p in (ROOT / "capture_core").glob("*.py")} - {"__init__"}
    packages = {p.parent.name for p in (ROOT / "capture_core").glob("*/__init__.py")}
    assert top <= (API | VOCABULARY) - {""}, top - (API | VOCABULARY)
    assert packages == LAYERS | {"testing", "records"}


def import_graph() -> dict[str, set[str]]:
    modules = product_modules()
    known = set(modules)
    return {
        module: {name for name in imports_of(path, known) if name in known and name != module}
        for module, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` as a path that returns to its start, or `None`."""
    state: dict[str, int] = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        path = [start]
        state[start] = 1
        while stack:
            node, pending = stack[-1]
            if not pending:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            child = pending.pop(0)
            if state.get(child) == 1:
                return [*path[path.index(child) :], child]
            if not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, sorted(graph[child])))
    return None


def test_no_import_circle_in_capture_core_tasks_or_flows() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_every_package_is_checked_and_shipped() -> None:
    """Sub-packages are layers' modules too: the check walks them and the wheel lists them."""
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = set(shipped["tool"]["setuptools"]["packages"])
    folders = {folder: name for name, folder in INSTALLED.items()}
    for layer in FORBIDDEN:
        for init in (ROOT / layer).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            package = ".".join([folders.get(parts[0], parts[0]), *parts[1:]])
            assert package in packages, f"{package} is missing from pyproject packages"
    checked = set(product_modules())
    for module in ("capture_core.storage.base", "capture_core.testing.contracts"):
        assert module in checked


CLAIM = re.compile(
    r"this module (?:imports only|imports nothing beyond|imports no|does not import|"
    r"imports nothing from) (.*?)(?=\.\s|\.$|[:;]|$)",
    re.IGNORECASE,
)
WORDS = {
    "prefect": "prefect",
    "storage": "capture_core.storage",
    "store": "capture_core.store",
    "builder": "capture_core.builder",
    "fsspec": "fsspec",
    "s3fs": "s3fs",
}


def _named(module: str, named: set[str]) -> bool:
    """Whether a claim names the module, or the package it is part of (`records` names
    `capture_core.records.served`)."""
    return any(module == a or module.endswith("." + a) or f".{a}." in f".{module}" for a in named)


def claim_violations(text: str, imported: set[str]) -> set[str]:
    """The imports a docstring claim ("This module imports only `x`", "...no Prefect") denies."""
    named = set(re.findall(r"`([\w.]+)`", text))
    project = {n for n in imported if n.split(".")[0] in PRODUCT}
    if "nothing from the project" in text.lower():
        return project
    if "standard library" in text.lower():
        extra = {w for w in re.findall(r"\w+", text.lower()) if w in ("pydantic", "orjson")}
        others = {n for n in imported if n.split(".")[0] not in sys.stdlib_module_names}
        return {n for n in others if n.split(".")[0] not in extra and not _named(n, named)}
    if "only" in text.lower():
        return {n for n in project if not _named(n, named)}
    denied = {WORDS[w] for w in re.findall(r"\w+", text.lower()) if w in WORDS}
    return {n for n in imported for d in denied if n == d or n.startswith(d + ".")}


def test_module_docstrings_claim_only_what_they_import() -> None:
    """ "This module imports only `x`" (or no Prefect, nothing beyond...) is checked."""
    modules = product_modules()
    wrong = {}
    for module, path in modules.items():
        doc = " ".join(
            (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").split()
        )
        for claim in CLAIM.finditer(doc):
            bad = claim_violations(claim.group(0), imports_of(path, set(modules)))
            if bad:
                wrong[f"{module}: {claim.group(0)}"] = sorted(bad)
    assert wrong == {}


def test_claim_checker_catches_a_false_claim() -> None:
    imported = {"capture_core.records", "capture_core.storage", "orjson", "os"}
    assert claim_violations("This module imports only `records`", imported) == {
        "capture_core.storage"
    }
    assert claim_violations(
        "This module does not import Prefect or any storage backend", imported
    ) == {"capture_core.storage"}
    assert claim_violations(
        "This module imports nothing beyond the standard library", imported
    ) == {
        "capture_core.records",
        "capture_core.storage",
        "orjson",
    }


def test_nothing_imports_flows_or_tasks_by_their_folder_names() -> None:
    """The wheel installs them as `tokcap.flows` and `tokcap.tasks`; no top-level name exists."""
    spelled = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _spelled_imports(path, set()) if n.split(".")[0] in ("flows", "tasks")
        )
        for top in (*PRODUCT, "tests", "bench")
        for path in sorted((ROOT / top).rglob("*.py"))
    }
    assert {path: names for path, names in spelled.items() if names} == {}


def test_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from prefect import flow\n    import tests.servers\n")
    assert imported_packages(module) == {"prefect", "tests"}


def test_cycle_finder_reports_the_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
