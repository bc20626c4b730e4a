"""Drive-test CSV -> E2 trace converter; on all of shared/data/ucc-5g (slow) and on hand-made reports."""

import json
import math
from pathlib import Path

import pytest

from xapp.e2.ie import e2_node_name
from pallas_tools import convert
from xapp.e2 import units
from xapp.e2.ingest import IngestConfig, decode_indication
from xapp.e2.trace import read_trace
from xapp.tracks import MeasurementReport, NeighbourMeas

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "ucc-5g"


def _same(a: float, b: float, tol: float = 0.0) -> bool:
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol


def check_decoded(src: MeasurementReport, dec: MeasurementReport, cfg: convert.ConvertConfig) -> None:
    """The decode of a converted report gives back the source's cell and values (at the
    resolution of the RRC/LPP encodings)."""
    assert dec.time == src.time and dec.serving_cell == src.serving_cell
    assert dec.e2_node == e2_node_name(cfg.plmn, convert.gnb_of_cell(src.serving_cell, cfg))
    assert _same(dec.rsrp_dbm, units.quantise_rsrp(src.rsrp_dbm))
    assert _same(dec.rsrq_db, units.quantise_rsrq(src.rsrq_db))
    assert _same(dec.sinr_db, units.quantise_sinr(src.sinr_db))
    src_nb = [n for n in src.neighbours if not (math.isnan(n.rsrp_dbm) and math.isnan(n.rsrq_db) and math.isnan(n.sinr_db))]
    assert len(dec.neighbours) == len(src_nb)
    for d, s in zip(dec.neighbours, src_nb):
        assert _same(d.rsrp_dbm, units.quantise_rsrp(s.rsrp_dbm)) and _same(d.rsrq_db, units.quantise_rsrq(s.rsrq_db))
    assert _same(dec.lat, src.lat, 0.6e-5) and _same(dec.lon, src.lon, 1.1e-5)
    if math.isnan(src.heading_deg) or math.isnan(src.speed_mps):
        assert math.isnan(dec.speed_mps)
    else:
        assert dec.speed_mps == units.kmh_to_speed(units.speed_to_kmh(src.speed_mps))
        assert dec.heading_deg == units.heading_to_bearing(src.heading_deg)


def test_converter_core_on_hand_made_reports():
    cfg = convert.ConvertConfig()
    src = [MeasurementReport(10.0, "x", 0xA81B0C, -99.0, -15.0, 6.4, (NeighbourMeas(rsrp_dbm=-101.0, rsrq_db=-16.5),),
                             lat=51.9, lon=-8.4, speed_mps=12.0, heading_deg=181.2),
           MeasurementReport(11.0, "x", 0xA81B0D, -200.0, math.nan, 60.0),  # out of range, missing
           MeasurementReport(11.0, "x", 0x3, -80.0, -9.0, 20.0, (NeighbourMeas(),))]
    recs = list(convert.reports_to_records(src, 4, cfg))
    assert [r.e2_node for r in recs] == ["gnb_001_01_0000a81b", "gnb_001_01_0000a81b", "gnb_001_01_00000000"]
    assert convert.count_handovers([r.serving_cell for r in src]) == 2
    for s, rec in zip(src, recs):
        d = decode_indication(rec.payload, rec.e2_node, rec.time, IngestConfig())
        (dec,) = d.reports
        assert dec.ue_id == "5"  # first_ue 1 + index 4
        check_decoded(s, dec, cfg)
    d1 = decode_indication(recs[1].payload, "", 0.0, IngestConfig()).reports[0]
    assert d1.rsrp_dbm == -156.0 and d1.sinr_db == 40.5  # clamped to the TS 38.133 range edges


@pytest.mark.slow
@pytest.mark.skipif(not DATA.is_dir(), reason="shared/data/ucc-5g not present")
def test_convert_all_ucc_drives_and_decode_back(tmp_path, capsys):
    assert convert.main([str(DATA), "-o", str(tmp_path)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    per_file, total = lines[:-1], lines[-1]
    files = convert.csv_files([DATA])
    assert total["ues"] == len(files) == len(per_file) == 39
    assert total["reports"] == sum(c["reports"] for c in per_file) > 60_000
    assert total["handovers"] == sum(c["handovers"] for c in per_file) > 1_000
    assert len({c["ue"] for c in per_file}) == 39
    cfg = convert.ConvertConfig()
    n = ho = 0
    for i, (c, f) in enumerate(zip(per_file, files)):
        src, n_ho = convert.read_reports(f, c["ue"])
        assert n_ho == c["handovers"]
        recs = list(read_trace(c["trace"]))
        assert len(recs) == len(src) == c["reports"]
        cells = []
        for s, rec in zip(src, recs):
            (dec,) = decode_indication(rec.payload, rec.e2_node, rec.time, IngestConfig()).reports
            assert dec.ue_id == c["ue"] == str(cfg.first_ue + i)
            check_decoded(s, dec, cfg)
            cells.append(dec.serving_cell)
        n += len(recs)
        ho += convert.count_handovers(cells)
    assert (n, ho) == (total["reports"], total["handovers"])  # HOs in the decoded traces == the reader's
    print(f"converted {total['ues']} UEs, {n} reports, {ho} handovers")
