"""Replays with several xApp replicas (``pallas replay --xapp-replicas N``; issue 46 item 3,
docs/scale-out.md §6-§7).

N test-mode xApp processes (``python -m xapp.main --mode test``) replay the same trace, each
with its own ``--replica-id`` (``xapp-0`` ... ``xapp-<N-1>``) and events file, with
``controls.cluster`` enabled: they share the replay's E2 nodes through leases in SDL, each
handles the indications of the nodes it owns and drops the others' (test mode feeds every
replica the whole trace, as a subscription manager that merged identical subscriptions
would), and a handover that crosses replicas is forwarded to the owner of the session's
record (docs/scale-out.md §3 item 6). SDL is a private ``redis-server`` started for the run
on a free loopback port (no RDB, no AOF), the DBaaS every replica is pointed at through
``DBAAS_SERVICE_HOST`` / ``DBAAS_SERVICE_PORT``. The replicas' events are merged into one
list by their wall time, each tagged with its ``replica``, so the per-handover rows are built
as for one xApp.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["REPLAY_CLUSTER", "replica_controls", "replica_commands", "merge_events",
           "start_dbaas", "replica_id", "epochs_of_two_replicas", "ORDER_KINDS"]

ORDER_KINDS = ("trigger", "commit", "cancel")
"""The xApp's events of an order sent to an agent (``xapp.dispatch.ActionDispatcher``: written
once the session's record was written, just before the policy call; a refused order is an
``order_refused`` instead)."""

REPLAY_CLUSTER = {"enabled": True, "lease_s": 1.5, "heartbeat_s": 0.5, "join_delay_s": 1.0,
                  "max_claims": 64, "max_releases": 16, "endpoint_host": "service"}
"""``controls.cluster`` of a replay's replicas: leases short enough that replicas started
together settle their shares within the replay's start delay (``ReplayOptions.start_delay_s``,
10 s), and a hand-over of a whole share in one heartbeat; the subscription endpoint is the
descriptor's host (test mode subscribes to nothing, and no replica has a pod IP).
``--xapp-set cluster.KEY=VALUE`` overrides any of them."""


def replica_id(i: int) -> str:
    """The identity of the replay's ``i``-th xApp replica (``--replica-id``)."""
    return f"xapp-{i}"


def replica_controls(scheme: str) -> dict:
    """The controls merged into a replica's descriptor under the run's overlay: the cluster
    (:data:`REPLAY_CLUSTER`) and an SDL namespace of the scheme's run."""
    return {"cluster": dict(REPLAY_CLUSTER), "sdl": {"namespace": f"pallas-replay-{scheme}"}}


def replica_commands(argv: Sequence[str], n: int) -> list[tuple[str, list[str], Path]]:
    """The N replicas' command lines from one xApp's ``argv`` (which names its events file
    after ``--events``): ``[(replica id, argv, events file)]``, each with ``--replica-id`` and
    its own events file (``<stem>-<replica id><suffix>`` beside the one given).

    Raises ValueError for ``n`` < 1 or an ``argv`` without ``--events FILE``."""
    if n < 1:
        raise ValueError(f"xApp replicas: {n} (at least 1)")
    argv = list(argv)
    try:
        at = argv.index("--events") + 1
        path = Path(argv[at])
    except (ValueError, IndexError):
        raise ValueError("the xApp's command line names no --events file") from None
    out = []
    for i in range(n):
        rid = replica_id(i)
        mine = path.with_name(f"{path.stem}-{rid}{path.suffix}")
        cmd = argv[:at] + [str(mine)] + argv[at + 1:] + ["--replica-id", rid]
        out.append((rid, cmd, mine))
    return out


def merge_events(files: Sequence[tuple[str, Path]]) -> list[dict[str, Any]]:
    """The events of every replica (``[(replica id, events file)]``; a missing file: none),
    each tagged with its ``replica``, in the order of their wall time ``t`` (s since 1970;
    ties keep each file's order). A file's last line cut short (a replica killed while writing
    it, ``--kill-replica``) is left out; a bad line elsewhere raises ValueError."""
    evs: list[tuple[float, int, dict]] = []
    for rid, path in files:
        if not Path(path).exists():
            continue
        lines = [x for x in Path(path).read_text().splitlines() if x.strip()]
        for k, line in enumerate(lines):
            try:
                e = json.loads(line)
            except ValueError:
                if k == len(lines) - 1:
                    continue
                raise
            e["replica"] = rid
            evs.append((float(e.get("t") or 0.0), len(evs), e))
    return [e for _, _, e in sorted(evs, key=lambda x: (x[0], x[1]))]


def epochs_of_two_replicas(events: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[str]]:
    """The (session, epoch) pairs whose orders (:data:`ORDER_KINDS`) came from more than one
    replica in ``events`` (:func:`merge_events`' list, each event with its ``replica``), each
    with the replicas, sorted. Empty when every epoch of every session was ordered by one
    replica, which the session records and generations guarantee (docs/scale-out.md §3, §5):
    an agent never gets policies of one epoch from two replicas."""
    by: dict[tuple[str, int], set[str]] = {}
    for e in events:
        if e.get("kind") in ORDER_KINDS and e.get("session") is not None and e.get("epoch") is not None:
            by.setdefault((str(e["session"]), int(e["epoch"])), set()).add(str(e.get("replica", "")))
    return {k: sorted(v) for k, v in sorted(by.items()) if len(v) > 1}


def start_dbaas(sup: Any, name: str, timeout_s: float = 15.0) -> tuple[Any, int]:
    """Start a private ``redis-server`` under ``sup`` (a :class:`pallas_eval.procs.Supervisor`,
    which ends it with the run) on a free loopback port; returns (its Child, the port) once it
    accepts connections. Raises FileNotFoundError when ``redis-server`` is not installed (the
    Debian package), RuntimeError (with its log's tail) when it does not listen in
    ``timeout_s``."""
    from pallas_eval.procs import free_port, wait_port

    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("--xapp-replicas needs redis-server (apt-get install redis-server): "
                                "the replicas share their E2 nodes through SDL")
    port = free_port()
    child = sup.start(name, [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--daemonize", "no"])
    try:
        wait_port("127.0.0.1", port, timeout_s, child)
    except Exception as e:
        sup.stop(child)
        raise RuntimeError(f"redis-server did not listen on {port}: {e}") from None
    return child, port
