"""E2AP RICindication (O-RAN.WG3.E2AP clause 9.1.1.7, aligned PER): decode.

RICindication (procedure code 5) with its IEs RICrequestID (29), RANfunctionID (5),
RICactionID (15), RICindicationSN (27), RICindicationType (28), RICindicationHeader (25),
RICindicationMessage (26) and RICcallProcessID (20). One decode path: the envelope walker
below, which hands anything it does not read (an unknown IE, an extension, a fragmented
length) to pycrate's bundled ``E2AP`` module on the same bytes; the tests require equal results
on generated PDUs.

Walker layout (X.691 clauses 10.9 lengths, 12 integers, 19 sequences, 23 choices):
E2AP-PDU ::= CHOICE {initiatingMessage, ...}; InitiatingMessage {procedureCode (0..255),
criticality ENUMERATED(3), value open type}; RICindication ::= SEQUENCE {protocolIEs
ProtocolIE-Container (SIZE(0..65535)), ...}; ProtocolIE-Field {id (0..65535), criticality,
value open type}; IE values RICrequestID {INTEGER (0..65535) x2, ...}, RANfunctionID
(0..4095), RICactionID (0..255), RICindicationSN (0..65535), RICindicationType ENUMERATED
{report, insert, ...}, OCTET STRINGs.

pycrate's compiled types are shared module objects: decode from one thread at a time (the xApp
decodes on its one RMR dispatch thread).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

from .ie import E2DecodeError, pycrate_decode
from .per import Unsupported, alen, octs_value

# E2AP protocol IE ids (O-RAN.WG3.E2AP E2AP-Constants)
IE_RIC_REQUEST_ID = 29
IE_RAN_FUNCTION_ID = 5
IE_RIC_ACTION_ID = 15
IE_RIC_INDICATION_SN = 27
IE_RIC_INDICATION_TYPE = 28
IE_RIC_INDICATION_HEADER = 25
IE_RIC_INDICATION_MESSAGE = 26
IE_RIC_CALL_PROCESS_ID = 20
PROC_RIC_INDICATION = 5


@dataclass(frozen=True, slots=True)
class RicIndication:
    """An E2AP RICindication (O-RAN.WG3.E2AP clause 9.1.1.7): ids, type and the E2SM octets."""

    ric_requestor_id: int
    ric_instance_id: int
    ran_function_id: int
    action_id: int
    header: bytes
    message: bytes
    sn: int | None = None
    ind_type: str = "report"
    call_process_id: bytes | None = None


@functools.lru_cache(maxsize=None)
def e2ap_pdu() -> Any:
    """pycrate's E2AP-PDU type (compiled module, about 1 s on first use)."""
    from pycrate_asn1dir import E2AP
    return E2AP.E2AP_PDU_Descriptions.E2AP_PDU


def _ie_value(ie: int, v: bytes) -> Any:
    if ie == 29:  # RICrequestID
        if len(v) != 5 or v[0] != 0:
            raise Unsupported("RICrequestID shape")
        return {"ricRequestorID": (v[1] << 8) | v[2], "ricInstanceID": (v[3] << 8) | v[4]}
    if ie == 5:  # RANfunctionID (0..4095)
        if len(v) != 2:
            raise Unsupported("RANfunctionID shape")
        x = (v[0] << 8) | v[1]
        if x > 4095:
            raise Unsupported("RANfunctionID range")
        return x
    if ie == 15:  # RICactionID (0..255)
        if len(v) != 1:
            raise Unsupported("RICactionID shape")
        return v[0]
    if ie == 27:  # RICindicationSN (0..65535)
        if len(v) != 2:
            raise Unsupported("RICindicationSN shape")
        return (v[0] << 8) | v[1]
    if ie == 28:  # RICindicationType
        if len(v) != 1 or v[0] & 0x80 or v[0] & 0x3F:
            raise Unsupported("RICindicationType shape")
        return "insert" if v[0] & 0x40 else "report"
    if ie in (25, 26, 20):
        return octs_value(v)
    raise Unsupported(f"IE {ie}")


def decode_ric_indication_ies(b: bytes) -> dict[int, Any]:
    """The walker: E2AP-PDU bytes -> {IE id: value} for a RICindication, as pycrate's get_val
    gives them; :class:`~.per.Unsupported` for anything else."""
    if len(b) < 4 or b[0] != 0x00 or b[1] != 5:
        raise Unsupported("not an initiatingMessage RICindication")
    if b[2] & 0x3F or (b[2] >> 6) > 2:
        raise Unsupported("criticality")
    n, i = alen(b, 3)
    if i + n != len(b):
        raise Unsupported("open type length mismatch")
    if n < 3 or b[i] != 0:  # RICindication extension bit and padding
        raise Unsupported("RICindication extension")
    count = (b[i + 1] << 8) | b[i + 2]
    i += 3
    out: dict[int, Any] = {}
    for _ in range(count):
        if i + 3 > len(b):
            raise Unsupported("truncated IE")
        ie = (b[i] << 8) | b[i + 1]
        c = b[i + 2]
        if c & 0x3F or (c >> 6) > 2:
            raise Unsupported("IE criticality")
        ln, j = alen(b, i + 3)
        if j + ln > len(b):
            raise Unsupported("truncated IE value")
        if ie in out:
            raise Unsupported("repeated IE")
        out[ie] = _ie_value(ie, b[j:j + ln])
        i = j + ln
    if i != len(b):
        raise Unsupported("trailing octets")
    return out


#: the IEs the walker reads, as bits of a mask; the RICindication's mandatory ones
_IE_BIT = {29: 1, 5: 2, 15: 4, 27: 8, 28: 16, 25: 32, 26: 64, 20: 128}
_IE_MANDATORY = 1 | 2 | 4 | 16 | 32 | 64


