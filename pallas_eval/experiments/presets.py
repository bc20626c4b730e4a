"""The paper's three models and its GPUs, in one place: s_kv from the model configs (Eq. 1) and
the rates of the timing model (docs/model.md §2-3) per (model, GPU).

Models (public Hugging Face ``config.json`` fields; s_kv = 2 L H_kv d_h b through
:func:`pallas_common.timing.kv_bytes_per_token`):

- Llama-3-8B: L 32, H_kv 8, d_h 4096/32 = 128, bf16 -> 131,072 B/token.
- Qwen3-14B: L 40, H_kv 8, d_h 128, bf16 -> 163,840 B/token.
- Qwen3-32B: L 64, H_kv 8, d_h 128, bf16 KV (the paper's AWQ checkpoint quantises weights, not
  the cache) -> 262,144 B/token.

GPUs:

- ``rtx-a6000``: the paper's testbed (section 6, vLLM 0.8.5). Rates from the paper's text:
  ``c_sync`` 0.15 s, fitted to the SIT floor of Figure 2 (section 2.3: SIT 0.25 s once the window
  covers the prefix, of which the first decode step, the tail and the last block's backlog
  account for about 0.08 s); Qwen3-32B's r_p from Table 1's two Recomputation points
  (581 ms at 1K, 2,103 ms at 4K) with that fixed cost; Qwen3-14B's r_p from Figure 2's 1.1 s at
  T_w = 0 (ctHO at 3,000 tokens, 300 Mbit/s); Llama-3-8B's r_p is Qwen3-14B's scaled by the
  measured H200 ratio (``benchmarks/results/h200_rates.json``, 4K prefill), as the paper gives
  no figure for it. r_d from Figure 5(d)'s Pallas mean ITL of 28-48 ms: 28 ms for Llama-3-8B,
  48 ms for Qwen3-32B, 40 ms for Qwen3-14B (between; an assumption).
- ``h200``: measured, ``benchmarks/results/h200_rates.json`` (``benchmarks/gpu_rates.py``,
  PyTorch, bf16): r_p the median prefill rate over 1K-4K tokens, r_d the CUDA-graph decode rate
  per request (median of 1K and 4K). c_sync is not measured there; the A6000's is used.

Detour's hop cost (both GPUs): ``pallas_common.timing.PAPER_HOP_COST``, a fixed delay, a jitter
and stalls per token and hop, the stalls more frequent at each further hop, fitted to Figure 1
(section 2.2, :data:`FIGURE1_ITL`; docs/model.md section 6.1); its first hop's mean, 12.0 ms, is
``hop_delay_s`` (``rates(..., hop_model="linear")``: the linear fit's 15.9 ms). The replay's
relay draws the same law by each proxy's position on the path (:data:`REPLAY_HOP_DELAY_S`,
``pallas_eval.relay.REPLAY_HOP_COST``).
Block size 16 (vLLM's GPU default).

The replay's setting (``paper-replay``, :func:`replay_rates`): what ``pallas replay --regime
paper`` emulates (``pallas_eval.emulation`` paces the tiny model to these rates and scales the
300 Mbit/s link by the KV size ratio) and what ``--rates paper`` simulates with
(:data:`PAPER_QWEN3_32B`). It keeps the figures docs/model.md §9 and issue 13 state for the
replay: Qwen3-32B prefilling 1,850 tokens/s (Table 1's Recomputation row taken whole, fixed
costs included) and decoding 25 tokens/s (about the middle of Figure 5(d)'s 28-48 ms ITL), with
c_sync 20 ms (an assumption: one control round trip plus admission). The ``rtx-a6000`` rates
above fit the same paper figures differently (c_sync 0.15 s taken out of Table 1, so r_p
2,238 tokens/s; Qwen3-32B's ITL at the slow end of 28-48 ms, so r_d 20.8 tokens/s), because the
experiments model c_sync and the first decode step separately and the replay's pacing does
not. Qwen3-14B and Llama-3-8B in this setting: Qwen3-32B's rates times the measured H200 ratio
of the same models (prefill and decode), rounded to whole tokens/s and 0.1 tokens/s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from pallas_common import timing
from pallas_eval.simulate import Rates

REPO = Path(__file__).resolve().parents[2]
H200_RESULTS = REPO / "benchmarks" / "results" / "h200_rates.json"

#: Public config.json fields of the paper's models (Hugging Face hub).
MODEL_CONFIGS: dict[str, dict] = {
    "llama-3-8b": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "hidden_size": 4096, "torch_dtype": "bfloat16"},
    "qwen3-14b": {"num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8,
                  "head_dim": 128, "hidden_size": 5120, "torch_dtype": "bfloat16"},
    "qwen3-32b": {"num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
                  "head_dim": 128, "hidden_size": 5120, "torch_dtype": "bfloat16"},
}
MODELS = tuple(MODEL_CONFIGS)
LABELS = {"llama-3-8b": "Llama-3-8B", "qwen3-14b": "Qwen3-14B", "qwen3-32b": "Qwen3-32B"}
GPUS = ("rtx-a6000", "h200")

BLOCK_SIZE = 16
#: Detour's first hop's mean cost per token, s (the default hop model's, 12.0 ms).
HOP_DELAY_S = timing.PAPER_HOP_COST.mean_s()
#: The replay's relay hop's mean cost per token at the path's first position, s: the default hop
#: model's, 12.0 ms (pallas_eval.relay draws each proxy's position on the path).
REPLAY_HOP_DELAY_S = timing.PAPER_HOP_COST.mean_s()
PAPER_C_SYNC_S = 0.150
#: The paper's inter-gNB goodput in its headline settings (Table 1, Figures 2, 5 and 9), Mbit/s.
PAPER_GOODPUT_MBPS = 300.0
# Figure 5(d): Pallas mean ITL 28-48 ms (Qwen3-14B's 40 ms is between, an assumption).
PAPER_ITL_S = {"llama-3-8b": 0.028, "qwen3-14b": 0.040, "qwen3-32b": 0.048}
#: Figure 1 as the paper's text gives it (section 2.2; ITL of a stream relayed over h hops on the
#: RTX A6000, decode steps PAPER_ITL_S): (model, hops) -> {"p90"/"p99": ms, "slo%": % of gaps
#: over the 100 ms SLO}. What the hop-cost models (pallas_common.timing.HOP_COSTS) are fitted to.
FIGURE1_ITL: dict[tuple[str, int], dict[str, float]] = {
    ("qwen3-32b", 2): {"slo%": 1.93}, ("qwen3-32b", 3): {"p90": 126.68, "p99": 263.54, "slo%": 12.94},
    ("llama-3-8b", 2): {"slo%": 1.74}, ("llama-3-8b", 3): {"p90": 130.54, "slo%": 12.61}}


def s_kv(model: str) -> int:
    """KV bytes per token of ``model`` (Eq. 1 over its config). KeyError for an unknown model."""
    return timing.kv_bytes_per_token(MODEL_CONFIGS[_check_model(model)])


def _check_model(model: str) -> str:
    if model not in MODEL_CONFIGS:
        raise KeyError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    return model


@lru_cache(maxsize=1)
def _h200() -> dict:
    d = json.loads(H200_RESULTS.read_text())
    out = {}
    for m in d["models"]:
        r_p = float(np.median([x["tokens_per_s"] for x in m["prefill"] if x["tokens"] >= 1024]))
        g = d.get("graphed_decode", {}).get(m["model"], [])
        r_d = float(np.median([x["tokens_per_s_per_request"] for x in g])) if g else float("nan")
        out[m["model"]] = {"r_p": r_p, "r_d": r_d, "r_p_4k": float(m["prefill"][-1]["tokens_per_s"]),
                           "s_kv": int(m["kv_bytes_per_token"])}
    return out


def _paper_r_p(model: str) -> float:
    """The A6000 prefill rates derived from the paper's text (module docstring)."""
    b300 = timing.mbit_per_s(PAPER_GOODPUT_MBPS)
    if model == "qwen3-32b":
        fixed = PAPER_C_SYNC_S + PAPER_ITL_S[model]              # c_sync + first decode step
        return (1024 + 4096) / ((0.581 - fixed) + (2.103 - fixed))
    q14 = "qwen3-14b"
    # ctHO at K = 3,000 with r_p, B: c + 1/r_d + min_p max(p / r_p, (K - p) s_kv / B) = 1.1 s.
    # The continuous optimum is K / (r_p + B / s_kv); solve it for r_p.
    budget = 1.1 - PAPER_C_SYNC_S - PAPER_ITL_S[q14]
    r_p14 = 3000.0 / budget - b300 / s_kv(q14)
    if model == q14:
        return r_p14
    h = _h200()
    return r_p14 * h[model]["r_p_4k"] / h[q14]["r_p_4k"]


