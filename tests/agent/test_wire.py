"""agent.wire: the KVBlock codec of the block stream is the .proto's wire format, both ways."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from google.protobuf.message import DecodeError
from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc as pbg

from agent.ipc import BlockStore, block_crc
from agent.transfer import GRPC_OPTIONS, PeerClient, serve_peer_transfer
from agent.wire import Block, decode_block, encode_block


def _fields(b) -> tuple:
    return (b.session_id, b.epoch, b.block_index, b.fill, b.checksum, bytes(b.data))


CASES = [
    Block("s", 1, 0, 32, 0, b""),
    Block("sess-ü", 2**63, 2**32 - 1, 32, 2**32 - 1, os.urandom(786_432)),
    Block("", 0, 0, 0, 0, b"\x00" * 5),
    Block("x" * 300, 7, 129, 5, 12345, os.urandom(200)),  # varint lengths over one byte
]


@pytest.mark.parametrize("blk", CASES)
def test_same_bytes_as_generated_class_both_ways(blk):
    wire = encode_block(blk)
    ref = pb.KVBlock(session_id=blk.session_id, epoch=blk.epoch, block_index=blk.block_index,
                     fill=blk.fill, checksum=blk.checksum, data=blk.data)
    assert wire == ref.SerializeToString()          # proto3 writes fields in number order
    assert _fields(pb.KVBlock.FromString(wire)) == _fields(blk)
    got = decode_block(ref.SerializeToString())
    assert _fields(got) == _fields(blk)
    assert encode_block(ref) == wire                # the generated class is accepted as input


def test_payload_is_a_view_of_the_received_buffer():
    data = os.urandom(4096)
    wire = encode_block(Block("s", 1, 3, 32, block_crc(data), data))
    got = decode_block(wire)
    assert isinstance(got.data, memoryview) and got.data.obj is wire
    assert block_crc(got.data) == got.checksum and len(got.data) == 4096


def test_any_field_order_repeats_and_unknown_fields():
    parts = [pb.KVBlock(data=b"first").SerializeToString(),
             pb.KVBlock(fill=3, checksum=9).SerializeToString(),
             b"\xa0\x06\x2a",                       # unknown field 100, varint 42
             b"\xaa\x06\x03abc",                    # unknown field 101, 3 bytes
             pb.KVBlock(session_id="s", data=b"last").SerializeToString(),
             pb.KVBlock(epoch=5, block_index=2).SerializeToString()]
    wire = b"".join(parts)
    ref = pb.KVBlock.FromString(wire)
    assert _fields(decode_block(wire)) == _fields(ref) == ("s", 5, 2, 3, 9, b"last")


def test_every_truncation_fails_exactly_where_protobuf_fails():
    wire = encode_block(Block("session", 300, 70000, 32, 0xDEADBEEF, os.urandom(300)))
    for n in range(len(wire)):
        prefix = wire[:n]
        try:
            ref = pb.KVBlock.FromString(prefix)
        except DecodeError:
            with pytest.raises(DecodeError):
                decode_block(prefix)
        else:
            assert _fields(decode_block(prefix)) == _fields(ref), n


def test_malformed_input_raises_decode_error():
    for bad in (b"\x00", b"\x32\x05ab", b"\x0a", b"\x33\x01", b"\xff" * 11,
                b"\x32" + b"\xff" * 9 + b"\x01"):
        with pytest.raises(DecodeError):
            decode_block(bad)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_parse_as_protobuf_parses_them_or_raise(junk):
    try:
        ref = _fields(pb.KVBlock.FromString(junk))
    except DecodeError:
        with pytest.raises(DecodeError):
            decode_block(junk)
    else:
        assert _fields(decode_block(junk)) == ref


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.binary(max_size=3000))
def test_round_trip_of_any_field_values(sid, epoch, idx, fill, crc, data):
    blk = Block(sid, epoch, idx, fill, crc, data)
    assert _fields(decode_block(encode_block(blk))) == _fields(blk)
    assert _fields(pb.KVBlock.FromString(encode_block(blk))) == _fields(blk)


class _Sink:
    def __init__(self):
        self.store = BlockStore()
        self.kinds = set()

    async def on_prepare(self, req):
        return pb.PrepareReply(status=pb.STATUS_OK)

    def on_block(self, blk, crc_ok=None):
        self.kinds.add(type(blk.data))
        return self.store.put(blk.session_id, blk.epoch, blk.block_index, blk.fill,
                              blk.checksum, blk.data, crc_ok)

    async def on_sync(self, req):
        return pb.SyncReply(status=pb.STATUS_OK)

    async def on_release(self, req):
        return pb.ReleaseReply(status=pb.STATUS_OK)


class _GeneratedSink(pbg.PeerTransferServicer):
    """A peer built on the generated stub alone (protobuf parsing)."""

    def __init__(self):
        self.got = []

    async def StreamBlocks(self, request_iterator, context):  # noqa: N802
        async for b in request_iterator:
            self.got.append(_fields(b))
        return pb.StreamAck(blocks_received=len(self.got))


def _blocks(n, size=10_000):
    out = []
    for i in range(n):
        data = os.urandom(size)
        out.append(Block("s", 1, i, 32, block_crc(data), data))
    return out


def test_generated_stub_client_reaches_the_agent_server():
    async def run():
        sink = _Sink()
        server, addr = await serve_peer_transfer(sink, "127.0.0.1:0")
        blocks = _blocks(6)
        try:
            async with grpc.aio.insecure_channel(addr, options=GRPC_OPTIONS) as ch:
                async def gen():
                    for b in blocks:
                        yield pb.KVBlock(session_id=b.session_id, epoch=b.epoch,
                                         block_index=b.block_index, fill=b.fill,
                                         checksum=b.checksum, data=b.data)
                ack = await pbg.PeerTransferStub(ch).StreamBlocks(gen())
                # The other calls still go through the generated handlers.
                rep = await pbg.PeerTransferStub(ch).Prepare(pb.PrepareRequest(session_id="s"))
        finally:
            await server.stop(0)
        assert ack.blocks_received == 6 and ack.blocks_rejected == 0 and rep.status == pb.STATUS_OK
        assert sink.kinds == {memoryview}
        for b in blocks:
            assert bytes(sink.store.get("s", 1, b.block_index).data) == b.data
    asyncio.run(run())


def test_agent_client_reaches_a_generated_stub_server():
    async def run():
        sink = _GeneratedSink()
        server = grpc.aio.server(options=GRPC_OPTIONS)
        pbg.add_PeerTransferServicer_to_server(sink, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        client = PeerClient(f"127.0.0.1:{port}")
        blocks = _blocks(5)
        try:
            st = client.open_stream("s", 1)
            for b in blocks:
                st.send(b)
            ack = await st.finish(10)
        finally:
            await client.close()
            await server.stop(0)
        assert ack.blocks_received == 5
        assert sink.got == [_fields(b) for b in blocks]
    asyncio.run(run())
