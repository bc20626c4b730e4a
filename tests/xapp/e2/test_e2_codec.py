"""E2AP / E2SM-RC / E2SM-KPM / NR RRC codec: hand-built messages, byte-identical round trips,
the fast PER walkers against pycrate."""

import math
import random

import pytest

from pallas_tools.tracegen import (encode_cgi, encode_kpm_indication, encode_rc_message_copy,
                                   encode_ric_indication, encode_ric_indication_pycrate,
                                   encode_rrc_meas_report, encode_rrc_meas_report_pycrate, encode_ueid)
from xapp.e2.e2ap import RicIndication, decode_e2ap_pycrate, decode_ric_indication
from xapp.e2.ie import (Cgi, E2DecodeError, GlobalGnbId, Guami, UeId, cgi_to_asn, decode_cgi, decode_ueid,
                        e2sm_spec, plmn_from_bytes, plmn_to_bytes, ueid_to_asn)
from xapp.e2.rrc import (EutraResult, decode_location, decode_rrc_meas_report,
                         decode_rrc_meas_report_pycrate, decode_velocity)
from xapp.e2.sm_kpm import (KpmIndication, KpmUeReport, decode_kpm_indication,
                            kpm_action_definition_ue_level, kpm_event_trigger, time_to_ntp)
from xapp.e2.sm_rc import (RcMessageCopy, decode_rc_message_copy, rc_action_definition_message_copy,
                           rc_event_trigger_message_copy)
from pallas_tools import tracegen
from xapp.e2 import per, rrc, sm_rc, units


# ----------------------------------------------------------------------------- units (TS 38.133)

def test_ts38133_reporting_ranges():
    assert units.rsrp_to_index(-156) == 0 and units.index_to_rsrp(0) == -156
    assert units.rsrp_to_index(-99) == 57 and units.index_to_rsrp(57) == -99
    assert units.rsrp_to_index(-200) == 0 and units.rsrp_to_index(0) == 127  # clamped
    assert units.rsrq_to_index(-43) == 0 and units.index_to_rsrq(126) == 20
    assert units.rsrq_to_index(-15.5) == 55 and units.index_to_rsrq(55) == -15.5
    assert units.sinr_to_index(-23) == 0 and units.index_to_sinr(127) == 40.5
    assert units.sinr_to_index(6.0) == 58 and units.index_to_sinr(58) == 6.0
    for x in range(-156, -30):
        assert units.quantise_rsrp(float(x)) == x
    for h in range(-86, 41):
        assert units.quantise_rsrq(h / 2) == h / 2


def test_lpp_position_and_velocity_resolution():
    for lat, lon in [(51.935604, -8.388186), (-33.9, 151.2), (0.0, 0.0), (89.99, 179.99)]:
        s, n = units.lat_to_lpp(lat)
        assert abs(units.lpp_to_lat(s, n) - lat) < 0.6e-5
        assert abs(units.lpp_to_lon(units.lon_to_lpp(lon)) - lon) < 1.1e-5
    assert units.speed_to_kmh(36 / 3.6) == 36 and units.heading_to_bearing(359.7) == 0
    with pytest.raises(ValueError):
        units.lat_to_lpp(91)


def test_plmn_tbcd():
    assert plmn_to_bytes("00101") == bytes([0x00, 0xF1, 0x10])
    assert plmn_to_bytes("310410") == bytes([0x13, 0x00, 0x14])
    for p in ("00101", "27201", "310410", "999999"):
        assert plmn_from_bytes(plmn_to_bytes(p)) == p
    with pytest.raises(E2DecodeError):
        plmn_from_bytes(b"\xff\xff\xff")


# ----------------------------------------------------------------------------- hand-built messages

