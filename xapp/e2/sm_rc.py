"""E2SM-RC REPORT Style 1 "Message Copy" (O-RAN.WG3.E2SM-RC v01.03 and v03.00 onward, clauses
7.4.2, 8.2.1, 9.2.1): indication decode and the subscription payloads.

Indication header (clause 9.2.1.3), every format of both versions:
- Format 1 {ric-eventTriggerCondition-ID OPTIONAL}: the UE comes from RAN parameter 4;
- Format 2 {ueID, ric-InsertStyle-Type, ric-InsertIndication-ID} (v01.03 on): the UE comes
  from the header;
- Format 3 {ric-eventTriggerCondition-ID OPTIONAL, ueID OPTIONAL} (v03.00 on, an extension
  addition of the header CHOICE, so one decoder serves both versions): the UE comes from the
  header, else from RAN parameter 4.
Indication message Format 1 (the one REPORT Style 1 uses in both versions) with the RAN
parameters of clause 8.2.1: 3 "RRC Message" (the copied UL-DCCH PDU), 4 "UE ID" and 6 "Cell
Global ID"; 4 and 6 are ELEMENTs whose value is an OCTET STRING holding the aligned-PER
E2SM common ``UEID`` / ``CGI``. Other message formats raise :class:`E2DecodeError` naming them.

The parameters may be written as any RANParameter-ValueType alternative that holds an OCTET
STRING (clause 9.3.11): an ELEMENT with the key flag (ranP-Choice-ElementTrue) or without it
(ranP-Choice-ElementFalse, which an E2 node may use for any non-key parameter), or inside a
STRUCTURE or a LIST's STRUCTUREs at any depth; each is read wherever it sits
(:func:`rc_params_from_leaves`: an ID Pallas reads must occur once and be an OCTET STRING).

One decode path per part: the header and UEID/CGI by asn1tools (memoised on their octets:
pure functions of the bytes); the message's RAN parameters by the octet walker
:func:`decode_rc_octs_params` (ELEMENT OCTET STRINGs, flat or nested, every part on an octet
boundary: what E2 nodes send), else the bit walker :func:`rc_leaves_fast` (every root
alternative, every value type), else asn1tools (:func:`rc_leaves_asn1tools`) on the same
octets; the walkers give what asn1tools gives (a differential property test).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from .ie import (E2DecodeError, UeId, Cgi, asn_decode, asn_decode_raw_reals, decode_cgi, decode_ueid, e2sm_spec,
                 ueid_from_asn)
from .per import Bits, Unsupported, alen, bit_reader, decode_real
from .rrc import RRC_MSG_ID_MEASUREMENT_REPORT

# E2SM-RC REPORT Style 1 RAN parameter ids (O-RAN.WG3.E2SM-RC-v01.03 clause 8.2.1)
RC_PARAM_RRC_MESSAGE = 3
RC_PARAM_UE_ID = 4
RC_PARAM_CELL_GLOBAL_ID = 6
RC_STYLE_MESSAGE_COPY = 1

_HEADER_FORMATS = {"indicationHeader-Format1": 1, "indicationHeader-Format2": 2, "indicationHeader-Format3": 3}


@dataclass(frozen=True, slots=True)
class RcHeader:
    """A decoded E2SM-RC indication header: ``format`` 1, 2 or 3 and its fields (None when absent)."""

    format: int
    condition_id: int | None = None
    ue: UeId | None = None
    insert_style: int | None = None
    insert_indication_id: int | None = None


@dataclass(frozen=True, slots=True)
class RcMessageCopy:
    """An E2SM-RC REPORT Style 1 indication: the copied RRC PDU with its UE and serving cell, and
    the header's format and fields (``condition_id`` from Format 1/3, ``insert_*`` from Format 2)."""

    rrc: bytes
    ue: UeId
    cell: Cgi | None = None
    condition_id: int | None = 1
    header_format: int = 1
    insert_style: int | None = None
    insert_indication_id: int | None = None


@functools.lru_cache(maxsize=65536)
def decode_rc_header(header: bytes) -> RcHeader:
    """E2SM-RC-IndicationHeader octets -> RcHeader (Formats 1-3). Memoised on the octets."""
    alt, v = asn_decode("E2SM-RC-IndicationHeader", header)["ric-indicationHeader-formats"]
    fmt = _HEADER_FORMATS.get(alt)
    if fmt is None:
        raise E2DecodeError(f"unsupported E2SM-RC indication header {alt}")
    ue = ueid_from_asn(v["ueID"]) if "ueID" in v else None
    return RcHeader(fmt, v.get("ric-eventTriggerCondition-ID"), ue, v.get("ric-InsertStyle-Type"),
                    v.get("ric-InsertIndication-ID"))


