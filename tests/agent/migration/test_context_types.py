"""The migration Context names the real types of what it holds (issue 44 item 3: "the context
typed"), read statically with :mod:`ast`: nothing in ``agent/migration/context.py`` is annotated
``Any``, and ``outbound``, ``inbound`` and ``vllm_client`` name their classes (which live below
``context.py``, in ``agent/migration/attempts.py`` and ``agent/session.py``, so no import
circle is needed). The ``Any`` checker itself is tested in tests/xapp/test_composition.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.annotations import any_annotations

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


def test_field_annotations_reads_a_class_and_refuses_a_missing_one():
    src = "class Context:\n    a: int\n    b: 'dict[str, X]' = {}\n    def f(self) -> None: ...\n"
    assert field_annotations(src) == {"a": "int", "b": "'dict[str, X]'"}
    with pytest.raises(LookupError):
        field_annotations(src, "Other")


def test_nothing_in_the_context_module_is_any():
    assert any_annotations(CONTEXT.read_text()) == []


def test_the_attempt_tables_and_the_vllm_client_name_their_classes():
    got = field_annotations(CONTEXT.read_text())
    assert {f: got.get(f) for f in EXPECTED} == EXPECTED
