"""Recipe for the interop vectors (issue 14): E2SM-RC and E2SM-KPM PDUs encoded by an encoder
independent of Pallas (asn1tools compiling the PUBLIC O-RAN ASN.1 modules, not the project's
``xapp/e2/asn1/pallas-e2sm.asn``), with the field values they were made from as the expected
result. The ASN.1 text is not in the repository; fetch it and point ``--asn-dir`` at it:

    # the O-RAN modules as carried by Wireshark (epan/dissectors/asn1/e2ap/ of
    # github.com/wireshark/wireshark, e.g. commit e9526984f17cfc9c8bee1cc34a3950f25156480b):
    #   e2sm-v3.01.asn (E2SM-COMMON-IEs), e2sm-kpm-v2.02.asn, e2sm-kpm-v3.00.asn, e2sm-rc-v1.03.asn
    .venv/xapp/bin/python tests/xapp/e2/vectors/make_vectors.py --asn-dir DIR \
        -o tests/xapp/e2/vectors/interop.json

Files are found by their module header (``E2SM-COMMON-IEs``, ``E2SM-KPM-IEs ... version2`` /
``version3``, ``E2SM-RC-IEs``), so a complete module or an extract of it both work. Wireshark's
copies comment out a few types their dissector does not need; the recipe adds exactly those
back (FIXUPS below, values from the same specifications) when a module lacks them, and renames
the one type name Wireshark changed (``PLMN-Identity`` in KPM v02.02). Everything else is the
text as published.

Vectors: RC indication header Formats 1 and 2 (v01.03) and 3 (v03.00 extension addition, with
and without a UE ID), each with an indication message Format 1 message copy (RAN parameters 3
RRC message, 4 UE ID, 6 CGI, as OCTET STRINGs of the public ``UEID``/``CGI``); KPM v02.02 and
v03.00 header Format 1 and message Formats 1, 2 and 3 (several granularity periods, noValue,
integer and real records, measName and measID, labels). The JSON holds per vector the version,
the header and message in hex and the expected decode.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
from pathlib import Path

import asn1tools

NTP = 2208988800

FIXUPS = {
    "E2SM-COMMON-IEs": {
        "ENB-ID": "ENB-ID ::= CHOICE { macro-eNB-ID BIT STRING (SIZE (20)), home-eNB-ID BIT STRING (SIZE (28)), ..., "
                  "short-Macro-eNB-ID BIT STRING (SIZE(18)), long-Macro-eNB-ID BIT STRING (SIZE(21)) }",
        "GlobalENB-ID": "GlobalENB-ID ::= SEQUENCE { pLMNIdentity PLMNIdentity, eNB-ID ENB-ID, ... }",
        "GlobalenGNB-ID": "GlobalenGNB-ID ::= SEQUENCE { pLMN-Identity PLMNIdentity, en-gNB-ID EN-GNB-ID, ... }",
        "GNB-DU-ID": "GNB-DU-ID ::= INTEGER (0..68719476735)",
        "GNB-CU-UP-ID": "GNB-CU-UP-ID ::= INTEGER (0..68719476735)",
        "NGENB-DU-ID": "NGENB-DU-ID ::= INTEGER (0..68719476735)",
    },
    "E2SM-KPM-IEs": {
        "LogicalOR": "LogicalOR ::= ENUMERATED {true, ...}",
        "maxnoofUEID": "maxnoofUEID INTEGER ::= 65535",
        "maxnoofRICStyles": "maxnoofRICStyles INTEGER ::= 63",
    },
    "E2SM-RC-IEs": {},
}


def _defines(text: str, name: str) -> bool:
    return re.search(rf"^\s*{re.escape(name)}\s+(INTEGER\s+)?::=", text, re.M) is not None


def load(asn_dir: Path) -> dict[str, str]:
    """Module texts by key 'common', 'kpm2', 'kpm3', 'rc', with the fix-ups applied."""
    out: dict[str, str] = {}
    for p in sorted(asn_dir.glob("*.asn*")):
        t = p.read_text()
        head = t[:t.find("DEFINITIONS")] if "DEFINITIONS" in t else ""
        if "E2SM-COMMON-IEs" in head:
            key, mod = "common", "E2SM-COMMON-IEs"
        elif "E2SM-KPM-IEs" in head and "version2" in head:
            key, mod = "kpm2", "E2SM-KPM-IEs"
            t = re.sub(r"\bPLMN-Identity\b", "PLMNIdentity", t)
        elif "E2SM-KPM-IEs" in head and "version3" in head:
            key, mod = "kpm3", "E2SM-KPM-IEs"
        elif "E2SM-RC-IEs" in head:
            key, mod = "rc", "E2SM-RC-IEs"
            if re.search(r"^\s*--\s*NR-CGI,", t, re.M):
                t = re.sub(r"^\s*--\s*NR-CGI,", "        NR-CGI,", t, count=1, flags=re.M)
        else:
            continue
        add = [d for n, d in FIXUPS[mod].items() if not _defines(t, n)]
        if add:
            i = t.rindex("END")
            t = t[:i] + "\n-- added by make_vectors.py (commented out in the copy used)\n" + "\n".join(add) + "\n" + t[i:]
        out[key] = t
    missing = {"common", "kpm2", "kpm3", "rc"} - set(out)
    if missing:
        raise SystemExit(f"--asn-dir lacks modules: {sorted(missing)}")
    return out


def compile_pair(common: str, other: str):
    return asn1tools.compile_string(common + "\n" + other, "per")


def bits(v: int, n: int) -> tuple[bytes, int]:
    nb = (n + 7) // 8
    return (v << (8 * nb - n)).to_bytes(nb, "big"), n


def ntp(t: float) -> bytes:
    s = int(t)
    return struct.pack(">II", s + NTP, int(round((t - s) * 2**32)))


GUAMI = {"pLMNIdentity": bytes([0x00, 0xF1, 0x10]), "aMFRegionID": bits(2, 8), "aMFSetID": bits(3, 10),
         "aMFPointer": bits(1, 6)}


def ue_gnb(amf: int) -> tuple:
    return ("gNB-UEID", {"amf-UE-NGAP-ID": amf, "guami": GUAMI})


def ue_du(f1ap: int) -> tuple:
    return ("gNB-DU-UEID", {"gNB-CU-UE-F1AP-ID": f1ap, "ran-UEID": bytes(range(8))})


def rrc_report() -> bytes:
    """An NR MeasurementReport by pycrate's RRCNR (TS 38.331), the copied RRC message."""
    from pycrate_asn1dir import RRCNR
    ul = RRCNR.NR_RRC_Definitions.UL_DCCH_Message
    ul.set_val({"message": ("c1", ("measurementReport", {"criticalExtensions": ("measurementReport", {
        "measResults": {"measId": 3, "measResultServingMOList": [{"servCellId": 0, "measResultServingCell": {
            "physCellId": 21, "measResult": {"cellResults": {"resultsSSB-Cell": {"rsrp": 60, "rsrq": 70, "sinr": 80}}}}}],
            "measResultNeighCells": ("measResultListNR", [{"physCellId": 22, "measResult": {"cellResults": {
                "resultsSSB-Cell": {"rsrp": 55}}}}])}})}))})
    return ul.to_uper()


