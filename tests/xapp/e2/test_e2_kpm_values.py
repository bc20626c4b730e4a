"""E2SM-KPM: a malformed value in one UE's record drops that record (issue 28 item 5).

A REAL with a reserved base, a reserved special value, non-numeric decimal contents or a value
beyond a double (X.690 clause 8.5, :func:`xapp.e2.per.decode_real`) in one record is left out
with a counted reason (``malformed value: ...``); the rest of that UE's record and every other
UE stay, in Formats 1, 2 and 3, on the Format 3 walker and on the asn1tools reference alike. A
Format 3 message of 16K octets or more is read in both open-type forms (X.691's fragments and
asn1tools').
"""

import math
import random

import pytest
from asn1tools.codecs.ber import encode_real as asn1tools_encode_real

from pallas_tools import tracegen
from xapp.e2 import e2ap, sm_kpm
from xapp.e2.ie import Guami, UeId, e2sm_decode_spec, ueid_to_asn
from xapp.e2.ingest import Dropped, IngestConfig, Ingestor, decode_indication
from xapp.e2.per import Unsupported
from xapp.tracks import TrackStore


def _same(a, b) -> bool:
    return repr(a) == repr(b)                 # NaN != NaN; repr compares it as a value


def _real(x) -> bytes:
    return bytes(asn1tools_encode_real(x))


def _kpm_f3(ues: list[tuple[UeId, list]], labels: bool = False) -> bytes:
    """Format 3, written with REALs as contents octets (``("real", octets)`` records)."""
    info = [{"measType": ("measName", n), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]}
            for n in ("L1M.SS-RSRP", "L1M.SS-RSRQ", "L1M.SS-SINR")]
    if labels:                                 # a label: not a walker shape, the reference reads it
        info[2] = {"measType": ("measName", "L1M.SS-SINR"), "labelInfoList": [{"measLabel": {"fiveQI": 9}}]}
    return tracegen.standard_open_type(e2sm_decode_spec().encode("E2SM-KPM-IndicationMessage", {
        "indicationMessage-formats": ("indicationMessage-Format3", {"ueMeasReportList": [
            {"ueID": ueid_to_asn(u), "measReport": {"measData": [{"measRecord": rec}], "measInfoList": info,
                                                    "granulPeriod": 100}} for u, rec in ues]})}))


def _ue(i: int) -> UeId:
    return UeId(kind="gNB", amf_ue_ngap_id=1000 + i, guami=Guami())


def _good(i: int) -> list:
    return [("real", _real(-80.0 - i % 50)), ("real", _real(-10.5)), ("integer", 3 + i % 20)]


