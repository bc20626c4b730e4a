"""The replay's run (``pallas replay``, and each live experiment's replays): :func:`run_replay`
carries out the whole job of :mod:`pallas_eval.replay` (prepare, start the servers, run every
scheme, verify, report and write the outputs), and the timing model's rates and handovers the
report compares the live figures with (``--rates``, ``--simulate``).

The command line (:mod:`pallas_eval.cli`) and the live experiments
(:mod:`pallas_eval.experiments.live`) both call :func:`run_replay`; neither imports the other.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from pallas_common.schemes import spec_for
from pallas_eval import replay as rp
from pallas_eval.experiments import presets as PR
from pallas_eval.failover import check_within, failover_lines
from pallas_eval.lengths import LengthSampler, ue_session_stream
from pallas_eval.ues import first_session_delay
from pallas_eval.results_page import provenance
from pallas_eval.preparation import (WastedPreparation, prediction_lines, sit_by_prediction, ue_hours,
                                     wasted_preparation)
from pallas_eval.metrics import (gap_between_tokens, hop_itl_line, itl_by_hops, itl_line, itl_stats,
                                 post_handover_itls, summarize)
from pallas_eval.report import (HandoverRow, cpu_table, handover_table, live_vs_model, live_vs_model_lines,
                                lead_summary, plot_cdfs, plot_timeline, ratio_table, summary_table,
                                write_csv, write_json)
from pallas_eval.simulate import (Rates, SimHandover, front_relay_paths, held_from_rows, measured_rates,
                                  simulate, summarize_sim)

def _rates_from_file(spec: str) -> Rates:
    path, _, model = spec.partition(":")
    d = json.loads(Path(path).read_text())
    m = next((x for x in d["models"] if x["model"] == model), None) if model else d["models"][-1]
    if m is None:
        raise ValueError(f"{path}: no model {model!r}")
    from pallas_common import timing
    r_p = float(np.median([x["tokens_per_s"] for x in m["prefill"]]))
    g = d.get("graphed_decode", {}).get(m["model"])
    r_d = None
    if isinstance(g, list) and g:
        r_d = float(np.median([x.get("tokens_per_s_per_request", x.get("tokens_per_s", 0)) for x in g]))
    elif isinstance(g, dict):
        vals = [v for v in g.values() if isinstance(v, (int, float))]
        r_d = float(np.median(vals)) if vals else None
    r_d = r_d or float(np.median([x["tokens_per_s_per_request"] for x in m["decode"]]))
    return Rates(f"{d.get('device', path)} {m['model']}", r_p, r_d, timing.mbit_per_s(PR.PAPER_GOODPUT_MBPS),
                 float(m["kv_bytes_per_token"]), PR.BLOCK_SIZE, PR.REPLAY_C_SYNC_S, PR.REPLAY_HOP_DELAY_S,
                 relay_request_s=PR.REPLAY_C_SYNC_S, relay_requests_per_hop=2)


def emulated_rates(regime: rp.Regime, c_sync: float | None, block_size: int = 32) -> Rates:
    """The timing model's rates in the paper regime: the emulated model's r_p and r_d, the
    scaled link with the tiny model's s_kv (so K * s_kv / B is the emulated model's transfer
    time), the relay hop delay, and c_sync as measured (20 ms if not), which is also each request
    of a Detour relay path's set-up (``Rates.relay_request_s``: an HTTP request between two of the
    replay's processes, as the control round trip is; two a hop through the delaying proxies)."""
    m = regime.model
    c = c_sync if c_sync and math.isfinite(c_sync) else PR.REPLAY_C_SYNC_S
    return Rates(f"emulated {m.name}", m.r_p, m.r_d, regime.peer_rate_mbps * 1e6 / 8.0, regime.s_kv_tiny,
                 block_size, c, regime.hop_delay_s, relay_request_s=c, relay_requests_per_hop=_requests_per_hop(regime))


