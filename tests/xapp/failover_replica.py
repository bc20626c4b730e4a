"""One xApp replica for the fail-over test (tests/xapp/test_cluster_failover.py), as a process
the test can SIGKILL: a :class:`xapp.app.PallasXapp` with ``controls.cluster`` enabled on the
DBaaS of ``DBAAS_SERVICE_HOST`` / ``_PORT`` (real leases in SDL), no RMR, no agents. It writes
the xApp's own ``lease`` events (``PallasXapp._lease_event``) and a ``beat`` event after every
heartbeat to its events file, and runs until SIGTERM (a clean stop: its leases released).

    python failover_replica.py REPLICA_ID NAMESPACE LEASE_S HEARTBEAT_S EVENTS NODE...
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class _Idle:
    """No RMR and no policy channel: this replica only holds leases."""

    on_reply = None
    on_message = None

    def start(self, on_message):
        self.on_message = on_message

    def stop(self):
        pass

    def send(self, action):
        raise AssertionError(f"no order expected: {action}")

    def close(self):
        pass


def main(argv: list[str]) -> int:
    from xapp.app import PallasXapp
    from xapp.cluster.leases import NodeLeases, open_sdl
    from xapp.cluster.replica import ClusterReplica
    from xapp.config import load_controls
    from xapp.events import EventLog

    rid, ns, lease_s, beat_s, path, *nodes = argv
    c = json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"]
    c["agents"] = {f"edge-{i}": {"e2_node_id": n, "control_address": f"127.0.0.1:{1 + i}",
                                 "peer_address": f"127.0.0.1:{1001 + i}"} for i, n in enumerate(nodes)}
    c["cells"] = {}
    c["cluster"] = {"enabled": True, "lease_s": float(lease_s), "heartbeat_s": float(beat_s)}
    c.pop("tls", None)
    cfg = load_controls(c)
    leases = NodeLeases(open_sdl(), rid, nodes, namespace=ns, lease_s=float(lease_s), max_claims=64,
                        join_delay_s=float(beat_s))
    cluster = ClusterReplica(leases, heartbeat_s=float(beat_s))
    events = EventLog(path)
    PallasXapp(cfg, _Idle(), policy=_Idle(), telemetry=False, events=events, cluster=cluster)
    lease_event = cluster.on_beat
    assert lease_event is not None

    def on_beat(hb):
        lease_event(hb)
        events.write("beat", owned=list(hb.owned))
    cluster.on_beat = on_beat
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    cluster.start()
    done.wait()
    cluster.stop()
    events.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
