"""A replica's own subscription endpoint (``controls.cluster.endpoint_host``, issue 46,
docs/scale-out.md §6): the host each replica names in its E2 subscriptions' ClientEndpoint,
checked at start, and carried by the subscription requests the live xApp makes."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from xapp.cluster.endpoint import EndpointError, is_host_name, replica_host
from xapp.config import load_controls
from xapp.e2.subscription import SubscriptionManager

REPO = Path(__file__).resolve().parents[2]
CONTROLS = json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"]
SERVICE = CONTROLS["e2"]["client_endpoint"]["host"]          # service-ricxapp-pallas-http.ricxapp


def _host(setting: str, replica: str = "pallas-xapp-1", **env: str) -> str:
    return replica_host(setting, replica=replica, service=SERVICE, environ=env)


def test_service_is_the_descriptors_host_for_every_replica():
    assert _host("service") == _host("service", replica="other") == SERVICE


def test_pod_ip_is_the_downward_apis_address():
    assert _host("pod_ip", POD_IP="10.42.3.17") == "10.42.3.17"
    assert _host("pod_ip", POD_IP=" 10.42.3.17\n") == "10.42.3.17"
    for env, words in [({}, "POD_IP is not set"), ({"POD_IP": ""}, "POD_IP is not set"),
                       ({"POD_IP": "pod-a"}, "not an IP address"),
                       ({"POD_IP": "fd00::17"}, "IPv6")]:
        with pytest.raises(EndpointError, match=words) as e:
            _host("pod_ip", **env)
        assert "\n" not in str(e.value) and str(e.value).startswith("controls.cluster.endpoint_host pod_ip")


def test_a_template_names_the_replica_under_a_headless_service():
    assert _host("{replica}.pallas-xapp.ricxapp") == "pallas-xapp-1.pallas-xapp.ricxapp"
    assert _host("{replica}.pallas-xapp.ricxapp.svc.cluster.local", replica="pallas-xapp-0") == \
        "pallas-xapp-0.pallas-xapp.ricxapp.svc.cluster.local"
    # {service}: the descriptor's host, e.g. a headless Service's name without "http"
    assert replica_host("{replica}.{service}", replica="x-2", service="pallas-hl.ricxapp",
                        environ={}) == "x-2.pallas-hl.ricxapp"


@pytest.mark.parametrize("setting, replica, words", [
    ("{pod}.pallas-xapp.ricxapp", "x-1", "unknown field {pod}"),
    ("{replica!r}.pallas", "x-1", "no conversion or format"),
    ("{replica:>9}.pallas", "x-1", "no conversion or format"),
    ("{replica.pallas", "x-1", "not a template"),
    ("{replica}.pallas", "xapp_1", "not an RFC 1123 host name"),        # '_'
    ("{replica}.pallas", "xapp-1:4560", "not an RFC 1123 host name"),   # ':'
    ("{replica}..pallas", "x-1", "not an RFC 1123 host name"),          # an empty label
    ("-{replica}.pallas", "x-1", "not an RFC 1123 host name"),
    ("{replica}.pallas", "a" * 64, "not an RFC 1123 host name"),        # label over 63
    ("{replica}.{service}", "x-1", "contains 'http'"),                  # submgr: http -> rmr
])
def test_a_template_that_gives_no_usable_host_is_refused_in_one_line(setting, replica, words):
    with pytest.raises(EndpointError, match=words) as e:
        _host(setting, replica=replica)
    assert "\n" not in str(e.value) and "controls.cluster.endpoint_host" in str(e.value)


def test_rfc_1123_host_names():
    for ok in ("a", "pallas-xapp-0", "0pallas", "x.y.z", "10.0.0.1", "A" * 63, ".".join(["a" * 63] * 3) + ".b" * 31):
        assert is_host_name(ok), ok
    for bad in ("", ".", "a.", ".a", "a..b", "-a", "a-", "a_b", "a b", "a" * 64,
                ".".join(["a" * 63] * 4) + ".ab", "é"):
        assert not is_host_name(bad), bad


def test_the_schema_takes_the_knob_and_refuses_other_characters():
    from xapp.config import ConfigError
    c = copy.deepcopy(CONTROLS)
    assert load_controls(c).cluster.endpoint_host == "service"              # the shipped default
    for v in ("pod_ip", "{replica}.pallas-xapp.ricxapp"):
        c["cluster"]["endpoint_host"] = v
        assert load_controls(c).cluster.endpoint_host == v
    for v in ("", "a b", "pod_name", "x/y", 3):
        c["cluster"]["endpoint_host"] = v
        with pytest.raises(ConfigError) as e:
            load_controls(c)
        assert [p for p, _ in e.value.errors] == ["controls.cluster.endpoint_host"]


class _Submgr:
    """submgr's POST as the manager calls it: keeps each request body."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def subscribe(self, params: dict) -> dict:
        self.bodies.append(params)
        return {"SubscriptionId": f"s{len(self.bodies)}", "SubscriptionInstances": []}

    def unsubscribe(self, sid: str) -> None:
        pass


