"""Fault-injecting test doubles for the agent (kept out of the product).

- :class:`UncheckedStore`: a block store that skips the CRC-32C check (the negative control of
  the end-to-end checksum tests: what a path without checksums would accept).
- :func:`corrupt_outgoing`: makes a migration engine zero the data of chosen blocks after their
  checksum was taken (the target must catch them).
"""

from __future__ import annotations

from agent.ipc import BlockStore, block_crc
from agent.migration import MigrationEngine
from agent.wire import Block


class UncheckedStore(BlockStore):
    """Stores every block as received, its checksum recomputed from the data."""

    def put(self, sid, epoch, idx, fill, crc, data, crc_ok=None):
        return super().put(sid, epoch, idx, fill, block_crc(data), data, True)


def corrupt_outgoing(engine: MigrationEngine, blocks: set[tuple[str, int]]) -> None:
    """From now on ``engine`` sends zeroed data for each (session_id, block_index) in
    ``blocks`` (a live set: add or clear entries while it runs), with the original checksum."""
    orig = engine._outgoing

    def outgoing(out, blk) -> Block:
        b = orig(out, blk)
        if (b.session_id, b.block_index) in blocks:
            b = Block(b.session_id, b.epoch, b.block_index, b.fill, b.checksum, bytes(len(b.data)))
        return b

    engine._outgoing = outgoing
