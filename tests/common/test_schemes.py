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


def _scheme_enums(doc) -> list[list[str]]:
    """Every JSON-schema enum in ``doc`` that lists scheme names (those naming ``ctho``)."""
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
    return found


def _agent_config_field(name: str) -> tuple[object, str]:
    """(default, help) of an AgentConfig field, read from agent/app.py's source (this test runs
    in the xApp's environment too, which cannot import the agent)."""
    import ast

    tree = ast.parse((REPO / "agent" / "app.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AgentConfig")
    node = next(n for n in cls.body if isinstance(n, ast.AnnAssign) and n.target.id == name)
    default, help_ = node.value.args[:2]
    return ast.literal_eval(default), ast.literal_eval(help_)


@pytest.mark.parametrize("path", ["descriptors/schema.json", "descriptors/policytype-26001.json",
                                  "helm/pallas-agent/values.schema.json"])
def test_every_scheme_enum_is_the_vocabulary_spelt_as_the_agent_spells_it(path):
    """One spelling per scheme (issue 42): the xApp descriptor's schema, the A1 policy type and
    the chart's values schema list exactly the vocabulary's names (``full-copy``, not
    ``full_copy``, which A1 refused while the agent and chart used it): every scheme for
    ``scheme``, the reactive ones for ``fallback``."""
    found = _scheme_enums(json.loads((REPO / path).read_text()))
    assert found, path
    for e in found:
        assert len(e) == len(set(e)), (path, e)
        assert sorted(e) == sorted(schemes.NAMES if "pallas" in e else schemes.REACTIVE_NAMES), (path, e)


def test_the_agent_the_chart_and_the_descriptor_agree_on_the_default_scheme_and_ports():
    import re

    default, help_ = _agent_config_field("scheme")
    listed = re.findall(r"[a-z][a-z-]*[a-z]", help_.split(":", 1)[1].split("(")[0])
    assert sorted(listed) == sorted(schemes.NAMES) and default in schemes.NAMES
    values = (REPO / "helm" / "pallas-agent" / "values.yaml").read_text()
    assert re.search(r"^  defaultScheme: (\S+)$", values, re.M).group(1) in schemes.NAMES
    controls = json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"]
    assert controls["scheme"] in schemes.NAMES and controls["fallback"] in schemes.REACTIVE_NAMES
    # The ports: the chart opens the agent's defaults (the front was 8100 in the chart, 8080 in
    # the agent and the README).
    for field, value in (("control_port", "controlPort"), ("peer_port", "peerPort"),
                         ("front_port", "frontPort")):
        port = int(re.search(rf"^  {value}: (\d+)$", values, re.M).group(1))
        assert port == _agent_config_field(field)[0], value
    # Old spellings stay accepted where a name is parsed (the agent's --scheme, the xApp's config).
    for alias, name in (("full_copy", "full-copy"), ("no_rc", "no-rc"), ("pallas_bridge", "pallas-bridge")):
        assert schemes.scheme_value(alias) == schemes.scheme_value(name)