def test_the_manager_names_the_replicas_host_in_every_request():
    cfg = load_controls(CONTROLS)
    sm = _Submgr()
    mgr = SubscriptionManager(sm, client_host="10.42.3.17")
    mgr.sync(cfg, owned={"gnb_a", "gnb_b"})
    assert sorted(b["Meid"] for b in sm.bodies) == ["gnb_a", "gnb_b"]
    assert {json.dumps(b["ClientEndpoint"]) for b in sm.bodies} == \
        {json.dumps({"Host": "10.42.3.17", "HTTPPort": 8080, "RMRPort": 4560})}
    sm.bodies.clear()                              # without it: the descriptor's host, as before
    SubscriptionManager(sm).sync(cfg, owned={"gnb_a"})
    assert sm.bodies[0]["ClientEndpoint"]["Host"] == SERVICE


def _live_args(*flags: str) -> argparse.Namespace:
    from xapp.main import build_parser
    return build_parser().parse_args(["--mode", "live", "--insecure", "--store", "memory", *flags])


@pytest.mark.parametrize("setting, env, host", [
    ("pod_ip", {"POD_IP": "10.42.3.17"}, "10.42.3.17"),
    ("{replica}.pallas-xapp.ricxapp", {"POD_NAME": "pallas-xapp-2"}, "pallas-xapp-2.pallas-xapp.ricxapp"),
    ("service", {"POD_IP": "10.42.3.17"}, SERVICE),
])
def test_the_live_xapp_subscribes_with_the_replicas_own_host(dbaas, sdl_ns, monkeypatch, setting, env, host):
    """build_xapp (live, cluster enabled, SDL on a private redis-server): the subscription
    manager it composes sends the replica's host, which submgr makes the route's host."""
    from prometheus_client import CollectorRegistry

    import xapp.main as xmain
    monkeypatch.setattr(xmain, "_default_registry", CollectorRegistry)     # a registry of its own
    for v in ("PALLAS_REPLICA_ID", "POD_NAME", "POD_IP"):
        monkeypatch.delenv(v, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    c = copy.deepcopy(CONTROLS)
    c["cluster"] = {"enabled": True, "nodes": "configured", "endpoint_host": setting}
    c["sdl"] = {"store": "sdl", "namespace": sdl_ns}
    b = xmain.build_xapp(load_controls(c), "live", _live_args())
    try:
        sm = _Submgr()
        b.app.subscriptions.client = sm
        b.app.subscriptions.sync(b.config, owned={"gnb_a"})
        assert [(x["Meid"], x["ClientEndpoint"]) for x in sm.bodies] == \
            [("gnb_a", {"Host": host, "HTTPPort": 8080, "RMRPort": 4560})]
    finally:
        b.app.cluster.leases.sdl.close()


def test_one_replica_keeps_the_descriptors_host_whatever_the_knob(monkeypatch):
    """Cluster disabled: the knob is not read (no POD_IP needed), the host is the descriptor's."""
    from xapp.main import subscription_host
    monkeypatch.delenv("POD_IP", raising=False)
    c = copy.deepcopy(CONTROLS)
    c["cluster"] = {"enabled": False, "endpoint_host": "pod_ip"}
    assert subscription_host(load_controls(c), None) is None
