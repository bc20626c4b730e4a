"""Every encoding the standard's ASN.1 admits (issue 28 item 5).

- E2SM-RC message copy (REPORT Style 1): the RRC Message, UE ID and Cell Global ID as any
  RANParameter-ValueType alternative that can hold an OCTET STRING (ElementTrue, ElementFalse,
  inside a Structure, inside a List's Structures, E2SM-RC clause 9.3.11), decoded field for
  field on the fast path (octet walker, bit walker) and the reference path (asn1tools), with a
  differential property test of the walkers against asn1tools on generated RAN parameter trees.
- REAL contents (X.690 clause 8.5): every form decoded; a malformed one is a value-level
  :class:`BadValue`, never a whole-PDU failure (E2SM-KPM's use of it: test_e2_kpm_values.py).
"""

import math

import pytest
from asn1tools.codecs.ber import decode_real as asn1tools_decode_real
from asn1tools.codecs.ber import encode_real as asn1tools_encode_real
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pallas_tools import tracegen
from xapp.e2 import e2ap, rrc, sm_rc
from xapp.e2.ie import Cgi, E2DecodeError, Guami, UeId, e2sm_decode_spec, e2sm_spec
from xapp.e2.ingest import IngestConfig, Ingestor, decode_indication, rc_ssb_report
from xapp.e2.per import BadValue, Unsupported, decode_real
from xapp.tracks import TrackStore

UE = UeId(kind="gNB", amf_ue_ngap_id=7, guami=Guami("00101", 2, 3, 1))
CELL = Cgi("00101", 0xA81B0C)
REPORT = rrc.RrcMeasReport(1, (rrc.ServingResult(0, rrc.CellResult(11, -96.0, -18.0, 12.0)),),
                           (rrc.CellResult(13, -99.0, -15.0, 3.0),), 51.9, -8.4, 12.0, 90.0)
RRC = tracegen.encode_rrc_meas_report(REPORT)


def _pdu(header: bytes, message: bytes) -> bytes:
    return tracegen.encode_ric_indication(e2ap.RicIndication(1, 1, 3, 1, header, message, sn=5))


def _message(items: list) -> bytes:
    return e2sm_spec().encode("E2SM-RC-IndicationMessage", {"ric-indicationMessage-formats": (
        "indicationMessage-Format1", {"ranP-Reported-List": items})})


def _el(pid: int, value, key: bool = True) -> dict:
    return {"ranParameter-ID": pid, "ranParameter-valueType": (
        "ranP-Choice-ElementTrue" if key else "ranP-Choice-ElementFalse",
        {} if value is None else {"ranParameter-value": value})}


def _struct(pid: int, items: list) -> dict:
    return {"ranParameter-ID": pid, "ranParameter-valueType": ("ranP-Choice-Structure", {
        "ranParameter-Structure": {"sequence-of-ranParameters": items} if items else {}})}


def _list(pid: int, structs: list) -> dict:
    return {"ranParameter-ID": pid, "ranParameter-valueType": ("ranP-Choice-List", {"ranParameter-List": {
        "list-of-ranParameter": [{"sequence-of-ranParameters": s} if s else {} for s in structs]}})}


# ------------------------------------------------------------------ E2SM-RC: the four alternatives

