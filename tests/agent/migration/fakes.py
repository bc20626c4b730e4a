"""Fakes of the migration engine's tests (tests/agent/migration/ and the agent tests that drive
a migration): a fake vLLM client, an engine around it and a BlockHub with no connector, request
and block builders, and a peer target served over real gRPC."""

from __future__ import annotations

import asyncio

import pytest
from pallas_proto import pallas_pb2 as pb

from agent.connector.messages import SchedHello
from agent.ipc import BlockHub, block_crc
from agent.migration import MigrationConfig, MigrationEngine
from agent.states import IllegalTransition
from agent.session import SamplingSpec, Session, SessionState, SessionStore
from agent.transfer import serve_peer_transfer

IDENT = pb.ModelIdentity(model="tiny", weights_digest="ab", dtype="float32",
                         kv_cache_dtype="auto", block_size=32, backend="cpu/CPU_ATTN/vec",
                         kv_bytes_per_token=2048, num_layers=2, block_bytes=65536)


class FakeVllmClient:
    def __init__(self, prefill_s: float = 0.0):
        self.prefill_s = prefill_s
        self.prefills: list[list[int]] = []
        self.started: list[tuple[Session, dict]] = []
        self.prefilling = 0          # warm-up prefills in flight
        self.prefilling_at_start: list[int] = []   # ... when each request started

    async def prefill(self, ids, **kw):
        self.prefills.append(list(ids))
        self.prefilling += 1
        try:
            await asyncio.sleep(self.prefill_s)
        finally:
            self.prefilling -= 1
        return {"prompt_tokens": len(ids), "prompt_tokens_details": {"cached_tokens": self.cached}}

    cached = 0

    def start(self, session, *, kv_transfer_params=None):
        self.started.append((session, kv_transfer_params))
        self.prefilling_at_start.append(self.prefilling)

    async def abort(self, session):
        pass


def _engine(free_blocks=1000, **cfg):
    hub = BlockHub()
    hub.sched_info = SchedHello(block_size=32, free_blocks=free_blocks)
    eng = FakeVllmClient()
    # generous RPC and commit bounds: a loaded host must not turn a success case into a timeout
    # (the deadline case sets its own, short one)
    kw = dict(claim_wait_s=0.05, resume_deadline_s=0.01, rpc_timeout_s=5.0, commit_deadline_s=10.0)
    kw.update(cfg)
    m = MigrationEngine(agent_id="b", peer_address="127.0.0.1:1", sessions=SessionStore(),
                        vllm_client=eng, hub=hub, identity=lambda: IDENT, config=MigrationConfig(**kw))
    return m, hub, eng


def _prep(epoch=1, prefix=64, model=IDENT, expected=1000, sid="s"):
    return pb.PrepareRequest(session_id=sid, epoch=epoch, model=model,
                             prefix_token_ids=list(range(prefix)), expected_kv_bytes=expected,
                             source=pb.PeerEndpoint(agent_id="a", address="x:1"))


def _blk(idx, epoch=1, data=b"\x01" * 16, crc=None, sid="s"):
    return pb.KVBlock(session_id=sid, epoch=epoch, block_index=idx, fill=32,
                      checksum=block_crc(data) if crc is None else crc, data=data)


def _serving(m, sid="s", n_prompt=40, outputs=(5, 6, 7), max_tokens=50):
    s = Session(sid, "ue", list(range(n_prompt)), SamplingSpec(max_tokens=max_tokens))
    s.set_state(SessionState.SERVING)
    s.append_tokens(list(outputs))
    m.ctx.sessions.add(s)
    return s


class Target:
    """A PeerTransfer handler: admits (or refuses) everything and records what it gets."""

    def __init__(self, refuse_prepare=False, sync_status=pb.STATUS_OK, progress=None,
                 sync_delay_s=0.0):
        self.sync_delay_s = sync_delay_s
        self.refuse_prepare = refuse_prepare
        self.sync_status = sync_status
        self.progress = progress
        self.calls: list[tuple[str, object]] = []

    async def on_prepare(self, req):
        self.calls.append(("prepare", req))
        if self.refuse_prepare:
            return pb.PrepareReply(status=pb.STATUS_REJECTED, model=IDENT, message="no KV memory")
        return pb.PrepareReply(status=pb.STATUS_OK, model=IDENT, free_kv_bytes=1 << 30)

    def on_block(self, blk, crc_ok=None):
        return "ok"

    async def on_sync(self, req):
        self.calls.append(("sync", req))
        await asyncio.sleep(self.sync_delay_s)
        return pb.SyncReply(status=self.sync_status, reused_tokens=40, blocks_received=1,
                            bytes_received=65536, message="" if self.sync_status == pb.STATUS_OK
                            else "resume failed")

    async def on_release(self, req):
        self.calls.append(("release", req))
        return pb.ReleaseReply(status=pb.STATUS_OK)

    async def on_progress(self, req):
        self.calls.append(("progress", req))
        return self.progress or pb.ProgressReply(status=pb.STATUS_OK, warmup_done=True)

    def ops(self):
        return [c[0] for c in self.calls]


async def _served(handler):
    server, addr = await serve_peer_transfer(handler, "127.0.0.1:0")
    return server, pb.PeerEndpoint(agent_id="t", address=addr)


# ------------------------------------------------------------------ states and vocabulary

def walk_table(states, table, terminal, check_fn, allowed=lambda a, b: False) -> None:
    """Every state reaches a terminal one; every move of ``table`` (or ``allowed``) passes
    ``check_fn``, every other raises IllegalTransition."""
    for a in states:
        for b in states:
            if b in table[a] or allowed(a, b):
                assert check_fn(a, b) is b
            else:
                with pytest.raises(IllegalTransition):
                    check_fn(a, b)
        seen, todo = set(), [a]
        while todo:
            x = todo.pop()
            seen.add(x)
            todo += [y for y in table[x] if y not in seen]
        assert seen & terminal, a
