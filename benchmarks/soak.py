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

``--faults`` (issue 25 item 5) mixes injected faults into the hops (``--fault-share`` of them,
drawn by pallas_eval.soak_faults.FaultSchedule), each a Pallas hop (Trigger, Commit) with:

- ``kill-source``: the source's vLLM EngineCore SIGKILLed after the Trigger, then the Commit;
- ``kill-target``: the target's EngineCore SIGKILLed after the Commit, once it decodes;
  after either kill the harness replaces that vLLM server (a new one, ~20 s) and re-attaches
  its agent; meanwhile no session starts there and no hop goes there (at most ``--max-kills``);
- ``bad-block``: the target's fault-injecting connector (tests/fault_connector.py, which the
  servers run in this mode) drops its next verified block at the load (vLLM recomputes it);
- ``target-full``: every ``max_num_seqs`` slot of the target busy with sessions of its own
  while the Commit runs (they are aborted after it);
- ``sync-deadline``: the target's connector channel holds the session's Claim back past the
  commit deadline (tests/faults.hold_back): the Sync expires;
- ``peer-restart``: the target agent stopped and a new one started on its ports and vLLM
  between Trigger and Commit (sessions it served then are lost with it: counted apart).

``--targets K`` (issue 45; default 1: one target per hop, as above): with K >= 2 every
Pallas-style hop (``pallas``, ``cancel``, both retargets and every fault hop) Triggers one epoch
at K distinct agents up (ranks 0..K-1, pallas_eval.soak_faults.plan_targets) and commits where
the UE goes: the rank-0 target with probability 0.6, another prepared one otherwise, and in
5% of the ``pallas`` and ``retarget-trigger`` hops (and every ``retarget-commit``) an agent
no Trigger named (the engine falls back to ctHO there and releases every preparation; with
``--agents`` at K + 1 such a hop prepares K - 1, leaving one agent unprepared). A fault hits
the target the Commit names (always a prepared one). A hop prepares only the agents up: while
an engine is replaced (``--max-kills``), ``--agents`` K + 1 leaves K - 1 (the report counts hops
by targets prepared); ``--agents`` K + 2 keeps K through a replacement. After
an OK commit every other prepared target, after a Cancel or a newer epoch's Triggers every
superseded one, must hold nothing of that epoch ``lease_s`` + 2 s later (no inbound attempt,
hence no reservation) and at the end; the agents' lease counters (granted, renewed,
committed, released, expired, evicted; printed with every run) must balance with none held.

