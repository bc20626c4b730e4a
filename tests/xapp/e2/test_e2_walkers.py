"""The fast walkers against the reference decoders (asn1tools, pycrate), field for field, on
generated PDUs of every shape the walkers read and some they must hand back."""

import math
import random

import pytest

from xapp.e2 import rrc, sm_kpm, tracegen
from xapp.e2.ie import E2DecodeError, Guami, UeId, asn_decode, e2sm_spec, ueid_to_asn
from xapp.e2.per import Unsupported

NAN = math.nan


def _val(rng: random.Random):
    return rng.choice([None, rng.randrange(0, 1 << 32), float(rng.randrange(-200, 200)),
                       rng.randrange(-4000, 4000) / 8, rng.uniform(-1e6, 1e6), 0.0])


def _kpm_message(rng: random.Random, labels: bool = False) -> bytes:
    reports = []
    for _ in range(rng.randrange(1, 6)):
        u = UeId(kind="gNB", amf_ue_ngap_id=rng.randrange(1 << 40),
                 guami=Guami("00101" if rng.random() < 0.5 else "310410", rng.randrange(256), rng.randrange(1024),
                             rng.randrange(64)))
        if rng.random() < 0.3:
            u = UeId(kind="gNB-DU", f1ap_ids=(rng.randrange(1 << 32),),
                     ran_ue_id=rng.choice([None, bytes(rng.randrange(256) for _ in range(8))]))
        n = rng.randrange(1, 5)
        info = []
        for j in range(n):
            mt = ("measName", rng.choice(["L1M.SS-RSRP", "DRB.UEThpDl", "x" * rng.randrange(1, 150)])) \
                if rng.random() < 0.8 else ("measID", rng.randrange(1, 65537))
            lab = [{"measLabel": {"noLabel": "true"}}]
            if labels and rng.random() < 0.5:
                lab = [{"measLabel": {"fiveQI": rng.randrange(256)}}, {"measLabel": {"sliceID": {"sST": b"\x01"}}}]
            info.append({"measType": mt, "labelInfoList": lab})
        width = sum(len(i["labelInfoList"]) for i in info)
        data = []
        for _ in range(rng.randrange(1, 4)):
            item = {"measRecord": [tracegen._record_item(_val(rng)) for _ in range(width)]}
            if rng.random() < 0.2:
                item["incompleteFlag"] = "true"
            data.append(item)
        f1 = {"measData": data, "measInfoList": info}
        if rng.random() < 0.7:
            f1["granulPeriod"] = rng.randrange(1, 1 << 32)
        reports.append({"ueID": ueid_to_asn(u), "measReport": f1})
    return e2sm_spec().encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": (
        "indicationMessage-Format3", {"ueMeasReportList": reports})})


def test_kpm_format3_walker_equals_asn1tools_on_generated_pdus():
    rng = random.Random(14)
    covered = 0
    for _ in range(300):
        m = _kpm_message(rng)
        ref = asn_decode("E2SM-KPM-IndicationMessage", m)["indicationMessage-formats"]
        try:
            got = sm_kpm.decode_f3_fast(m)
        except Unsupported:
            continue
        covered += 1
        assert repr(got) == repr(ref)
    assert covered == 300  # every generated shape above is a walker shape


def test_kpm_walker_hands_labels_back_and_the_result_is_asn1tools():
    rng = random.Random(15)
    handed = 0
    for _ in range(100):
        m = _kpm_message(rng, labels=True)
        ref = asn_decode("E2SM-KPM-IndicationMessage", m)["indicationMessage-formats"]
        try:
            got = sm_kpm.decode_f3_fast(m)
            assert repr(got) == repr(ref)
        except Unsupported:
            handed += 1
        assert sm_kpm.decode_message_value(m) == ref or repr(sm_kpm.decode_message_value(m)) == repr(ref)
    assert handed > 10


def test_kpm_labels_become_keys_and_records_map_per_label():
    u = UeId(kind="gNB", amf_ue_ngap_id=5, guami=Guami())
    m = e2sm_spec().encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": (
        "indicationMessage-Format3", {"ueMeasReportList": [{"ueID": ueid_to_asn(u), "measReport": {
            "measData": [{"measRecord": [("integer", 10), ("integer", 20), ("noValue", None)]}],
            "measInfoList": [
                {"measType": ("measName", "DRB.UEThpDl"), "labelInfoList": [
                    {"measLabel": {"fiveQI": 9}}, {"measLabel": {"sliceID": {"sST": b"\x01", "sD": b"\x00\x00\x02"}}}]},
                {"measType": ("measID", 3), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]}]}}]})})
    h = b"\x00" + sm_kpm.time_to_ntp(1.0)
    k = sm_kpm.decode_kpm_indication(h, m)
    assert k.ue_reports[0].values == (("DRB.UEThpDl|fiveQI=9", 10), ("DRB.UEThpDl|sliceID=01-000002", 20),
                                      ("measID:3", None))