@pytest.mark.parametrize("value_type", tracegen.RC_VALUE_TYPES)
@pytest.mark.parametrize("fmt, ue_in_message", [(1, True), (2, False), (2, True), (3, False), (3, True)])
def test_message_copy_decodes_field_for_field_in_every_alternative(value_type, fmt, ue_in_message):
    copy = sm_rc.RcMessageCopy(RRC, UE, CELL, 1 if fmt != 2 else None, fmt,
                               3 if fmt == 2 else None, 1 if fmt == 2 else None)
    h, m = tracegen.encode_rc_message_copy(copy, ue_in_message=ue_in_message, value_type=value_type)
    # the reference (asn1tools) and both walkers give the same parameters
    want = {3: RRC, 4: tracegen.encode_ueid(UE), 6: tracegen.encode_cgi(CELL)}
    if not ue_in_message and fmt != 1:
        del want[4]
    assert sm_rc.rc_params_asn1tools(m) == sm_rc.rc_params_fast(m) == sm_rc.rc_params(m) == want
    assert sm_rc.rc_leaves_fast(m) == sm_rc.rc_leaves_asn1tools(m)
    # every shape tracegen writes is on the octet walker (the hot path)
    assert sm_rc.decode_rc_octs_params(m) == want
    got = sm_rc.decode_rc_message_copy(h, m)
    assert got == copy
    assert sm_rc.message_copy_parts(h, m) == (RRC, "7", 0xA81B0C)
    # the ingest: the fast path and the full decode give the same report, value for value
    pdu = _pdu(h, m)
    fast = rc_ssb_report(pdu, "gnb", 4.0, IngestConfig())
    (full,) = decode_indication(pdu, "gnb", 4.0, IngestConfig()).reports
    assert repr(fast) == repr(full)
    assert (fast.ue_id, fast.serving_cell, fast.serving_pci, fast.rsrp_dbm, fast.rsrq_db, fast.sinr_db) == (
        "7", 0xA81B0C, 11, -96.0, -18.0, 12.0)
    assert [(n.pci, n.rsrp_dbm, n.rsrq_db, n.sinr_db) for n in fast.neighbours] == [(13, -99.0, -15.0, 3.0)]
    assert round(fast.lat, 4) == 51.9 and round(fast.lon, 4) == -8.4


def test_element_false_without_value_and_mixed_shapes_take_the_bit_walker():
    # an ElementFalse without a value (5 bits) leaves every later part off the octet boundary
    items = [_el(10, None, key=False), _el(9, ("valueBoolean", True)),
             _struct(1, [_el(3, ("valueOctS", RRC), key=False), _el(77, ("valueBitS", (b"\xa0", 3)))]),
             _list(20, [[_el(4, ("valueOctS", tracegen.encode_ueid(UE)))], [],
                        [_el(30, ("valueReal", -2.5)), _el(31, ("valuePrintableString", "Hi"))]]),
             _el(6, ("valueOctS", tracegen.encode_cgi(CELL)), key=False), _el(5_000_000, ("valueInt", -300)),
             _struct(2, [])]
    m = _message(items)
    with pytest.raises(Unsupported):
        sm_rc.decode_rc_octs_params(m)
    leaves = sm_rc.rc_leaves_fast(m)
    assert leaves == sm_rc.rc_leaves_asn1tools(m)
    assert leaves == (
        ("", 10, False, None), ("", 9, True, ("valueBoolean", True)),
        ("1/", 3, False, ("valueOctS", RRC)), ("1/", 77, True, ("valueBitS", (b"\xa0", 3))),
        ("20[0]/", 4, True, ("valueOctS", tracegen.encode_ueid(UE))),
        ("20[2]/", 30, True, ("valueReal", -2.5)), ("20[2]/", 31, True, ("valuePrintableString", "Hi")),
        ("", 6, False, ("valueOctS", tracegen.encode_cgi(CELL))), ("", 5_000_000, True, ("valueInt", -300)))
    h = tracegen.rc_header(1, 1)
    assert sm_rc.decode_rc_message_copy(h, m) == sm_rc.RcMessageCopy(RRC, UE, CELL)
    assert sm_rc.message_copy_parts(h, m) == (RRC, "7", 0xA81B0C)
    assert rc_ssb_report(_pdu(h, m), "gnb", 1.0, IngestConfig()).rsrp_dbm == -96.0


