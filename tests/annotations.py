"""Reading annotations with :mod:`ast` for the typing tests (issue 44: ``Any`` only where no
Protocol or concrete type fits): tests/xapp/test_composition.py and
tests/agent/migration/test_context_types.py. Standard library only: both environments."""

from __future__ import annotations

import ast


def names_any(expr: ast.expr | None) -> bool:
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
                if names_any(ast.parse(node.value, mode="eval").body):
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
            if names_any(node.returns) or any(names_any(p.annotation) for p in params):
                out.append((node.lineno, node.name))
        elif isinstance(node, ast.AnnAssign) and names_any(node.annotation):
            out.append((node.lineno, ast.unparse(node.target)))
    return out
