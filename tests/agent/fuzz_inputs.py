"""Hypothesis strategies for the agent's input parsers: KVBlock wire bytes and front open bodies.

Shared by the fixed-budget tests (tests/agent/test_wire_differential.py,
tests/agent/test_front_requests.py) and the long run by hand (benchmarks/fuzz.py).

KVBlock (``pallas.v1.KVBlock``, protobuf encoding): messages built field by field over every
wire type (varint, fixed64, length-delimited, start/end group, fixed32, and the invalid 6/7),
known field numbers with their own and with foreign wire types, unknown numbers up to 2^29 - 1,
groups nested and sometimes closed by the wrong end-group, varints padded non-canonically; and
mutants of valid messages (byte flips, insertions, deletions, truncations, appended fields).

Front (``POST /v1/sessions`` bodies, agent/frontend.py): JSON objects whose fields take valid
values, values of the wrong JSON type, out-of-range numbers, huge integers, unknown fields.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from pallas_proto import pallas_pb2 as pb

KNOWN = [1, 2, 3, 4, 5, 6]
FIELD_NUMBERS = st.one_of(st.sampled_from(KNOWN), st.sampled_from([7, 15, 16, 100, 2047]),
                          st.integers(1, 2**29 - 1))


def varint(n: int, pad: int = 0) -> bytes:
    """Base-128 varint of ``n`` (n >= 0), padded with ``pad`` redundant groups (non-canonical)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    if pad:
        out[-1] |= 0x80
        out += b"\x80" * (pad - 1) + b"\x00"
    return bytes(out)


@st.composite
def _varint(draw, lo: int = 0, hi: int = 2**64 - 1) -> bytes:
    pad = draw(st.sampled_from([0] * 8 + [1, 2, 5]))
    return varint(draw(st.integers(lo, hi)), pad)


def _tag(num: int, wt: int) -> int:
    return (num << 3) | wt


@st.composite
def wire_field(draw, depth: int = 0) -> bytes:
    """One field of any wire type (a group holds 0-3 fields, nested up to depth 3)."""
    num = draw(FIELD_NUMBERS)
    kinds = ["varint", "i64", "len", "i32"] + (["group"] if depth < 3 else []) + ["bad"]
    kind = draw(st.sampled_from(kinds))
    if kind == "varint":
        return varint(_tag(num, 0)) + draw(st.one_of(_varint(), _varint(2**64, 2**70 - 1)))
    if kind == "i64":
        return varint(_tag(num, 1)) + draw(st.binary(min_size=8, max_size=8))
    if kind == "i32":
        return varint(_tag(num, 5)) + draw(st.binary(min_size=4, max_size=4))
    if kind == "len":
        body = draw(st.one_of(st.text(max_size=12).map(lambda t: t.encode()), st.binary(max_size=40)))
        return varint(_tag(num, 2)) + varint(len(body), draw(st.sampled_from([0, 0, 0, 1]))) + body
    if kind == "group":
        inner = b"".join(draw(st.lists(wire_field(depth + 1), max_size=3)))
        end = num if draw(st.integers(0, 9)) else draw(FIELD_NUMBERS)  # sometimes mismatched
        return varint(_tag(num, 3)) + inner + varint(_tag(end, 4))
    return varint(_tag(num, draw(st.sampled_from([4, 6, 7]))))  # stray end-group, invalid types


@st.composite
def valid_kvblock(draw) -> bytes:
    """A KVBlock as the generated class writes it."""
    return pb.KVBlock(session_id=draw(st.text(max_size=20)), epoch=draw(st.integers(0, 2**64 - 1)),
                      block_index=draw(st.integers(0, 2**32 - 1)), fill=draw(st.integers(0, 2**32 - 1)),
                      checksum=draw(st.integers(0, 2**32 - 1)),
                      data=draw(st.binary(max_size=200))).SerializeToString()


@st.composite
def kvblock_messages(draw) -> bytes:
    """A sequence of fields: valid KVBlocks and single fields of any wire type, in any order."""
    parts = draw(st.lists(st.one_of(valid_kvblock(), wire_field()), max_size=6))
    return b"".join(parts)


