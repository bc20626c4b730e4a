"""Fuzz inputs and checks for the xApp's descriptor loader and its A1 policy handler (issue 16,
"Fuzzing with a budget"), shared by the CI-budget tests (test_deploy_config.py,
test_deploy_a1.py) and the long run by hand (benchmarks/fuzz.py).

- :func:`descriptor_files`: the bytes of a descriptor file: the shipped
  ``descriptors/config-file.json`` with one to four edits (a leaf set to an edge value or
  removed, a key added) and sometimes byte mutations (flip, insertion, cut, duplicated span,
  deep nesting, invalid UTF-8, NaN/Infinity tokens).
- :func:`check_descriptor`: ``xapp.config.load_config_file`` on those bytes (from a file, as the
  xApp reads ``$CONFIG_FILE``): it either returns a configuration, and then the document's
  ``controls`` satisfy ``descriptors/schema.json``, or raises ``ConfigError`` naming at least
  one field or the file with a message; anything else (another exception, a refusal of a
  schema-valid document, an acceptance of an invalid one) is a crash (AssertionError).
- :func:`a1_requests` / :func:`check_a1`: A1_POLICY_REQ bodies (both forms, valid and not,
  byte-mutated) through ``A1PolicyHandler.process``: an answer per the A1-xApp contract, an
  ERROR changes nothing, the window grid stays capped, the instance count stays bounded.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from hypothesis import strategies as st
from jsonschema import Draft7Validator

REPO = Path(__file__).resolve().parents[3]
DESCRIPTOR = REPO / "descriptors" / "config-file.json"
SCHEMA = json.loads((REPO / "descriptors" / "schema.json").read_text())
BASE_DOC = json.loads(DESCRIPTOR.read_text())
A1_TYPE_ID = 26001

EDGE = [None, True, False, 0, -1, 1, 0.5, 2.0, 1e308, -1e-308, 2**31, 2**63, 10**30, "", "x",
        "pallas", "ctho", "edge-a", "h:1", "127.0.0.1:50051", "41959425", "a" * 300, [], [1],
        {}, {"a": 1}, {"enabled": True}]


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path] if path else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, path + (k,))
    return out


PATHS = _paths(BASE_DOC)


def edit(doc: dict, path: tuple, how: str, value: Any) -> None:
    """Set (``how="set"``), remove (``"drop"``) or add beside (``"add"``) the node at ``path``."""
    node = doc
    for k in path[:-1]:
        if not isinstance(node, dict) or k not in node:
            return
        node = node[k]
    if not isinstance(node, dict):
        return
    if how == "drop":
        node.pop(path[-1], None)
    elif how == "add":
        node[f"{path[-1]}_x"] = value
    else:
        node[path[-1]] = value


def mutate_raw(raw: bytearray, op: str, i: int, byte: int) -> bytearray:
    """One byte-level mutation of ``raw`` at position ``i`` (``op`` names it)."""
    i = min(i, max(0, len(raw) - 1))
    if op == "flip" and raw:
        raw[i] ^= byte or 1
    elif op == "insert":
        raw.insert(i, byte)
    elif op == "cut" and raw:
        del raw[i:]
    elif op == "repeat" and raw:
        raw[i:i] = raw[i:i + 16] * 4
    elif op == "nest":
        raw = bytearray(b'{"controls": ' * (1 + byte * 40) + b"1")
    elif op == "latin1":
        raw[i:i] = b"\xe9"
    elif op == "constant":
        raw = bytearray(raw.replace(b"0.8", b"NaN", 1).replace(b"5.0", b"Infinity", 1))
    return raw


@st.composite
def descriptor_files(draw) -> bytes:
    """A descriptor file's bytes (module docstring)."""
    doc = copy.deepcopy(BASE_DOC)
    for _ in range(draw(st.integers(1, 4))):
        edit(doc, draw(st.sampled_from(PATHS)), draw(st.sampled_from(["set", "set", "drop", "add"])),
             draw(st.sampled_from(EDGE) | st.integers() | st.floats(allow_nan=False)
                  | st.text(max_size=8)))
    raw = bytearray(json.dumps(doc).encode())
    if draw(st.integers(0, 3)) == 0:
        raw = mutate_raw(raw, draw(st.sampled_from(["flip", "insert", "cut", "repeat", "nest",
                                                    "latin1", "constant"])),
                         draw(st.integers(0, len(raw))), draw(st.integers(0, 255)))
    return bytes(raw)


def make_check_descriptor() -> Callable[[bytes], None]:
    """A checker of descriptor file bytes (module docstring); it writes each input to one file
    in a private temporary directory (on tmpfs when there is one)."""
    from xapp.config import ConfigError, XappConfig, load_config_file

    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = Path(tempfile.mkdtemp(prefix="pallas-desc-", dir=base)) / "config-file.json"
    validator = Draft7Validator(SCHEMA)

    def check_descriptor(raw: bytes) -> None:
        path.write_bytes(raw)
        try:
            doc = json.loads(raw.decode("utf-8"), parse_constant=_refuse)
        except (ValueError, UnicodeDecodeError, RecursionError):
            doc = None
        controls = doc.get("controls") if isinstance(doc, dict) else None
        valid = isinstance(controls, dict) and validator.is_valid(controls)
        try:
            cfg = load_config_file(path)
        except ConfigError as e:
            assert e.errors and all(p and m for p, m in e.errors), f"an unclear error {e.errors!r}"
            assert not valid, f"a schema-valid descriptor refused: {e}"
            return
        assert isinstance(cfg, XappConfig)
        assert valid, "a descriptor the schema refuses was loaded"

    return check_descriptor


