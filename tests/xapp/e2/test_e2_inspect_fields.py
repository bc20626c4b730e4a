"""``python -m xapp.e2.inspect`` prints every decoded field (issue 28 item 5): KPM collection
start time, sender name/type, vendor, file format version, granularity period, UE identities and
per-period values; RC header, UE, cell, every RAN parameter and the copied MeasurementReport."""

import io
import json
from pathlib import Path

import pytest

from pallas_tools import tracegen
from xapp.e2 import e2ap, inspect as e2inspect, rrc, sm_kpm, sm_rc
from xapp.e2.ie import Cgi, Guami, UeId, e2sm_decode_spec, e2sm_spec

CASES = Path(__file__).resolve().parents[3].parent / "shared" / "cases" / "e2"
GNB = UeId(kind="gNB", amf_ue_ngap_id=7, guami=Guami("00101", 2, 3, 1))
DU = UeId(kind="gNB-DU", f1ap_ids=(12,), ran_ue_id=bytes(range(8)))


def _inspect_hex(pdu: bytes) -> tuple[int, dict]:
    out = io.StringIO()
    rc = e2inspect.main(["--hex", pdu.hex(), "--e2-node", "gnb_a"], out=out)
    return rc, json.loads(out.getvalue())


def test_kpm_every_field():
    k = sm_kpm.KpmIndication(
        1_700_000_000.25, (
            sm_kpm.KpmUeReport(GNB, (("L1M.SS-RSRP", -95.0), ("L1M.SS-SINR", 13)), 100,
                               ((("L1M.SS-RSRP", -96.0),), (("L1M.SS-RSRP", -95.0), ("L1M.SS-SINR", 13)))),
            sm_kpm.KpmUeReport(DU, (("DRB.UEThpDl", 1200),))),
        sender_name="gnb-cu-1", file_format_version="3.0", sender_type="CU", vendor_name="acme")
    h, m = tracegen.encode_kpm_indication(k)
    rc, d = _inspect_hex(tracegen.encode_ric_indication(e2ap.RicIndication(4, 5, 2, 6, h, m, sn=77)))
    assert rc == 0
    assert (d["ran_function"], d["request"], d["action"], d["sn"], d["ind_type"], d["service_model"]) == (
        2, [4, 5], 6, 77, "report", "kpm")
    assert d["e2sm"] == {
        "format": 3, "collect_start": 1_700_000_000.25, "collect_start_utc": "2023-11-14T22:13:20.250000Z",
        "sender_name": "gnb-cu-1", "sender_type": "CU", "vendor_name": "acme", "file_format_version": "3.0",
        "ue_reports": [
            {"ue": {"kind": "gNB", "amf_ue_ngap_id": 7,
                    "guami": {"plmn": "00101", "amf_region_id": 2, "amf_set_id": 3, "amf_pointer": 1}},
             "key": "7", "granularity_ms": 100, "values": {"L1M.SS-RSRP": -95.0, "L1M.SS-SINR": 13},
             "periods": [{"L1M.SS-RSRP": -96.0}, {"L1M.SS-RSRP": -95.0, "L1M.SS-SINR": 13}]},
            {"ue": {"kind": "gNB-DU", "f1ap_ids": [12], "ran_ue_id": "0001020304050607"},
             "key": "du-f1ap-12", "values": {"DRB.UEThpDl": 1200}, "periods": [{"DRB.UEThpDl": 1200}]}]}
    assert [r["ue"] for r in d["reports"]] == ["7"] and d["reports"][0]["rsrp_dbm"] == -95.0


def test_kpm_field_case_per_granularity_period():
    p = CASES / "kpm-f3-measdata-per-granularity-period.hex"
    if not p.exists():
        pytest.skip(f"field case {p} not present")
    rc, d = _inspect_hex(bytes.fromhex(p.read_text().strip()))
    assert rc == 0
    e = d["e2sm"]
    assert (e["format"], e["collect_start_utc"]) == (3, "2023-11-14T22:13:20.000000Z")
    assert [(u["key"], u["granularity_ms"], len(u["periods"])) for u in e["ue_reports"]] == [
        ("7", 100, 2), ("8", 100, 2), ("9", 200, 1)]
    assert e["ue_reports"][1]["periods"][0] == {}                         # noValue only
    assert e["ue_reports"][0]["periods"][0] == {"L1M.SS-RSRP": -96.0, "L1M.SS-RSRQ": -11.0, "L1M.SS-SINR": 12.0}


