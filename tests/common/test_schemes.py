"""The one scheme and session-state vocabulary (pallas_common.schemes) against the .proto and
the xApp's descriptors (issue 12: no second vocabulary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pallas_common import schemes
from pallas_proto import pallas_pb2 as pb

REPO = Path(__file__).resolve().parents[2]


def test_every_proto_scheme_has_one_name_and_label():
    values = [v for v in pb.Scheme.values() if v != pb.SCHEME_UNSPECIFIED]
    assert sorted(schemes.SCHEMES) == sorted(values)
    assert len(set(schemes.NAMES)) == len(values)
    for v in values:
        spec = schemes.SCHEMES[v]
        assert schemes.scheme_value(pb.Scheme.Name(v)) == v
        assert spec.label and schemes.label(spec.name) == spec.label == schemes.label(v)
    assert schemes.label("no_rc") == "Pallas w/o RC"
    assert schemes.label("teleport") == "teleport"


def test_groups_partition_the_names():
    assert set(schemes.COMPARED) | set(schemes.ABLATIONS) | {schemes.PALLAS_BRIDGE} == set(schemes.NAMES)
    assert not set(schemes.COMPARED) & set(schemes.ABLATIONS)
    assert set(schemes.REPLAYED) == set(schemes.COMPARED) | {schemes.PALLAS_BRIDGE}
    assert schemes.PROACTIVE == {pb.SCHEME_PALLAS, pb.SCHEME_PALLAS_BRIDGE, pb.SCHEME_NO_RC, pb.SCHEME_NO_SM}
    assert schemes.PROACTIVE_NAMES == {schemes.PALLAS, schemes.PALLAS_BRIDGE, *schemes.ABLATIONS}
    assert [s.name for s in schemes.SCHEMES.values() if s.bridge] == [schemes.PALLAS_BRIDGE]
    assert set(schemes.RECOVERING) == set(schemes.COMPARED) - {schemes.PALLAS, schemes.DETOUR}
    assert schemes.REACTIVE_NAMES == {*schemes.RECOVERING, schemes.DETOUR}


def test_session_states_are_the_proto_enum():
    names = {n for n in pb.SessionState.keys() if n != "SESSION_UNSPECIFIED"}
    assert {"SESSION_" + s.name for s in schemes.SessionState} == names
    for s in schemes.SessionState:
        assert pb.SessionState.Name(s.proto) == "SESSION_" + s.name
        assert schemes.SessionState.of(s.value) is s
    assert schemes.SessionState.of("") is None
    assert schemes.SessionState.of("teleported") is None


def test_control_reply_state_is_the_session_state_enum():
    """ControlReply.state is ``pallas.v1.SessionState`` (not a free string): every state
    survives the wire as itself, UNSPECIFIED and values of a newer agent read as None."""
    field = pb.ControlReply.DESCRIPTOR.fields_by_name["state"]
    assert field.enum_type is not None and field.enum_type.name == "SessionState"
    for s in schemes.SessionState:
        wire = pb.ControlReply(state=s.proto).SerializeToString()
        back = pb.ControlReply.FromString(wire).state
        assert schemes.SessionState.from_proto(back) is s and schemes.SessionState.name_of(back) == s.value
    assert schemes.SessionState.from_proto(pb.SESSION_UNSPECIFIED) is None
    assert schemes.SessionState.from_proto(99) is None and schemes.SessionState.name_of(99) is None


@pytest.mark.parametrize("path", ["descriptors/schema.json", "descriptors/policytype-26001.json"])
def test_descriptor_scheme_enums_are_the_vocabulary(path):
    """The xApp's descriptors must list JSON-schema enums statically; each list of scheme names
    in them is exactly the vocabulary's names (``_`` for ``-``): every scheme for ``scheme``,
    the reactive ones for ``fallback``."""
    doc = json.loads((REPO / path).read_text())
    found = []

    def walk(x):
        if isinstance(x, dict):
            e = x.get("enum")
            if isinstance(e, list) and "ctho" in e:
                found.append(e)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    assert found, path
    every = sorted(n.replace("-", "_") for n in schemes.NAMES)
    reactive = sorted(n.replace("-", "_") for n in schemes.REACTIVE_NAMES)
    for e in found:
        assert sorted(e) == (every if "pallas" in e else reactive), (path, e)