def decode_rc_octs_params(b: bytes) -> dict[int, bytes]:
    """The octet walker (the hot path): E2SM-RC-IndicationMessage Format 1 whose every RAN
    parameter is, or is a STRUCTURE or LIST holding, ELEMENTs with an OCTET STRING value (the
    message-copy shapes: every part then starts on an octet) -> {RAN parameter ID: octets}.
    :class:`~.per.Unsupported` for anything else, and when an ID occurs twice (the bit walker
    :func:`rc_leaves_fast` and :func:`rc_params_from_leaves` decide then).

    Layout (aligned PER): message and CHOICE extension bits, Format 1 index (3 bits of 5 root
    alternatives), Format 1 extension bit, then the list count - 1 in two octets; each item:
    item and RANParameter-ID extension bits, octet count - 1 (2 bits), the ID - 1 in that many
    octets; then the RANParameter-ValueType: 0x04 (ElementTrue, valueOctS) or 0x2A 0x00
    (ElementFalse, value present, valueOctS) and an aligned length with the octets; 0x44 and
    two octets (Structure with its item count - 1, then items as above); 0x60 and two octets
    (List with its count - 1, then per STRUCTURE 0x40 and two octets and its items).
    """
    n = len(b)
    if n < 3 or b[0] != 0:
        raise Unsupported("E2SM-RC indication message shape")
    out: dict[int, bytes] = {}
    i = _octs_items(b, 1, out, 0)
    if i != n:
        raise Unsupported("trailing octets")
    return out


def _octs_items(b: bytes, i: int, out: dict[int, bytes], depth: int) -> int:
    """Octet walker: a SEQUENCE OF (STRUCTURE-)items from its two-octet count at ``i`` -> the
    octet after the last item, their octet parameters added to ``out``."""
    n = len(b)
    if i + 2 > n or depth > 8:
        raise Unsupported("truncated RAN parameter list, or nested too deeply")
    count = ((b[i] << 8) | b[i + 1]) + 1
    i += 2
    for _ in range(count):
        if i >= n:
            raise Unsupported("truncated RAN parameter")
        x = b[i]
        if x & 0xCF:
            raise Unsupported("RAN parameter item shape")
        k = ((x >> 4) & 3) + 1
        if i + 1 + k + 1 > n:
            raise Unsupported("truncated RAN parameter")
        pid = int.from_bytes(b[i + 1:i + 1 + k], "big") + 1
        i += 1 + k
        t = b[i]
        if t == 0x04:                                # ElementTrue, valueOctS
            i += 1
        elif t == 0x2A and i + 1 < n and b[i + 1] == 0:  # ElementFalse with valueOctS
            i += 2
        elif t == 0x44:                              # Structure holding a list of items
            i = _octs_items(b, i + 1, out, depth + 1)
            continue
        elif t == 0x60:                              # List of STRUCTUREs
            if i + 3 > n:
                raise Unsupported("truncated RAN parameter list")
            m = ((b[i + 1] << 8) | b[i + 2]) + 1
            i += 3
            for _ in range(m):
                if i >= n or b[i] != 0x40:
                    raise Unsupported("LIST item is not a STRUCTURE with parameters")
                i = _octs_items(b, i + 1, out, depth + 1)
            continue
        else:
            raise Unsupported("RAN parameter value is not an ELEMENT OCTET STRING")
        ln, j = alen(b, i)
        if j + ln > n or pid in out:
            raise Unsupported("RAN parameter length or repetition")
        out[pid] = b[j:j + ln]
        i = j + ln
    return i


#: One ELEMENT of an E2SM-RC indication message, wherever it sits (a leaf of the RAN parameter
#: tree, clause 9.3.11): (``path``, RAN parameter ID, key flag, value). ``path`` names the
#: enclosing parameters: "" at the top, "1/" inside STRUCTURE 1, "7[0]/" inside LIST 7's first
#: STRUCTURE ("1/7[2]/" nested); the key flag is True for ranP-Choice-ElementTrue; the value is
#: asn1tools' RANParameter-Value CHOICE value (alternative, value), a valueReal as a float or a
#: :class:`~.per.BadValue`, or None for an ElementFalse without a value.
RcLeaf = tuple[str, int, bool, "tuple[str, Any] | None"]

_VALUE_ALTS = ("valueBoolean", "valueInt", "valueReal", "valueBitS", "valueOctS", "valuePrintableString")
_MAX_DEPTH = 16


