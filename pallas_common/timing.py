"""The Pallas timing model: KV size, the cost of a prefetching window, the decision, the baselines.

Pure functions over numpy arrays, importable from both the xApp's environment (protobuf 3.20)
and the agent's (vLLM): this module depends on numpy only. Every quantity is defined in
``docs/model.md``; equation numbers below are that page's (which follow the paper's).

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
stream catches up at the first block, otherwise it never catches up (docs/model.md Eq. 7's
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
    "DEFAULT_HOP_MODEL",
    "HOP_COSTS",
    "HopCost",
    "PAPER_HOP_COST",
    "PAPER_HOP_COST_LINEAR",
    "Decision",
    "WindowCosts",
    "WindowInputs",
    "candidate_windows",
    "ctho_split",
    "hop_cost",
    "decide",
    "DetourDelivery",
    "detour_delivery",
    "detour_switch_gap",
    "detour_itl",
    "detour_itl_samples",
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
    """Per-UE inputs of the window evaluation at decision time t_curr (docs/model.md §3).

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


def _k_ho(x: WindowInputs) -> np.ndarray:
    """K_HO = K_curr + r_d max(T_remain_hat, 0): predicted tokens at the HO, shape (n_ue,)."""
    return x.k_curr + x.r_d * np.maximum(x.t_remain, 0.0)


class _Columns:
    """Per-UE constants of Eqs. 4-8, shape (n_ue,), computed once per evaluation.

    The kernels lay (UE, window) arrays out as (n_w, n_ue): every operation then runs along
    the long, contiguous UE axis (a per-window scalar or a per-UE row broadcasts without cost),
    which is several times faster than broadcasting (n_ue, 1) columns over a short window axis.

    The kernel works in block units: u = K_trig / P = y - rho T_w with y = K_HO / P and
    rho = r_d / P; m = floor(u) prefix blocks (L_hist = m P); a = u - m the fill of the first
    suffix block at the trigger. Because L_hist is a multiple of P, n_full = floor(y) - m and
    N_tail = K_HO - P floor(y) (the tail does not depend on the window), and
    t_{n_full} = T_w - (y - floor(y)) P / r_d, so t_{n_full} + tau - T_w = ``c1`` per UE.
    """

    __slots__ = ("p", "y", "y_eps", "fy", "rho", "blk", "tau", "keeps_up", "nk_tau", "c1", "c1_pos",
                 "blk_tau", "p_over_rp", "inv_rp", "const_sit", "t_remain", "k_ho", "n_tail")

    def __init__(self, x: WindowInputs | None) -> None:
        if x is None:
            return
        p = x.block_size
        r_d = x.r_d
        self.p = p
        self.t_remain = x.t_remain
        self.k_ho = _k_ho(x)                          # tokens at the HO
        self.y = self.k_ho / p
        self.y_eps = self.y + _GRID_EPS               # snaps exact block multiples up
        self.fy = np.floor(self.y_eps)
        self.rho = r_d / p                            # blocks of decode per second
        self.blk = p / r_d                            # P / r_d: one block of decode, s
        self.tau = p * x.s_kv / x.bandwidth           # one block on the link, s
        # The link keeps up with the source iff tau <= P / r_d (then f_j = t_j + tau).
        self.keeps_up = self.tau <= self.blk
        self.nk_tau = np.where(self.keeps_up, 0.0, self.tau)
        self.c1 = self.tau - np.maximum(self.y - self.fy, 0.0) * self.blk
        self.c1_pos = np.maximum(self.c1, 0.0)        # T_tx_res when it keeps up and n_full >= 1
        self.blk_tau = self.blk + self.tau            # t_1 + tau = blk_tau - frac * blk
        self.n_tail = np.maximum(self.k_ho - self.fy * p, 0.0)
        self.inv_rp = 1.0 / x.r_p
        self.p_over_rp = p * self.inv_rp
        # Eq. 6's window-independent part: c_sync + N_tail / r_p + 1 / r_d_target.
        self.const_sit = x.c_sync + self.n_tail * self.inv_rp + 1.0 / x.r_d_target

    def take(self, index: Any, names: tuple[str, ...] | None = None) -> "_Columns":
        """The constants of UEs ``index`` (a slice or an integer array); only ``names`` if given."""
        out = _Columns(None)
        for name in self.__slots__ if names is None else names:
            setattr(out, name, getattr(self, name)[index])
        return out


