"""The pallas-agent chart passes Helm's linter (helm-sdkpy: the Helm Go library), which renders
the templates and checks the values against values.schema.json; a copy with a bad value fails."""

import asyncio
import json
import re
import shutil

import helm_sdkpy
import pytest
from jsonschema import Draft7Validator

from deploy_paths import CHART, DESCRIPTORS, REPO

# helm.sh/helm/v3/pkg/lint/support: UnknownSev=0, InfoSev=1, WarningSev=2, ErrorSev=3
INFO, WARNING = 1, 2


def helm_lint(chart_dir) -> list[tuple[int, str]]:
    """Run `helm lint` on ``chart_dir``; return its (severity, path) messages."""
    result = asyncio.run(helm_sdkpy.Lint(helm_sdkpy.Configuration(namespace="pallas")).run(str(chart_dir)))
    assert result["TotalChartsLinted"] == 1, result
    return [(m["Severity"], m["Path"]) for m in result["Messages"] or []]


def test_chart_lints_without_errors_or_warnings():
    msgs = helm_lint(CHART)
    bad = [m for m in msgs if m[0] >= WARNING or m[0] == 0]
    assert not bad, f"helm lint reported (severity, path): {bad}"
    # the only allowed finding is informational (Chart.yaml has no icon)
    assert all(sev == INFO for sev, _ in msgs)


def _copy_with(tmp_path, pattern, repl):
    dst = tmp_path / "pallas-agent"
    shutil.copytree(CHART, dst)
    values = dst / "values.yaml"
    text, n = re.subn(pattern, repl, values.read_text(), count=1, flags=re.M)
    assert n == 1, pattern
    values.write_text(text)
    return dst


@pytest.mark.parametrize("pattern, repl", [
    (r"^  gpus: 1$", "  gpus: -1"),                     # a negative GPU count
    (r"^  controlPort: 50051$", "  controlPort: 70000"),  # not a port
    (r"^  blockSize: 16$", "  blockSize: 24"),           # not a vLLM block size
    (r"^agentId: edge-a$", "agentId: Edge_A"),            # not a DNS label: no Service name
])
def test_a_chart_copy_with_a_bad_value_is_rejected_by_the_linter(tmp_path, pattern, repl):
    bad = _copy_with(tmp_path, pattern, repl)
    msgs = helm_lint(bad)
    # values.yaml fails values.schema.json, so the templates are not rendered either
    assert (3, "values.yaml") in msgs, msgs


def test_values_schema_is_valid_draft7_and_kv_connector_matches_the_agent():
    schema = json.loads((CHART / "values.schema.json").read_text())
    Draft7Validator.check_schema(schema)
    values = (CHART / "values.yaml").read_text()
    assert re.search(r"^    className: PallasConnector$", values, re.M)
    assert re.search(r"^    modulePath: agent\.connector$", values, re.M)


def test_chart_ports_match_the_xapp_descriptor():
    """The descriptor's agent addresses point at the ports the chart opens."""
    values = (CHART / "values.yaml").read_text()
    control = int(re.search(r"^  controlPort: (\d+)$", values, re.M).group(1))
    peer = int(re.search(r"^  peerPort: (\d+)$", values, re.M).group(1))
    agents = json.loads((DESCRIPTORS / "config-file.json").read_text())["controls"]["agents"]
    for aid, a in agents.items():
        assert a["control_address"] == f"pallas-agent-{aid}.pallas.svc.cluster.local:{control}"
        assert a["peer_address"] == f"pallas-agent-{aid}.pallas.svc.cluster.local:{peer}"


def _agent_container_flags() -> set[str]:
    tpl = (CHART / "templates" / "deployment.yaml").read_text()
    block = tpl[tpl.index("- name: agent"):tpl.index("ports:", tpl.index("- name: agent"))]
    return set(re.findall(r'^\s+- (?:\{\{ printf ")?(--[a-z0-9-]+)=', block, re.M))


