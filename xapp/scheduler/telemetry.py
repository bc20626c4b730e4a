"""Runtime estimates for the Scheduler Engine: EWMA-smoothed r_p, r_d and B with staleness.

Paper §4.2 "Mobility and telemetry inputs"; docs/model.md §2: r_p per target (prefill rate
available to migrations), r_d per session (decode rate at the source), B per source-target
pair (block-stream goodput), each an EWMA with the newest sample weighted ``ewma_weight``.
An estimate older than ``stale_age_s`` is not trusted: reads return the configured
conservative default until a fresh sample arrives, and that sample restarts the average.

Values are kept in numpy arrays indexed by a stable slot per key, so the engine reads the
estimates of thousands of sessions in one vectorised call (:meth:`EwmaTable.read`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Iterable

import numpy as np
import structlog

from pallas_common.schemes import SessionState

from .admission import ModelKey, ServerState
from .config import SchedulerConfig

__all__ = ["EwmaTable", "SessionSample", "TelemetryStore"]

log = structlog.get_logger(__name__)


class EwmaTable:
    """EWMA estimates keyed by any hashable key, with per-key update times.

    ``weight``: weight of the newest sample (0, 1]; ``stale_age_s``: age after which a value
    reads as ``default``. Samples that are not finite and positive are logged and dropped.
    """

    def __init__(self, name: str, weight: float, stale_age_s: float, default: float,
                 capacity: int = 64) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"EWMA weight must be in (0, 1], got {weight!r}")
        if not (stale_age_s > 0 and default > 0):
            raise ValueError("stale_age_s and default must be > 0")
        self.name, self.weight, self.stale_age_s, self.default = name, weight, stale_age_s, default
        self._slots: dict[Hashable, int] = {}
        self._free: list[int] = []
        self._value = np.full(capacity, np.nan)
        self._time = np.full(capacity, -np.inf)

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slots

    def slot(self, key: Hashable) -> int:
        """The slot of ``key``, created (reading as the default) if new."""
        i = self._slots.get(key)
        if i is not None:
            return i
        if self._free:
            i = self._free.pop()
        else:
            i = len(self._slots)
            if i >= self._value.size:
                grow = self._value.size
                self._value = np.concatenate([self._value, np.full(grow, np.nan)])
                self._time = np.concatenate([self._time, np.full(grow, -np.inf)])
        self._value[i], self._time[i] = np.nan, -np.inf
        self._slots[key] = i
        return i

    def update(self, key: Hashable, sample: float, now: float) -> bool:
        """Fold ``sample`` taken at ``now`` (s) into ``key``'s estimate; False if dropped."""
        try:
            x = float(sample)
            t = float(now)
        except (TypeError, ValueError):
            x, t = math.nan, math.nan
        if not (math.isfinite(x) and x > 0 and math.isfinite(t)):
            log.warning("telemetry_sample_dropped", table=self.name, key=str(key), sample=sample,
                        time=now)
            return False
        i = self.slot(key)
        old, then = self._value[i], self._time[i]
        if math.isnan(old) or t - then > self.stale_age_s:
            self._value[i] = x                        # fresh start after silence
        else:
            self._value[i] = self.weight * x + (1.0 - self.weight) * old
        self._time[i] = max(t, then)
        return True

    def get(self, key: Hashable, now: float) -> float:
        """The estimate of ``key`` at ``now``, or the default if unknown or stale."""
        i = self._slots.get(key)
        if i is None or not now - self._time[i] <= self.stale_age_s:
            return self.default
        return float(self._value[i])

    def is_fresh(self, key: Hashable, now: float) -> bool:
        """Whether ``key`` has an estimate no older than ``stale_age_s`` at ``now``."""
        i = self._slots.get(key)
        return i is not None and now - self._time[i] <= self.stale_age_s

    def read(self, slots: np.ndarray, now: float) -> np.ndarray:
        """Estimates for an int array of slots at ``now``; slot -1, unknown or stale: default."""
        slots = np.asarray(slots, dtype=np.int64)
        safe = np.where(slots >= 0, slots, 0)
        fresh = (slots >= 0) & (now - self._time[safe] <= self.stale_age_s)
        return np.where(fresh, self._value[safe], self.default)

    def forget(self, key: Hashable) -> None:
        """Drop ``key``; its slot is reused."""
        i = self._slots.pop(key, None)
        if i is not None:
            self._value[i], self._time[i] = np.nan, -np.inf
            self._free.append(i)


@dataclass(frozen=True)
class SessionSample:
    """One session as its serving agent reported it (``pallas_pb2.SessionTelemetry``).

    ``tokens``: K_curr; ``remaining_tokens``: tokens still to generate (None: unknown);
    ``decode_rate``: tokens/s (0: not reported); ``state``: the agent's
    ``SessionTelemetry.state`` read through :class:`pallas_common.schemes.SessionState` (None:
    empty or a state this version does not know); ``time``: report time, s.
    """

    session_id: str
    ue_id: str
    agent_id: str
    tokens: int
    remaining_tokens: int | None
    decode_rate: float
    state: SessionState | None
    epoch: int
    time: float