def _check_windows(windows: Any, n_ue: int) -> np.ndarray:
    """Public windows, (n_w,) or (n_ue, n_w), as the kernels' (n_w, 1) or (n_w, n_ue)."""
    w = np.asarray(windows, dtype=np.float64)
    if w.ndim == 1:
        w = w[:, None]
    elif w.ndim == 2 and w.shape[0] in (1, n_ue):
        w = w.T
    else:
        raise ValueError(f"windows must have shape (n_w,) or (n_ue, n_w), got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("candidate windows must be finite and >= 0")
    return w


_BLOCK_FIELDS = ("m", "frac", "n", "ind", "t1")
# The per-UE constants the kernel reads (what a chunk needs of :class:`_Columns`).
_KERNEL_COLUMNS = ("y_eps", "fy", "rho", "blk", "tau", "keeps_up", "nk_tau", "c1", "c1_pos",
                   "blk_tau", "p_over_rp", "const_sit")
_KERNEL_FIELDS = _BLOCK_FIELDS + ("t_tx_res", "t_pre", "t_res", "t_catch", "t_ready", "t_early",
                                  "t_sit", "j", "tmp")


def _scratch(shape: tuple[int, ...], names: tuple[str, ...] = _KERNEL_FIELDS) -> dict[str, np.ndarray]:
    """Uninitialised float64 work arrays, one per name (the kernels write every element)."""
    return {k: np.empty(shape) for k in names}


def _blocks(col: _Columns, w: np.ndarray, o: dict[str, np.ndarray], clamp: bool = True) -> None:
    """Eq. 4's split and the suffix stream's block counts, into ``o`` (in place).

    m = floor(K_trig / P) = L_hist / P; frac = (K_trig - L_hist) / P in [0, 1); n = n_full;
    ind = 1 where n_full >= 1 else 0; t1 = frac P / r_d (t_1 = P / r_d - t1, s after the
    trigger; the caller completes it where it needs t_1 itself).
    """
    m, frac, n, ind, t1 = (o.get(k) for k in _BLOCK_FIELDS)
    np.multiply(col.rho, w, out=frac)
    np.subtract(col.y_eps, frac, out=frac)            # u = K_trig / P (+ the grid slack)
    np.floor(frac, out=m)
    if clamp:
        np.maximum(m, 0.0, out=m)                     # m <= floor(y) holds as T_w >= 0
    np.subtract(frac, m, out=frac)
    if n is not None:
        np.subtract(col.fy, m, out=n)                 # n_full = floor(K_HO / P) - m
    np.less(m, col.fy, out=ind)                       # n_full >= 1
    np.multiply(frac, col.blk, out=t1)                # frac P / r_d; t_1 = P / r_d - this


def _pallas_kernel(col: _Columns, w: np.ndarray, alpha: float, o: dict[str, np.ndarray],
                   all_keep_up: bool = False, j_only: bool = False) -> dict[str, np.ndarray]:
    """Eqs. 4-8 on (n_w, n_ue) into the work arrays ``o`` (see :func:`_scratch`); returns ``o``.

    Every step writes into a preallocated array: at 10,000 UEs x 51 windows the evaluation is
    bound by memory traffic, and fresh temporaries of this size cost more than the arithmetic.
    ``all_keep_up`` (every UE's link keeps up with its source) takes the shorter path in which
    T_tx_res and T_catch do not need f_n's slow-link branch. ``j_only`` (the decision's hot
    path) leaves T_SIT and n_full unwritten, skips clamping L_hist at 0 (only windows beyond
    T_limit can go below), and writes (J - alpha (c_sync + N_tail / r_p + 1 / r_d_target)) / s
    instead of J, s = max(alpha, 1 - alpha): a per-UE shift and a positive factor, so the
    argmin is the same and ties scale by :func:`_j_only_scale`.
    """
    if j_only and all_keep_up:
        o = dict(o, n=None)
    _blocks(col, w, o, clamp=not j_only)
    m, frac, n, ind, t1 = o["m"], o["frac"], o["n"], o["ind"], o["t1"]
    tx, pre, res, catch = o["t_tx_res"], o["t_pre"], o["t_res"], o["t_catch"]
    ready, early, sit, j, tmp = o["t_ready"], o["t_early"], o["t_sit"], o["j"], o["tmp"]
    if all_keep_up:
        # f_n = t_n + tau = T_w + c1, so T_tx_res = max(0, c1) once a suffix block is complete,
        # and the stream catches up at f_1 = t_1 + tau.
        np.multiply(ind, col.c1_pos, out=tx)
        np.subtract(col.blk_tau, t1, out=catch)       # t1 holds frac * P / r_d here
        catch *= ind
    else:
        np.subtract(col.blk, t1, out=t1)              # t_1 = (1 - frac) P / r_d
        # Eq. 5: T_tx_res = max(0, f_n - T_w), f_n = max(t_1 + n tau, T_w + c1) for n >= 1.
        np.multiply(n, col.tau, out=tx)
        tx += t1
        tx -= w
        np.maximum(tx, col.c1, out=tx)
        np.maximum(tx, 0.0, out=tx)
        tx *= ind
        # Eq. 7: the stream catches up at f_1 = t_1 + tau if the link keeps up, else never
        # (T_catch = f_n = t_1 + n tau); 0 if no suffix block completes before the HO.
        np.subtract(n, 1.0, out=catch)
        catch *= col.nk_tau
        catch += t1
        catch += col.tau
        catch *= ind
    np.multiply(m, col.p_over_rp, out=pre)            # Eq. 4: T_pre = L_hist / r_p
    np.subtract(pre, w, out=res)
    np.maximum(res, tx, out=res)                      # Eq. 5: T_res (T_tx_res >= 0)
    np.maximum(pre, catch, out=ready)                 # Eq. 7: T_ready
    np.subtract(w, ready, out=early)
    np.maximum(early, 0.0, out=early)                 # Eq. 7: T_early
    if j_only:
        # Eq. 8 up to a per-UE constant and a positive factor (see :func:`_j_only_scale`).
        if alpha >= 0.5:
            np.multiply(early, (1.0 - alpha) / alpha, out=j)
            j += res                                  # (J - alpha (T_SIT - T_res)) / alpha
        else:
            np.multiply(res, alpha / (1.0 - alpha), out=j)
            j += early                                # (J - alpha (T_SIT - T_res)) / (1 - alpha)
        return o
    np.add(res, col.const_sit, out=sit)               # Eq. 6: T_SIT
    np.multiply(sit, alpha, out=j)
    np.multiply(early, 1.0 - alpha, out=tmp)
    j += tmp                                          # Eq. 8: J
    return o


def _j_only_scale(alpha: float) -> float:
    """The factor by which the kernel's ``j_only`` output divides J's differences."""
    return alpha if alpha >= 0.5 else 1.0 - alpha


def _f_n(col: _Columns, w: np.ndarray, o: dict[str, np.ndarray], f0: np.ndarray) -> np.ndarray:
    """f_{n_full} of Eq. 5's recursion with f_0 = ``f0``, closed form (after :func:`_blocks`).

    Unrolled, f_j = max(f_0 + j tau, max_{1<=i<=j} (t_i + (j-i+1) tau)); the inner maximum is
    over a function linear in i, so f_j = max(max(f_0, t_1) + j tau, t_j + tau), and
    t_{n_full} + tau = T_w + c1.
    """
    fn = np.maximum(col.blk - o["t1"], f0)           # max(t_1, f_0)
    fn += o["n"] * col.tau
    np.maximum(fn, w + col.c1, out=fn)
    fn *= o["ind"]
    fn += (1.0 - o["ind"]) * f0
    return fn


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

    Definitions (docs/model.md §3): K_trig = K_curr + r_d (T_remain - T_w);
    L_hist = P floor(K_trig / P); T_pre = L_hist / r_p; the suffix block j completes at
    t_j = (j P - (K_trig - L_hist)) / r_d and its transfer ends at f_j = max(f_{j-1}, t_j) + P
    s_kv / B; n_full blocks complete by the HO; T_tx_res = max(0, f_{n_full} - T_w);
    T_res = max(max(0, T_pre - T_w), T_tx_res); N_tail = K_HO - L_hist - n_full P;
    T_SIT = T_res + c_sync + N_tail / r_p + 1 / r_d_target; T_catch = f_j of the first
    j <= n_full with f_j <= t_{j+1} (else f_{n_full}); T_ready = max(T_pre, T_catch);
    T_early = max(0, T_w - T_ready); J = alpha T_SIT + (1 - alpha) T_early.

    Choices docs/model.md leaves open: a window longer than T_remain_hat (a trigger in the past) is
    computed as if the decode had run that long but flagged ``valid = False``; with
    T_remain_hat < 0 the HO is taken as now (K_HO = K_curr). Fractional token counts are kept
    (they are expectations); only L_hist and n_full are snapped to the block grid.
    """
    alpha = _check_alpha(alpha)
    w = _check_windows(windows, inputs.n_ue)
    col = _Columns(inputs)
    shape = np.broadcast_shapes(col.y.shape, w.shape)
    o = _pallas_kernel(col, w, alpha, _scratch(shape))
    out = dict(
        windows=np.broadcast_to(w, shape),
        valid=np.broadcast_to(w <= np.maximum(col.t_remain, 0.0) + _GRID_EPS, shape),
        k_trig=(o["m"] + o["frac"]) * col.p, l_hist=o["m"] * col.p, t_pre=o["t_pre"],
        n_full=o["n"], t_tx_res=o["t_tx_res"], t_res=o["t_res"],
        n_tail=np.broadcast_to(col.n_tail, shape), t_sit=o["t_sit"], t_catch=o["t_catch"],
        t_ready=o["t_ready"], t_early=o["t_early"], j=o["j"])
    return WindowCosts(**{k: v.T for k, v in out.items()})      # (n_w, n_ue) -> (n_ue, n_w)


# ---------------------------------------------------------------------------------------------
# Eq. 9: the decision and the trigger rule
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecisionParams:
    """Parameters of Eq. 9 and the trigger rule (docs/model.md §4).

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


_DECIDE_CHUNK = 256    # UEs per block of work: keeps the (chunk, n_w) work arrays in cache.
_BEYOND_LIMIT = 1e30   # added to J of windows beyond T_limit (J itself is finite)


def decide(inputs: WindowInputs, params: Any = DecisionParams()) -> Decision:
    """Choose T_w* = argmin_{T_w in W} J(T_w) per UE and apply the trigger rule (Eq. 9).

    W is :func:`candidate_windows` (``params.dt``, ``params.t_max``) truncated per UE at
    T_limit = min(T_max, T_remain_hat) (T_limit = 0 when T_remain_hat <= 0, so the trigger
    fires at once). Ties (J within ``params.tie_tol``) go to the smaller window. The trigger
    fires where T_remain_hat <= T_w* + ``params.trigger_lookahead``.

    ``params``: :class:`DecisionParams`, or an object with a ``decision_params()`` method
    returning one (the xApp's ``SchedulerConfig``).

    Cost: O(n_ue * n_w) array arithmetic, in chunks of 256 UEs. Returns :class:`Decision`.
    """
    if not isinstance(params, DecisionParams):
        params = params.decision_params()
    grid = candidate_windows(params.dt, params.t_max)
    n = inputs.n_ue
    cols = _Columns(inputs)
    t_limit = np.minimum(params.t_max, np.maximum(inputs.t_remain, 0.0))
    # Last valid grid index per UE (Eq. 9's floor(T_limit / dT)); later windows get a penalty.
    last = np.floor(t_limit / params.dt + _GRID_EPS)
    k = np.arange(grid.size, dtype=np.float64)[:, None]
    index = np.empty(n, dtype=np.int64)
    tie_tol = params.tie_tol / _j_only_scale(params.alpha)
    picked = {name: np.empty(n) for name in ("t_res", "t_early", "t_ready", "m")}
    work = _scratch((grid.size, min(n, _DECIDE_CHUNK)))
    # Order the UEs by link regime (those that keep up first: the kernel's shorter path) and
    # then by T_limit, so that a chunk evaluates only the windows its UEs can use and most
    # chunks need no masking of windows beyond T_limit.
    order = np.lexsort((last, ~cols.keeps_up))
    sorted_cols, sorted_last = cols.take(order, _KERNEL_COLUMNS), last[order]
    for lo in range(0, n, _DECIDE_CHUNK):
        sl = slice(lo, min(n, lo + _DECIDE_CHUNK))
        rows = sl.stop - sl.start
        c = sorted_cols.take(sl, _KERNEL_COLUMNS)
        chunk_last = sorted_last[sl]
        n_w = int(chunk_last.max()) + 1
        o = _pallas_kernel(c, grid[:n_w, None], params.alpha,
                           {name: v[:n_w, :rows] for name, v in work.items()},
                           all_keep_up=bool(c.keeps_up.all()), j_only=True)
        j, tmp = o["j"], o["tmp"]
        if chunk_last.min() < n_w - 1:
            np.greater(k[:n_w], chunk_last, out=tmp)  # 1.0 beyond T_limit
            tmp *= _BEYOND_LIMIT
            j += tmp
        jmin = j.min(axis=0)
        jmin += tie_tol
        best = np.argmax(j <= jmin, axis=0)           # the first, i.e. smallest, T_w
        dest = order[sl]
        index[dest] = best
        ue = np.arange(rows)
        for name, arr in picked.items():
            arr[dest] = o[name][best, ue]
    window = grid[index]
    t_sit = picked["t_res"] + cols.const_sit          # Eq. 6
    trigger = inputs.t_remain <= window + params.trigger_lookahead + _GRID_EPS
    return Decision(t_limit=t_limit, window=window, index=index,
                    j=params.alpha * t_sit + (1.0 - params.alpha) * picked["t_early"],
                    t_sit=t_sit, t_early=picked["t_early"], t_ready=picked["t_ready"],
                    l_hist=picked["m"] * inputs.block_size, k_ho=cols.k_ho, trigger=trigger)


# ---------------------------------------------------------------------------------------------
# Section 6: the baselines (also the fallbacks) and the ablations; Eq. 10
# ---------------------------------------------------------------------------------------------

def sit_full_copy(k: Any, s_kv: Any, bandwidth: Any, c_sync: Any = 0.0) -> Any:
    """Full-Copy SIT = c + K s_kv / B, s (docs/model.md §6). Broadcasts over arrays.

    ``k`` tokens at the HO, ``s_kv`` bytes/token, ``bandwidth`` bytes/s, ``c_sync`` s. The first
    decode step at the target is not in docs/model.md's table; fold it into ``c_sync`` if wanted.
    """
    return np.add(c_sync, np.multiply(k, s_kv) / np.asarray(bandwidth, dtype=np.float64))


def sit_recomputation(k: Any, r_p: Any, c_sync: Any = 0.0) -> Any:
    """Recomputation SIT = c + K / r_p, s (docs/model.md §6). Broadcasts over arrays."""
    return np.add(c_sync, np.divide(k, np.asarray(r_p, dtype=np.float64)))


def ctho_split(k: Any, block_size: Any, r_p: Any, s_kv: Any, bandwidth: Any,
               held_tokens: Any = 0) -> tuple[Any, Any]:
    """ctHO's optimal block-aligned prefix/suffix split (docs/model.md §6; paper §2.2, §6.1).

    After the HO the target recomputes the first p tokens (p / r_p) while the source ships the
    other K - p tokens' KV ((K - p) s_kv / B); both run in parallel. Minimises
    max(p / r_p, (K - p) s_kv / B) over p in {0, P, 2P, ..., floor(K / P) P}. The objective is
    convex in p, so the optimum is one of the two grid points around the continuous balance
    point p* = K a / (1 / r_p + a), a = s_kv / B; ties go to the smaller p.

    ``held_tokens`` h: tokens of the session whose KV the target already holds (its prefix
    cache, from when it served the session before: a UE handing back to the cell it came
    from), floored to whole blocks and capped at floor(K / P) P. Those are never redone
    (docs/model.md §8): recomputing p >= h costs (p - h) / r_p, so the split is h plus the
    split of the K - h tokens after them.

    Returns ``(split_tokens, seconds)``: Python (int, float) for scalar inputs, else int64 and
    float64 arrays of the broadcast shape. ``seconds`` excludes c_sync (see :func:`sit_ctho`).
    Raises ValueError for K < 0, h < 0 or a non-positive block size, rate, s_kv or bandwidth.
    """
    scalar = all(np.ndim(v) == 0 for v in (k, block_size, r_p, s_kv, bandwidth, held_tokens))
    k_, p_, rp, s, b, h_ = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64)
                                                 for v in (k, block_size, r_p, s_kv, bandwidth, held_tokens)))
    if np.any(k_ < 0) or np.any(p_ <= 0) or np.any(rp <= 0) or np.any(s <= 0) or np.any(b <= 0):
        raise ValueError("ctho_split needs K >= 0 and positive block_size, r_p, s_kv, bandwidth")
    if np.any(h_ < 0):
        raise ValueError("ctho_split needs held_tokens >= 0")
    a = s / b                                   # s per shipped token
    held = np.minimum(np.floor(h_ / p_ + _GRID_EPS), np.floor(k_ / p_ + _GRID_EPS)) * p_
    k_ = k_ - held                              # what the target does not hold
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
    split = (held + blocks * p_).astype(np.int64)
    if scalar:
        return int(split), float(seconds)
    return split, seconds


