"""Resident sessions' inter-token latency at a target vLLM while migrations' loads come in.

One real vLLM CPU server (the e2e tests' tiny random-weight fp32 Llama, pallas_eval/models.py)
with the Pallas connector (paced to a real model's step period as the e2e tests do, unless
``--no-pace``: pallas_eval/emulated_connector.py, which keeps the product's load path) and its
agent's block hub (in this process). ``--residents``
sessions decode there without pause. Then ``--loads`` times, a resumed request arrives as at a
Pallas commit: ``--blocks`` received blocks of a fresh session are put in the agent's store
first (random bytes with a matching CRC-32C: their content does not matter here), the request
(prompt ``32 * blocks + 1`` tokens, ``kv_transfer_params`` as the agent's resume sends,
docs/vllm.md §3.3) claims them all and the connector loads them (docs/vllm.md §3.2). The load
window of one load runs from sending the request to its first token. ``--fetch-delay-ms``
makes the agent answer a fetch that many ms per block later (a slow agent; the knob is here,
in the harness, not in the product).

Each resident inter-token interval that overlaps a load window counts as "during load", the
rest as "outside"; p50/p90/p99 in ms of both, with the CPU time of the vLLM processes and of
this one and the machine load (/proc/loadavg) beside them. Last line::

    resident_itl: p99 during load <X> ms (outside <Y> ms), <N> loads of <B> blocks

Usage (takes the bench and vLLM locks, as docs say of timed runs that start vLLM):
    flock /tmp/pallas-bench.lock flock /tmp/pallas-vllm.lock \\
        .venv/agent/bin/python benchmarks/resident_itl.py [--residents 3] [--loads 8]
        [--blocks 96] [--fetch-delay-ms 2] [--gap-s 1.5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

from agent.app import Agent, AgentConfig  # noqa: E402
from agent.connector.link import block_crc  # noqa: E402
from agent.connector.messages import Fetch  # noqa: E402
from agent.server import ServerConfig, VLLMServer  # noqa: E402
from agent.session import SamplingSpec, Session  # noqa: E402
from benchmarks.soak import _cpu_s  # noqa: E402
from pallas_eval.emulation import E2E_PACE, server_settings  # noqa: E402
from pallas_eval.models import build_model  # noqa: E402

BS = 32


def pct(xs: list[float], q: float) -> float:
    """The ``q``-quantile (0..1, nearest rank) of ``xs``; NaN if empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def slow_fetches(agent: Agent, per_block_s: float) -> None:
    """Make the agent's hub answer each fetch ``per_block_s`` per block later (harness only)."""
    if per_block_s <= 0:
        return
    handle = agent.hub._handle

    async def delayed(ident, msg, payload):
        if isinstance(msg, Fetch):
            await asyncio.sleep(per_block_s * len(msg.blocks))
        await handle(ident, msg, payload)

    agent.hub._handle = delayed


def record_reports(agent: Agent) -> dict[str, list]:
    """Keep the connector's claim and loaded reports by session id (and pass them on)."""
    seen: dict[str, list] = {}
    for attr in ("on_claim", "on_loaded"):
        inner = getattr(agent.hub, attr)

        def rec(msg, inner=inner):
            seen.setdefault(msg.sid, []).append(msg)
            if inner is not None:
                inner(msg)

        setattr(agent.hub, attr, rec)
    return seen


async def one_load(agent: Agent, rng: random.Random, blocks: int) -> tuple[str, float, float]:
    """Plant ``blocks`` blocks of a new session and resume a request that claims them; returns
    (session id, window start, window end: its first token)."""
    sid = uuid.uuid4().hex
    nbytes = int(agent.hub.worker_info.block_bytes)
    data = rng.randbytes(nbytes)
    crc = block_crc(data)
    for i in range(blocks):
        assert agent.hub.put_block(sid, 1, i, BS, crc, data) == "ok"
    prompt = [rng.randrange(3, 2000) for _ in range(BS * blocks + 1)]
    s = Session(sid, "ue", prompt, SamplingSpec(max_tokens=2, ignore_eos=True))
    load = {"epoch": 1, "prefix_len": 0, "first_block": 0, "last_block": blocks - 1,
            "deadline": time.time() + 30.0}
    t0 = time.time()
    agent.vllm_client.start(s, kv_transfer_params={"pallas": {"load": load}})
    await s.wait_tokens(1, 120)
    t1 = s.token_times[0]
    await s.wait_tokens(2, 120)
    agent.hub.drop(sid)
    return sid, t0, t1


