"""E2 decode throughput and memory per tracked UE.

    .venv/xapp/bin/python benchmarks/e2_decode.py [--n 20000] [--ues 1000] [--capacity 256]

Prints, for one core (the process is pinned to one CPU; rates are per second of CPU time, so
other processes on a shared machine do not distort them; wall times are printed too):
- RC message copies (E2AP RICindication + E2SM-RC REPORT Style 1 + NR RRC MeasurementReport
  with serving/neighbour results and locationInfo-r16) decoded into MeasurementReports per
  second: through the fast walkers (the xApp's path), through pycrate/asn1tools only (the
  reference path), and the full ingest into UE tracks;
- E2SM-KPM Format 3 indications (10 UEs x 3 measurements x 2 granularity periods each) decoded
  per second, through the Format 3 walker (the xApp's path) and through asn1tools only;
- memory per tracked UE: the track arrays (UETrack.nbytes) and the Python heap growth per UE
  of a TrackStore holding ``--ues`` full tracks (tracemalloc), at ``--capacity`` reports and
  8 neighbours per report.
Targets: >= 5,000 RC message copies per second on one core (issue 4); >= 5,000 KPM UE reports
per second (issue 15).
"""

from __future__ import annotations

import argparse
import os
import random
import time
import tracemalloc

from pallas_tools.tracegen import (encode_kpm_indication, encode_rc_message_copy, encode_ric_indication,
                                   encode_rrc_meas_report)
from xapp.e2.e2ap import RicIndication, decode_e2ap_pycrate
from xapp.e2.ie import Cgi, Guami, UeId, cgi_from_asn, e2sm_spec, ueid_from_asn
from xapp.e2.rrc import CellResult, RrcMeasReport, ServingResult, decode_rrc_meas_report_pycrate
from xapp.e2.sm_kpm import KpmIndication, KpmUeReport
from xapp.e2.sm_rc import RC_PARAM_RRC_MESSAGE, RcMessageCopy
from xapp.e2 import sm_kpm, sm_rc
from xapp.e2.ingest import IngestConfig, Ingestor, decode_indication, report_from_rc
from xapp.tracks import MeasurementReport, NeighbourMeas, TrackStore


def make_rc(rng: random.Random, n: int, ues: int) -> list[bytes]:
    out = []
    for i in range(n):
        u = UeId(kind="gNB", amf_ue_ngap_id=1 + i % ues, guami=Guami())
        nbs = tuple(CellResult(rng.randrange(1008), float(rng.randrange(-130, -60)), rng.randrange(-40, -6) / 2,
                               rng.randrange(-10, 60) / 2) for _ in range(rng.randrange(1, 5)))
        r = RrcMeasReport(1, (ServingResult(0, CellResult(rng.randrange(1008), float(rng.randrange(-130, -60)),
                                                          rng.randrange(-40, -6) / 2, rng.randrange(-10, 60) / 2)),),
                          nbs, 51.9 + rng.uniform(-0.1, 0.1), -8.4 + rng.uniform(-0.1, 0.1),
                          rng.uniform(0, 30), rng.uniform(0, 360))
        h, m = encode_rc_message_copy(RcMessageCopy(encode_rrc_meas_report(r), u,
                                                    Cgi("00101", rng.randrange(1 << 28))))
        out.append(encode_ric_indication(RicIndication(1, 1, 3, 1, h, m, sn=i % 65536)))
    return out


