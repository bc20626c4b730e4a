"""Shared E2 information elements: the E2SM common IEs (O-RAN.WG3.E2SM-v02.01 / v03.01 clause
6.2.2: PLMN identity, GUAMI, Global gNB ID, ``UEID``, ``CGI``), the decode error, and the
project's compiled E2SM ASN.1 module (``asn1/pallas-e2sm.asn``, asn1tools, aligned PER).

Every layer module (:mod:`.e2ap`, :mod:`.sm_rc`, :mod:`.sm_kpm`, :mod:`.rrc`) imports this one and
nothing imports them back: no import cycle.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

ASN1_PATH = os.path.join(os.path.dirname(__file__), "asn1", "pallas-e2sm.asn")


class E2DecodeError(ValueError):
    """A PDU could not be decoded; ``reason`` says why (malformed, truncated, unsupported)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@functools.lru_cache(maxsize=None)
def e2sm_spec() -> Any:
    """The project's E2SM-RC/KPM module compiled with asn1tools, codec 'per' (aligned); 0.4 s once."""
    import asn1tools
    return asn1tools.compile_files(ASN1_PATH, "per")


@functools.lru_cache(maxsize=None)
def e2sm_decode_spec() -> Any:
    """The same module compiled with every REAL read as the OCTET STRING of its contents, for
    decoding: aligned PER writes a REAL as an aligned length and the X.690 clause 8.5 contents
    octets (X.691 clause 15), exactly as it writes an unconstrained OCTET STRING, so this spec
    reads every PDU the first one reads, and hands each REAL's contents to
    :func:`.per.decode_real`. asn1tools' own REAL decoder reads only base 2 with scale factor 0
    and 1- or 2-octet exponents, and raises on a malformed REAL, which would lose the whole
    PDU for one value (issue 28); 0.4 s once."""
    import re

    import asn1tools
    with open(ASN1_PATH, encoding="utf-8") as f:
        text = f.read()
    code = "\n".join(line.split("--")[0] for line in text.splitlines())  # comments may say REAL
    return asn1tools.compile_string(re.sub(r"\bREAL\b", "OCTET STRING", code), "per")


def asn_decode(type_name: str, b: bytes) -> Any:
    """Decode ``b`` as ``type_name`` of the project's E2SM module; any asn1tools failure becomes
    :class:`E2DecodeError` naming the type."""
    try:
        return e2sm_spec().decode(type_name, b)
    except Exception as e:  # noqa: BLE001 - asn1tools raises DecodeError and others
        raise E2DecodeError(f"{type_name}: {type(e).__name__}: {e}") from None


def asn_decode_raw_reals(type_name: str, b: bytes) -> Any:
    """:func:`asn_decode` with :func:`e2sm_decode_spec`: every REAL comes out as its contents
    octets (decode them with :func:`.per.decode_real`)."""
    try:
        return e2sm_decode_spec().decode(type_name, b)
    except Exception as e:  # noqa: BLE001 - asn1tools raises DecodeError and others
        raise E2DecodeError(f"{type_name}: {type(e).__name__}: {e}") from None


def pycrate_decode(obj: Any, b: bytes, what: str, aligned: bool = False) -> Any:
    """Decode ``b`` with the pycrate ASN.1 object ``obj`` (UPER, or APER if ``aligned``) and
    return its value; any pycrate failure (it raises many types) becomes E2DecodeError naming
    ``what``."""
    try:
        (obj.from_aper if aligned else obj.from_uper)(b)
        return obj.get_val()
    except Exception as e:  # noqa: BLE001 - pycrate raises many types
        raise E2DecodeError(f"{what}: {type(e).__name__}: {e}") from None


def plmn_to_bytes(plmn: str) -> bytes:
    """'MCCMNC' (5 or 6 digits) -> 3-octet TBCD PLMN identity (TS 38.413 clause 9.3.3.5)."""
    if not (plmn.isdigit() and len(plmn) in (5, 6)):
        raise ValueError(f"PLMN must be 5 or 6 digits, got {plmn!r}")
    d = [int(c) for c in plmn]
    mnc3 = d[5] if len(d) == 6 else 0xF
    return bytes([(d[1] << 4) | d[0], (mnc3 << 4) | d[2], (d[4] << 4) | d[3]])


def plmn_from_bytes(b: bytes) -> str:
    """3-octet TBCD PLMN identity -> 'MCCMNC'. Raises E2DecodeError on a non-BCD digit."""
    if len(b) != 3:
        raise E2DecodeError(f"PLMN identity has {len(b)} octets, not 3")
    digits = [b[0] & 0xF, b[0] >> 4, b[1] & 0xF, b[2] & 0xF, b[2] >> 4]
    if any(x > 9 for x in digits):
        raise E2DecodeError("PLMN identity is not BCD")
    mnc3 = b[1] >> 4
    s = "".join(map(str, digits))
    if mnc3 == 0xF:
        return s
    if mnc3 > 9:
        raise E2DecodeError("PLMN identity is not BCD")
    return s + str(mnc3)


