"""The xApp killed mid-migration and restarted on the same SDL (issue 16, "the restart test").

``pallas-xapp --mode test --store sdl`` runs as a subprocess against a private redis-server
(reached through ``DBAAS_SERVICE_HOST`` / ``DBAAS_SERVICE_PORT``, as in a RIC) and two fake
agents at the gRPC boundary (recording Control servicers on loopback that keep what each
Trigger prepared until a Cancel or Commit of that epoch releases it). A UE drives from agent A's
cell towards B's; once the migration is in flight (Trigger sent, or Commit sent and its reply
held back) the xApp is killed with SIGKILL and started again on the same Redis, replaying the
drive up to the handover. Checked: every epoch ordered after the restart is above every epoch
ordered before it (per session), and nothing is left prepared or frozen at any agent: the
fakes keep both ends of an attempt (the source's outbound and the attempt its Prepare left at
the target), and the source's Release to the target is lost (the source cannot reach it), so
only a Cancel the restarted xApp sends to the target itself frees the target. (The agents' own
side of this, a Cancel at the target releasing its attempt and a commit whose caller died
running to its end, is tested on the real engine in tests/agent/migration/test_control_recovery.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc as pbg
from redis_server import redis_or_skip, redis_server
from test_app_live import CELL_A, CELL_B, PCI_A, PCI_B, UE, _grpc_agent, _indication

REPO = Path(__file__).resolve().parents[2]
NODE_A, NODE_B = "gnb_001_01_00a81b0c", "gnb_001_01_00a81c0d"
SESSION = "sess-1"


class PreparingAgent(pbg.ControlServicer):
    """A fake agent that records every Control call (with the xApp run it came from) and what
    each Trigger left prepared; ``hold_commits`` keeps Commit replies back (the migration stays
    in its committing phase); ``serves``: it streams the UE's session in its telemetry, with the
    last epoch it saw when ``reports_epoch``."""

    def __init__(self, agent_id: str, serves: bool, reports_epoch: bool = True) -> None:
        self.agent_id, self.serves, self.reports_epoch = agent_id, serves, reports_epoch
        self.run = 1
        self.calls: list[tuple[int, str, str, int]] = []     # (run, kind, session, epoch)
        self.prepared: set[tuple[str, int]] = set()   # source side: attempts streaming out
        self.inbound: set[tuple[str, int]] = set()    # target side: attempts prepared here
        self.frozen: set[tuple[str, int]] = set()     # sessions frozen by a commit in flight
        self.peer: "PreparingAgent | None" = None     # the target its Triggers prepare
        self.reaches_peer = True                       # False: its Release to the target is lost
        self.hold_commits = threading.Event()
        self.released = threading.Event()
        self._lock = threading.Lock()

    def _record(self, kind: str, req, *, logged: bool = False) -> None:
        key = (req.session_id, int(req.epoch))
        with self._lock:
            if not logged:
                self.calls.append((self.run, kind, req.session_id, int(req.epoch)))
            if kind == "Trigger":
                self.prepared.add(key)
                if self.peer is not None:
                    self.peer.inbound.add(key)     # its Prepare reached the target
            elif kind == "Cancel":
                # At the source: stop the stream and tell the target (lost if it cannot reach
                # it); at the target: release the attempt prepared here.
                if key in self.prepared and self.peer is not None and self.reaches_peer:
                    self.peer.inbound.discard(key)
                self.prepared.discard(key)
                self.inbound.discard(key)
            else:   # a Commit hands the prepared attempt over: the target resumes the session
                self.prepared.discard(key)
                if self.peer is not None:
                    self.peer.inbound.discard(key)

    def _reply(self, req, state: str) -> pb.ControlReply:
        return pb.ControlReply(status=pb.STATUS_OK, session_id=req.session_id, epoch=req.epoch,
                               state=pb.SessionState.Value("SESSION_" + state.upper()),
                               scheme=pb.SCHEME_PALLAS)

    def Trigger(self, request, context):
        self._record("Trigger", request)
        return self._reply(request, "migrating")

    def Cancel(self, request, context):
        self._record("Cancel", request)
        return self._reply(request, "serving")

    def Commit(self, request, context):
        held = self.hold_commits.is_set()
        key = (request.session_id, int(request.epoch))
        with self._lock:
            self.calls.append((self.run, "Commit", request.session_id, int(request.epoch)))
            self.frozen.add(key)                 # frozen at the commit point until it ends
        if held:
            self.released.wait(30.0)
        self._record("Commit", request, logged=True)
        with self._lock:
            self.frozen.discard(key)
        return self._reply(request, "handed_over")

    def Telemetry(self, request, context):
        while context.is_active():
            rep = pb.TelemetryReport(agent_id=self.agent_id, time=time.time())
            rep.server.model.CopyFrom(pb.ModelIdentity(model="tiny", block_size=32,
                                                       kv_bytes_per_token=16384))
            rep.server.prefill_rate = 5000.0
            rep.server.free_kv_blocks = 10000
            if self.serves:
                with self._lock:
                    seen = [e for _, _, s, e in self.calls if s == SESSION]
                rep.sessions.add(session_id=SESSION, ue_id=str(UE), tokens=480, decode_rate=50.0,
                                 state="serving", remaining_tokens=5000,
                                 epoch=max(seen) if seen and self.reports_epoch else 0)
            yield rep
            time.sleep(0.05)

    def epochs(self, run: int) -> list[int]:
        """The epochs of the run's new orders for the session (Trigger and Commit)."""
        with self._lock:
            return [e for r, k, s, e in self.calls if r == run and s == SESSION
                    and k in ("Trigger", "Commit")]