@pytest.mark.parametrize("items, reason", [
    ([_el(3, None, key=False), _el(4, ("valueOctS", b"\x00"))],
     "RAN parameter 3 (RRC Message) is an ELEMENT without a value"),
    ([_el(3, ("valueOctS", RRC)), _struct(1, [_el(3, ("valueOctS", RRC), key=False)])],
     "RAN parameter 3 (RRC Message, in 1) occurs more than once"),
    ([_el(3, ("valueInt", 5))], "RAN parameter 3 (RRC Message) is valueInt, not an OCTET STRING"),
    ([_list(1, [[_el(3, ("valueOctS", RRC))], [_el(4, ("valuePrintableString", "x"))]])],
     "RAN parameter 4 (UE ID, in 1[1]) is valuePrintableString, not an OCTET STRING"),
])
def test_message_copy_parameters_that_cannot_be_read_are_dropped_with_the_reason(items, reason):
    m = _message(items)
    h = tracegen.rc_header(3, 1, UE)
    for params in (sm_rc.rc_params_asn1tools, sm_rc.rc_params):
        with pytest.raises(E2DecodeError) as e:
            params(m)
        assert e.value.reason == reason
    with pytest.raises(Unsupported):          # the ingest's fast path hands it to the full decode
        sm_rc.message_copy_parts(h, m)
    ing = Ingestor(TrackStore())
    assert ing.on_indication(_pdu(h, m), "gnb", t=1.0) == []
    assert ing.stats["dropped:E2SM-RC"] == 1


def test_element_false_ue_without_value_leaves_the_header_ue():
    m = _message([_el(3, ("valueOctS", RRC), key=False), _el(4, None, key=False)])
    assert sm_rc.rc_params(m) == {3: RRC}
    got = sm_rc.decode_rc_message_copy(tracegen.rc_header(3, 1, UE), m)
    assert (got.rrc, got.ue, got.cell, got.header_format) == (RRC, UE, None, 3)
    with pytest.raises(E2DecodeError, match="no UE ID"):
        sm_rc.decode_rc_message_copy(tracegen.rc_header(1, 1), m)


# ------------------------------------------------------- the differential property test (hypothesis)

_PRINTABLE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?"


@st.composite
def _bit_string(draw):
    n = draw(st.integers(0, 70))
    nb = (n + 7) // 8
    v = draw(st.integers(0, (1 << n) - 1)) if n else 0
    return ((v << (8 * nb - n)).to_bytes(nb, "big"), n)


_VALUES = st.one_of(
    st.tuples(st.just("valueBoolean"), st.booleans()),
    st.tuples(st.just("valueInt"), st.integers(-(1 << 70), 1 << 70)),
    st.tuples(st.just("valueReal"), st.floats(allow_nan=True, allow_infinity=True)),
    st.tuples(st.just("valueBitS"), _bit_string()),
    st.tuples(st.just("valueOctS"), st.binary(max_size=200)),
    st.tuples(st.just("valuePrintableString"), st.text(alphabet=_PRINTABLE, max_size=30)),
)
_IDS = st.one_of(st.integers(7, 300), st.integers(1, 4294967296).filter(lambda x: x not in (3, 4, 6)))
_ELEMENT = st.builds(lambda key, v: ("E", key, v), st.booleans(), st.one_of(st.none(), _VALUES)).filter(
    lambda e: e[1] is False or e[2] is not None)            # only ElementFalse may lack its value


def _tree(children):
    items = st.lists(st.tuples(_IDS, children), max_size=3)
    return st.one_of(st.builds(lambda its: ("S", its), items),
                     st.builds(lambda ss: ("L", ss), st.lists(items, min_size=1, max_size=3)))


_VALUE_TYPE = st.recursive(_ELEMENT, _tree, max_leaves=10)


def _to_asn(pid: int, node) -> dict:
    if node[0] == "E":
        return _el(pid, node[2], node[1])
    if node[0] == "S":
        return _struct(pid, [_to_asn(p, c) for p, c in node[1]])
    return _list(pid, [[_to_asn(p, c) for p, c in s] for s in node[1]])


def _same(a, b) -> bool:
    return repr(a) == repr(b)                 # NaN != NaN; repr compares it as a value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_IDS, _VALUE_TYPE), min_size=1, max_size=6))