def test_hand_built_e2ap_indication_with_rc_message_copy_decodes():
    """Every layer built by hand from the specifications' field names, then decoded by Pallas."""
    from pycrate_asn1dir import E2AP, RRCNR
    ul = RRCNR.NR_RRC_Definitions.UL_DCCH_Message
    ul.set_val({"message": ("c1", ("measurementReport", {"criticalExtensions": ("measurementReport", {
        "measResults": {
            "measId": 2,
            "measResultServingMOList": [{"servCellId": 0, "measResultServingCell": {
                "physCellId": 101, "measResult": {"cellResults": {"resultsSSB-Cell": {"rsrp": 60, "rsrq": 70, "sinr": 80}}}}}],
            "measResultNeighCells": ("measResultListNR", [
                {"physCellId": 102, "measResult": {"cellResults": {"resultsSSB-Cell": {"rsrp": 55, "rsrq": 66}}}},
                {"physCellId": 103, "measResult": {"cellResults": {"resultsSSB-Cell": {"rsrp": 50}}}}]),
        }})}))})
    rrc_bytes = ul.to_uper()
    s = e2sm_spec()
    ueid = s.encode("UEID", ("gNB-UEID", {
        "amf-UE-NGAP-ID": 4242, "guami": {"pLMNIdentity": b"\x72\xf2\x10", "aMFRegionID": (b"\x80", 8),
                                          "aMFSetID": (b"\x00\x40", 10), "aMFPointer": (b"\x04", 6)},
        "ran-UEID": b"\x00\x00\x00\x00\x00\x00\x00\x09"}))
    cgi = s.encode("CGI", ("nR-CGI", {"pLMNIdentity": b"\x72\xf2\x10", "nRCellIdentity": (b"\x00\xa8\x1b\x0c\x10", 36)}))
    header = s.encode("E2SM-RC-IndicationHeader", {"ric-indicationHeader-formats": (
        "indicationHeader-Format1", {"ric-eventTriggerCondition-ID": 5})})
    message = s.encode("E2SM-RC-IndicationMessage", {"ric-indicationMessage-formats": ("indicationMessage-Format1", {
        "ranP-Reported-List": [
            {"ranParameter-ID": 3, "ranParameter-valueType": ("ranP-Choice-ElementTrue", {"ranParameter-value": ("valueOctS", rrc_bytes)})},
            {"ranParameter-ID": 4, "ranParameter-valueType": ("ranP-Choice-ElementTrue", {"ranParameter-value": ("valueOctS", ueid)})},
            {"ranParameter-ID": 6, "ranParameter-valueType": ("ranP-Choice-ElementTrue", {"ranParameter-value": ("valueOctS", cgi)})},
        ]})})
    pdu = E2AP.E2AP_PDU_Descriptions.E2AP_PDU
    pdu.set_val(("initiatingMessage", {"procedureCode": 5, "criticality": "ignore", "value": ("RICindication", {"protocolIEs": [
        {"id": 29, "criticality": "reject", "value": ("RICrequestID", {"ricRequestorID": 123, "ricInstanceID": 9})},
        {"id": 5, "criticality": "reject", "value": ("RANfunctionID", 3)},
        {"id": 15, "criticality": "reject", "value": ("RICactionID", 1)},
        {"id": 27, "criticality": "reject", "value": ("RICindicationSN", 77)},
        {"id": 28, "criticality": "reject", "value": ("RICindicationType", "report")},
        {"id": 25, "criticality": "reject", "value": ("RICindicationHeader", header)},
        {"id": 26, "criticality": "reject", "value": ("RICindicationMessage", message)},
    ]})}))
    ind = decode_ric_indication(pdu.to_aper())
    assert (ind.ric_requestor_id, ind.ric_instance_id, ind.ran_function_id, ind.action_id, ind.sn) == (123, 9, 3, 1, 77)
    copy = decode_rc_message_copy(ind.header, ind.message)
    assert copy.condition_id == 5
    assert copy.ue.key == "4242" and copy.ue.guami == Guami("27201", 128, 1, 1)
    assert copy.ue.ran_ue_id == b"\x00" * 7 + b"\x09"
    assert copy.cell == Cgi("27201", 0xA81B0C1, "nr")
    r = decode_rrc_meas_report(copy.rrc)
    assert r.meas_id == 2
    pc = r.serving[0].cell
    assert (pc.pci, pc.rsrp_dbm, pc.rsrq_db, pc.sinr_db) == (101, -96.0, -8.0, 17.0)
    assert [(n.pci, n.rsrp_dbm) for n in r.neighbours] == [(102, -101.0), (103, -106.0)]
    assert r.neighbours[0].rsrq_db == -10.0 and math.isnan(r.neighbours[1].rsrq_db)
    assert math.isnan(r.lat) and math.isnan(r.speed_mps)


