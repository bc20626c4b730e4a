"""The Pallas timing model: KV size, the cost of a prefetching window, the decision, the baselines.

Pure functions over numpy arrays, importable from both the xApp's environment (protobuf 3.20)
and the agent's (vLLM): this module depends on numpy only. Every quantity is defined in
``design/model.md``; equation numbers below are that page's (which follow the paper's).

Units are SI throughout: seconds, bytes, bytes/s, tokens, tokens/s. Convert goodput given in
Mbit/s once at the edge with :func:`mbit_per_s`.

Array conventions. Per-UE inputs are 1-D arrays of shape ``(n_ue,)`` (scalars broadcast).
Candidate windows are shape ``(n_w,)`` shared by every UE, or ``(n_ue, n_w)`` per UE (for
example each UE's chosen window as ``(n_ue, 1)``). Window costs come back as ``(n_ue, n_w)``.

The block-stream recursion of Eq. 5 (``f_j = max(f_{j-1}, t_j) + tau``) is evaluated in closed
form, so a whole control cycle is a fixed number of array operations whatever the window or
the block count. Because ``t_j`` is linear in ``j`` (constant decode rate), unrolling gives
``f_j = max_{1<=i<=j} (t_i + (j-i+1) tau)``, a maximum of a function linear in ``i``, so it is
attained at ``i = 1`` or ``i = j``::

    f_j = max(t_1 + j * tau, t_j + tau)          (j >= 1; f_0 = 0)

The link keeps up with the source iff ``tau <= P / r_d``; then ``f_j = t_j + tau`` and the
stream catches up at the first block, otherwise it never catches up (model.md Eq. 7's
``T_catch`` falls back to ``f_{n_full}``). ``tests/common/test_timing.py`` checks this against
the literal recursion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np

__all__ = [
    "BYTES_PER_ELEMENT",
    "DecisionParams",
    "Decision",
    "WindowCosts",
    "WindowInputs",
    "candidate_windows",
    "ctho_split",
    "decide",
    "detour_itl",
    "discard_bound",
    "evaluate_windows",
    "kv_bytes_per_token",
    "kv_bytes",
    "mbit_per_s",
    "sit_ctho",
    "sit_detour",
    "sit_full_copy",
    "sit_no_rc",
    "sit_no_sm",
    "sit_recomputation",
]

#: Bytes per KV-cache element by dtype name (vLLM's ``--kv-cache-dtype`` values and the
#: ``torch_dtype`` strings of Hugging Face configs). ``"auto"`` means: the model's dtype.
BYTES_PER_ELEMENT: dict[str, int] = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "float8_e4m3fn": 1,
    "float8_e5m2": 1, "int8": 1, "uint8": 1,
}

# Slack when snapping a float to the block grid or the window grid, so that values computed
# as exact multiples (1,024 tokens, 0.3 s) do not fall one step short through rounding.
_GRID_EPS = 1e-9


def mbit_per_s(mbps: float) -> float:
    """Goodput in bytes/s from Mbit/s (10^6 bit/s), e.g. 300 Mbit/s -> 37.5e6 B/s."""
    return float(mbps) * 1e6 / 8.0


# ---------------------------------------------------------------------------------------------
# Eq. 1: KV-cache size
# ---------------------------------------------------------------------------------------------

def _cfg_get(config: Any, key: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def _dtype_bytes(name: Any, what: str) -> int:
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in BYTES_PER_ELEMENT:
        raise ValueError(f"unknown {what} {name!r}; known: {sorted(BYTES_PER_ELEMENT)}")
    return BYTES_PER_ELEMENT[key]


def kv_bytes_per_token(config: Mapping[str, Any] | Any, kv_cache_dtype: str = "auto") -> int:
    """s_kv = 2 * L * H_kv * d_h * b: KV-cache bytes per token, all layers, K and V (Eq. 1).

    ``config`` is a Hugging Face-style model config (a dict such as ``config.json`` or a
    ``PretrainedConfig``); a multimodal config's ``text_config`` is used when the top level has
    no ``num_hidden_layers``. Fields: ``num_hidden_layers`` (L); ``num_key_value_heads``
    (H_kv; absent means multi-head attention, H_kv = ``num_attention_heads``); ``head_dim``
    (d_h; absent or null means ``hidden_size / num_attention_heads``). ``kv_cache_dtype`` is
    vLLM's ``--kv-cache-dtype``: ``"auto"`` takes the model's ``torch_dtype`` (or ``dtype``),
    ``"fp8"`` and its variants are 1 byte.

    Raises ValueError for a missing or non-positive field, an unknown dtype, or an MLA model
    (``kv_lora_rank``), whose latent cache Eq. 1 does not describe.

    Example: Qwen3-32B (L=64, H_kv=8, d_h=128, bfloat16) gives 262,144 B.
    """
    if _cfg_get(config, "num_hidden_layers") is None and _cfg_get(config, "text_config") is not None:
        config = _cfg_get(config, "text_config")
    if _cfg_get(config, "kv_lora_rank"):
        raise ValueError("MLA model (kv_lora_rank set): its latent KV cache is not Eq. 1's 2*L*H_kv*d_h")

    def positive_int(key: str, value: Any) -> int:
        if value is None:
            raise ValueError(f"model config lacks {key!r}")
        try:
            iv = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"model config field {key!r} is not an integer: {value!r}") from None
        if iv <= 0 or iv != value:
            raise ValueError(f"model config field {key!r} must be a positive integer, got {value!r}")
        return iv

    n_layers = positive_int("num_hidden_layers", _cfg_get(config, "num_hidden_layers"))
    n_heads_raw = _cfg_get(config, "num_attention_heads")
    kv_heads_raw = _cfg_get(config, "num_key_value_heads")
    n_kv_heads = positive_int("num_key_value_heads",
                              kv_heads_raw if kv_heads_raw is not None else n_heads_raw)
    head_dim_raw = _cfg_get(config, "head_dim")
    if head_dim_raw is None:
        hidden = positive_int("hidden_size", _cfg_get(config, "hidden_size"))
        n_heads = positive_int("num_attention_heads", n_heads_raw)
        if hidden % n_heads:
            raise ValueError(f"hidden_size {hidden} is not divisible by num_attention_heads {n_heads}")
        head_dim = hidden // n_heads
    else:
        head_dim = positive_int("head_dim", head_dim_raw)

    if str(kv_cache_dtype).strip().lower() == "auto":
        model_dtype = _cfg_get(config, "torch_dtype") or _cfg_get(config, "dtype")
        if model_dtype is None:
            raise ValueError("kv_cache_dtype='auto' but the model config has no torch_dtype/dtype")
        b = _dtype_bytes(model_dtype, "model dtype")
    else:
        b = _dtype_bytes(kv_cache_dtype, "kv_cache_dtype")
    return 2 * n_layers * n_kv_heads * head_dim * b


def kv_bytes(n_tokens: Any, s_kv: Any) -> Any:
    """S_kv(N) = N * s_kv, bytes (Eq. 1). Broadcasts over arrays."""
    return np.multiply(n_tokens, s_kv)


# ---------------------------------------------------------------------------------------------
# Eqs. 4-8: the cost of a candidate window
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WindowInputs:
    """Per-UE inputs of the window evaluation at decision time t_curr (model.md section 3).

    Every field is converted to a float64 array of shape ``(n_ue,)``; scalars broadcast to the
    common length (1 if every field is scalar).

    - ``k_curr``: K_curr, tokens in the request so far (prompt + generated).
    - ``t_remain``: T_remain_hat = t_HO_hat - t_curr, seconds (may be <= 0: HO imminent).
    - ``block_size``: P, tokens per KV block.
    - ``r_p``: prefill rate available to the migration at the target, tokens/s.
    - ``r_d``: per-request decode rate at the source, tokens/s.
    - ``bandwidth``: B, inter-gNB goodput available to the migration, bytes/s.
    - ``s_kv``: bytes per token (Eq. 1).
    - ``c_sync``: seconds, one control round trip plus engine admission at the commit.
    - ``r_d_target``: decode rate at the target, tokens/s (first decode step 1/r_d_target of
      Eq. 6); None means equal to ``r_d``.

    Raises ValueError if the lengths disagree, a value is not finite, a rate, ``s_kv`` or
    ``block_size`` is not positive, or ``k_curr`` or ``c_sync`` is negative.
    """

    k_curr: np.ndarray
    t_remain: np.ndarray
    block_size: np.ndarray
    r_p: np.ndarray
    r_d: np.ndarray
    bandwidth: np.ndarray
    s_kv: np.ndarray
    c_sync: np.ndarray
    r_d_target: np.ndarray | None = None

    def __post_init__(self) -> None:
        names = [f.name for f in fields(self)]
        raw = {k: getattr(self, k) for k in names}
        if raw["r_d_target"] is None:
            raw["r_d_target"] = raw["r_d"]
        try:
            arrays = np.broadcast_arrays(*(np.atleast_1d(np.asarray(raw[k], dtype=np.float64))
                                           for k in names))
        except ValueError as exc:
            raise ValueError(f"WindowInputs: fields have incompatible shapes: {exc}") from None
        for k, a in zip(names, arrays):
            if a.ndim != 1:
                raise ValueError(f"WindowInputs.{k} must be 1-D (n_ue,), got shape {a.shape}")
            if not np.all(np.isfinite(a)):
                raise ValueError(f"WindowInputs.{k} has non-finite values")
            object.__setattr__(self, k, np.ascontiguousarray(a))
        for k in ("block_size", "r_p", "r_d", "bandwidth", "s_kv", "r_d_target"):
            if np.any(getattr(self, k) <= 0):
                raise ValueError(f"WindowInputs.{k} must be > 0")
        for k in ("k_curr", "c_sync"):
            if np.any(getattr(self, k) < 0):
                raise ValueError(f"WindowInputs.{k} must be >= 0")

    @property
    def n_ue(self) -> int:
        """Number of UEs (rows)."""
        return int(self.k_curr.shape[0])

    def take(self, index: Any) -> "WindowInputs":
        """The rows ``index`` (a slice, integer array or boolean mask) as a new WindowInputs."""
        return WindowInputs(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


@dataclass(frozen=True)
class WindowCosts:
    """Eqs. 4-8 for every (UE, window) pair: arrays of shape ``(n_ue, n_w)``, seconds or tokens.

    ``windows`` is the candidate T_w, broadcast to ``(n_ue, n_w)``. ``valid`` marks windows with
    T_w <= max(T_remain_hat, 0) (a trigger cannot lie in the past); the other fields are still
    computed there but have no meaning.
    """

    windows: np.ndarray   # T_w, s
    valid: np.ndarray     # bool
    k_trig: np.ndarray    # K_trig, tokens (Eq. 4)
    l_hist: np.ndarray    # L_hist, tokens, multiple of P (Eq. 4)
    t_pre: np.ndarray     # T_pre = L_hist / r_p, s (Eq. 4)
    n_full: np.ndarray    # suffix blocks complete at the HO
    t_tx_res: np.ndarray  # transfer backlog at the HO, s (Eq. 5)
    t_res: np.ndarray     # residual work on the interruption path, s (Eq. 5)
    n_tail: np.ndarray    # tokens of the partial last block, recomputed at the commit (Eq. 6)
    t_sit: np.ndarray     # T_SIT, s (Eq. 6)
    t_catch: np.ndarray   # when the stream caught up, s after the trigger (Eq. 7)
    t_ready: np.ndarray   # T_ready, s after the trigger (Eq. 7)
    t_early: np.ndarray   # T_early, s (Eq. 7)
    j: np.ndarray         # objective J, s (Eq. 8)


class _Geometry:
    """Block bookkeeping shared by Pallas and its ablations (Eq. 4 and the stream's t_j).

    Works in block units: u = K_trig / P, m = floor(u) prefix blocks (L_hist = m P),
    a = u - m (fill of the first suffix block at the trigger, in blocks), and since L_hist is a
    multiple of P, n_full = floor(K_HO / P) - m and N_tail = K_HO mod P with
    K_HO = K_curr + r_d T_remain_hat (both independent of the window but for n_full).
    """

    __slots__ = ("tw", "m", "frac", "n_full", "t1", "blk_period", "tau", "k_ho", "n_tail",
                 "inputs", "col")

    def __init__(self, inputs: WindowInputs, windows: Any) -> None:
        w = np.asarray(windows, dtype=np.float64)
        if w.ndim == 1:
            w = w[None, :]
        elif w.ndim != 2 or w.shape[0] not in (1, inputs.n_ue):
            raise ValueError(f"windows must have shape (n_w,) or (n_ue, n_w), got {w.shape}")
        if np.any(w < 0) or not np.all(np.isfinite(w)):
            raise ValueError("candidate windows must be finite and >= 0")
        col = _Columns(inputs)
        self.inputs, self.col, self.tw = inputs, col, w
        u = col.y - col.rho * w                       # K_trig / P
        m = np.floor(u + _GRID_EPS)
        np.clip(m, 0.0, col.fy, out=m)                # 0 <= L_hist <= K_HO
        self.m = m
        self.frac = u - m                             # (K_trig - L_hist) / P, in [0, 1)
        np.maximum(self.frac, 0.0, out=self.frac)
        self.n_full = col.fy - m                      # Eq. 5's n_full
        self.blk_period = col.blk_period              # P / r_d: one block of decode, s
        self.t1 = (1.0 - self.frac) * col.blk_period  # t_1, s after the trigger
        self.tau = col.tau                            # P s_kv / B: one block on the link, s
        self.k_ho = col.k_ho
        self.n_tail = col.n_tail

    def f_n(self, f0: np.ndarray | None = None) -> np.ndarray:
        """f_{n_full} of Eq. 5's recursion with f_0 = ``f0`` (default 0), closed form.

        Unrolled, f_j = max(f_0 + j tau, max_{1<=i<=j} (t_i + (j-i+1) tau)); the inner
        maximum is over a function linear in i, so f_j = max(max(f_0, t_1) + j tau, t_j + tau).
        """
        n = self.n_full
        tn = self.t1 + (n - 1.0) * self.blk_period
        tn += self.tau                                # t_n + tau
        start = self.t1 if f0 is None else np.maximum(self.t1, f0)
        fn = np.maximum(start + n * self.tau, tn)
        return np.where(n >= 1, fn, 0.0 if f0 is None else f0)


def _k_ho(x: WindowInputs) -> np.ndarray:
    """K_HO = K_curr + r_d max(T_remain_hat, 0): predicted tokens at the HO, shape (n_ue,)."""
    return x.k_curr + x.r_d * np.maximum(x.t_remain, 0.0)


class _Columns:
    """Per-UE constants as (n_ue, 1) columns."""

    __slots__ = ("y", "fy", "rho", "blk_period", "tau", "k_ho", "n_tail", "inv_rp", "const_sit",
                 "t_remain")

    def __init__(self, x: WindowInputs) -> None:
        p = x.block_size[:, None]
        r_d = x.r_d[:, None]
        self.t_remain = x.t_remain[:, None]
        self.k_ho = _k_ho(x)[:, None]                 # tokens at the HO
        self.y = self.k_ho / p
        self.fy = np.floor(self.y + _GRID_EPS)
        self.rho = r_d / p                            # blocks/s
        self.blk_period = p / r_d                     # s per block of decode
        self.tau = p * x.s_kv[:, None] / x.bandwidth[:, None]
        self.n_tail = np.maximum(self.k_ho - self.fy * p, 0.0)
        self.inv_rp = 1.0 / x.r_p[:, None]
        # Eq. 6's window-independent part: c_sync + N_tail / r_p + 1 / r_d_target.
        self.const_sit = x.c_sync[:, None] + self.n_tail * self.inv_rp + 1.0 / x.r_d_target[:, None]


def _pallas_costs(inputs: WindowInputs, windows: Any, alpha: float) -> WindowCosts:
    g = _Geometry(inputs, windows)
    col, tw = g.col, g.tw
    p = inputs.block_size[:, None]
    l_hist = g.m * p
    t_pre = l_hist * col.inv_rp                                        # Eq. 4
    fn = g.f_n()
    t_tx_res = np.maximum(fn - tw, 0.0)                                # Eq. 5
    t_res = np.maximum(t_pre - tw, t_tx_res)                           # Eq. 5 (t_tx_res >= 0)
    t_sit = t_res + col.const_sit                                      # Eq. 6
    keeps_up = col.tau <= col.blk_period                               # (n_ue, 1)
    t_catch = np.where(g.n_full >= 1, np.where(keeps_up, g.t1 + col.tau, fn), 0.0)  # Eq. 7
    t_ready = np.maximum(t_pre, t_catch)
    t_early = np.maximum(tw - t_ready, 0.0)                            # Eq. 7
    j = alpha * t_sit + (1.0 - alpha) * t_early                        # Eq. 8
    shape = j.shape
    valid = np.broadcast_to(tw <= np.maximum(col.t_remain, 0.0) + _GRID_EPS, shape)
    return WindowCosts(
        windows=np.broadcast_to(tw, shape), valid=valid,
        k_trig=(g.m + g.frac) * p, l_hist=l_hist, t_pre=t_pre, n_full=g.n_full,
        t_tx_res=t_tx_res, t_res=t_res, n_tail=np.broadcast_to(col.n_tail, shape), t_sit=t_sit,
        t_catch=t_catch, t_ready=t_ready, t_early=t_early, j=j)


def _check_alpha(alpha: float) -> float:
    a = float(alpha)
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return a


def evaluate_windows(inputs: WindowInputs, windows: Any, alpha: float = 0.8) -> WindowCosts:
    """Cost of each candidate prefetching window T_w for each UE (Eqs. 4-8).

    ``windows``: T_w in seconds, shape ``(n_w,)`` (shared) or ``(n_ue, n_w)``, all >= 0.
    ``alpha``: Eq. 8's weight of T_SIT against T_early, in [0, 1].
    Returns :class:`WindowCosts` of shape ``(n_ue, n_w)``.

    Definitions (model.md section 3): K_trig = K_curr + r_d (T_remain - T_w);
    L_hist = P floor(K_trig / P); T_pre = L_hist / r_p; the suffix block j completes at
    t_j = (j P - (K_trig - L_hist)) / r_d and its transfer ends at f_j = max(f_{j-1}, t_j) + P
    s_kv / B; n_full blocks complete by the HO; T_tx_res = max(0, f_{n_full} - T_w);
    T_res = max(max(0, T_pre - T_w), T_tx_res); N_tail = K_HO - L_hist - n_full P;
    T_SIT = T_res + c_sync + N_tail / r_p + 1 / r_d_target; T_catch = f_j of the first
    j <= n_full with f_j <= t_{j+1} (else f_{n_full}); T_ready = max(T_pre, T_catch);
    T_early = max(0, T_w - T_ready); J = alpha T_SIT + (1 - alpha) T_early.

    Choices model.md leaves open: a window longer than T_remain_hat (a trigger in the past) is
    computed as if the decode had run that long but flagged ``valid = False``; with
    T_remain_hat < 0 the HO is taken as now (K_HO = K_curr). Fractional token counts are kept
    (they are expectations); only L_hist and n_full are snapped to the block grid.
    """
    return _pallas_costs(inputs, windows, _check_alpha(alpha))


# ---------------------------------------------------------------------------------------------
# Eq. 9: the decision and the trigger rule
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecisionParams:
    """Parameters of Eq. 9 and the trigger rule (model.md section 4).

    - ``alpha``: Eq. 8's weight (default 0.8).
    - ``dt``: window grid step ΔT, s (default 0.1).
    - ``t_max``: cap on the window T_max, s (default 5).
    - ``trigger_lookahead``: s; trigger once T_remain_hat <= T_w* + lookahead. Eq. 9's rule
      is T_remain_hat <= T_w*; a controller that runs every ``control_period`` seconds would see
      that only when T_remain_hat happens to land on the grid, so the xApp passes its control
      period here and triggers at the last cycle before the ideal trigger time has passed
      (the window actually used is then within one period above T_w*). 0 is the literal rule.
    - ``tie_tol``: s; windows whose J is within this of the minimum tie, and ties go to the
      smaller window (Eq. 9).
    """

    alpha: float = 0.8
    dt: float = 0.1
    t_max: float = 5.0
    trigger_lookahead: float = 0.0
    tie_tol: float = 1e-9

    def __post_init__(self) -> None:
        _check_alpha(self.alpha)
        if not (math.isfinite(self.dt) and self.dt > 0):
            raise ValueError(f"dt must be > 0, got {self.dt!r}")
        if not (math.isfinite(self.t_max) and self.t_max >= 0):
            raise ValueError(f"t_max must be >= 0, got {self.t_max!r}")
        if not (math.isfinite(self.trigger_lookahead) and self.trigger_lookahead >= 0):
            raise ValueError(f"trigger_lookahead must be >= 0, got {self.trigger_lookahead!r}")
        if not (math.isfinite(self.tie_tol) and self.tie_tol >= 0):
            raise ValueError(f"tie_tol must be >= 0, got {self.tie_tol!r}")


def candidate_windows(dt: float, t_max: float) -> np.ndarray:
    """The grid W = {0, dT, 2 dT, ..., floor(T_max / dT) dT}, shape (n_w,), seconds (Eq. 9).

    dT = 0.1 s and T_max = 5 s give 51 windows.
    """
    if not dt > 0 or not t_max >= 0:
        raise ValueError(f"need dt > 0 and t_max >= 0, got dt={dt!r}, t_max={t_max!r}")
    n = int(math.floor(t_max / dt + _GRID_EPS)) + 1
    return dt * np.arange(n, dtype=np.float64)


@dataclass(frozen=True)
class Decision:
    """Eq. 9's outcome per UE: arrays of shape ``(n_ue,)``.

    - ``t_limit``: T_limit = min(T_max, max(T_remain_hat, 0)), s.
    - ``window``: T_w*, s; ``index``: its position in the grid of :func:`candidate_windows`.
    - ``j``, ``t_sit``, ``t_early``, ``t_ready``: Eqs. 6-8 at T_w*, s.
    - ``l_hist``: predicted block-aligned prefix at the trigger, tokens (Eq. 4).
    - ``k_ho``: predicted tokens at the HO (K_curr + r_d T_remain_hat).
    - ``trigger``: True where the trigger rule fires this cycle (T_remain_hat <= T_w* +
      lookahead); False means defer and decide again next cycle.
    """

    t_limit: np.ndarray
    window: np.ndarray
    index: np.ndarray
    j: np.ndarray
    t_sit: np.ndarray
    t_early: np.ndarray
    t_ready: np.ndarray
    l_hist: np.ndarray
    k_ho: np.ndarray
    trigger: np.ndarray


_DECIDE_CHUNK = 1024   # UEs per block of work: keeps the (chunk, n_w) temporaries in cache.


def decide(inputs: WindowInputs, params: DecisionParams = DecisionParams()) -> Decision:
    """Choose T_w* = argmin_{T_w in W} J(T_w) per UE and apply the trigger rule (Eq. 9).

    W is :func:`candidate_windows` (``params.dt``, ``params.t_max``) truncated per UE at
    T_limit = min(T_max, T_remain_hat) (T_limit = 0 when T_remain_hat <= 0, so the trigger
    fires at once). Ties (J within ``params.tie_tol``) go to the smaller window. The trigger
    fires where T_remain_hat <= T_w* + ``params.trigger_lookahead``.

    Cost: O(n_ue * n_w) array arithmetic, in chunks of 1,024 UEs. Returns :class:`Decision`.
    """
    grid = candidate_windows(params.dt, params.t_max)
    n = inputs.n_ue
    out = {k: np.empty(n) for k in ("t_limit", "window", "j", "t_sit", "t_early", "t_ready",
                                    "l_hist", "k_ho")}
    index = np.empty(n, dtype=np.int64)
    t_limit_all = np.minimum(params.t_max, np.maximum(inputs.t_remain, 0.0))
    # Last valid grid index per UE (Eq. 9's floor(T_limit / dT)).
    last = np.floor(t_limit_all / params.dt + _GRID_EPS).astype(np.int64)
    np.minimum(last, grid.size - 1, out=last)
    k = np.arange(grid.size)
    for lo in range(0, n, _DECIDE_CHUNK):
        sl = slice(lo, min(n, lo + _DECIDE_CHUNK))
        sub = inputs.take(sl) if (lo or sl.stop < n) else inputs
        costs = _pallas_costs(sub, grid, params.alpha)
        j = np.where(k[None, :] <= last[sl, None], costs.j, np.inf)
        jmin = j.min(axis=1)
        best = np.argmax(j <= (jmin + params.tie_tol)[:, None], axis=1)   # first = smallest T_w
        rows = np.arange(best.size)
        index[sl] = best
        out["window"][sl] = grid[best]
        out["j"][sl] = costs.j[rows, best]
        out["t_sit"][sl] = costs.t_sit[rows, best]
        out["t_early"][sl] = costs.t_early[rows, best]
        out["t_ready"][sl] = costs.t_ready[rows, best]
        out["l_hist"][sl] = costs.l_hist[rows, best]
    out["t_limit"] = t_limit_all
    out["k_ho"] = _k_ho(inputs)
    trigger = inputs.t_remain <= out["window"] + params.trigger_lookahead + _GRID_EPS
    return Decision(index=index, trigger=trigger, **out)


# ---------------------------------------------------------------------------------------------
# Section 6: the baselines (also the fallbacks) and the ablations; Eq. 10
# ---------------------------------------------------------------------------------------------

def sit_full_copy(k: Any, s_kv: Any, bandwidth: Any, c_sync: Any = 0.0) -> Any:
    """Full-Copy SIT = c + K s_kv / B, s (model.md section 6). Broadcasts over arrays.

    ``k`` tokens at the HO, ``s_kv`` bytes/token, ``bandwidth`` bytes/s, ``c_sync`` s. The first
    decode step at the target is not in model.md's table; fold it into ``c_sync`` if wanted.
    """
    return np.add(c_sync, np.multiply(k, s_kv) / np.asarray(bandwidth, dtype=np.float64))


def sit_recomputation(k: Any, r_p: Any, c_sync: Any = 0.0) -> Any:
    """Recomputation SIT = c + K / r_p, s (model.md section 6). Broadcasts over arrays."""
    return np.add(c_sync, np.divide(k, np.asarray(r_p, dtype=np.float64)))


def ctho_split(k: Any, block_size: Any, r_p: Any, s_kv: Any, bandwidth: Any) -> tuple[Any, Any]:
    """ctHO's optimal block-aligned prefix/suffix split (model.md section 6; paper §2.2, §6.1).

    After the HO the target recomputes the first p tokens (p / r_p) while the source ships the
    other K - p tokens' KV ((K - p) s_kv / B); both run in parallel. Minimises
    max(p / r_p, (K - p) s_kv / B) over p in {0, P, 2P, ..., floor(K / P) P}. The objective is
    convex in p, so the optimum is one of the two grid points around the continuous balance
    point p* = K a / (1 / r_p + a), a = s_kv / B; ties go to the smaller p.

    Returns ``(split_tokens, seconds)``: Python (int, float) for scalar inputs, else int64 and
    float64 arrays of the broadcast shape. ``seconds`` excludes c_sync (see :func:`sit_ctho`).
    Raises ValueError for K < 0 or a non-positive block size, rate, s_kv or bandwidth.
    """
    scalar = all(np.ndim(v) == 0 for v in (k, block_size, r_p, s_kv, bandwidth))
    k_, p_, rp, s, b = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64)
                                             for v in (k, block_size, r_p, s_kv, bandwidth)))
    if np.any(k_ < 0) or np.any(p_ <= 0) or np.any(rp <= 0) or np.any(s <= 0) or np.any(b <= 0):
        raise ValueError("ctho_split needs K >= 0 and positive block_size, r_p, s_kv, bandwidth")
    a = s / b                                   # s per shipped token
    max_blocks = np.floor(k_ / p_ + _GRID_EPS)
    balance = k_ * a / (1.0 / rp + a) / p_      # continuous optimum, in blocks
    lo = np.clip(np.floor(balance), 0, max_blocks)
    hi = np.clip(lo + 1, 0, max_blocks)

    def cost(blocks: np.ndarray) -> np.ndarray:
        split = blocks * p_
        return np.maximum(split / rp, np.maximum(k_ - split, 0.0) * a)

    c_lo, c_hi = cost(lo), cost(hi)
    blocks = np.where(c_hi < c_lo, hi, lo)
    seconds = np.minimum(c_lo, c_hi)
    split = (blocks * p_).astype(np.int64)
    if scalar:
        return int(split), float(seconds)
    return split, seconds


def sit_ctho(k: Any, block_size: Any, r_p: Any, s_kv: Any, bandwidth: Any, c_sync: Any = 0.0) -> Any:
    """ctHO SIT = c + min over block-aligned p of max(p / r_p, (K - p) s_kv / B), s (section 6).

    See :func:`ctho_split` for the split itself. Broadcasts over arrays.
    """
    return np.add(c_sync, ctho_split(k, block_size, r_p, s_kv, bandwidth)[1])


def sit_detour(hops: Any, hop_delay_s: Any) -> Any:
    """Detour's added latency at and after the HO, s (model.md section 6; paper §2.2, Figure 1).

    Detour recovers nothing: the source keeps decoding and every later token, the first one
    after the HO included, crosses ``hops`` extra forwarding hops of ``hop_delay_s`` each.
    There is no interruption beyond that per-token penalty, so the SIT is the first token's
    extra delay ``hops * hop_delay_s``; the same penalty lands on every later inter-token
    latency (see :func:`detour_itl`).
    """
    h = np.asarray(hops, dtype=np.float64)
    if np.any(h < 0) or np.any(np.asarray(hop_delay_s) < 0):
        raise ValueError("hops and hop_delay_s must be >= 0")
    return h * hop_delay_s


def detour_itl(itl_s: Any, hops: Any, hop_delay_s: Any) -> Any:
    """ITL under Detour: the source's ITL plus ``hops * hop_delay_s`` per token, s (section 6)."""
    return np.add(itl_s, sit_detour(hops, hop_delay_s))


def sit_no_rc(inputs: WindowInputs, windows: Any) -> np.ndarray:
    """T_SIT of the ablation "Pallas w/o RC" for the same windows, shape (n_ue, n_w), s.

    Proactive, but no prefix recomputation (paper §6.4; model.md section 6): at the trigger the
    source ships the L_hist prefix (its complete blocks) over the link and then streams the
    suffix blocks as they complete, all in order at goodput B. That is Eq. 5's recursion with
    f_0 = L_hist s_kv / B and T_pre = 0, so T_res = T_tx_res; the tail is recomputed as in
    Eq. 6: T_SIT = T_tx_res + c_sync + N_tail / r_p + 1 / r_d_target.
    """
    g = _Geometry(inputs, windows)
    fn = g.f_n(f0=g.m * g.tau)
    return np.maximum(fn - g.tw, 0.0) + g.col.const_sit


def sit_no_sm(inputs: WindowInputs, windows: Any) -> np.ndarray:
    """T_SIT of the ablation "Pallas w/o SM" for the same windows, shape (n_ue, n_w), s.

    Proactive prefix prefill but no suffix stream (paper §6.4; model.md section 6): after the
    HO the target finishes the prefix if it has not (max(0, T_pre - T_w)), then recomputes
    every token after L_hist, K_HO - L_hist of them, on the same GPU:
    T_SIT = max(0, T_pre - T_w) + c_sync + (K_HO - L_hist) / r_p + 1 / r_d_target.
    """
    g = _Geometry(inputs, windows)
    p = inputs.block_size[:, None]
    l_hist = g.m * p
    col = g.col
    rest = np.maximum(l_hist * col.inv_rp - g.tw, 0.0)
    return rest + (col.k_ho - l_hist) * col.inv_rp + (col.const_sit - col.n_tail * col.inv_rp)


def discard_bound(t_max: Any, e_early: Any, t_avail: Any) -> Any:
    """Eq. 10: T_discard <= max(0, T_max + E_early - T_avail), s. Broadcasts over arrays.

    ``t_max`` the window cap; ``e_early`` the largest amount by which a predicted t_HO preceded
    the actual HO before the target prediction stabilised (>= 0); ``t_avail`` the time from
    the target prediction becoming stably correct to the actual HO (0 if never).
    """
    return np.maximum(0.0, np.add(t_max, e_early) - np.asarray(t_avail, dtype=np.float64))