def _requests_per_hop(regime: rp.Regime | None) -> int:
    """HTTP stream requests per relay hop of a Detour path in this replay: the front's, and the
    delaying proxy's in front of the next front where the regime has a hop delay (pallas_eval.relay)."""
    return 2 if regime is not None and regime.hop_delay_s > 0 else 1


def _pick_rates(spec: str, measured: dict | None, block_size: int = 32, s_kv: float = 0.0,
                regime: rp.Regime | None = None) -> Rates:
    if spec == "auto":
        spec = "emulated" if regime is not None and regime.model is not None else "measured"
    if spec == "emulated":
        if regime is None or regime.model is None:
            raise ValueError("--rates emulated needs --regime paper")
        return emulated_rates(regime, (measured or {}).get("c_sync"), block_size)
    if spec == "measured":
        m = measured or {}
        return dataclasses.replace(measured_rates(r_p=m.get("r_p"), r_d=m.get("r_d_xapp") or m.get("r_d_ue"), bandwidth=m.get("bandwidth"),
                              s_kv=float(m.get("s_kv") or s_kv or 16384.0), block_size=int(m.get("block_size") or block_size),
                              c_sync=m.get("c_sync"), hop_delay_s=None),
                                   relay_requests_per_hop=_requests_per_hop(regime))
    if spec in PR.RATE_PRESETS:
        return PR.RATE_PRESETS[spec]
    return _rates_from_file(spec)


def _sim_handovers_live(rows: list[HandoverRow]) -> list[SimHandover]:
    """The model's handovers of a scheme's live rows: Detour's relay hops are the live fronts'
    (simulate.front_relay_paths)."""
    out, hops = [], {}
    for r, (cached, known), (rh, prev) in zip(rows, held_from_rows(rows), front_relay_paths(rows)):
        if not math.isfinite(r.sit_s):
            continue
        h = hops.get(r.session_id, 0)
        out.append(SimHandover(r.ue_id, r.time_s, r.from_cell, r.to_cell, int(r.tokens_at_ho),
                               r.lead_s if math.isfinite(r.lead_s) else 0.0, h, cached, known, rh, prev))
        hops[r.session_id] = h + 1
    return out


def model_on_own_rows(rows: list[HandoverRow], rates: Rates, schemes) -> dict[str, dict]:
    """The timing model's summary (simulate.summarize_sim) of each scheme on that scheme's own
    handover rows: its tokens at each handover, its sessions' paths and leads. A scheme's own
    interruptions move where its sessions are at its later handovers (a Full-Copy session
    stalled for seconds has decoded fewer tokens by the next one, or has not ended when another
    scheme's had), so one scheme's rows are not another's handovers. Schemes without a row with
    a session are left out."""
    out: dict[str, dict] = {}
    for sch in schemes:
        hos = _sim_handovers_live([x for x in rows if x.scheme == sch])
        if hos:
            out.update(summarize_sim(simulate(hos, rates, (sch,))))
    return out


def _sim_handovers_offline(plan: dict, opts: rp.ReplayOptions, rates: Rates, sampler: LengthSampler,
                           lead_s: float, server_of: dict[int, int] | None = None) -> list[SimHandover]:
    """Sessions laid out in time with the model's rates (prefill then decode at r_d, back to
    back per UE), so the handovers meet the same session lengths as a live run. ``server_of``
    (cell -> server, the replay's cell map): Detour's relay hops are the live fronts'
    (simulate.front_relay_paths); without it, the chain."""
    out, legs = [], []
    for u in plan["ues"]:
        stream = ue_session_stream(opts.seed, u["ue_id"], sampler, 2048)
        t = float(u["start"]) + first_session_delay(opts.seed, u["ue_id"], opts.first_session_spread_s)
        end = float(u["end"])
        sessions = []
        while t < end:
            s = next(stream)
            dur = len(s.prompt_ids) / rates.r_p + s.max_tokens / rates.r_d
            sessions.append((t, len(s.prompt_ids), s.max_tokens))
            t += dur + 0.2
        hops: dict[int, int] = {}
        for ue, tho, a, b in plan["handovers"]:
            if ue != u["ue_id"]:
                continue
            for i, (t0, p, o) in enumerate(sessions):
                gen = (tho - t0 - p / rates.r_p) * rates.r_d
                if 0 < gen < o:
                    out.append(SimHandover(ue, tho - float(plan["t_first"]), a, b, int(p + gen), lead_s,
                                           hops.get(i, 0)))
                    if server_of is not None:
                        legs.append(SimpleNamespace(session_id=f"{ue}/{i}", from_server=server_of.get(a, -1),
                                                    to_server=server_of.get(b, -1)))
                    hops[i] = hops.get(i, 0) + 1
                    break
    if server_of is None:
        return out
    return [dataclasses.replace(h, relay_hops=rh, prev_relay_hops=prev)
            for h, (rh, prev) in zip(out, front_relay_paths(legs))]


