"""The replay's regime (issue 13 item 1): its settings, the pacing check, the delaying relay and
the per-process CPU figures."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest

from pallas_common import timing
from pallas_eval import replay as rp
from pallas_eval.cpu import CpuSample, CpuSampler, cpu_share
from pallas_eval.metrics import SessionRecord
from pallas_eval.relay import ProxyPool, delayed
from pallas_eval.report import cpu_table


def test_paper_regime_paces_scales_the_link_and_delays_the_relay(tmp_path):
    opts = rp.ReplayOptions(out_dir=tmp_path)
    r = rp.regime_of(opts, 2048.0)
    assert (r.name, r.model.name) == ("paper", "qwen3-32b")
    assert r.hop_delay_s == pytest.approx(timing.PAPER_HOP_COST.mean_s())   # the relay's first hop (relay.py)
    assert r.peer_rate_mbps == pytest.approx(300 * 2048 / 262_144)
    assert "emulating qwen3-32b" in r.describe() and "2.34 Mbit/s" in r.describe()
    r14 = rp.regime_of(rp.ReplayOptions(out_dir=tmp_path, emulate="qwen3-14b", hop_delay_s=0.0), 2048.0)
    assert r14.peer_rate_mbps == pytest.approx(300 * 2048 / 163_840) and r14.hop_delay_s == 0.0
    nat = rp.regime_of(rp.ReplayOptions(out_dir=tmp_path, regime="native"), 2048.0)
    assert (nat.model, nat.peer_rate_mbps, nat.hop_delay_s) == (None, 0.0, 0.0)
    with pytest.raises(ValueError):
        rp.regime_of(rp.ReplayOptions(out_dir=tmp_path, regime="warp"), 2048.0)
    with pytest.raises(ValueError):
        rp.regime_of(rp.ReplayOptions(out_dir=tmp_path, emulate="gpt-5"), 2048.0)


def _run_with_itl(itl: float, n: int = 50):
    s = SessionRecord("u", "s", 10, n, 0.0, [1.0 + k * itl for k in range(n)], list(range(n)))
    return rp.SchemeRun("pallas", 0.0, [s], {}, [], [], 0.0)


def test_pacing_check_holds_or_says_the_machine_could_not_keep_up(tmp_path):
    r = rp.regime_of(rp.ReplayOptions(out_dir=tmp_path), 2048.0)
    good = [{"prefill_tokens": 1850, "prefill_s": 1.0, "decode_steps": 25, "decode_s": 1.0, "steps": 26},
            {"prefill_tokens": 925, "prefill_s": 0.5, "decode_steps": 50, "decode_s": 2.05, "steps": 51,
             "overruns": 1, "overrun_s": 0.01}]
    ok = rp.pacing_check(r, good, [_run_with_itl(0.041)])
    assert ok["held"] and ok["r_p"] == pytest.approx(1850) and ok["r_d"] == pytest.approx(75 / 3.05)
    assert "pacing held" in ok["verdict"] and "1 of 77 steps overran" in ok["verdict"]
    slow = rp.pacing_check(r, good, [_run_with_itl(0.050)])       # the UEs saw 20 tok/s, not 25
    assert not slow["held"] and "COULD NOT KEEP UP" in slow["verdict"] and "decode (UE) 20.0" in slow["verdict"]
    none = rp.pacing_check(r, [None, None], [_run_with_itl(0.04)])  # no connector statistics at all
    assert not none["held"] and "prefill (engine)" in none["verdict"]


def test_delayed_adds_latency_not_spacing():
    clock = [0.0]
    slept = []

    async def sleep(dt):
        slept.append(dt)
        clock[0] += dt

    async def chunks():
        for k in range(3):
            yield k
            clock[0] += 0.01       # the upstream sends every 10 ms

    async def go():
        out = []
        async for c in delayed(chunks(), 0.03, clock=lambda: clock[0], sleep=sleep):
            out.append((c, clock[0]))
        return out
    out = asyncio.run(go())
    assert [c for c, _ in out] == [0, 1, 2]
    # each chunk leaves 30 ms after it arrived (0, 10, 20 ms): at 30, 40, 50 ms
    assert [t for _, t in out] == [pytest.approx(0.03), pytest.approx(0.04), pytest.approx(0.05)]


def test_delay_proxy_forwards_a_stream_no_earlier_than_the_delay():
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def stream(request):
        async def gen():
            for k in range(3):
                yield f"data: {k} {request.query_params.get('from_index')}\n\n".encode()
                await asyncio.sleep(0.01)
        return StreamingResponse(gen(), media_type="text/event-stream")

    with ProxyPool() as pool:
        import uvicorn
        from pallas_eval.procs import free_port
        port = free_port()
        srv = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/s/{x}/stream", stream)]), host="127.0.0.1",
                                            port=port, log_level="warning", lifespan="off"))
        fut = asyncio.run_coroutine_threadsafe(srv.serve(), pool.loop)
        while not srv.started:
            time.sleep(0.01)
        try:
            proxy = pool.add(f"http://127.0.0.1:{port}", 0.2)
            t0 = time.monotonic()
            with httpx.stream("GET", proxy.url + "/v1/s/abc/stream", params={"from_index": 4}) as r:
                first = None
                body = b""
                for c in r.iter_raw():
                    first = first or time.monotonic()
                    body += c
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            assert body == b"data: 0 4\n\ndata: 1 4\n\ndata: 2 4\n\n"
            assert first - t0 >= 0.2
        finally:
            srv.should_exit = True
            fut.result(timeout=5)


def test_cpu_share_per_process_and_table():
    a = CpuSample(10.0, {1: ("agent", "edge-0", 1.0), 2: ("vllm-engine", "edge-0", 5.0)})
    b = CpuSample(12.0, {1: ("agent", "edge-0", 1.2), 2: ("vllm-engine", "edge-0", 5.1),
                         3: ("xapp", "xapp", 0.4)})                    # started in between
    sh = cpu_share(a, b)
    assert sh == {"edge-0/agent": pytest.approx(0.1), "edge-0/vllm-engine": pytest.approx(0.05),
                  "xapp/xapp": pytest.approx(0.2)}
    with pytest.raises(ValueError):
        cpu_share(b, a)
    from rich.console import Console
    con = Console(record=True, width=120)
    con.print(cpu_table({"pallas": {**sh, "edge-1/agent": 0.1, "harness/python": 0.3}}))
    text = con.export_text()
    assert "pallas" in text and "20.0" in text and "75.0" in text   # agent 10+10, total 10+5+20+10+30


def test_cpu_sampler_sees_a_busy_child(tmp_path):
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<0.6: pass"])
    try:
        s = CpuSampler({"job": os.getpid()})
        s.add("me", os.getpid(), alone=True)
        a = s.snapshot()
        p.wait(timeout=10)
        time.sleep(0.05)
        b = s.snapshot()
        assert any(k.startswith("me/") for k in cpu_share(a, b))
        assert p.pid in a.procs and a.procs[p.pid][1] == "job"       # the child, under its root
    finally:
        p.kill()


def test_history_drives_knob_reaches_the_prepare_step(tmp_path, monkeypatch):
    """``pallas replay --history-drives N`` is passed to the prepare step (the generated drive's
    earlier traffic the xApp learns from); the default is 16, 0 turns it off."""
    import json as _json
    import subprocess

    from pallas_eval import cli

    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        out = Path(cmd[cmd.index("pallas_eval.prepare") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(_json.dumps({"history": ""}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(rp.subprocess, "run", fake_run)
    for argv, want in ((["replay", "--out", str(tmp_path / "a")], "16"),
                       (["replay", "--out", str(tmp_path / "b"), "--history-drives", "0"], "0")):
        a = cli.build_parser().parse_args(argv)
        opts = cli.options_from_args(a)
        rp.prepare(opts)
        cmd = seen[-1]
        assert cmd[cmd.index("--history-drives") + 1] == want


def test_a_relative_out_folder_is_made_absolute_before_the_subprocesses_see_it(tmp_path, monkeypatch):
    """The prepare step runs in the repository's folder: a relative ``--out`` from another
    folder was written there and then not found here (a clean clone using another checkout's
    environment showed it)."""
    from rich.console import Console

    from pallas_eval import cli
    from pallas_eval.replay_run import run_replay

    seen = []

    def stop(opts):
        seen.append(opts.out_dir)
        raise RuntimeError("stop here")

    monkeypatch.setattr(rp, "prepare", stop)
    monkeypatch.chdir(tmp_path)
    opts = cli.options_from_args(cli.build_parser().parse_args(["replay", "--out", "rel/run"]))
    with pytest.raises(RuntimeError, match="stop here"):
        run_replay(opts, Console(quiet=True))
    assert seen == [tmp_path / "rel" / "run"] and seen[0].is_absolute()


def test_relay_due_lengthens_every_gap_by_the_hops_cost():
    """A relay hop's per-token cost lands on each gap: chunks arriving 10 ms apart that pay
    10 ms each (two hops of 5 ms) leave 20 ms apart, the first one 10 ms (+ the latency) late."""
    from pallas_eval.relay import relay_due
    last, out = None, []
    for t in (0.0, 0.01, 0.02, 0.03):
        last = relay_due(last, t, 0.002, 0.010)
        out.append(last[1])
    assert out == [pytest.approx(x) for x in (0.012, 0.032, 0.052, 0.072)]


def test_delayed_with_a_hop_cost_draws_per_chunk_and_keeps_order():
    from pallas_common.timing import HopCost
    clock = [0.0]
    waits = []

    async def sleep(dt):
        waits.append(dt)
        clock[0] += dt

    async def chunks():
        for k in range(4):
            yield k

    cost = HopCost(fixed_s=0.005, jitter_median_s=0.0, jitter_sigma=0.0, stall_prob=0.0, stall_mean_s=0.0)

    async def go():
        return [(c, clock[0]) async for c in delayed(chunks(), 0.0, cost=cost, hops=2, clock=lambda: clock[0],
                                                     sleep=sleep)]
    out = asyncio.run(go())
    # all arrive at 0; each leaves 10 ms (two hops of 5 ms) after the one before
    assert [c for c, _ in out] == [0, 1, 2, 3]
    assert [t for _, t in out] == [pytest.approx(x) for x in (0.01, 0.02, 0.03, 0.04)]
