"""Soak of the migration engine: N migrations between real vLLM servers (issue 12; run by hand,
not in CI, under the vLLM lock)::

    flock /tmp/pallas-vllm.lock nice -n 5 .venv/agent/bin/python benchmarks/soak.py \\
        --migrations 1000 [--agents 3] [--concurrency 6] [--json out.json]

Starts ``--agents`` agents in this process (mutual TLS on their peer links, as the e2e tests and
the replay run them) and one vLLM CPU server each with the product's Pallas connector at native
speed (no pacing; the tiny random-weight fp32 model of pallas_eval.models, greedy). Sessions run
``--concurrency`` at a time; each starts at a random agent with a random prompt (lengths at and
around block boundaries) and hops from agent to agent until it ends. Every hop is one of:

- ``pallas``: Trigger (a block-aligned split), decode on, Commit at the predicted target;
- ``full-copy`` / ``recomputation`` / ``ctho``: a reactive Commit (no Trigger);
- ``detour``: Commit with Detour (the source serves on);
- ``cancel``: Trigger, then Cancel (the source serves on), and a Pallas hop after it;
- ``retarget-trigger``: Trigger at one target, then a newer epoch's Trigger at another, Commit
  there; ``retarget-commit``: Trigger at one target, Commit at another (the engine falls back to
  ctHO there and releases the first).

Each Commit's point (``ue_tokens``) is put at or around a block boundary (n = k*bs - 1, k*bs,
k*bs + 1, k*bs + 2) or anywhere, also behind what the source has decoded (the source takes
those tokens back and the target decodes them again). A session's whole output is compared
with an unmigrated greedy reference of the same prompt (computed at its first agent).

Counted as migrations: Commits answered OK (detours included: the engine carried out the
scheme named); cancels and retargets are counted too. At the end every agent must hold
nothing (``held()`` all 0) and each engine's free KV blocks must be back at the baseline taken
after start-up (prefix-cached blocks are free in vLLM's pool), its connector tracking no
request, no export and no advertised block.

Prints: migrations by kind and outcome, mismatches (session, first differing output), leaked
KV blocks per engine, this process's RSS (the agents and the harness) at start, middle and end,
migrations/s, and CPU seconds per process (this process; each vLLM server's process group).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "proto")]

import psutil  # noqa: E402
from pallas_proto import pallas_pb2 as pb  # noqa: E402

from agent.app import Agent, AgentConfig  # noqa: E402
from agent.server import ServerConfig, VLLMServer, free_port  # noqa: E402
from agent.session import SamplingSpec, Session, SessionState  # noqa: E402
from pallas_common.localca import LocalCA  # noqa: E402
from pallas_common.tls import LinkSecurity  # noqa: E402
from pallas_eval.models import build_model  # noqa: E402

BS = 32
PROMPT_LENS = (20, 31, 32, 33, 63, 64, 65, 96, 97, 150, 255, 256, 257, 400)
KINDS = {  # kind -> weight
    "pallas": 4, "full-copy": 1, "recomputation": 1, "ctho": 1, "detour": 1, "cancel": 1,
    "retarget-trigger": 1, "retarget-commit": 1}
REACTIVE = {"full-copy": pb.SCHEME_FULL_COPY, "recomputation": pb.SCHEME_RECOMPUTATION,
            "ctho": pb.SCHEME_CTHO, "detour": pb.SCHEME_DETOUR}


@dataclass
class Tally:
    """What the soak counted."""

    target: int
    migrations: int = 0
    ops: Counter = field(default_factory=Counter)        # (kind, outcome) -> count
    sessions: int = 0
    mismatches: list = field(default_factory=list)       # (session, first index, resumed hops)
    failures: list = field(default_factory=list)         # (session, why)
    rss_mib: dict = field(default_factory=dict)          # start / middle / end
    refused: list = field(default_factory=list)          # (kind, status, message) of non-OK commits
    snapshot: object = None                              # tracemalloc at the middle (--tracemalloc)
    types_middle: Counter = field(default_factory=Counter)  # live objects by type at the middle
    t0: float = 0.0

    def done(self) -> bool:
        return self.migrations >= self.target


def _type_counts() -> Counter:
    """Live objects tracked by the garbage collector, by type name."""
    gc.collect()
    return Counter(type(o).__name__ for o in gc.get_objects())


def _rss_mib() -> float:
    return psutil.Process().memory_info().rss / (1 << 20)


def _cpu_s(pids: list[int], children: bool = True) -> float:
    """CPU seconds (user + system) of the processes ``pids`` and, with ``children``, all their
    descendants (a vLLM server's API process and its EngineCore)."""
    total = 0.0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs = [p, *(p.children(recursive=True) if children else ())]
        except psutil.Error:
            continue
        for q in procs:
            try:
                t = q.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


class Soak:
    """The agents, their servers and the session workers (see the module)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.tally = Tally(target=args.migrations)
        self.agents: list[Agent] = []
        self.servers: list[VLLMServer] = []
        self.baseline: list[int] = []
        self._housekeeping: list[asyncio.Task] = []

    # ------------------------------------------------------------------ set-up
    async def start(self) -> None:
        a = self.args
        model = str(build_model("tiny"))
        names = [f"soak-{i}" for i in range(a.agents)]
        ca, pki = LocalCA("pallas-soak-ca"), tempfile.mkdtemp(prefix="pallas-soak-tls-")
        for i, name in enumerate(names):
            cfg = AgentConfig(agent_id=name, model=model, host="127.0.0.1", peer_port=free_port(),
                              hub_address=f"tcp://127.0.0.1:{free_port()}", vllm_url="-",
                              resume_deadline_s=a.resume_deadline_s,
                              commit_deadline_s=a.commit_deadline_s,
                              inbound_idle_s=a.inbound_idle_s, session_ttl_s=a.session_ttl_s,
                              peer_identity=[n for n in names if n != name])
            agent = Agent(cfg, LinkSecurity(ca.write(pki, name)))
            await agent.start_core()
            srv = VLLMServer(ServerConfig(model=model, agent_address=agent.hub.address,
                                          omp_threads_bind=str(i % max(1, os.cpu_count() or 1)),
                                          kv_cache_gib=a.kv_cache_gib,
                                          max_num_seqs=max(8, 2 * a.concurrency)))
            srv.start()
            self.agents.append(agent)
            self.servers.append(srv)
        loop = asyncio.get_running_loop()
        for agent, srv in zip(self.agents, self.servers):
            await loop.run_in_executor(None, srv.wait_ready, 900)
            await agent.attach(srv.base_url, 600)
            # The product's housekeeping (forget ended sessions, expire silent inbound attempts),
            # as Agent.start runs it, so that the agents' memory is what a deployment's is.
            self._housekeeping.append(asyncio.create_task(agent._housekeeping()))
        for agent in self.agents:  # one request each: the engines' first-step costs out of the way
            await agent.engine.complete(self._prompt(40), SamplingSpec(max_tokens=4, ignore_eos=True))
        self.baseline = await self._free_blocks()

    async def stop(self) -> None:
        for t in self._housekeeping:
            t.cancel()
        for agent in self.agents:
            try:
                await agent.stop()
            except Exception as exc:  # noqa: BLE001 - best effort at the end
                print(f"stop {agent.cfg.agent_id}: {exc!r}", file=sys.stderr)
        for srv in self.servers:
            srv.stop()

    async def _free_blocks(self) -> list[int]:
        await asyncio.sleep(0.6)  # two hello periods of the connectors
        return [int(a.hub.kv_stats().get("free_blocks", -1)) for a in self.agents]

    def _prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(3, 2000) for _ in range(n)]

    # ------------------------------------------------------------------ one session
    def _commit_point(self, s: Session, prompt_len: int) -> int:
        """Output tokens at the commit (``ue_tokens``): n at or around a block boundary (or
        anywhere), past the session's resume point here, at most ``ahead`` tokens on."""
        low = prompt_len + s.resumed_from + 1
        n_now = prompt_len + len(s.output_token_ids)
        base = max(low, n_now + self.rng.randint(-20, self.args.ahead))
        if self.rng.random() < 0.8:
            k = max(1, base // BS + self.rng.randint(0, 1))
            n = k * BS + self.rng.choice((-1, 0, 1, 2))
        else:
            n = base
        return max(n, low) - prompt_len

    async def _hop(self, kind: str, cur: Agent, s: Session, epoch: int, prompt_len: int
                   ) -> tuple[Agent, int, str]:
        """One hop of ``kind`` from ``cur``; returns (agent serving after it, epoch used, outcome)."""
        sid = s.session_id
        others = [a for a in self.agents if a is not cur]
        tgt = self.rng.choice(others)
        split = self.rng.choice((0, (prompt_len + len(s.output_token_ids)) // BS * BS))
        mig = cur.migration
        if kind == "cancel":
            rep = await mig.trigger(sid, epoch, tgt.endpoint, split_tokens=split, scheme=pb.SCHEME_PALLAS)
            await asyncio.sleep(self.rng.uniform(0.0, 0.15))
            rep = await mig.cancel(sid, epoch, "soak")
            self._count(kind, rep.status == pb.STATUS_OK and s.state != SessionState.HANDED_OVER)
            return cur, epoch + 1, "cancelled"
        if kind in ("pallas", "retarget-trigger", "retarget-commit"):
            rep = await mig.trigger(sid, epoch, tgt.endpoint, split_tokens=split, scheme=pb.SCHEME_PALLAS)
            if kind == "retarget-trigger":
                await asyncio.sleep(self.rng.uniform(0.0, 0.1))
                tgt2 = self.rng.choice([a for a in others if a is not tgt] or others)
                epoch += 1
                rep = await mig.trigger(sid, epoch, tgt2.endpoint, split_tokens=split,
                                        scheme=pb.SCHEME_PALLAS)
                tgt = tgt2
            elif kind == "retarget-commit":
                tgt = self.rng.choice([a for a in others if a is not tgt] or others)
            scheme = pb.SCHEME_PALLAS
        else:
            scheme = REACTIVE[kind]
        ue = self._commit_point(s, prompt_len)
        if ue > 0:
            await s.wait_tokens(ue - 1, 120)  # [] if it ends first: the commit then takes it as is
        rep = await mig.commit(sid, epoch, tgt.endpoint, scheme, ue_tokens=ue)
        ok = rep.status == pb.STATUS_OK
        self._count(kind, ok)
        if not ok:
            self.tally.refused.append((kind, pb.Status.Name(rep.status), rep.message[:300]))
        if ok:
            self.tally.migrations += 1
            if self.tally.migrations == self.tally.target // 2:
                self.tally.rss_mib["middle"] = round(_rss_mib(), 1)
                self.tally.types_middle = _type_counts()
                if tracemalloc.is_tracing():
                    self.tally.snapshot = tracemalloc.take_snapshot()
        moved = ok and kind != "detour" and s.state == SessionState.HANDED_OVER
        return (tgt if moved else cur), epoch + 1, "committed" if ok else pb.Status.Name(rep.status)

    def _count(self, kind: str, ok: bool) -> None:
        self.tally.ops[(kind, "ok" if ok else "not ok")] += 1

    async def session(self) -> None:
        """One session: start, hop until it ends (or the soak has its migrations), compare."""
        home = self.rng.choice(self.agents)
        prompt_len = self.rng.choice(PROMPT_LENS)
        prompt = self._prompt(prompt_len)
        max_tokens = self.rng.randint(self.args.min_tokens, self.args.max_tokens)
        sampling = SamplingSpec(max_tokens=max_tokens, ignore_eos=True)
        ref = await home.engine.complete(prompt, sampling)
        s = Session(uuid.uuid4().hex, "ue-soak", prompt, sampling)
        home.sessions.add(s)
        home.engine.start(s)
        cur, epoch, hops = home, 1, 0
        kinds, weights = zip(*KINDS.items())
        while not self.tally.done():
            if s.done or len(s.output_token_ids) >= max_tokens - 2:
                break
            kind = self.rng.choices(kinds, weights)[0]
            try:
                cur, epoch, _ = await self._hop(kind, cur, s, epoch, prompt_len)
            except Exception as exc:  # noqa: BLE001 - a harness error is reported, not hidden
                self.tally.failures.append((s.session_id, f"{kind}: {exc!r}"))
                break
            s = cur.sessions.get(s.session_id) or s
            hops += 1
        # Let it end where it is, then compare everything it produced with the reference.
        t_end = time.monotonic() + 300
        while not s.done and len(s.output_token_ids) < max_tokens:
            if time.monotonic() > t_end:
                self.tally.failures.append((s.session_id, f"no end at {cur.cfg.agent_id}: "
                                            f"{s.state.value} {len(s.output_token_ids)}"))
                break
            await s.wait_tokens(len(s.output_token_ids), 5.0)
        out = s.output_token_ids[:max_tokens]
        if s.state == SessionState.FAILED:
            self.tally.failures.append((s.session_id, f"failed at {cur.cfg.agent_id}: {s.error}"))
        elif out != ref:
            first = next((i for i, (x, y) in enumerate(zip(out, ref)) if x != y), min(len(out), len(ref)))
            self.tally.mismatches.append((s.session_id, first, hops, len(out), len(ref)))
        self.tally.sessions += 1

    async def worker(self) -> None:
        while not self.tally.done():
            await self.session()

    # ------------------------------------------------------------------ the run
    async def run(self) -> dict:
        a = self.args
        await self.start()
        if a.tracemalloc:
            tracemalloc.start()
        me = "soak (agents + harness)"  # this process only: the servers are its children
        pids = {me: [os.getpid()],
                **{f"vllm-{i}": [srv.proc.pid] for i, srv in enumerate(self.servers) if srv.proc}}

        def cpu_now() -> dict[str, float]:
            return {k: _cpu_s(v, children=k != me) for k, v in pids.items()}
        cpu0 = cpu_now()
        self.tally.rss_mib["start"] = round(_rss_mib(), 1)
        t0 = time.monotonic()
        try:
            await asyncio.gather(*(self.worker() for _ in range(a.concurrency)))
            wall = time.monotonic() - t0
            cpu = {k: round(v - cpu0[k], 1) for k, v in cpu_now().items()}
            # Settle: every session ended; the housekeeping's expiry has had its period.
            await asyncio.sleep(max(2.0, a.inbound_idle_s / 2))
            for agent in self.agents:
                await agent.migration.expire()
            free = await self._free_blocks()
            self.tally.rss_mib["end"] = round(_rss_mib(), 1)
            types_end = _type_counts()
            grew = sorted(((n - self.tally.types_middle.get(t, 0), t) for t, n in types_end.items()),
                          reverse=True)[:12]
            growth = []
            if self.tally.snapshot is not None:
                diff = tracemalloc.take_snapshot().compare_to(self.tally.snapshot, "lineno")
                growth = [str(d) for d in diff[:15]]
            report = {
                "migrations": self.tally.migrations, "sessions": self.tally.sessions,
                "wall_s": round(wall, 1), "migrations_per_s": round(self.tally.migrations / wall, 2),
                "ops": {f"{k}/{o}": n for (k, o), n in sorted(self.tally.ops.items())},
                "mismatches": self.tally.mismatches, "failures": self.tally.failures,
                "refused": self.tally.refused,
                "kv_free_baseline": self.baseline, "kv_free_end": free,
                "leaked_kv_blocks": [b - f for b, f in zip(self.baseline, free)],
                "held_end": [ag.migration.held() for ag in self.agents],
                "connector_end": [{k: ag.hub.kv_stats().get(k) for k in
                                   ("exports", "avail_blocks", "tracked_reqs")}
                                  for ag in self.agents],
                "sessions_in_stores_end": [len(list(ag.sessions)) for ag in self.agents],
                "rss_mib": self.tally.rss_mib, "cpu_s": cpu,
                "live_objects_grown_middle_to_end": {t: d for d, t in grew if d > 0},
                "cpu_share_of_wall": {k: round(v / wall, 2) for k, v in cpu.items()},
                "agents": a.agents, "concurrency": a.concurrency, "seed": a.seed,
            }
            if a.tracemalloc:
                report["traced_growth_middle_to_end"] = growth
            return report
        finally:
            await self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--migrations", type=int, default=1000, help="OK commits to reach")
    p.add_argument("--agents", type=int, default=3, help="agents (and vLLM servers), >= 2")
    p.add_argument("--concurrency", type=int, default=6, help="sessions at a time")
    p.add_argument("--min-tokens", type=int, default=120, help="shortest session, output tokens")
    p.add_argument("--max-tokens", type=int, default=400, help="longest session, output tokens")
    p.add_argument("--ahead", type=int, default=40,
                   help="a commit point at most this many tokens past what the source decoded")
    p.add_argument("--kv-cache-gib", type=float, default=0.5)
    p.add_argument("--commit-deadline-s", type=float, default=10.0)
    p.add_argument("--resume-deadline-s", type=float, default=5.0)
    p.add_argument("--inbound-idle-s", type=float, default=10.0)
    p.add_argument("--session-ttl-s", type=float, default=5.0,
                   help="the agents forget ended sessions after this long (housekeeping)")
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--json", help="also write the report here")
    p.add_argument("--tracemalloc", action="store_true",
                   help="trace Python allocations; report the 15 lines that grew most from the "
                        "middle to the end (slower)")
    args = p.parse_args(argv)
    if args.agents < 2:
        p.error("--agents must be >= 2")
    report = asyncio.run(Soak(args).run())
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    leaked = sum(report["leaked_kv_blocks"])
    held = any(any(v for v in h.values()) for h in report["held_end"])
    print(f"\nsoak: {report['migrations']} migrations in {report['wall_s']} s "
          f"({report['migrations_per_s']}/s), {report['sessions']} sessions, "
          f"mismatches {len(report['mismatches'])}, failures {len(report['failures'])}, "
          f"leaked KV blocks {leaked}, agents holding anything: {held}, "
          f"RSS MiB {report['rss_mib']}, CPU s {report['cpu_s']}")
    return 0 if not report["mismatches"] and not leaked and not held and not report["failures"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
