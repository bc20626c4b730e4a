"""Scale-out's configuration (issue 46, docs/scale-out.md): ``controls.cluster`` in the
descriptor and its schema, ``pallas-xapp --replica-id``, and the refusals (one line, exit 2)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from xapp.config import ClusterConfig, ConfigError, load_controls
from xapp.e2.trace import TraceRecord, write_trace

REPO = Path(__file__).resolve().parents[2]
CONTROLS = json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"]


def _controls(**cluster) -> dict:
    c = copy.deepcopy(CONTROLS)
    c["cluster"] = cluster
    return c


def test_the_shipped_descriptor_runs_one_replica_and_an_absent_section_means_the_same():
    assert load_controls(CONTROLS).cluster == ClusterConfig(enabled=False, lease_s=3.0,
                                                            heartbeat_s=1.0, max_claims=16,
                                                            max_releases=4, endpoint_host="service")
    assert CONTROLS["cluster"] == {"enabled": False, "lease_s": 3.0, "heartbeat_s": 1.0, "max_claims": 16,
                                   "max_releases": 4, "endpoint_host": "service"}
    c = copy.deepcopy(CONTROLS)
    del c["cluster"]
    assert load_controls(c).cluster == ClusterConfig()
    assert ClusterConfig().enabled is False and ClusterConfig().join_delay_s is None


def test_every_key_is_read():
    cfg = load_controls(_controls(enabled=True, lease_s=6, heartbeat_s=1.5, join_delay_s=0,
                                  max_claims=2, max_releases=1)).cluster
    assert cfg == ClusterConfig(True, 6.0, 1.5, 0.0, 2, 1)
    assert (cfg.nodes, cfg.e2mgr_timeout_s, cfg.nodes_refresh_s) == ("ric", 2.0, 10.0)
    assert cfg.e2mgr_url == "http://service-ricplt-e2mgr-http.ricplt:3800/v1/nodeb/states"
    cfg = load_controls(_controls(nodes="configured", e2mgr_url="https://e2mgr.ric:3800/v1/nodeb/states",
                                  e2mgr_timeout_s=0.5, nodes_refresh_s=30)).cluster
    assert (cfg.nodes, cfg.e2mgr_url, cfg.e2mgr_timeout_s, cfg.nodes_refresh_s) == \
        ("configured", "https://e2mgr.ric:3800/v1/nodeb/states", 0.5, 30.0)
    assert isinstance(cfg.lease_s, float) and isinstance(cfg.max_claims, int)


@pytest.mark.parametrize("key, value", [("lease_s", 0), ("heartbeat_s", -1.0), ("max_claims", 0),
                                        ("max_releases", 1.5), ("enabled", "yes"),
                                        ("join_delay_s", -0.1), ("lease", 3.0),
                                        ("nodes", "agents"), ("e2mgr_url", "e2mgr:3800"),
                                        ("e2mgr_timeout_s", 0), ("nodes_refresh_s", -1)])
def test_the_schema_refuses_a_bad_value_by_its_path(key, value):
    with pytest.raises(ConfigError) as e:
        load_controls(_controls(**{key: value}))
    assert any(p.startswith("controls.cluster") for p, _ in e.value.errors), e.value.errors


def test_a_heartbeat_slower_than_a_third_of_the_lease_is_a_problem():
    assert ClusterConfig(lease_s=3.0, heartbeat_s=1.0).problems() == []
    (path, msg), = ClusterConfig(lease_s=3.0, heartbeat_s=1.5).problems()
    assert path == "controls.cluster.heartbeat_s" and "lease_s / 3 = 1 s" in msg


@pytest.fixture
def run_main(tmp_path, monkeypatch, capsys):
    """pallas-xapp in test mode on a one-record trace, with a descriptor of the given cluster
    section; returns (exit status, stderr)."""
    import xapp.main as xmain
    monkeypatch.setattr(xmain, "_configure_logging", lambda level: None)
    trace = tmp_path / "one.e2trace"
    write_trace(trace, [TraceRecord(1000.0, "gnb_a", 12050, b"\x00")])

    def run(cluster: dict, *flags: str) -> tuple[int, str]:
        doc = json.loads((REPO / "descriptors" / "config-file.json").read_text())
        doc["controls"]["cluster"] = cluster
        path = tmp_path / "config-file.json"
        path.write_text(json.dumps(doc))
        rc = xmain.main(["--mode", "test", "--config", str(path), "--trace", str(trace),
                         "--speed", "0", "--linger-s", "0", *flags])
        return rc, capsys.readouterr().err
    return run


def test_pallas_xapp_refuses_a_bad_cluster_in_one_line(run_main, monkeypatch):
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    rc, err = run_main({"enabled": True, "lease_s": 3.0, "heartbeat_s": 2.0})
    assert rc == 2 and err.strip().count("\n") == 0
    assert "controls.cluster.heartbeat_s" in err
    rc, err = run_main({"enabled": True})                      # no DBaaS to hold the leases in
    assert rc == 2 and err.strip().count("\n") == 0 and "DBAAS_SERVICE_HOST" in err
    rc, err = run_main({"lease_s": 0})                         # the schema's refusal, by path
    assert rc == 2 and "controls.cluster.lease_s" in err


@pytest.mark.parametrize("setting, env, words", [
    ("pod_ip", {}, "controls.cluster.endpoint_host pod_ip: POD_IP is not set"),
    ("pod_ip", {"POD_IP": "fd00::7"}, "is IPv6"),
    ("{pod}.pallas-xapp.ricxapp", {"POD_NAME": "p-0"}, "unknown field {pod}"),
    ("{replica}.pallas-xapp.ricxapp", {"POD_NAME": "p_0"}, "not an RFC 1123 host name"),
])
def test_pallas_xapp_refuses_an_endpoint_host_it_cannot_resolve_in_one_line(run_main, monkeypatch,
                                                                            setting, env, words):
    """Checked at start, before SDL is contacted (none is configured here)."""
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    for v in ("PALLAS_REPLICA_ID", "POD_NAME", "POD_IP"):
        monkeypatch.delenv(v, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, err = run_main({"enabled": True, "endpoint_host": setting})
    assert rc == 2 and err.strip().count("\n") == 0 and words in err, err


def test_a_disabled_cluster_touches_no_sdl(run_main, monkeypatch):
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    assert run_main({"enabled": False, "heartbeat_s": 2.0}) == (0, "")


def test_the_replica_id_is_the_flag_else_the_pod_name(monkeypatch):
    from xapp.main import build_parser, replica_id
    for v in ("PALLAS_REPLICA_ID", "POD_NAME", "HOSTNAME"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HOSTNAME", "pallas-xapp-2")
    assert replica_id(build_parser().parse_args([]).replica_id) == "pallas-xapp-2"
    monkeypatch.setenv("POD_NAME", "pallas-xapp-1")
    assert replica_id(None) == "pallas-xapp-1"
    monkeypatch.setenv("PALLAS_REPLICA_ID", "r0")
    assert replica_id(None) == "r0"
    assert replica_id(build_parser().parse_args(["--replica-id", "x"]).replica_id) == "x"


def test_the_cluster_knobs_reach_the_leases(dbaas, sdl_ns, monkeypatch):
    """With SDL reachable, build_xapp wires a ClusterReplica whose leases carry every knob."""
    from xapp.main import StartRefused, build_parser, open_cluster
    from xapp.cluster.nodes import E2mgrNodes
    c = _controls(enabled=True, lease_s=0.9, heartbeat_s=0.3, join_delay_s=0.25, max_claims=3,
                  max_releases=2, e2mgr_url="http://e2mgr.example:3800/v1/nodeb/states",
                  e2mgr_timeout_s=0.7, nodes_refresh_s=4.5)
    c["sdl"] = {"store": "sdl", "namespace": sdl_ns}
    cfg = load_controls(c)
    monkeypatch.setenv("POD_NAME", "pallas-xapp-7")
    rep = open_cluster(cfg, build_parser().parse_args([]).replica_id)
    try:
        lz = rep.leases
        assert (rep.replica_id, lz.ns, lz.lease_s, lz.max_claims, lz.max_releases) == \
            ("pallas-xapp-7", sdl_ns, 0.9, 3, 2)
        assert lz.membership.join_delay_s == 0.25 and rep.heartbeat_s == 0.3
        # live, nodes = ric: the E2 manager's list, read at start (none yet)
        assert isinstance(rep.source, E2mgrNodes) and lz.nodes == ()
        assert (rep.source.url, rep.source.timeout_s, rep.refresh_s) == \
            ("http://e2mgr.example:3800/v1/nodeb/states", 0.7, 4.5)
    finally:
        rep.leases.sdl.close()
    c["cluster"]["nodes"] = "configured"
    rep = open_cluster(load_controls(c), "x")
    try:
        assert rep.source is None and rep.leases.nodes == tuple(sorted(cfg.e2_nodes))
    finally:
        rep.leases.sdl.close()
    with pytest.raises(StartRefused, match="replica id"):
        open_cluster(cfg, "bad id*")
    assert open_cluster(load_controls(CONTROLS), "x") is None


def test_an_unreachable_dbaas_refuses_the_start_in_one_line(run_main, monkeypatch):
    from redis_server import _free_port
    monkeypatch.setenv("DBAAS_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("DBAAS_SERVICE_PORT", str(_free_port()))     # nobody listens
    rc, err = run_main({"enabled": True})
    assert rc == 2 and err.strip().count("\n") == 0 and "controls.cluster: SDL" in err, err
