"""ActionDispatcher: a trigger goes out with what the engine decided (xapp/dispatch.py)."""

import dataclasses
import math
import threading
from types import SimpleNamespace

from pallas_common import schemes
from xapp.dispatch import ActionDispatcher
from xapp.events import EventLog
from xapp.scheduler import TriggerAction
from policy_fakes import OrdersByKind


class _Telemetry:
    """Rates that would give another T_early than the engine's if the dispatcher recomputed."""

    def model_of(self, agent):
        return SimpleNamespace(kv_bytes_per_token=2048, block_size=32)

    def prefill_rate(self, agent, now):
        return 10.0

    def decode_rate(self, session, now):
        return 1.0

    def goodput_bytes_per_s(self, source, target, now):
        return 1.0


class _Policy(OrdersByKind):
    def __init__(self):
        self.calls = []

    def trigger(self, *args, **kw):
        self.calls.append((args, kw))


def _dispatcher(policy, events):
    engine = SimpleNamespace(telemetry=_Telemetry(), session=lambda sid: SimpleNamespace(ue_id="ue-1"),
                             cfg=SimpleNamespace(c_sync_s=0.03, alpha=0.5))
    return ActionDispatcher(engine, policy, events, threading.RLock(), offset=lambda: 1000.0,
                            tokens={"s1": (300, 1005.0)})


def _trigger(**kw):
    return TriggerAction(session_id="s1", epoch=2, source="a", target="b", predicted_handover_time=1010.0,
                         window_s=3.0, predicted_split_tokens=256, **kw)


def test_the_trigger_event_carries_the_engines_estimates_and_the_order_goes_out():
    events, policy = EventLog(), _Policy()
    _dispatcher(policy, events).send([_trigger(predicted_sit_s=0.12, predicted_early_s=0.4)])
    ev = [e for e in events.events if e["kind"] == "trigger"]
    assert len(ev) == 1
    assert ev[0]["t_sit_s"] == 0.12 and ev[0]["t_early_s"] == 0.4
    assert ev[0]["ue"] == "ue-1" and ev[0]["t_ho_pred"] == 10.0 and ev[0]["scheme"] == schemes.PALLAS
    (args, kw), = policy.calls
    assert args == ("a", "s1", 2, "b") and kw["window_s"] == 3.0 and kw["scheme"] == schemes.PALLAS


def test_the_policy_client_sends_each_action_as_built():
    from pallas_proto import pallas_pb2 as pb
    from xapp.policy import AgentEndpoint, PolicyClient
    from xapp.scheduler import CancelAction, CommitAction

    client = PolicyClient({k: AgentEndpoint(k, f"127.0.0.1:{p}", f"127.0.0.1:{p + 1000}")
                           for k, p in (("a", 1), ("b", 2))})
    sent = []
    client._submit = lambda kind, agent, req: sent.append((kind, agent, req))
    trig = _trigger(predicted_sit_s=0.1, predicted_early_s=0.2)
    commit = CommitAction("s1", 2, "a", "b", "b", pb.SCHEME_PALLAS, 1010.5)
    for a in (trig, CancelAction("s1", 2, "a", "b", "mispredicted"), commit,
              CancelAction("s1", 2, "a", "b", "left", only_target=True)):
        client.send(a)
    assert [(k, agent) for k, agent, _ in sent] == [("Trigger", "a"), ("Cancel", "a"), ("Commit", "a"),
                                                    ("Cancel", "a")]
    assert sent[0][2] == trig.to_proto("127.0.0.1:1002")
    assert sent[1][2] == pb.CancelRequest(session_id="s1", epoch=2, reason="mispredicted")
    assert sent[2][2] == commit.to_proto("127.0.0.1:1002")
    assert sent[3][2] == pb.CancelRequest(session_id="s1", epoch=2, reason="left", target=pb.PeerEndpoint(
        agent_id="b", address="127.0.0.1:1002"))   # targeted: the target's PeerTransfer address
    assert client.trigger("a", "s1", 2, "b", window_s=3.0, predicted_handover_time=1010.0) is None
    assert sent[-1][2].target.address == "127.0.0.1:1002" and sent[-1][2].window_s == 3.0
    try:
        client.send(CommitAction("s1", 3, "a", "nowhere", None, pb.SCHEME_CTHO, 0.0))
    except KeyError:
        pass
    else:
        raise AssertionError("an unknown target must raise KeyError")
    client.close()


