"""The descriptor the replay hands the xApp names every replayed scheme as the descriptor's schema
spells it (a scheme the xApp refuses stops that scheme's run with no decisions at all: on
d242e74 pallas-bridge and full-copy ran without an xApp, 'full_copy' is not one of the enum)."""

import json
from pathlib import Path

import pytest

from pallas_common.schemes import ABLATIONS, REPLAYED
from pallas_eval.cluster import LocalAgent
from pallas_eval.replay import Server, xapp_descriptor

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scheme", REPLAYED + ABLATIONS)
def test_every_replayed_scheme_is_one_the_descriptor_accepts(scheme, tmp_path):
    enum = json.loads((REPO / "descriptors" / "schema.json").read_text())["definitions"]["scheme"]["enum"]
    agent = LocalAgent("edge-0", "m", log_dir=str(tmp_path))
    agent.insecure = True
    desc = xapp_descriptor({"cells": []}, {}, [Server(0, agent, None, 1)], scheme)
    assert desc["controls"]["scheme"] in enum
    assert desc["controls"]["scheme"] == scheme


def test_a_scheme_run_without_its_xapp_fails_the_replay():
    from pallas_eval.cli import replay_status
    assert replay_status({"errors": {}, "leftover_pids": []}) == 0
    assert replay_status({"errors": {"ctho": ["a UE's session failed: x"]}, "leftover_pids": []}) == 0
    assert replay_status({"errors": {"full-copy": ["the xApp wrote no events\n--- last lines"]}}) == 1
    assert replay_status({"errors": {}, "leftover_pids": [12]}) == 1
