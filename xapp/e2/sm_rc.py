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

One decode path per part: the header and UEID/CGI by asn1tools (memoised on their octets:
pure functions of the bytes), the message's RAN parameter list by the walker
:func:`decode_rc_octs_params` when it has the plain message-copy shape, else by asn1tools.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .ie import E2DecodeError, UeId, Cgi, asn_decode, decode_cgi, decode_ueid, e2sm_spec, ueid_from_asn
from .per import Unsupported, alen
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
    """The walker: E2SM-RC-IndicationMessage Format 1 whose every RAN parameter is an ELEMENT
    holding an OCTET STRING (the message-copy shape) -> {RAN parameter ID: octets}.

    Layout (aligned PER): message and CHOICE extension bits, Format 1 index (3 bits of 5 root
    alternatives), Format 1 extension bit, then the list count - 1 in two octets; each item:
    item and RANParameter-ID extension bits, octet count - 1 (2 bits), the ID - 1 in that many
    octets; then one octet 0x04 (ElementTrue, valueOctS) and an aligned length with the octets.
    """
    n = len(b)
    if n < 3 or b[0] != 0:
        raise Unsupported("E2SM-RC indication message shape")
    count = ((b[1] << 8) | b[2]) + 1
    i = 3
    out: dict[int, bytes] = {}
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
        if b[i + 1 + k] != 0x04:
            raise Unsupported("RAN parameter value is not an ELEMENT OCTET STRING")
        ln, j = alen(b, i + 2 + k)
        if j + ln > n or pid in out:
            raise Unsupported("RAN parameter length or repetition")
        out[pid] = b[j:j + ln]
        i = j + ln
    if i != n:
        raise Unsupported("trailing octets")
    return out


def rc_params_asn1tools(message: bytes) -> dict[int, bytes]:
    """The reference: E2SM-RC-IndicationMessage Format 1 -> {RAN parameter ID: octets} of its
    ELEMENT OCTET STRING parameters (others are not message-copy parameters and are skipped)."""
    alt, v = asn_decode("E2SM-RC-IndicationMessage", message)["ric-indicationMessage-formats"]
    if alt != "indicationMessage-Format1":
        raise E2DecodeError(f"unsupported E2SM-RC indication message {alt} (REPORT Style 1 uses Format1)")
    params: dict[int, bytes] = {}
    for it in v["ranP-Reported-List"]:
        vt = it["ranParameter-valueType"]
        if vt[0] == "ranP-Choice-ElementTrue" and vt[1]["ranParameter-value"][0] == "valueOctS":
            params[it["ranParameter-ID"]] = vt[1]["ranParameter-value"][1]
    return params


def decode_rc_message_copy(header: bytes, message: bytes) -> RcMessageCopy:
    """(E2SM-RC indication header, message) -> RcMessageCopy. E2DecodeError (naming the header
    format where it matters) when not a Format 1 message copy carrying an RRC message and a UE
    ID in the header or in RAN parameter 4, or when the two UE IDs differ."""
    h = decode_rc_header(header)
    try:
        params = decode_rc_octs_params(message)
    except Unsupported:
        params = rc_params_asn1tools(message)
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
    params = decode_rc_octs_params(message)
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