def test_a_trigger_without_estimates_logs_none_for_them():
    events, policy = EventLog(), _Policy()
    _dispatcher(policy, events).send([_trigger()])
    ev = next(e for e in events.events if e["kind"] == "trigger")
    assert ev["t_sit_s"] is None and ev["t_early_s"] is None
    assert len(policy.calls) == 1 and not math.isnan(ev["window_s"])


def test_the_events_carry_the_rates_the_action_was_decided_with():
    """The dispatcher writes the action's rates, not the telemetry read again at send time
    (_Telemetry would say r_p 10, r_d 1, bandwidth 1, s_kv 2048, block 32)."""
    from pallas_proto import pallas_pb2 as pb
    from xapp.scheduler import CommitAction, DecidedRates

    events, policy = EventLog(), _Policy()
    policy.commit = lambda *args, **kw: policy.calls.append((args, kw))
    d = _dispatcher(policy, events)
    decided = DecidedRates(r_p=2700.0, r_d=30.0, bandwidth=3.75e7, s_kv=163840, block_size=16)
    d.send([_trigger(rates=decided)])
    d.send([CommitAction("s1", 2, "a", "b", "b", pb.SCHEME_PALLAS, 1010.5,
                         rates=DecidedRates(2600.0, 29.0, 3.5e7, 163840, 16))])
    trig, commit = (next(e for e in events.events if e["kind"] == k) for k in ("trigger", "commit"))
    assert {k: trig[k] for k in decided.fields()} == decided.fields()
    assert {k: commit[k] for k in decided.fields()} == dict(r_p=2600.0, r_d=29.0, bandwidth=3.5e7,
                                                          s_kv=163840, block_size=16)
    assert len(policy.calls) == 2
    # built by hand, no estimates: the fields are there, null (another session: s1's commit is
    # in flight, which holds its next order)
    d.send([TriggerAction("s2", 1, "a", "b", 1010.0, 3.0, 256)])
    last = [e for e in events.events if e["kind"] == "trigger"][-1]
    assert last["session"] == "s2"
    assert all(last[k] is None for k in decided.fields())


def test_the_policy_client_refuses_what_is_not_an_action():
    from xapp.policy import PolicyClient

    client = PolicyClient({})
    try:
        client.send(object())
    except TypeError:
        pass
    else:
        raise AssertionError("a non-action must raise TypeError")
    finally:
        client.close()


def test_a_targeted_cancels_reply_ends_that_targets_trigger_alone():
    """Issue 45: the reply to a Cancel naming c drops c's pending Trigger only; b's stays until
    the epoch's commit or untargeted cancel, and the cancel event says it was targeted."""
    from pallas_proto import pallas_pb2 as pb
    from xapp.policy import CallOutcome
    from xapp.scheduler import CancelAction

    events, policy = EventLog(), _Policy()
    policy.send = lambda a: None
    replies = []
    d = _dispatcher(policy, events)
    d.engine.on_reply = lambda a, r: replies.append((a, r.status)) or []
    extra = dataclasses.replace(_trigger(rank=1), target="c")
    cancel = CancelAction("s1", 2, "a", "c", "left the target choice", only_target=True)
    d.send([_trigger(), extra, cancel])
    ok = pb.ControlReply(status=pb.STATUS_OK)
    d.on_reply(CallOutcome("Cancel", "a", "s1", 2, ok, target="c"))
    assert sorted(d.pending["s1"]) == [("Trigger", 2, "b")]
    assert replies == [(cancel, pb.STATUS_OK)]
    (ev,) = [e for e in events.events if e["kind"] == "cancel"]
    assert ev["only_target"] is True and ev["target_agent"] == "c"