def test_kpm_per_ue_problem_drops_that_ue_only():
    good = UeId(kind="gNB", amf_ue_ngap_id=1, guami=Guami())
    bad = UeId(kind="gNB", amf_ue_ngap_id=2, guami=Guami())
    info = [{"measType": ("measName", "L1M.SS-RSRP"), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]}]
    m = e2sm_spec().encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": (
        "indicationMessage-Format3", {"ueMeasReportList": [
            {"ueID": ueid_to_asn(good), "measReport": {"measData": [{"measRecord": [("real", -90.0)]}],
                                                       "measInfoList": info}},
            {"ueID": ueid_to_asn(bad), "measReport": {"measData": [{"measRecord": [("real", -90.0)] * 3}],
                                                      "measInfoList": info}},
            {"ueID": ("ng-eNB-UEID", None), "measReport": {"measData": [{"measRecord": [("real", -1.0)]}],
                                                            "measInfoList": info}}]})})
    k = sm_kpm.decode_kpm_indication(b"\x00" + sm_kpm.time_to_ntp(1.0), m)
    assert [r.ue.key for r in k.ue_reports] == ["1"]
    assert k.dropped == ("record count: measData item 0 has 3 values for 1 measurement/label pairs (UE 2)",
                         "UE report: unsupported UEID kind ng-eNB-UEID")


def test_kpm_formats_1_and_2():
    info = [{"measType": ("measName", "RRU.PrbUsedDl"), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]}]
    m1 = e2sm_spec().encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": (
        "indicationMessage-Format1", {"measData": [{"measRecord": [("integer", 5)]}, {"measRecord": [("integer", 7)]}],
                                      "measInfoList": info})})
    h = b"\x00" + sm_kpm.time_to_ntp(2.0)
    k1 = sm_kpm.decode_kpm_indication(h, m1)
    assert (k1.format, k1.node_values, k1.ue_reports) == (1, (("RRU.PrbUsedDl", 7),), ())
    u = UeId(kind="gNB", amf_ue_ngap_id=9, guami=Guami())
    for fam, ver, cond in ((3, "3.00", {"matchingCondChoice": ("testCondInfo", {"testType": ("rSRP", "true")})}),
                           (2, "2.03", ("testCondInfo", {"testType": ("rSRP", "true")}))):
        body = {"measData": [{"measRecord": [("real", -88.0), ("integer", 40)]}],
                "measCondUEidList": [
                    {"measType": ("measName", "L1M.SS-RSRP"), "matchingCond": [cond],
                     "matchingUEidList": [{"ueID": ueid_to_asn(u)}]},
                    {"measType": ("measName", "DRB.UEThpDl"), "matchingCond": [cond]}]}
        t = "E2SM-KPM-IndicationMessage" if fam == 3 else "E2SM-KPM-IndicationMessage-v2"
        m2 = e2sm_spec().encode(t, {"indicationMessage-formats": ("indicationMessage-Format2", body)})
        hh = h if fam == 3 else b"\x00" + sm_kpm.time_to_ntp(2.0)[:4]
        k2 = sm_kpm.decode_kpm_indication(hh, m2, ver)
        assert k2.format == 2 and k2.collect_start == 2.0
        assert [(r.ue.key, r.values) for r in k2.ue_reports] == [("9", (("L1M.SS-RSRP", -88.0),))]
        assert k2.node_values == (("L1M.SS-RSRP", None), ("DRB.UEThpDl", 40))
    with pytest.raises(ValueError):
        sm_kpm.kpm_family("9.99")


def _random_cell(rng: random.Random) -> rrc.CellResult:
    def q():
        return (rng.choice([NAN, float(rng.randrange(-156, -30))]), rng.choice([NAN, rng.randrange(-86, 41) / 2]),
                rng.choice([NAN, rng.randrange(-46, 81) / 2]))
    ssb = q() if rng.random() < 0.6 else (NAN, NAN, NAN)
    csi = q() if rng.random() < 0.5 else (NAN, NAN, NAN)
    beams = ()
    if rng.random() < 0.4:
        beams = tuple(rrc.BeamResult("ssb", rng.randrange(64), *q()) for _ in range(rng.randrange(0, 4))) + tuple(
            rrc.BeamResult("csi-rs", rng.randrange(96), *q()) for _ in range(rng.randrange(0, 4)))
    return rrc.CellResult(rng.choice([-1, rng.randrange(1008)]), *ssb, *csi, beams)


def test_rrc_walker_equals_pycrate_with_csi_rs_and_beams():
    rng = random.Random(16)
    for _ in range(200):
        r = rrc.RrcMeasReport(rng.randrange(1, 65),
                              tuple(rrc.ServingResult(rng.randrange(32), _random_cell(rng)) for _ in range(rng.randrange(1, 3))),
                              tuple(_random_cell(rng) for _ in range(rng.randrange(0, 5))))
        b = tracegen.encode_rrc_meas_report(r)
        assert repr(rrc.decode_rrc_meas_report(b)) == repr(rrc.decode_rrc_meas_report_pycrate(b)) == repr(r)
        rrc.decode_meas_report_fast(b)  # the walker covers these shapes (no Unsupported)


def test_truncated_kpm_is_a_decode_error():
    m = _kpm_message(random.Random(3))
    for cut in (1, 5, len(m) // 2, len(m) - 1):
        with pytest.raises(E2DecodeError):
            sm_kpm.decode_kpm_indication(b"\x00" + sm_kpm.time_to_ntp(1.0), m[:cut])