class TelemetryStore:
    """The engine's view of the agents: r_p per agent, r_d per session, B per agent pair,
    and each agent's last server report (model identity, free KV blocks) for admission.
    """

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.prefill = EwmaTable("prefill_rate", cfg.ewma_weight, cfg.stale_age_s,
                                 cfg.default_prefill_rate_tps)
        self.decode = EwmaTable("decode_rate", cfg.ewma_weight, cfg.stale_age_s,
                                cfg.default_decode_rate_tps, capacity=1024)
        self.goodput = EwmaTable("goodput", cfg.ewma_weight, cfg.stale_age_s,
                                 cfg.default_goodput_bytes_per_s)
        self._servers: dict[str, ServerState] = {}

    # -- samples ------------------------------------------------------------------------------
    def reconfigure(self, cfg: SchedulerConfig) -> None:
        """Take new parameters (EWMA weight, staleness, conservative defaults); the estimates
        themselves are kept."""
        self.cfg = cfg
        for table, default in ((self.prefill, cfg.default_prefill_rate_tps),
                               (self.decode, cfg.default_decode_rate_tps),
                               (self.goodput, cfg.default_goodput_bytes_per_s)):
            table.weight, table.stale_age_s, table.default = cfg.ewma_weight, cfg.stale_age_s, default

    def observe_prefill_rate(self, agent_id: str, tokens_per_s: float, now: float) -> bool:
        """A prefill-rate sample r_p available to migrations at ``agent_id`` (tokens/s)."""
        return self.prefill.update(agent_id, tokens_per_s, now)

    def observe_decode_rate(self, session_id: str, tokens_per_s: float, now: float) -> bool:
        """A decode-rate sample r_d of ``session_id`` at its source (tokens/s)."""
        return self.decode.update(session_id, tokens_per_s, now)

    def observe_goodput(self, source: str, target: str, bytes_per_s: float, now: float) -> bool:
        """A block-stream goodput sample B from ``source`` to ``target`` (bytes/s)."""
        return self.goodput.update((source, target), bytes_per_s, now)

    def observe_server(self, state: ServerState) -> None:
        """An agent's server report (model identity, free KV blocks); kept if it is the newest.

        A report whose time is not finite is logged and dropped."""
        if not math.isfinite(state.time):
            log.warning("server_report_dropped", agent=state.agent_id,
                        reason=f"report time {state.time!r} is not finite")
            return
        old = self._servers.get(state.agent_id)
        if old is None or state.time >= old.time:
            self._servers[state.agent_id] = state

    def ingest(self, report: Any, now: float | None = None) -> list[SessionSample]:
        """Fold in one ``pallas_pb2.TelemetryReport``; returns its sessions.

        The report's ``time`` is used (``now`` if it is 0); a report without an agent id or
        with a non-finite time is logged and dropped whole. Rates that are 0 mean "not
        measured" and are skipped; bad ones are logged and dropped. Nothing raises for a
        malformed report: what can be read is kept.
        """
        agent = report.agent_id
        t = float(report.time) if report.time else float(now if now is not None else 0.0)
        if not agent:
            log.warning("telemetry_report_dropped", reason="no agent_id")
            return []
        if not math.isfinite(t):
            # An infinite time would keep this report "fresh" and newer than every later one.
            log.warning("telemetry_report_dropped", agent=agent, reason=f"report time {t!r} is not finite")
            return []
        if report.HasField("server"):
            srv = report.server
            model = ModelKey.from_proto(srv.model) if srv.HasField("model") and srv.model.model else None
            self.observe_server(ServerState(agent, model, int(srv.free_kv_blocks),
                                            int(srv.total_kv_blocks), t))
            if srv.prefill_rate:
                self.observe_prefill_rate(agent, srv.prefill_rate, t)
        for peer in report.peers:
            if peer.agent_id and peer.goodput_bytes_per_s:
                self.observe_goodput(agent, peer.agent_id, peer.goodput_bytes_per_s, t)
        out = []
        for s in report.sessions:
            if not s.session_id:
                log.warning("telemetry_session_dropped", agent=agent, reason="no session_id")
                continue
            if s.decode_rate:
                self.observe_decode_rate(s.session_id, s.decode_rate, t)
            remaining = int(s.remaining_tokens) if (s.remaining_tokens or s.max_tokens) else None
            out.append(SessionSample(s.session_id, s.ue_id, agent, int(s.tokens), remaining,
                                     float(s.decode_rate), SessionState.of(s.state), int(s.epoch), t))
        return out

    # -- reads --------------------------------------------------------------------------------
    def prefill_rate(self, agent_id: str, now: float) -> float:
        """r_p at ``agent_id`` (tokens/s), the default if unknown or stale."""
        return self.prefill.get(agent_id, now)

    def decode_rate(self, session_id: str, now: float) -> float:
        """r_d of ``session_id`` (tokens/s), the default if unknown or stale."""
        return self.decode.get(session_id, now)

    def goodput_bytes_per_s(self, source: str, target: str, now: float) -> float:
        """B from ``source`` to ``target`` (bytes/s), the default if unknown or stale."""
        return self.goodput.get((source, target), now)

    def server(self, agent_id: str, now: float) -> ServerState | None:
        """``agent_id``'s last server report if fresh (no older than ``stale_age_s``)."""
        s = self._servers.get(agent_id)
        if s is None or now - s.time > self.cfg.stale_age_s:
            return None
        return s

    def model_of(self, agent_id: str) -> ModelKey | None:
        """The model ``agent_id`` last reported serving, however old (None if never)."""
        s = self._servers.get(agent_id)
        return None if s is None else s.model

    def forget_session(self, session_id: str) -> None:
        """Drop a finished session's estimates."""
        self.decode.forget(session_id)

    def agents(self) -> Iterable[str]:
        """Agents that have sent a server report."""
        return self._servers.keys()
