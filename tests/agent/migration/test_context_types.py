"""The migration Context names the real types of what it holds (issue 44 item 3: "the context
typed"), read statically with :mod:`ast`: no field of ``Context`` is annotated ``Any``, and
``outbound``, ``inbound`` and ``vllm_client`` name their classes (which live below
``context.py``, in ``agent/migration/attempts.py`` and ``agent/session.py``, so no import
circle is needed)."""

from __future__ import annotations

import ast
from pathlib import Path

CONTEXT = Path(__file__).resolve().parents[3] / "agent" / "migration" / "context.py"
EXPECTED = {"outbound": "Attempts", "inbound": "dict[str, Inbound]", "vllm_client": "VllmClient"}


def field_annotations(source: str, cls: str = "Context") -> dict[str, str]:
    """Field name -> its annotation as written, for the annotated fields of class ``cls`` in
    ``source``; raises LookupError when ``source`` defines no such class."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {st.target.id: ast.unparse(st.annotation) for st in node.body
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}
    raise LookupError(f"no class {cls}")


def untyped(annotations: dict[str, str]) -> list[str]:
    """The fields whose annotation mentions ``Any`` (``Any``, ``typing.Any``, ``dict[str, Any]``)."""
    return sorted(f for f, a in annotations.items()
                  if any(isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", "")) == "Any"
                         for n in ast.walk(ast.parse(a, mode="eval"))))


def test_the_checker_finds_an_any_field():
    src = ("import typing\nclass Context:\n    a: Any\n    b: dict[str, Any]\n    c: typing.Any\n"
           "    d: int\n    e: 'Anything'\n")
    assert untyped(field_annotations(src)) == ["a", "b", "c"]


def test_no_context_field_is_any():
    assert untyped(field_annotations(CONTEXT.read_text())) == []


def test_the_attempt_tables_and_the_vllm_client_name_their_classes():
    got = field_annotations(CONTEXT.read_text())
    assert {f: got.get(f) for f in EXPECTED} == EXPECTED