@pytest.mark.parametrize("labels", [False, True], ids=["walker", "asn1tools"])
@pytest.mark.parametrize("bad, reason", [
    (b"\xb0\x00\x01", "REAL with the reserved base (first octet 0xb0)"),
    (b"\x03-9x.5", "decimal REAL with non-numeric contents (b'-9x.5')"),
    (b"\x81\x7f\xff\x01", "REAL beyond the range of a double"),
])
def test_kpm_200_ues_with_one_malformed_real_keep_every_ue(labels, bad, reason):
    recs = [_good(i) for i in range(200)]
    recs[117] = [("real", bad), ("real", _real(-12.0)), ("integer", 9)]
    m = _kpm_f3([(_ue(i), r) for i, r in enumerate(recs)], labels)
    if labels:
        with pytest.raises(Unsupported):
            sm_kpm.decode_f3_fast(m)
    else:
        assert _same(sm_kpm.decode_f3_fast(m), sm_kpm.asn1tools_message_value(m))
    h = b"\x00" + sm_kpm.time_to_ntp(1_700_000_000.0)
    sinr = "L1M.SS-SINR|fiveQI=9" if labels else "L1M.SS-SINR"
    for k in (sm_kpm.decode_kpm_indication(h, m), sm_kpm.decode_kpm_indication_asn1tools(h, m)):
        assert [r.ue.key for r in k.ue_reports] == [str(1000 + i) for i in range(200)]
        assert k.dropped == (f"malformed value: {reason} (measData item 0, L1M.SS-RSRP, UE 1117)",)
        assert k.ue_reports[117].values == (("L1M.SS-RSRP", None), ("L1M.SS-RSRQ", -12.0), (sinr, 9))
        assert k.ue_reports[118].values == (("L1M.SS-RSRP", -80.0 - 118 % 50), ("L1M.SS-RSRQ", -10.5), (sinr, 3 + 118 % 20))
    ing = Ingestor(TrackStore(max_ues=300), IngestConfig(kpm_measurements={
        "L1M.SS-RSRP": "rsrp_dbm", "L1M.SS-RSRQ": "rsrq_db", sinr: "sinr_db"}))
    pdu = tracegen.encode_ric_indication(e2ap.RicIndication(1, 2, 2, 1, h, m, sn=1))
    reps = ing.on_indication(pdu, "gnb", t=3.0)
    assert len(reps) == 200 and ing.stats["dropped:malformed value"] == 1
    r117 = reps[117]
    assert (r117.ue_id, r117.rsrq_db, r117.sinr_db) == ("1117", -12.0, 9.0) and math.isnan(r117.rsrp_dbm)
    assert (reps[0].ue_id, reps[0].rsrp_dbm, reps[0].rsrq_db, reps[0].sinr_db) == ("1000", -80.0, -10.5, 3.0)


def test_kpm_walker_equals_reference_on_random_real_contents():
    # every REAL form, valid or not, through the Format 3 walker and the reference alike
    rng = random.Random(28)
    forms = [lambda: _real(rng.uniform(-1e6, 1e6)), lambda: bytes([0x80 | rng.randrange(64)]) + rng.randbytes(rng.randrange(0, 5)),
             lambda: bytes([rng.randrange(256)]), lambda: b"\x03" + rng.choice([b"1.5E2", b"abc", b"-0", b" 7", b""]),
             lambda: b"", lambda: bytes([0x40 | rng.randrange(64)])]
    for _ in range(150):
        ues = [(_ue(i), [("real", rng.choice(forms)()), ("noValue", None), ("integer", rng.randrange(1 << 32))])
               for i in range(rng.randrange(1, 5))]
        m = _kpm_f3(ues)
        assert _same(sm_kpm.decode_f3_fast(m), sm_kpm.asn1tools_message_value(m))


def test_kpm_formats_1_and_2_drop_the_malformed_record_only():
    raw = e2sm_decode_spec()
    h = b"\x00" + sm_kpm.time_to_ntp(2.0)
    info = [{"measType": ("measName", n), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]} for n in ("A", "B")]
    m1 = raw.encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": ("indicationMessage-Format1", {
        "measData": [{"measRecord": [("real", _real(1.5)), ("integer", 4)]},
                     {"measRecord": [("real", b"\x44"), ("integer", 5)]}], "measInfoList": info})})
    k1 = sm_kpm.decode_kpm_indication(h, m1)
    assert (k1.format, k1.node_values) == (1, (("A", 1.5), ("B", 5)))
    assert k1.dropped == ("malformed value: REAL with a reserved special value (0x44) (measData item 1, A, Format 1)",)
    u = UeId(kind="gNB", amf_ue_ngap_id=9, guami=Guami())
    cond = {"matchingCondChoice": ("testCondInfo", {"testType": ("rSRP", "true")})}
    m2 = raw.encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": ("indicationMessage-Format2", {
        "measData": [{"measRecord": [("real", b"\xf0\x00\x01"), ("integer", 40), ("real", _real(-90.0))]}],
        "measCondUEidList": [{"measType": ("measName", n), "matchingCond": [cond], "matchingUEidList": [{"ueID": ueid_to_asn(u)}]}
                             for n in ("L1M.SS-RSRP", "DRB.UEThpDl", "L1M.SS-SINR")]})})
    k2 = sm_kpm.decode_kpm_indication(h, m2)
    assert [(r.ue.key, r.values) for r in k2.ue_reports] == [("9", (("DRB.UEThpDl", 40), ("L1M.SS-SINR", -90.0)))]
    assert k2.dropped == ("malformed value: REAL with the reserved base (first octet 0xf0) (measData item 0, Format 2, L1M.SS-RSRP)",)
    assert repr(sm_kpm.decode_kpm_indication_asn1tools(h, m2)) == repr(k2)