def sit_ctho(k: Any, block_size: Any, r_p: Any, s_kv: Any, bandwidth: Any, c_sync: Any = 0.0) -> Any:
    """ctHO SIT = c + min over block-aligned p of max(p / r_p, (K - p) s_kv / B), s (section 6).

    See :func:`ctho_split` for the split itself. Broadcasts over arrays.
    """
    return np.add(c_sync, ctho_split(k, block_size, r_p, s_kv, bandwidth)[1])


def sit_detour(hops: Any, hop_delay_s: Any) -> Any:
    """Detour's added latency at and after the HO, s, with every hop alike (docs/model.md §6;
    paper §2.2, Figure 1); ``HopCost.mean_s(hops)`` is the same for a hop cost whose hops differ.

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


@dataclass(frozen=True)
class HopCost:
    """What the backhaul forwarding hops add to every relayed token's gap, s (Detour's relay).

    Per token and per hop, independently: a fixed forwarding delay ``fixed_s``, a log-normal
    jitter (median ``jitter_median_s``, log-sd ``jitter_sigma``) and, with a probability, a
    stall drawn from an exponential of mean ``stall_mean_s`` (a token held behind a lost or
    queued segment). The stall probability of the ``k``-th hop of the path (k = 1, 2, ...) is
    ``min(1, stall_prob * growth ** (k - 1))``: ``growth`` 1 makes every hop alike, so the cost
    is linear in hops; ``growth`` above 1 makes each further relay hop more likely to hold a
    token than the one before (each relay a queue fed by a burstier stream than its
    predecessor's, so the tail compounds along the path). Over ``h`` hops the token's gap grows
    by the sum of the ``h`` hops' draws: the relay forwards a token only after the previous one
    crossed, so the cost lands on every inter-token latency (paper section 2.2: "this
    path-induced penalty affects every token generated after handover"), and ITL at ``h`` hops
    is ``1 / r_d + D_h``.

    Calibrations (docs/model.md section 6.1; ``benchmarks/detour_calibration.py`` fits and
    prints them), by Monte Carlo to the paper's Figure 1 (section 2.2; RTX A6000, decode step
    48 ms for Qwen3-32B and 28 ms for Llama-3-8B, ``pallas_eval.experiments.presets.PAPER_ITL_S``
    and ``FIGURE1_ITL``): :data:`PAPER_HOP_COST` (the default; ``growth`` fitted with the rest to
    all seven points the text gives: 2.2% / 1.7% over 100 ms at two hops, 15.2% / 11.6% at three,
    P90 131 / 112 ms, P99 306 ms, against the paper's 1.93% / 1.74%, 12.94% / 12.61%, 126.7 /
    130.5 and 263.5 ms) and :data:`PAPER_HOP_COST_LINEAR` (``growth`` 1, fitted to Qwen3-32B's
    four points: 1.9%, 12.8%, P90 102 ms, P99 254 ms; it misses Llama-3-8B's three-hop share,
    2.4% against 12.61%). Beyond three hops both are extrapolations.

    Raises ValueError for a negative part, ``stall_prob`` outside [0, 1] or ``growth`` <= 0.
    """

    fixed_s: float = 0.0082
    jitter_median_s: float = 0.0052
    jitter_sigma: float = 0.60
    stall_prob: float = 0.008
    stall_mean_s: float = 0.188
    growth: float = 1.0

    def __post_init__(self) -> None:
        if min(self.fixed_s, self.jitter_median_s, self.jitter_sigma, self.stall_mean_s) < 0:
            raise ValueError(f"hop cost parts must be >= 0: {self}")
        if not 0.0 <= self.stall_prob <= 1.0:
            raise ValueError(f"stall_prob must be in [0, 1], got {self.stall_prob}")
        if not self.growth > 0:
            raise ValueError(f"growth must be > 0, got {self.growth}")

    def stall_prob_at(self, k: int) -> float:
        """Stall probability of the ``k``-th hop of the path (1-based). ValueError for k < 1."""
        if k < 1:
            raise ValueError(f"hop index must be >= 1, got {k}")
        return min(1.0, self.stall_prob * self.growth ** (k - 1))

    def mean_s(self, hops: int = 1) -> float:
        """Expected cost of ``hops`` hops per token, s (default: the first hop alone).
        ValueError for negative hops."""
        if hops < 0:
            raise ValueError(f"hops must be >= 0, got {hops}")
        base = self.fixed_s + self.jitter_median_s * math.exp(self.jitter_sigma ** 2 / 2.0)
        return sum(base + self.stall_prob_at(k) * self.stall_mean_s for k in range(1, hops + 1))

    def scaled(self, factor: float) -> "HopCost":
        """Every duration times ``factor`` (probabilities and growth kept). ValueError if < 0."""
        if factor < 0:
            raise ValueError(f"scale factor must be >= 0, got {factor}")
        return HopCost(self.fixed_s * factor, self.jitter_median_s * factor, self.jitter_sigma,
                       self.stall_prob, self.stall_mean_s * factor, self.growth)

    def with_mean(self, mean_s: float) -> "HopCost":
        """The same shape scaled so the first hop costs ``mean_s`` on average (0: free hops).

        Raises ValueError for a negative mean."""
        if mean_s < 0:
            raise ValueError(f"mean hop cost must be >= 0, got {mean_s}")
        return self.scaled(mean_s / self.mean_s() if self.mean_s() > 0 else 0.0)

    def sample(self, rng: np.random.Generator, hops: Any, size: int | None = None) -> np.ndarray:
        """Per-token added gap over ``hops`` hops, s: shape ``np.shape(hops)`` (or ``(size,)``
        of one hop count when ``size`` is given). Raises ValueError for negative hops."""
        h = np.asarray(hops, dtype=np.int64)
        if np.any(h < 0):
            raise ValueError("hops must be >= 0")
        if size is not None:
            h = np.broadcast_to(h, (size,))
        h = np.atleast_1d(h)
        n_max = int(h.max()) if h.size else 0
        out = np.zeros(h.shape, dtype=np.float64)
        for k in range(n_max):
            on = h > k
            out[on] += self.sample_at(rng, k + 1, int(on.sum()))
        return out if (size is not None or np.ndim(hops)) else out.reshape(())

    def sample_at(self, rng: np.random.Generator, position: int, size: int) -> np.ndarray:
        """Per-token cost of the ``position``-th hop of the path alone (1-based), s: shape
        ``(size,)``; :meth:`sample` over ``h`` hops is the sum of one such draw at each position
        1..h. A relay that knows its place on the path draws this (``pallas_eval.relay``).
        Raises ValueError for a position below 1 or a negative size."""
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        q = self.stall_prob_at(position)
        jit = self.jitter_median_s * np.exp(self.jitter_sigma * rng.standard_normal(size))
        stall = np.where(rng.random(size) < q, rng.exponential(self.stall_mean_s, size), 0.0)
        return self.fixed_s + jit + stall


#: Figure 1's fit with the stall probability growing along the path (see :class:`HopCost`,
#: docs/model.md section 6.1): the default of the timing model, the experiments and the replay.
PAPER_HOP_COST = HopCost(fixed_s=0.0076, jitter_median_s=0.0036, jitter_sigma=0.45, stall_prob=0.0048,
                         stall_mean_s=0.074, growth=5.8)
#: Figure 1's fit with every hop alike (``growth`` 1): the cost linear in hops.
PAPER_HOP_COST_LINEAR = HopCost()
#: The hop-cost models by name (``pallas experiment --hop-model``).
HOP_COSTS: dict[str, HopCost] = {"compounding": PAPER_HOP_COST, "linear": PAPER_HOP_COST_LINEAR}
DEFAULT_HOP_MODEL = "compounding"


def hop_cost(name: str) -> HopCost:
    """The hop-cost model called ``name`` (:data:`HOP_COSTS`). KeyError for another name."""
    if name not in HOP_COSTS:
        raise KeyError(f"unknown hop-cost model {name!r}; known: {', '.join(HOP_COSTS)}")
    return HOP_COSTS[name]


def detour_itl_samples(rng: np.random.Generator, itl_s: float, hops: int, n: int,
                       cost: HopCost = PAPER_HOP_COST) -> np.ndarray:
    """``n`` inter-token latencies of a stream relayed over ``hops`` hops, s: shape ``(n,)``.

    ``itl_s`` the source's own gap (1 / r_d) plus each token's draw of ``cost`` over ``hops``
    (see :class:`HopCost`). Raises ValueError for negative hops, ``n`` or ``itl_s``."""
    if n < 0 or itl_s < 0:
        raise ValueError(f"n and itl_s must be >= 0, got {n}, {itl_s}")
    return itl_s + cost.sample(rng, hops, n)


@dataclass(frozen=True)
class DetourDelivery:
    """One Detour session as the UE receives it (:func:`detour_delivery`).

    ``arrival``: when each token reached the UE, s, shape ``(n,)`` in token order; ``hops``:
    the relay hops of the path it came over, int64 ``(n,)``; ``switch_gaps``: per path switch
    (a handover), the gap from the last token the UE got before it to the first it got at or
    after it, s, shape ``(m,)`` (NaN where no token came before or after it: the gap the
    replay's SIT measures for Detour, ``pallas_eval.metrics.sit_for_handover``)."""

    arrival: np.ndarray
    hops: np.ndarray
    switch_gaps: np.ndarray

    def gaps(self) -> np.ndarray:
        """Inter-token latencies at the UE, s, shape ``(max(0, n - 1),)``."""
        return np.diff(self.arrival)

    def gap_hops(self) -> np.ndarray:
        """The relay hops of each gap's later token, int64, shape of :meth:`gaps`."""
        return self.hops[1:]


def detour_delivery(n_tokens: int, step_s: float, switches: Any, path_hops: Any, cost: HopCost,
                    rng: np.random.Generator, setup_s: float = 0.0) -> DetourDelivery:
    """When each of a Detour session's tokens reaches the UE over a relay path that changes at
    every handover (docs/model.md section 6.1).

    The source decodes token ``i`` at ``i * step_s`` (s, i = 0 .. ``n_tokens`` - 1) whatever the
    relay does. The UE is on path ``k`` from ``switches[k - 1]`` to ``switches[k]`` (path 0
    from the start, the last one until every token has arrived), of ``path_hops[k]`` relay
    hops (``len(path_hops) == len(switches) + 1``). At each switch the UE resumes from the
    first token it has not received (agent/frontend.py: ``from_index``): tokens that were
    still on the old path are fetched again over the new one. On a path that opened at ``s``
    token ``i`` enters the relay at ``a_i = max(i * step_s, s + setup_s)`` (the tokens the
    source holds by then all at once) and reaches the UE at
    ``out_i = out_{i-1} + (a_i - a_{i-1}) + D_i`` (the first at ``a_i + D_i``): each relay
    forwards a token only after the previous one crossed (:class:`HopCost`), the rule the
    live relay's proxies follow (``pallas_eval.relay.relay_due``), ``D_i`` one draw of ``cost``
    over the path's hops (0 at 0 hops). A token whose ``out_i`` falls after the path's end
    never arrives over it. So on a relayed path the stream falls behind the source by every
    draw, and the tokens decoded on a short path are delivered over the longer later ones.

    ``setup_s``: how long after a switch the new path takes its first token (the UE's request
    to its new front and the front's to the source), s; 0 for none. Raises ValueError for a
    negative token count, a non-positive step, negative hops or setup, unsorted switches or a
    ``path_hops`` of the wrong length.
    """
    sw = np.asarray(switches, dtype=np.float64).reshape(-1)
    hp = np.asarray(path_hops, dtype=np.int64).reshape(-1)
    if n_tokens < 0 or not step_s > 0 or setup_s < 0:
        raise ValueError(f"need n_tokens >= 0, step_s > 0, setup_s >= 0; got {n_tokens}, {step_s}, {setup_s}")
    if hp.size != sw.size + 1 or np.any(hp < 0):
        raise ValueError(f"path_hops must be {sw.size + 1} counts >= 0, got {hp.tolist()}")
    if np.any(np.diff(sw) < 0):
        raise ValueError("switches must be sorted")
    gen = np.arange(n_tokens, dtype=np.float64) * step_s
    arrival = np.empty(n_tokens)
    hops = np.zeros(n_tokens, dtype=np.int64)
    nxt, start = 0, -math.inf
    for k in range(sw.size + 1):
        if nxt >= n_tokens:
            break
        end = sw[k] if k < sw.size else math.inf
        a = gen[nxt:] if k == 0 else np.maximum(gen[nxt:], start + setup_s)
        d = cost.sample(rng, int(hp[k]), a.size) if hp[k] > 0 else np.zeros(a.size)
        out = a + np.cumsum(d)
        got = int(np.searchsorted(out, end, side="right")) if math.isfinite(end) else a.size
        arrival[nxt:nxt + got], hops[nxt:nxt + got] = out[:got], hp[k]
        nxt += got
        start = end
    i = np.searchsorted(arrival, sw, side="left")
    ok = (i > 0) & (i < n_tokens)
    gaps = np.full(sw.size, np.nan)
    gaps[ok] = arrival[i[ok]] - arrival[i[ok] - 1]
    return DetourDelivery(arrival, hops, gaps)


def detour_switch_gap(r_d: float, hops: Any, prev_hops: Any, cost: HopCost, request_s: float = 0.0,
                      requests_per_hop: int = 1) -> np.ndarray:
    """The gap a UE sees across a Detour handover on average, s (docs/model.md section 6.1):
    from its last token before the switch to its first over the new path of ``hops`` relay hops,
    the old path having had ``prev_hops``. Broadcasts ``hops`` and ``prev_hops`` (ints >= 0).

    The new path opens ``S = (1 + requests_per_hop * hops) * request_s`` after the switch: the
    UE's request to its new front and, per relay hop, ``requests_per_hop`` HTTP stream requests
    of ``request_s`` each (agent/frontend.py relays by one stream request a hop; the replay's
    delaying proxy in front of each front forwards it once more, ``pallas_eval.relay``: 2).
    Its first token pays ``D = cost.mean_s(hops)``. With a direct
    old path (``prev_hops`` 0) nothing is held back: the UE switched ``U`` after its last token,
    uniform over a decode step ``1 / r_d``, and the source decodes the next token a step after
    the last, so the gap is ``E[max(1 / r_d, U + S)] + D`` (``1 / r_d + S^2 r_d / 2 + D`` for
    ``S <= 1 / r_d``, else ``S + 1 / (2 r_d) + D``). Over a relayed old path the stream lags its
    source (:func:`detour_delivery`): the next tokens are held at the source and the first
    leaves as the new path opens, ``U' + S + D``, ``U'`` on average half a relayed gap,
    ``(1 / r_d + cost.mean_s(prev_hops)) / 2``.

    Raises ValueError for a non-positive rate, negative hops or ``request_s``, or
    ``requests_per_hop`` below 1.
    """
    if not r_d > 0 or request_s < 0 or requests_per_hop < 1:
        raise ValueError(f"need r_d > 0, request_s >= 0, requests_per_hop >= 1; got {r_d}, {request_s}, "
                         f"{requests_per_hop}")
    h, ph = np.broadcast_arrays(np.asarray(hops, dtype=np.int64), np.asarray(prev_hops, dtype=np.int64))
    if np.any(h < 0) or np.any(ph < 0):
        raise ValueError("hops and prev_hops must be >= 0")
    step = 1.0 / r_d
    mean = np.vectorize(cost.mean_s, otypes=[np.float64])
    setup = (1 + requests_per_hop * h) * request_s
    direct = np.where(setup <= step, step + setup ** 2 / (2.0 * step), setup + step / 2.0)
    lagging = (step + mean(ph)) / 2.0 + setup
    return np.where(ph == 0, direct, lagging) + mean(h)


def sit_bridge(block_size: Any, r_p: Any, r_d: Any, c_sync: Any, hop_delay_s: Any) -> Any:
    """The largest token gap across a bridged handover (``pallas-bridge``, docs/model.md §8), s.

    The source decodes on through the new agent's front until the target holds every full
    block, then hands over right after a token: the UE got that token one relay hop late, and
    gets the target's first token after the switch (c_sync), the tail's recomputation (on
    average half a block, P / 2 tokens at r_p) and one decode step. The gap is that less the
    hop, and never below one inter-token gap 1 / r_d:

        gap = max(1 / r_d, c_sync + (P / 2) / r_p + 1 / r_d - hop_delay_s)

    Raises ValueError for a non-positive block size or rate, or a negative c_sync or hop delay.
    """
    P, rp, rd = (np.asarray(v, dtype=np.float64) for v in (block_size, r_p, r_d))
    if np.any(P <= 0) or np.any(rp <= 0) or np.any(rd <= 0):
        raise ValueError("block_size, r_p and r_d must be > 0")
    if np.any(np.asarray(c_sync) < 0) or np.any(np.asarray(hop_delay_s) < 0):
        raise ValueError("c_sync and hop_delay_s must be >= 0")
    step = 1.0 / rd
    return np.maximum(step, np.asarray(c_sync) + P / 2.0 / rp + step - np.asarray(hop_delay_s))


def sit_no_rc(inputs: WindowInputs, windows: Any) -> np.ndarray:
    """T_SIT of the ablation "Pallas w/o RC" for the same windows, shape (n_ue, n_w), s.

    Proactive, but no prefix recomputation (paper §6.4; docs/model.md §6): at the trigger the
    source ships the L_hist prefix (its complete blocks) over the link and then streams the
    suffix blocks as they complete, all in order at goodput B. That is Eq. 5's recursion with
    f_0 = L_hist s_kv / B and T_pre = 0, so T_res = T_tx_res; the tail is recomputed as in
    Eq. 6: T_SIT = T_tx_res + c_sync + N_tail / r_p + 1 / r_d_target.
    """
    col = _Columns(inputs)
    w = _check_windows(windows, inputs.n_ue)
    o = _scratch(np.broadcast_shapes(col.y.shape, w.shape), _BLOCK_FIELDS)
    _blocks(col, w, o)
    fn = _f_n(col, w, o, f0=o["m"] * col.tau)
    return (np.maximum(fn - w, 0.0) + col.const_sit).T


def sit_no_sm(inputs: WindowInputs, windows: Any) -> np.ndarray:
    """T_SIT of the ablation "Pallas w/o SM" for the same windows, shape (n_ue, n_w), s.

    Proactive prefix prefill but no suffix stream (paper §6.4; docs/model.md §6): after the
    HO the target finishes the prefix if it has not (max(0, T_pre - T_w)), then recomputes
    every token after L_hist, K_HO - L_hist of them, on the same GPU:
    T_SIT = max(0, T_pre - T_w) + c_sync + (K_HO - L_hist) / r_p + 1 / r_d_target.
    """
    col = _Columns(inputs)
    w = _check_windows(windows, inputs.n_ue)
    o = _scratch(np.broadcast_shapes(col.y.shape, w.shape), _BLOCK_FIELDS)
    _blocks(col, w, o)
    l_hist = o["m"] * col.p
    rest = np.maximum(l_hist * col.inv_rp - w, 0.0)
    return (rest + (col.k_ho - l_hist) * col.inv_rp + (col.const_sit - col.n_tail * col.inv_rp)).T


def discard_bound(t_max: Any, e_early: Any, t_avail: Any) -> Any:
    """Eq. 10: T_discard <= max(0, T_max + E_early - T_avail), s. Broadcasts over arrays.

    ``t_max`` the window cap; ``e_early`` the largest amount by which a predicted t_HO preceded
    the actual HO before the target prediction stabilised (>= 0); ``t_avail`` the time from
    the target prediction becoming stably correct to the actual HO (0 if never).
    """
    return np.maximum(0.0, np.add(t_max, e_early) - np.asarray(t_avail, dtype=np.float64))


# ---------------------------------------------------------------------------------------------
# Section 8: the commit-time choice (this project's addition)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HandoverState:
    """What the source knows at the handover of a prepared attempt (docs/model.md §8).

    Attributes (tokens unless noted): ``prefix_tokens`` L_hist (the prepared prefix, block
    aligned); ``prefilled_tokens`` L_done (of it, prefilled at the target so far);
    ``received_blocks`` n_recv (suffix blocks from L_hist on that the target holds);
    ``handover_tokens`` K_HO; ``block_size`` P; ``s_kv`` bytes/token; ``r_p`` the target's
    prefill rate, tokens/s; ``goodput`` B, bytes/s; ``c_sync`` s; ``hop_delay_s`` Detour's
    relay hop, s; ``warmup_left_s`` the time the target's prefix warm-up still needs (0 when it
    ended or never ran), s.
    """

    prefix_tokens: int
    prefilled_tokens: int
    received_blocks: int
    handover_tokens: int
    block_size: int
    s_kv: float
    r_p: float
    goodput: float
    c_sync: float = 0.0
    hop_delay_s: float = 0.0
    warmup_left_s: float = 0.0


@dataclass(frozen=True)
class CommitChoice:
    """Each way out's expected SIT, s (c_sync included), and the one to take.

    ``option``: "finish", "ctho" or "recompute" (Detour is reported, ``detour_s``, but is the
    xApp's to choose: it needs the relay). ``ctho_split``: the ctHO option's split p, tokens.
    ``wait_s``: the longest the commit may wait for the target's warm-up (finish only: never
    longer than the best alternative would have taken).
    """

    option: str
    finish_s: float
    ctho_s: float
    ctho_split: int
    recompute_s: float
    detour_s: float
    wait_s: float


def commit_choice(st: HandoverState) -> CommitChoice:
    """The commit-time choice of docs/model.md §8 for one prepared attempt.

    With L_d = L_done rounded down to a block (only whole blocks are cached), M = K_HO - L_hist
    - n_recv P (suffix tokens the target lacks, tail included):

        finish    = c + max((L_hist - L_d) / r_p, M s_kv / B)
        ctho      = c + min over block-aligned p in [L_d, L_hist] of
                        max((p - L_d) / r_p, (L_hist - p + M) s_kv / B)
        recompute = c + (K_HO - L_d) / r_p
        detour    = hop_delay_s

    A warm-up still running (``warmup_left_s`` = W > 0) is one engine step that cannot be cut
    short, and the target's engine serves requests in order: every option waits W, after which
    the whole prefix is cached (L_d = L_hist), so finish = c + max(W, M s_kv / B) and ctho and
    recompute add W to their cost from L_d = L_hist (finish wins: the choice only bounds the
    wait). Measured here: choosing "recompute" against a running warm-up saved nothing, the
    resumed request waited 0.3-0.8 s behind it.

    ctHO never redoes what the target holds (p >= L_d; blocks from L_hist on are never
    recomputed). The smallest of finish / ctho / recompute wins; ties go to finish (the
    prepared state), then ctho. Raises ValueError for a non-positive rate, size or block size
    or inconsistent token counts.
    """
    P, L, K = int(st.block_size), int(st.prefix_tokens), int(st.handover_tokens)
    if P <= 0 or st.r_p <= 0 or st.s_kv <= 0 or st.goodput <= 0:
        raise ValueError("commit_choice needs positive block_size, r_p, s_kv and goodput")
    if not 0 <= st.prefilled_tokens <= L or L > K or L % P:
        raise ValueError(f"need 0 <= L_done <= L_hist <= K_HO, L_hist block-aligned "
                         f"(L_done={st.prefilled_tokens}, L_hist={L}, K_HO={K}, P={P})")
    if st.warmup_left_s < 0:
        raise ValueError(f"warmup_left_s must be >= 0, got {st.warmup_left_s}")
    busy = float(st.warmup_left_s)
    l_d = L if busy > 0 else st.prefilled_tokens // P * P
    missing = max(0, K - L - int(st.received_blocks) * P)
    a = st.s_kv / st.goodput
    finish = st.c_sync + max(busy + (L - l_d) / st.r_p, missing * a)
    p = np.arange(l_d, L + 1, P, dtype=np.float64)
    cost = busy + np.maximum((p - l_d) / st.r_p, (L - p + missing) * a)
    best = int(np.argmin(cost))
    ctho = st.c_sync + float(cost[best])
    recompute = st.c_sync + busy + (K - l_d) / st.r_p
    option = min((finish, 0, "finish"), (ctho, 1, "ctho"), (recompute, 2, "recompute"))[2]
    wait = max(0.0, min(ctho, recompute) - st.c_sync) if option == "finish" else 0.0
    return CommitChoice(option=option, finish_s=finish, ctho_s=ctho, ctho_split=int(p[best]),
                        recompute_s=recompute, detour_s=float(st.hop_delay_s), wait_s=wait)