def make_kpm(rng: random.Random, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        reps = tuple(KpmUeReport(UeId(kind="gNB", amf_ue_ngap_id=1 + (10 * i + j) % 1000, guami=Guami()),
                                 (("L1M.SS-RSRP", float(rng.randrange(-130, -60))), ("L1M.SS-RSRQ", -10.5),
                                  ("L1M.SS-SINR", rng.randrange(0, 30))), 100,
                                 ((("L1M.SS-RSRP", float(rng.randrange(-130, -60))), ("L1M.SS-SINR", 3)),
                                  (("L1M.SS-RSRP", float(rng.randrange(-130, -60))), ("L1M.SS-RSRQ", -10.5),
                                   ("L1M.SS-SINR", rng.randrange(0, 30)))))
                     for j in range(10))
        h, m = encode_kpm_indication(KpmIndication(1_700_000_000.0 + i, reps))
        out.append(encode_ric_indication(RicIndication(1, 2, 2, 1, h, m, sn=i % 65536)))
    return out


def rate(fn, items) -> float:
    """Items per second of this process's CPU time (time.process_time): the rate one core
    sustains, independent of other processes sharing the machine. Wall-clock rate also printed."""
    w0, c0 = time.perf_counter(), time.process_time()
    for x in items:
        fn(x)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    print(f"  [{len(items)} items: {cpu:.2f} s CPU, {wall:.2f} s wall]")
    return len(items) / cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--ues", type=int, default=1000)
    ap.add_argument("--capacity", type=int, default=256)
    a = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    rng = random.Random(1)
    rc = make_rc(rng, a.n, a.ues)
    cfg = IngestConfig()
    for b in rc[:200]:  # warm the compiled specs and caches
        decode_indication(b, "gnb", 0.0, cfg)

    fast = rate(lambda b: decode_indication(b, "gnb", 0.0, cfg), rc)

    def reference(b: bytes) -> MeasurementReport:
        ind = decode_e2ap_pycrate(b)
        params = sm_rc.rc_params_asn1tools(ind.message)
        copy = RcMessageCopy(params[RC_PARAM_RRC_MESSAGE], ueid_from_asn(e2sm_spec().decode("UEID", params[4])),
                             cgi_from_asn(e2sm_spec().decode("CGI", params[6])))
        return report_from_rc(copy, decode_rrc_meas_report_pycrate(copy.rrc), 0.0, "gnb")[0]

    reference(rc[0])  # compile the reference's specs outside the timed loop
    ref = rate(reference, rc[:1000])
    store = TrackStore(capacity=a.capacity)
    ing = Ingestor(store)
    t = [0.0]

    def ingest(b: bytes) -> None:
        t[0] += 0.001
        ing.on_indication(b, "gnb", t[0])

    full = rate(ingest, rc)
    kpm = make_kpm(rng, 2000)
    kpm_rate = rate(lambda b: decode_indication(b, "gnb", 0.0, cfg), kpm)

    def kpm_reference(b: bytes) -> object:
        ind = decode_e2ap_pycrate(b)
        return sm_kpm.decode_kpm_indication_asn1tools(ind.header, ind.message)

    kpm_reference(kpm[0])
    kpm_ref = rate(kpm_reference, kpm[:300])

    print(f"RC message copies, fast path (decode to MeasurementReport): {fast:8.0f} /s on one core "
          f"({1e6 / fast:.0f} us each; target >= 5000 /s)")
    print(f"RC message copies, pycrate/asn1tools reference path:        {ref:8.0f} /s ({1e6 / ref:.0f} us each)")
    print(f"RC message copies, decode + append to UE tracks:            {full:8.0f} /s ({ing.stats['reports']} reports, "
          f"{len(store)} UEs)")
    print(f"KPM Format 3 indications (10 UEs x 3 meas. x 2 periods):    {kpm_rate:8.0f} /s "
          f"({10 * kpm_rate:.0f} UE reports /s; target >= 5000 UE reports /s)")
    print(f"KPM Format 3, asn1tools/pycrate reference path:              {kpm_ref:8.0f} /s "
          f"({10 * kpm_ref:.0f} UE reports /s)")

    # memory per tracked UE
    nb = tuple(NeighbourMeas(pci=i, rsrp_dbm=-100.0) for i in range(8))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    s2 = TrackStore(capacity=a.capacity, max_ues=a.ues + 1)
    for i in range(a.capacity):
        for u in range(a.ues):
            s2.add(MeasurementReport(float(i), str(u), 1, -90.0, -10.0, 5.0, nb, 3, 51.9, -8.4, 10.0, 90.0))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    arrays = next(iter(s2)).nbytes
    print(f"memory per tracked UE ({a.capacity} reports x 8 neighbours): arrays {arrays / 1024:.1f} KiB, "
          f"Python heap {(after - before) / a.ues / 1024:.1f} KiB (tracemalloc, {a.ues} UEs)")


if __name__ == "__main__":
    main()