def test_kpm_malformed_pdu_as_a_whole_is_still_dropped_whole():
    m = _kpm_f3([(_ue(0), _good(0))])
    with pytest.raises(Dropped, match="E2SM-KPM"):
        decode_indication(tracegen.encode_ric_indication(e2ap.RicIndication(
            1, 2, 2, 1, b"\x00" + sm_kpm.time_to_ntp(1.0), m[:-3], sn=1)), "gnb", 1.0, IngestConfig())


def test_kpm_format3_of_16k_octets_or_more_in_both_open_type_forms():
    """A Format 3 message of 16K octets or more (200 UEs): X.691 fragments its open type; asn1tools
    0.169 writes (and reads) one fragment octet and then the whole contents instead. The walker
    reads the standard form; the reference reads both; both give the same UEs."""
    ues = [(_ue(i), _good(i)) for i in range(200)]
    std = _kpm_f3(ues)
    asn = e2sm_decode_spec().encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": (
        "indicationMessage-Format3", {"ueMeasReportList": [
            {"ueID": ueid_to_asn(u), "measReport": {"measData": [{"measRecord": rec}], "measInfoList": [
                {"measType": ("measName", n), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]}
                for n in ("L1M.SS-RSRP", "L1M.SS-RSRQ", "L1M.SS-SINR")], "granulPeriod": 100}} for u, rec in ues]})})
    assert len(std) > 16384 and std[2] == 0xC1 and std[3 + 16384] < 0xC0 and asn[2] == 0xC1 and std != asn
    assert std[3:3 + 16384] + std[3 + 16384 + 2:] == asn[3:]            # same contents, 2-octet last length
    with pytest.raises(Unsupported):
        sm_kpm.decode_f3_fast(asn)
    want = sm_kpm.decode_f3_fast(std)
    assert len(want[1]["ueMeasReportList"]) == 200
    assert _same(sm_kpm.asn1tools_message_value(std), want) and _same(sm_kpm.asn1tools_message_value(asn), want)
    h = b"\x00" + sm_kpm.time_to_ntp(5.0)
    k = sm_kpm.decode_kpm_indication(h, std)
    assert k.ue_reports[199].values == (("L1M.SS-RSRP", -80.0 - 199 % 50), ("L1M.SS-RSRQ", -10.5), ("L1M.SS-SINR", 22))
    assert repr(sm_kpm.decode_kpm_indication(h, asn)) == repr(k)


def test_wide_bit_reader_reads_what_the_bit_reader_reads():
    from xapp.e2.per import Bits, WideBits, bit_reader
    rng = random.Random(5)
    for _ in range(50):
        b = rng.randbytes(rng.randrange(0, 4000))
        x, y = Bits(b), WideBits(b)
        while True:
            k = rng.choice([0, 1, 2, 3, 7, 8, 9, 16, 31, 64, 100])
            if rng.random() < 0.2:
                x.align(), y.align()
            try:
                want = x.read(k)
            except Unsupported:
                with pytest.raises(Unsupported):
                    y.read(k)
                break
            assert y.read(k) == want and y.p == x.p
    assert type(bit_reader(bytes(3071))) is Bits and type(bit_reader(bytes(3072))) is WideBits
