"""Block-stream goodput and source ITL figures for issue 2.

Prints:
0. two references with no agent code: gRPC's ceiling on this host (prebuilt KVBlock bytes
   through grpc.aio on both sides, nothing behind) and the same stream through the generated
   protobuf classes, which copy the payload in and out of the message (what the agents used
   before agent/wire.py).
1. goodput of the PeerTransfer block stream on loopback, without a limit (target >= 1 GB/s)
   and with a 300 Mbit/s token-bucket limit (target >= 90 % of it). The receiver is a real
   PeerTransferService in its own process whose handler checks every block's CRC-32C and keeps
   it in a BlockStore (the target agent's data path); the sender is a PeerClient in this
   process. Blocks are the 152M model's whole KV blocks (12 layers x 2 x 4 KV heads x 32
   tokens x 64 dims x fp32 = 786,432 B) unless --block-bytes says otherwise. Each line also
   gives the CPU time (user + system, all threads) per block of the sending and the receiving
   process: on a host where both ends share few CPUs their sum, not the network, sets the rate.
2. (--itl) the source's inter-token latency (vLLM's own histogram) with and without an active
   suffix stream: two vLLM CPU servers with the Pallas connector, the source's on a CPU of its
   own, one session decoding at A alone, with A's connector copying out every completed block
   (no target), with a real Trigger and stream to B, and a control with B's prefill only.

Usage:
    .venv/agent/bin/python benchmarks/stream.py [--blocks 400] [--itl] [--model tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

from pallas_proto import pallas_pb2, pallas_pb2_grpc  # noqa: E402

from agent.ipc import BlockStore, block_crc  # noqa: E402
from agent.transfer import PeerClient, serve_peer_transfer  # noqa: E402
from agent.wire import Block, tune_malloc_for_blocks  # noqa: E402


WARMUP_BLOCKS = 32  # blocks sent on a connection before it is measured


class _SinkHandler:
    """Target handler for the goodput test: verify and store, then forget the session."""

    def __init__(self) -> None:
        self.store = BlockStore()

    async def on_prepare(self, req):
        return pallas_pb2.PrepareReply(status=pallas_pb2.STATUS_OK)

    def on_block(self, blk, crc_ok=None):
        v = self.store.put(blk.session_id, blk.epoch, blk.block_index, blk.fill, blk.checksum,
                           blk.data, crc_ok)
        if self.store.num_blocks > 64:
            self.store.drop(blk.session_id)
        return v

    async def on_sync(self, req):
        return pallas_pb2.SyncReply(status=pallas_pb2.STATUS_OK)

    async def on_release(self, req):
        return pallas_pb2.ReleaseReply(status=pallas_pb2.STATUS_OK)


class _BareSink(pallas_pb2_grpc.PeerTransferServicer):
    """StreamBlocks with nothing behind it (counts bytes): the reference for the agents' figure."""

    async def StreamBlocks(self, request_iterator, context):  # noqa: N802 (gRPC names)
        n = nbytes = 0
        async for blk in request_iterator:
            n += 1
            nbytes += len(blk) if isinstance(blk, bytes) else len(blk.data)
        return pallas_pb2.StreamAck(blocks_received=n, bytes_received=nbytes)


def _identity(b: bytes) -> bytes:
    return b


