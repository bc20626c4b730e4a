"""Handover gap of one migrated session: Pallas connector vs prefix cache only vs cold.

One session (default: 152M-parameter random fp32 Llama, 1,000-token prompt, handover after
200 generated tokens, so about 1,200 tokens at the handover) is served by agent A's vLLM and
handed over to agent B's three times:

- connector: trigger (B prefills the block-aligned prefix, A streams every completed suffix
  block), commit (tail + token ids): B recomputes one token;
- prefix cache only: trigger without the suffix stream (w/o SM), commit with token ids only:
  B recomputes the suffix after the handover;
- cold: no trigger, commit with token ids only (Recomputation): B recomputes everything.

The gap is measured where the UE sees it (docs/model.md §7): from the arrival of the last token
from A to the arrival of the first token from B. B's prefix cache is reset before each variant.
Each variant's first tokens after the resume are compared with A's own continuation.

Usage:
    .venv/agent/bin/python benchmarks/handover_gap.py [--model m152] [--prompt 1000]
        [--trigger-at 25] [--commit-at 200] [--check 8]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

import httpx  # noqa: E402
from pallas_proto import pallas_pb2  # noqa: E402

from pallas_eval.models import build_model  # noqa: E402
from agent.app import Agent as AgentNode, AgentConfig  # noqa: E402
from agent.server import ServerConfig, VLLMServer  # noqa: E402
from agent.session import SamplingSpec, Session, SessionState  # noqa: E402


async def one(a: AgentNode, b: AgentNode, srv_b: VLLMServer, variant: str, prompt: list[int],
              trigger_at: int, commit_at: int, check: int) -> dict:
    async with httpx.AsyncClient() as c:
        r = await c.post(srv_b.base_url + "/reset_prefix_cache")
        assert r.status_code == 200, r.text
    s = Session(uuid.uuid4().hex, "ue", prompt,
                SamplingSpec(max_tokens=commit_at + check, ignore_eos=True))
    a.sessions.add(s)
    a.vllm_client.start(s)
    if variant != "cold":
        await s.wait_tokens(trigger_at - 1)
        rep = await a.migration.trigger(s.session_id, 1, b.endpoint, scheme=(
            pallas_pb2.SCHEME_PALLAS if variant == "connector" else pallas_pb2.SCHEME_NO_SM))
        assert rep.status == pallas_pb2.STATUS_OK, rep
    await s.wait_tokens(commit_at - 1)
    t_commit = time.time()
    if variant == "connector":
        rep = await a.migration.commit(s.session_id, 1, b.endpoint, ue_tokens=commit_at)
    elif variant == "prefix_only":
        rep = await a.migration.commit(s.session_id, 1, b.endpoint, ue_tokens=commit_at)
    else:
        rep = await a.migration.commit(s.session_id, 1, b.endpoint,
                                       pallas_pb2.SCHEME_RECOMPUTATION, ue_tokens=commit_at)
    assert rep.status == pallas_pb2.STATUS_OK, rep
    t = b.sessions.get(s.session_id)
    assert t is not None
    await t.wait_tokens(commit_at, timeout=600)
    while t.state not in (SessionState.FINISHED, SessionState.FAILED):
        await asyncio.sleep(0.05)
    gap = t.token_times[commit_at] - s.token_times[commit_at - 1]
    return {"variant": variant, "gap_s": gap, "commit_to_first_s": t.token_times[commit_at] - t_commit,
            "n": len(prompt) + commit_at, "split": rep.split_tokens,
            "claim": t.claim or {}, "tokens": list(t.output_token_ids)}


async def main_async(args) -> None:
    model = str(build_model(args.model))
    a, b = AgentNode(AgentConfig(agent_id="gnb-a", model=model, host="127.0.0.1", peer_port=0, vllm_url="-")), AgentNode(AgentConfig(agent_id="gnb-b", model=model, host="127.0.0.1", peer_port=0, vllm_url="-"))
    await a.start_core()
    await b.start_core()
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    sa = VLLMServer(ServerConfig(model=model, agent_address=a.hub.address, omp_threads_bind="0",
                                 kv_cache_gib=args.kv_gib, env=env))
    sb = VLLMServer(ServerConfig(model=model, agent_address=b.hub.address, omp_threads_bind="1",
                                 kv_cache_gib=args.kv_gib, env=env))
    sa.start()
    sb.start()
    try:
        t0 = time.time()
        await a.attach(sa.base_url, 900)
        await b.attach(sb.base_url, 900)
        print(f"servers ready after {time.time() - t0:.0f} s", flush=True)
        rng = random.Random(5)
        prompt = [rng.randrange(3, 16000) for _ in range(args.prompt)]
        ref = await a.vllm_client.complete(prompt, SamplingSpec(max_tokens=args.commit_at + args.check,
                                                                ignore_eos=True))
        rows = []
        for variant in ("cold", "prefix_only", "connector"):
            r = await one(a, b, sb, variant, prompt, args.trigger_at, args.commit_at, args.check)
            r["exact"] = r["tokens"] == ref
            rows.append(r)
            c = r["claim"]
            print(f"{variant:12s} gap {r['gap_s']:7.3f} s  (commit->first token "
                  f"{r['commit_to_first_s']:7.3f} s)  n={r['n']} split={r['split']} "
                  f"local={c.get('local')} loaded={c.get('external')} "
                  f"recomputed={r['n'] - (c.get('local', 0) + c.get('external', 0))} "
                  f"exact={r['exact']}", flush=True)
        print(f"model {args.model}: handover gap connector {rows[2]['gap_s']:.3f} s, prefix "
              f"cache only {rows[1]['gap_s']:.3f} s, cold {rows[0]['gap_s']:.3f} s")
    finally:
        await a.stop()
        await b.stop()
        sa.stop()
        sb.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="m152")
    ap.add_argument("--prompt", type=int, default=1000)
    ap.add_argument("--trigger-at", type=int, default=25)
    ap.add_argument("--commit-at", type=int, default=200)
    ap.add_argument("--check", type=int, default=8, help="tokens after the resume to compare")
    ap.add_argument("--kv-gib", type=int, default=1)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
