"""Paths used by the deployment tests: the repository root and the OSC schema beside it
(tests read shared data as <repo>/../shared/..., never a copy in the repository)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DESCRIPTORS = REPO / "descriptors"
OSC_SCHEMA = REPO.parent / "shared" / "osc" / "xapp-descriptor-schema.json"
CHART = REPO / "helm" / "pallas-agent"
