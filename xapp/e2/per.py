"""Primitives of the hand-written PER walkers (ITU-T X.691): aligned length determinants and an
unaligned bit reader. A walker raises :class:`Unsupported` for anything outside the shapes it
reads (a fragmented length, an unknown extension, truncation); its caller then decodes the same
bytes with the reference decoder (pycrate or asn1tools), so a walker can only be faster, never
different (tests compare both on generated PDUs).
"""

from __future__ import annotations


class Unsupported(Exception):
    """The walker does not cover this PDU; decode it with the reference decoder instead."""


def alen(b: bytes, i: int) -> tuple[int, int]:
    """Aligned-PER length determinant at octet ``i`` (X.691 clause 11.9.3.6-7) -> (length, next
    octet). Fragmented lengths (>= 16K) are Unsupported."""
    if i >= len(b):
        raise Unsupported("truncated length")
    x = b[i]
    if x < 0x80:
        return x, i + 1
    if x < 0xC0:
        if i + 1 >= len(b):
            raise Unsupported("truncated length")
        return ((x & 0x3F) << 8) | b[i + 1], i + 2
    raise Unsupported("fragmented length")


def octs_value(v: bytes) -> bytes:
    """An open-type value holding one unconstrained OCTET STRING -> its octets."""
    n, j = alen(v, 0)
    if j + n != len(v):
        raise Unsupported("OCTET STRING length mismatch")
    return v[j:]


class Bits:
    """Unaligned-PER bit reader over ``b`` (most significant bit first)."""

    __slots__ = ("v", "n", "p")

    def __init__(self, b: bytes) -> None:
        self.v = int.from_bytes(b, "big")
        self.n = 8 * len(b)
        self.p = 0

    def read(self, k: int) -> int:
        """The next ``k`` bits as an unsigned integer."""
        p = self.p + k
        if p > self.n:
            raise Unsupported("truncated")
        self.p = p
        return (self.v >> (self.n - p)) & ((1 << k) - 1)

    def length(self) -> int:
        """An unconstrained length determinant (X.691 clause 11.9.4.2), unfragmented."""
        if self.read(1) == 0:
            return self.read(7)
        if self.read(1) == 0:
            return self.read(14)
        raise Unsupported("fragmented length")

    def octets(self, k: int) -> bytes:
        """The next ``k`` octets (not aligned)."""
        return self.read(8 * k).to_bytes(k, "big") if k else b""

    def align(self) -> None:
        """Skip to the next octet boundary (aligned PER)."""
        self.p = (self.p + 7) & ~7
        if self.p > self.n:
            raise Unsupported("truncated")
