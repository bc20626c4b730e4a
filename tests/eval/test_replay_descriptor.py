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


def test_xapp_profile_and_settings_reach_the_descriptor_the_xapp_reads(tmp_path):
    """``pallas replay --xapp-profile drive-log --xapp-set scheduler.targets_k=2``: both land in
    the scheme's descriptor, nested objects merged (the profile's a3 keys beside the shipped
    ones), the replay's own agents and scheme kept."""
    from pallas_eval.cli import build_parser, options_from_args

    a = build_parser().parse_args(["replay", "--xapp-profile", "drive-log", "--xapp-set", "scheduler.targets_k=2",
                                   "--xapp-set", "predictor.a3.offset_db=2.5", "--out", str(tmp_path / "r")])
    opts = options_from_args(a)
    agent = LocalAgent("edge-0", "m", log_dir=str(tmp_path))
    agent.insecure = True
    c = xapp_descriptor({"cells": []}, {}, [Server(0, agent, None, 1)], "pallas", opts.xapp_controls)["controls"]
    shipped = json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"]
    assert c["scheduler"]["targets_k"] == 2
    assert c["scheduler"]["alpha"] == shipped["scheduler"]["alpha"]
    assert c["predictor"]["dwell_edge"] is True and c["predictor"]["min_confidence"] == 0.0
    assert c["predictor"]["a3"]["trend"] == "all_pairs" and c["predictor"]["a3"]["offset_db"] == 2.5
    assert c["predictor"]["a3"]["hysteresis_db"] == shipped["predictor"]["a3"]["hysteresis_db"]
    assert c["predictor"]["cvh"] == shipped["predictor"]["cvh"]
    assert c["scheme"] == "pallas" and list(c["agents"]) == ["edge-0"]


@pytest.mark.parametrize("argv, says", [
    (["--xapp-profile", "no-such-profile"], "not one of the shipped profiles"),
    (["--xapp-set", "scheduler.targets_kk=2"], "targets_kk"),
    (["--xapp-set", "predictor.min_confidence=3"], "controls.predictor.min_confidence"),
    (["--xapp-set", "targets_k=2"], "section.key=VALUE"),
])
def test_a_bad_xapp_control_stops_the_replay_before_it_starts(argv, says, tmp_path):
    from pallas_eval.cli import build_parser, options_from_args

    a = build_parser().parse_args(["replay", *argv, "--out", str(tmp_path / "r")])
    with pytest.raises(SystemExit) as e:
        options_from_args(a)
    assert says in str(e.value)
    assert not (tmp_path / "r").exists()
