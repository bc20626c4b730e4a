"""The pallas-agent chart as Helm renders it (tests/chart_render.py: Helm's own engine, offline):
the vLLM and agent command lines are what the agent checks at start, the TLS Secret is one per
agent, TLS without peers is refused at render time, and the pod carries the security blocks,
ServiceAccount, NetworkPolicy and PodDisruptionBudget (issue 42)."""

from __future__ import annotations

import ast
import copy
import json
import shutil

import helm_python
import pytest

from deploy_paths import CHART, REPO
from tests.chart_render import PEERS, container, flags, render, render_text

# What the agent needs of vLLM: the arguments it passes when it launches vLLM itself
# (agent/server.py VLLMServer.command; docs/vllm.md section 1), less the CPU-only ones.
NEEDED_VLLM_FLAGS = ("--skip-tokenizer-init", "--enable-prefix-caching", "--enable-prompt-tokens-details")


def _with(*parts: dict) -> dict:
    """Deep merge of value dicts, later ones win."""
    out: dict = {}

    def merge(dst, src):
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(dst.get(k), dict):
                merge(dst[k], v)
            else:
                dst[k] = copy.deepcopy(v)
    for p in parts:
        merge(out, p)
    return out


@pytest.fixture(scope="module")
def objs():
    return render(PEERS)


def test_vllm_gets_the_failure_policy_and_every_flag_the_agent_needs(objs):
    """Before: no kv_load_failure_policy, vLLM ran with its default "fail" and the agent
    (check_load_failure_policy) exited 1 at every restart."""
    args = container(objs, "vllm")["args"]
    f = flags(args)
    kv = json.loads(f["--kv-transfer-config"])
    assert kv["kv_load_failure_policy"] == "recompute"
    assert (kv["kv_connector"], kv["kv_connector_module_path"], kv["kv_role"]) == (
        "PallasConnector", "agent.connector", "kv_both")
    agent_f = flags(container(objs, "agent")["args"])
    assert kv["kv_connector_extra_config"] == {"agent_address": agent_f["--hub-address"]}
    server_src = (REPO / "agent" / "server.py").read_text()
    for flag in NEEDED_VLLM_FLAGS:
        assert f'"{flag}"' in server_src, flag  # the agent's own launch passes it too
        assert flag in f, flag
    assert f["--tensor-parallel-size"] == "1"
    # Both read the same model, block size and dtype; the agent talks to this vLLM.
    for k in ("--model", "--block-size", "--dtype"):
        assert f[k] == agent_f[k], k
    assert agent_f["--vllm-url"] == f"http://127.0.0.1:{f['--port']}"


