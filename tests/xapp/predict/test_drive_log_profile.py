"""The drive-log predictor profile has one home (descriptors/profiles/drive-log.json): the
scoring command reads it, and the xApp runs exactly that predictor when the profile is merged
into its shipped descriptor (``pallas replay --xapp-profile drive-log``). Every predictor field
is a descriptor key, so a profile can say it (issue 43: the edge-gated timing switches were
not)."""

import dataclasses
import json
from pathlib import Path

from pallas_common.controls import load_profile, merge_controls
from pallas_tools.evaluate import drive_log_config
from xapp.config import load_controls, validate_controls
from xapp.predict.config import PredictorConfig

REPO = Path(__file__).resolve().parents[3]


def _fields(cls, schema: dict, prefix: str = "") -> list[str]:
    missing = []
    for f in dataclasses.fields(cls):
        if f.name not in schema["properties"]:
            missing.append(prefix + f.name)
        elif f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory()):
            missing += _fields(type(f.default_factory()), schema["properties"][f.name], prefix + f.name + ".")
    return missing


def test_every_predictor_field_is_a_descriptor_key():
    schema = json.loads((REPO / "descriptors" / "schema.json").read_text())["properties"]["predictor"]
    assert _fields(PredictorConfig, schema) == []


def test_the_xapp_with_the_profile_runs_the_predictor_the_scoring_command_scores():
    shipped = json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"]
    merged = merge_controls(shipped, load_profile("drive-log"))
    validate_controls(merged)
    assert load_controls(merged).predictor == drive_log_config()
    # and the profile changes what it exists for: the shipped xApp's predictor is not it
    assert load_controls(shipped).predictor != drive_log_config()
    assert drive_log_config().dwell_edge and drive_log_config().places_edge and drive_log_config().dwell_residual


def test_the_profile_reads_the_route_and_casts_the_return_vote():
    # issue 43: the route's successor table and the return vote raise right@2 on the UCC drives
    cfg = drive_log_config()
    assert cfg.history.order == 4 and cfg.w_return > 0 and cfg.return_max_s > 0
