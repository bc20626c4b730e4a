"""Handover gap (SIT at the UE) of Pallas and each baseline on one ~1,200-token session.

Starts two real agents (``pallas-agent``, each launching its own vLLM CPU server) serving the
same random-weight Llama (default: the 152M preset, fp32, block 32), then replays ONE session
(same prompt, same greedy decoding) once per scheme:

- the UE opens the session at agent a and streams;
- at output index ``--trigger-at`` the xApp's Trigger goes to a (proactive schemes prepare b);
- at output index ``--commit-at`` the UE switches to agent b's front and the xApp's Commit
  goes to a at the same moment (Detour: the UE's stream is relayed by b);
- the gap is the UE-side time between the last token before the switch and the first token
  after it (docs/model.md §7).

Between runs both servers' prefix caches are reset (vLLM dev endpoint), so no scheme profits
from an earlier run's cache. Every run's tokens are compared with a run without a handover.

    .venv/agent/bin/python benchmarks/scheme_gaps.py                # 152M, ~1,200 tokens
    .venv/agent/bin/python benchmarks/scheme_gaps.py --model-preset tiny --prompt-tokens 400

Prints one line per scheme and a table at the end (JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "proto")]

import httpx  # noqa: E402
from pallas_proto import pallas_pb2 as pb  # noqa: E402
from pallas_proto import pallas_pb2_grpc  # noqa: E402

from pallas_eval.client import UESession  # noqa: E402
from pallas_eval.cluster import LocalAgent, free_port, start_agents  # noqa: E402
from pallas_common.schemes import (CTHO, DETOUR, FULL_COPY, NO_RC, NO_SM, PALLAS,  # noqa: E402
                                   RECOMPUTATION, SCHEMES, scheme_name, scheme_value)

ALL = [PALLAS, NO_RC, NO_SM, CTHO, RECOMPUTATION, FULL_COPY, DETOUR]


async def reset_caches(urls: list[str]) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        for u in urls:
            for _ in range(20):
                r = await c.post(f"{u}/reset_prefix_cache")
                if r.status_code == 200 and r.json().get("success"):
                    break
                await asyncio.sleep(0.5)
            else:
                print(f"warning: prefix cache reset at {u} did not succeed", file=sys.stderr)


async def one_run(a: LocalAgent, b: LocalAgent, ids: list[int], args, scheme: str | None) -> dict:
    """One session; scheme None = the reference run without a handover."""
    ue = UESession(a.front_url, ue_id="bench")
    out: dict = {"scheme": scheme or "none"}
    async with a.channel(aio=True) as ch:
        ctl = pallas_pb2_grpc.ControlStub(ch)
        await ue.open(prompt_token_ids=ids, max_tokens=args.max_tokens, ignore_eos=True, scheme=scheme)
        t_open = time.perf_counter()
        async for rec in ue.tokens():
            if rec.index == 0:
                out["ttft_s"] = time.perf_counter() - t_open
            if scheme is None:
                continue
            spec = SCHEMES[scheme_value(scheme)]
            if rec.index == args.trigger_at and spec.proactive:
                t0 = time.perf_counter()
                r = await ctl.Trigger(pb.TriggerRequest(session_id=ue.session_id, epoch=1, target=b.endpoint))
                out["trigger"] = {"status": pb.Status.Name(r.status), "split": r.split_tokens,
                                  "rpc_s": round(time.perf_counter() - t0, 4), "message": r.message}
            if rec.index == args.commit_at:
                t0 = time.perf_counter()
                relay = scheme == DETOUR
                commit = ctl.Commit(pb.CommitRequest(session_id=ue.session_id, epoch=1, actual_target=b.endpoint))
                _, r = await asyncio.gather(ue.handover(b.front_url, relay=relay), commit)
                out["commit"] = {"status": pb.Status.Name(r.status), "scheme": scheme_name(r.scheme),
                                 "split": r.split_tokens, "rpc_s": round(time.perf_counter() - t0, 4),
                                 "message": r.message}
        await ue.close()
    if scheme is not None and scheme != DETOUR:
        # Agent-side decode gap: the source's last decoded token (its frozen length n) to the
        # target's first own token, both timed where the engines produced them (one host clock).
        # The UE-side gap can hide part of it when the UE was still a few tokens behind the
        # source at the switch (those tokens then reach it from the target in a burst).
        async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {ue.token}"}) as c:
            sa = (await c.get(f"{a.front_url}/v1/sessions/{ue.session_id}", params={"include_tokens": True})).json()
            sb = (await c.get(f"{b.front_url}/v1/sessions/{ue.session_id}", params={"include_tokens": True})).json()
        n = sa["output_tokens"]
        out["frozen_at"] = n
        out["ue_behind_tokens"] = n - ue.handovers[0].next_index if ue.handovers else None
        if 0 < n < len(sb["token_times"]):
            out["decode_gap_s"] = sb["token_times"][n] - sa["token_times"][n - 1]
    itl = ue.itls()
    hi = ue.handovers[0].next_index if ue.handovers else None
    before = itl[max(0, (hi or len(itl)) - 40):(hi or len(itl)) - 1] if itl else []
    after = itl[hi:] if hi else []
    out.update(tokens=ue.token_ids, n=len(ue.token_ids),
               gap_s=(ue.handover_gaps() or [None])[0],
               itl_before_ms=round(1000 * statistics.median(before), 1) if before else None,
               itl_after_ms=round(1000 * statistics.median(after), 1) if after else None)
    return out


async def bench(args) -> list[dict]:
    from pallas_eval.models import build_model, model_config, num_parameters

    model = str(build_model(args.model_preset))
    cfg = model_config(model)
    print(f"model {args.model_preset}: {num_parameters(model) / 1e6:.1f}M parameters, "
          f"{cfg['num_hidden_layers']} layers, vocab {cfg['vocab_size']}", flush=True)
    vports = [free_port(), free_port()]
    common = ["--probe-prefill-tokens", "256", "--kv-cache-gib", str(args.kv_cache_gib),
              "--peer-rate-mbps", str(args.peer_rate_mbps), "--resume-wait-s", "120",
              "--log-level", "INFO"]
    a = LocalAgent("a", model, omp_bind=args.bind[0], extra=common + ["--vllm-port", str(vports[0])],
                   env={"VLLM_SERVER_DEV_MODE": "1"})
    b = LocalAgent("b", model, omp_bind=args.bind[1], extra=common + ["--vllm-port", str(vports[1])],
                   env={"VLLM_SERVER_DEV_MODE": "1"})
    t0 = time.time()
    start_agents([a, b], timeout_s=900)
    print(f"agents ready in {time.time() - t0:.0f} s", flush=True)
    vllm = [f"http://127.0.0.1:{p}" for p in vports]
    rng = random.Random(args.seed)
    ids = [rng.randrange(3, cfg["vocab_size"]) for _ in range(args.prompt_tokens)]
    rows = []
    try:
        await reset_caches(vllm)
        ref = await one_run(a, b, ids, args, None)
        print(f"reference (no handover): {ref['n']} tokens, TTFT {ref['ttft_s']:.2f} s, "
              f"median ITL {ref['itl_before_ms']} ms", flush=True)
        for scheme in args.schemes:
            await reset_caches(vllm)
            r = await one_run(a, b, ids, args, scheme)
            r["token_exact"] = r["tokens"] == ref["tokens"]
            r.pop("tokens")
            rows.append(r)
            gap = f"{r['gap_s'] * 1000:.0f} ms" if r["gap_s"] is not None else "n/a"
            dgap = f"{r['decode_gap_s'] * 1000:.0f} ms" if r.get("decode_gap_s") is not None else "n/a"
            print(f"{scheme:14s} UE gap {gap:>9s}  decode gap {dgap:>9s}  UE behind by {r.get('ue_behind_tokens')}"
                  f"  exact={r['token_exact']}  commit={r.get('commit')}  "
                  f"trigger={r.get('trigger')}  ITL before/after {r['itl_before_ms']}/{r['itl_after_ms']} ms",
                  flush=True)
    finally:
        a.stop()
        b.stop()
    k = args.prompt_tokens + args.commit_at + 1
    print(f"\nhandover gap at the UE, one session: prompt {args.prompt_tokens} + {args.max_tokens} output tokens,"
          f" commit at K = {k} tokens, trigger at output {args.trigger_at}, peer link "
          f"{args.peer_rate_mbps or 'unlimited'} Mbit/s")
    print("UE gap: last token from the source to the first after the switch, at the UE; decode gap:"
          " the source's last decoded token to the target's first, where the engines produced them")
    print(f"{'scheme':14s} {'UE gap (ms)':>11s} {'decode gap (ms)':>15s} {'exact':>6s} {'used':>14s} {'split':>6s}"
          f" {'ITL after (ms)':>14s}")
    for r in rows:
        c = r.get("commit") or {}
        gap = f"{r['gap_s'] * 1000:.0f}" if r["gap_s"] is not None else "n/a"
        dgap = f"{r['decode_gap_s'] * 1000:.0f}" if r.get("decode_gap_s") is not None else "n/a"
        print(f"{r['scheme']:14s} {gap:>11s} {dgap:>15s} {str(r['token_exact']):>6s} {c.get('scheme', ''):>14s} "
              f"{c.get('split', ''):>6} {r['itl_after_ms']!s:>14s}")
    if args.json:
        print(json.dumps({"reference": {k_: v for k_, v in ref.items() if k_ != "tokens"}, "runs": rows}))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-preset", default="m152", choices=["tiny", "m152"])
    p.add_argument("--prompt-tokens", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=220)
    p.add_argument("--trigger-at", type=int, default=120, help="output index of the Trigger")
    p.add_argument("--commit-at", type=int, default=199, help="output index of the handover / Commit")
    p.add_argument("--peer-rate-mbps", type=float, default=300.0)
    p.add_argument("--kv-cache-gib", type=int, default=2)
    p.add_argument("--bind", nargs=2, default=["0", "1"], help="OMP thread binding of a's and b's vLLM")
    p.add_argument("--schemes", nargs="+", default=ALL, choices=ALL)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not 0 <= args.trigger_at < args.commit_at < args.max_tokens - 1:
        p.error("need 0 <= trigger-at < commit-at < max-tokens - 1")
    asyncio.run(bench(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
