"""Telemetry for the xApp's window decision (docs/model.md §2-4), measured here, never taken
from peak hardware figures: per session K_curr (tokens) and the decode rate r_d (tokens/s); per
server the prefill rate r_p available to migrations (tokens/s, from vLLM's prefill histograms
and the agent's warm-ups), free and total KV blocks, the aggregate decode rate and the model
identity; per peer the block-stream goodput B (bytes/s), bytes sent and RTT. Rates are EWMAs
with weight ``alpha`` on the newest sample (docs/model.md §2: default 0.3).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from pallas_proto import pallas_pb2

from agent.obs import get_logger
from pallas_common.aio import cancel_and_wait

__all__ = ["Ewma", "VllmMetrics", "VllmScraper", "parse_vllm_metrics", "TelemetryCollector"]

_log = get_logger("pallas.agent.telemetry")


class Ewma:
    """Exponentially weighted moving average; ``alpha`` weighs the newest sample (0 < alpha <= 1).

    ``value`` is None until the first sample.
    """

    def __init__(self, alpha: float = 0.3) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.value: float | None = None

    def update(self, sample: float) -> float:
        """Fold in one sample (non-finite samples are ignored); returns the new value."""
        if not math.isfinite(sample):
            return self.value if self.value is not None else 0.0
        self.value = sample if self.value is None else self.alpha * sample + (1 - self.alpha) * self.value
        return self.value


@dataclass
class VllmMetrics:
    """The figures the agent reads from one scrape of vLLM's ``/metrics``.

    Attributes:
        prefill_time_s: sum of ``vllm:request_prefill_time_seconds`` (s).
        prefill_tokens: sum of ``vllm:request_prefill_kv_computed_tokens`` (tokens whose KV
            was computed by prefill, cached tokens excluded).
        generation_tokens: ``vllm:generation_tokens`` total.
        kv_usage: ``vllm:kv_cache_usage_perc`` (a fraction, 1 = full).
        total_blocks: ``num_gpu_blocks`` label of ``vllm:cache_config_info`` (0 if absent).
        block_size: ``block_size`` label of ``vllm:cache_config_info`` (0 if absent).
        at: ``time.monotonic()`` of the scrape.
    """

    prefill_time_s: float = 0.0
    prefill_tokens: float = 0.0
    generation_tokens: float = 0.0
    kv_usage: float = 0.0
    total_blocks: int = 0
    block_size: int = 0
    at: float = field(default_factory=time.monotonic)

    @property
    def free_blocks(self) -> int:
        """KV blocks not in use: total * (1 - usage), rounded down."""
        return int(self.total_blocks * max(0.0, 1.0 - self.kv_usage))


def parse_vllm_metrics(text: str, at: float | None = None) -> VllmMetrics:
    """Parse vLLM's Prometheus exposition text into :class:`VllmMetrics` (sums over engines).

    Raises:
        ValueError: the text is not Prometheus exposition format.
    """
    m = VllmMetrics(at=time.monotonic() if at is None else at)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            n, v = s.name, s.value
            if n == "vllm:request_prefill_time_seconds_sum":
                m.prefill_time_s += v
            elif n == "vllm:request_prefill_kv_computed_tokens_sum":
                m.prefill_tokens += v
            elif n in ("vllm:generation_tokens_total", "vllm:generation_tokens"):
                m.generation_tokens += v
            elif n == "vllm:kv_cache_usage_perc":
                m.kv_usage = max(m.kv_usage, v)
            elif n == "vllm:cache_config_info":
                try:
                    m.total_blocks += int(float(s.labels.get("num_gpu_blocks") or 0))
                    m.block_size = int(float(s.labels.get("block_size") or 0))
                except ValueError:
                    pass
    return m


class VllmScraper:
    """Polls a vLLM server's ``/metrics`` and keeps the derived rates.

    r_p sample = delta(prefill KV tokens) / delta(prefill time) between two scrapes, taken
    only when at least ``min_prefill_tokens`` were prefilled in between (a one-token resume
    or a short prompt measures step overhead, not the prefill rate available to a migration).
    The aggregate decode rate is delta(generation tokens) / delta(wall time).

    :meth:`migration_prefill_rate` is the r_p a migration gets here (docs/model.md §2): the
    agent's own prefix warm-ups while one was timed in the last ``warmup_fresh_s``, else vLLM's.

    Args:
        base_url: vLLM server URL.
        period_s: scrape period, seconds.
        alpha: EWMA weight of the newest sample.
        min_prefill_tokens: smallest prefill volume that counts as an r_p sample.
        client: an httpx.AsyncClient to use (tests); one is created otherwise.
    """

    def __init__(self, base_url: str, *, period_s: float = 1.0, alpha: float = 0.3,
                 min_prefill_tokens: int = 64, client: httpx.AsyncClient | None = None,
                 warmup_fresh_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.period_s = period_s
        self.min_prefill_tokens = min_prefill_tokens
        self.prefill_rate = Ewma(alpha)
        self.prefill_measured_at = 0.0  # time.time() of the last real r_p measurement
        self.warmup_rate = Ewma(alpha)
        self.warmup_measured_at = 0.0   # time.time() of the last timed warm-up
        self.warmup_fresh_s = warmup_fresh_s
        self.decode_rate = Ewma(alpha)
        self.last: VllmMetrics | None = None
        self._client = client
        self._task: asyncio.Task | None = None

    def observe(self, m: VllmMetrics) -> None:
        """Fold one scrape into the rates (public so tests and probes can feed it)."""
        prev, self.last = self.last, m
        if prev is None:
            return
        d_tok = m.prefill_tokens - prev.prefill_tokens
        d_t = m.prefill_time_s - prev.prefill_time_s
        if d_tok >= self.min_prefill_tokens and d_t > 0:
            self.prefill_rate.update(d_tok / d_t)
            self.prefill_measured_at = time.time()
        wall = m.at - prev.at
        if wall > 0:
            self.decode_rate.update(max(0.0, m.generation_tokens - prev.generation_tokens) / wall)

    def observe_prefill(self, tokens: int, seconds: float, *, warmup: bool = False) -> None:
        """Fold in a prefill timed elsewhere (a probe, or with ``warmup`` a migration's prefix
        warm-up, which also feeds :meth:`migration_prefill_rate`)."""
        if tokens >= self.min_prefill_tokens and seconds > 0:
            self.prefill_rate.update(tokens / seconds)
            self.prefill_measured_at = time.time()
            if warmup:
                self.warmup_rate.update(tokens / seconds)
                self.warmup_measured_at = self.prefill_measured_at

    def migration_prefill_rate(self, now: float | None = None) -> tuple[float, float]:
        """(r_p a migration gets here, tokens/s; time.time() it was measured): the warm-ups'
        while fresh, else the engine's figure; (0, 0) before any measurement."""
        now = time.time() if now is None else now
        if self.warmup_rate.value and now - self.warmup_measured_at <= self.warmup_fresh_s:
            return float(self.warmup_rate.value), self.warmup_measured_at
        if self.prefill_rate.value:
            return float(self.prefill_rate.value), self.prefill_measured_at
        return 0.0, 0.0

    async def scrape_once(self) -> VllmMetrics | None:
        """One scrape; returns the parsed metrics or None if the server did not answer."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=5.0)
        try:
            r = await self._client.get(f"{self.base_url}/metrics")
            r.raise_for_status()
            m = parse_vllm_metrics(r.text)
        except (httpx.HTTPError, ValueError) as e:
            _log.debug("vllm_metrics_unavailable", url=self.base_url, error=repr(e))
            return None
        self.observe(m)
        return m

    async def run(self) -> None:
        """Scrape every ``period_s`` until cancelled."""
        while True:
            await self.scrape_once()
            await asyncio.sleep(self.period_s)

    def start(self) -> asyncio.Task:
        """Start :meth:`run` as a background task."""
        self._task = asyncio.get_running_loop().create_task(self.run(), name="vllm-scraper")
        return self._task

    async def stop(self) -> None:
        """Stop the background task and close the HTTP client."""
        await cancel_and_wait(self._task)
        if self._client is not None:
            await self._client.aclose()


class TelemetryCollector:
    """Builds one ``pallas.v1.TelemetryReport`` on demand (cheap: no I/O).

    Args:
        agent_id: this agent's id.
        sessions: ``sessions() -> iterable`` of session objects with the attributes of
            :class:`agent.session.Session` (session_id, ue_id, num_tokens, prompt_token_ids,
            sampling.max_tokens, remaining_tokens, state, epoch, token_times, decode_rate).
        scraper: the vLLM scraper (r_p, KV blocks, aggregate decode rate); optional.
        identity: ``identity() -> pallas_pb2.ModelIdentity | None``; optional.
        peers: ``peers() -> iterable`` of ``pallas_pb2.PeerTelemetry``
            (:meth:`agent.transfer.PeerPool.telemetry`); optional.
        kv_blocks: ``kv_blocks() -> (free, total) | None``: KV blocks reported by the connector
            (preferred over the scraped figure when it answers); optional.
        alpha: EWMA weight for the per-session decode rate.
        window: output tokens over which one r_d sample is taken.
        default_prefill_rate: r_p reported before any measurement (0 = unknown).
    """

    def __init__(
        self,
        agent_id: str,
        sessions: Callable[[], Iterable[Any]],
        *,
        scraper: VllmScraper | None = None,
        identity: Callable[[], pallas_pb2.ModelIdentity | None] | None = None,
        peers: Callable[[], Iterable[Any]] | None = None,
        kv_blocks: Callable[[], tuple[int, int] | None] | None = None,
        alpha: float = 0.3,
        window: int = 16,
        default_prefill_rate: float = 0.0,
    ) -> None:
        self.agent_id = agent_id
        self.sessions = sessions
        self.scraper = scraper
        self.identity = identity
        self.peers = peers
        self.kv_blocks = kv_blocks
        self.alpha = alpha
        self.window = window
        self.default_prefill_rate = default_prefill_rate
        self._rd: dict[str, tuple[int, Ewma]] = {}

    def session_rate(self, s: Any) -> float:
        """Smoothed r_d of one session (tokens/s): an EWMA of its ``decode_rate(window)``
        (:meth:`agent.session.Session.decode_rate`), updated when new tokens arrived."""
        n = len(s.token_times)
        seen, ew = self._rd.get(s.session_id, (0, Ewma(self.alpha)))
        if n > seen and (rate := s.decode_rate(self.window)) > 0:
            ew.update(rate)
        self._rd[s.session_id] = (n, ew)
        return ew.value or 0.0

    def report(self) -> pallas_pb2.TelemetryReport:
        """One report for now (``time`` is ``time.time()``)."""
        rep = pallas_pb2.TelemetryReport(agent_id=self.agent_id, time=time.time())
        live = set()
        for s in self.sessions():
            state = getattr(s.state, "value", s.state)
            live.add(s.session_id)
            rep.sessions.append(pallas_pb2.SessionTelemetry(
                session_id=s.session_id, ue_id=s.ue_id, tokens=int(s.num_tokens),
                decode_rate=self.session_rate(s), prompt_tokens=len(s.prompt_token_ids),
                max_tokens=int(s.sampling.max_tokens), state=str(state), epoch=int(s.epoch),
                remaining_tokens=int(s.remaining_tokens)))
        for sid in list(self._rd):
            if sid not in live:
                del self._rd[sid]
        srv = rep.server
        if self.identity is not None:
            ident = self.identity()
            if ident is not None:
                srv.model.CopyFrom(ident)
        sc = self.scraper
        r_p, at = sc.migration_prefill_rate() if sc else (0.0, 0.0)
        srv.prefill_rate = r_p or self.default_prefill_rate
        srv.prefill_rate_measured_at = at
        kv = self.kv_blocks() if self.kv_blocks is not None else None
        if kv is not None:
            srv.free_kv_blocks, srv.total_kv_blocks = kv
        elif sc is not None and sc.last is not None:
            srv.free_kv_blocks = sc.last.free_blocks
            srv.total_kv_blocks = sc.last.total_blocks
        srv.decode_rate = (sc.decode_rate.value or 0.0) if sc else sum(x.decode_rate for x in rep.sessions)
        if self.peers is not None:
            rep.peers.extend(self.peers())
        return rep
