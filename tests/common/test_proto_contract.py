"""The generated stubs import and round-trip under each environment's protobuf."""

import google.protobuf
from pallas_proto import pallas_pb2, pallas_pb2_grpc


def test_stubs_roundtrip_under_this_protobuf():
    blk = pallas_pb2.KVBlock(session_id="s1", epoch=3, block_index=7, fill=32,
                             checksum=0xDEADBEEF, data=b"\x00\x01" * 64)
    back = pallas_pb2.KVBlock.FromString(blk.SerializeToString())
    assert back == blk and back.checksum == 0xDEADBEEF
    trig = pallas_pb2.TriggerRequest(session_id="s1", epoch=1, scheme=pallas_pb2.SCHEME_CTHO,
                                     target=pallas_pb2.PeerEndpoint(agent_id="b", address="127.0.0.1:1"))
    assert pallas_pb2.TriggerRequest.FromString(trig.SerializeToString()).target.agent_id == "b"
    assert hasattr(pallas_pb2_grpc, "ControlStub") and hasattr(pallas_pb2_grpc, "PeerTransferServicer")
    assert google.protobuf.__version__


def test_commit_moved_fields_are_control_reply_fields():
    from pallas_common.contract import COMMIT_MOVED_FIELDS

    names = set(pallas_pb2.ControlReply.DESCRIPTOR.fields_by_name)
    assert set(COMMIT_MOVED_FIELDS) <= names, set(COMMIT_MOVED_FIELDS) - names


def test_commit_choice_of_a_reply_goes_to_the_event_log_whole():
    from pallas_common.contract import commit_choice_of
    pb = pallas_pb2
    r = pb.ControlReply(status=pb.STATUS_OK)
    assert commit_choice_of(r) == {} and commit_choice_of(None) == {}
    r.choice.option, r.choice.finish_s, r.choice.ctho_s, r.choice.prefilled_tokens = "ctho", 2.5, 0.4, 64
    assert commit_choice_of(r) == {"option": "ctho", "finish_s": 2.5, "ctho_s": 0.4,
                                   "prefilled_tokens": 64}