def test_hand_built_kpm_format3_decodes():
    s = e2sm_spec()
    u = ("gNB-UEID", {"amf-UE-NGAP-ID": 5, "guami": {"pLMNIdentity": b"\x00\xf1\x10", "aMFRegionID": (b"\x01", 8),
                                                      "aMFSetID": (b"\x00\x40", 10), "aMFPointer": (b"\x00", 6)}})
    header = s.encode("E2SM-KPM-IndicationHeader", {"indicationHeader-formats": ("indicationHeader-Format1", {
        "colletStartTime": time_to_ntp(1_700_000_000.25), "senderName": "gnb-7"})})
    message = s.encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": ("indicationMessage-Format3", {
        "ueMeasReportList": [{"ueID": u, "measReport": {
            "measData": [{"measRecord": [("real", -97.5), ("integer", 12), ("noValue", None)]}],
            "measInfoList": [{"measType": ("measName", n), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]}
                             for n in ("L1M.SS-RSRP", "L1M.SS-SINR", "L1M.SS-RSRQ")],
            "granulPeriod": 1000}}]})})
    k = decode_kpm_indication(header, message)
    assert k.collect_start == 1_700_000_000.25 and k.sender_name == "gnb-7"
    (r,) = k.ue_reports
    assert r.ue.key == "5" and r.granularity_ms == 1000
    assert r.values == (("L1M.SS-RSRP", -97.5), ("L1M.SS-SINR", 12), ("L1M.SS-RSRQ", None))


def test_subscription_payloads_decode_to_the_spec_fields():
    s = e2sm_spec()
    et = s.decode("E2SM-RC-EventTrigger", rc_event_trigger_message_copy(4))
    item = et["ric-eventTrigger-formats"][1]["message-List"][0]
    assert item["ric-eventTriggerCondition-ID"] == 4
    assert item["messageType"] == ("messageType-Choice-RRC", {"rRC-Message": {"rrcType": ("nR", "uL-DCCH"), "messageID": 0}})
    ad = s.decode("E2SM-RC-ActionDefinition", rc_action_definition_message_copy())
    assert ad["ric-Style-Type"] == 1
    assert [p["ranParameter-ID"] for p in ad["ric-actionDefinition-formats"][1]["ranP-ToBeReported-List"]] == [3, 4, 6]
    kt = s.decode("E2SM-KPM-EventTriggerDefinition", kpm_event_trigger(500))
    assert kt["eventDefinition-formats"] == ("eventDefinition-Format1", {"reportingPeriod": 500})
    ka = s.decode("E2SM-KPM-ActionDefinition", kpm_action_definition_ue_level(["A", "B"], 100, Cgi("00101", 5)))
    assert ka["ric-Style-Type"] == 4
    f4 = ka["actionDefinition-formats"][1]
    assert [m["measType"][1] for m in f4["subscriptionInfo"]["measInfoList"]] == ["A", "B"]
    assert f4["matchingUeCondList"][0]["testCondInfo"]["testType"] == ("rSRP", "true")


# ----------------------------------------------------------------------------- round trips

UES = [
    UeId(kind="gNB", amf_ue_ngap_id=1, guami=Guami()),
    UeId(kind="gNB", amf_ue_ngap_id=(1 << 40) - 1, guami=Guami("310410", 255, 1023, 63), f1ap_ids=(1, 2),
         e1ap_ids=(3,), ran_ue_id=b"12345678", xnap_id=99, global_gnb=GlobalGnbId("00101", 0xA81B, 22)),
    UeId(kind="gNB-DU", f1ap_ids=(4294967295,), ran_ue_id=b"abcdefgh"),
    UeId(kind="gNB-CU-UP", e1ap_ids=(0,)),
]


@pytest.mark.parametrize("u", UES, ids=lambda u: u.kind)
def test_ueid_round_trip_byte_identical(u):
    s = e2sm_spec()
    b = s.encode("UEID", ueid_to_asn(u))
    back = decode_ueid(b)
    assert back == u
    assert s.encode("UEID", ueid_to_asn(back)) == b


@pytest.mark.parametrize("c", [Cgi("00101", (1 << 36) - 1, "nr"), Cgi("27201", 0xA81B0C, "eutra")])
def test_cgi_round_trip_byte_identical(c):
    s = e2sm_spec()
    b = s.encode("CGI", cgi_to_asn(c))
    assert decode_cgi(b) == c and s.encode("CGI", cgi_to_asn(decode_cgi(b))) == b


