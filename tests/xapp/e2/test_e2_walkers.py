"""The fast walkers against the reference decoders (asn1tools, pycrate), field for field, on
generated PDUs of every shape the walkers read and some they must hand back."""

import math
import random

import pytest

from pallas_tools import tracegen
from xapp.e2 import rrc, sm_kpm
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


# ----------------------------------------------------------------- the SSB report fast path (issue 15)

def _plain_cell(rng: random.Random) -> rrc.CellResult:
    return rrc.CellResult(rng.randrange(1008), float(rng.randrange(-156, -30)), rng.randrange(-87, 40) / 2,
                          rng.randrange(-46, 80) / 2)


def _is_plain(c: rrc.CellResult) -> bool:
    return c.pci >= 0 and c.has_ssb and not c.has_csi_rs and not c.beams and all(
        x == x for x in (c.rsrp_dbm, c.rsrq_db, c.sinr_db))


def _ssb_report(rng: random.Random) -> rrc.RrcMeasReport:
    """Mostly the common shape (one serving MO, every cell with a PCI and SSB RSRP/RSRQ/SINR),
    sometimes a cell or a second MO the fast path must hand back."""
    plain = rng.random() < 0.8
    mos = (rrc.ServingResult(rng.randrange(32), _plain_cell(rng) if plain else _random_cell(rng)),)
    if rng.random() < 0.05:
        mos += (rrc.ServingResult(rng.randrange(32), _plain_cell(rng)),)
    nbs = tuple(_plain_cell(rng) if rng.random() < 0.95 else _random_cell(rng) for _ in range(rng.randrange(0, 9)))
    lat = rng.choice([NAN, rng.uniform(-90, 90)])
    lon = rng.uniform(-180, 180) if lat == lat else NAN
    hv = rng.random() < 0.5
    return rrc.RrcMeasReport(rng.randrange(1, 65), mos, nbs, lat, lon, rng.uniform(0, 60) if hv else NAN,
                             rng.uniform(0, 360) if hv else NAN)


def test_ssb_fast_path_equals_pycrate_and_covers_the_common_shape():
    from xapp.e2.ie import Cgi
    from xapp.e2.ingest import Dropped, report_from_rc, report_from_ssb
    from xapp.e2.sm_rc import RcMessageCopy

    rng = random.Random(15)
    fast = handed_back = 0
    for _ in range(600):
        r = _ssb_report(rng)
        b = tracegen.encode_rrc_meas_report(r)
        copy = RcMessageCopy(b, UeId(kind="gNB", amf_ue_ngap_id=9, guami=Guami()), Cgi("00101", 0x1234))
        unused: list[str] = []
        try:
            ref, rs = report_from_rc(copy, rrc.decode_rrc_meas_report_pycrate(b), 5.0, "gnb", unused)
        except Dropped:                          # a PCell without results: not the fast shape
            with pytest.raises(Unsupported):
                rrc.decode_ssb_meas_report(b)
            continue
        plain = len(r.serving) == 1 and all(_is_plain(c) for c in (r.serving[0].cell, *r.neighbours))
        try:
            got = report_from_ssb(copy, rrc.decode_ssb_meas_report(b), 5.0, "gnb")
        except Unsupported:
            assert not plain, r
            handed_back += 1
            continue
        fast += 1
        assert plain and rs == "ssb" and unused == []
        assert repr(got) == repr(ref)
    assert fast > 300 and handed_back > 50