def run_replay(opts: rp.ReplayOptions, con) -> dict:
    """The whole job (module docstring of pallas_eval.replay); prints to ``con`` (a rich
    Console) and writes the outputs. Returns what summary.json holds, plus ``runs``
    (SchemeRun objects) and ``rows`` (HandoverRow objects) for tests."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    schemes = opts.schemes
    # Absolute: the prepare step and the xApp run as subprocesses in the repository's folder,
    # which need not be the caller's (a relative --out was written there and read here).
    opts = dataclasses.replace(opts, out_dir=Path(opts.out_dir).resolve())
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    con.print(f"[bold]pallas replay[/] -> {opts.out_dir}")
    inputs = []        # one (options, plan, cell map) per seed: --seeds pools several drives
    for sd in opts.seeds or (opts.seed,):
        sopts = opts if not opts.seeds else dataclasses.replace(opts, seed=sd, out_dir=opts.out_dir / f"seed-{sd}")
        plan = rp.prepare(sopts)
        con.print(f"input{f' (seed {sd})' if opts.seeds else ''}: {plan['source']}: {len(plan['ues'])} UE(s), "
                  f"{len(plan['handovers'])} handover(s), {len(plan['cells'])} cell(s), "
                  f"{plan['t_last'] - plan['t_first']:.0f} s")
        if opts.kill_replica is not None:
            try:
                check_within(opts.kill_replica, float(plan["t_last"]) - float(plan["t_first"]))
            except ValueError as e:
                raise SystemExit(f"pallas replay: {e}") from None
        mapping = rp.server_map(plan, opts.servers)
        hard = [(h[2], h[3]) for h in plan["handovers"]]
        con.print(f"cells -> servers: {', '.join(f'{c}->edge-{i}' for c, i in sorted(mapping.items()))}"
                  f"  (handover pairs sharing a server: {len(rp.shared_pairs(mapping, hard))})")
        inputs.append((sopts, plan, mapping))
    _, plan, mapping = inputs[0]
    sampler = LengthSampler(opts.azure, max_model_len=opts.max_model_len, max_output=opts.max_output)
    result: dict = {"input": {k: plan[k] for k in ("source", "trace", "cells", "handovers")},
                    "seeds": [so.seed for so, _, _ in inputs],
                    "options": {k: str(v) for k, v in vars(opts).items()}, "cell_map": mapping,
                    "provenance": provenance()}

    if opts.simulate_only:
        rates = _pick_rates(opts.rates if opts.rates not in ("measured", "auto", "emulated") else "paper", None)
        hos = [h for so, pl, mp in inputs for h in _sim_handovers_offline(pl, so, rates, sampler, so.lead_s, mp)]
        res = simulate(hos, rates, schemes)
        sm = summarize_sim(res)
        _print_sim(con, sm, rates, hos)
        write_csv(opts.out_dir / "simulated_handovers.csv",
                  [dict(scheme=r.scheme, ue=r.handover.ue_id, time_s=r.handover.time, from_cell=r.handover.from_cell,
                        to_cell=r.handover.to_cell, k_ho=r.handover.k_ho, lead_s=r.handover.lead_s, sit_s=r.sit_s,
                        t_early_s=r.t_early_s, window_s=r.window_s, bytes_moved=r.bytes_moved,
                        prefill_tokens=r.prefill_tokens, outcome=r.outcome) for r in res])
        out = {**result, "rates": vars(rates), "simulated": sm}
        write_json(opts.out_dir / "summary.json", out)
        return out

    from pallas_eval.cpu import CpuSampler
    from pallas_eval.procs import Supervisor
    from pallas_eval.relay import REPLAY_HOP_COST, ProxyPool
    regime = rp.regime_of(opts, rp.tiny_kv_bytes_per_token(opts.model_preset))
    con.print(regime.describe())
    result["regime"] = regime.describe()
    with Supervisor(opts.out_dir / "logs") as sup, ProxyPool() as proxies:
        relay: dict[str, str] = {}       # front -> its delaying proxy (the paper regime's relay hop)

        def peer_url(front: str) -> str:
            if regime.hop_delay_s <= 0:
                return front
            key = front.rstrip("/")
            if key not in relay:
                cost = REPLAY_HOP_COST.with_mean(regime.hop_delay_s)
                relay[key] = proxies.add(key, 0.0, cost=cost, seed=len(relay) + 1000 * opts.seed).url
            return relay[key]

        with con.status(f"starting {opts.servers} vLLM servers with agents (tiny model, first start builds it)"):
            servers = rp.start_servers(sup, opts, opts.servers, regime, peer_url=peer_url)
        # Which agent each relay proxy fronts: each stream's position on its relay path (relay.py).
        proxies.name_agents({s.agent_id: s.agent.front_url for s in servers})
        con.print(f"servers ready after {time.time() - t_start:.0f} s: "
                  + ", ".join(f"{s.agent_id} (front {s.agent.front_url})" for s in servers))
        origin_of = (lambda front: relay.get(front.rstrip("/"), front)) if relay else None  # noqa: E731
        cpu = CpuSampler({s.agent_id: s.child.popen.pid for s in servers})
        cpu.add("harness", os.getpid(), alone=True)
        from pallas_eval.models import build_model, model_config
        vocab = int(model_config(build_model(opts.model_preset)).get("vocab_size", 2048))
        runs, ctx = [], {}     # ctx: id(run) -> its seed's (options, plan, cell map)
        before = rp.agent_counters(servers)
        counters = {}
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
                      TimeElapsedColumn(), console=con, transient=False) as prog:
            for sch in schemes:
                for so, pl, mp in inputs:
                    rp.end_sessions(servers)
                    rp.reset_prefix_caches(servers)
                    run = rp.run_scheme(sup, so, pl, mp, servers, sch, sampler, vocab, prog,
                                        cpu=cpu, origin_of=origin_of)
                    runs.append(run)
                    ctx[id(run)] = (so, pl, mp)
                after = rp.agent_counters(servers)
                counters[sch] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
                before = after
        if opts.verify:
            with con.status("no-handover references (one greedy request per session)"):
                rp.reset_prefix_caches(servers)
                specs = {spec: None for r in runs for spec in r.specs.values()}
                refs = rp.references(servers, list(specs))
            for r in runs:
                for s in r.sessions:
                    spec = r.specs.get(s.session_id)
                    if spec is not None and spec in refs:
                        s.reference = refs[spec]
        sup.refresh()
    leftover = sup.leftovers()

    rows_all, summaries, sit_by, itl_by, gaps_by, post_by = [], [], {}, {}, {}, {}
    failovers: dict[str, list[dict]] = {}     # scheme -> one report per run with a replica killed
    for sch in schemes:     # the seeds' runs of a scheme pooled
        mine = [r for r in runs if r.scheme == sch]
        rows, sits = [], []
        for r in mine:
            _, pl, mp = ctx[id(r)]
            rw, st = rp.handover_rows(r, pl, mp, servers)
            rows += rw
            sits += st
            fo = rp.failover_of(r, pl, rw)
            if fo is not None:
                failovers.setdefault(sch, []).append(fo)
        sessions = [s for r in mine for s in r.sessions]
        gaps_by[sch] = gap_between_tokens(sits)
        post_by[sch] = post_handover_itls(sessions, sits)
        rows_all += rows
        commits = sum(1 for x in rows if x.outcome in ("commit", "recovered"))
        fallbacks = sum(1 for x in rows if x.outcome.startswith("fallback"))
        t_early = [x.t_early_s for x in rows]
        summaries.append(summarize(sch, sits, sessions, t_early, commits, fallbacks))
        sit_by[sch] = np.array([x.sit_s for x in rows])
        itl_by[sch] = np.concatenate([s.itls() for s in sessions] or [np.zeros(0)])
    measured = rp.measured_rates(runs)
    if not measured.get("s_kv"):
        from pallas_eval.models import build_model, model_config
        from pallas_common.timing import kv_bytes_per_token
        measured["s_kv"] = float(kv_bytes_per_token(model_config(build_model(opts.model_preset))))
        measured["block_size"] = measured.get("block_size") or 32.0
    rp.fill_migration_figures(rows_all, runs, rp.migration_figures(runs))
    rates = _pick_rates(opts.rates, measured, s_kv=measured["s_kv"], regime=regime)
    pacing = rp.pacing_check(regime, [rp.load_pace(opts, s.index) for s in servers], runs) if regime.model else {}
    for r in runs:
        rp.save_sessions(ctx[id(r)][0].out_dir / r.scheme / "sessions.jsonl", r)
    sim = model_on_own_rows(rows_all, rates, schemes)

    con.print(handover_table(rows_all))
    for sch in (x for x in schemes if spec_for(x).proactive):
        line = lead_summary(rows_all, sch)
        if line:
            con.print(line)
    con.print(summary_table(summaries, title=f"Per scheme (live, {regime.name} regime)  |  model: {rates.describe()}",
                            simulated=sim))
    ratios = ratio_table(sit_by, runs[0].scheme)
    if ratios is not None:
        con.print(ratios)
    vs_model = live_vs_model(summaries, sim, rows_all, rates.r_d)
    if vs_model:
        con.print("live against the timing model (same handovers, the run's rates):")
        for line in live_vs_model_lines(vs_model):
            con.print("  " + line)
    for sm in summaries:
        gaps = gaps_by.get(sm.scheme, np.zeros(0))
        if spec_for(sm.scheme).bridge and math.isfinite(sm.itl_mean) and sm.itl_mean > 0 and gaps.size:
            p99 = float(np.percentile(gaps, 99))
            con.print(f"{sm.scheme}: largest token gap across a handover p99 {p99 * 1000:.0f} ms "
                      f"= {p99 / sm.itl_mean:.1f} x its mean ITL ({sm.itl_mean * 1000:.0f} ms), over the "
                      f"{gaps.size} handovers between two tokens ({sm.handovers_with_session - gaps.size} in a session's prefill "
                      f"left out: no token gap across them)")
    prep = {}
    for sch in (x for x in schemes if spec_for(x).proactive):
        mine = [r for r in runs if r.scheme == sch]
        wasted = [wasted_preparation(r.events, ue_hours(ctx[id(r)][1]), float(ctx[id(r)][1]["t_last"])) for r in mine]
        total = WastedPreparation(*(sum(getattr(w, f) for w in wasted) for f in
                                    ("count", "triggers", "ue_hours", "held_s", "prefill_gpu_s", "bytes_streamed",
                                     "vram_gib_s"))) if wasted else None
        split = sit_by_prediction(rows_all, sch)
        prep[sch] = {"sit_by_prediction": split, "wasted": total.as_dict() if total else None}
        for line in prediction_lines(split, total, sch):
            con.print(line)
    hop_itls = {sch: itl_by_hops([s for r in runs if r.scheme == sch for s in r.sessions]) for sch in schemes}
    for sch in schemes:
        line = hop_itl_line(sch, hop_itls[sch])
        if line:
            con.print(line)
    con.print("ITL after a session's first handover (each handover's own gap left out: that is its SIT):")
    for sch in schemes:
        con.print("  " + itl_line(sch, post_by[sch]))
    con.print(cpu_table({r.scheme: r.cpu for r in runs}))
    con.print(regime.describe())
    if pacing:
        con.print(("[green]" if pacing["held"] else "[red]") + pacing["verdict"] + "[/]")
    for sch, reps in failovers.items():
        for rep in reps:
            for line in failover_lines(rep):
                con.print(f"{sch}: {line}", markup=False)
    errors: dict[str, list] = {}
    for r in runs:
        if r.errors:
            errors.setdefault(r.scheme, []).extend(r.errors)
    if errors:
        con.print(f"[yellow]errors: {sum(len(v) for v in errors.values())} (see summary.json)[/]")
    con.print(f"processes left running: {len(leftover)}; wall time {time.time() - t_start:.0f} s")
    out = opts.out_dir
    write_csv(out / "handovers.csv", rows_all)
    write_csv(out / "summary.csv", [s.as_dict() for s in summaries])
    write_json(out / "summary.json", {**result, "summary": [s.as_dict() for s in summaries], "handovers":
                                      [vars(x) for x in rows_all], "measured_rates": measured, "model_rates": vars(rates),
                                      "pacing": pacing, "cpu": {r.scheme: r.cpu for r in runs},
                                      "simulated": sim, "live_vs_model": vs_model,
                                      "itl_by_relay_hops": {sch: {str(k): itl_stats(g) for k, g in v.items()} for sch, v in hop_itls.items()},
                                      "itl_after_handover": {sch: itl_stats(g) for sch, g in post_by.items()},
                                      "preparation": prep, "failover": failovers,
                                      "agent_counters": counters, "errors": errors,
                                      "leftover_pids": sorted(leftover), "wall_s": time.time() - t_start,
                                      "load_avg_end": round(os.getloadavg()[0], 2)})
    plot_cdfs(out / "sit_cdf.png", sit_by, "SIT (ms)", log_x=True)
    plot_cdfs(out / "itl_cdf.png", itl_by, "ITL (ms)", slo_ms=100.0, log_x=True)
    ue0 = max(plan["ues"], key=lambda u: len(u["cells"]))["ue_id"]
    # One UE's tokens across its handovers, each scheme on its own run's clock (time since start).
    plot_timeline(out / "timeline.png", ue0,
                  {r.scheme: [_shifted(s, -r.start_at) for s in r.sessions] for r in runs if ctx[id(r)][1] is plan},
                  [float(h[1]) - float(plan["t_first"]) for h in plan["handovers"] if h[0] == ue0], t0=0.0)
    con.print(f"wrote {out}/handovers.csv, summary.csv, summary.json, sit_cdf.png, itl_cdf.png, timeline.png")
    return {**result, "summary": [s.as_dict() for s in summaries], "leftover_pids": sorted(leftover),
            "failover": failovers,
            "pacing": pacing, "cpu": {r.scheme: r.cpu for r in runs},
            "started_pids": sorted(sup.started_pids), "runs": runs, "rows": rows_all, "errors": errors}


def _shifted(s, dt: float):
    """A copy of a SessionRecord with its token times moved by ``dt`` seconds."""
    import dataclasses
    return dataclasses.replace(s, times=[t + dt for t in s.times])


def _print_sim(con, sm: dict, rates: Rates, hos) -> None:
    from rich.table import Table
    t = Table(title=f"Timing model only ({len(hos)} handovers with a session)  |  {rates.describe()}")
    for c in ("scheme", "SIT mean (ms)", "SIT p50 (ms)", "SIT p99 (ms)", "T_early (ms)"):
        t.add_column(c, justify="left" if c == "scheme" else "right")
    for k, v in sm.items():
        te = v["t_early_mean"]
        t.add_row(k, f"{v['sit_mean'] * 1000:.0f}", f"{v['sit_p50'] * 1000:.0f}", f"{v['sit_p99'] * 1000:.0f}",
                  "-" if not math.isfinite(te) else f"{te * 1000:.0f}")
    con.print(t)