def test_every_flag_the_chart_passes_to_pallas_agent_exists():
    """Read the agent's flags from its source (the agent's environment, not this one, can
    import it): one flag per field of agent/app.py's AgentConfig, ``--<field-with-dashes>``;
    check each flag the chart gives the agent container."""
    import ast

    tree = ast.parse((REPO / "agent" / "app.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AgentConfig")
    defined = {"--" + n.target.id.replace("_", "-") for n in cls.body if isinstance(n, ast.AnnAssign)}
    used = _agent_container_flags()
    assert {"--agent-id", "--control-port", "--peer-port", "--front-port", "--hub-address"} <= used
    assert used <= defined, f"flags the agent does not define: {sorted(used - defined)}"


def test_the_kv_connector_class_is_where_the_chart_says():
    """vLLM imports kv_connector_module_path and takes the kv_connector attribute from it: the
    module must export the class (here lazily, through __all__ and a module __getattr__) and
    the package must define it."""
    import ast

    values = (CHART / "values.yaml").read_text()
    module = re.search(r"^    modulePath: (\S+)$", values, re.M).group(1)
    cls = re.search(r"^    className: (\S+)$", values, re.M).group(1)
    path = REPO.joinpath(*module.split("."))
    init = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(init.read_text())
    exported = {e.value for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", "") == "__all__" for t in node.targets)
                for e in node.value.elts}
    assert cls in exported
    sources = [init] + (sorted(path.glob("*.py")) if path.is_dir() else [])
    assert any(re.search(rf"^class {cls}\(", f.read_text(), re.M) for f in sources)


# --- the chart as a subchart (field case ../shared/cases/helm/: an operator's umbrella chart) ----
UMBRELLA = REPO.parent / "shared" / "cases" / "helm"


def _umbrella(tmp_path, values_text: str | None = None):
    """The umbrella of the field case (its Chart.yaml and values.yaml as the operator wrote them)
    with this chart vendored under charts/ (what `helm dependency build` leaves there) and one
    template, so that lint renders the whole tree and checks the subchart's values schema."""
    root = tmp_path / "edge-stack"
    (root / "charts").mkdir(parents=True)
    (root / "templates").mkdir()
    (root / "templates" / "NOTES.txt").write_text("edge stack\n")
    shutil.copy(UMBRELLA / "umbrella-Chart.yaml", root / "Chart.yaml")
    text = (UMBRELLA / "umbrella-values.yaml").read_text()
    (root / "values.yaml").write_text(text if values_text is None else values_text(text))
    shutil.copytree(CHART, root / "charts" / "pallas-agent")
    return root


def test_the_field_umbrella_with_a_condition_lints_clean(tmp_path):
    """Family: the chart composed as a conditional dependency (`condition: <name>.enabled`),
    which puts `enabled` (and Helm puts `global`) into the subchart's values. Before the fix the
    schema refused `enabled` and the umbrella failed to render (severity 3 on templates/)."""
    msgs = helm_lint(_umbrella(tmp_path))
    assert msgs == [(INFO, "Chart.yaml")], msgs


def test_the_umbrella_with_the_chart_switched_off_lints_clean(tmp_path):
    root = _umbrella(tmp_path, lambda t: t.replace("enabled: true", "enabled: false"))
    assert helm_lint(root) == [(INFO, "Chart.yaml")]


@pytest.mark.parametrize("edit", [
    lambda t: t.replace("enabled: true", "enabeld: true"),      # a typo of the switch
    lambda t: t.replace("enabled: true", 'enabled: "yes"'),     # not a boolean
    lambda t: t + "  agentID: edge-b\n",                         # a typo of a chart value
])
def test_the_schema_still_refuses_typos_through_the_umbrella(tmp_path, edit):
    assert (3, "templates/") in helm_lint(_umbrella(tmp_path, edit))


def test_the_values_schema_names_enabled_and_global_and_stays_closed():
    schema = json.loads((CHART / "values.schema.json").read_text())
    props = schema["properties"]
    assert props["enabled"]["type"] == "boolean" and props["global"]["type"] == "object"
    assert schema["additionalProperties"] is False