def rc_leaves_fast(b: bytes) -> tuple[RcLeaf, ...]:
    """The bit walker: E2SM-RC-IndicationMessage Format 1 octets -> every ELEMENT of its RAN
    parameter tree (:data:`RcLeaf`), in encoding order, for every root alternative of
    RANParameter-ValueType (ElementTrue, ElementFalse with or without a value, Structure, List)
    and of RANParameter-Value. What :func:`rc_leaves_asn1tools` gives for the same octets
    (tested on generated PDUs); :class:`~.per.Unsupported` for extensions, fragmented lengths,
    nesting deeper than 16 and anything malformed (the reference then says what is wrong)."""
    r = bit_reader(b)
    if r.read(6) != 0:               # message ext, CHOICE ext, Format 1 (index 0), Format 1 ext
        raise Unsupported("not an E2SM-RC indication message Format 1 without extensions")
    leaves: list[RcLeaf] = []
    _bit_items(r, "", leaves, 0)
    r.align()
    if r.p != r.n:
        raise Unsupported("trailing octets")
    return tuple(leaves)


def _bit_items(r: Bits, path: str, leaves: list, depth: int) -> None:
    r.align()
    for _ in range(r.read(16) + 1):
        if r.read(2):                # item extension bit (Format1-Item / STRUCTURE-Item), ID ext
            raise Unsupported("RAN parameter item or ID extension")
        k = r.read(2) + 1
        r.align()
        pid = r.read(8 * k) + 1
        _bit_value_type(r, path, pid, leaves, depth)


def _bit_value_type(r: Bits, path: str, pid: int, leaves: list, depth: int) -> None:
    x = r.read(4)                    # CHOICE ext, alternative (2 bits), the alternative's ext
    if x & 0b1001:
        raise Unsupported("RANParameter-ValueType extension")
    alt = x >> 1
    if alt == 0:                     # ElementTrue {value}
        leaves.append((path, pid, True, _bit_value(r)))
    elif alt == 1:                   # ElementFalse {value OPTIONAL}
        leaves.append((path, pid, False, _bit_value(r) if r.read(1) else None))
    elif depth >= _MAX_DEPTH:
        raise Unsupported("RAN parameters nested too deeply")
    elif alt == 2:                   # Structure {RANParameter-STRUCTURE}
        _bit_structure(r, f"{path}{pid}/", leaves, depth + 1)
    else:                            # List {RANParameter-LIST {list-of-ranParameter, ...}}
        if r.read(1):
            raise Unsupported("RANParameter-LIST extension")
        r.align()
        for k in range(r.read(16) + 1):
            _bit_structure(r, f"{path}{pid}[{k}]/", leaves, depth + 1)


def _bit_structure(r: Bits, path: str, leaves: list, depth: int) -> None:
    x = r.read(2)                    # RANParameter-STRUCTURE ext, sequence-of present
    if x & 2:
        raise Unsupported("RANParameter-STRUCTURE extension")
    if x:
        _bit_items(r, path, leaves, depth)


def _bit_value(r: Bits) -> tuple[str, Any]:
    x = r.read(4)                    # RANParameter-Value CHOICE ext, alternative (3 bits)
    if x > 5:
        raise Unsupported("RANParameter-Value extension or unknown alternative")
    alt = _VALUE_ALTS[x]
    if x == 0:
        return alt, bool(r.read(1))
    if x == 3:                       # BIT STRING: length in bits, then the bits (not aligned after)
        nbits = r.aligned_length()
        v = r.read(nbits)
        nb = (nbits + 7) // 8
        return alt, ((v << (8 * nb - nbits)).to_bytes(nb, "big"), nbits)
    octs = r.octets(r.aligned_length())
    if x == 1:
        if not octs:
            raise Unsupported("INTEGER without octets")
        return alt, int.from_bytes(octs, "big", signed=True)
    if x == 2:
        return alt, decode_real(octs)
    if x == 4:
        return alt, octs
    try:
        return alt, octs.decode("ascii")
    except UnicodeDecodeError:
        raise Unsupported("PrintableString characters") from None


