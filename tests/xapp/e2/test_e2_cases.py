"""Field cases (../shared/cases/e2/, README "e2/"): RIC_INDICATION payloads of the kinds real E2
nodes send, read from the shared folder at test time, each through the xApp's whole ingest."""

import math
from pathlib import Path

import pytest

from xapp.e2 import rrc, sm_kpm, sm_rc
from xapp.e2.e2ap import decode_ric_indication
from xapp.e2.ingest import IngestConfig, Ingestor
from xapp.tracks import TrackStore

CASES = Path(__file__).resolve().parents[3].parent / "shared" / "cases" / "e2"


def case(name: str) -> bytes:
    p = CASES / name
    if not p.exists():
        pytest.skip(f"field case {p} not present")
    return bytes.fromhex(p.read_text().strip())


def test_rc_header_format3_ue_id_from_header():
    """Family: E2SM-RC v03.00+ UE-level REPORT headers (Format 3, an extension addition)."""
    ind = decode_ric_indication(case("rc-indication-header-format3.hex"))
    h = sm_rc.decode_rc_header(ind.header)
    assert (h.format, h.condition_id, h.ue.key) == (3, 1, "7")
    ing = Ingestor(TrackStore())
    reps = ing.on_indication(case("rc-indication-header-format3.hex"), "gnb", t=5.0)
    assert [(r.ue_id, r.serving_cell, r.serving_pci, r.rsrp_dbm, r.rsrq_db, r.sinr_db) for r in reps] == [
        ("7", 41959425, 11, -96.0, -18.0, 12.0)]
    assert ing.stats["rs:ssb"] == 1 and not any(k.startswith("dropped:") for k in ing.stats)


def test_rc_header_format2_ue_id_and_insert_fields():
    """Family: E2SM-RC v01.03+ header Format 2 (UE ID + INSERT style / indication id)."""
    ind = decode_ric_indication(case("rc-indication-header-format2.hex"))
    h = sm_rc.decode_rc_header(ind.header)
    assert (h.format, h.ue.key, h.insert_style, h.insert_indication_id, h.condition_id) == (2, "7", 3, 1, None)
    ing = Ingestor(TrackStore())
    reps = ing.on_indication(case("rc-indication-header-format2.hex"), "gnb", t=5.0)
    assert [(r.ue_id, r.serving_pci, r.rsrp_dbm) for r in reps] == [("7", 11, -96.0)]


def test_kpm_format3_one_measdata_item_per_granularity_period():
    """Family: KPM Format 3 with several measData items per UE (one per granularity period),
    noValue records for a UE that matched only later: every UE out with its latest values."""
    ind = decode_ric_indication(case("kpm-f3-measdata-per-granularity-period.hex"))
    k = sm_kpm.decode_kpm_indication(ind.header, ind.message)
    assert [(r.ue.key, len(r.periods), r.granularity_ms) for r in k.ue_reports] == [
        ("7", 2, 100), ("8", 2, 100), ("9", 1, 200)]
    assert k.ue_reports[1].periods[0] == ()  # UE 8: noValue in the first period, skipped
    assert k.ue_reports[0].periods[0] == (("L1M.SS-RSRP", -96.0), ("L1M.SS-RSRQ", -11.0), ("L1M.SS-SINR", 12.0))
    ing = Ingestor(TrackStore())
    reps = ing.on_indication(case("kpm-f3-measdata-per-granularity-period.hex"), "gnb", t=5.0)
    assert [(r.ue_id, r.rsrp_dbm, r.rsrq_db, r.sinr_db) for r in reps] == [
        ("7", -95.0, -11.0, 13.0), ("8", -101.0, -14.0, 3.0), ("9", -95.0, -11.0, 13.0)]
    assert not any(k.startswith("dropped:") for k in ing.stats)
    assert ing.stats["unused:earlier granularity periods"] == 2


def test_rc_measreport_csi_rs_only_with_beams():
    """Family: MeasurementReports measured on CSI-RS only, with per-beam results: the CSI-RS
    cell values are used (labelled), every value left out has a counted reason."""
    ind = decode_ric_indication(case("rc-measreport-csirs-only-with-beams.hex"))
    copy = sm_rc.decode_rc_message_copy(ind.header, ind.message)
    m = rrc.decode_rrc_meas_report(copy.rrc)
    assert m == rrc.decode_rrc_meas_report_pycrate(copy.rrc) or repr(m) == repr(rrc.decode_rrc_meas_report_pycrate(copy.rrc))
    pcell = m.serving[0].cell
    assert not pcell.has_ssb and (pcell.csi_rsrp_dbm, pcell.csi_rsrq_db, pcell.csi_sinr_db) == (-96.0, -18.0, 12.0)
    assert [(b.rs, b.index, b.rsrp_dbm) for b in pcell.beams] == [("ssb", 63, -96.0), ("csi-rs", 95, -96.0)]
    ing = Ingestor(TrackStore())
    reps = ing.on_indication(case("rc-measreport-csirs-only-with-beams.hex"), "gnb", t=5.0)
    assert len(reps) == 1
    r = reps[0]
    assert (r.ue_id, r.serving_pci, r.rsrp_dbm, r.rsrq_db, r.sinr_db) == ("7", 11, -96.0, -18.0, 12.0)
    assert [(n.pci, n.rsrp_dbm) for n in r.neighbours] == [(13, -95.0)] and math.isnan(r.neighbours[0].rsrq_db)
    assert ing.stats["rs:csi-rs"] == 1
    assert ing.stats["unused:per-beam results"] == 1