def rc_vectors(spec) -> list[dict]:
    rrc = rrc_report()
    cgi = ("nR-CGI", {"pLMNIdentity": bytes([0x00, 0xF1, 0x10]), "nRCellIdentity": bits(0xA81B0C, 36)})

    def octs(pid: int, b: bytes) -> dict:
        return {"ranParameter-ID": pid, "ranParameter-valueType": (
            "ranP-Choice-ElementTrue", {"ranParameter-value": ("valueOctS", b)})}

    def message(ue) -> bytes:
        items = [octs(3, rrc)]
        if ue is not None:
            items.append(octs(4, spec.encode("UEID", ue)))
        items.append(octs(6, spec.encode("CGI", cgi)))
        return spec.encode("E2SM-RC-IndicationMessage", {"ric-indicationMessage-formats": (
            "indicationMessage-Format1", {"ranP-Reported-List": items})})

    out = []
    cases = [
        ("rc-v01.03-header-f1", "1.03", ("indicationHeader-Format1", {"ric-eventTriggerCondition-ID": 5}),
         ue_gnb(7), {"format": 1, "condition_id": 5, "ue": "7"}),
        ("rc-v01.03-header-f2", "1.03", ("indicationHeader-Format2", {
            "ueID": ue_gnb(1099511627775), "ric-InsertStyle-Type": 3, "ric-InsertIndication-ID": 2}),
         None, {"format": 2, "condition_id": None, "ue": "1099511627775", "insert_style": 3, "insert_indication_id": 2}),
        ("rc-v03.00-header-f3", "3.00", ("indicationHeader-Format3", {
            "ric-eventTriggerCondition-ID": 65535, "ueID": ue_du(42)}),
         None, {"format": 3, "condition_id": 65535, "ue": "du-f1ap-42"}),
        ("rc-v03.00-header-f3-ue-in-message", "3.00", ("indicationHeader-Format3", {}),
         ue_gnb(9), {"format": 3, "condition_id": None, "ue": "9"}),
    ]
    for name, ver, hdr, msg_ue, exp in cases:
        h = spec.encode("E2SM-RC-IndicationHeader", {"ric-indicationHeader-formats": hdr})
        exp = {**exp, "cell_id": 0xA81B0C, "rrc_hex": rrc.hex()}
        out.append({"name": name, "sm": "rc", "version": ver, "header": h.hex(), "message": message(msg_ue).hex(),
                    "expected": exp})
    return out