def _refuse(token: str) -> Any:
    raise ValueError(token)


# -- A1 -----------------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12)
_payloads = st.fixed_dictionaries({}, optional={
    "alpha": _json | st.floats(), "t_max_s": _json | st.floats(), "dt_s": st.floats(),
    "fallback": st.sampled_from(["ctho", "detour", "x"]),
    "proactive": st.fixed_dictionaries({}, optional={
        "enabled": _json, "cells": st.dictionaries(st.sampled_from(["1", "x", "01"]), _json),
        "slices": _json})})
# Both forms: the contract's (integer id, object payload) and the mediator's (the id's digits in a
# string, the payload's JSON text in a string, "" on DELETE), and mixtures and mutations of both.
_requests = st.fixed_dictionaries(
    {}, optional={"operation": st.sampled_from(["CREATE", "UPDATE", "DELETE", "READ", "PATCH"]) | _json,
                  "policy_type_id": st.sampled_from([A1_TYPE_ID, str(A1_TYPE_ID), "026001", 0, -1,
                                                     2**31, 10**30]) | _json,
                  "policy_instance_id": st.sampled_from(["i", ""]) | _json,
                  "payload": _payloads | _payloads.map(json.dumps) | st.just("") | _json})
# Well-formed requests of both forms with knobs anywhere in (and at the edges of) their ranges,
# so that the fuzzing also walks the accepted path (overlays, configuration build, reverts).
_knobs = st.fixed_dictionaries({}, optional={
    "alpha": st.floats(0, 1), "t_max_s": st.floats(1e-3, 60) | st.just(60.0),
    "dt_s": st.floats(0.01, 1) | st.just(0.01), "fallback": st.sampled_from(["ctho", "detour", "full-copy"]),
    "proactive": st.fixed_dictionaries({}, optional={"enabled": st.booleans(), "slices": st.dictionaries(
        st.sampled_from(["1", "1-000001", "255-ABCDEF"]), st.booleans(), max_size=2)})})
_valid = st.fixed_dictionaries({
    "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE", "READ"]),
    "policy_type_id": st.sampled_from([A1_TYPE_ID, str(A1_TYPE_ID)]),
    "policy_instance_id": st.sampled_from(["a", "b", "c"]) | st.text(min_size=1, max_size=6),
    "payload": _knobs | _knobs.map(json.dumps)})
a1_objects = _valid | _requests | _json
"""A1_POLICY_REQ bodies as JSON values (before serialisation)."""


@st.composite
def a1_requests(draw) -> bytes:
    """A1_POLICY_REQ bodies as bytes: JSON of :data:`a1_objects`, sometimes byte-mutated."""
    raw = bytearray(json.dumps(draw(a1_objects)).encode())
    if draw(st.integers(0, 3)) == 0:
        raw = mutate_raw(raw, draw(st.sampled_from(["flip", "insert", "cut", "repeat", "nest"])),
                         draw(st.integers(0, len(raw))), draw(st.integers(0, 255)))
    return bytes(raw)


def a1_response(raw: bytes) -> dict:
    """Decode an A1_POLICY_RESP and check it against the A1-xApp contract (ric-plt-a1
    docs/a1_xapp_contract_openapi.yaml downstream_notification_schema: exactly these four
    fields, status one of OK/ERROR/DELETED)."""
    body = json.loads(raw)
    assert set(body) == {"policy_type_id", "policy_instance_id", "handler_id", "status"}
    assert isinstance(body["policy_type_id"], int) and 1 <= body["policy_type_id"] <= 2**31 - 1
    assert isinstance(body["policy_instance_id"], str) and isinstance(body["handler_id"], str)
    assert body["status"] in ("OK", "ERROR", "DELETED")
    return body


def make_check_a1() -> Callable[[bytes], None]:
    """A checker of A1 request bodies through one long-lived handler (instances accumulate
    across inputs, as in a running xApp)."""
    from xapp.a1 import MAX_INSTANCES, A1PolicyHandler, default_policy_type_path, load_policy_type
    from xapp.config import load_config_file

    handler = A1PolicyHandler(load_config_file(DESCRIPTOR),
                              load_policy_type(default_policy_type_path(A1_TYPE_ID)))

    def check_a1(raw: bytes) -> None:
        before = handler.config
        out = handler.process(raw)
        body = a1_response(out.response)
        assert body["status"] == out.status and (out.status == "ERROR") == bool(out.reason)
        if out.status == "ERROR":
            assert handler.config is before and not out.changed, "an ERROR changed the config"
        sc = handler.config.scheduler          # whatever was accepted, the window grid stays capped
        assert sc.t_max_s / sc.dt_s <= 6000 * (1 + 1e-9), "window grid over its cap"
        assert len(handler.instances) <= MAX_INSTANCES, "instances over their cap"

    return check_a1