def indication_parts(b: bytes) -> tuple[int, bytes, bytes]:
    """The walker's lean form for the ingest's fast path: E2AP-PDU bytes -> (RAN function ID,
    indication header octets, indication message octets) of a RICindication that
    :func:`decode_ric_indication_ies` reads and :func:`indication_from_ies` accepts (the same
    checks of every IE, without building the others' values). :class:`~.per.Unsupported`
    for anything else, including what the full decode would reject: call
    :func:`decode_ric_indication` then, for its value or its error."""
    n = len(b)
    if n < 4 or b[0] != 0x00 or b[1] != 5 or b[2] & 0x3F or (b[2] >> 6) > 2:
        raise Unsupported("not an initiatingMessage RICindication")
    x = b[3]
    if x < 0x80:
        i = 4
        ln = x
    elif x < 0xC0 and n > 4:
        i = 5
        ln = ((x & 0x3F) << 8) | b[4]
    else:
        raise Unsupported("length")
    if i + ln != n or ln < 3 or b[i] != 0:
        raise Unsupported("open type length or RICindication extension")
    count = (b[i + 1] << 8) | b[i + 2]
    i += 3
    seen = ran = 0
    header = message = b""
    for _ in range(count):
        if i + 4 > n:
            raise Unsupported("truncated IE")
        ie = (b[i] << 8) | b[i + 1]
        c = b[i + 2]
        x = b[i + 3]
        if c & 0x3F or (c >> 6) > 2:
            raise Unsupported("IE criticality")
        if x < 0x80:
            j = i + 4
            ln = x
        elif x < 0xC0 and i + 4 < n:
            j = i + 5
            ln = ((x & 0x3F) << 8) | b[i + 4]
        else:
            raise Unsupported("IE length")
        e = j + ln
        bit = _IE_BIT.get(ie, 0)
        if e > n or not bit or seen & bit:
            raise Unsupported("IE value, unknown or repeated IE")
        seen |= bit
        if bit & (32 | 64 | 128):                  # OCTET STRING in an open type
            if ln == 0:
                raise Unsupported("empty open type")
            x = b[j]
            if x < 0x80:
                k = j + 1 + x
                v0 = j + 1
            elif x < 0xC0 and ln > 1:
                v0 = j + 2
                k = v0 + (((x & 0x3F) << 8) | b[j + 1])
            else:
                raise Unsupported("OCTET STRING length")
            if k != e:
                raise Unsupported("OCTET STRING length mismatch")
            if ie == 25:
                header = b[v0:e]
            elif ie == 26:
                message = b[v0:e]
        elif ie == 5:
            ran = (b[j] << 8) | b[j + 1] if ln == 2 else 4096
            if ran > 4095:
                raise Unsupported("RANfunctionID")
        elif ie == 29:
            if ln != 5 or b[j] != 0:
                raise Unsupported("RICrequestID shape")
        elif ie == 28:
            if ln != 1 or b[j] & 0xBF:
                raise Unsupported("RICindicationType shape")
        elif ln != (1 if ie == 15 else 2):
            raise Unsupported("RICactionID or RICindicationSN shape")
        i = e
    if i != n or seen & _IE_MANDATORY != _IE_MANDATORY:
        raise Unsupported("trailing octets or a mandatory IE missing")
    return ran, header, message


def decode_e2ap_pycrate(b: bytes) -> RicIndication:
    """E2AP-PDU bytes -> RicIndication with pycrate (the reference decoder)."""
    v = pycrate_decode(e2ap_pdu(), b, "E2AP", aligned=True)
    try:
        kind, body = v
        name = body["value"][0] if isinstance(body.get("value"), tuple) else "(unknown value)"
        if kind != "initiatingMessage" or name != "RICindication":
            raise E2DecodeError(f"E2AP {kind} {name} is not a RICindication")
        f: dict[int, Any] = {ie["id"]: ie["value"][1] for ie in body["value"][1]["protocolIEs"]}
        return indication_from_ies(f)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        if isinstance(e, E2DecodeError):
            raise
        raise E2DecodeError(f"E2AP: unexpected structure ({type(e).__name__}: {e})") from None


def indication_from_ies(f: Mapping[int, Any]) -> RicIndication:
    """{IE id: value} -> RicIndication; E2DecodeError naming a missing mandatory IE."""
    for need in (IE_RIC_REQUEST_ID, IE_RAN_FUNCTION_ID, IE_RIC_ACTION_ID, IE_RIC_INDICATION_TYPE,
                 IE_RIC_INDICATION_HEADER, IE_RIC_INDICATION_MESSAGE):
        if need not in f:
            raise E2DecodeError(f"RICindication lacks mandatory IE {need}")
    rid = f[IE_RIC_REQUEST_ID]
    return RicIndication(
        ric_requestor_id=rid["ricRequestorID"], ric_instance_id=rid["ricInstanceID"],
        ran_function_id=f[IE_RAN_FUNCTION_ID], action_id=f[IE_RIC_ACTION_ID],
        header=f[IE_RIC_INDICATION_HEADER], message=f[IE_RIC_INDICATION_MESSAGE],
        sn=f.get(IE_RIC_INDICATION_SN), ind_type=f[IE_RIC_INDICATION_TYPE],
        call_process_id=f.get(IE_RIC_CALL_PROCESS_ID))


def decode_ric_indication(b: bytes) -> RicIndication:
    """E2AP-PDU bytes -> RicIndication. The walker first; pycrate for the rest. Raises
    E2DecodeError with a reason on anything malformed, truncated or not a RICindication."""
    try:
        return indication_from_ies(decode_ric_indication_ies(b))
    except Unsupported:
        return decode_e2ap_pycrate(b)