def test_rrc_round_trip_byte_identical(e2):
    rng = random.Random(3)
    for _ in range(200):
        r = e2.random_rrc(rng)
        b = encode_rrc_meas_report(r)
        back = decode_rrc_meas_report(b)
        assert encode_rrc_meas_report(back) == b
        assert back.serving[0].cell.rsrp_dbm == units.quantise_rsrp(r.serving[0].cell.rsrp_dbm) or (
            math.isnan(r.serving[0].cell.rsrp_dbm))


def test_rc_message_copy_round_trip_byte_identical(e2):
    for u in UES:
        for cell in (None, Cgi("00101", 123456789)):
            m = RcMessageCopy(encode_rrc_meas_report(e2.rrc()), u, cell, condition_id=9)
            h, msg = encode_rc_message_copy(m)
            back = decode_rc_message_copy(h, msg)
            assert back == m
            assert encode_rc_message_copy(back) == (h, msg)


def test_kpm_round_trip_byte_identical(e2):
    k = KpmIndication(1_700_000_123.5, (
        KpmUeReport(UES[0], (("L1M.SS-RSRP", -97.5), ("L1M.SS-SINR", 12), ("x", None)), 1000),
        KpmUeReport(UES[2], (("L1M.SS-RSRQ", -10.0),))), sender_name="n")
    h, m = encode_kpm_indication(k)
    back = decode_kpm_indication(h, m)
    assert (back.collect_start, back.sender_name, back.format) == (k.collect_start, k.sender_name, 3)
    assert [(r.ue, r.values, r.granularity_ms) for r in back.ue_reports] == [
        (r.ue, r.values, r.granularity_ms) for r in k.ue_reports]
    assert back.ue_reports[0].periods == ((("L1M.SS-RSRP", -97.5), ("L1M.SS-SINR", 12)),)  # noValue skipped
    assert encode_kpm_indication(back) == (h, m)


def test_ric_indication_round_trip_byte_identical_and_pycrate_agrees():
    rng = random.Random(5)
    for _ in range(200):
        ind = RicIndication(rng.randrange(65536), rng.randrange(65536), rng.randrange(4096), rng.randrange(256),
                            bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))),
                            bytes(rng.randrange(256) for _ in range(rng.choice([0, 5, 127, 128, 300, 16000]))),
                            rng.choice([None, rng.randrange(65536)]), rng.choice(["report", "insert"]),
                            rng.choice([None, b"", b"\x01\x02"]))
        b = encode_ric_indication(ind)
        assert b == encode_ric_indication_pycrate(ind)
        assert decode_ric_indication(b) == ind == decode_e2ap_pycrate(b)
        assert encode_ric_indication(decode_ric_indication(b)) == b


def test_subscription_payloads_round_trip_byte_identical():
    s = e2sm_spec()
    for t, b in [("E2SM-RC-EventTrigger", rc_event_trigger_message_copy()),
                 ("E2SM-RC-ActionDefinition", rc_action_definition_message_copy()),
                 ("E2SM-KPM-EventTriggerDefinition", kpm_event_trigger(1000)),
                 ("E2SM-KPM-ActionDefinition", kpm_action_definition_ue_level(["L1M.SS-RSRP"], 1000))]:
        assert s.encode(t, s.decode(t, b)) == b


# ----------------------------------------------------------------------------- fast paths == pycrate

def test_fast_rrc_encoder_and_decoder_match_pycrate(e2):
    rng = random.Random(11)
    for _ in range(400):
        r = e2.random_rrc(rng)
        b = encode_rrc_meas_report(r)
        assert b == encode_rrc_meas_report_pycrate(r)
        assert repr(decode_rrc_meas_report(b)) == repr(decode_rrc_meas_report_pycrate(b))


def test_rrc_shapes_outside_the_fast_walker_fall_back_to_pycrate():
    from pycrate_asn1dir import RRCNR
    ul = RRCNR.NR_RRC_Definitions.UL_DCCH_Message
    ul.set_val({"message": ("c1", ("measurementReport", {"criticalExtensions": ("measurementReport", {
        "measResults": {"measId": 1, "measResultServingMOList": [{"servCellId": 0, "measResultServingCell": {
            "physCellId": 1, "measResult": {"cellResults": {"resultsSSB-Cell": {"rsrp": 70}}}}}],
            "measResultNeighCells": ("measResultListEUTRA", [
                {"eutra-PhysCellId": 77, "measResult": {"rsrp": 40, "rsrq": 20}}])}})}))})
    b = ul.to_uper()
    with pytest.raises(per.Unsupported):
        rrc.decode_meas_report_fast(b)
    got = decode_rrc_meas_report(b)
    assert got.serving[0].cell.rsrp_dbm == -86.0
    assert got.eutra_neighbours == (EutraResult(77, 40, 20, None),) and got.neighbours == ()