def kpm_vectors(spec, ver: str) -> list[dict]:
    t = 1_700_000_123.5 if ver == "3.00" else 1_700_000_123.0
    ts = ntp(t) if ver == "3.00" else ntp(t)[:4]
    h = spec.encode("E2SM-KPM-IndicationHeader", {"indicationHeader-formats": ("indicationHeader-Format1", {
        "colletStartTime": ts, "senderName": "gnb-interop", "vendorName": "x"})})
    nol = [{"measLabel": {"noLabel": "true"}}]
    info = [{"measType": ("measName", "L1M.SS-RSRP"), "labelInfoList": nol},
            {"measType": ("measID", 77), "labelInfoList": nol},
            {"measType": ("measName", "DRB.UEThpDl"), "labelInfoList": [{"measLabel": {"fiveQI": 9}},
                                                                        {"measLabel": {"qCI": 5}}]}]
    f3 = {"ueMeasReportList": [
        {"ueID": ue_gnb(7), "measReport": {"measData": [
            {"measRecord": [("real", -96.0), ("integer", 3), ("integer", 100), ("integer", 200)]},
            {"measRecord": [("real", -95.5), ("noValue", None), ("integer", 110), ("noValue", None)],
             "incompleteFlag": "true"}],
            "measInfoList": info, "granulPeriod": 100}},
        {"ueID": ue_du(12), "measReport": {"measData": [
            {"measRecord": [("noValue", None), ("noValue", None), ("noValue", None), ("noValue", None)]},
            {"measRecord": [("real", -101.0), ("integer", 4294967295), ("integer", 0), ("real", 0.25)]}],
            "measInfoList": info}}]}
    f3_exp = {"ues": {
        "7": {"values": [["L1M.SS-RSRP", -95.5], ["measID:77", 3], ["DRB.UEThpDl|fiveQI=9", 110],
                         ["DRB.UEThpDl|qCI=5", 200]],
              "periods": [[["L1M.SS-RSRP", -96.0], ["measID:77", 3], ["DRB.UEThpDl|fiveQI=9", 100],
                           ["DRB.UEThpDl|qCI=5", 200]],
                          [["L1M.SS-RSRP", -95.5], ["DRB.UEThpDl|fiveQI=9", 110]]], "granularity_ms": 100},
        "du-f1ap-12": {"values": [["L1M.SS-RSRP", -101.0], ["measID:77", 4294967295], ["DRB.UEThpDl|fiveQI=9", 0],
                                  ["DRB.UEThpDl|qCI=5", 0.25]],
                       "periods": [[], [["L1M.SS-RSRP", -101.0], ["measID:77", 4294967295],
                                        ["DRB.UEThpDl|fiveQI=9", 0], ["DRB.UEThpDl|qCI=5", 0.25]]],
                       "granularity_ms": None}}, "node_values": []}
    f1 = {"measData": [{"measRecord": [("integer", 5), ("noValue", None), ("integer", 1), ("integer", 2)]},
                       {"measRecord": [("integer", 6), ("integer", 9), ("noValue", None), ("integer", 3)]}],
          "measInfoList": info, "granulPeriod": 1000}
    f1_exp = {"ues": {}, "node_values": [["L1M.SS-RSRP", 6], ["measID:77", 9], ["DRB.UEThpDl|fiveQI=9", 1],
                                         ["DRB.UEThpDl|qCI=5", 3]]}
    test = {"testType": ("rSRP", "true"), "testExpr": "present"}
    cond = {"matchingCondChoice": ("testCondInfo", test)} if ver == "3.00" else ("testCondInfo", test)
    f2 = {"measData": [{"measRecord": [("real", -88.0), ("integer", 40)]}],
          "measCondUEidList": [
              {"measType": ("measName", "L1M.SS-RSRP"), "matchingCond": [cond], "matchingUEidList": [{"ueID": ue_gnb(8)}]},
              {"measType": ("measName", "DRB.UEThpDl"), "matchingCond": [cond],
               "matchingUEidList": [{"ueID": ue_gnb(8)}, {"ueID": ue_gnb(9)}]}],
          "granulPeriod": 500}
    f2_exp = {"ues": {"8": {"values": [["L1M.SS-RSRP", -88.0]], "periods": [[["L1M.SS-RSRP", -88.0]]],
                            "granularity_ms": 500}},
              "node_values": [["L1M.SS-RSRP", None], ["DRB.UEThpDl", 40]]}
    out = []
    for fmt, body, exp in ((1, f1, f1_exp), (2, f2, f2_exp), (3, f3, f3_exp)):
        m = spec.encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": (f"indicationMessage-Format{fmt}", body)})
        out.append({"name": f"kpm-v{ver}-message-f{fmt}", "sm": "kpm", "version": ver, "header": h.hex(),
                    "message": m.hex(), "expected": {"format": fmt, "collect_start": t, "sender_name": "gnb-interop", **exp}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--asn-dir", type=Path, required=True)
    ap.add_argument("-o", "--out", type=Path, default=Path(__file__).with_name("interop.json"))
    a = ap.parse_args()
    mods = load(a.asn_dir)
    vectors = rc_vectors(compile_pair(mods["common"], mods["rc"]))
    vectors += kpm_vectors(compile_pair(mods["common"], mods["kpm2"]), "2.02")
    vectors += kpm_vectors(compile_pair(mods["common"], mods["kpm3"]), "3.00")
    a.out.write_text(json.dumps({"source": "asn1tools over the public O-RAN E2SM modules (see make_vectors.py)",
                                 "asn1tools": asn1tools.__version__, "vectors": vectors}, indent=1) + "\n")
    print(f"{len(vectors)} vectors -> {a.out}")


if __name__ == "__main__":
    main()