def _serve_bare(port_q, raw: bool) -> None:
    """A bare StreamBlocks server: messages as raw bytes (raw) or parsed by the generated class."""
    import grpc

    from agent.transfer import GRPC_OPTIONS, STREAM_BLOCKS_METHOD

    tune_malloc_for_blocks()

    async def main():
        server = grpc.aio.server(options=GRPC_OPTIONS)
        if raw:
            h = grpc.stream_unary_rpc_method_handler(
                _BareSink().StreamBlocks, request_deserializer=_identity,
                response_serializer=pallas_pb2.StreamAck.SerializeToString)
            service = STREAM_BLOCKS_METHOD.split("/")[1]
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, {"StreamBlocks": h}),))
        else:
            pallas_pb2_grpc.add_PeerTransferServicer_to_server(_BareSink(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_q.put(f"127.0.0.1:{port}")
        await server.wait_for_termination()
    asyncio.run(main())


async def bare_goodput(address: str, *, n_blocks: int, block_bytes: int, raw: bool,
                       rounds: int) -> list[float]:
    """Bytes/s of ``rounds`` StreamBlocks calls (after a warm-up call) with no agent code.

    raw: the message is a prebuilt bytes object on both sides (gRPC's own cost only);
    otherwise the generated protobuf class serialises and parses it.
    """
    import grpc

    from agent.transfer import GRPC_OPTIONS, STREAM_BLOCKS_METHOD

    blk = pallas_pb2.KVBlock(session_id="bench", epoch=1, block_index=0, fill=32, checksum=0,
                             data=os.urandom(block_bytes))
    item = blk.SerializeToString() if raw else blk

    async def gen(k):
        for _ in range(k):
            yield item
    async with grpc.aio.insecure_channel(address, options=GRPC_OPTIONS) as ch:
        if raw:
            call = ch.stream_unary(STREAM_BLOCKS_METHOD, request_serializer=_identity,
                                   response_deserializer=pallas_pb2.StreamAck.FromString)
        else:
            call = pallas_pb2_grpc.PeerTransferStub(ch).StreamBlocks
        await call(gen(WARMUP_BLOCKS))
        rates = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            ack = await call(gen(n_blocks))
            rates.append(ack.bytes_received / (time.perf_counter() - t0))
        return rates


def _serve(port_q, tls_files=None) -> None:
    """A PeerTransferService with the sink handler; ``tls_files``: a pallas_common.tls TlsFiles
    (mutual TLS, every identity of the CA admitted), None: plaintext."""
    tune_malloc_for_blocks()  # as pallas-agent does at start

    async def main():
        from pallas_common.tls import LinkSecurity

        security = LinkSecurity(tls_files) if tls_files else None
        server, addr = await serve_peer_transfer(
            _SinkHandler(), "127.0.0.1:0",
            credentials=security.server_credentials() if security else None,
            interceptors=(security.interceptors({"pallas.v1.PeerTransfer": ["*"]})
                          if security else ()))
        port_q.put(addr)
        await server.wait_for_termination()
    asyncio.run(main())


async def goodput(address: str, *, n_blocks: int, block_bytes: int,
                  rate_mbps: float | None, rounds: int = 1,
                  channel_factory=None) -> tuple[list[float], int]:
    """``rounds`` streams of n_blocks through one PeerClient after a warm-up stream
    (``channel_factory``: PeerClient's).

    Returns (goodput of each round, bytes/s; blocks rejected in all).
    """
    client = PeerClient(address, link_rate_mbps=rate_mbps, channel_factory=channel_factory)
    data = os.urandom(block_bytes)
    crc = block_crc(data)
    blocks = [Block("bench", 1, i, 32, crc, data) for i in range(n_blocks)]
    # Warm the connection up (gRPC grows its flow-control windows as it measures the link).
    warm = client.open_stream("warm", 1)
    for b in blocks[:WARMUP_BLOCKS if rate_mbps is None else 1]:
        warm.send(b)
    await warm.finish()
    rates, rejected = [], 0
    for r in range(rounds):
        stream = client.open_stream("bench", r + 1)
        t0 = time.perf_counter()
        for b in blocks:
            stream.send(b)
        ack = await stream.finish()
        dt = time.perf_counter() - t0
        assert ack is not None and ack.blocks_received + ack.blocks_rejected == n_blocks, ack
        rates.append(ack.bytes_received / dt)
        rejected += ack.blocks_rejected
    await client.close()
    return rates, rejected


def _in_server(target, run):
    """Run ``run(address)`` against a server process started with ``target(port_q)``.

    Returns (run's result, sender CPU s, receiver CPU s): CPU time (user + system, all threads)
    of this process and of the server process over the run.
    """
    import psutil

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=target, args=(q,), daemon=True)
    proc.start()
    try:
        addr = q.get(timeout=60)
        me, peer = psutil.Process(), psutil.Process(proc.pid)
        c0, s0 = sum(me.cpu_times()[:2]), sum(peer.cpu_times()[:2])
        out = run(addr)
        c1, s1 = sum(me.cpu_times()[:2]), sum(peer.cpu_times()[:2])
        return out, c1 - c0, s1 - s0
    finally:
        proc.terminate()
        proc.join(5)


def _spread(rates: list[float], scale: float) -> str:
    return (f"{statistics.median(rates) * scale:6.3f}"
            + (f" (range {min(rates) * scale:.3f}-{max(rates) * scale:.3f})" if len(rates) > 1 else ""))


def run_goodput(n_blocks: int, block_bytes: int, rounds: int) -> None:
    """Print the references, the agents' goodput without a limit and under 300 Mbit/s.

    Unlimited figures are the median of ``rounds`` streams on one warmed-up connection.
    """
    tune_malloc_for_blocks()  # as pallas-agent does at start
    sent = WARMUP_BLOCKS + rounds * n_blocks
    for raw, what in ((True, "gRPC ceiling, raw     "), (False, "generated stub        ")):
        rates, cs, cr = _in_server(
            functools.partial(_serve_bare, raw=raw),
            lambda a: asyncio.run(bare_goodput(a, n_blocks=n_blocks, block_bytes=block_bytes,
                                               raw=raw, rounds=rounds)))
        note = ("prebuilt message bytes through grpc.aio, nothing behind: what this host allows"
                if raw else "the same through the generated protobuf classes, which copy the payload")
        print(f"{what}: {_spread(rates, 1e-9)} GB/s  CPU/block sender {1e6 * cs / sent:4.0f} us, "
              f"receiver {1e6 * cr / sent:4.0f} us  ({note})")
    (rates, rej), cs, cr = _in_server(
        _serve, lambda a: asyncio.run(goodput(a, n_blocks=n_blocks, block_bytes=block_bytes,
                                              rate_mbps=None, rounds=rounds)))
    print(f"goodput, no limit     : {_spread(rates, 1e-9)} GB/s  CPU/block sender "
          f"{1e6 * cs / sent:4.0f} us, receiver {1e6 * cr / sent:4.0f} us  ({rounds} x "
          f"{n_blocks} blocks of {block_bytes} B, rejected {rej}; both ends share this host's "
          f"{os.cpu_count()} CPUs)  target >= 1 GB/s")
    limit = 300.0
    n_lim = max(20, int(limit * 1e6 / 8 * 4 / block_bytes))  # about 4 s of traffic
    (rates, rej), _, _ = _in_server(
        _serve, lambda a: asyncio.run(goodput(a, n_blocks=n_lim, block_bytes=block_bytes,
                                              rate_mbps=limit)))
    gp = rates[0]
    print(f"goodput, {limit:.0f} Mbit/s : {gp * 8 / 1e6:6.1f} Mbit/s = "
          f"{100 * gp * 8 / 1e6 / limit:5.1f} % of the limit ({n_lim} blocks)  "
          f"target >= 90 %")


async def _vllm_itl_counters(base_url: str) -> tuple[float, float]:
    """(sum seconds, count) of vLLM's own ``vllm:inter_token_latency_seconds`` histogram.

    vLLM times every output token in its engine core, so this mean is the engine's ITL,
    untouched by how fast the agent's event loop reads the stream.
    """
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{base_url}/metrics")).text
    total = count = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:inter_token_latency_seconds":
            for smp in fam.samples:
                if smp.name.endswith("_sum"):
                    total += smp.value
                elif smp.name.endswith("_count"):
                    count += smp.value
    return total, count


def _isolate_source(sa, sb) -> None:
    """Give the source server's processes CPU 0 and everything else (target server, both
    agents, this harness) the other CPUs, as on a deployment where source and target are
    different machines and the agent has its own cores: what the source's ITL then shows is
    what the stream costs the source, not what the target and the harness take from it."""
    import psutil

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("one CPU: the source is not isolated")
        return
    src, rest = cpus[:1], cpus[1:]

    def pin(pid: int, which: list[int]) -> None:
        p = psutil.Process(pid)
        for q in [p, *p.children(recursive=True)]:
            try:
                for t in q.threads():
                    os.sched_setaffinity(t.id, which)
            except (psutil.Error, OSError):
                pass
    pin(sa.proc.pid, src)
    pin(sb.proc.pid, rest)
    pin(os.getpid(), rest)
    print(f"source vLLM on CPU {src}, target vLLM, agents and harness on CPUs {rest}")


async def _itl(model_name: str, n_tokens: int, prompt_len: int, rounds: int = 3) -> None:
    from pallas_eval.models import build_model
    from agent.app import Agent as AgentNode, AgentConfig
    from agent.server import ServerConfig, VLLMServer
    from agent.session import SamplingSpec, Session

    model = str(build_model(model_name))
    a, b = AgentNode(AgentConfig(agent_id="a", model=model, host="127.0.0.1", peer_port=0, vllm_url="-")), AgentNode(AgentConfig(agent_id="b", model=model, host="127.0.0.1", peer_port=0, vllm_url="-"))
    await a.start_core()
    await b.start_core()
    sa = VLLMServer(ServerConfig(model=model, agent_address=a.hub.address, omp_threads_bind="0"))
    sb = VLLMServer(ServerConfig(model=model, agent_address=b.hub.address, omp_threads_bind="1"))
    sa.start()
    sb.start()
    try:
        await a.attach(sa.base_url)
        await b.attach(sb.base_url)
        _isolate_source(sa, sb)
        # Mean ITL per run from vLLM's own ITL histogram at A (engine-core timestamps): the
        # agents' event loop (both agents share this process) cannot blur it. Runs alternate.
        # Four modes, rotated per round, each run with its own prompt (no prefix-cache hit):
        #   alone     the session decodes at A, nothing else;
        #   export    A's connector copies out every completed block of it (the source's whole
        #             share of a suffix stream: copy, CRC-32C, local channel), no target;
        #   streaming the real thing: Trigger to B (B prefills the prefix), blocks streamed;
        #   target    control: B runs the same prefix prefill with no migration at all.
        # On a deployment source and target are different machines; here they share one VM,
        # so "target" shows what the target's engine alone takes from the source.
        modes = ["alone", "export", "streaming", "target"]
        results: dict[str, list[float]] = {m: [] for m in modes}
        for rnd in range(rounds):
            for k, mode in enumerate(modes[rnd % 4:] + modes[:rnd % 4]):
                prompt = [3 + (i * 7 + 13 * (10 * rnd + k)) % 1900 for i in range(prompt_len)]
                s = Session(uuid.uuid4().hex, "ue", prompt,
                            SamplingSpec(max_tokens=n_tokens, ignore_eos=True))
                sum0, n0 = await _vllm_itl_counters(sa.base_url)
                a.sessions.add(s)
                a.vllm_client.start(s)
                await s.wait_tokens(4)
                if mode == "streaming":
                    rep = await a.migration.trigger(s.session_id, 1, b.endpoint, split_tokens=32)
                    assert rep.status == pallas_pb2.STATUS_OK, rep
                elif mode == "export":
                    a.hub.export(s.session_id, 1, 1, stream=True, tail=False)
                elif mode == "target":
                    await b.vllm_client.prefill(prompt[:32])
                await s._task
                await asyncio.sleep(1.0)  # vLLM publishes its stats about once a second
                sum1, n1 = await _vllm_itl_counters(sa.base_url)
                if n1 - n0 < n_tokens // 2:
                    raise RuntimeError(f"vLLM counted {n1 - n0} inter-token gaps for {n_tokens} tokens")
                results[mode].append((sum1 - sum0) / (n1 - n0))
                if mode == "streaming":
                    await a.migration.cancel(s.session_id, 2)
                elif mode == "export":
                    a.hub.stop_export(s.session_id)
        m0 = statistics.mean(results["alone"])
        print(f"source ITL ({model_name}, {prompt_len}-token prompt, {n_tokens} tokens, "
              f"{rounds} rotated runs each; vLLM's own inter-token latency at A):")
        for m in modes:
            mean = statistics.mean(results[m])
            note = {"export": "  <- the source's cost of streaming; target <= +5 %",
                    "target": "  <- control: the target's prefill alone, no migration"}.get(m, "")
            print(f"  {m:9s} : mean {1e3 * mean:7.2f} ms  ({100 * (mean / m0 - 1):+5.1f} %)  "
                  f"runs {[round(1e3 * x, 2) for x in results[m]]}{note}")
        print(f"  blocks copied out at A: {a.hub.blocks_in}, bytes {a.hub.bytes_in}")
    finally:
        await a.stop()
        await b.stop()
        sa.stop()
        sb.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=400)
    ap.add_argument("--block-bytes", type=int, default=786_432)
    ap.add_argument("--itl", action="store_true", help="also measure the source ITL (vLLM)")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--itl-tokens", type=int, default=400)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--no-goodput", action="store_true")
    ap.add_argument("--goodput-rounds", type=int, default=3,
                    help="measured streams per unlimited goodput figure (median printed)")
    args = ap.parse_args()
    if not args.no_goodput:
        run_goodput(args.blocks, args.block_bytes, args.goodput_rounds)
    if args.itl:
        asyncio.run(_itl(args.model, args.itl_tokens, args.prompt, args.rounds))


if __name__ == "__main__":
    main()
