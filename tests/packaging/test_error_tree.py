"""One error tree: capture_core raises only classes under TokcapError (see capture_core/errors.py).

A raise of a builtin exception class in capture_core fails here, so the tree cannot drift.
Each class that replaced a builtin keeps it as a base: older `except ValueError` still holds.
"""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import pytest
from pydantic import ValidationError

import capture_core.errors as errors
from capture_core.errors import TokcapError, error_text, is_transient
from capture_core.records import TokenEntry

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


def _is_abstract_stub(function: ast.AST) -> bool:
    """A method whose body is a docstring and `raise NotImplementedError`: a subclass hook."""
    if not isinstance(function, ast.FunctionDef):
        return False
    body = [node for node in function.body if not isinstance(node, ast.Expr)]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def builtin_raises(path: Path) -> list[str]:
    """`path:line: Name` for every `raise Name(...)` or `raise Name` of a builtin exception."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    stubs = {id(node.body[-1]) for node in ast.walk(tree) if _is_abstract_stub(node) and node.body}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if not isinstance(raised, ast.Name) or raised.id not in BUILTIN_EXCEPTIONS:
            continue
        if raised.id == "NotImplementedError" and id(node) in stubs:
            continue
        found.append(
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:"
            f"{node.lineno}: {raised.id}"
        )
    return found


def test_capture_core_raises_no_builtin_exception_directly() -> None:
    found = [
        hit
        for path in sorted((ROOT / "capture_core").rglob("*.py"))
        for hit in builtin_raises(path)
    ]
    assert found == [], "raise a class of capture_core/errors.py instead:\n" + "\n".join(found)


def test_scan_catches_a_builtin_raise(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    raise ValueError('bad')\n"
        "def g():\n    raise KeyError\n"
        "class C:\n    def hook(self):\n        '''A hook.'''\n        raise NotImplementedError\n"
        "def h(x):\n    if x:\n        raise NotImplementedError('not yet')\n    return x\n"
    )
    hits = [hit.split(": ")[-1] for hit in builtin_raises(module)]
    assert hits == ["ValueError", "KeyError", "NotImplementedError"]


def _error_classes() -> list[type[BaseException]]:
    return [
        value
        for value in vars(errors).values()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    ]


def test_every_error_is_under_tokcap_error_and_in_the_drawn_tree() -> None:
    doc = errors.__doc__ or ""
    for cls in _error_classes():
        assert issubclass(cls, TokcapError), cls
        assert f"── {cls.__name__} " in doc or cls is TokcapError, f"{cls.__name__} not drawn"


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (errors.InvalidInputError, ValueError),
        (errors.InvalidRecordError, ValueError),
        (errors.WrongTypeError, TypeError),
        (errors.PrefixContiguityError, AssertionError),
        (errors.LocationMissingError, FileNotFoundError),
        (errors.LocationNotWritableError, PermissionError),
        (errors.LocationNotADirectoryError, NotADirectoryError),
    ],
)
def test_a_replacing_class_keeps_its_builtin_and_its_recorded_name(
    cls: type[BaseException], builtin: type[BaseException]
) -> None:
    with pytest.raises(builtin):
        raise cls("the message")
    assert error_text(cls("the message")) == f"{builtin.__name__}: the message"
    assert not is_transient(cls("the message"))


def test_error_text_names_other_tree_errors_by_their_own_class() -> None:
    assert error_text(errors.CaptureConflictError("x")) == "CaptureConflictError: x"
    assert error_text(errors.StoreUnavailableError("x")) == "StoreUnavailableError: x"
    assert error_text(KeyError("k")) == "KeyError: 'k'"


def test_a_validator_raising_a_tree_error_still_gives_a_validation_error() -> None:
    fields = {"rollout_id": "r", "model_call_id": "c", "prompt_token_ids": [1]}
    with pytest.raises(ValidationError, match="holds the negative id -5"):
        TokenEntry(**fields, generation_token_ids=[-5], generation_log_probs=[-0.1])
    with pytest.raises(ValidationError, match="schema_version 99 is newer"):
        TokenEntry.model_validate(
            {
                **fields,
                "generation_token_ids": [5],
                "generation_log_probs": [-0.1],
                "schema_version": 99,
            }
        )