def test_decode_indication_on_the_fast_path_equals_the_pycrate_reference():
    from xapp.e2 import e2ap, sm_rc
    from xapp.e2.ie import Cgi
    from xapp.e2.ingest import IngestConfig, decode_indication, report_from_rc

    rng = random.Random(16)
    for k in range(150):
        r = _ssb_report(rng)
        if not r.serving[0].cell.has_ssb and not r.serving[0].cell.has_csi_rs:
            continue                             # dropped on both paths
        u = UeId(kind="gNB", amf_ue_ngap_id=1 + k, guami=Guami())
        h, m = tracegen.encode_rc_message_copy(sm_rc.RcMessageCopy(tracegen.encode_rrc_meas_report(r), u,
                                                                   Cgi("00101", 1000 + k)))
        pdu = tracegen.encode_ric_indication(e2ap.RicIndication(1, 1, 3, 1, h, m, sn=k))
        d = decode_indication(pdu, "gnb", 7.0, IngestConfig())
        ind = e2ap.decode_e2ap_pycrate(pdu)
        copy = sm_rc.decode_rc_message_copy(ind.header, ind.message)
        unused: list[str] = []
        ref, rs = report_from_rc(copy, rrc.decode_rrc_meas_report_pycrate(copy.rrc), 7.0, "gnb", unused)
        assert repr(d.reports) == repr([ref]) and d.rs == [rs] and d.unused == unused


def test_ssb_fast_path_hands_back_truncated_and_padded_reports():
    r = rrc.RrcMeasReport(3, (rrc.ServingResult(0, rrc.CellResult(5, -80.0, -10.5, 12.0)),),
                          (rrc.CellResult(6, -90.0, -11.0, 3.5),), 51.9, -8.4, 10.0, 90.0)
    b = tracegen.encode_rrc_meas_report(r)
    (code,) = rrc.decode_ssb_meas_report(b).neighbour_codes
    assert rrc.ssb_cell_values(code) == (6, -90.0, -11.0, 3.5)
    for cut in range(len(b)):
        with pytest.raises(Unsupported):
            rrc.decode_ssb_meas_report(b[:cut])
    with pytest.raises(Unsupported):
        rrc.decode_ssb_meas_report(b + b"\x00")


def test_ingest_fast_path_equals_decode_indication_or_hands_back():
    # rc_ssb_report (E2AP lean walker, memoised UE/cell, SSB walker) gives the report of
    # decode_indication wherever it answers, and hands back (raises) wherever decode_indication
    # drops or takes another path: header formats 1-3, UE in the header and/or RAN parameter 4,
    # UEs that differ, no cell, a KPM RAN function, mutated and truncated PDUs
    from xapp.e2 import e2ap, sm_rc
    from xapp.e2.ie import Cgi
    from xapp.e2.ingest import Dropped, IngestConfig, decode_indication, rc_ssb_report

    rng = random.Random(17)
    cfg = IngestConfig()
    fast = back = 0
    for k in range(400):
        r = _ssb_report(rng)
        u = UeId(kind="gNB", amf_ue_ngap_id=1 + k % 50, guami=Guami())
        fmt = rng.choice([1, 2, 3])
        copy = sm_rc.RcMessageCopy(tracegen.encode_rrc_meas_report(r), u,
                                   Cgi("00101", 1000 + k % 7) if rng.random() < 0.9 else None, header_format=fmt)
        h, m = tracegen.encode_rc_message_copy(copy, ue_in_message=rng.random() < 0.5)
        if rng.random() < 0.05:               # the header names another UE than RAN parameter 4
            h, _ = tracegen.encode_rc_message_copy(sm_rc.RcMessageCopy(copy.rrc, UeId(kind="gNB", amf_ue_ngap_id=999,
                                                                                      guami=Guami()), None,
                                                                       header_format=2))
        pdu = tracegen.encode_ric_indication(e2ap.RicIndication(1, 1, rng.choice([3, 3, 3, 2]), 1, h, m, sn=k))
        if rng.random() < 0.15:               # a mutated or truncated PDU
            b = bytearray(pdu)
            if rng.random() < 0.5:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            else:
                del b[rng.randrange(len(b)):]
            pdu = bytes(b)
        try:
            want = decode_indication(pdu, "gnb", 3.0, cfg)
        except Dropped:
            want = None
        try:
            got = rc_ssb_report(pdu, "gnb", 3.0, cfg)
        except Exception:                     # noqa: BLE001 - handed back to decode_indication
            back += 1                         # (the other shapes' path is tested above)
            continue
        fast += 1
        assert want is not None and want.service_model == "rc" and want.rs == ["ssb"]
        assert repr(want.reports) == repr([got]) and not want.dropped and not want.unused
    assert fast > 120 and back > 120
