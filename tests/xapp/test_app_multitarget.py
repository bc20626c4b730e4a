"""The xApp's path from the predictor's ranked candidates to Triggers at several targets (issue
45): the control loop maps the candidates' cells to agents (the serving cell's agent and cells
the proactive rules forbid left out), ``targets_k`` from A1 makes the engine prepare the second
target under the same epoch, the event log records each Trigger's rank, a handover to the
second target is a prepared commit, and a reply names the Trigger it answers by its target.

Composed as in live mode with a scripted predictor and a recording policy client, as in
test_app_knobs.py."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pallas_proto import pallas_pb2 as pb
from xapp.a1 import A1PolicyHandler, default_policy_type_path, load_policy_type
from xapp.app import PallasXapp
from xapp.config import load_controls
from xapp.policy import CallOutcome
from xapp.predict.base import Prediction
from xapp.predict.combined import Predictions
from xapp.tracks import MeasurementReport
from test_app_knobs import CELL_A, CELL_B, Recorder, Rts, _controls, _report, a1

CELL_C = 0xA81D0E01


class RankRecorder(Recorder):
    """Records (call, source, session, epoch, target, scheme, rank) of every order."""

    def send(self, a):
        self.calls.append((a.rpc, a.source, a.session_id, a.epoch, getattr(a, "target", None)
                           or getattr(a, "actual_target", None), getattr(a, "scheme", None),
                           getattr(a, "rank", None)))


class Candidates:
    """A predictor naming CELL_B 2 s ahead with ranked candidates ``cands``."""

    def __init__(self) -> None:
        self.cands: tuple[tuple[int, float], ...] = ((CELL_B, 0.5), (CELL_C, 0.4))

    def observe(self, r):
        pass

    def predict(self, track, now):
        return Prediction(CELL_B, now + 2.0, self.cands[0][1], "scripted", candidates=self.cands)


def controls(**scheduler):
    c = _controls()
    c["agents"]["edge-c"] = {"e2_node_id": "gnb_c", "control_address": "127.0.0.1:3", "peer_address": "c:1"}
    c["cells"][str(CELL_C)] = "edge-c"
    c["scheduler"].update(scheduler)
    return c


@pytest.fixture
def app():
    cfg = load_controls(controls())
    policy, predictor = RankRecorder(), Candidates()
    a1h = A1PolicyHandler(cfg, load_policy_type(default_policy_type_path(cfg.a1.policy_type_id)))
    x = PallasXapp(cfg, Rts(), policy=policy, telemetry=False, predictor=predictor, a1=a1h)
    now = time.time()
    x.tracks.add(MeasurementReport(now, "7", CELL_A, -80.0))
    x.control.on_report(MeasurementReport(now, "7", CELL_A, -80.0))
    for agent in ("edge-b", "edge-c"):
        x.on_telemetry(agent, _report(agent))
    x.on_telemetry("edge-a", _report("edge-a", [("s1", "7")]))
    x.calls, x.script, x.rts_out = policy.calls, predictor, x.transport.sent
    yield x
    x.stop()


def triggers(app):
    return [(c[4], c[6], c[3]) for c in app.calls if c[0] == "Trigger"]


def test_k1_prepares_the_most_likely_target_only(app):
    app.control_cycle()
    assert [t[:2] for t in triggers(app)] == [("edge-b", 0)]


def test_a1_targets_k_2_prepares_both_candidates_under_one_epoch(app):
    assert a1(app, {"targets_k": 2}) == "OK"
    assert app.engine.cfg.targets_k == 2
    app.control_cycle()
    (b, rb, eb), (c, rc, ec) = triggers(app)
    assert (b, rb, c, rc) == ("edge-b", 0, "edge-c", 1) and eb == ec
    ranks = [(e["target_agent"], e["rank"]) for e in app.events.events if e["kind"] == "trigger"]
    assert ranks == [("edge-b", 0), ("edge-c", 1)]
    # The UE goes to the second target: a prepared commit there.
    app.control.on_handover("7", CELL_A, CELL_C, app.control.now())
    commits = [c for c in app.calls if c[0] == "Commit"]
    assert [(c[4], c[3], c[5]) for c in commits] == [("edge-c", eb, pb.SCHEME_PALLAS)]
    ev = next(e for e in app.events.events if e["kind"] == "commit")
    assert ev["prepared"] is True and ev["window_s"] is not None


def test_a_refused_second_trigger_reaches_the_engine_as_that_target(app):
    assert a1(app, {"targets_k": 2}) == "OK"
    app.control_cycle()
    epoch = triggers(app)[0][2]
    no = pb.ControlReply(status=pb.STATUS_REJECTED, message="full")
    app.dispatcher.on_reply(CallOutcome("Trigger", "edge-a", "s1", epoch, no, target="edge-c"))
    sm = app.engine.session("s1")
    assert sm.target == "edge-b" and set(sm.prepared) == {"edge-b"}
    assert not [c for c in app.calls if c[0] == "Cancel"]          # the first target stays


def test_candidates_on_the_serving_agent_or_forbidden_cells_are_left_out(app):
    app.script.cands = ((CELL_B, 0.5), (CELL_A, 0.3), (CELL_C, 0.2))
    assert a1(app, {"targets_k": 2, "proactive": {"cells": {str(CELL_C): False}}}) == "OK"
    app.control_cycle()
    assert [t[:2] for t in triggers(app)] == [("edge-b", 0)]
    assert "7" not in app.engine._cands                # only the primary was left


class BatchCandidates:
    """A batch predictor (``update(store)``) with ranked candidates in arrays, as the combined
    predictor reports them: CELL_B 2 s ahead, then CELL_C, padded with -1."""

    def observe(self, r):
        pass

    def update(self, store):
        one = lambda v, dt=None: np.array([v], dtype=dt)  # noqa: E731
        return Predictions(one(True), one(CELL_B), one(-1), one(time.time() + 2.0), one(0.5), one(0, np.int16),
                           one(CELL_A), ue_ids=["7"], flips=one(0),
                           cand_cell=np.array([[CELL_B, CELL_C, -1]]), cand_p=np.array([[0.5, 0.4, 0.0]]))


def test_a_batch_predictors_candidate_arrays_reach_the_engine(app):
    app.control.predictor = BatchCandidates()
    assert a1(app, {"targets_k": 2}) == "OK"
    app.control_cycle()
    assert [t[:2] for t in triggers(app)] == [("edge-b", 0), ("edge-c", 1)]


class OwnCellFirst:
    """A predictor naming a cell of the serving agent first (CELL_A, p 0.6), then CELL_C."""

    def observe(self, r):
        pass

    def predict(self, track, now):
        return Prediction(CELL_A, now + 2.0, 0.6, "scripted", candidates=((CELL_A, 0.6), (CELL_C, 0.3)))


@pytest.mark.parametrize("k", [1, 2])
def test_a_serving_agent_cell_first_prepares_the_next_candidate_with_k2(app, k):
    app.control.predictor = OwnCellFirst()
    assert a1(app, {"targets_k": k}) == "OK"
    app.control_cycle()
    assert [t[:2] for t in triggers(app)] == ([] if k == 1 else [("edge-c", 0)])
    app.control.on_handover("7", CELL_A, CELL_C, app.control.now())
    ev = next(e for e in app.events.events if e["kind"] == "commit")
    assert ev["prepared"] is (k == 2) and ev["target_agent"] == "edge-c"
