"""The xApp is composed from typed parts (issue 44 item 2), read statically with :mod:`ast`:
the composition root (``xapp/app.py``, the handlers) and the RMR receive loop annotate nothing as
``Any`` (their collaborators have Protocols in :mod:`xapp.ports`, or a concrete type)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: files whose annotations must not say ``Any``
TYPED = ("xapp/app.py", "xapp/e2/rmrloop.py")
#: (file, function or attribute) -> why ``Any`` stays there; empty today
ALLOWED_ANY: dict[tuple[str, str], str] = {}


def _names_any(expr: ast.expr | None) -> bool:
    """Whether an annotation mentions ``Any`` (``Any``, ``typing.Any``, or inside a string)."""
    if expr is None:
        return False
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and node.id == "Any":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Any":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                if _names_any(ast.parse(node.value, mode="eval").body):
                    return True
            except SyntaxError:
                pass
    return False


def any_annotations(source: str) -> list[tuple[int, str]]:
    """(line, where) of every annotation in ``source`` that mentions ``Any``: function
    parameters and returns (``where`` is the function's name) and annotated assignments
    (``where`` is the target's text)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]
            if _names_any(node.returns) or any(_names_any(p.annotation) for p in params):
                out.append((node.lineno, node.name))
        elif isinstance(node, ast.AnnAssign) and _names_any(node.annotation):
            out.append((node.lineno, ast.unparse(node.target)))
    return out


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