@dataclass(frozen=True, slots=True)
class Guami:
    """GUAMI (TS 38.413 clause 9.3.3.3): PLMN, AMF region (8 bit), set (10 bit), pointer (6 bit)."""

    plmn: str = "00101"
    amf_region_id: int = 1
    amf_set_id: int = 1
    amf_pointer: int = 0


@dataclass(frozen=True, slots=True)
class GlobalGnbId:
    """Global gNB ID: PLMN and a gNB ID of ``length`` bits (22..32)."""

    plmn: str
    gnb_id: int
    length: int = 28


@dataclass(frozen=True, slots=True)
class UeId:
    """E2SM common ``UEID`` (O-RAN.WG3.E2SM-v02.01 clause 6.2.2.1) for the three NG-RAN kinds Pallas
    consumes: ``kind`` 'gNB' (amf_ue_ngap_id, guami, optional lists and ids), 'gNB-DU'
    (f1ap_ids[0], ran_ue_id) or 'gNB-CU-UP' (e1ap_ids[0], ran_ue_id).

    :attr:`key` is the track key: the AMF UE NGAP ID for a gNB UE (kept by the AMF across
    Xn handovers, so a UE's track survives its handovers), else a prefixed F1AP/E1AP id.
    """

    kind: str = "gNB"
    amf_ue_ngap_id: int = -1
    guami: Guami | None = None
    f1ap_ids: tuple[int, ...] = ()
    e1ap_ids: tuple[int, ...] = ()
    ran_ue_id: bytes | None = None
    xnap_id: int | None = None
    global_gnb: GlobalGnbId | None = None

    @property
    def key(self) -> str:
        """The UE's key in the track store: the AMF UE NGAP ID (decimal) for a gNB UEID,
        ``du-f1ap-<id>`` / ``cuup-e1ap-<id>`` for gNB-DU / gNB-CU-UP UEIDs (the E2SM common UEID CHOICE)."""
        if self.kind == "gNB":
            return str(self.amf_ue_ngap_id)
        if self.kind == "gNB-DU":
            return f"du-f1ap-{self.f1ap_ids[0]}"
        return f"cuup-e1ap-{self.e1ap_ids[0]}"


@dataclass(frozen=True, slots=True)
class Cgi:
    """Cell global identity: ``rat`` 'nr' (36-bit NR cell identity) or 'eutra' (28-bit ECI)."""

    plmn: str
    cell_id: int
    rat: str = "nr"


def _bits(v: int, n: int) -> tuple[bytes, int]:
    if not 0 <= v < (1 << n):
        raise ValueError(f"{v} does not fit in {n} bits")
    nbytes = (n + 7) // 8
    return (v << (8 * nbytes - n)).to_bytes(nbytes, "big"), n


def _unbits(t: tuple[bytes, int]) -> int:
    b, n = t
    return int.from_bytes(b, "big") >> (8 * len(b) - n)


def _guami_val(g: Guami) -> dict:
    return {"pLMNIdentity": plmn_to_bytes(g.plmn), "aMFRegionID": _bits(g.amf_region_id, 8),
            "aMFSetID": _bits(g.amf_set_id, 10), "aMFPointer": _bits(g.amf_pointer, 6)}


def ueid_to_asn(u: UeId) -> tuple:
    """UeId -> asn1tools value of ``UEID``."""
    if u.kind == "gNB":
        if u.guami is None or u.amf_ue_ngap_id < 0:
            raise ValueError("a gNB UEID needs amf_ue_ngap_id and guami")
        v: dict = {"amf-UE-NGAP-ID": u.amf_ue_ngap_id, "guami": _guami_val(u.guami)}
        if u.f1ap_ids:
            v["gNB-CU-UE-F1AP-ID-List"] = [{"gNB-CU-UE-F1AP-ID": i} for i in u.f1ap_ids]
        if u.e1ap_ids:
            v["gNB-CU-CP-UE-E1AP-ID-List"] = [{"gNB-CU-CP-UE-E1AP-ID": i} for i in u.e1ap_ids]
        if u.ran_ue_id is not None:
            v["ran-UEID"] = u.ran_ue_id
        if u.xnap_id is not None:
            v["m-NG-RAN-UE-XnAP-ID"] = u.xnap_id
        if u.global_gnb is not None:
            g = u.global_gnb
            v["globalGNB-ID"] = {"pLMNIdentity": plmn_to_bytes(g.plmn),
                                 "gNB-ID": ("gNB-ID", _bits(g.gnb_id, g.length))}
        return ("gNB-UEID", v)
    if u.kind == "gNB-DU":
        v = {"gNB-CU-UE-F1AP-ID": u.f1ap_ids[0]}
        if u.ran_ue_id is not None:
            v["ran-UEID"] = u.ran_ue_id
        return ("gNB-DU-UEID", v)
    if u.kind == "gNB-CU-UP":
        v = {"gNB-CU-CP-UE-E1AP-ID": u.e1ap_ids[0]}
        if u.ran_ue_id is not None:
            v["ran-UEID"] = u.ran_ue_id
        return ("gNB-CU-UP-UEID", v)
    raise ValueError(f"unknown UEID kind {u.kind!r}")


