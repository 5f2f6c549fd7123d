"""The layering contract, checked over every module's imports (see docs/architecture.md).

Every import counts, also one inside a function. capture_core's layers point one way:
storage imports no other layer; store imports storage; builder imports neither; run may
import builder, store and storage; rows (the trainer's side) may import run's handoff modules
(`ROWS_MAY_IMPORT_RUN`), and the run modules `RUN_MAY_IMPORT_ROWS` names may import the row
writer back; the operator's views (`capture_core.operator`) may import run, rows and what
they build on, and nothing below imports them; the gateway may import store and storage;
each may use the vocabulary (records, ids, protocols, errors). No layer imports the seed
API (consumer, delivery, config, dataset, the package root) or the test kit. capture_core
imports no Prefect, tasks or flows; tasks import no flows; nothing in the product imports
tests or bench. No import circle anywhere.
Inside the run layer, each module imports only the run modules `RUN_MAY_IMPORT` declares.
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
LAYERS = {"storage", "store", "builder", "run", "rows", "operator", "gateway"}
API = {"consumer", "delivery", "config", "dataset", ""}  # "" is the package root
MAY_IMPORT = {
    "storage": {"storage", "errors"},
    "store": {"store", "storage"} | VOCABULARY,
    "builder": {"builder"} | VOCABULARY,
    "run": {"run", "rows", "builder", "store", "storage"} | VOCABULARY,
    "rows": {"rows", "run", "builder", "storage"} | VOCABULARY,
    # The operator's views read what the handoff and the rows wrote; nothing below reads them.
    "operator": {"operator", "run", "rows", "builder", "store", "storage"} | VOCABULARY,
    # The capture gateway writes through the store's API; nothing below imports it.
    "gateway": {"gateway", "store", "storage"} | VOCABULARY,
    **{name: VOCABULARY for name in VOCABULARY},
}


RUN = "capture_core.run"
RUN_MAY_IMPORT: dict[str, set[str]] = {
    # A run's vocabulary: its files, its input, its settings, its words. Nothing above.
    "__init__": set(),
    "crash_points": set(),
    "concurrency": set(),
    "retry_delays": set(),
    "finalize": set(),
    "ledger_versions": set(),
    "task_groups": set(),
    "rollout_io": {"task_groups"},
    "run_layout": {"rollout_io", "task_groups"},  # the manifest's group cap default
    "receipt": {"rollout_io", "run_layout"},
    # The batch path: finalize, hand off, read back as certified, retire by receipt.
    "batch_finalize": {
        "concurrency",
        "finalize",
        "receipt",
        "rollout_io",
        "ledger_versions",
        "run_layout",
    },
    "part_upload": {"batch_finalize", "crash_points", "receipt"},
    "verified_read": {"receipt"},
    "retire_verdict": {"finalize", "receipt"},
    "retirement": {"concurrency", "crash_points", "receipt", "retire_verdict", "verified_read"},
    # Claims on the inbox's files; whether a claimed run is complete is the caller's view.
    "inbox": {"rollout_io", "run_layout"},
    "capture_source": {"crash_points"},
    "store_check": {"capture_source", "finalize", "rollout_io", "run_layout"},
}
"""Which run modules each module of `capture_core.run` may import (by last name).