async def main_async(args) -> None:
    model = str(build_model("tiny"))
    agent = Agent(AgentConfig(agent_id="itl", model=model, host="127.0.0.1", peer_port=0,
                              vllm_url="-", insecure=True))
    await agent.start_core()
    paced = server_settings(*E2E_PACE) if args.pace else {}
    srv = VLLMServer(ServerConfig(model=model, agent_address=agent.hub.address,
                                  omp_threads_bind=args.omp_bind, kv_cache_gib=1.0,
                                  max_model_len=max(4096, BS * args.blocks + 64), **paced))
    srv.start()
    try:
        await agent.attach(srv.base_url, 900)
        slow_fetches(agent, args.fetch_delay_ms / 1000.0)
        reports = record_reports(agent)
        rng = random.Random(7)
        residents = []
        for _ in range(args.residents):
            s = Session(uuid.uuid4().hex, "ue", [rng.randrange(3, 2000) for _ in range(100)],
                        SamplingSpec(max_tokens=3500, ignore_eos=True))
            agent.sessions.add(s)
            agent.vllm_client.start(s)
            residents.append(s)
        for s in residents:
            await s.wait_tokens(20, 120)
        await one_load(agent, rng, args.blocks)          # warm-up load, not counted
        await asyncio.sleep(args.gap_s)
        load0, cpu_v0, cpu_me0 = os.getloadavg(), _cpu_s([srv.proc.pid]), time.process_time()
        t_start = time.time()
        windows, sids = [], []
        for _ in range(args.loads):
            sid, t0, t1 = await one_load(agent, rng, args.blocks)
            windows.append((t0, t1))
            sids.append(sid)
            await asyncio.sleep(args.gap_s)
        t_end = time.time()
        cpu_v, cpu_me = _cpu_s([srv.proc.pid]) - cpu_v0, time.process_time() - cpu_me0
        load1 = os.getloadavg()
        during, outside = [], []
        for s in residents:
            tt = s.token_times
            for a, b in zip(tt, tt[1:]):
                if a < t_start or b > t_end:
                    continue
                hit = any(a < w1 and b > w0 for w0, w1 in windows)
                (during if hit else outside).append((b - a) * 1000.0)
        for s in residents:
            await agent.vllm_client.abort(s)
        wall = t_end - t_start
        lw = [(w1 - w0) * 1000.0 for w0, w1 in windows]
        print(f"{'paced' if args.pace else 'unpaced'} engine, {args.residents} residents, {args.loads} loads of {args.blocks} blocks "
              f"({args.blocks * agent.hub.worker_info.block_bytes / 2**20:.1f} MiB each), "
              f"fetch delay {args.fetch_delay_ms} ms/block; load window p50 {pct(lw, .5):.0f} ms, "
              f"max {max(lw):.0f} ms")
        msgs = [m for sid in sids for m in reports.get(sid, [])]
        claimed = sum(getattr(m, "external", 0) for m in msgs)
        loaded = sum(len(getattr(m, "blocks", ())) for m in msgs if hasattr(m, "failed"))
        failed = sum(len(m.failed) for m in msgs if hasattr(m, "failed"))
        print(f"claimed {claimed} tokens from received blocks, loaded {loaded} blocks, "
              f"{failed} failed to load")
        for name, xs in (("during load", during), ("outside", outside)):
            print(f"ITL {name:12s} n={len(xs):5d}  p50 {pct(xs, .5):7.1f}  p90 {pct(xs, .9):7.1f}"
                  f"  p99 {pct(xs, .99):7.1f} ms")
        print(f"CPU over {wall:.1f} s: vLLM processes {cpu_v:.1f} s ({cpu_v / wall:.2f} cores), "
              f"this process {cpu_me:.1f} s; loadavg before {load0[0]:.2f} {load0[1]:.2f}, "
              f"after {load1[0]:.2f} {load1[1]:.2f}; {os.cpu_count()} CPUs")
        print(f"resident_itl: p99 during load {pct(during, .99):.1f} ms (outside "
              f"{pct(outside, .99):.1f} ms), {args.loads} loads of {args.blocks} blocks")
    finally:
        await agent.stop()
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--residents", type=int, default=3)
    ap.add_argument("--loads", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=96, help="blocks per load (32 tokens each)")
    ap.add_argument("--fetch-delay-ms", type=float, default=2.0,
                    help="the agent answers a fetch this much later per block (harness knob)")
    ap.add_argument("--gap-s", type=float, default=1.5, help="pause between loads")
    ap.add_argument("--omp-bind", default="nobind", help="VLLM_CPU_OMP_THREADS_BIND")
    ap.add_argument("--pace", action=argparse.BooleanOptionalAction, default=True,
                    help="pace engine steps as the e2e tests do (pallas_eval.emulation.E2E_PACE: "
                         "a real model's step period; the tiny model alone saturates the CPUs)")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