def test_kpm_format1_granularity_and_a_malformed_value():
    info = [{"measType": ("measName", n), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]} for n in ("A", "B")]
    m = e2sm_decode_spec().encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": (
        "indicationMessage-Format1", {"measData": [{"measRecord": [("real", b"\xb0\x00\x01"), ("integer", 4)]}],
                                      "measInfoList": info, "granulPeriod": 250})})
    h = e2sm_spec().encode("E2SM-KPM-IndicationHeader", {"indicationHeader-formats": (
        "indicationHeader-Format1", {"colletStartTime": sm_kpm.time_to_ntp(1_700_000_001.5), "senderName": "du"})})
    rc, d = _inspect_hex(tracegen.encode_ric_indication(e2ap.RicIndication(1, 1, 2, 1, h, m, sn=1)))
    assert rc == 0
    assert d["e2sm"] == {"format": 1, "collect_start": 1_700_000_001.5, "collect_start_utc": "2023-11-14T22:13:21.500000Z",
                         "sender_name": "du", "granularity_ms": 250, "ue_reports": [], "node_values": {"A": None, "B": 4},
                         "dropped": ["malformed value: REAL with the reserved base (first octet 0xb0) "
                                     "(measData item 0, A, Format 1)"]}
    assert d["dropped"] == d["e2sm"]["dropped"]


def test_rc_every_field_of_a_structure_encoded_copy():
    r = rrc.RrcMeasReport(3, (rrc.ServingResult(0, rrc.CellResult(11, -96.0, -18.0, 12.0)),),
                          (rrc.CellResult(13, -99.0, -15.0, 3.0),), 51.9, -8.4)
    octs = tracegen.encode_rrc_meas_report(r)
    copy = sm_rc.RcMessageCopy(octs, GNB, Cgi("00101", 0xA81B0C), 5, 3)
    h, m = tracegen.encode_rc_message_copy(copy, ue_in_message=False, value_type="structure")
    rc, d = _inspect_hex(tracegen.encode_ric_indication(e2ap.RicIndication(1, 1, 3, 1, h, m, sn=2,
                                                                           call_process_id=b"\x01\x02")))
    assert rc == 0 and d["call_process_id"] == "0102"
    e = d["e2sm"]
    gnb = {"kind": "gNB", "amf_ue_ngap_id": 7, "guami": {"plmn": "00101", "amf_region_id": 2, "amf_set_id": 3,
                                                          "amf_pointer": 1}}
    assert e["header"] == {"format": 3, "condition_id": 5, "ue": gnb}
    assert (e["ue"], e["ue_key"], e["cell"]) == (gnb, "7", {"plmn": "00101", "cell_id": 0xA81B0C, "rat": "nr"})
    assert e["ran_parameters"] == [
        {"id": 3, "key": True, "in": "1", "type": "valueOctS", "value": octs.hex()},
        {"id": 6, "key": True, "in": "1", "type": "valueOctS", "value": tracegen.encode_cgi(Cgi("00101", 0xA81B0C)).hex()}]
    assert e["rrc"]["meas_id"] == 3 and e["rrc"]["octets"] == len(octs)
    assert e["rrc"]["serving"] == [{"serv_cell_index": 0, "cell": {"pci": 11, "rsrp_dbm": -96.0, "rsrq_db": -18.0,
                                                                   "sinr_db": 12.0}}]
    assert e["rrc"]["neighbours"] == [{"pci": 13, "rsrp_dbm": -99.0, "rsrq_db": -15.0, "sinr_db": 3.0}]
    assert round(e["rrc"]["lat"], 4) == 51.9 and round(e["rrc"]["lon"], 4) == -8.4


def test_an_e2sm_drop_still_shows_the_e2ap_fields():
    m = e2sm_spec().encode("E2SM-RC-IndicationMessage", {"ric-indicationMessage-formats": (
        "indicationMessage-Format1", {"ranP-Reported-List": [
            {"ranParameter-ID": 3, "ranParameter-valueType": ("ranP-Choice-ElementFalse", {
                "ranParameter-value": ("valueInt", 5)})}]})})
    rc, d = _inspect_hex(tracegen.encode_ric_indication(e2ap.RicIndication(9, 8, 3, 7, tracegen.rc_header(3, 1, GNB),
                                                                           m, sn=3)))
    assert rc == 1
    assert (d["ran_function"], d["request"], d["action"], d["sn"]) == (3, [9, 8], 7, 3)
    assert d["error"] == "E2SM-RC: RAN parameter 3 (RRC Message) is valueInt, not an OCTET STRING"
