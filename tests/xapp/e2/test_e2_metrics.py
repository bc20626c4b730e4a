"""E2 ingest metrics for operators (issue 28 item 4): drops by reason class on the registry,
and drop reasons without their repeated layer prefix."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from xapp.e2.ingest import Ingestor, _unprefixed, reason_class
from xapp.tracks import TrackStore


@pytest.mark.parametrize("reason, cls", [
    ("E2SM-KPM v2.03: record count: measData item 3 has 2 values for 3 names (x)", "E2SM-KPM: record count"),
    ("value out of range: L1M.SS-RSRP=nan (UE 7)", "value out of range"),
    ("E2SM-RC: message copy (header Format 1) has no RRC Message (RAN parameter 3)",
     "E2SM-RC: message copy has no RRC Message"),
    ("E2AP: unexpected structure (TypeError: a (b) c)", "E2AP: unexpected structure"),
    ("unknown RAN function: 7", "unknown RAN function"),
    ("internal error: ValueError: boom", "internal error"),
    ("MeasurementReport has no serving cell result", "MeasurementReport has no serving cell result"),
])
def test_reason_class_keeps_the_kind_and_drops_the_details(reason, cls):
    assert reason_class(reason) == cls


def test_a_decoder_reason_naming_its_layer_again_is_not_prefixed_twice():
    assert _unprefixed("E2SM-RC message copy (header Format 1) has no RRC Message", "E2SM-RC") == \
        "message copy (header Format 1) has no RRC Message"
    assert _unprefixed("E2SM-KPM: unexpected structure (KeyError: 'x')", "E2SM-KPM") == \
        "unexpected structure (KeyError: 'x')"
    assert _unprefixed("E2SM-KPM-IndicationHeader: out of data", "E2SM-KPM") == \
        "E2SM-KPM-IndicationHeader: out of data"          # a type name, not the layer again


def test_drops_are_counted_by_reason_on_the_registry_and_logged_once_prefixed(e2):
    reg = CollectorRegistry()
    ing = Ingestor(TrackStore(), registry=reg)
    with capture_logs() as logs:
        assert ing.on_indication(e2.rc_indication(e2.ue(1), e2.rrc()), "n", t=1.0)
        ing.on_indication(e2.kpm_indication([(e2.ue(1), [("L1M.SS-RSRP", -90.0)])], rf=3), "n", t=2.0)
        ing.on_indication(e2.rc_indication(e2.ue(1), e2.rrc(), rf=9), "n", t=3.0)
        ing.on_indication(e2.kpm_indication([(e2.ue(2), [("L1M.SS-RSRP", 90.0)])]), "n", t=4.0)
        ing.on_indication(e2.kpm_indication([(e2.ue(3), [("L1M.SS-RSRP", 95.0)])]), "n", t=5.0)
    reasons = [x["reason"] for x in logs if x["event"] == "e2_dropped"]
    assert len(reasons) == 4
    assert reasons[0].startswith("E2SM-RC: ") and not reasons[0].startswith("E2SM-RC: E2SM-RC")
    assert reasons[1] == "unknown RAN function: 9"
    get = reg.get_sample_value
    assert get("pallas_e2_dropped_total", {"reason": "value out of range"}) == 2
    assert get("pallas_e2_dropped_total", {"reason": "unknown RAN function"}) == 1
    assert get("pallas_e2_dropped_total", {"reason": reason_class(reasons[0])}) == 1
    assert get("pallas_e2_indications_total", {"outcome": "ok"}) == 3      # KPM with a bad value: UE dropped
    assert get("pallas_e2_indications_total", {"outcome": "dropped"}) == 2
    assert get("pallas_e2_reports_total") == 1
    assert get("pallas_e2_unused_total", {"kind": "no mapped measurement"}) == 2


def test_reason_classes_are_bounded():
    ing = Ingestor(TrackStore())
    for k in range(ing.MAX_REASON_CLASSES + 10):
        ing._drop(f"reason number {k}")
    assert len(ing.reasons) == ing.MAX_REASON_CLASSES + 1 and ing.reasons["other"] == 10