@st.composite
def kvblock_mutants(draw) -> bytes:
    """A generated message after 1-4 byte-level mutations (flip, insert, delete, truncate, append)."""
    buf = bytearray(draw(st.one_of(valid_kvblock(), kvblock_messages())))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "append"]))
        if op == "append":
            buf += draw(wire_field())
        elif not buf:
            buf += draw(st.binary(min_size=1, max_size=4))
        elif op == "flip":
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] ^= draw(st.integers(1, 255))
        elif op == "insert":
            buf.insert(draw(st.integers(0, len(buf))), draw(st.integers(0, 255)))
        elif op == "delete":
            del buf[draw(st.integers(0, len(buf) - 1))]
        else:
            del buf[draw(st.integers(0, len(buf) - 1)):]
    return bytes(buf)


# ---------------------------------------------------------------------------------- front
_JSON_ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                         | st.text(max_size=8),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                         max_leaves=6)
_INT_LIKE = st.one_of(st.integers(-3, 5000), st.integers(), st.integers(-2**70, 2**70), st.floats(),
                      st.text(max_size=6), st.booleans(), st.none(), st.just([]))
_FLOAT_LIKE = st.one_of(st.floats(-3, 3), st.floats(), st.integers(-5, 5), st.text(max_size=6),
                        st.booleans(), st.none())
_TOKEN_IDS = st.one_of(st.lists(st.integers(0, 3000), min_size=1, max_size=20),
                       st.lists(st.one_of(st.integers(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=3),
                                          st.booleans()), max_size=6),
                       st.text(max_size=10), st.none(), st.integers())
FRONT_FIELDS: dict[str, Any] = {
    "prompt_token_ids": _TOKEN_IDS, "prompt": _TOKEN_IDS,
    "max_tokens": _INT_LIKE, "min_tokens": _INT_LIKE, "top_k": _INT_LIKE, "seed": _INT_LIKE,
    "temperature": _FLOAT_LIKE, "top_p": _FLOAT_LIKE,
    "stop_token_ids": _TOKEN_IDS, "ignore_eos": st.one_of(st.booleans(), _JSON_ANY),
    "stream": st.one_of(st.booleans(), _JSON_ANY),
    "scheme": st.one_of(st.sampled_from(["pallas", "full-copy", "ctho", "detour", "warp", ""]), _JSON_ANY),
    "session_id": st.one_of(st.from_regex(r"[A-Za-z0-9._-]{1,70}", fullmatch=True), st.text(max_size=80), _JSON_ANY),
    "ue_id": st.one_of(st.text(max_size=80), _JSON_ANY),
}


@st.composite
def front_bodies(draw) -> Any:
    """An open-request body: mostly objects with some of the fields above, sometimes any JSON."""
    if draw(st.integers(0, 19)) == 0:
        return draw(_JSON_ANY)
    names = draw(st.lists(st.sampled_from(sorted(FRONT_FIELDS)), unique=True, max_size=len(FRONT_FIELDS)))
    body = {k: draw(FRONT_FIELDS[k]) for k in names}
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(max_size=6))] = draw(_JSON_ANY)  # an unknown field
    return body


@st.composite
def front_raw_bodies(draw) -> bytes:
    """Open-request bodies as bytes: JSON of :func:`front_bodies`, sometimes mutated byte-wise
    (a flip, insertion or cut) or prefixed with deep nesting."""
    raw = bytearray(json.dumps(draw(front_bodies())).encode())
    kind = draw(st.sampled_from(["json"] * 6 + ["flip", "insert", "cut", "nest"]))
    if kind == "flip" and raw:
        raw[draw(st.integers(0, len(raw) - 1))] ^= draw(st.integers(1, 255))
    elif kind == "insert":
        raw.insert(draw(st.integers(0, len(raw))), draw(st.sampled_from(list(b'{}[]",:\\0-9eE+.\xff'))))
    elif kind == "cut" and raw:
        del raw[draw(st.integers(0, len(raw) - 1)):]
    elif kind == "nest":
        depth = draw(st.integers(1, 5000))
        raw = bytearray(b'{"prompt_token_ids": ' + b"[" * depth + b"1" + b"]" * depth + b"}")
    return bytes(raw)