def rates(model: str, gpu: str = "rtx-a6000", goodput_mbps: float = PAPER_GOODPUT_MBPS,
          hop_model: str = timing.DEFAULT_HOP_MODEL) -> Rates:
    """The timing model's :class:`~pallas_eval.simulate.Rates` for ``model`` on ``gpu`` at
    ``goodput_mbps`` Mbit/s of inter-gNB goodput (module docstring for every figure's source);
    ``hop_delay_s`` is the first hop's mean cost of ``hop_model`` (``timing.HOP_COSTS``).

    Raises KeyError for an unknown model, GPU or hop model, ValueError for a non-positive goodput.
    """
    hop_delay_s = timing.hop_cost(hop_model).mean_s()
    _check_model(model)
    if not goodput_mbps > 0:
        raise ValueError(f"goodput must be > 0 Mbit/s, got {goodput_mbps!r}")
    if gpu == "rtx-a6000":
        r_p, r_d = _paper_r_p(model), 1.0 / PAPER_ITL_S[model]
    elif gpu == "h200":
        h = _h200()[model]
        r_p, r_d = h["r_p"], h["r_d"]
    else:
        raise KeyError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    return Rates(name=f"{LABELS[model]} on {gpu}", r_p=r_p, r_d=r_d, bandwidth=timing.mbit_per_s(goodput_mbps),
                 s_kv=float(s_kv(model)), block_size=BLOCK_SIZE, c_sync=PAPER_C_SYNC_S, hop_delay_s=hop_delay_s,
                 hop_model=hop_model)


