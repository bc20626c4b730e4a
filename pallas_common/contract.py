"""Facts of the wire contract (proto/pallas_proto/pallas.proto) that both deployables use."""

from __future__ import annotations

# ControlReply fields in which a Commit's reply says what the handover moved (0 when nothing
# migrated): KV blocks and bytes the target accepted, tokens it reused and recomputed.
COMMIT_MOVED_FIELDS = ("blocks_moved", "kv_bytes_moved", "reused_tokens", "recomputed_tokens")


def commit_choice_of(reply) -> dict:
    """The commit-time choice a Commit's ``ControlReply`` carries (docs/model.md §8), as
    {field: value} for the xApp's event log: the option taken, each option's expected SIT (s)
    and what the source observed; {} when the reply has none (nothing to choose)."""
    if reply is None or not reply.HasField("choice"):
        return {}
    return {f.name: v for f, v in reply.choice.ListFields()}