def test_walkers_equal_asn1tools_on_generated_ran_parameter_trees(params):
    m = _message([_to_asn(p, n) for p, n in params])
    ref = sm_rc.rc_leaves_asn1tools(m)
    assert _same(sm_rc.rc_leaves_fast(m), ref)
    assert _same(sm_rc.rc_params_fast(m), sm_rc.rc_params_asn1tools(m))
    try:
        octs = sm_rc.decode_rc_octs_params(m)
    except Unsupported:
        return
    assert octs == sm_rc.rc_params_asn1tools(m)


@st.composite
def _copy_with_placements(draw):
    """A message copy whose RRC Message, UE ID and Cell Global ID each sit in a drawn place
    (top-level ElementTrue / ElementFalse, a new or shared Structure, a List's Structure) among
    drawn parameters of other IDs; -> (items, header, expected copy)."""
    u = UeId(kind="gNB", amf_ue_ngap_id=draw(st.integers(0, (1 << 40) - 1)),
             guami=Guami("00101", draw(st.integers(0, 255)), draw(st.integers(0, 1023)), draw(st.integers(0, 63))))
    cell = Cgi("00101", draw(st.integers(0, (1 << 36) - 1))) if draw(st.booleans()) else None
    rrc_octs = draw(st.binary(min_size=1, max_size=300))
    noise = [_to_asn(p, n) for p, n in draw(st.lists(st.tuples(_IDS, _VALUE_TYPE), max_size=3))]
    shared: list = []
    top = list(noise)
    params = [(3, rrc_octs), (4, tracegen.encode_ueid(u))] + ([(6, tracegen.encode_cgi(cell))] if cell else [])
    for pid, octs in params:
        where = draw(st.sampled_from(["true", "false", "structure", "shared", "list"]))
        el = _el(pid, ("valueOctS", octs), key=draw(st.booleans()))
        if where in ("true", "false"):
            el = _el(pid, ("valueOctS", octs), key=where == "true")
            top.insert(draw(st.integers(0, len(top))), el)
        elif where == "structure":
            top.insert(draw(st.integers(0, len(top))), _struct(draw(_IDS), [el]))
        elif where == "shared":
            shared.append(el)
        else:
            top.insert(draw(st.integers(0, len(top))), _list(draw(_IDS), [[el]] + draw(st.lists(st.just([]), max_size=2))))
    if shared:
        top.insert(draw(st.integers(0, len(top))), _struct(draw(_IDS), shared))
    fmt = draw(st.sampled_from([1, 3]))
    header = tracegen.rc_header(fmt, 1, u if fmt == 3 and draw(st.booleans()) else None)
    return top, header, sm_rc.RcMessageCopy(rrc_octs, u, cell, 1, fmt)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_copy_with_placements())
def test_message_copy_in_any_placement_decodes_field_for_field(case):
    items, header, want = case
    m = _message(items)
    assert sm_rc.rc_params_fast(m) == sm_rc.rc_params_asn1tools(m)
    got = sm_rc.decode_rc_message_copy(header, m)
    assert got == want
    assert sm_rc.message_copy_parts(header, m) == (want.rrc, want.ue.key,
                                                   want.cell.cell_id if want.cell else -1)


def test_malformed_real_in_a_parameter_pallas_does_not_read_keeps_the_copy():
    # written with the REAL-as-contents spec, so the contents can be anything; both paths
    # carry the same BadValue and the copy decodes
    raw = e2sm_decode_spec()
    items = [_el(3, ("valueOctS", RRC)), _el(4, ("valueOctS", tracegen.encode_ueid(UE))),
             _el(40, ("valueReal", b"\xb0\x00\x01")), _el(41, ("valueReal", b"\x03x1"), key=False)]
    m = raw.encode("E2SM-RC-IndicationMessage", {"ric-indicationMessage-formats": (
        "indicationMessage-Format1", {"ranP-Reported-List": items})})
    leaves = sm_rc.rc_leaves_fast(m)
    assert leaves == sm_rc.rc_leaves_asn1tools(m)
    assert leaves[2:] == (("", 40, True, ("valueReal", BadValue(b"\xb0\x00\x01", "REAL with the reserved base (first octet 0xb0)"))),
                          ("", 41, False, ("valueReal", BadValue(b"\x03x1", "decimal REAL with non-numeric contents (b'x1')"))))
    assert sm_rc.decode_rc_message_copy(tracegen.rc_header(1, 1), m) == sm_rc.RcMessageCopy(RRC, UE)