#: The replay's setting (module docstring): its name, its anchor model and the anchor's rates.
REPLAY_SETTING = "paper-replay"
REPLAY_ANCHOR_MODEL = "qwen3-32b"
REPLAY_R_P = 1850.0        # tokens/s: Table 1's Recomputation row (docs/model.md §9, issue 13)
REPLAY_R_D = 25.0          # tokens/s: Figure 5(d)'s 28-48 ms ITL
REPLAY_C_SYNC_S = 0.020    # assumption: one control round trip plus admission
_REPLAY_SOURCES = {True: "paper Table 1 / Fig. 5(d) (docs/model.md §6)",
                   False: "qwen3-32b's paper rates x the H200 ratio (benchmarks/results/h200_rates.json)"}


def replay_rates(model: str = REPLAY_ANCHOR_MODEL) -> Rates:
    """The replay's setting (``paper-replay``, module docstring) for ``model``: the anchor's
    rates for Qwen3-32B, the others' scaled by the H200 ratio; at 300 Mbit/s, block size 16,
    c_sync 20 ms, the replay relay's first hop's mean cost (:data:`REPLAY_HOP_DELAY_S`, 12.0 ms),
    and c_sync for each request of a Detour relay path's set-up (``Rates.relay_request_s``, two a
    hop: the replay's delaying proxies forward each relay's request, pallas_eval.relay).
    KeyError for an unknown model."""
    _check_model(model)
    if model == REPLAY_ANCHOR_MODEL:
        r_p, r_d = REPLAY_R_P, REPLAY_R_D
        name = f"paper ({LABELS[model]}, RTX A6000, {PAPER_GOODPUT_MBPS:.0f} Mbit/s)"
    else:
        h = _h200()
        a = h[REPLAY_ANCHOR_MODEL]
        r_p = round(REPLAY_R_P * h[model]["r_p"] / a["r_p"], 0)
        r_d = round(REPLAY_R_D * h[model]["r_d"] / a["r_d"], 1)
        name = f"{REPLAY_SETTING} ({LABELS[model]}, {PAPER_GOODPUT_MBPS:.0f} Mbit/s)"
    return Rates(name=name, r_p=r_p, r_d=r_d, bandwidth=timing.mbit_per_s(PAPER_GOODPUT_MBPS),
                 s_kv=float(s_kv(model)), block_size=BLOCK_SIZE, c_sync=REPLAY_C_SYNC_S, hop_delay_s=REPLAY_HOP_DELAY_S,
                 relay_request_s=REPLAY_C_SYNC_S, relay_requests_per_hop=2)


def replay_source(model: str) -> str:
    """Where :func:`replay_rates`'s figures for ``model`` come from (one line)."""
    return _REPLAY_SOURCES[_check_model(model) == REPLAY_ANCHOR_MODEL]


#: The replay's ``--rates paper``: Qwen3-32B in the replay's setting.
PAPER_QWEN3_32B = replay_rates(REPLAY_ANCHOR_MODEL)
#: Named rate presets of ``pallas replay --rates``.
RATE_PRESETS = {"paper": PAPER_QWEN3_32B}


def with_goodput(r: Rates, goodput_mbps: float) -> Rates:
    """``r`` at another inter-gNB goodput (Mbit/s)."""
    return replace(r, bandwidth=timing.mbit_per_s(goodput_mbps))


@dataclass(frozen=True)
class PresetRow:
    """One (model, GPU) preset as a table row (``pallas experiment presets``-style listing)."""

    model: str
    gpu: str
    s_kv: int
    r_p: float
    r_d: float
    c_sync_s: float
    hop_delay_s: float
    block_size: int


def preset_table() -> list[PresetRow]:
    """Every (model, GPU) preset, for the outputs' JSON and the printed header."""
    out = []
    for g in GPUS:
        for m in MODELS:
            r = rates(m, g)
            out.append(PresetRow(m, g, int(r.s_kv), r.r_p, r.r_d, r.c_sync, r.hop_delay_s, r.block_size))
    return out