def _leaves_from_asn(items: list, path: str, leaves: list) -> None:
    for it in items:
        pid = it["ranParameter-ID"]
        alt, v = it["ranParameter-valueType"]
        if alt in ("ranP-Choice-ElementTrue", "ranP-Choice-ElementFalse"):
            val = v.get("ranParameter-value")
            if val is not None and val[0] == "valueReal":
                val = ("valueReal", decode_real(val[1]))
            leaves.append((path, pid, alt == "ranP-Choice-ElementTrue", val))
        elif alt == "ranP-Choice-Structure":
            _leaves_from_asn(v["ranParameter-Structure"].get("sequence-of-ranParameters", ()), f"{path}{pid}/", leaves)
        elif alt == "ranP-Choice-List":
            for k, st in enumerate(v["ranParameter-List"]["list-of-ranParameter"]):
                _leaves_from_asn(st.get("sequence-of-ranParameters", ()), f"{path}{pid}[{k}]/", leaves)
        else:
            raise E2DecodeError(f"RAN parameter {pid}: unsupported value type {alt}")


def rc_leaves_asn1tools(message: bytes) -> tuple[RcLeaf, ...]:
    """The reference: E2SM-RC-IndicationMessage octets, decoded by asn1tools (REAL contents by
    :func:`~.per.decode_real`, :func:`~.ie.e2sm_decode_spec`) -> every ELEMENT of Format 1's
    RAN parameter tree (:data:`RcLeaf`). E2DecodeError for another format or a malformed PDU."""
    alt, v = asn_decode_raw_reals("E2SM-RC-IndicationMessage", message)["ric-indicationMessage-formats"]
    if alt != "indicationMessage-Format1":
        raise E2DecodeError(f"unsupported E2SM-RC indication message {alt} (REPORT Style 1 uses Format1)")
    leaves: list[RcLeaf] = []
    _leaves_from_asn(v["ranP-Reported-List"], "", leaves)
    return tuple(leaves)


_CONSUMED = {RC_PARAM_RRC_MESSAGE: "RRC Message", RC_PARAM_UE_ID: "UE ID", RC_PARAM_CELL_GLOBAL_ID: "Cell Global ID"}


def rc_params_from_leaves(leaves: tuple[RcLeaf, ...]) -> dict[int, bytes]:
    """The message-copy parameters of a RAN parameter tree -> {RAN parameter ID: octets} of
    every ELEMENT holding an OCTET STRING, whatever its key flag and wherever it sits (top
    level, in a STRUCTURE or in a LIST's STRUCTUREs: clause 9.3.11 admits all). The parameters
    Pallas reads (3 RRC Message, 4 UE ID, 6 Cell Global ID, clause 8.2.1) must be OCTET
    STRINGs and occur once; an ElementFalse without a value counts as not reported (RRC
    Message excepted). E2DecodeError naming the parameter otherwise; other IDs repeated: the
    last one."""
    out: dict[int, bytes] = {}
    seen: set[int] = set()
    for path, pid, _key, val in leaves:
        name = _CONSUMED.get(pid)
        if name is not None:
            where = f"RAN parameter {pid} ({name}{', in ' + path.rstrip('/') if path else ''})"
            if pid in seen:
                raise E2DecodeError(f"{where} occurs more than once")
            seen.add(pid)
            if val is None:
                if pid == RC_PARAM_RRC_MESSAGE:
                    raise E2DecodeError(f"{where} is an ELEMENT without a value")
                continue
            if val[0] != "valueOctS":
                raise E2DecodeError(f"{where} is {val[0]}, not an OCTET STRING")
        if val is not None and val[0] == "valueOctS":
            out[pid] = val[1]
    return out


def rc_params_asn1tools(message: bytes) -> dict[int, bytes]:
    """The reference: E2SM-RC-IndicationMessage Format 1 -> {RAN parameter ID: octets}
    (:func:`rc_leaves_asn1tools`, :func:`rc_params_from_leaves`)."""
    return rc_params_from_leaves(rc_leaves_asn1tools(message))


def rc_params_fast(message: bytes) -> dict[int, bytes]:
    """The walkers: the octet walker, else the bit walker -> what :func:`rc_params_asn1tools`
    gives; :class:`~.per.Unsupported` where neither reads the message (E2DecodeError from
    :func:`rc_params_from_leaves`)."""
    try:
        return decode_rc_octs_params(message)
    except Unsupported:
        return rc_params_from_leaves(rc_leaves_fast(message))


def rc_params(message: bytes) -> dict[int, bytes]:
    """E2SM-RC-IndicationMessage octets -> {RAN parameter ID: octets}: the walkers
    (:func:`rc_params_fast`), else asn1tools on the same octets."""
    try:
        return rc_params_fast(message)
    except Unsupported:
        return rc_params_asn1tools(message)


