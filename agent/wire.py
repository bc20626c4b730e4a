"""KVBlock on the wire without protobuf's payload copies.

The block stream (PeerTransfer.StreamBlocks) carries ``pallas.v1.KVBlock`` messages: a few small
header fields and one ``data`` field of a whole KV block (0.8-2.4 MB for the evaluation's
models). The generated classes copy the payload four times per block (into the message, out at
serialisation, into the parsed message, out at each ``.data``), most of a CPU at 1 GB/s. This
module writes and reads the *same* protobuf encoding (proto/pallas_proto/pallas.proto): header
fields through the generated class, the payload appended as field ``data`` on the way out and
sliced as a ``memoryview`` on the way in; a peer on the generated stub interoperates
(tests/agent/test_wire.py checks both directions).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from typing import Any

from pallas_proto import pallas_pb2

_FIELDS = pallas_pb2.KVBlock.DESCRIPTOR.fields_by_name
DATA_FIELD = _FIELDS["data"].number
_WT_VARINT, _WT_I64, _WT_LEN, _WT_I32 = 0, 1, 2, 5


@dataclass(slots=True)
class Block:
    """One KV block as the agents handle it in process (the fields of ``pallas.v1.KVBlock``).

    Attributes:
        session_id: session the block belongs to.
        epoch: migration attempt; blocks of an older epoch are dropped by the target.
        block_index: index within the token sequence (token t lies in block t // block_size).
        fill: valid tokens in the block (block_size unless it is the tail).
        checksum: CRC-32C (RFC 3720 §B.4) of ``data``.
        data: the block's bytes, all layers (``bytes`` or a ``memoryview`` into the received
            message; either supports ``len`` and the buffer protocol).
    """

    session_id: str
    epoch: int
    block_index: int
    fill: int
    checksum: int
    data: bytes | memoryview


def _varint(n: int) -> bytes:
    """Base-128 varint of a non-negative int (protobuf encoding)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_DATA_TAG = _varint((DATA_FIELD << 3) | _WT_LEN)
_DATA_TAG_BYTE = _DATA_TAG[0]
assert len(_DATA_TAG) == 1  # field 6: a one-byte tag


def encode_block(blk: Any) -> bytes:
    """Serialise a block (a :class:`Block` or a ``pallas_pb2.KVBlock``) to KVBlock wire bytes.

    One copy of the payload (the final join). Raises ``ValueError`` for out-of-range header
    fields, as the generated class does.
    """
    data = blk.data
    head = pallas_pb2.KVBlock(session_id=blk.session_id, epoch=blk.epoch,
                              block_index=blk.block_index, fill=blk.fill,
                              checksum=blk.checksum).SerializeToString()
    if not len(data):
        return head  # proto3 leaves an empty bytes field out
    return b"".join((head, _DATA_TAG, _varint(memoryview(data).nbytes), data))


class _Slow(Exception):
    """The fast scan met something only protobuf's own parser decides (see decode_block)."""


def _read_varint(buf: bytes, i: int, end: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= end:
            raise _Slow
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise _Slow


def _decode_fast(buf: bytes) -> Block:
    """The zero-copy scan of :func:`decode_block`; raises :class:`_Slow` where it cannot decide."""
    end = len(buf)
    i = 0
    head: list[bytes] = []
    data: bytes | memoryview = b""
    while i < end:
        start = i
        if buf[i] == _DATA_TAG_BYTE:  # field 6, length-delimited, one-byte (canonical) tag
            n, i = _read_varint(buf, i + 1, end)
            if i + n > end:
                raise _Slow
            data = memoryview(buf)[i:i + n]
            i += n
            continue
        tag, i = _read_varint(buf, i, end)
        wt = tag & 7
        if tag >> 3 == DATA_FIELD or tag >> 3 == 0 or tag > 0xFFFFFFFF:
            raise _Slow  # a non-canonical tag of data, field 0 or an out-of-range tag
        if wt == _WT_VARINT:
            _, i = _read_varint(buf, i, end)
        elif wt == _WT_I64:
            i += 8
        elif wt == _WT_I32:
            i += 4
        elif wt == _WT_LEN:
            n, i = _read_varint(buf, i, end)
            i += n
        else:
            raise _Slow  # groups (wire types 3, 4) and the invalid wire types 6, 7
        if i > end:
            raise _Slow
        head.append(buf[start:i])
    h = pallas_pb2.KVBlock.FromString(b"".join(head))
    return Block(h.session_id, h.epoch, h.block_index, h.fill, h.checksum, data)


def decode_block(buf: bytes) -> Block:
    """Parse KVBlock wire bytes exactly as the generated ``pallas_pb2.KVBlock`` does.

    Accepts exactly the inputs ``pallas_pb2.KVBlock.FromString`` accepts and yields the same
    field values (any field order; repeated fields: the last wins; unknown fields of every wire
    type skipped, groups included; a field of a known number with another wire type is an
    unknown field). Fast path: one scan over the tags; the small header fields go through the
    generated class, ``data`` is a zero-copy ``memoryview`` of ``buf``. Anything the scan does
    not decide itself (a group, a truncated or overlong varint, a length past the end, field 0,
    an invalid wire type, a non-canonical tag of ``data``) is handed whole to the generated
    class, which either raises or decodes it (then ``data`` is ``bytes``, a copy). Checked by a
    differential test against the generated class (tests/agent/test_wire_differential.py).

    Raises:
        google.protobuf.message.DecodeError: where the generated class raises it.
    """
    try:
        return _decode_fast(buf)
    except _Slow:
        h = pallas_pb2.KVBlock.FromString(buf)
        return Block(h.session_id, h.epoch, h.block_index, h.fill, h.checksum, h.data)


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_malloc_for_blocks(mmap_threshold: int = 16 << 20, trim_threshold: int = 64 << 20) -> bool:
    """Keep KV-block-sized buffers in glibc's heap instead of fresh mmaps (call once at start).

    Every block on the stream passes through several short-lived buffers of the block's size
    (0.8-2.4 MB). glibc serves allocations above its mmap threshold with a fresh ``mmap`` and
    gives the pages back on free, so each buffer costs page faults and page zeroing; and a
    freed chunk at the top of the heap above the trim threshold is returned to the kernel, with
    the same effect. Raising both (as ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``
    would) keeps those buffers in the heap: measured on the 2-core dev host, the block stream's
    sender CPU per 786 KB block fell from about 1.7 ms to 0.75 ms (benchmarks/stream.py).
    The price is up to ``trim_threshold`` bytes of freed heap kept by the process.

    Args:
        mmap_threshold: bytes; allocations at least this large still use mmap.
        trim_threshold: bytes of free heap top kept before it is returned to the kernel.

    Returns:
        True if glibc accepted both settings; False on another libc (nothing changed).
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(
        mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)))