def test_pinned_kpm_version_reads_v2_header():
    """A node pinned (or declared) to KPM v02.0x: the 4-octet colletStartTime of v02 is read; the
    same bytes under v03.00's types are a drop naming the version."""
    from pallas_tools import tracegen
    from xapp.e2.ie import Guami, UeId
    from xapp.e2.e2ap import RicIndication
    u = UeId(kind="gNB", amf_ue_ngap_id=4, guami=Guami())
    h, m = tracegen.encode_kpm_indication(sm_kpm.KpmIndication(
        1_700_000_000.0, (sm_kpm.KpmUeReport(u, (("L1M.SS-RSRP", -90.0),)),)), version="2.03")
    pdu = tracegen.encode_ric_indication(RicIndication(1, 2, 2, 1, h, m, sn=1))
    ing = Ingestor(TrackStore(), IngestConfig(sm_versions={"gnb-a": {"kpm": "2.03"}}))
    assert [(r.ue_id, r.rsrp_dbm) for r in ing.on_indication(pdu, "gnb-a", t=1.0)] == [("4", -90.0)]
    assert ing.on_indication(pdu, "gnb-b", t=1.0) == []
    assert ing.stats["dropped:E2SM-KPM"] == 1
    # declared through the RAN function OID (E2 manager's nodeb record): v2 arc
    assert ing.declare_ran_function("gnb-b", 2, "1.3.6.1.4.1.53148.1.2.2.2") == ("kpm", "2.03")
    assert [r.ue_id for r in ing.on_indication(pdu, "gnb-b", t=2.0)] == ["4"]


def test_declared_versions_from_the_e2_managers_nodeb_record():
    """The version each E2 node declared for its RAN functions, from e2mgr's REST JSON or the
    R-NIB protobuf: the RAN function OID, else the E2SM OID inside the definition."""
    from ricxappframe.entities.rnib.nodeb_info_pb2 import NodebInfo
    from xapp.e2.ingest import versions_from_nodeb
    oid_in_def = b"\x00\x20ORAN-E2SM-KPM\x00\x181.3.6.1.4.1.53148.1.2.2.2\x00".hex()
    rest = {"ranName": "gnb_001_01_00000001", "gnb": {"ranFunctions": [
        {"ranFunctionId": 2, "ranFunctionOid": "1.3.6.1.4.1.53148.1.3.2.2", "ranFunctionRevision": 1},
        {"ranFunctionId": 3, "ranFunctionOid": "1.3.6.1.4.1.53148.1.1.2.3"},
        {"ranFunctionId": 4, "ranFunctionOid": "", "ranFunctionDefinition": oid_in_def},
        {"ranFunctionId": 5, "ranFunctionOid": "1.3.6.1.4.1.53148.1.1.2.99"}]}}
    assert versions_from_nodeb(rest) == {2: ("kpm", "3.00"), 3: ("rc", "1.03"), 4: ("kpm", "2.03")}
    nb = NodebInfo()
    f = nb.gnb.ran_functions.add()
    f.ran_function_id, f.ran_function_oid = 2, "1.3.6.1.4.1.53148.1.2.2.2"
    assert versions_from_nodeb(nb) == {2: ("kpm", "2.03")}
    ing = Ingestor(TrackStore())
    assert ing.declare_nodeb("gnb-x", nb) == {2: ("kpm", "2.03")} and ing.declared[("gnb-x", 2)] == "2.03"


def test_descriptor_pins_sm_versions():
    """controls.e2.sm_versions (schema, config, app) reaches the ingest; a typo is refused."""
    import copy
    import json as _json

    from xapp.app import PallasXapp
    from xapp.config import ConfigError, load_controls
    desc = Path(__file__).resolve().parents[3] / "descriptors" / "config-file.json"
    c = copy.deepcopy(_json.loads(desc.read_text())["controls"])
    assert c["e2"]["sm_versions"] == {}
    c["e2"]["sm_versions"] = {"gnb_001_01_00000001": {"kpm": "2.03"}, "*": {"rc": "3.00"}}
    cfg = load_controls(c)
    assert cfg.e2.sm_versions["gnb_001_01_00000001"] == {"kpm": "2.03"}
    assert PallasXapp._ingest_config(cfg).sm_versions == {"gnb_001_01_00000001": {"kpm": "2.03"}, "*": {"rc": "3.00"}}
    c["e2"]["sm_versions"] = {"gnb": {"kpm": "9.9"}}
    with pytest.raises(ConfigError):
        load_controls(c)
