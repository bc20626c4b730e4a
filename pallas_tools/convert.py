"""Drive-test CSVs (G-NetTrack Pro layout, ``shared/data/ucc-5g/**.csv``) -> E2 traces.

``python -m pallas_tools.convert CSV_OR_DIR [...] -o OUT_DIR [--plmn 00101]`` writes one trace per
CSV (``OUT_DIR/<csv stem>.e2trace``) and prints a JSON summary (UEs, reports, handovers).

Each CSV is one UE; each row becomes what a gNB would send the RIC for it: an E2AP
RICindication (RAN function 3, E2SM-RC REPORT Style 1 message copy) carrying an NR RRC
MeasurementReport, sent by the serving cell's E2 node:

- serving cell: the row's cell identity (``RAWCELLID``: the LTE ECI = eNB id * 256 + cell, or
  the UMTS cell id) taken as the 36-bit NR cell identity with a 28-bit gNB ID, so the gNB ID
  is ``cell >> 8`` (the eNB id for LTE rows) and the local cell id ``cell & 0xFF``; it travels as
  RAN parameter 6 (NR CGI, PLMN ``--plmn``, default the test network 001/01);
- E2 node: ``gnb_<mcc>_<mnc>_<gNB ID as 8 hex digits>`` of that gNB (trace record field);
- UE: gNB-UEID with AMF UE NGAP ID = ``--first-ue`` + the file's index (sorted order), GUAMI
  of the same PLMN; the AMF UE NGAP ID stays the same across handovers, as in NG-RAN;
- serving RSRP/RSRQ/SNR as the PCell's SSB RSRP/RSRQ/SINR (TS 38.133 indices; serving PCI is
  not logged by the app so physCellId is absent); the NR neighbour value (``NRxRSRP``/
  ``NRxRSRQ``) as one measResultListNR entry without physCellId (the log has no identity);
- position as locationInfo-r16 (TS 37.355 ellipsoid point) and speed with heading as its
  horizontal velocity (written only once a heading is known: bearing from the previous fix);
- record time = the row time; a change of serving cell between consecutive rows is a handover.

What a MeasurementReport cannot carry is lost: rows in RRC idle (State I) are still written as
reports (a real idle UE sends none), so decoded reports have ``connected=True``; the RRC
quantisation (1 dB RSRP, 0.5 dB RSRQ/SINR, ~1 m position, whole km/h and degrees) applies.

The CSVs are read by ``xapp.drivetest.read_drive`` (serving cell RAWCELLID, values outside the
TS 38.133 ranges as NaN, monotone times, heading from the previous fix); the core
(:func:`reports_to_records`) works on any MeasurementReport list (the simulator uses it too).
The handover count printed is ``read_drive``'s (every change of RAWCELLID between rows).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from pallas_tools.tracegen import encode_rc_message_copy, encode_ric_indication, encode_rrc_meas_report
from xapp.e2.e2ap import RicIndication
from xapp.e2.ie import Cgi, Guami, UeId, e2_node_name
from xapp.e2.rrc import CellResult, RrcMeasReport, ServingResult
from xapp.e2.sm_rc import RcMessageCopy
from xapp.drivetest import read_drive
from xapp.e2.trace import TraceRecord, TraceWriter
from xapp.e2.transport import RIC_INDICATION
from xapp.tracks import MeasurementReport


@dataclass(frozen=True)
class ConvertConfig:
    """Identities written into the traces. ``gnb_id_bits`` is the gNB ID length of the NR cell
    identity (28: gNB ID = cell >> 8)."""

    plmn: str = "00101"
    first_ue: int = 1
    ran_function_id: int = 3
    ric_requestor_id: int = 1
    ric_instance_id: int = 1
    action_id: int = 1
    meas_id: int = 1
    gnb_id_bits: int = 28


def gnb_of_cell(cell: int, cfg: ConvertConfig = ConvertConfig()) -> int:
    """gNB ID of a 36-bit NR cell identity."""
    return cell >> (36 - cfg.gnb_id_bits)


def ue_identity(index: int, cfg: ConvertConfig = ConvertConfig()) -> UeId:
    """The UEID written for the UE of file number ``index``."""
    return UeId(kind="gNB", amf_ue_ngap_id=cfg.first_ue + index, guami=Guami(plmn=cfg.plmn))


def report_to_record(r: MeasurementReport, ue: UeId, sn: int, cfg: ConvertConfig) -> TraceRecord:
    """One MeasurementReport -> the RIC_INDICATION record its serving E2 node would send."""
    if not 0 <= r.serving_cell < (1 << 36):
        raise ValueError(f"serving cell {r.serving_cell} is not a 36-bit cell identity")
    nbs = tuple(CellResult(n.pci if 0 <= n.pci <= 1007 else -1, n.rsrp_dbm, n.rsrq_db, n.sinr_db)
                for n in r.neighbours if n.rsrp_dbm == n.rsrp_dbm or n.rsrq_db == n.rsrq_db or n.sinr_db == n.sinr_db)
    pci = r.serving_pci if 0 <= r.serving_pci <= 1007 else -1
    rrc = RrcMeasReport(
        cfg.meas_id, (ServingResult(0, CellResult(pci, r.rsrp_dbm, r.rsrq_db, r.sinr_db)),),
        nbs[:8], r.lat, r.lon, r.speed_mps, r.heading_deg)
    header, message = encode_rc_message_copy(RcMessageCopy(
        encode_rrc_meas_report(rrc), ue, Cgi(cfg.plmn, r.serving_cell, "nr")))
    payload = encode_ric_indication(RicIndication(
        cfg.ric_requestor_id, cfg.ric_instance_id, cfg.ran_function_id, cfg.action_id, header, message,
        sn=sn % 65536))
    node = e2_node_name(cfg.plmn, gnb_of_cell(r.serving_cell, cfg))
    return TraceRecord(r.time, node, RIC_INDICATION, payload, cfg.ric_instance_id)


def reports_to_records(reports: Sequence[MeasurementReport], index: int,
                       cfg: ConvertConfig = ConvertConfig()) -> Iterator[TraceRecord]:
    """A UE's reports (time order) -> its trace records, one RIC_INDICATION each."""
    ue = ue_identity(index, cfg)
    for i, r in enumerate(reports):
        yield report_to_record(r, ue, i, cfg)


