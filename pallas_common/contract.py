"""Facts of the wire contract (proto/pallas_proto/pallas.proto) that both deployables use."""

from __future__ import annotations

# ControlReply fields in which a Commit's reply says what the handover moved (0 when nothing
# migrated): KV blocks and bytes the target accepted, tokens it reused and recomputed.
COMMIT_MOVED_FIELDS = ("blocks_moved", "kv_bytes_moved", "reused_tokens", "recomputed_tokens")