def test_fast_rc_params_match_asn1tools(e2):
    s = e2sm_spec()
    for u in UES:
        for n in (0, 1, 127, 128, 5000):
            items = [(3, b"\x01" * n), (4, encode_ueid(u)), (6, encode_cgi(Cgi("00101", 1))), (70000, b"x")]
            msg = tracegen.encode_rc_octs_params(items)
            assert msg == s.encode("E2SM-RC-IndicationMessage", {"ric-indicationMessage-formats": (
                "indicationMessage-Format1", {"ranP-Reported-List": [tracegen._elem_octs(p, b) for p, b in items]})})
            assert sm_rc.decode_rc_octs_params(msg) == sm_rc.rc_params_asn1tools(msg) == dict(items)


def test_non_indication_e2ap_is_rejected_with_reason():
    from pycrate_asn1dir import E2AP
    pdu = E2AP.E2AP_PDU_Descriptions.E2AP_PDU
    pdu.set_val(("initiatingMessage", {"procedureCode": 8, "criticality": "ignore", "value": (
        "RICserviceQuery", {"protocolIEs": [{"id": 49, "criticality": "reject", "value": ("TransactionID", 1)}]})}))
    with pytest.raises(E2DecodeError, match="not a RICindication"):
        decode_ric_indication(pdu.to_aper())


def test_truncated_pdus_raise_e2decodeerror_only(e2):
    b = e2.rc_indication(e2.ue(), e2.rrc(lat=51.9, lon=-8.4, speed=10.0, heading=90.0))
    for n in range(len(b)):
        with pytest.raises(E2DecodeError):
            ind = decode_ric_indication(b[:n])
            c = decode_rc_message_copy(ind.header, ind.message)
            decode_rrc_meas_report(c.rrc)


def test_kpm_labels_other_than_nolabel_decode():
    s = e2sm_spec()
    lab = {"sliceID": {"sST": b"\x01", "sD": b"\x00\x00\x07"}, "fiveQI": 9, "plmnID": b"\x00\xf1\x10", "avg": "true"}
    b = s.encode("MeasurementLabel", lab)
    assert s.decode("MeasurementLabel", b) == lab
    # extension bit 0, 21 presence bits (only noLabel), noLabel's own extension bit: 23 bits
    assert s.encode("MeasurementLabel", {"noLabel": "true"}) == bytes.fromhex("400000")


@pytest.mark.parametrize("decode, octets", [
    (decode_velocity, bytes.fromhex("80000000")),            # Velocity extension alternative
    (decode_location, bytes.fromhex("86000000")),            # LocationCoordinates extension
])
def test_extension_alternatives_of_position_and_velocity_are_e2decodeerror(decode, octets):
    # pycrate returns an unknown extension alternative's value as bytes, not a dict; found by
    # fuzzing the ingest path, where it escaped as TypeError ("internal error").
    with pytest.raises(E2DecodeError, match="unsupported"):
        decode(octets)


def test_rc_copy_whose_velocity_is_an_extension_alternative_is_dropped_with_reason():
    # A mutated RC message copy from the ingest fuzzer: the RRC report's velocityEstimate-r16
    # holds an extension alternative of TS 37.355 Velocity.
    from xapp.e2.ingest import Ingestor
    from xapp.tracks import TrackStore
    pdu = bytes.fromhex(
        "0005407a000007001d00050000010001000500020003000f000101001b00020016001c000100001900"
        "0403080000001a004c4b0000020002042800c410013fd04f00a2d827aee1b8222284bc0155d675d021"
        "03908241c25dc448368d8800ed402e800003040b0008039a0000f1100200c1000504090000f110000a"
        "81b0c048aa009473")
    ing = Ingestor(TrackStore())
    assert ing.on_indication(pdu, "n", t=0.0) == []
    assert ing.stats["dropped:E2SM-RC"] == 1, ing.stats
