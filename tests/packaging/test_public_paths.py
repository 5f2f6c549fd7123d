"""Every name the README promises under "Same functions, same signatures" imports from there."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
while not (ROOT / "pyproject.toml").exists():
    ROOT = ROOT.parent


def promised_names() -> dict[str, list[str]]:
    """The README's paragraph, read as {module: [names]} in the order it lists them."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("**Same functions, same signatures.**")
    paragraph = readme[start : readme.index("replace their", start)]
    promised: dict[str, list[str]] = {}
    pieces = re.split(r"`(capture_core(?:\.\w+)*)`", paragraph)
    for module, listed in zip(pieces[1::2], pieces[2::2], strict=True):
        promised[module] = re.findall(r"`(\w+)(?:\(|`)", listed)
    return promised


def test_the_readme_lists_the_seed_modules() -> None:
    promised = promised_names()
    modules = {"delivery", "consumer", "builder", "records", "config"}
    assert {f"capture_core.{m}" for m in modules} <= set(promised)
    assert all(promised[f"capture_core.{m}"] for m in modules), promised
    assert "run_builder" in promised["capture_core.builder"]


def test_every_promised_name_imports_from_its_module() -> None:
    missing = [
        f"{module}.{name}"
        for module, names in promised_names().items()
        for name in names
        if not hasattr(importlib.import_module(module), name)
    ]
    assert missing == []


def test_the_store_and_records_keep_their_paths() -> None:
    from capture_core import TokenCaptureStore as from_root
    from capture_core.records import TokenEntry
    from capture_core.store import TokenCaptureStore

    assert from_root is TokenCaptureStore and TokenEntry.__module__ == "capture_core.records"
    assert importlib.import_module("capture_core.config").TokenIdCaptureConfig is not None
