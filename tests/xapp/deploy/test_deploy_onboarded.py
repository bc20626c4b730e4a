"""The xApp started from descriptors/config-file.json as the chart of OSC's onboarder deploys it.

What the onboarder's chart (ric-plt-appmgr xapp_onboarder, template ``xapp-std``; docs/osc.md
§3.3) gives the container, laid out here under a directory standing for its root:

- the whole descriptor as ``config-file.json`` in the ``-appconfig`` ConfigMap, mounted at
  ``/opt/ric/config``;
- the environment: the descriptor's ``appenv`` plus what the chart adds (``RMR_SRC_ID``,
  ``RMR_RTG_SVC``) and the RIC's ``dbaas-appconfig`` (``DBAAS_SERVICE_HOST``/``PORT``: SDL, here
  a private redis-server);
- the container's ``command``; the descriptor's probes appended to the Deployment;
- no Secret: the xApp's certificates come from ``descriptors/xapp-tls-patch.json`` (the
  documented patch: the Secret ``tls.crt``/``tls.key``/``ca.crt`` mounted where
  ``controls.tls`` reads them).

The one liberty: the descriptor's absolute paths are re-rooted under the test's directory and its
HTTP port moved to a free one (the probe, the messaging port and the subscription endpoint
together). RMR's C library is stubbed (tests/xapp/deploy/stubbed_xapp.py). Each test starts the
xApp as a process in live mode and checks what Kubernetes would see: the readiness probe over
HTTP, the declared metrics at the metrics URL, a clean exit on SIGTERM, and exit 2 with a line
naming what is missing when the Secret is not mounted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from deploy_paths import DESCRIPTORS, REPO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # tests/xapp: redis_server
from redis_server import redis_or_skip, redis_server  # noqa: E402

RUNNER = Path(__file__).with_name("stubbed_xapp.py")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port(descriptor: dict, name: str) -> dict:
    return next(p for p in descriptor["messaging"]["ports"] if p["name"] == name)


def lay_out(root: Path, descriptor: dict, http_port: int, redis_port: int, mount_secret: bool) -> dict:
    """Write the container's files under ``root`` as the onboarded chart (and, with
    ``mount_secret``, the documented TLS patch) mounts them; returns the container's environment."""
    from pallas_eval.localca import LocalCA

    d = json.loads(json.dumps(descriptor))
    c = d["controls"]
    # the probe asks the port the xApp serves HTTP on, the one submgr is told to call back
    assert d["readinessProbe"]["httpGet"]["port"] == _port(d, "http")["port"] == c["e2"]["client_endpoint"]["http_port"]
    for where in (d["readinessProbe"]["httpGet"], _port(d, "http"), c["e2"]["client_endpoint"]):
        where["port" if "port" in where else "http_port"] = http_port
    for k in ("cert_file", "key_file", "ca_file"):
        c["tls"][k] = str(root) + c["tls"][k]
    # the ConfigMap at the chart's appconfig path, read through CONFIG_FILE (appenv)
    config_file = Path(str(root) + d["appenv"]["CONFIG_FILE"])
    assert str(config_file.parent) == str(root) + "/opt/ric/config"
    config_file.parent.mkdir(parents=True)
    config_file.write_text(json.dumps(d, indent=2))
    if mount_secret:
        patch = json.loads((DESCRIPTORS / "xapp-tls-patch.json").read_text())["spec"]["template"]["spec"]
        (container,) = patch["containers"]
        assert container["name"] == descriptor["containers"][0]["name"]
        (mount,) = container["volumeMounts"]
        (volume,) = patch["volumes"]
        assert mount["name"] == volume["name"] and volume["secret"]["secretName"] == "pallas-xapp-tls"
        # the Secret's keys appear as files in the mount; controls.tls must name them there
        names = {"cert_file": "tls.crt", "key_file": "tls.key", "ca_file": "ca.crt"}
        for k, key in names.items():
            assert descriptor["controls"]["tls"][k] == f"{mount['mountPath']}/{key}", k
        LocalCA("pallas-ca").write(Path(str(root) + mount["mountPath"]), "pallas-xapp", stem="tls")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PALLAS_", "RMR_", "DBAAS_"))}
    env.update({k: str(v) for k, v in d["appenv"].items()})
    env["CONFIG_FILE"] = str(config_file)
    env.update(RMR_SRC_ID="service-ricxapp-pallas-rmr.ricxapp", RMR_RTG_SVC="4561",
               DBAAS_SERVICE_HOST="127.0.0.1", DBAAS_SERVICE_PORT=str(redis_port),
               PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'proto'}")
    return env


def _start(descriptor: dict, env: dict, root: Path) -> subprocess.Popen:
    cmd = descriptor["containers"][0]["command"]
    assert cmd[0] == "pallas-xapp"
    log = open(root / "xapp.log", "wb")
    return subprocess.Popen([sys.executable, str(RUNNER), *cmd[1:], *descriptor["containers"][0].get("args", [])],
                            env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except OSError:
        return 0, b""


@pytest.mark.timeout(120)
def test_the_onboarded_xapp_with_its_secret_mounted_gets_ready_serves_its_metrics_and_stops_clean(
        descriptor, tmp_path):
    redis_or_skip()
    assert "httpGet" in descriptor["readinessProbe"], "readiness must be an HTTP probe"
    http_port = _free_port()
    with redis_server() as redis_port:
        env = lay_out(tmp_path, descriptor, http_port, redis_port, mount_secret=True)
        proc = _start(descriptor, env, tmp_path)
        try:
            ready = f"http://127.0.0.1:{http_port}{descriptor['readinessProbe']['httpGet']['path']}"
            deadline = time.monotonic() + 60
            status = 0
            while time.monotonic() < deadline and proc.poll() is None:
                status, _ = _get(ready)
                if status == 200:
                    break
                time.sleep(0.2)
            log = (tmp_path / "xapp.log").read_text()
            assert status == 200, f"not ready (last {status}, exit {proc.poll()}):\n{log[-3000:]}"
            # every counter declared for the VESPA manager is exposed at the metrics URL
            status, body = _get(f"http://127.0.0.1:{http_port}{descriptor['metrics']['url']}")
            assert status == 200
            exposed = {ln.split("{")[0].split(" ")[0] for ln in body.decode().splitlines() if ln and ln[0] != "#"}
            declared = {m["name"] for g in descriptor["measurements"] for m in g["metrics"]}
            assert declared and declared <= exposed, declared - exposed
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, (tmp_path / "xapp.log").read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.timeout(60)
def test_without_the_secret_the_xapp_names_the_missing_files_and_how_to_mount_them(descriptor, tmp_path):
    env = lay_out(tmp_path, descriptor, _free_port(), _free_port(), mount_secret=False)
    proc = _start(descriptor, env, tmp_path)
    assert proc.wait(30) == 2
    lines = [ln for ln in (tmp_path / "xapp.log").read_text().splitlines() if ln.startswith("TLS:")]
    assert len(lines) == 1, (tmp_path / "xapp.log").read_text()
    for k in ("cert_file", "key_file", "ca_file"):
        assert f"controls.tls.{k} {tmp_path}/opt/ric/tls/" in lines[0]
    assert "xapp-tls-patch.json" in lines[0] and "controls.tls.enabled to false" in lines[0]