def decode_rc_message_copy(header: bytes, message: bytes) -> RcMessageCopy:
    """(E2SM-RC indication header, message) -> RcMessageCopy. E2DecodeError (naming the header
    format where it matters) when not a Format 1 message copy carrying an RRC message and a UE
    ID in the header or in RAN parameter 4, or when the two UE IDs differ."""
    h = decode_rc_header(header)
    params = rc_params(message)
    if RC_PARAM_RRC_MESSAGE not in params:
        raise E2DecodeError(f"E2SM-RC message copy (header Format {h.format}) has no RRC Message (RAN parameter 3)")
    ue = h.ue
    if RC_PARAM_UE_ID in params:
        pue = decode_ueid(params[RC_PARAM_UE_ID])
        if ue is not None and pue != ue:
            raise E2DecodeError(f"E2SM-RC header Format {h.format} UE {ue.key} differs from RAN parameter 4 UE {pue.key}")
        ue = pue
    if ue is None:
        raise E2DecodeError(f"E2SM-RC message copy has no UE ID (header Format {h.format}, no RAN parameter 4)")
    cell = decode_cgi(params[RC_PARAM_CELL_GLOBAL_ID]) if RC_PARAM_CELL_GLOBAL_ID in params else None
    return RcMessageCopy(params[RC_PARAM_RRC_MESSAGE], ue, cell, h.condition_id, h.format,
                         h.insert_style, h.insert_indication_id)


def message_copy_parts(header: bytes, message: bytes) -> tuple[bytes, str, int]:
    """The ingest's fast path: (E2SM-RC indication header, message) of the plain message-copy
    shape -> (RRC message octets, UE key, serving NR cell identity or -1), what
    :func:`decode_rc_message_copy` gives (its ``rrc``, ``ue.key``, ``cell.cell_id``); the UE and
    cell are memoised on their octets (:func:`_copy_ids`). :class:`~.per.Unsupported` when the
    message is not the walker's shape or the copy lacks its RRC message (call
    :func:`decode_rc_message_copy` then); E2DecodeError as that function raises it."""
    try:
        params = rc_params_fast(message)
    except E2DecodeError as e:
        raise Unsupported(e.reason) from None
    rrc = params.get(RC_PARAM_RRC_MESSAGE)
    if rrc is None:
        raise Unsupported("no RRC Message")
    ue, cell = _copy_ids(header, params.get(RC_PARAM_UE_ID), params.get(RC_PARAM_CELL_GLOBAL_ID))
    return rrc, ue, cell


@functools.lru_cache(maxsize=65536)
def _copy_ids(header: bytes, ue_param: bytes | None, cgi: bytes | None) -> tuple[str, int]:
    """(header, RAN parameter 4 and 6 octets) -> (UE key, cell id or -1), by the rules of
    :func:`decode_rc_message_copy` (the header's UE, else parameter 4's; both must agree)."""
    h = decode_rc_header(header)
    ue = h.ue
    if ue_param is not None:
        pue = decode_ueid(ue_param)
        if ue is not None and pue != ue:
            raise Unsupported("UE IDs differ")
        ue = pue
    if ue is None:
        raise Unsupported("no UE ID")
    return ue.key, decode_cgi(cgi).cell_id if cgi is not None else -1


# ------------------------------------------------------------------------------------------------
# subscription payloads (event trigger and action definition)
# ------------------------------------------------------------------------------------------------

def rc_event_trigger_message_copy(condition_id: int = 1) -> bytes:
    """E2SM-RC event trigger Format 1 (clause 9.2.1.1.1): an NR UL-DCCH MeasurementReport."""
    return e2sm_spec().encode("E2SM-RC-EventTrigger", {"ric-eventTrigger-formats": ("eventTrigger-Format1", {
        "message-List": [{"ric-eventTriggerCondition-ID": condition_id, "messageType": (
            "messageType-Choice-RRC", {"rRC-Message": {"rrcType": ("nR", "uL-DCCH"),
                                                       "messageID": RRC_MSG_ID_MEASUREMENT_REPORT}})}]})})


def rc_action_definition_message_copy() -> bytes:
    """E2SM-RC action definition Format 1, REPORT Style 1: report RAN parameters 3, 4 and 6."""
    return e2sm_spec().encode("E2SM-RC-ActionDefinition", {
        "ric-Style-Type": RC_STYLE_MESSAGE_COPY,
        "ric-actionDefinition-formats": ("actionDefinition-Format1", {"ranP-ToBeReported-List": [
            {"ranParameter-ID": p} for p in (RC_PARAM_RRC_MESSAGE, RC_PARAM_UE_ID, RC_PARAM_CELL_GLOBAL_ID)]})})