def _drive(path: Path, t0: float, handover: bool) -> None:
    """The UE's E2 trace: serving RSRP from A falls and B's rises (8 dB/s closing), a report
    every 200 ms for 4 s; with ``handover`` the first report from cell B follows."""
    from xapp.e2.trace import TraceRecord, write_trace
    from xapp.e2.transport import RIC_INDICATION
    recs = [TraceRecord(t0 + 0.2 * k, NODE_A, RIC_INDICATION,
                        _indication(CELL_A, PCI_A, -80.0 - 0.8 * k, PCI_B, -100.0 + 0.8 * k, k), 1)
            for k in range(20)]
    if handover:
        recs.append(TraceRecord(t0 + 4.0, NODE_B, RIC_INDICATION,
                                _indication(CELL_B, PCI_B, -80.0, PCI_A, -100.0, 20), 1))
    write_trace(path, recs)


def _xapp(tmp: Path, run: int, trace: Path, redis_port: int, linger_s: float) -> subprocess.Popen:
    env = dict(os.environ, DBAAS_SERVICE_HOST="127.0.0.1", DBAAS_SERVICE_PORT=str(redis_port),
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "proto"),
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("CONFIG_FILE", None)
    cmd = [sys.executable, "-m", "xapp.main", "--mode", "test", "--config", str(tmp / "cfg.json"),
           "--trace", str(trace), "--start-delay-s", "1.0", "--store", "sdl",
           "--insecure", "--events", str(tmp / f"events-{run}.jsonl"), "--nrt", str(tmp / "nrt.json"),
           "--linger-s", str(linger_s), "--log-level", "WARNING"]
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=open(tmp / f"xapp-{run}.log", "wb"))


