"""The xApp learns its network from an E2 trace of earlier traffic (``association_map.path``
pointing at a ``.e2trace``), as the replay's generated drive gives it (``--history-drives``)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from xapp.e2.ingest import decode_trace
from xapp.predict import HandoverPredictor, Knowledge, PredictorConfig, knowledge_from_drives_at

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from pallas_eval.prepare import HISTORY_UE_BASE, generate
    out = tmp_path_factory.mktemp("gen")
    trace, nrt, hist = generate(out, seed=2, ues=3, duration_s=60.0, speed_mps=16.0, rows=2, cols=2,
                                history_drives=4)
    return trace, nrt, hist, HISTORY_UE_BASE


def test_history_trace_is_other_ues_before_the_drive(generated):
    trace, _, hist, base = generated
    drive, _ = decode_trace(str(trace))
    past, _ = decode_trace(str(hist))
    assert past and drive
    assert max(r.time for _, r in past) < min(r.time for _, r in drive)
    assert not {r.ue_id for _, r in past} & {r.ue_id for _, r in drive}
    assert len({r.ue_id for _, r in past}) == 4


def test_knowledge_from_a_trace_learns_what_online_learning_would(generated):
    _, _, hist, _ = generated
    k = knowledge_from_drives_at(hist)
    reports, _ = decode_trace(str(hist))
    # the handovers of the trace, per UE in time order
    last, hos = {}, []
    for _, r in sorted(reports, key=lambda x: x[1].time):
        if r.ue_id in last and last[r.ue_id] != r.serving_cell:
            hos.append((last[r.ue_id], r.serving_cell))
        last[r.ue_id] = r.serving_cell
    assert len(hos) >= 10
    online = Knowledge.create()
    for _, r in sorted(reports, key=lambda x: x[1].time):
        online.observe(r)
    n_places = sum(len(v) for v in k.places.events.values())
    assert len(hos) - 5 <= n_places == sum(len(v) for v in online.places.events.values())
    assert len(k.assoc) == len(online.assoc) > 100
    assert k.ues == 0 and online.ues > 0           # the history's UEs hold no online state
    a, b = hos[0]
    assert k.trans.probs(a) == online.trans.probs(a) and k.trans.probs(a).get(b, 0.0) > 0


def test_a_predictor_that_learned_the_network_names_targets_earlier(generated):
    """The replayed UEs' handovers: with the history, the reported target is right 1 s ahead for
    most of them; without it (online learning from the drive alone) for far fewer."""
    trace, nrt, hist, _ = generated
    reports, _ = decode_trace(str(trace))

    def right_1s_ahead(knowledge) -> float:
        from xapp.tracks import UETrack
        p = HandoverPredictor(PredictorConfig(min_confidence=0.5), knowledge=knowledge)
        for pci, cell in nrt.items():
            p.knowledge.nrt.add_serving(pci, cell)
        tracks, seen = {}, {}
        for _, r in sorted(reports, key=lambda x: x[1].time):
            tr = tracks.setdefault(r.ue_id, UETrack(r.ue_id, capacity=32, max_neighbours=16))
            tr.append(r)
            p.observe(r)
            pr = p.predict(tr, r.time)
            seen.setdefault(r.ue_id, []).append((r.time, r.serving_cell, pr.target_cell if pr else -1))
        hits = n = 0
        for rows in seen.values():
            for i in range(1, len(rows)):
                t, cell, _ = rows[i]
                if cell != rows[i - 1][1]:
                    n += 1
                    before = [x for x in rows[:i] if x[0] <= t - 1.0]
                    hits += bool(before) and before[-1][2] == cell and before[-1][1] == rows[i - 1][1]
        return hits / n

    with_history = right_1s_ahead(knowledge_from_drives_at(hist))
    cold = right_1s_ahead(None)
    assert with_history >= 0.7 and with_history > cold + 0.2, (with_history, cold)


def test_the_xapp_learns_from_the_history_trace_at_start(generated):
    from xapp.app import PallasXapp
    from xapp.config import from_descriptor
    _, _, hist, _ = generated
    cfg = from_descriptor(json.loads((REPO / "descriptors" / "config-file.json").read_text()))
    p = PallasXapp._build_predictor(dataclasses.replace(cfg, association_map_path=str(hist)), None)
    assert len(p.knowledge.assoc) == len(knowledge_from_drives_at(hist).assoc) > 0


def test_a_trace_without_reports_is_a_clear_error(tmp_path):
    from xapp.e2.trace import TraceWriter
    empty = tmp_path / "empty.e2trace"
    with TraceWriter(str(empty)):
        pass
    with pytest.raises(ValueError, match="no decodable RIC_INDICATION"):
        knowledge_from_drives_at(empty)