def test_every_rendered_agent_flag_is_a_flag_of_the_agent(objs):
    """One flag per AgentConfig field (agent/app.py, read by AST: this environment does not
    import the agent)."""
    tree = ast.parse((REPO / "agent" / "app.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AgentConfig")
    defined = {"--" + n.target.id.replace("_", "-") for n in cls.body if isinstance(n, ast.AnnAssign)}
    objs2 = render(_with(PEERS, {"model": {"servedName": "qwen3"}, "agent": {"peerIdentities": ["edge-c"]},
                                 "vllm": {"maxModelLen": 4096}}))
    used = set(flags(container(objs2, "agent")["args"]))
    assert {"--served-model-name", "--peer-front", "--peer-identity", "--max-model-len"} <= used
    assert used <= defined, sorted(used - defined)


def test_the_served_model_name_reaches_both_containers(objs):
    o = render(_with(PEERS, {"model": {"servedName": "qwen3-14b"}}))
    assert flags(container(o, "vllm")["args"])["--served-model-name"] == "qwen3-14b"
    assert flags(container(o, "agent")["args"])["--served-model-name"] == "qwen3-14b"
    assert "--served-model-name" not in flags(container(objs, "vllm")["args"])
    with pytest.raises(helm_python.HelmValuesError, match="servedName"):
        render(_with(PEERS, {"model": {"servedName": "two words"}}))


def test_the_tls_secret_is_one_per_agent(objs):
    def secret(o):
        vols = o["Deployment"][0]["spec"]["template"]["spec"]["volumes"]
        return next(v for v in vols if v["name"] == "tls")["secret"]["secretName"]
    assert secret(objs) == "pallas-agent-edge-a-tls"
    assert secret(render({"agentId": "edge-b", "agent": {"peerIdentities": ["edge-a"]}},
                         release="edge-b")) == "pallas-agent-edge-b-tls"
    assert secret(render(_with(PEERS, {"tls": {"secretName": "my-cert"}}))) == "my-cert"
    env = {e["name"]: e["value"] for e in container(objs, "agent")["env"]}
    assert env["PALLAS_TLS_CERT"] == "/etc/pallas/tls/tls.crt" and env["PALLAS_TLS_CA"] == "/etc/pallas/tls/ca.crt"
    assert "pallas-agent-edge-a-tls" in objs["NOTES"][0]["text"]


def test_tls_without_peers_is_refused_at_render_time():
    """Before: rendered, installed, and every migration refused (target_not_in_directory)."""
    with pytest.raises(helm_python.HelmRenderError,
                       match=r"agent\.peerFronts or agent\.peerIdentities must name the other agents"):
        render({})
    with pytest.raises(helm_python.HelmRenderError, match="own id"):
        render({"agent": {"peerIdentities": ["edge-a"]}})
    # Peer identities alone suffice; plaintext needs none (and says that any agent is admitted).
    assert "--peer-identity=edge-c" in container(render({"agent": {"peerIdentities": ["edge-c"]}}), "agent")["args"]
    o = render({"tls": {"enabled": False}})
    assert "--insecure" in container(o, "agent")["args"]
    assert "any agent is admitted" in o["NOTES"][0]["text"]


def test_notes_list_the_peers():
    o = render(_with(PEERS, {"agent": {"peerIdentities": ["edge-c"]}}))
    text = o["NOTES"][0]["text"]
    assert "  - edge-b (UE front http://pallas-agent-edge-b.pallas.svc.cluster.local:8080)" in text
    assert "  - edge-c\n" in text
    assert "kubectl create secret generic pallas-agent-edge-a-tls -n pallas" in text


def test_the_pod_runs_non_root_without_privileges_and_with_probes(objs):
    spec = objs["Deployment"][0]["spec"]["template"]["spec"]
    sc = spec["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["containers"]:
        csc = c["securityContext"]
        assert csc["allowPrivilegeEscalation"] is False, c["name"]
        assert csc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(c), c["name"]
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["HOME"] == "/var/cache/pallas"  # a writable home for a user the image lacks
    assert spec["automountServiceAccountToken"] is False


def test_service_account_network_policy_and_disruption_budget(objs):
    dep = objs["Deployment"][0]
    pod = dep["spec"]["template"]
    (sa,) = objs["ServiceAccount"]
    assert sa["metadata"]["name"] == pod["spec"]["serviceAccountName"] == "pallas-agent-edge-a"
    assert sa["automountServiceAccountToken"] is False
    (pdb,) = objs["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["minAvailable"] == 1
    (np,) = objs["NetworkPolicy"]
    assert np["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert np["spec"]["policyTypes"] == ["Ingress"]
    rules = {r["ports"][0]["port"]: r.get("from") for r in np["spec"]["ingress"]}
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c["ports"]}
    assert set(rules) == {ports["peer"], ports["control"], ports["front"]}  # not vLLM's, not the hub's
    assert rules[ports["peer"]] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "pallas-agent"}}}]
    (xapp,) = rules[ports["control"]]
    assert xapp["podSelector"]["matchLabels"] == {"app": "ricxapp-pallas"}
    assert xapp["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ricxapp"}
    assert rules[ports["front"]] is None  # any source unless networkPolicy.frontFrom
    # Selectors are values (null drops one: Helm merges a {} into the default); each block can
    # be switched off.
    o = render(_with(PEERS, {"networkPolicy": {"xappSelector": {"app": "x"}, "xappNamespaceSelector": None},
                             "podDisruptionBudget": {"enabled": False}, "serviceAccount": {"create": False}}))
    (np2,) = o["NetworkPolicy"]
    assert np2["spec"]["ingress"][1]["from"] == [{"podSelector": {"matchLabels": {"app": "x"}}}]
    assert "PodDisruptionBudget" not in o and "ServiceAccount" not in o
    assert o["Deployment"][0]["spec"]["template"]["spec"]["serviceAccountName"] == "default"


@pytest.mark.parametrize("values, where", [
    ({"vllm": {"tensorParallelSize": 2}}, "/vllm/tensorParallelSize"),   # values.yaml says: must be 1
    ({"networkPolicy": {"peerSelector": None}}, "peerSelector"),     # no selector: admit whom?
    ({"tls": {"secretName": "Bad_Name"}}, "/tls/secretName"),
])
def test_the_schema_refuses(values, where):
    with pytest.raises(helm_python.HelmValuesError, match=where):
        render(_with(PEERS, values))


def test_the_field_umbrella_without_peers_is_refused_with_the_reason(tmp_path):
    """The operator's umbrella of ../shared/cases/helm (TLS on by default, no peers) rendered as
    `helm install` would: refused, naming the values to set (lint alone does not run `fail`)."""
    umbrella = REPO.parent / "shared" / "cases" / "helm"
    root = tmp_path / "edge-stack"
    (root / "charts").mkdir(parents=True)
    shutil.copy(umbrella / "umbrella-Chart.yaml", root / "Chart.yaml")
    shutil.copy(umbrella / "umbrella-values.yaml", root / "values.yaml")
    shutil.copytree(CHART, root / "charts" / "pallas-agent")
    with pytest.raises(helm_python.HelmRenderError, match="agent.peerFronts or agent.peerIdentities"):
        render_text(chart=root)
    out = render_text({"pallas-agent": PEERS}, chart=root)
    assert "pallas-agent-edge-a-tls" in out["edge-stack/charts/pallas-agent/templates/deployment.yaml"]