def _wait_for(cond, timeout_s: float, what: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise AssertionError(f"{what} not seen (xApp rc={proc.poll()}): {log.read_text()[-3000:]}")


@pytest.mark.parametrize("phase,reports_epoch", [("preparing", True), ("committing", False)])
def test_killed_mid_migration_the_restarted_xapp_never_reissues_an_epoch_and_leaves_nothing_prepared(
        tmp_path, phase, reports_epoch):
    redis_or_skip()
    a, b = PreparingAgent("edge-a", True, reports_epoch), PreparingAgent("edge-b", False)
    a.peer = b
    (sa, pa), (sb, pb_) = _grpc_agent(a), _grpc_agent(b)
    desc = json.loads((REPO / "descriptors" / "config-file.json").read_text())
    c = desc["controls"]
    c["scheme"] = "pallas"
    c["agents"] = {
        "edge-a": {"e2_node_id": NODE_A, "control_address": f"127.0.0.1:{pa}",
                   "peer_address": "127.0.0.1:1001"},
        "edge-b": {"e2_node_id": NODE_B, "control_address": f"127.0.0.1:{pb_}",
                   "peer_address": "127.0.0.1:1002"}}
    c["cells"] = {str(CELL_A): "edge-a", str(CELL_B): "edge-b"}
    c["sdl"] = {"store": "sdl", "namespace": f"pallas-restart-{uuid.uuid4().hex[:8]}"}
    (tmp_path / "cfg.json").write_text(json.dumps(desc))
    (tmp_path / "nrt.json").write_text(json.dumps({str(PCI_A): CELL_A, str(PCI_B): CELL_B}))
    approach, full = tmp_path / "approach.e2trace", tmp_path / "drive.e2trace"
    _drive(approach, 1000.0, handover=False)
    _drive(full, 1000.0, handover=True)
    procs: list[subprocess.Popen] = []
    try:
        with redis_server() as port:
            if phase == "committing":
                a.hold_commits.set()
            first = _xapp(tmp_path, 1, full if phase == "committing" else approach, port, 30.0)
            procs.append(first)
            if phase == "committing":
                _wait_for(lambda: a.frozen, 60.0, "Commit", first, tmp_path / "xapp-1.log")
            else:
                _wait_for(lambda: any(k == "Trigger" for _, k, _, _ in a.calls), 60.0, "Trigger",
                          first, tmp_path / "xapp-1.log")
            first.send_signal(signal.SIGKILL)      # no clean stop: nothing flushed, nothing sent
            first.wait(10)
            left, left_in = set(a.prepared), set(b.inbound)
            before = a.epochs(1) + [e for _, e in a.frozen]
            in_flight = max(before)
            assert left == left_in == {(SESSION, in_flight)}, (left, left_in)
            a.reaches_peer = False        # from now on A's Release never reaches B
            a.hold_commits.clear()
            a.released.set()
            a.run = b.run = 2
            second = _xapp(tmp_path, 2, full, port, 2.0)
            procs.append(second)
            assert second.wait(90) == 0, (tmp_path / "xapp-2.log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        a.released.set()
        sa.stop(0)
        sb.stop(0)
    run2 = [(k, e) for r, k, s, e in a.calls if r == 2 and s == SESSION]
    # The restarted xApp first finished the migration it found in flight, at its epoch...
    assert run2[0] == ("Commit" if phase == "committing" else "Cancel", in_flight), run2
    # ...then ordered the new drive's migration under epochs above every earlier one.
    after = a.epochs(2)[1:] if phase == "committing" else a.epochs(2)
    assert after and min(after) > max(before), (before, run2)
    assert [k for k, _ in run2[1:]][:1] == ["Trigger"] and run2[-1][0] == "Commit", run2
    # Nothing prepared, streaming or frozen at either agent: a preparing attempt was cancelled
    # at the target too (B was told by the xApp, A's Release never came), a committing one ended.
    assert a.prepared == b.prepared == a.inbound == b.inbound == a.frozen == b.frozen == set(), \
        (a.prepared, b.inbound, a.frozen)
    b_calls = [(r, k, s, e) for r, k, s, e in b.calls]
    assert b_calls == ([(2, "Cancel", SESSION, in_flight)] if phase == "preparing" else []), b_calls
    ev = [json.loads(x) for x in (tmp_path / "events-2.jsonl").read_text().splitlines()]
    rec = [e for e in ev if e["kind"] == "recover"]
    assert [(e["action"], e["epoch"], e["phase"]) for e in rec] == \
        [("commit" if phase == "committing" else "cancel", in_flight, phase)]
