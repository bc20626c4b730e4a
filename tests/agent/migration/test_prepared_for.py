"""The one rule "is this attempt prepared for this commit?" (Outbound.prepared_for), over its
inputs: proactive or not, each source state, the epoch and the target's address."""

import itertools

import pytest

from agent.migration import Outbound
from agent.session import SamplingSpec, Session
from agent.states import SourceState
from pallas_proto import pallas_pb2 as pb


def _out(proactive: bool, state: SourceState) -> Outbound:
    s = Session("s", "ue", list(range(40)), SamplingSpec(max_tokens=50))
    o = Outbound(session=s, epoch=3, target=pb.PeerEndpoint(agent_id="b", address="b:1"), client=None, split=32,
                 first_block=2, scheme=pb.SCHEME_PALLAS, proactive=proactive, stream_suffix=True)
    o.state = state
    return o


@pytest.mark.parametrize("proactive,state", itertools.product([True, False], list(SourceState)))
def test_prepared_only_when_proactive_live_same_epoch_same_target(proactive, state):
    o = _out(proactive, state)
    live = state in (SourceState.PREPARED, SourceState.STREAMING)
    assert o.prepared_for(3, "b:1") is (proactive and live)
    assert o.prepared_for(4, "b:1") is False           # another epoch
    assert o.prepared_for(2, "b:1") is False
    assert o.prepared_for(3, "c:1") is False           # the UE went to another target
