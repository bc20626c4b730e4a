"""The xApp is composed from typed parts (issue 44 item 2), read statically with :mod:`ast`:
the composition root (``xapp/app.py``, the handlers), the RMR receive loop, the action dispatcher
and the store annotate nothing as ``Any`` (their collaborators have Protocols in
:mod:`xapp.ports`, or a concrete type)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.annotations import any_annotations

ROOT = Path(__file__).resolve().parents[2]

#: files whose annotations must not say ``Any``
TYPED = ("xapp/app.py", "xapp/e2/rmrloop.py", "xapp/dispatch.py", "xapp/store.py")
#: (file, function or attribute) -> why ``Any`` stays there; empty today
ALLOWED_ANY: dict[tuple[str, str], str] = {}


def test_the_checker_finds_any():
    src = ("from typing import Any\nimport typing\n"
           "def f(a: int, *, b: 'dict[str, Any]') -> None: ...\n"
           "def g(a: int) -> typing.Any: ...\n"
           "def h(**kw: Any) -> None: ...\n"
           "def ok(a: object) -> int: ...\n"
           "x: list[Any] = []\ny: int = 0\n")
    assert any_annotations(src) == [(3, "f"), (4, "g"), (5, "h"), (7, "x")]


def test_no_any_in_the_composition_root_and_the_rmr_loop():
    left = []
    for rel in TYPED + tuple(str(p.relative_to(ROOT)) for p in sorted((ROOT / "xapp/handlers").glob("*.py"))):
        for line, where in any_annotations((ROOT / rel).read_text()):
            if (rel, where) not in ALLOWED_ANY:
                left.append(f"{rel}:{line} {where}")
    assert left == []


def function_lines(source: str, name: str) -> int:
    """Lines of the module-level function ``name`` in ``source`` (decorators aside)."""
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise LookupError(name)


def test_main_parses_builds_and_runs_in_under_40_lines():
    assert function_lines("def main():\n    a = 1\n\n    return a\n", "main") == 4
    assert function_lines((ROOT / "xapp/main.py").read_text(), "main") < 40