Why a table: the run layer is one package, so the layer rules cannot tell its modules apart.
Its vocabulary (layout, input, settings, the receipt model) imports nothing above it; the
batch path (finalize, upload, verified read, retirement) never imports a report or a reader,
so a change to what a run prints cannot change what it hands off or retires; the accounts
and readers sit on top. A new edge is a decision: make it here, with the code that needs it.
"""


ROWS = "capture_core.rows"
ROWS_MAY_IMPORT_RUN = {"crash_points", "receipt", "run_layout", "verified_read"}
"""The run modules the rows may build on: a run's layout, its receipts, the verified read.
Never a report, the inbox or the batch path, so what a run prints or how it finalizes
cannot change what a trainer reads."""
RUN_MAY_IMPORT_ROWS: dict[str, set[str]] = {
    # The handoff writes a batch's rows part beside its records part.
    "batch_finalize": {"trainer_rows"},
    "part_upload": {"trainer_rows"},
}
"""The only edges from run into rows: the row writer beside the records part. (The
operator's views, `capture_core.operator`, read the cursors from above.)"""


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


def run_layer_crossings(graph: dict[str, set[str]], may_import: dict[str, set[str]]) -> list[str]:
    """What in `graph` breaks the run layer's table `may_import`, each in words.

    A run module missing from the table, and every edge between run modules the table does
    not declare, is reported with the edge and what to do about it.
    """

    def short(module: str) -> str:
        return "__init__" if module == RUN else module.removeprefix(RUN + ".")

    found = []
    for module in sorted(m for m in graph if m == RUN or m.startswith(RUN + ".")):
        name = short(module)
        if name not in may_import:
            found.append(
                f"{module} has no row in RUN_MAY_IMPORT (tests/test_layering.py): add one "
                "naming the run modules it may import"
            )
            continue
        for target in sorted(graph[module]):
            if (target == RUN or target.startswith(RUN + ".")) and short(target) not in may_import[
                name
            ]:
                found.append(
                    f"{module} imports {target}, an edge RUN_MAY_IMPORT does not declare: "
                    "import what you need from a module the row allows (or move the shared "
                    f"piece down to one), or, if this edge is right, add {short(target)!r} "
                    f"to RUN_MAY_IMPORT[{name!r}] and say why there"
                )
    return found


def test_run_modules_import_only_what_their_row_allows() -> None:
    """Every import between run modules, function-level ones included, is declared."""
    assert run_layer_crossings(import_graph(), RUN_MAY_IMPORT) == []


def test_run_table_names_no_edge_or_module_that_is_gone() -> None:
    """The table is the run layer's map: a declared edge no module uses any more is removed."""
    graph = import_graph()
    run = {m: graph[m] for m in graph if m == RUN or m.startswith(RUN + ".")}
    present = {"__init__" if m == RUN else m.removeprefix(RUN + ".") for m in run}
    assert set(RUN_MAY_IMPORT) - present == set()
    used = {
        ("__init__" if m == RUN else m.removeprefix(RUN + ".")): {
            t.removeprefix(RUN + ".") for t in targets if t.startswith(RUN + ".")
        }
        for m, targets in run.items()
    }
    unused = {name: sorted(allowed - used[name]) for name, allowed in RUN_MAY_IMPORT.items()}
    assert {name: gone for name, gone in unused.items() if gone} == {}


def test_run_table_check_reports_a_forbidden_edge_and_an_unlisted_module() -> None:
    graph = {
        f"{RUN}.receipt": {f"{RUN}.retirement", f"{RUN}.run_layout", "capture_core.errors"},
        f"{RUN}.retirement": {f"{RUN}.receipt"},
        f"{RUN}.newcomer": set(),
        "capture_core.store.base": {f"{RUN}.receipt"},
    }
    table = {"receipt": {"run_layout"}, "retirement": {"receipt"}}
    found = run_layer_crossings(graph, table)
    assert len(found) == 2, found
    assert found[0].startswith(f"{RUN}.newcomer has no row in RUN_MAY_IMPORT")
    assert found[1].startswith(f"{RUN}.receipt imports {RUN}.retirement, an edge")
    assert "add 'retirement' to RUN_MAY_IMPORT['receipt']" in found[1]
    assert run_layer_crossings(graph, {**table, "newcomer": set()}) == found[1:]


def rows_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Edges between run and rows that `ROWS_MAY_IMPORT_RUN` and `RUN_MAY_IMPORT_ROWS` do
    not declare, each in words."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            upward = module.startswith(ROWS + ".") and target.startswith(RUN + ".")
            if upward and target.removeprefix(RUN + ".") not in ROWS_MAY_IMPORT_RUN:
                found.append(f"{module} imports {target}: rows build on run's handoff only")
            if module.startswith(RUN + ".") and target.startswith(ROWS + "."):
                allowed = RUN_MAY_IMPORT_ROWS.get(module.removeprefix(RUN + "."), set())
                if target.removeprefix(ROWS + ".") not in allowed:
                    found.append(f"{module} imports {target}: declare it in RUN_MAY_IMPORT_ROWS")
    return found


def test_run_and_rows_import_each_other_only_as_declared() -> None:
    """The trainer's side reads a run's handoff; a run writes rows and shows acks, no more."""
    assert rows_crossings(import_graph()) == []
