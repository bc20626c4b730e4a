"""Static checks of the container recipes (they cannot be built here: no Docker engine, and
OSC's package repository is out of reach): what they copy exists, and what they set agrees with
the descriptor and the chart."""

import contextlib
import io
import json
import os
import re
import tomllib

from deploy_paths import CHART, DESCRIPTORS, REPO

XAPP = (REPO / "docker" / "xapp.Dockerfile").read_text()
AGENT = (REPO / "docker" / "agent.Dockerfile").read_text()


def _copies(dockerfile: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^COPY (?!--from)(\S+) ", dockerfile, re.M)]


def test_every_copied_path_exists():
    for src in _copies(XAPP) + _copies(AGENT):
        assert (REPO / src).exists(), src


def test_xapp_image_agrees_with_the_descriptor():
    d = json.loads((DESCRIPTORS / "config-file.json").read_text())
    env = dict(re.findall(r"^\s*(?:ENV\s+)?([A-Z_]+)=(\S+?)\s*\\?$", XAPP, re.M))
    assert env["CONFIG_FILE"] == d["appenv"]["CONFIG_FILE"]
    assert env["PALLAS_CONTROLS_SCHEMA"] == "/opt/pallas/descriptors/schema.json"
    assert "COPY descriptors/ /opt/pallas/descriptors/" in XAPP
    assert d["livenessProbe"]["exec"]["command"][0] == "/usr/local/bin/rmr_probe"
    assert "test -x /usr/local/bin/rmr_probe" in XAPP
    assert re.search(r"^ARG RMR_VERSION=4\.9\.4$", XAPP, re.M)
    assert re.search(r"^FROM python:3\.11-slim|^ARG PYTHON_IMAGE=python:3\.11-slim$", XAPP, re.M)
    assert d["containers"][0]["command"] == ["pallas-xapp"] and 'CMD ["pallas-xapp"]' in XAPP
    # the seed route table sends A1 responses and queries to the A1 mediator, nothing else
    seed = env["RMR_SEED_RT"]
    rt = (REPO / "docker" / "xapp-seed.rt").read_text()
    assert seed == "/opt/pallas/route.rt" and "COPY docker/xapp-seed.rt /opt/pallas/route.rt" in XAPP
    rows = [ln for ln in rt.splitlines() if ln and not ln.startswith("#")]
    assert rows[0] == "newrt|start" and rows[-1] == "newrt|end"
    assert {r.split("|")[1] for r in rows[1:-1]} == {"20011", "20012"}


def test_agent_image_installs_the_gpu_extra_without_vllm():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # run the Dockerfile's own requirement filter on this pyproject
    expr = re.search(r"python3 -c '([^']+)' > /tmp/requirements.txt", AGENT).group(1)
    scope = {}
    out = io.StringIO()
    cwd = os.getcwd()
    try:
        os.chdir(REPO)
        with contextlib.redirect_stdout(out):
            exec(expr, scope)
    finally:
        os.chdir(cwd)
    reqs = out.getvalue().split()
    assert not [r for r in reqs if r.startswith("vllm")]
    wanted = [r for r in project["dependencies"] + project["optional-dependencies"]["gpu"]
              if not r.startswith("vllm")]
    assert reqs == wanted
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v\S+$", AGENT, re.M)
    # the chart runs both containers from this image with its own commands
    assert "ENTRYPOINT []" in AGENT
    assert "vllm.entrypoints.openai.api_server" in (CHART / "templates" / "deployment.yaml").read_text()
