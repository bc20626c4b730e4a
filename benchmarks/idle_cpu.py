"""CPU of one agent with its vLLM server (tiny model) when idle, under light load and while a
paced session decodes, with vLLM's default multiprocessing and with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (issue 13, item 2).

For each variant it starts one ``pallas-agent`` (which launches vLLM with the harness's paced
connector, pallas_eval/emulated_connector.py, at Qwen3-32B's emulated rates unless ``--raw``),
lets it settle, then measures each process's CPU (pallas_eval/cpu.py) over three windows:

- idle: no request at all;
- tick: one 1-token completion every 200 ms, sent straight to vLLM;
- decode: one session decoding through the agent's front (paced at r_d unless ``--raw``).

    flock /tmp/pallas-vllm.lock .venv/agent/bin/python benchmarks/idle_cpu.py

Prints % of one core per process and window, and a JSON line per variant with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "proto")]

import httpx  # noqa: E402

from pallas_eval.client import UESession  # noqa: E402
from pallas_eval.cluster import LocalAgent, free_port  # noqa: E402
from pallas_eval.cpu import CpuSampler, cpu_share  # noqa: E402
from pallas_eval.emulation import agent_flags, emulated_model  # noqa: E402
from pallas_eval.models import build_model  # noqa: E402

VARIANTS = {"default": {}, "mp0": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}


def window(sampler: CpuSampler, seconds: float, work=None) -> dict[str, float]:
    a = sampler.snapshot()
    if work is None:
        time.sleep(seconds)
    else:
        work(seconds)
    return cpu_share(a, sampler.snapshot())


def tick(url: str, model: str, seconds: float, period: float = 0.2) -> None:
    end = time.monotonic() + seconds
    with httpx.Client(timeout=30) as c:
        i = 0
        while time.monotonic() < end:
            t0 = time.monotonic()
            r = c.post(url + "/v1/completions", json={"model": model, "prompt": [5 + i % 500], "max_tokens": 1,
                                                      "temperature": 0.0})
            r.raise_for_status()
            i += 1
            time.sleep(max(0.0, period - (time.monotonic() - t0)))


def decode(front: str, seconds: float, r_d: float) -> None:
    async def go():
        s = UESession(front)
        n = max(8, int(seconds * r_d))
        await s.open(list(range(10, 138)), max_tokens=n)
        async for _ in s.tokens():
            pass
        await s.close()
    asyncio.run(go())


def run_variant(name: str, env: dict[str, str], args) -> dict:
    model = str(build_model("tiny"))
    m = emulated_model(args.emulate)
    vport = free_port()
    flags = ["--vllm-port", str(vport), "--probe-prefill-tokens", "0"]
    if not args.raw:
        flags += agent_flags(m.r_p, m.r_d)
    a = LocalAgent(f"cpu-{name}", model, omp_bind="0", extra=flags, env=env, insecure=True)
    a.start({})
    try:
        a.wait_ready(600)
        sampler = CpuSampler({"agent": a.proc.pid})
        time.sleep(args.settle_s)
        vurl = f"http://127.0.0.1:{vport}"
        served = httpx.get(vurl + "/v1/models", timeout=10).json()["data"][0]["id"]
        out = {"variant": name, "env": env, "paced": not args.raw}
        out["idle"] = window(sampler, args.window_s)
        out["tick"] = window(sampler, args.window_s, lambda s: tick(vurl, served, s))
        time.sleep(2.0)
        out["idle_after"] = window(sampler, args.window_s)
        out["decode"] = window(sampler, args.window_s, lambda s: decode(a.front_url, s, m.r_d if not args.raw else 200))
        return out
    finally:
        a.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="default,mp0")
    p.add_argument("--emulate", default="qwen3-32b")
    p.add_argument("--raw", action="store_true", help="the product connector, no pacing")
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--settle-s", type=float, default=5.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    for v in args.variants.split(","):
        res = run_variant(v, VARIANTS[v], args)
        print(f"== {v} ({'paced ' + args.emulate if res['paced'] else 'raw'}): % of one core")
        for w in ("idle", "tick", "idle_after", "decode"):
            parts = ", ".join(f"{k.split('/')[-1]} {100 * x:.1f}" for k, x in sorted(res[w].items()))
            print(f"  {w:>10}: total {100 * sum(res[w].values()):6.1f}  ({parts})")
        if args.json:
            print(json.dumps(res))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
