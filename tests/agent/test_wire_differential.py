"""agent.wire.decode_block against the generated ``pallas.v1.KVBlock`` class (issue 12, fault 7).

``decode_block`` claims wire equivalence with ``pallas_pb2.KVBlock.FromString``: for every input
both accept or both raise ``DecodeError``, and the accepted values agree. Checked here on
generated messages (every wire type, groups nested and mismatched, known numbers with the wrong
wire type, non-canonical varints), their byte mutations and truncations, and the field case
``../shared/cases/wire/unknown-field-group-wiretype.hex``. The budget is small and fixed for
the normal test run (derandomised under CI, tests/conftest.py); ``benchmarks/fuzz.py`` runs the same generators long.

Family of the field case: unknown fields that protobuf's parser skips (any wire type, groups
included) must be skipped by the hand-written decoder too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from pallas_proto import pallas_pb2 as pb

from agent.wire import Block, decode_block, encode_block
from fuzz_inputs import kvblock_messages, kvblock_mutants

CASES = Path(__file__).resolve().parents[2].parent / "shared" / "cases" / "wire"
CI = settings(max_examples=400, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _fields(b) -> tuple:
    return (b.session_id, b.epoch, b.block_index, b.fill, b.checksum, bytes(b.data))


def outcome(parse, buf: bytes) -> tuple | None:
    """The fields ``parse`` decodes from ``buf``, or None when it raises DecodeError."""
    try:
        return _fields(parse(buf))
    except DecodeError:
        return None


def assert_same(buf: bytes) -> None:
    ref = outcome(pb.KVBlock.FromString, buf)
    got = outcome(decode_block, buf)
    assert got == ref, f"decode_block differs from the generated class on {buf.hex()}"


def test_field_case_unknown_group_is_skipped_as_protobuf_skips_it():
    buf = bytes.fromhex((CASES / "unknown-field-group-wiretype.hex").read_text().strip())
    blk = decode_block(buf)
    assert _fields(blk) == ("s1", 1, 0, 16, 0, b"\x01" * 8)
    assert _fields(blk) == _fields(pb.KVBlock.FromString(buf))


@pytest.mark.parametrize("hexbuf, accepted", [
    ("7b7c", True),                      # empty group, field 15
    ("7b08011b1c7c", True),              # group holding a varint and a nested group
    ("7b08017c" + "3203616263", True),   # group, then data: data still sliced after it
    ("7b84", False),                     # group 15 closed by end-group of field 16
    ("7c", False),                       # end-group with no group open
    ("7b0801", False),                   # group never closed
    ("3334", True),                      # field 6 (data) as a group: an unknown field
    ("0e", False), ("0f", False),        # wire types 6 and 7
    ("b2000161", True),                  # data with a non-canonical two-byte tag
    ("32810061", True),                  # data with a non-canonical length
    ("7b" * 99 + "7c" * 99, True),       # nesting at protobuf's depth limit
    ("7b" * 101 + "7c" * 101, False),    # past it
])
def test_groups_and_edges_agree_with_protobuf(hexbuf, accepted):
    buf = bytes.fromhex(hexbuf)
    assert (outcome(pb.KVBlock.FromString, buf) is not None) is accepted
    assert_same(buf)


def test_a_group_goes_to_the_generated_class_with_the_same_values():
    wire = encode_block(Block("s", 1, 2, 32, 7, b"payload"))
    # A group is handed to the generated class: same values, data copied (bytes).
    blk = decode_block(b"\x7b\x7c" + wire)
    assert _fields(blk) == ("s", 1, 2, 32, 7, b"payload")
    # Without one, data is sliced out of the buffer.
    assert isinstance(decode_block(wire).data, memoryview)


@CI
@given(kvblock_messages())
def test_generated_messages_decode_as_protobuf_decodes_them(buf):
    assert_same(buf)


@CI
@given(kvblock_mutants())
def test_mutated_messages_decode_as_protobuf_decodes_them(buf):
    assert_same(buf)


@settings(max_examples=100, deadline=None)
@given(kvblock_messages())
def test_every_truncation_of_a_generated_message_agrees(buf):
    for n in range(len(buf)):
        assert_same(buf[:n])
