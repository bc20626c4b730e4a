"""``pallas``: the evaluation harness's command line.

``pallas replay`` (no arguments) replays a short generated drive end to end: two UEs crossing a
few cells of a hexagonal grid, three tiny-model vLLM servers with an agent each, the xApp in
test mode, under Pallas, Detour, Full-Copy, Recomputation and ctHO, and prints the per-handover
table and the per-scheme summary. See ``pallas replay --help`` and the README.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

from pallas_common.controls import load_profile, merge_controls, parse_setting
from pallas_common.schemes import ABLATIONS, REPLAYED
from pallas_eval import replay as rp
from pallas_eval.experiments import presets as PR
from pallas_eval.replay_run import run_replay

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pallas", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("replay", help="replay a drive end to end and compare the schemes",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("--trace", action="append",
                   help="a converted real drive (python -m pallas_tools.convert CSV... -o DIR) or a folder of them; "
                        "repeat for several: all replayed together on the same engines, one UE per drive "
                        "(default: a short generated drive)")
    r.add_argument("--segment", default="auto", help="with --trace, per drive: 'auto' (shortest stretch with "
                   "--min-handovers handovers), START:END seconds from the drive's start, or '' for whole drives")
    r.add_argument("--min-handovers", type=int, default=5)
    r.add_argument("--servers", type=int, default=3, help="vLLM servers (each with an agent)")
    r.add_argument("--schemes", default=",".join(REPLAYED), help="comma-separated")
    r.add_argument("--ablations", action="store_true", help="also run Pallas w/o RC and w/o SM")
    r.add_argument("--ues", type=int, default=6, help="generated drive: UEs")
    r.add_argument("--duration-s", type=float, default=90.0, help="generated drive: seconds")
    r.add_argument("--history-drives", type=int, default=16,
                   help="generated drive: earlier drives (300 s each, other UEs and routes, same network) the "
                        "xApp learns its association map, handover places and successors from at start, as "
                        "a deployed xApp would have learned them online (0: it starts empty)")
    r.add_argument("--history", default="",
                   help="with --trace: what the xApp learns its association map, handover places and successors "
                        "from, as a deployed xApp would have: an E2 trace of the same area (*.e2trace, e.g. "
                        "recorded with pallas-xapp --record) or a folder of drive-test CSVs (e.g. "
                        "../shared/data/ucc-5g; every one of them but the replayed drive)")
    r.add_argument("--seed", type=int, default=2, help="drive and session-length seed")
    r.add_argument("--seeds", default="",
                   help="comma-separated seeds (e.g. 1,2,3): one generated drive per seed, all replayed on the same "
                        "engines (one start), the statistics pooled over them; each seed's files in OUT/seed-N")
    r.add_argument("--first-session-spread-s", type=float, default=5.0,
                   help="the UEs open their first sessions at times spread uniformly over this many seconds "
                        "from their first report (fixed per seed and UE), not all at once")
    r.add_argument("--azure", help="Azure LLM trace CSV to draw session lengths from "
                   "(default: the bundled distribution derived from it)")
    r.add_argument("--model-preset", default="tiny", choices=["tiny", "m152"])
    r.add_argument("--max-model-len", type=int, default=2048)
    r.add_argument("--max-output", type=int, default=512, help="cap on a session's output tokens")
    r.add_argument("--regime", default="paper", choices=["paper", "native"],
                   help="'paper': engines paced to the emulated model's prefill/decode rates, the peer link "
                        "at 300 Mbit/s scaled by the KV size ratio, the paper's per-hop relay delay "
                        "(docs/model.md §9); 'native': the tiny model's raw speed, unlimited link")
    r.add_argument("--emulate", default=PR.REPLAY_ANCHOR_MODEL, choices=PR.MODELS,
                   help="--regime paper: the model whose rates the engines and link take")
    r.add_argument("--insecure", action="store_true",
                   help="plaintext gRPC between the xApp and the agents and between agents (default: "
                        "mutual TLS with a local CA made at start)")
    r.add_argument("--peer-rate-mbps", type=float, default=None,
                   help="agents' block-stream limit, Mbit/s (default: the regime's; 0: none)")
    r.add_argument("--hop-delay-ms", type=float, default=None,
                   help="mean per-token cost of a relay path's first hop (jitter and stalls scaled with it, "
                        "later hops dearer: pallas_eval.relay.REPLAY_HOP_COST; default: the regime's, 12.0 ms "
                        "in paper, 0 in native)")
    r.add_argument("--engine-multiprocessing", action="store_true",
                   help="vLLM's default engine/worker processes (busy-polls between steps); the default runs "
                        "the worker inside the EngineCore process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    r.add_argument("--out", default="runs/replay-" + time.strftime("%Y%m%d-%H%M%S"), help="output folder")
    r.add_argument("--no-verify", action="store_true", help="skip the no-handover reference check")
    r.add_argument("--simulate", action="store_true",
                   help="no engines: the same handovers through the timing model only (see --rates)")
    r.add_argument("--rates", default="auto",
                   help="timing-model rates: 'auto' (the emulated model's in paper regime, else measured), "
                        "'emulated', 'measured' (this run's), 'paper' (Qwen3-32B on the paper's GPU), "
                        "or a benchmarks/results JSON as FILE:MODEL")
    r.add_argument("--lead-s", type=float, default=3.0,
                   help="--simulate without a live run: the prediction lead assumed for every handover")
    r.add_argument("--xapp-profile", action="append", default=[], metavar="NAME|FILE",
                   help="merge a controls profile into the xApp's descriptor: a shipped one in descriptors/profiles "
                        "(drive-log: the predictor settings chosen on 1 s drive logs such as ../shared/data/ucc-5g) "
                        "or a JSON file; repeat to merge several in order")
    r.add_argument("--xapp-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="one descriptor control for the xApp, VALUE as JSON (e.g. scheduler.targets_k=2); "
                        "applied after the profiles; repeatable")
    r.add_argument("--xapp-python", default="", help="the xApp environment's python (default .venv/xapp)")
    r.add_argument("--xapp-replicas", type=_at_least_one, default=1, metavar="N",
                   help="run N xApp replicas (test mode, controls.cluster enabled, --replica-id xapp-0..N-1) "
                        "sharing the E2 nodes through a private redis-server (docs/scale-out.md; needs "
                        "redis-server); default 1: one xApp")
    r.add_argument("--kill-replica", default=None, metavar="I@T",
                   help="with --xapp-replicas N: SIGKILL replica I (0..N-1) T seconds of trace time after the "
                        "replay's start (its leases left to expire); the summary reports the fail-over "
                        "(pallas_eval.failover)")
    _add_experiment_parser(sub)
    cmp_ = sub.add_parser("compare", help="pair two builds' replays of the same drive and seed handover by "
                                          "handover: the mean SIT difference with its 95%% interval")
    cmp_.add_argument("a", help="arm A: a pallas replay output folder, or several comma-separated (averaged)")
    cmp_.add_argument("b", help="arm B, likewise")
    cmp_.add_argument("--scheme", default="pallas", help="the scheme whose SIT is compared")
    cmp_.add_argument("--json", action="store_true", help="one JSON object instead of text")
    rep = sub.add_parser("report", help="render replay runs' summary.json as a Markdown results page")
    rep.add_argument("runs", nargs="+", help="pallas replay output folders (each holds summary.json)")
    rep.add_argument("--markdown", action="store_true", help="Markdown (the only format; the default)")
    rep.add_argument("-o", "--out", help="write the page here (default: standard output)")
    rep.add_argument("--title", action="append", default=[],
                     help="a section's title, one per run in order (default: the folder's name)")
    rep.add_argument("--append", action="store_true",
                     help="add the runs' sections to the page at -o (a section of the same title is replaced), "
                          "keeping the sections of runs whose folders are gone")
    return p


def _add_experiment_parser(sub) -> None:
    """``pallas experiment NAME``: the paper's experiments (pallas_eval.experiments)."""
    from pallas_eval.experiments import NAMES
    from pallas_eval.experiments.presets import GPUS
    e = sub.add_parser("experiment", help="re-run one of the paper's experiments beside the paper's figures",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("name", choices=NAMES + ("all",))
    e.add_argument("--simulate", action="store_true",
                   help="the timing model at the paper's scale and rates (else the live mode: real xApp, agents, vLLM)")
    e.add_argument("--out", default="runs/experiments-" + time.strftime("%Y%m%d-%H%M%S"), help="output folder")
    e.add_argument("--gpu", default="rtx-a6000", choices=GPUS, help="rates: the paper's GPU or the measured H200")
    e.add_argument("--tiny", action="store_true", help="a tiny size of each experiment (seconds; for tests)")
    e.add_argument("--seed", type=int, default=17)
    e.add_argument("--hop-model", default=None, choices=("compounding", "linear"),
                   help="--simulate: Detour's per-hop cost fitted to Figure 1 (pallas_common.timing.HOP_COSTS): "
                        "'compounding' (each further relay hop stalls tokens more often; the default) or 'linear' "
                        "(every hop alike); taken by the experiments that relay over several hops (repeated)")
    e.add_argument("--reuse-replays", action="store_true",
                   help="live mode: read a replay already in --out (its summary.json) instead of running it again")
    e.add_argument("--emulate", default=None, choices=PR.MODELS,
                   help="live mode: the model the replay's engines and link emulate (default: the experiment's, "
                        "pallas_eval/experiments/live.py LIVE_SCALE)")


def cmd_experiment(a: argparse.Namespace) -> int:
    """Run ``a.name`` (or all six) and print the comparison with the paper."""
    from rich.console import Console

    from pallas_eval import experiments as ex
    from pallas_eval.experiments import live
    con = Console() if Console().is_terminal else Console(width=220)
    names = ex.NAMES if a.name == "all" else (a.name,)
    if a.hop_model is not None and not a.simulate:
        con.print("--hop-model applies to --simulate (the live replay's relay draws the default's hops)", markup=False)
        return 2
    if not a.simulate:
        runnable = [n for n in names if n in live.LIVE_DRIVERS and not live.missing()]
        for n in names:
            if n not in runnable:
                con.print(live.message(n), markup=False)
        if not runnable:
            return 2
        live.REUSE = a.reuse_replays
        for n in runnable:
            t0 = time.perf_counter()
            kw = {"emulate": a.emulate} if a.emulate else {}
            r = live.LIVE_DRIVERS[n](Path(a.out) / n, con, **kw)
            r.wall_s = time.perf_counter() - t0
            print_live(con, r)
            r.write(Path(a.out) / n)
        return 0 if len(runnable) == len(names) else 2
    t0 = time.perf_counter()
    out = Path(a.out)
    results = []
    for n in names:
        with con.status(f"{n} (simulate)"):
            results.append(ex.run_simulated(n, out, tiny=a.tiny, gpu=a.gpu, seed=a.seed, hop_model=a.hop_model))
    ex.print_results(con, results, time.perf_counter() - t0)
    con.print(f"outputs in {out}/<name>/")
    return 0


def print_live(con, r) -> None:
    """A live experiment's figures: per row (scheme or variant) the live SIT beside the timing
    model's on the same handovers and the paper's where it gives one."""
    con.print(f"[bold]{r.name} (live, {r.wall_s:.0f} s)[/]: " + "; ".join(r.notes), markup=True)
    keys = [k for k in ("t_avail_imposed_s", "window") if r.rows and k in r.rows[0]]
    for row in r.rows:
        tag = " ".join(f"{k}={row[k]}" for k in keys)
        paper = row.get("paper_sit_mean_ms")
        con.print(f"  {row['scheme']:14s} {tag:22s} SIT mean live {row['sit_mean_live_s'] * 1000:8.0f} ms  "
                  f"model {row['sit_mean_model_s'] * 1000:8.0f} ms"
                  + (f"  paper {paper:8.0f} ms" if paper is not None and math.isfinite(paper) else "")
                  + f"  p99 live {row['sit_p99_live_s'] * 1000:6.0f} ms  ITL mean/p99 {row['itl_mean_live_s'] * 1000:.0f}/"
                  f"{row['itl_p99_live_s'] * 1000:.0f} ms  ({row['handovers_with_session']} HOs, "
                  f"{row['prepared_commits']} prepared, lead {row['lead_mean_s']:.2f} s, window {row['window_mean_s']:.2f} s, "
                  f"CPU {row['cpu_cores']} cores, replay {row['replay_wall_s']} s)"
                  + (f"; at its {row['triggers']} triggers the engine predicted SIT "
                     f"{row['trigger_sit_pred_mean_s'] * 1000:.0f} ms, T_early {row['trigger_t_early_pred_mean_s'] * 1000:.0f} ms "
                     f"at window {row['trigger_window_mean_s']:.2f} s" if row.get("triggers") else ""), markup=False)
        if "sit_mean_concurrent_s" in row:
            con.print(f"    concurrent with another to the same target: {row['handovers_concurrent']} HOs, SIT mean/worst "
                      f"{row['sit_mean_concurrent_s'] * 1000:.0f}/{row['sit_max_concurrent_s'] * 1000:.0f} ms; alone: "
                      f"{row['handovers_alone']} HOs, {row['sit_mean_alone_s'] * 1000:.0f}/{row['sit_max_alone_s'] * 1000:.0f} ms; "
                      f"residents at the target within 2 s: ITL mean/p99 {row['resident_itl_mean_s'] * 1000:.0f}/"
                      f"{row['resident_itl_p99_s'] * 1000:.0f} ms ({row['resident_gaps']} gaps)", markup=False)
    for k, v in r.summary.items():
        if k in ("factors_over_pallas", "handovers_per_session", "concurrent_handovers"):
            con.print(f"  {k}: {v}", markup=False)


def _at_least_one(text: str) -> int:
    """An argparse type: an integer >= 1 (else argparse's one-line error, exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: at least 1")
    return n


def options_from_args(a: argparse.Namespace) -> rp.ReplayOptions:
    """ReplayOptions from ``pallas replay``'s arguments."""
    schemes = tuple(s.strip() for s in a.schemes.split(",") if s.strip()) + (ABLATIONS if a.ablations else ())
    return rp.ReplayOptions(out_dir=Path(a.out), trace=tuple(a.trace or ()), segment=a.segment, min_handovers=a.min_handovers,
                            servers=a.servers, schemes=schemes, seed=a.seed, ues=a.ues, duration_s=a.duration_s,
                            history_drives=a.history_drives, history=a.history,
                            azure=a.azure, model_preset=a.model_preset, max_model_len=a.max_model_len,
                            max_output=a.max_output, peer_rate_mbps=a.peer_rate_mbps, regime=a.regime,
                            emulate=a.emulate,
                            hop_delay_s=None if a.hop_delay_ms is None else a.hop_delay_ms / 1000.0,
                            engine_multiprocessing=a.engine_multiprocessing, verify=not a.no_verify,
                            simulate_only=a.simulate, rates=a.rates, xapp_python=a.xapp_python, lead_s=a.lead_s,
                            tls=not a.insecure, first_session_spread_s=a.first_session_spread_s,
                            seeds=_seeds(a.seeds), xapp_controls=xapp_overlay(a.xapp_profile, a.xapp_set),
                            xapp_replicas=a.xapp_replicas, kill_replica=_kill(a))


def _kill(a: argparse.Namespace):
    """``--kill-replica I@T`` as a pallas_eval.failover.KillSpec (None without it). Raises
    SystemExit with one line for a malformed one, I not below --xapp-replicas, T not > 0 or,
    for a generated drive, not before its --duration-s."""
    if a.kill_replica is None:
        return None
    from pallas_eval.failover import check_within, parse_kill
    try:
        k = parse_kill(a.kill_replica, a.xapp_replicas)
        if not a.trace:
            check_within(k, a.duration_s)
    except ValueError as exc:
        raise SystemExit(f"pallas replay: {exc}") from None
    return k


def xapp_overlay(profiles: Sequence[str], settings: Sequence[str]) -> dict:
    """The controls ``--xapp-profile`` and ``--xapp-set`` merge into the xApp's descriptor, in
    order, checked against the descriptor's schema with the shipped controls under them (so a
    misspelt key or a value out of range stops the replay before any engine starts). Raises
    SystemExit with the reason."""
    from xapp.config import ConfigError, validate_controls

    overlay: dict = {}
    try:
        for p in profiles:
            overlay = merge_controls(overlay, load_profile(p))
        for s in settings:
            overlay = merge_controls(overlay, parse_setting(s))
    except ValueError as exc:
        raise SystemExit(f"pallas replay: {exc}") from None
    if overlay:
        shipped = json.loads((rp.REPO / "descriptors" / "config-file.json").read_text())["controls"]
        try:
            validate_controls(merge_controls(shipped, overlay))
        except ConfigError as exc:
            raise SystemExit(f"pallas replay: --xapp-profile/--xapp-set: {exc}") from None
    return overlay


def _seeds(spec: str) -> tuple[int, ...]:
    """``--seeds 1,2,3`` as (1, 2, 3); "" as (). Raises SystemExit (argparse's way) for a
    non-integer or a repeated seed."""
    if not spec.strip():
        return ()
    try:
        out = tuple(int(x) for x in spec.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"--seeds: integers separated by commas, got {spec!r}") from None
    if len(set(out)) != len(out):
        raise SystemExit(f"--seeds: a seed repeated in {spec!r}")
    return out


def cmd_replay(a: argparse.Namespace) -> int:
    from rich.console import Console
    con = Console()
    if not con.is_terminal:
        con = Console(width=200)   # a log file or pipe: keep the tables' columns whole
    res = run_replay(options_from_args(a), con)
    return replay_status(res, con)


def replay_status(res: dict, con=None) -> int:
    """The replay's exit status: 1 when a process was left running or a scheme ran without its
    xApp (it wrote no events: that scheme's figures are not Pallas's decisions), else 0."""
    no_xapp = sorted(s for s, errs in (res.get("errors") or {}).items()
                     if any(str(e).startswith(rp.XAPP_SILENT) for e in errs))
    if no_xapp and con is not None:
        con.print(f"[red]the xApp did not run for {', '.join(no_xapp)}: their rows are not valid (see summary.json)[/]")
    return 1 if res.get("leftover_pids") or no_xapp else 0


def _stubs_importable() -> None:
    """Make ``pallas_proto`` importable when the project is not pip-installed (a checkout run
    with ``python -m pallas_eval.cli``): its stubs live in ``proto/``."""
    try:
        import pallas_proto  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(rp.REPO / "proto"))


def main(argv: Sequence[str] | None = None) -> int:
    _stubs_importable()
    a = build_parser().parse_args(argv)
    if a.cmd == "replay":
        return cmd_replay(a)
    if a.cmd == "experiment":
        return cmd_experiment(a)
    if a.cmd == "compare":
        from pallas_eval.compare import main_compare
        return main_compare(a.a, a.b, a.scheme, a.json)
    if a.cmd == "report":
        from pallas_eval.results_page import main_report
        return main_report(a.runs, a.out, a.title, a.append)
    return 2


if __name__ == "__main__":
    sys.exit(main())