def count_handovers(cells: Sequence[int]) -> int:
    """Changes of serving cell between consecutive reports."""
    return sum(1 for a, b in zip(cells, cells[1:]) if a != b)


# ------------------------------------------------------------------------------------------------
# CSV reading: xapp.drivetest (one reader of the drive CSVs for the whole project)
# ------------------------------------------------------------------------------------------------

def read_reports(path: Path, ue_id: str) -> tuple[list[MeasurementReport], int]:
    """A drive CSV -> (its MeasurementReports, its handovers) via ``xapp.drivetest.read_drive``."""
    d = read_drive(path, ue_id=ue_id)
    return list(d.reports), len(d.handovers)


def csv_files(inputs: Sequence[str | Path]) -> list[Path]:
    """CSV files named or under the named folders, sorted (the order fixes the UE numbering)."""
    files: list[Path] = []
    for p in map(Path, inputs):
        files += sorted(p.rglob("*.csv")) if p.is_dir() else [p]
    return sorted(set(files))


@dataclass(frozen=True)
class Converted:
    """One converted drive: source CSV, trace path, UE key, reports and handovers written."""

    csv: str
    trace: str
    ue: str
    reports: int
    handovers: int


def convert_file(path: Path, out_dir: Path, index: int, cfg: ConvertConfig = ConvertConfig()) -> Converted:
    """Convert one CSV (UE number ``index``) to ``out_dir/<stem>.e2trace``."""
    ue = ue_identity(index, cfg)
    reports, handovers = read_reports(path, ue.key)
    out = out_dir / f"{path.parent.name}_{path.stem}.e2trace"
    with TraceWriter(str(out)) as w:
        for rec in reports_to_records(reports, index, cfg):
            w.write(rec)
    return Converted(str(path), str(out), ue.key, len(reports), handovers)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pallas_tools.convert``: drive CSVs -> one .e2trace per UE; prints one JSON line
    per file (UE, reports, handovers, trace path) and a total line. Returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m pallas_tools.convert", description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", help="drive CSV files or folders searched for *.csv")
    ap.add_argument("-o", "--out", required=True, help="output folder for the .e2trace files")
    ap.add_argument("--plmn", default="00101", help="PLMN (MCC+MNC digits) of cells and UEs")
    ap.add_argument("--first-ue", type=int, default=1, help="AMF UE NGAP ID of the first file's UE")
    a = ap.parse_args(argv)
    cfg = ConvertConfig(plmn=a.plmn, first_ue=a.first_ue)
    files = csv_files(a.inputs)
    if not files:
        print("no CSV files found", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    done = [convert_file(f, out, i, cfg) for i, f in enumerate(files)]
    for c in done:
        print(json.dumps(c.__dict__))
    print(json.dumps({"ues": len(done), "reports": sum(c.reports for c in done),
                      "handovers": sum(c.handovers for c in done)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
