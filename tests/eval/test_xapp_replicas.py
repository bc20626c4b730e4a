"""``pallas replay --xapp-replicas N`` (pallas_eval/replicas.py, issue 46 item 3): the flag
reaches the options, the replicas' descriptor enables the cluster under the run's own
settings, each replica gets its identity, its events file and the private redis-server's
address, and their events come back as one list in time order, each with its replica."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest

from pallas_eval.cluster import LocalAgent
from pallas_eval.replay import ReplayOptions, Server, scheme_overlay, xapp_descriptor


def _parse(*argv):
    from pallas_eval.cli import build_parser, options_from_args
    return options_from_args(build_parser().parse_args(["replay", *argv]))


def test_the_flag_reaches_the_options_and_refuses_fewer_than_one(capsys):
    assert _parse("--xapp-replicas", "3").xapp_replicas == 3
    assert _parse().xapp_replicas == 1
    for bad in ("0", "-2", "two"):
        with pytest.raises(SystemExit) as e:
            _parse("--xapp-replicas", bad)
        assert e.value.code == 2
        assert "--xapp-replicas" in capsys.readouterr().err


def test_the_replicas_descriptor_enables_the_cluster_under_the_runs_settings(tmp_path):
    from xapp.config import load_controls
    from pallas_eval.replicas import REPLAY_CLUSTER
    agent = LocalAgent("edge-0", "m", log_dir=str(tmp_path))
    agent.insecure = True
    one = _parse("--out", str(tmp_path / "r"), "--xapp-set", "scheduler.targets_k=2")
    assert scheme_overlay(one, "pallas") == {"scheduler": {"targets_k": 2}}   # one xApp: as ever
    three = _parse("--out", str(tmp_path / "r"), "--xapp-replicas", "3",
                   "--xapp-set", "cluster.lease_s=3.0", "--xapp-set", "scheduler.targets_k=2")
    c = xapp_descriptor({"cells": []}, {}, [Server(0, agent, None, 1)], "pallas",
                        scheme_overlay(three, "pallas"))["controls"]
    assert c["cluster"] == dict(REPLAY_CLUSTER, lease_s=3.0)       # --xapp-set wins
    assert c["sdl"]["namespace"] == "pallas-replay-pallas"
    assert c["scheduler"]["targets_k"] == 2
    cfg = load_controls(c)                                          # the xApp accepts it
    assert cfg.cluster.enabled and cfg.cluster.lease_s == 3.0 and cfg.cluster.heartbeat_s == 0.5
    with pytest.raises(ValueError, match="at least 1"):
        scheme_overlay(ReplayOptions(out_dir=tmp_path, xapp_replicas=0), "pallas")


def test_each_replica_gets_its_id_and_events_file(tmp_path):
    from pallas_eval.replicas import replica_commands
    ev = tmp_path / "xapp-events.jsonl"
    got = replica_commands(["py", "-m", "xapp.main", "--events", str(ev), "--linger-s", "5"], 2)
    assert [r for r, _, _ in got] == ["xapp-0", "xapp-1"]
    assert got[1][1] == ["py", "-m", "xapp.main", "--events", str(tmp_path / "xapp-events-xapp-1.jsonl"),
                         "--linger-s", "5", "--replica-id", "xapp-1"]
    assert got[0][2] == tmp_path / "xapp-events-xapp-0.jsonl"
    with pytest.raises(ValueError, match="at least 1"):
        replica_commands(["py", "--events", str(ev)], 0)
    with pytest.raises(ValueError, match="--events"):
        replica_commands(["py", "-m", "xapp.main"], 2)


def test_the_replicas_events_merge_in_time_order(tmp_path):
    from pallas_eval.replicas import merge_events
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps({"t": t, "kind": k}) for t, k in ((1.0, "x"), (3.0, "z"))) + "\n")
    b.write_text(json.dumps({"t": 2.0, "kind": "y"}) + "\n\n")
    evs = merge_events([("xapp-0", a), ("xapp-1", b), ("xapp-2", tmp_path / "none.jsonl")])
    assert [(e["kind"], e["replica"]) for e in evs] == [("x", "xapp-0"), ("y", "xapp-1"), ("z", "xapp-0")]


def test_an_epoch_ordered_by_two_replicas_is_found_in_the_merged_events():
    from pallas_eval.replicas import epochs_of_two_replicas
    evs = [{"kind": "trigger", "session": "s1", "epoch": 7, "replica": "xapp-0"},
           {"kind": "commit", "session": "s1", "epoch": 7, "replica": "xapp-0"},   # same replica
           {"kind": "commit", "session": "s1", "epoch": 9, "replica": "xapp-1"},   # a new epoch
           {"kind": "trigger", "session": "s2", "epoch": 3, "replica": "xapp-2"},
           {"kind": "order_refused", "session": "s2", "epoch": 3, "replica": "xapp-1"},  # not sent
           {"kind": "reply", "session": "s2", "epoch": 3, "replica": "xapp-0"},    # not an order
           {"kind": "arrival", "ue": "u", "replica": "xapp-1"}]
    assert epochs_of_two_replicas(evs) == {}
    evs.append({"kind": "cancel", "session": "s2", "epoch": 3, "replica": "xapp-0"})
    evs.append({"kind": "commit", "session": "s1", "epoch": 7, "replica": "xapp-2"})
    assert epochs_of_two_replicas(evs) == {("s1", 7): ["xapp-0", "xapp-2"],
                                           ("s2", 3): ["xapp-0", "xapp-2"]}


_FAKE_XAPP = """
import json, os, sys, time
ev = sys.argv[sys.argv.index("--events") + 1]
rid = sys.argv[sys.argv.index("--replica-id") + 1]
with open(ev, "w") as f:
    f.write(json.dumps({"t": time.time(), "kind": "started", "id": rid,
                        "dbaas": [os.environ["DBAAS_SERVICE_HOST"], os.environ["DBAAS_SERVICE_PORT"]]}) + "\\n")
"""


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_the_replicas_start_against_a_private_redis_server(tmp_path):
    from pallas_eval.procs import Supervisor
    from pallas_eval.replay import _start_xapps
    from pallas_eval.replicas import merge_events
    with Supervisor(tmp_path / "logs") as sup:
        started = _start_xapps(sup, "pallas", [sys.executable, "-c", _FAKE_XAPP, "--events",
                                               str(tmp_path / "xapp-events.jsonl")], tmp_path / "unused", 3)
        assert [name for name, _, _ in started] == ["dbaas", "xapp-0", "xapp-1", "xapp-2"]
        for _, child, _ in started[1:]:
            child.popen.wait(30)
        evs = merge_events([(n, p) for n, _, p in started[1:]])
        assert sorted(e["id"] for e in evs) == ["xapp-0", "xapp-1", "xapp-2"]
        assert all(e["id"] == e["replica"] for e in evs)
        port = {e["dbaas"][1] for e in evs}
        assert len(port) == 1 and all(e["dbaas"][0] == "127.0.0.1" for e in evs)
        with socket.create_connection(("127.0.0.1", int(port.pop())), timeout=2) as s:
            s.sendall(b"PING\r\n")
            assert s.recv(16).startswith(b"+PONG")
        for _, child, _ in reversed(started):
            sup.stop(child)
        assert not started[0][1].alive()