def ueid_from_asn(t: tuple) -> UeId:
    """asn1tools value of ``UEID`` -> UeId. E2DecodeError for the kinds Pallas does not consume."""
    alt, v = t
    if alt == "gNB-UEID":
        g = v["guami"]
        gg = None
        if "globalGNB-ID" in v:
            gid = v["globalGNB-ID"]
            bits = gid["gNB-ID"][1]
            gg = GlobalGnbId(plmn_from_bytes(gid["pLMNIdentity"]), _unbits(bits), bits[1])
        return UeId(
            kind="gNB", amf_ue_ngap_id=v["amf-UE-NGAP-ID"],
            guami=Guami(plmn_from_bytes(g["pLMNIdentity"]), _unbits(g["aMFRegionID"]),
                        _unbits(g["aMFSetID"]), _unbits(g["aMFPointer"])),
            f1ap_ids=tuple(i["gNB-CU-UE-F1AP-ID"] for i in v.get("gNB-CU-UE-F1AP-ID-List", ())),
            e1ap_ids=tuple(i["gNB-CU-CP-UE-E1AP-ID"] for i in v.get("gNB-CU-CP-UE-E1AP-ID-List", ())),
            ran_ue_id=v.get("ran-UEID"), xnap_id=v.get("m-NG-RAN-UE-XnAP-ID"), global_gnb=gg)
    if alt == "gNB-DU-UEID":
        return UeId(kind="gNB-DU", f1ap_ids=(v["gNB-CU-UE-F1AP-ID"],), ran_ue_id=v.get("ran-UEID"))
    if alt == "gNB-CU-UP-UEID":
        return UeId(kind="gNB-CU-UP", e1ap_ids=(v["gNB-CU-CP-UE-E1AP-ID"],),
                    ran_ue_id=v.get("ran-UEID"))
    raise E2DecodeError(f"unsupported UEID kind {alt}")


def cgi_to_asn(c: Cgi) -> tuple:
    """Cgi -> asn1tools value of ``CGI``."""
    if c.rat == "nr":
        return ("nR-CGI", {"pLMNIdentity": plmn_to_bytes(c.plmn), "nRCellIdentity": _bits(c.cell_id, 36)})
    if c.rat == "eutra":
        return ("eUTRA-CGI", {"pLMNIdentity": plmn_to_bytes(c.plmn),
                              "eUTRACellIdentity": _bits(c.cell_id, 28)})
    raise ValueError(f"unknown RAT {c.rat!r}")


def cgi_from_asn(t: tuple) -> Cgi:
    """asn1tools value of ``CGI`` -> Cgi."""
    alt, v = t
    if alt == "nR-CGI":
        return Cgi(plmn_from_bytes(v["pLMNIdentity"]), _unbits(v["nRCellIdentity"]), "nr")
    if alt == "eUTRA-CGI":
        return Cgi(plmn_from_bytes(v["pLMNIdentity"]), _unbits(v["eUTRACellIdentity"]), "eutra")
    raise E2DecodeError(f"unsupported CGI kind {alt}")


def e2_node_name(plmn: str, gnb_id: int) -> str:
    """OSC-style E2 node (RAN) name of a gNB: ``gnb_<mcc>_<mnc>_<gNB id as 8 hex digits>``."""
    return f"gnb_{plmn[:3]}_{plmn[3:]}_{gnb_id:08x}"


@functools.lru_cache(maxsize=65536)
def decode_ueid(b: bytes) -> UeId:
    """Aligned-PER ``UEID`` octets -> UeId (memoised: a UE's ID octets repeat in every report)."""
    return ueid_from_asn(asn_decode("UEID", b))


@functools.lru_cache(maxsize=65536)
def decode_cgi(b: bytes) -> Cgi:
    """Aligned-PER ``CGI`` octets -> Cgi (memoised: an E2 node reports few cells)."""
    return cgi_from_asn(asn_decode("CGI", b))
