"""The paper's setting emulated on a tiny model (docs/model.md §9): pacing and link scaling.

A tiny model on a CPU is cheap to copy and dear to prefill, the opposite of a 32B model on a GPU
behind a 300 Mbit/s link. To put the live system in the paper's regime *in absolute time*:

- ``EmulatedPallasConnector`` (pallas_eval/emulated_connector.py, a subclass of the product's
  :class:`agent.connector.PallasConnector`, loaded by an unmodified vLLM through
  ``kv_connector_module_path = "pallas_eval.emulated_connector"``) stretches every engine step to what
  the emulated model would take for it: ``P / r_p`` for the ``P`` prompt tokens it prefills plus
  ``1 / r_d`` when it decodes (a batched decode step costs one step). The scheduler side works
  out the step's emulated duration from vLLM's ``SchedulerOutput`` and sends it to the worker in
  the connector metadata; the worker sleeps, after the forward pass and the block saves, until
  that long after the step began. A step that is already slower is not delayed (and counted as
  an overrun). Sleeping inside the step leaves the engine idle, not spinning.
- :func:`emulated_peer_rate_mbps` scales the paper's 300 Mbit/s link by the KV size ratio, so a
  tiny model's block takes as long to send as the emulated model's block would.

Extra config of the connector (``kv_connector_extra_config``, beside the product's
``agent_address``): ``prefill_tokens_per_s`` (r_p), ``decode_tokens_per_s`` (r_d), both > 0, and
``stats_path`` (optional): a JSON file the worker rewrites at most every second with its step
counts and measured rates (:class:`PaceStats`), which ``pallas replay`` checks against the
emulated rates.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pallas_eval.experiments import presets as PR

REPO = Path(__file__).resolve().parent.parent
H200_RATES = PR.H200_RESULTS
#: Where vLLM finds the paced connector (pallas_eval/emulated_connector.py; it imports vLLM).
CONNECTOR_MODULE = "pallas_eval.emulated_connector"
CONNECTOR_CLASS = "EmulatedPallasConnector"

__all__ = ["EmulatedModel", "EMULATED", "emulated_model", "emulated_peer_rate_mbps", "step_seconds",
           "PaceStats", "load_pace_stats", "connector_extra", "agent_flags", "server_settings", "PAPER_LINK_MBPS", "PAPER_HOP_DELAY_S",
           "CONNECTOR_MODULE", "CONNECTOR_CLASS", "E2E_PACE"]

#: The vLLM e2e tests' pacing (r_p, r_d tokens/s): decode steps 15 ms apart, a 300-token prefill
#: in 15 ms, so a session is still decoding when a test's trigger and commit come.
E2E_PACE = (20_000.0, 1000.0 / 15.0)
#: The paper's inter-gNB goodput of the headline settings (Table 1, Figures 5 and 9), Mbit/s
#: (pallas_eval.experiments.presets).
PAPER_LINK_MBPS = PR.PAPER_GOODPUT_MBPS
#: The replay relay's mean per-token cost at the path's first hop, s (pallas_eval.relay.REPLAY_HOP_COST:
#: the compounding fit to the paper's Figure 1, 12.0 ms, later positions dearer); the replay
#: rates' (presets.REPLAY_HOP_DELAY_S).
PAPER_HOP_DELAY_S = PR.REPLAY_HOP_DELAY_S


@dataclass(frozen=True)
class EmulatedModel:
    """One emulated model in the paper's testbed (RTX A6000).

    Attributes:
        name: ``qwen3-32b``, ``qwen3-14b`` or ``llama-3-8b``.
        r_p: prefill rate, tokens/s.
        r_d: decode rate per request, tokens/s.
        s_kv: KV bytes per token (docs/model.md Eq. 1, the model's bf16 cache).
        source: where the figures come from.
    """

    name: str
    r_p: float
    r_d: float
    s_kv: float
    source: str


def _paper_models() -> dict[str, EmulatedModel]:
    """The replay's setting of ``pallas_eval.experiments.presets`` (``paper-replay``,
    :func:`~pallas_eval.experiments.presets.replay_rates`; the one table of the paper's models):
    Qwen3-32B at the rates docs/model.md §9 states for the replay (1,850 tokens/s prefill,
    25 tokens/s decode), Qwen3-14B and Llama-3-8B at those times the ratio of the same models'
    rates measured on one H200 (benchmarks/results/h200_rates.json): the relative speed of the
    three models is taken from the H200, the absolute level from the paper's A6000."""
    out = {}
    for name in (PR.REPLAY_ANCHOR_MODEL, *(m for m in PR.MODELS if m != PR.REPLAY_ANCHOR_MODEL)):
        r = PR.replay_rates(name)
        out[name] = EmulatedModel(name, r.r_p, r.r_d, r.s_kv, PR.replay_source(name))
    return out


EMULATED: dict[str, EmulatedModel] = _paper_models()


def emulated_model(name: str) -> EmulatedModel:
    """The emulated model ``name`` (a key of :data:`EMULATED`).

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        return EMULATED[name]
    except KeyError:
        raise ValueError(f"unknown emulated model {name!r}; known: {', '.join(sorted(EMULATED))}") from None


def emulated_peer_rate_mbps(s_kv_tiny: float, model: EmulatedModel, paper_mbps: float = PAPER_LINK_MBPS) -> float:
    """The link rate (Mbit/s) at which one token of the tiny model's KV (``s_kv_tiny`` bytes) takes
    as long to send as one token of ``model``'s KV at ``paper_mbps`` (docs/model.md §9):
    ``paper_mbps * s_kv_tiny / s_kv(model)``; e.g. 300 * 2,048 / 262,144 = 2.34 Mbit/s.

    Raises:
        ValueError: a size or rate that is not positive.
    """
    if s_kv_tiny <= 0 or model.s_kv <= 0 or paper_mbps <= 0:
        raise ValueError("KV sizes and the link rate must be > 0")
    return paper_mbps * s_kv_tiny / model.s_kv


def step_seconds(num_scheduled: Mapping[str, int], r_p: float, r_d: float) -> tuple[int, int, float]:
    """The emulated duration of one engine step.

    Args:
        num_scheduled: request id -> tokens scheduled this step (vLLM's
            ``SchedulerOutput.num_scheduled_tokens``). A request with more than one token is
            prefilling (speculative decoding is off); one token is a decode step (or the one
            token left of a prefill whose prefix came from the cache, which costs the same).
        r_p: prefill tokens/s; r_d: decode tokens/s per request (> 0).

    Returns:
        (prefill tokens, decoding requests, seconds): ``P / r_p`` for a prefill-only step,
        ``max(P / r_p, 1 / r_d)`` for a step with any decode. A batched decode step costs one
        step, as on a GPU at batch sizes this small; a mixed step (a prefill chunk with the
        running requests' decodes, vLLM's chunked prefill) costs what the larger part costs, as
        on a GPU, where decoding is bound by reading the weights and a prefill chunk by compute,
        and one pass does both (the sum, used before, charged a 2,000-token prefill in 256-token
        chunks 1.4 s instead of 1.1 s).
    """
    prefill = sum(n for n in num_scheduled.values() if n > 1)
    decode = sum(1 for n in num_scheduled.values() if n == 1)
    return prefill, decode, max(prefill / r_p, 1.0 / r_d) if decode else prefill / r_p


@dataclass
class PaceStats:
    """What the paced worker saw (times in seconds, from each step's start to its paced end).

    Prefill-only steps measure r_p, decode-only steps measure r_d; mixed steps are counted but
    not used for either. ``overruns``: steps whose real work took longer than the emulated time.
    """

    steps: int = 0
    prefill_steps: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_s: float = 0.0
    mixed_steps: int = 0
    overruns: int = 0
    overrun_s: float = 0.0
    work_s: float = 0.0
    r_p: float = 0.0
    r_d: float = 0.0

    def observe(self, prefill: int, decode: int, pace_s: float, work_s: float, total_s: float) -> None:
        """Record one step: ``work_s`` the real work, ``total_s`` with the pacing sleep."""
        self.steps += 1
        self.work_s += work_s
        if work_s > pace_s:
            self.overruns += 1
            self.overrun_s += work_s - pace_s
        if prefill and not decode:
            self.prefill_steps += 1
            self.prefill_tokens += prefill
            self.prefill_s += total_s
        elif decode and not prefill:
            self.decode_steps += 1
            self.decode_s += total_s
        elif prefill and decode:
            self.mixed_steps += 1

    def measured_r_p(self) -> float | None:
        """Prefill tokens/s over prefill-only steps (None before any)."""
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else None

    def measured_r_d(self) -> float | None:
        """Decode steps/s over decode-only steps (None before any)."""
        return self.decode_steps / self.decode_s if self.decode_s > 0 else None


def extra_rate(extra: Mapping[str, Any], key: str) -> float:
    """The positive number at ``extra[key]`` (the connector's extra config).

    Raises:
        ValueError: missing, not a number, or not > 0.
    """
    try:
        v = float(extra[key])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"EmulatedPallasConnector needs kv_connector_extra_config.{key} (a number > 0)") from None
    if not v > 0:
        raise ValueError(f"kv_connector_extra_config.{key} must be > 0, got {v}")
    return v


def load_pace_stats(path: str | os.PathLike) -> dict[str, Any] | None:
    """The stats a paced worker last wrote to ``path`` (None if there are none yet)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None



def connector_extra(r_p: float, r_d: float, stats_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The paced connector's ``kv_connector_extra_config`` entries for rates ``r_p``, ``r_d``
    (tokens/s) and an optional stats file.

    Raises:
        ValueError: a rate that is not > 0.
    """
    raw = {"prefill_tokens_per_s": r_p, "decode_tokens_per_s": r_d}
    extra: dict[str, Any] = {k: extra_rate(raw, k) for k in raw}
    if stats_path:
        extra["stats_path"] = str(stats_path)
    return extra


# vLLM's token budget per engine step in the paper regime (--max-num-batched-tokens): a long
# prefill goes in chunks of at most this many tokens, each step beside the running requests'
# decodes, so no decode (nor a resumed request's first step) waits behind a whole 2,000-token
# prompt (1.1 s at 1,850 tokens/s); a chunk is 138 ms at that rate.
PREFILL_CHUNK_TOKENS = 256

# A running long prefill takes at most this many tokens of a step's budget while another request
# is present (vLLM's --long-prefill-token-threshold; its default 0 is no cap): without it the
# scheduler serves running requests first, so a prefill of a new prompt or a warm-up took the
# whole budget step after step and a request that arrived meanwhile (a resumed session, whose
# prefix is cached) waited until it ended: stalls of 0.3-1.3 s at the switch measured in the
# replay. The cap leaves >= 128 tokens a step for the others; the throughput is unchanged (a
# step is paced by its tokens).
LONG_PREFILL_CAP_TOKENS = 128


def vllm_step_args() -> str:
    """The vLLM flags of the paper regime's step budget (``--vllm-args`` of the agent)."""
    return (f"--max-num-batched-tokens {PREFILL_CHUNK_TOKENS} "
            f"--long-prefill-token-threshold {LONG_PREFILL_CAP_TOKENS}")


def agent_flags(r_p: float, r_d: float, stats_path: str | os.PathLike | None = None) -> list[str]:
    """``pallas-agent`` flags that launch its vLLM with the paced connector (rates in tokens/s)."""
    return ["--kv-connector-module", CONNECTOR_MODULE, "--kv-connector-class", CONNECTOR_CLASS,
            "--kv-connector-extra", json.dumps(connector_extra(r_p, r_d, stats_path))]


def server_settings(r_p: float, r_d: float, stats_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """:class:`agent.server.ServerConfig` fields that launch vLLM with the paced connector."""
    return {"kv_connector_module": CONNECTOR_MODULE, "kv_connector_class": CONNECTOR_CLASS,
            "kv_connector_extra": connector_extra(r_p, r_d, stats_path)}