# ------------------------------------------------------------------------- REAL contents (X.690 8.5)

@pytest.mark.parametrize("octets, value", [
    (b"", 0.0), (b"\x40", math.inf), (b"\x41", -math.inf), (b"\x43", -0.0),
    (b"\x80\x00\x03", 3.0), (b"\xc0\xff\x03", -1.5),                 # base 2, 1-octet exponent
    (b"\x81\x00\x02\x05", 5 * 4.0),                                    # 2-octet exponent
    (b"\x82\x00\x00\x01\x05", 10.0),                                   # 3-octet exponent
    (b"\x83\x01\x02\x05", 20.0),                                       # long form, 1 octet
    (b"\x90\x01\x01", 8.0), (b"\xa0\xff\x01", 1 / 16),                 # base 8, base 16
    (b"\x84\x00\x03", 6.0), (b"\x8c\x01\x01", 16.0),                   # scale factor 1, 3
    (b"\x01  -42", -42.0), (b"\x02+1,5", 1.5), (b"\x02.25", 0.25), (b"\x03-1.5E+3", -1500.0), (b"\x03" + b"2e-2", 0.02),
])
def test_decode_real_every_form(octets, value):
    got = decode_real(octets)
    assert type(got) is float and got == value and math.copysign(1, got) == math.copysign(1, value)


def test_decode_real_nan():
    assert math.isnan(decode_real(b"\x42"))


@pytest.mark.parametrize("octets, reason", [
    (b"\xb0\x00\x01", "REAL with the reserved base (first octet 0xb0)"),
    (b"\xf3\x00\x01", "REAL with the reserved base (first octet 0xf3)"),
    (b"\x44", "REAL with a reserved special value (0x44)"),
    (b"\x40\x00", "REAL with a reserved special value (0x4000)"),
    (b"\x04123", "decimal REAL with a reserved form (first octet 0x04)"),
    (b"\x00", "decimal REAL with a reserved form (first octet 0x00)"),
    (b"\x03abc", "decimal REAL with non-numeric contents (b'abc')"),
    (b"\x01inf", "decimal REAL with non-numeric contents (b'inf')"),
    (b"\x02", "decimal REAL with non-numeric contents (b'')"),
    (b"\x031e999", "decimal REAL beyond the range of a double"),
    (b"\x80\x01", "REAL truncated (exponent or mantissa missing)"),
    (b"\x83", "REAL truncated (no exponent length)"),
    (b"\x83\x00\x01", "REAL with a zero-octet exponent"),
    (b"\x81\x7f\xff\x01", "REAL beyond the range of a double"),
])
def test_decode_real_malformed_is_a_bad_value_with_the_reason(octets, reason):
    assert decode_real(octets) == BadValue(octets, reason)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                 st.builds(lambda s, e, m: bytes([0x80 | s, e]) + m, st.sampled_from([0, 0x40]), st.integers(0, 255),
                           st.binary(min_size=1, max_size=9)),
                 st.builds(lambda s, e, m: bytes([0x81 | s]) + e.to_bytes(2, "big", signed=True) + m,
                           st.sampled_from([0, 0x40]), st.integers(-900, 900), st.binary(min_size=1, max_size=9)),
                 st.builds(lambda f, x: bytes([f]) + repr(x).encode(), st.sampled_from([1, 2, 3]),
                           st.floats(allow_nan=False, allow_infinity=False))))
def test_decode_real_equals_asn1tools_where_asn1tools_reads_it(x):
    octets = bytes(asn1tools_encode_real(x)) if isinstance(x, float) else x
    want = asn1tools_decode_real(bytearray(octets))
    assert _same(decode_real(octets), want)
