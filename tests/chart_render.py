"""Render the pallas-agent chart with Helm's own engine (helm-python-sdk: ctypes over Helm's Go
SDK, offline; ``lookup`` returns nothing), for the chart tests of both environments.

Usage: ``objs = render({"agent": {"peerIdentities": ["edge-b"]}}, release="edge-a")``, then
``objs["Deployment"][0]["spec"]...``; ``container(objs, "agent")["args"]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import yaml

CHART = Path(__file__).resolve().parents[1] / "helm" / "pallas-agent"
PEERS = {"agent": {"peerFronts": {"edge-b": "http://pallas-agent-edge-b.pallas.svc.cluster.local:8080"}}}
"""The least an install with TLS on must add: one other agent."""


def render_text(values: dict[str, Any] | None = None, *, release: str = "edge-a",
                namespace: str = "pallas", chart: Path = CHART) -> dict[str, str]:
    """Helm's rendering of ``chart`` with ``values`` over its values.yaml: template path -> text.

    Raises:
        helm_python.HelmValuesError: the values fail values.schema.json.
        helm_python.HelmRenderError: a template failed (e.g. the chart's own ``fail``).
    """
    return helm_python.Chart.load(str(chart)).render(values or {}, name=release, namespace=namespace)


def render(values: dict[str, Any] | None = None, **kw: Any) -> dict[str, list[dict[str, Any]]]:
    """The rendered Kubernetes objects by kind (NOTES.txt under the key "NOTES")."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path, text in render_text(values, **kw).items():
        if path.endswith("NOTES.txt"):
            out["NOTES"] = [{"text": text}]
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.setdefault(doc["kind"], []).append(doc)
    return out


def container(objs: dict[str, list[dict[str, Any]]], name: str) -> dict[str, Any]:
    """The Deployment's container ``name`` ("vllm" or "agent")."""
    (dep,) = objs["Deployment"]
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def flags(args: list[str]) -> dict[str, str]:
    """``--flag=value`` arguments as {flag: value} ("" for a bare ``--flag``); a repeated flag
    keeps its last value."""
    return {a.split("=", 1)[0]: (a.split("=", 1)[1] if "=" in a else "") for a in args}