Every session ends as (pallas_eval.soak_faults.classify) exact, failed with a reason, short
(fewer tokens than asked, no reason: must be 0), mismatch (must be 0) or hung (no end within
``--end-bound-s`` of its last token: must be 0); a sampler records every agent's copy of every
session, and copies at two agents decoding at once count as two holders (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import signal
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
from agent.connector.messages import Claim  # noqa: E402
from agent.server import ServerConfig, VLLMServer, free_port  # noqa: E402
from agent.session import SamplingSpec, Session, SessionState  # noqa: E402
from pallas_eval.localca import LocalCA  # noqa: E402
from pallas_common.tls import LinkSecurity  # noqa: E402
from pallas_eval.models import build_model  # noqa: E402
from pallas_eval.soak_faults import (KILLS, LEASE_EVENTS, FaultSchedule, HopPlan,  # noqa: E402
                                     classify, decoding_at_once, lease_report, plan_targets)
from prometheus_client import REGISTRY  # noqa: E402
from tests.faults import engine_core, hold_back  # noqa: E402

BS = 32
PROMPT_LENS = (20, 31, 32, 33, 63, 64, 65, 96, 97, 150, 255, 256, 257, 400)
KINDS = {  # kind -> weight
    "pallas": 4, "full-copy": 1, "recomputation": 1, "ctho": 1, "detour": 1, "cancel": 1,
    "retarget-trigger": 1, "retarget-commit": 1}
MULTI = ("pallas", "cancel", "retarget-trigger", "retarget-commit")   # Trigger: K targets
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
    faults: Counter = field(default_factory=Counter)     # fault kind -> injected
    ends: Counter = field(default_factory=Counter)       # exact / failed / short / mismatch / hung
    causes: Counter = field(default_factory=Counter)     # failure reason (first 80 chars) -> n
    lost_to_restart: int = 0                             # sessions at an agent when it restarted
    bad_ends: list = field(default_factory=list)         # (session, end, detail) short/hung/mismatch
    restarts: list = field(default_factory=list)         # (what, agent, seconds)

    def done(self) -> bool:
        return self.migrations >= self.target


def _type_counts() -> Counter:
    """Live objects tracked by the garbage collector, by type name."""
    gc.collect()
    return Counter(type(o).__name__ for o in gc.get_objects())


def _lease_counts() -> dict[str, float]:
    """The agents' lease counters (agent.obs's ``pallas_lease_events``: one registry for every
    agent of this process)."""
    return {e: REGISTRY.get_sample_value("pallas_lease_events_total", {"event": e}) or 0.0
            for e in LEASE_EVENTS}


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
        self.schedule = FaultSchedule(self.rng, args.fault_share, args.max_kills) \
            if args.faults else None
        if self.schedule is not None and args.fault_weights:
            for item in args.fault_weights.split(","):
                kind, w = item.split("=")
                if kind not in self.schedule.weights:
                    raise SystemExit(f"--fault-weights: no fault kind {kind!r}")
                self.schedule.weights[kind] = float(w)
        self.up: list[bool] = []                       # agent i and its vLLM serve
        self.locks: list[asyncio.Lock] = []            # one patching fault per agent at a time
        self.fault_files: list[Path] = []
        self.drops: list[int] = []                     # drop_loads written to agent i's file
        self.gone: set[int] = set()                    # id() of agents replaced by a restart
        self.copies: dict[str, dict[int, tuple[Agent, Session]]] = {}   # sid -> every copy
        self.two: dict[str, list] = {}                 # sid -> its copies, decoded at once
        self.hist: dict[str, list] = {}                # sid -> [(hop kind, outcome)]
        self.cpu_gone: Counter = Counter()             # CPU s of vLLM servers replaced
        self.logs: list[str] = []                      # every vLLM server's log
        self._bg: set[asyncio.Task] = set()
        # --targets K >= 2: hops by what was prepared and where the UE went; every target a
        # commit or cancel must have released, (session, epoch, agent index); those found still
        # holding the session's attempt of that epoch lease_s + 2 s later
        self.multi: Counter = Counter()
        self.trigger_refused: Counter = Counter()      # status: message of a non-OK Trigger
        self.released: list[tuple[str, int, int]] = []
        self.holding_after: list[tuple] = []
        self._checks: set[asyncio.Task] = set()
        self.leases0: dict[str, float] = {}

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
                              lease_s=a.lease_s, session_ttl_s=a.session_ttl_s,
                              peer_identity=[n for n in names if n != name])
            agent = Agent(cfg, LinkSecurity(ca.write(pki, name)))
            await agent.start_core()
            faulty = {}
            if a.faults:  # the fault-injecting connector, driven by a control file per server
                ff = Path(pki) / f"faults-{i}.json"
                ff.write_text(json.dumps({"drop_loads": 0}))
                self.fault_files.append(ff)
                self.drops.append(0)
                faulty = {"kv_connector_module": "tests.fault_connector",
                          "kv_connector_class": "FaultyPallasConnector",
                          "kv_connector_extra": {"fault_file": str(ff)}}
            srv = VLLMServer(ServerConfig(model=model, agent_address=agent.hub.address,
                                          omp_threads_bind=str(i % max(1, os.cpu_count() or 1)),
                                          kv_cache_gib=a.kv_cache_gib,
                                          max_num_seqs=max(8, 2 * a.concurrency), **faulty))
            srv.start()
            self.agents.append(agent)
            self.servers.append(srv)
            self.up.append(True)
            self.locks.append(asyncio.Lock())
        loop = asyncio.get_running_loop()
        for agent, srv in zip(self.agents, self.servers):
            await loop.run_in_executor(None, srv.wait_ready, 900)
            await agent.attach(srv.base_url, 600)
            # The product's housekeeping (forget ended sessions, expire silent inbound attempts),
            # as Agent.start runs it, so that the agents' memory is what a deployment's is.
            self._housekeeping.append(asyncio.create_task(agent._housekeeping()))
        for agent in self.agents:  # one request each: the engines' first-step costs out of the way
            await agent.vllm_client.complete(self._prompt(40), SamplingSpec(max_tokens=4, ignore_eos=True))
        self.baseline = await self._free_blocks()

    async def stop(self) -> None:
        for t in [*self._housekeeping, *self._bg]:
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

    # ------------------------------------------------------------------ faults (--faults)
    def _i(self, agent: Agent) -> int:
        return next(i for i, ag in enumerate(self.agents) if ag.cfg.agent_id == agent.cfg.agent_id)

    def _live(self) -> list[Agent]:
        return [ag for ag, up in zip(self.agents, self.up) if up]

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _sampler(self) -> None:
        """Every 0.1 s: record every agent's copy of every soak session (to follow a session to
        its holder) and check that no two agents published new tokens of one session since
        the last sample (pallas_eval.soak_faults.decoding_at_once)."""
        last: dict[int, int] = {}
        publishing = (SessionState.SERVING, SessionState.MIGRATING, SessionState.RESUMED)
        while True:
            sample = []
            for ag in self.agents:
                for s in list(ag.sessions):
                    seen = self.copies.get(s.session_id)
                    if seen is None:
                        continue
                    seen.setdefault(id(s), (ag, s))
                    n = len(s.output_token_ids)
                    sample.append((s.session_id, ag.cfg.agent_id,
                                   s.state in publishing and s.frozen_at is None,
                                   last.get(id(s), n), n))
                    last[id(s)] = n
            for sid in decoding_at_once(sample):
                self.two.setdefault(sid, [
                    (ag.cfg.agent_id, c.state.value, c.resumed_from, len(c.output_token_ids),
                     c.error) for ag, c in self.copies[sid].values()])
            await asyncio.sleep(0.1)

    def _holder(self, sid: str, s: Session) -> tuple[Agent | None, Session]:
        """The copy of ``sid`` that holds it now: one still running (at an agent not restarted
        since), else the one with the most tokens that was not handed over, the latest of equals
        (``s`` when it knows no other)."""
        seen = list(self.copies.get(sid, {}).values())
        if not seen:
            return None, s
        rank = [(not c.done and id(ag) not in self.gone, c.state != SessionState.HANDED_OVER,
                 len(c.output_token_ids), i) for i, (ag, c) in enumerate(seen)]
        return seen[max(range(len(seen)), key=rank.__getitem__)]

    async def _free_blocks_of(self, i: int) -> int:
        await asyncio.sleep(0.6)
        return int(self.agents[i].hub.kv_stats().get("free_blocks", -1))

    async def _replace_engine(self, i: int, why: str) -> None:
        """Agent i's vLLM lost its engine core: wait (bounded) until its sessions ended, stop
        that server, start a new one and attach the agent to it; agent i is down meanwhile."""
        t0 = time.monotonic()
        ag, old = self.agents[i], self.servers[i]
        bound = time.monotonic() + 30.0
        while any(not s.done for s in ag.sessions) and time.monotonic() < bound:
            await asyncio.sleep(0.2)
        pending = [(s.session_id[:8], s.state.value) for s in ag.sessions if not s.done]
        t_wait = time.monotonic() - t0
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, old.stop)
        self.drops[i] = 0
        self.fault_files[i].write_text(json.dumps({"drop_loads": 0}))
        srv = VLLMServer(old.cfg)
        srv.start()
        self.servers[i] = srv
        self.logs.append(str(srv.log_path))
        await loop.run_in_executor(None, srv.wait_ready, 900)
        await ag.attach(srv.base_url, 600)
        await ag.vllm_client.complete(self._prompt(40), SamplingSpec(max_tokens=4, ignore_eos=True))
        self.baseline[i] = await self._free_blocks_of(i)
        self.up[i] = True
        self.tally.restarts.append((why, ag.cfg.agent_id, round(time.monotonic() - t0, 1),
                                    f"waited {t_wait:.1f} s for its sessions to end"
                                    + (f", still running: {pending}" if pending else "")))

    def _kill_core(self, i: int) -> None:
        """SIGKILL agent i's vLLM EngineCore (its server's CPU so far is kept for the report)."""
        srv = self.servers[i]
        self.cpu_gone[f"vllm-{i}"] += _cpu_s([srv.proc.pid])
        os.kill(engine_core(srv).pid, signal.SIGKILL)

    async def _restart_agent(self, i: int) -> None:
        """Stop agent i (its sessions there are lost with it) and start a new one on the same
        ports, hub address and vLLM server."""
        t0 = time.monotonic()
        old = self.agents[i]
        self.up[i] = False
        self.gone.add(id(old))
        self._housekeeping[i].cancel()
        await old.stop()
        new = Agent(old.cfg, old.security)
        await new.start_core()
        await new.attach(self.servers[i].base_url, 600)
        self.agents[i] = new
        self._housekeeping[i] = asyncio.create_task(new._housekeeping())
        self.up[i] = True
        self.tally.restarts.append(("peer-restart", old.cfg.agent_id, round(time.monotonic() - t0, 1)))

    async def _fill(self, tgt: Agent) -> list[Session]:
        """Every sequence slot of ``tgt``'s vLLM busy with a session of its own."""
        n = self.servers[self._i(tgt)].cfg.max_num_seqs
        busy = []
        for _ in range(n):
            b = Session(uuid.uuid4().hex, "ue-busy", self._prompt(40),
                        SamplingSpec(max_tokens=1500, ignore_eos=True))
            tgt.sessions.add(b)
            tgt.vllm_client.start(b)
            busy.append(b)
        t_end = time.monotonic() + 30
        while sum(1 for b in busy if b.output_token_ids) < n - self.args.concurrency \
                and time.monotonic() < t_end:
            await asyncio.sleep(0.05)
        return busy

    async def _unfill(self, tgt: Agent, busy: list[Session]) -> None:
        for b in busy:
            await tgt.vllm_client.abort(b)
            if not b.done:
                b.set_state(SessionState.FINISHED, finish_reason="abort")

    async def _fault_hop(self, kind: str, cur: Agent, s: Session, epoch: int, prompt_len: int
                         ) -> tuple[Agent, int, str]:
        """One Pallas hop from ``cur`` with the fault ``kind`` (see the module); with
        ``--targets`` K >= 2 the Triggers name K targets and the fault hits the one the Commit
        names (a prepared one)."""
        plan = self._plan(cur, unprepared=False) if self.args.targets > 1 else None
        tgt = plan.commit if plan else self.rng.choice([a for a in self._live() if a is not cur])
        ti, ci = self._i(tgt), self._i(cur)
        self.tally.faults[kind] += 1
        down = ci if kind == "kill-source" else ti
        if kind in KILLS or kind == "peer-restart":
            self.up[down] = False     # no other hop goes there, no other kill or restart
        replacing: list[bool] = []   # set by _faulty once a replacement runs (it brings it up)
        try:
            return await self._faulty(kind, cur, tgt, ci, ti, s, epoch, prompt_len, replacing,
                                      plan)
        finally:
            if (kind in KILLS or kind == "peer-restart") and not replacing:
                self.up[down] = True  # the fault was not carried out (or the restart is done)

    async def _faulty(self, kind: str, cur: Agent, tgt: Agent, ci: int, ti: int, s: Session,
                      epoch: int, prompt_len: int, replacing: list[bool],
                      plan: HopPlan | None = None) -> tuple[Agent, int, str]:
        sid = s.session_id
        n_now = prompt_len + len(s.output_token_ids)
        split = max(BS, n_now // BS * BS) if kind == "bad-block" else \
            self.rng.choice((0, n_now // BS * BS))
        if plan is not None:
            await self._trigger_at(cur, sid, epoch, plan.prepared, split)
        else:
            await cur.migration.trigger(sid, epoch, tgt.endpoint, split_tokens=split,
                                        scheme=pb.SCHEME_PALLAS)
        ue = self._commit_point(s, prompt_len)
        if ue > 0:
            await s.wait_tokens(ue - 1, 120)
        undo, busy, locked = None, [], None
        try:
            if kind == "kill-source":
                self._kill_core(ci)
                replacing.append(True)
                self._spawn(self._replace_engine(ci, kind))
                t_end = time.monotonic() + self.args.end_bound_s
                while not s.done and time.monotonic() < t_end:
                    await asyncio.sleep(0.05)
            elif kind == "bad-block":
                self.drops[ti] += 1
                self.fault_files[ti].write_text(json.dumps({"drop_loads": self.drops[ti]}))
            elif kind == "target-full":
                await self.locks[ti].acquire()
                locked = self.locks[ti]
                busy = await self._fill(tgt)
            elif kind == "sync-deadline":
                await self.locks[ti].acquire()
                locked = self.locks[ti]
                undo = hold_back(tgt, Claim, sid, self.args.commit_deadline_s + 1.0,
                                 asyncio.Event())
            elif kind == "peer-restart":
                await asyncio.sleep(self.rng.uniform(0.0, 0.2))
                replacing.append(True)   # the restart brings agent ti up itself
                await self._restart_agent(ti)
                tgt = self.agents[ti]
            rep = await cur.migration.commit(sid, epoch, tgt.endpoint, pb.SCHEME_PALLAS,
                                             ue_tokens=ue)
        finally:
            if undo is not None:
                await asyncio.sleep(1.5)   # the held-back claim reaches the target's hub
                undo()
            if busy:
                await self._unfill(tgt, busy)
            if locked is not None:
                locked.release()
        ok = self._outcome(kind, rep, sid, epoch, plan)
        moved = ok and s.state == SessionState.HANDED_OVER
        if kind == "kill-target":
            t = tgt.sessions.get(sid) if moved else None
            if t is not None:
                await t.wait_tokens(t.resumed_from + 3, 60)
            self._kill_core(ti)
            replacing.append(True)
            self._spawn(self._replace_engine(ti, kind))
        return (tgt if moved else cur), epoch + 1, "committed" if ok else pb.Status.Name(rep.status)

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
        if self.args.targets > 1 and kind in MULTI:
            return await self._multi_hop(kind, cur, s, epoch, prompt_len)
        sid = s.session_id
        others = [a for a in self._live() if a is not cur]
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
        ok = self._outcome(kind, rep)
        moved = ok and kind != "detour" and s.state == SessionState.HANDED_OVER
        return (tgt if moved else cur), epoch + 1, "committed" if ok else pb.Status.Name(rep.status)

    # ------------------------------------------------------------------ --targets K >= 2
    def _plan(self, cur: Agent, unprepared: bool | None = None) -> HopPlan:
        """Draw a multi-target hop from ``cur`` among the agents up (pallas_eval.soak_faults.
        plan_targets) and count how many targets it prepares."""
        plan = plan_targets(self.rng, [a for a in self._live() if a is not cur],
                            self.args.targets, unprepared=unprepared)
        self.multi[f"prepared {len(plan.prepared)}"] += 1
        return plan

    async def _trigger_at(self, cur: Agent, sid: str, epoch: int, targets: tuple, split: int
                          ) -> None:
        """Trigger ``sid`` of ``epoch`` at each of ``targets``, ``targets[r]`` with rank r."""
        for rank, t in enumerate(targets):
            rep = await cur.migration.trigger(sid, epoch, t.endpoint, split_tokens=split,
                                              scheme=pb.SCHEME_PALLAS, rank=rank)
            ok = rep.status == pb.STATUS_OK
            self.multi[f"trigger rank {rank} " + ("ok" if ok else pb.Status.Name(rep.status))] += 1
            if not ok:
                self.trigger_refused[f"{pb.Status.Name(rep.status)}: {rep.message}"[:90]] += 1

    def _watch_released(self, sid: str, epoch: int, targets) -> None:
        """``targets`` must hold nothing of ``sid``'s ``epoch`` (no inbound attempt, so no
        reservation either) once a Release had its time: checked ``lease_s`` + 2 s from now (a
        lost Release is then covered by the lease's expiry; a later hop's newer epoch there is
        not this one); each is checked again at the end."""
        idx = [self._i(t) for t in targets]
        self.released.extend((sid, epoch, i) for i in idx)

        async def check() -> None:
            await asyncio.sleep(self.args.lease_s + 2.0)
            for i in idx:
                inb = self.agents[i].migration.ctx.inbound.get(sid)
                if inb is not None and inb.epoch == epoch:
                    self.holding_after.append((sid[:12], epoch, self.agents[i].cfg.agent_id,
                                               inb.state.value, self.hist.get(sid, [])[-3:]))

        task = asyncio.get_running_loop().create_task(check())
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    def _outcome(self, kind: str, rep: pb.ControlReply, sid: str = "", epoch: int = 0,
                 plan: HopPlan | None = None) -> bool:
        """Count a hop's Commit reply (a migration when OK, else a refusal); with a
        multi-target ``plan``, where it went (:meth:`_committed`). Returns whether OK."""
        ok = rep.status == pb.STATUS_OK
        self._count(kind, ok)
        if not ok:
            self.tally.refused.append((kind, pb.Status.Name(rep.status), rep.message[:300]))
        else:
            self._migrated()
        if plan is not None:
            self._committed(sid, epoch, plan, ok)
        return ok

    def _committed(self, sid: str, epoch: int, plan: HopPlan, ok: bool) -> None:
        """Count where a multi-target commit went; after an OK every other target (all of
        them after a fallback to an unprepared agent) must be released."""
        where = "an unprepared agent" if plan.rank is None else f"rank {plan.rank}"
        self.multi[f"commit at {where} " + ("ok" if ok else "not ok")] += 1
        if ok:
            self._watch_released(sid, epoch, plan.released)

    async def _multi_hop(self, kind: str, cur: Agent, s: Session, epoch: int, prompt_len: int
                         ) -> tuple[Agent, int, str]:
        """One Pallas-style hop with ``--targets`` K >= 2 (see the module): Triggers of one
        epoch at K targets (ranks 0..K-1), then ``cancel``: Cancel (every target released);
        ``retarget-trigger``: a newer epoch's Triggers at K targets drawn again (the first ones
        superseded); ``retarget-commit``: the Commit at an agent no Trigger named; else the
        Commit where :func:`plan_targets` sends the UE."""
        sid, mig = s.session_id, cur.migration
        split = self.rng.choice((0, (prompt_len + len(s.output_token_ids)) // BS * BS))
        # the commit of a cancel and a retarget-trigger's first epoch is never made: K prepared
        plan = self._plan(cur, unprepared={"retarget-commit": True, "pallas": None}.get(kind, False))
        await self._trigger_at(cur, sid, epoch, plan.prepared, split)
        if kind == "cancel":
            await asyncio.sleep(self.rng.uniform(0.0, 0.15))
            rep = await mig.cancel(sid, epoch, "soak")
            ok = rep.status == pb.STATUS_OK and s.state != SessionState.HANDED_OVER
            self._count(kind, ok)
            if ok:
                self._watch_released(sid, epoch, plan.prepared)
            return cur, epoch + 1, "cancelled"
        if kind == "retarget-trigger":
            await asyncio.sleep(self.rng.uniform(0.0, 0.1))
            self._watch_released(sid, epoch, plan.prepared)   # superseded by the newer epoch
            epoch += 1
            plan = self._plan(cur)
            await self._trigger_at(cur, sid, epoch, plan.prepared, split)
        ue = self._commit_point(s, prompt_len)
        if ue > 0:
            await s.wait_tokens(ue - 1, 120)
        rep = await mig.commit(sid, epoch, plan.commit.endpoint, pb.SCHEME_PALLAS, ue_tokens=ue)
        ok = self._outcome(kind, rep, sid, epoch, plan)
        moved = ok and s.state == SessionState.HANDED_OVER
        return (plan.commit if moved else cur), epoch + 1, \
            "committed" if ok else pb.Status.Name(rep.status)

    def _migrated(self) -> None:
        self.tally.migrations += 1
        if self.args.faults and self.tally.migrations % 100 == 0:
            print(f"{time.strftime('%H:%M:%S')} {self.tally.migrations} migrations, faults "
                  f"{dict(self.tally.faults)}, ends {dict(self.tally.ends)}, two holders "
                  f"{len(self.two)}, restarts {len(self.tally.restarts)}", file=sys.stderr,
                  flush=True)
        if self.tally.migrations == self.tally.target // 2:
            self.tally.rss_mib["middle"] = round(_rss_mib(), 1)
            self.tally.types_middle = _type_counts()
            if tracemalloc.is_tracing():
                self.tally.snapshot = tracemalloc.take_snapshot()

    def _count(self, kind: str, ok: bool) -> None:
        self.tally.ops[(kind, "ok" if ok else "not ok")] += 1

    async def session(self) -> None:
        """One session: start, hop until it ends (or the soak has its migrations), compare."""
        home = self.rng.choice(self._live() or self.agents)
        prompt_len = self.rng.choice(PROMPT_LENS)
        prompt = self._prompt(prompt_len)
        max_tokens = self.rng.randint(self.args.min_tokens, self.args.max_tokens)
        sampling = SamplingSpec(max_tokens=max_tokens, ignore_eos=True)
        try:
            ref = await home.vllm_client.complete(prompt, sampling)
        except Exception as exc:  # noqa: BLE001 - its engine was killed (--faults): next one
            if not self.args.faults:
                raise
            print(f"reference at {home.cfg.agent_id} failed ({exc!r}); another session",
                  file=sys.stderr)
            await asyncio.sleep(1.0)
            return
        s = Session(uuid.uuid4().hex, "ue-soak", prompt, sampling)
        sid = s.session_id
        self.copies[sid] = {id(s): (home, s)}
        home.sessions.add(s)
        home.vllm_client.start(s)
        cur, epoch, hops = home, 1, 0
        kinds, weights = zip(*KINDS.items())
        while not self.tally.done():
            if s.done or len(s.output_token_ids) >= max_tokens - 2 or id(cur) in self.gone:
                break
            if not any(a is not cur for a in self._live()):
                await s.wait_tokens(len(s.output_token_ids), 0.5)   # no target up: wait
                continue
            # no kill or restart in the last fifth: the end need not wait for a vLLM start
            calm = all(self.up) and self.tally.migrations < 0.8 * self.tally.target
            fault = self.schedule.draw(calm) if self.schedule is not None else None
            kind = fault or self.rng.choices(kinds, weights)[0]
            try:
                if fault:
                    cur, epoch, how = await self._fault_hop(fault, cur, s, epoch, prompt_len)
                else:
                    cur, epoch, how = await self._hop(kind, cur, s, epoch, prompt_len)
                self.hist.setdefault(sid, []).append((kind, how, s.state.value))
            except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - reported
                if isinstance(exc, asyncio.CancelledError) and (
                        asyncio.current_task().cancelling() or not self.args.faults):
                    raise   # this worker is cancelled (else: a call cut by an agent's stop)
                if self.args.faults and (id(cur) in self.gone or not all(self.up)):
                    self.tally.causes[f"hop cut by a restart: {kind}: {exc!r}"[:80]] += 1
                else:
                    self.tally.failures.append((sid, f"{kind}: {exc!r}"))
                break
            s = cur.sessions.get(sid) or s
            hops += 1
        # Let it end where it is (following it to its holder), then compare everything it
        # produced with the reference.
        ended, lost, last_n, t_last = False, False, -1, time.monotonic()
        while True:
            if self.args.faults:
                who, s = self._holder(sid, s)
                cur = who or cur
            if id(cur) in self.gone and not s.done:
                lost = True
                break
            if s.done and (s.state != SessionState.HANDED_OVER or not self.args.faults):
                ended = True
                break
            if not self.args.faults and len(s.output_token_ids) >= max_tokens:
                ended = True
                break
            if len(s.output_token_ids) != last_n:
                last_n, t_last = len(s.output_token_ids), time.monotonic()
            elif time.monotonic() - t_last > self.args.end_bound_s:
                break
            if s.done:
                await asyncio.sleep(0.1)
            else:
                await s.wait_tokens(len(s.output_token_ids), 1.0)
        out = s.output_token_ids[:max_tokens]
        self.tally.sessions += 1
        if lost:
            self.tally.lost_to_restart += 1
            end = classify(out, ref, max_tokens, True, "its agent restarted")
        else:
            error = s.error if s.state == SessionState.FAILED else None
            end = classify(out, ref, max_tokens, ended, error)
            if error:
                self.tally.causes[error[:80]] += 1
        self.tally.ends[end] += 1
        if end in ("short", "hung", "mismatch"):
            self.tally.bad_ends.append((sid, end, f"at {cur.cfg.agent_id}: {s.state.value} "
                                        f"{len(out)}/{max_tokens} {s.finish_reason} {s.error}"))
        if not ended and not lost:
            self.tally.failures.append((sid, f"no end at {cur.cfg.agent_id}: "
                                        f"{s.state.value} {len(s.output_token_ids)}"))
        elif s.state == SessionState.FAILED and not self.args.faults:
            self.tally.failures.append((sid, f"failed at {cur.cfg.agent_id}: {s.error}"))
        elif end == "mismatch" or (not self.args.faults and out != ref):
            first = next((i for i, (x, y) in enumerate(zip(out, ref)) if x != y), min(len(out), len(ref)))
            self.tally.mismatches.append((sid, first, hops, len(out), len(ref)))

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
        self.logs = [str(srv.log_path) for srv in self.servers]

        def cpu_now() -> dict[str, float]:  # a replaced server's CPU up to its stop included
            return {me: _cpu_s([os.getpid()], children=False),
                    **{f"vllm-{i}": (_cpu_s([srv.proc.pid]) if srv.proc else 0.0)
                       + self.cpu_gone[f"vllm-{i}"] for i, srv in enumerate(self.servers)}}
        cpu0 = cpu_now()
        self.leases0 = _lease_counts()
        sampler = asyncio.create_task(self._sampler()) if a.faults else None
        self.tally.rss_mib["start"] = round(_rss_mib(), 1)
        t0 = time.monotonic()
        try:
            await asyncio.gather(*(self.worker() for _ in range(a.concurrency)))
            wall = time.monotonic() - t0
            t_bg = time.monotonic() + 900
            while self._bg and time.monotonic() < t_bg:   # engines still being replaced
                await asyncio.sleep(0.5)
            cpu = {k: round(v - cpu0[k], 1) for k, v in cpu_now().items()}  # restarts included
            wall_all = time.monotonic() - t0
            if sampler is not None:
                sampler.cancel()
            if self._checks:   # the last commits' other targets: each checked lease_s + 2 s on
                await asyncio.gather(*list(self._checks))
            # Settle: every session ended; the housekeeping's expiry has had its period.
            await asyncio.sleep(max(2.0, a.lease_s / 2))
            for agent in self.agents:
                await agent.migration.target.expire()
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
                "wall_s": round(wall, 1), "wall_with_restarts_s": round(wall_all, 1), "migrations_per_s": round(self.tally.migrations / wall, 2),
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
                "leases": lease_report(self.leases0, _lease_counts(),
                                       REGISTRY.get_sample_value("pallas_leases_held") or 0.0),
                "wasted_prefill_tokens": REGISTRY.get_sample_value(
                    "pallas_wasted_prefill_tokens_total") or 0.0,
            }
            if a.targets > 1:
                report["multi_target"] = {
                    "targets": a.targets, "hops": dict(sorted(self.multi.items())),
                    "triggers_not_ok": dict(self.trigger_refused.most_common(10)),
                    "released_targets_checked": len(self.released),
                    "holding_after_lease": self.holding_after[:30],
                    "holding_after_lease_n": len(self.holding_after),
                    "holding_at_end": sorted({
                        (sid[:12], e, self.agents[i].cfg.agent_id) for sid, e, i in self.released
                        if sid in self.agents[i].migration.ctx.inbound})[:30]}
            if a.tracemalloc:
                report["traced_growth_middle_to_end"] = growth
            if a.faults:
                dropped = 0
                for path in self.logs:
                    try:
                        dropped += Path(path).read_text(errors="replace").count(
                            "pallas fault: dropped block")
                    except OSError:
                        pass
                two = sorted(self.two)
                report["faults"] = {
                    "injected": dict(sorted(self.tally.faults.items())),
                    "injected_total": sum(self.tally.faults.values()),
                    "bad_blocks_dropped_at_load": dropped,
                    "session_ends": dict(sorted(self.tally.ends.items())),
                    "short_no_error": self.tally.ends["short"],
                    "never_ended": self.tally.ends["hung"],
                    "mismatched": self.tally.ends["mismatch"],
                    "two_holders": len(two),
                    "two_holder_sessions": {sid: self.two[sid] for sid in two[:20]},
                    "lost_to_agent_restart": self.tally.lost_to_restart,
                    "failure_reasons": dict(self.tally.causes.most_common(15)),
                    "bad_ends": self.tally.bad_ends[:30],
                    "restarts": self.tally.restarts,
                    "held_outbound_end": [
                        (ag.cfg.agent_id, sid[:12], o.state.value, o.epoch, o.target.agent_id,
                         o.session.state.value, o.session.finish_reason, o.session.error,
                         self.hist.get(sid, [])[-4:])
                        for ag in self.agents for sid, o in ag.migration.ctx.outbound.items()],
                    "fault_share": a.fault_share, "commit_deadline_s": a.commit_deadline_s}
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
    p.add_argument("--lease-s", type=float, default=10.0)
    p.add_argument("--session-ttl-s", type=float, default=5.0,
                   help="the agents forget ended sessions after this long (housekeeping)")
    p.add_argument("--targets", type=int, default=1,
                   help="K: every Pallas-style hop Triggers K targets of one epoch (issue 45; "
                        "1: one target, as before); <= --agents - 1")
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--json", help="also write the report here")
    p.add_argument("--faults", action="store_true",
                   help="inject faults into the hops (issue 25 item 5; see the module)")
    for flag, kind, default, text in (  # with --faults
            ("--fault-share", float, 0.25, "the share of hops that carry a fault"),
            ("--fault-weights", str, "", "KIND=W,... to change fault weights (default "
                                         "pallas_eval.soak_faults.FAULT_WEIGHTS)"),
            ("--max-kills", int, 10, "engine core kills at most (each restarts a vLLM)"),
            ("--end-bound-s", float, 90.0, "a session with no new token and no end this long "
                                           "counts as hung")):
        p.add_argument(flag, type=kind, default=default, help=f"with --faults: {text}")
    p.add_argument("--tracemalloc", action="store_true",
                   help="trace Python allocations; report the 15 lines that grew most from the "
                        "middle to the end (slower)")
    args = p.parse_args(argv)
    if args.agents < 2:
        p.error("--agents must be >= 2")
    if not 1 <= args.targets <= args.agents - 1:
        p.error(f"--targets must be in 1..--agents - 1 ({args.agents - 1}), got {args.targets}")
    report = asyncio.run(Soak(args).run())
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    leaked = sum(report["leaked_kv_blocks"])
    held = any(any(v for v in h.values()) for h in report["held_end"])
    ls, mt = report["leases"], report.get("multi_target")
    print(f"\nleases (every agent): granted {ls['granted']}, renewed {ls['renewed']}, committed "
          f"{ls['committed']}, released {ls['released']}, expired {ls['expired']}, evicted "
          f"{ls['evicted']}, held at the end {ls['held_end']}, balanced {ls['balanced']}; "
          f"wasted prefill tokens {report['wasted_prefill_tokens']:.0f}")
    leases_bad = ls["held_end"] or not ls["balanced"]
    if mt is not None:
        print(f"targets K={mt['targets']}: {mt['hops']}; released targets checked "
              f"{mt['released_targets_checked']}, still holding lease_s + 2 s later "
              f"{mt['holding_after_lease_n']}, at the end {len(mt['holding_at_end'])}")
        leases_bad = leases_bad or mt["holding_after_lease_n"] or mt["holding_at_end"]
    f = report.get("faults")
    if f is not None:
        print(f"\nfaults: {f['injected_total']} injected {f['injected']} "
              f"({f['bad_blocks_dropped_at_load']} blocks dropped at the load); session ends "
              f"{f['session_ends']}; finished short with no error {f['short_no_error']}, never "
              f"ended {f['never_ended']}, decoded by two agents at once {f['two_holders']}, "
              f"lost to an agent restart {f['lost_to_agent_restart']}; restarts "
              f"{len(f['restarts'])}; migrations by kind/outcome {report['ops']}")
        bad = (f["short_no_error"] or f["never_ended"] or f["two_holders"] or f["mismatched"]
               or leaked or held or report["failures"] or leases_bad)
        print(f"soak --faults: {report['migrations']} migrations in {report['wall_s']} s, "
              f"{report['sessions']} sessions, leaked KV blocks {leaked}, agents holding "
              f"anything: {held}, CPU s {report['cpu_s']}")
        return 1 if bad else 0
    print(f"\nsoak: {report['migrations']} migrations in {report['wall_s']} s "
          f"({report['migrations_per_s']}/s), {report['sessions']} sessions, "
          f"mismatches {len(report['mismatches'])}, failures {len(report['failures'])}, "
          f"leaked KV blocks {leaked}, agents holding anything: {held}, "
          f"RSS MiB {report['rss_mib']}, CPU s {report['cpu_s']}")
    return 0 if not report["mismatches"] and not leaked and not held and not report["failures"] \
        and not leases_bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
