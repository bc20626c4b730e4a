"""Vehicle drives over a square grid of cells, a CVH predictor, and the Scheduler Engine online.

This is the simulate mode's stand-in for the paper's nuScenes replay (section 6, "Network and
Mobility Settings"): the nuScenes trajectories are not available here, so drives are generated.

- **Grid**: ``grid`` x ``grid`` square cells of side ``cell_m`` (the paper's repeated-handover
  setting: 8 x 8 cells of 100 m). A UE is served by the cell its position lies in; a handover is
  the crossing of a cell boundary, its time linearly interpolated between the two samples that
  straddle it (as the paper does).
- **Drives**: vehicles at 6-14 m/s (urban driving), speed an Ornstein-Uhlenbeck process (sd
  1 m/s), heading a slow random drift (3 deg/s) plus left or right 90-degree turns (one every
  15 s on average, taken over 4 s, like street corners); the heading reflects at the grid's
  edge. Each drive starts at the centre of a random cell, sampled every ``step_s`` (0.1 s, the
  control period).
- **CVH predictor** (paper ref. 10): from the newest GPS fix (every 0.5 s, as nuScenes'
  keyframes, with 0.3 m position noise) it takes velocity and heading from the last two fixes,
  dead-reckons the position now and extrapolates a straight line; the first boundary of the
  serving cell it reaches within ``horizon_s`` names the target cell (the neighbour across it)
  and t_HO. No crossing within the horizon (or one that leaves the grid): no prediction.
- **T_avail** (docs/model.md §5): the time from which the predicted target stayed equal to the
  actual one until the handover.
- **Scheduler Engine online** (:func:`run_online`): every control period, for each session with a
  prediction, Eq. 9 on the current estimates (through ``pallas_common.timing.decide``), the
  trigger rule, cancellation when the predicted target changes after the trigger (the prepared
  time is discarded, Eq. 10's T_discard), and at the actual handover either a commit (the
  prepared target is the actual one: Eq. 6 and 7 at the window actually used, with the actual
  rates) or the fallback, ctHO at the actual target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pallas_common import timing
from pallas_eval.simulate import Rates

GPS_PERIOD_S = 0.5
GPS_NOISE_M = 0.3
HORIZON_S = 10.0


@dataclass
class Drives:
    """Drives of ``n`` sessions, padded to a common length; arrays (n, steps) unless noted.

    ``x``, ``y`` metres; ``cell`` serving cell index (ix * grid + iy); ``alive`` whether the
    session is still running at that step; ``ho_time`` (n, max_ho) actual handover times (s,
    NaN padding) with ``ho_from``, ``ho_to`` the cells; ``end_s`` (n,) each session's end.
    """

    step_s: float
    grid: int
    cell_m: float
    x: np.ndarray
    y: np.ndarray
    cell: np.ndarray
    alive: np.ndarray
    ho_time: np.ndarray
    ho_from: np.ndarray
    ho_to: np.ndarray
    end_s: np.ndarray

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def n_handovers(self) -> np.ndarray:
        return np.sum(np.isfinite(self.ho_time), axis=1)


def _cell_of(x: np.ndarray, y: np.ndarray, grid: int, cell_m: float) -> np.ndarray:
    ix = np.clip(np.floor(x / cell_m), 0, grid - 1).astype(np.int64)
    iy = np.clip(np.floor(y / cell_m), 0, grid - 1).astype(np.int64)
    return ix * grid + iy


def generate_drives(rng: np.random.Generator, n_handovers: np.ndarray, *, grid: int = 8, cell_m: float = 100.0,
                    step_s: float = 0.1, tail_s: float = 3.0, max_s: float = 600.0) -> Drives:
    """One drive per entry of ``n_handovers`` (ints >= 1), each ending ``tail_s`` after its
    ``n``-th handover (module docstring for the motion model). Raises ValueError for a count < 1
    or a drive that does not reach its count within ``max_s``."""
    want = np.asarray(n_handovers, dtype=np.int64)
    if want.ndim != 1 or np.any(want < 1):
        raise ValueError("n_handovers must be a 1-D array of counts >= 1")
    n = want.size
    side = grid * cell_m
    cx, cy = rng.integers(0, grid, n), rng.integers(0, grid, n)
    x, y = (cx + 0.5) * cell_m, (cy + 0.5) * cell_m
    heading = rng.choice([0.0, 90.0, 180.0, 270.0], n) + rng.normal(0, 10, n)
    v0 = rng.uniform(6.0, 14.0, n)
    v = v0.copy()
    turn_left = np.zeros(n)                        # degrees of an ongoing corner turn still to go
    xs, ys, cells = [x.copy()], [y.copy()], [_cell_of(x, y, grid, cell_m)]
    count = np.zeros(n, dtype=np.int64)
    end = np.full(n, np.inf)
    ho_t = [[] for _ in range(n)]
    ho_a = [[] for _ in range(n)]
    ho_b = [[] for _ in range(n)]
    steps = int(max_s / step_s)
    dt = step_s
    for k in range(1, steps + 1):
        t = k * dt
        v += 0.2 * (v0 - v) * dt + rng.normal(0, 1.0 * math.sqrt(0.4 * dt), n)
        v = np.maximum(v, 2.0)
        start_turn = (turn_left == 0) & (rng.random(n) < dt / 15.0)
        turn_left = np.where(start_turn, rng.choice([-90.0, 90.0], n), turn_left)
        rate = np.clip(turn_left, -22.5 * dt, 22.5 * dt)
        turn_left = turn_left - rate
        turn_left[np.abs(turn_left) < 1e-9] = 0.0
        heading = heading + rate + rng.normal(0, 3.0 * math.sqrt(dt), n)
        hr = np.radians(heading)
        nx, ny = x + v * dt * np.sin(hr), y + v * dt * np.cos(hr)
        # reflect at the grid's edge (1 m inside)
        bx = (nx < 1.0) | (nx > side - 1.0)
        by = (ny < 1.0) | (ny > side - 1.0)
        heading = np.where(bx, -heading, heading)
        heading = np.where(by, 180.0 - heading, heading)
        turn_left[bx | by] = 0.0
        nx, ny = np.where(bx, x, nx), np.where(by, y, ny)
        c_old, c_new = cells[-1], _cell_of(nx, ny, grid, cell_m)
        crossed = (c_new != c_old) & (t - dt < end)
        for i in np.nonzero(crossed)[0]:
            # linear interpolation to the boundary crossed first
            fr = []
            for a0, a1 in ((x[i], nx[i]), (y[i], ny[i])):
                b0, b1 = math.floor(a0 / cell_m), math.floor(a1 / cell_m)
                if b0 != b1:
                    edge = max(b0, b1) * cell_m
                    fr.append((edge - a0) / (a1 - a0))
            f = min(fr) if fr else 1.0
            if count[i] < want[i]:
                ho_t[i].append(t - dt + f * dt)
                ho_a[i].append(int(c_old[i]))
                ho_b[i].append(int(c_new[i]))
                count[i] += 1
                if count[i] == want[i]:
                    end[i] = t - dt + f * dt + tail_s
        x, y = nx, ny
        xs.append(x.copy())
        ys.append(y.copy())
        cells.append(c_new)
        if np.all(t >= end):
            break
    if np.any(~np.isfinite(end)):
        raise ValueError(f"{int(np.sum(~np.isfinite(end)))} drive(s) did not reach their handover count in {max_s} s")
    X, Y, C = np.stack(xs, 1), np.stack(ys, 1), np.stack(cells, 1)
    T = np.arange(X.shape[1]) * dt
    alive = T[None, :] <= end[:, None] + 1e-9
    m = int(want.max())
    pad = lambda rows, fill, dtype: np.array([r + [fill] * (m - len(r)) for r in rows], dtype=dtype)  # noqa: E731
    return Drives(dt, grid, cell_m, X, Y, C, alive, pad(ho_t, np.nan, np.float64), pad(ho_a, -1, np.int64),
                  pad(ho_b, -1, np.int64), end)


@dataclass
class Predictions:
    """CVH output per (session, step): ``target`` cell (-1: none) and ``t_ho`` (s, NaN: none)."""

    target: np.ndarray
    t_ho: np.ndarray


def cvh_predict(d: Drives, rng: np.random.Generator, *, gps_period_s: float = GPS_PERIOD_S,
                gps_noise_m: float = GPS_NOISE_M, horizon_s: float = HORIZON_S) -> Predictions:
    """The CVH predictor at every control step (module docstring). Shapes (n, steps)."""
    n, steps = d.x.shape
    T = np.arange(steps) * d.step_s
    every = max(1, int(round(gps_period_s / d.step_s)))
    fix_idx = (np.arange(steps) // every) * every                   # newest fix at or before each step
    prev_idx = np.maximum(fix_idx - every, 0)
    gx = d.x + rng.normal(0, gps_noise_m, d.x.shape)
    gy = d.y + rng.normal(0, gps_noise_m, d.y.shape)
    fx, fy = gx[:, fix_idx], gy[:, fix_idx]
    span = np.maximum((fix_idx - prev_idx) * d.step_s, d.step_s)
    vx, vy = (fx - gx[:, prev_idx]) / span, (fy - gy[:, prev_idx]) / span
    age = T - fix_idx * d.step_s
    px, py = fx + vx * age, fy + vy * age                            # dead-reckoned position now
    g, L = d.grid, d.cell_m
    ix, iy = d.cell // g, d.cell % g
    with np.errstate(divide="ignore", invalid="ignore"):
        tx = np.where(vx > 0, ((ix + 1) * L - px) / vx, np.where(vx < 0, (ix * L - px) / vx, np.inf))
        ty = np.where(vy > 0, ((iy + 1) * L - py) / vy, np.where(vy < 0, (iy * L - py) / vy, np.inf))
    tx, ty = np.maximum(tx, 0.0), np.maximum(ty, 0.0)
    via_x = tx <= ty
    tau = np.where(via_x, tx, ty)
    nix = np.where(via_x, ix + np.sign(vx).astype(np.int64), ix)
    niy = np.where(via_x, iy, iy + np.sign(vy).astype(np.int64))
    ok = np.isfinite(tau) & (tau <= horizon_s) & (nix >= 0) & (nix < g) & (niy >= 0) & (niy < g) & d.alive
    target = np.where(ok, nix * g + niy, -1)
    t_ho = np.where(ok, T + tau, np.nan)
    return Predictions(target, t_ho)


def t_avail(d: Drives, p: Predictions) -> np.ndarray:
    """T_avail per handover (docs/model.md §5), shape (n, max_ho), s; NaN padding.

    The control steps between the previous handover (or the start) and this one are scanned
    backwards from the last step strictly before the handover (at the handover's own step the
    UE is already in the target cell); T_avail is the handover time minus the
    first step of the trailing run of correct target predictions (0 if the last one was wrong).
    """
    out = np.full(d.ho_time.shape, np.nan)
    for i in range(d.n):
        prev = 0.0
        for j in range(d.ho_time.shape[1]):
            t = d.ho_time[i, j]
            if not np.isfinite(t):
                break
            k_end = int(math.ceil(t / d.step_s - 1e-9)) - 1      # the last step before the HO
            k0 = int(math.ceil(prev / d.step_s - 1e-9))
            ok = p.target[i, k0:k_end + 1] == d.ho_to[i, j]
            if ok.size == 0 or not ok[-1]:
                out[i, j] = 0.0
            else:
                bad = np.nonzero(~ok)[0]
                first = k0 + (int(bad[-1]) + 1 if bad.size else 0)
                out[i, j] = t - first * d.step_s
            prev = t
    return out


def truncated_normal(rng: np.random.Generator, size, mean: float = 300.0, sd: float = 50.0,
                     floor: float = 150.0) -> np.ndarray:
    """Draws from N(mean, sd) truncated below at ``floor`` (rejection sampling), e.g. the paper's
    per-handover goodput in Mbit/s (section 6.2: mean 300, sd 50, floor 150)."""
    out = rng.normal(mean, sd, size)
    bad = out < floor
    while np.any(bad):
        out[bad] = rng.normal(mean, sd, int(bad.sum()))
        bad = out < floor
    return out


@dataclass
class OnlineResult:
    """What :func:`run_online` saw at every handover (arrays of shape (n, max_ho), NaN padding).

    ``k_ho`` tokens at the HO under Pallas; ``committed`` whether the prepared target was the
    actual one; ``window`` the window used (trigger to HO, s); ``k_trig`` tokens at the trigger;
    ``sit`` Pallas's SIT (s, the fallback's where not committed); ``t_early`` (s, NaN on
    fallback); ``t_avail`` (s); ``discarded`` preparation time thrown away since the previous
    HO (s); ``bandwidth`` the HO's goodput (bytes/s); ``triggers`` trigger count per HO.
    """

    k_ho: np.ndarray
    committed: np.ndarray
    window: np.ndarray
    k_trig: np.ndarray
    sit: np.ndarray
    t_early: np.ndarray
    t_avail: np.ndarray
    discarded: np.ndarray
    bandwidth: np.ndarray
    triggers: np.ndarray
    extra: dict = field(default_factory=dict)


def run_online(d: Drives, p: Predictions, rates: Rates, k0: np.ndarray, bandwidth: np.ndarray, *,
               r_p=None, delay_correct_s: np.ndarray | None = None, ewma: float = 0.3,
               alpha: float = 0.8, dt: float = 0.1, t_max: float = 5.0, lookahead: float = 0.1,
               t_avail_s: np.ndarray | None = None) -> OnlineResult:
    """The Scheduler Engine over the drives (module docstring), one control cycle per step.

    ``k0`` (n,) tokens in each session at time 0 (the prompt prefilled); tokens then grow at r_d,
    stalled by each SIT. ``bandwidth`` (n, max_ho) the goodput each handover's migration gets
    (bytes/s); the engine's estimate is an EWMA (weight ``ewma``) of the earlier handovers'
    goodput in the session, starting at ``rates.bandwidth``. ``r_p`` the target's prefill rate
    (scalar or (n,); default ``rates.r_p``). ``delay_correct_s`` (n, max_ho): the prediction
    stress of section 6.3: a prediction naming the right target is withheld (no prediction)
    until this long before each HO (wrong ones are kept), so T_avail is at most that. The trigger fires once T_remain_hat <= T_w* +
    ``lookahead`` (the control period, as the xApp does).
    """
    n, steps = d.x.shape
    m = d.ho_time.shape[1]
    P, r_d = rates.block_size, rates.r_d
    rp = np.broadcast_to(np.asarray(rates.r_p if r_p is None else r_p, dtype=np.float64), (n,)).copy()
    params = timing.DecisionParams(alpha=alpha, dt=dt, t_max=t_max, trigger_lookahead=lookahead)
    nanm = lambda: np.full((n, m), np.nan)  # noqa: E731
    res = OnlineResult(nanm(), np.zeros((n, m), bool), nanm(), nanm(), nanm(), nanm(),
                       t_avail(d, p) if t_avail_s is None else t_avail_s, np.zeros((n, m)),
                       np.asarray(bandwidth, dtype=np.float64), np.zeros((n, m), np.int64))
    target = p.target.copy()
    if delay_correct_s is not None:
        # withhold predictions until delay before the HO (per handover interval)
        T = np.arange(steps) * d.step_s
        prev = np.zeros(n)
        for j in range(m):
            t = d.ho_time[:, j]
            has = np.isfinite(t)
            lo = np.where(has, prev, np.inf)[:, None]
            hi = np.where(has, t - delay_correct_s[:, j], -np.inf)[:, None]
            hide = (T[None, :] >= lo) & (T[None, :] < hi) & (target == d.ho_to[:, j][:, None])
            target[hide] = -1                      # the correct target is withheld; wrong ones stay
            prev = np.where(has, t, prev)
        res.t_avail = np.minimum(res.t_avail, delay_correct_s) if t_avail_s is None else res.t_avail
    stall = np.zeros(n)                 # seconds of SIT so far (no tokens generated)
    b_est = np.full(n, rates.bandwidth)
    trig = np.zeros(n, bool)
    t_trig = np.zeros(n)
    k_trig = np.zeros(n)
    prep = np.full(n, -1)
    ho_j = np.zeros(n, np.int64)        # index of the next handover
    disc = np.zeros(n)

    def tokens(t, idx):
        return k0[idx] + r_d * np.maximum(0.0, t - stall[idx])

    for k in range(steps):
        t = k * d.step_s
        # handovers that happened since the previous step
        nxt = np.where(ho_j < m, d.ho_time[np.arange(n), np.minimum(ho_j, m - 1)], np.inf)
        hit = np.nonzero(np.isfinite(nxt) & (nxt <= t))[0]
        if hit.size:
            j = ho_j[hit]
            tho = nxt[hit]
            b = res.bandwidth[hit, j]
            kho = tokens(tho, hit)
            ok = trig[hit] & (prep[hit] == d.ho_to[hit, j])
            split, cs = timing.ctho_split(kho, P, rp[hit], rates.s_kv, b)
            sit = rates.c_sync + cs + 1.0 / r_d
            te = np.full(hit.size, np.nan)
            w = np.where(ok, tho - t_trig[hit], np.nan)
            if np.any(ok):
                s = hit[ok]
                x = timing.WindowInputs(k_curr=k_trig[s], t_remain=w[ok], block_size=P, r_p=rp[s], r_d=r_d,
                                        bandwidth=b[ok], s_kv=rates.s_kv, c_sync=rates.c_sync)
                c = timing.evaluate_windows(x, w[ok][:, None], alpha)
                sit[ok], te[ok] = c.t_sit[:, 0], c.t_early[:, 0]
            res.k_ho[hit, j], res.committed[hit, j], res.window[hit, j] = kho, ok, w
            res.k_trig[hit, j] = np.where(ok, k_trig[hit], np.nan)
            res.sit[hit, j], res.t_early[hit, j] = sit, te
            res.discarded[hit, j] = disc[hit]
            stall[hit] += sit
            b_est[hit] = (1 - ewma) * b_est[hit] + ewma * b
            trig[hit], prep[hit], disc[hit] = False, -1, 0.0
            ho_j[hit] += 1
        alive = d.alive[:, k] & (ho_j < m) & np.isfinite(d.ho_time[np.arange(n), np.minimum(ho_j, m - 1)])
        tg = target[:, k]
        # a new target after the trigger: cancel (epoch + 1), the prepared time is discarded
        cancel = alive & trig & (tg >= 0) & (tg != prep)
        if np.any(cancel):
            disc[cancel] += t - t_trig[cancel]
            trig[cancel], prep[cancel] = False, -1
        t_rem = p.t_ho[:, k] - t
        cand = np.nonzero(alive & ~trig & (tg >= 0) & (t_rem <= t_max + lookahead + dt))[0]
        if cand.size:
            kc = tokens(t, cand)
            x = timing.WindowInputs(k_curr=kc, t_remain=t_rem[cand], block_size=P, r_p=rp[cand], r_d=r_d,
                                    bandwidth=b_est[cand], s_kv=rates.s_kv, c_sync=rates.c_sync)
            dec = timing.decide(x, params)
            fire = cand[dec.trigger]
            trig[fire], t_trig[fire], k_trig[fire], prep[fire] = True, t, kc[dec.trigger], tg[fire]
            res.triggers[fire, np.minimum(ho_j[fire], m - 1)] += 1
    return res
