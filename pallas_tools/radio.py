"""A synthetic drive generator: gNB sites, 3GPP path loss with correlated shadowing, A3 handovers.

What it models, and where each piece comes from:

- **Layout**: a hexagonal grid of gNB sites (inter-site distance ``isd_m``, 500 m by default, the
  TR 38.901 Table 7.8-1 UMa value), three sectors per site at azimuths 30/150/270 degrees. Each
  sector is one NR cell: NR cell identity NCI = gNB id << 14 | cell local id (36-bit NCI with a
  22-bit gNB id, TS 38.413 §9.3.1.7), PCI 3*site + sector (PCI mod 3 follows the sector, the usual
  planning rule), E2 node id ``gnb-<gNB id>`` (one E2 node per site).
- **Path loss**: TR 38.901 §7.4.1 Table 7.4.1-1 UMa (LOS, and NLOS = max(LOS, NLOS')), carrier
  ``fc_ghz`` 3.5 GHz, h_BS 25 m, h_UT 1.5 m; breakpoint distance d'_BP = 4 h'_BS h'_UT fc / c with
  h_E = 1 m. Antenna: TR 38.901 Table 7.3-1 element pattern (65 degree beamwidths, 30 dB limits,
  8 dBi) with an electrical downtilt. RSRP = per-RE transmit power + gain - path loss - shadowing.
- **Shadowing**: log-normal, sigma 6 dB (NLOS) / 4 dB (LOS) and exponential spatial correlation
  with decorrelation distance 50 m / 37 m (TR 38.901 Table 7.5-6, UMa; the exponential model of
  §7.5 step 1 / Gudmundson 1991). It is a 2-D field per site (sectors of one site share it, as
  38.901 large-scale parameters are per site-UE link), so every drive over the same street sees
  the same shadowing: maps learned from earlier drives are meaningful.
- **UE measurements**: an L1 sample every ``step_s`` with Gaussian error ``meas_noise_db``, L3
  filtered per TS 38.331 §5.5.3.2 (F_n = (1-a) F_{n-1} + a M_n, a = 1/2^(k/4), k = 4, with a
  rescaled so that the time constant matches the 200 ms sample rate the coefficient assumes).
- **Handover**: the serving cell changes by the A3 event (TS 38.331 §5.5.4.4): entering when
  Mn + Ofn + Ocn - Hys > Mp + Ofp + Ocp + Off on the L3-filtered RSRP (checked at every L1
  sample), held for time-to-trigger (a timer from the entry sample); the HO completes
  ``ho_delay_s`` after the report (HO command, RACH). Ofn/Ocn are 0.
- **What E2 delivers**: a MeasurementReport every ``report_period_s`` (200 ms) with the serving
  cell's and every neighbour's L3 RSRP above ``report_floor_dbm`` (strongest ``max_neighbours``,
  each with its PCI; ``cell_id`` only if ``resolve_neighbour_ids``), and position, speed and
  heading once per ``gps_period_s`` (1 s, Gaussian position error ``gps_noise_m``), NaN between.

Everything is deterministic given the seed. Positions are metres east/north of the network
origin; reports carry WGS 84 lat/lon around ``origin_lat``/``origin_lon`` (equirectangular, the
inverse of ``xapp.drivetest.local_xy_m``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from xapp.drivetest import EARTH_RADIUS_M, Drive, Handover
from xapp.tracks import MeasurementReport, NeighbourMeas

NAN = float("nan")
C_LIGHT = 299_792_458.0


@dataclass(frozen=True, slots=True)
class Cell:
    """One NR cell (a sector of a gNB site). Position in metres, azimuth in degrees from north."""

    index: int
    cell_id: int        # NR cell identity (36 bits)
    pci: int            # 0..1007
    site: int
    gnb_id: int
    e2_node: str
    x_m: float
    y_m: float
    azimuth_deg: float


@dataclass(frozen=True)
class RadioConfig:
    """Radio, measurement and A3 parameters. Units in the names; defaults as the module doc cites."""

    fc_ghz: float = 3.5
    h_bs_m: float = 25.0
    h_ut_m: float = 1.5
    tx_power_dbm: float = 46.0      # total; per RE = tx - 10 log10(12 * n_prb)
    n_prb: int = 273                # 100 MHz at 30 kHz SCS
    max_gain_dbi: float = 8.0
    downtilt_deg: float = 6.0
    los: bool = False               # UMa LOS everywhere, else NLOS everywhere
    shadow_sigma_db: float | None = None   # None: 4 (LOS) / 6 (NLOS)
    shadow_corr_m: float | None = None     # None: 37 (LOS) / 50 (NLOS)
    meas_noise_db: float = 1.0
    l3_k: int = 4
    step_s: float = 0.1
    a3_offset_db: float = 3.0
    a3_hysteresis_db: float = 1.0
    a3_ttt_s: float = 0.32
    ho_delay_s: float = 0.05
    report_period_s: float = 0.2
    report_floor_dbm: float = -130.0
    max_neighbours: int = 8
    resolve_neighbour_ids: bool = False
    gps_period_s: float = 1.0
    gps_noise_m: float = 2.0
    origin_lat: float = 51.8985     # Cork
    origin_lon: float = -8.4756


@dataclass
class Network:
    """Cells plus the per-site shadowing fields. Build with ``hex_network`` or ``line_network``."""

    cells: list[Cell]
    cfg: RadioConfig
    seed: int = 0
    omni: bool = False          # isotropic antennas (max gain in every direction)
    # shadowing: one (ny, nx) field per site on a grid of ``grid_m`` spacing starting at (x0, y0)
    _shadow: np.ndarray | None = None
    _grid: tuple[float, float, float] = (0.0, 0.0, 10.0)
    _xy: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self._xy = np.array([[c.x_m, c.y_m] for c in self.cells], dtype=np.float64).reshape(-1, 2)
        self._az = np.array([c.azimuth_deg for c in self.cells])
        self._site = np.array([c.site for c in self.cells])
        self.by_id = {c.cell_id: c for c in self.cells}

    @property
    def n_sites(self) -> int:
        return int(self._site.max()) + 1 if self.cells else 0

    def neighbour_relations(self) -> dict[tuple[int, int], int]:
        """The full neighbour relation table: (serving cell id, neighbour PCI) -> neighbour cell id.

        What an E2 node's configuration (or O&M) gives; with unique PCIs it is just PCI -> cell.
        """
        return {(a.cell_id, b.pci): b.cell_id for a in self.cells for b in self.cells if a is not b}

    def bounds(self, margin_m: float = 0.0) -> tuple[float, float, float, float]:
        """(xmin, xmax, ymin, ymax) of the sites, widened by ``margin_m``."""
        x, y = self._xy[:, 0], self._xy[:, 1]
        return (x.min() - margin_m, x.max() + margin_m, y.min() - margin_m, y.max() + margin_m)

    def build_shadowing(self, margin_m: float = 600.0, grid_m: float = 10.0) -> None:
        """Draw one exponentially correlated Gaussian field per site (FFT filtering of white noise)."""
        cfg = self.cfg
        sigma = cfg.shadow_sigma_db if cfg.shadow_sigma_db is not None else (4.0 if cfg.los else 6.0)
        dcor = cfg.shadow_corr_m if cfg.shadow_corr_m is not None else (37.0 if cfg.los else 50.0)
        xmin, xmax, ymin, ymax = self.bounds(margin_m)
        nx = int(2 ** math.ceil(math.log2((xmax - xmin) / grid_m + 1)))
        ny = int(2 ** math.ceil(math.log2((ymax - ymin) / grid_m + 1)))
        self._grid = (xmin, ymin, grid_m)
        if sigma <= 0 or not self.cells:
            self._shadow = np.zeros((max(self.n_sites, 1), ny, nx), dtype=np.float32)
            return
        # periodic field; the wrap-around only correlates the two margins (>> d_cor), not the sites' area
        NX, NY = nx, ny
        kx = np.minimum(np.arange(NX), NX - np.arange(NX)) * grid_m
        ky = np.minimum(np.arange(NY), NY - np.arange(NY)) * grid_m
        r = np.hypot(ky[:, None], kx[None, :])
        psd = np.fft.rfft2(np.exp(-r / dcor)).real
        amp = np.sqrt(np.maximum(psd, 0.0))
        rng = np.random.default_rng([self.seed, 0x5AD0])
        fields = np.empty((self.n_sites, ny, nx), dtype=np.float32)
        for s in range(self.n_sites):
            w = rng.standard_normal((NY, NX))
            f = np.fft.irfft2(np.fft.rfft2(w) * amp, s=(NY, NX))[:ny, :nx]
            fields[s] = (f / f.std() * sigma).astype(np.float32)
        self._shadow = fields

    def shadowing_db(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Shadowing per site at points, bilinear on the field. Shapes (n,), (n,) -> (n, n_sites)."""
        if self._shadow is None:
            self.build_shadowing()
        assert self._shadow is not None
        x0, y0, g = self._grid
        _, ny, nx = self._shadow.shape
        fx = np.clip((np.asarray(x) - x0) / g, 0, nx - 1.001)
        fy = np.clip((np.asarray(y) - y0) / g, 0, ny - 1.001)
        ix, iy = fx.astype(int), fy.astype(int)
        ax, ay = fx - ix, fy - iy
        S = self._shadow
        v = (S[:, iy, ix] * (1 - ax) * (1 - ay) + S[:, iy, ix + 1] * ax * (1 - ay)
             + S[:, iy + 1, ix] * (1 - ax) * ay + S[:, iy + 1, ix + 1] * ax * ay)
        return v.T

    def rsrp_dbm(self, x: np.ndarray, y: np.ndarray, shadowing: bool = True) -> np.ndarray:
        """Mean RSRP of every cell at points (no measurement error). (n,), (n,) -> (n, n_cells) dBm."""
        cfg = self.cfg
        x = np.atleast_1d(np.asarray(x, dtype=np.float64))
        y = np.atleast_1d(np.asarray(y, dtype=np.float64))
        dx = x[:, None] - self._xy[None, :, 0]
        dy = y[:, None] - self._xy[None, :, 1]
        d2 = np.maximum(np.hypot(dx, dy), 10.0)
        pl = uma_path_loss_db(d2, cfg.fc_ghz, cfg.h_bs_m, cfg.h_ut_m, cfg.los)
        bearing = np.degrees(np.arctan2(dx, dy))          # from site to UE, clockwise from north
        phi = (bearing - self._az[None, :] + 180.0) % 360.0 - 180.0
        theta = 90.0 + np.degrees(np.arctan2(cfg.h_bs_m - cfg.h_ut_m, d2))
        gain = cfg.max_gain_dbi if self.omni else antenna_gain_db(phi, theta, cfg.downtilt_deg, cfg.max_gain_dbi)
        p_re = cfg.tx_power_dbm - 10.0 * math.log10(12 * cfg.n_prb)
        out = p_re + gain - pl
        if shadowing:
            out = out - self.shadowing_db(x, y)[:, self._site]
        return out


def uma_path_loss_db(d2d_m: np.ndarray, fc_ghz: float, h_bs: float, h_ut: float, los: bool) -> np.ndarray:
    """TR 38.901 Table 7.4.1-1 UMa path loss (dB) at 2-D distances (m); any shape.

    LOS: PL1 = 28 + 22 log10(d3D) + 20 log10(fc) below d'_BP, PL2 = 28 + 40 log10(d3D) +
    20 log10(fc) - 9 log10(d'_BP^2 + (hBS-hUT)^2) above. NLOS: max(PL_LOS, 13.54 +
    39.08 log10(d3D) + 20 log10(fc) - 0.6 (hUT - 1.5)).
    """
    d2d = np.asarray(d2d_m, dtype=np.float64)
    d3d = np.hypot(d2d, h_bs - h_ut)
    dbp = 4.0 * (h_bs - 1.0) * (h_ut - 1.0) * fc_ghz * 1e9 / C_LIGHT
    lf = 20.0 * math.log10(fc_ghz)
    pl1 = 28.0 + 22.0 * np.log10(d3d) + lf
    pl2 = 28.0 + 40.0 * np.log10(d3d) + lf - 9.0 * math.log10(dbp ** 2 + (h_bs - h_ut) ** 2)
    pl_los = np.where(d2d <= dbp, pl1, pl2)
    if los:
        return pl_los
    pl_nlos = 13.54 + 39.08 * np.log10(d3d) + lf - 0.6 * (h_ut - 1.5)
    return np.maximum(pl_los, pl_nlos)


def antenna_gain_db(phi_deg: np.ndarray, theta_deg: np.ndarray, tilt_deg: float, g_max: float) -> np.ndarray:
    """TR 38.901 Table 7.3-1 element gain (dBi): phi off boresight, theta zenith angle (90 = horizon)."""
    a_h = -np.minimum(12.0 * (phi_deg / 65.0) ** 2, 30.0)
    a_v = -np.minimum(12.0 * ((theta_deg - 90.0 - tilt_deg) / 65.0) ** 2, 30.0)
    return g_max - np.minimum(-(a_h + a_v), 30.0)


def _make_cells(sites_xy: list[tuple[float, float]], azimuths: tuple[float, ...], gnb_base: int) -> list[Cell]:
    cells = []
    for s, (x, y) in enumerate(sites_xy):
        gnb = gnb_base + s
        for k, az in enumerate(azimuths):
            cells.append(Cell(index=len(cells), cell_id=(gnb << 14) | (k + 1), pci=(3 * s + k) % 1008,
                              site=s, gnb_id=gnb, e2_node=f"gnb-{gnb}", x_m=x, y_m=y, azimuth_deg=az))
    return cells


def hex_network(rows: int = 4, cols: int = 4, isd_m: float = 500.0, cfg: RadioConfig | None = None,
                seed: int = 0, gnb_base: int = 0x1000) -> Network:
    """A hexagonal grid of ``rows x cols`` three-sector sites, ``isd_m`` apart. Site 0 at (0, 0)."""
    sites = [(c * isd_m + (r % 2) * isd_m / 2.0, r * isd_m * math.sqrt(3) / 2.0)
             for r in range(rows) for c in range(cols)]
    net = Network(_make_cells(sites, (30.0, 150.0, 270.0), gnb_base), cfg or RadioConfig(), seed)
    net.build_shadowing()
    return net


def line_network(n_sites: int = 2, isd_m: float = 500.0, cfg: RadioConfig | None = None, seed: int = 0,
                 gnb_base: int = 0x1000) -> Network:
    """Omnidirectional sites on a line 50 m south of the x axis (one cell each), for border tests."""
    sites = [(i * isd_m, -50.0) for i in range(n_sites)]
    net = Network(_make_cells(sites, (0.0,), gnb_base), cfg or RadioConfig(), seed, omni=True)
    net.build_shadowing()
    return net


@dataclass(frozen=True)
class Route:
    """A polyline (metres) driven at constant ``speed_mps`` from its first point."""

    points: np.ndarray   # (k, 2)
    speed_mps: float

    @property
    def length_m(self) -> float:
        return float(np.sum(np.hypot(*np.diff(self.points, axis=0).T)))

    def at(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Position x, y (m) and heading (degrees from north) at times t (s from the start)."""
        seg = np.diff(self.points, axis=0)
        seg_len = np.hypot(seg[:, 0], seg[:, 1])
        cum = np.r_[0.0, np.cumsum(seg_len)]
        s = np.clip(np.asarray(t, dtype=np.float64) * self.speed_mps, 0.0, cum[-1])
        i = np.clip(np.searchsorted(cum, s, side="right") - 1, 0, len(seg) - 1)
        f = (s - cum[i]) / np.maximum(seg_len[i], 1e-9)
        x = self.points[i, 0] + f * seg[i, 0]
        y = self.points[i, 1] + f * seg[i, 1]
        hd = np.degrees(np.arctan2(seg[i, 0], seg[i, 1])) % 360.0
        return x, y, hd


def straight_route(start: tuple[float, float], heading_deg: float, length_m: float, speed_mps: float) -> Route:
    """A straight drive of ``length_m`` from ``start`` towards ``heading_deg`` (from north)."""
    h = math.radians(heading_deg)
    end = (start[0] + length_m * math.sin(h), start[1] + length_m * math.cos(h))
    return Route(np.array([start, end], dtype=np.float64), speed_mps)


def manhattan_route(net: Network, length_m: float, speed_mps: float, seed: int, block_m: float = 150.0,
                    p_turn: float = 0.35) -> Route:
    """A drive on a square street grid (``block_m`` blocks) over the network area.

    Starts at a random intersection, goes straight at each intersection or turns with total
    probability ``p_turn``, and turns back inwards at the edge. Drives with different seeds
    share streets, so they pass the same shadowing.
    """
    rng = np.random.default_rng([seed, 0xD21E])
    xmin, xmax, ymin, ymax = net.bounds(margin_m=100.0)
    gx = np.arange(math.ceil(xmin / block_m), math.floor(xmax / block_m) + 1) * block_m
    gy = np.arange(math.ceil(ymin / block_m), math.floor(ymax / block_m) + 1) * block_m
    p = np.array([rng.choice(gx), rng.choice(gy)], dtype=np.float64)
    dirs = [np.array(d, dtype=np.float64) for d in ((1, 0), (0, 1), (-1, 0), (0, -1))]
    d = dirs[int(rng.integers(4))]
    pts = [p.copy()]
    done = 0.0
    while done < length_m:
        if rng.random() < p_turn:
            d = np.array([-d[1], d[0]]) if rng.random() < 0.5 else np.array([d[1], -d[0]])
        nxt = p + d * block_m
        tries = 0
        while not (gx[0] <= nxt[0] <= gx[-1] and gy[0] <= nxt[1] <= gy[-1]) and tries < 8:
            d = dirs[int(rng.integers(4))]
            nxt = p + d * block_m
            tries += 1
        p = nxt
        pts.append(p.copy())
        done += block_m
    return Route(np.array(pts), speed_mps)


@dataclass
class SimResult:
    """A generated drive: reports (what E2 delivers), the true handovers, and the truth trace."""

    ue_id: str
    reports: list[MeasurementReport]
    handovers: list[Handover]
    t: np.ndarray          # (T,) simulation times (s)
    x_m: np.ndarray        # (T,) true position
    y_m: np.ndarray
    serving: np.ndarray    # (T,) true serving cell index per step
    l3_rsrp: np.ndarray    # (T, n_cells) L3-filtered RSRP the UE measured

    @property
    def drive(self) -> Drive:
        """As a drivetest.Drive (for the evaluation, which scores Drive objects)."""
        return Drive(ue_id=self.ue_id, path=None, reports=self.reports, handovers=self.handovers)


def _to_latlon(cfg: RadioConfig, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k = math.pi / 180.0 * EARTH_RADIUS_M
    lat = cfg.origin_lat + np.asarray(y) / k
    lon = cfg.origin_lon + np.asarray(x) / (k * math.cos(math.radians(cfg.origin_lat)))
    return lat, lon


def generate_drive(net: Network, route: Route, duration_s: float | None = None, seed: int = 0,
                   ue_id: str = "ue-0", t0: float = 0.0) -> SimResult:
    """Drive ``route`` through ``net``; return the reports E2 would deliver and the true handovers.

    ``duration_s`` defaults to the route's length over its speed. The UE starts on the strongest
    cell. ``t0`` offsets all times. Deterministic given (net.seed, seed).
    """
    cfg = net.cfg
    rng = np.random.default_rng([net.seed, seed, 0xA3])
    dur = duration_s if duration_s is not None else route.length_m / route.speed_mps
    n = int(round(dur / cfg.step_s)) + 1
    t = np.arange(n) * cfg.step_s
    x, y, hd = route.at(t)
    mean = net.rsrp_dbm(x, y).astype(np.float64)
    meas = mean + rng.normal(0.0, cfg.meas_noise_db, size=mean.shape)
    a = 1.0 / 2.0 ** (cfg.l3_k / 4.0)
    a = 1.0 - (1.0 - a) ** (cfg.step_s / 0.2)
    l3 = np.empty_like(meas)
    l3[0] = meas[0]
    for i in range(1, n):
        l3[i] = (1.0 - a) * l3[i - 1] + a * meas[i]
    serving = np.empty(n, dtype=np.int64)
    events: list[tuple[float, int, int]] = []   # (exact HO time, source index, target index)
    s = int(np.argmax(l3[0]))
    enter_since = np.full(l3.shape[1], np.nan)
    pending: tuple[float, int] | None = None
    thr = cfg.a3_offset_db + cfg.a3_hysteresis_db
    for i in range(n):
        if pending is not None and t[i] >= pending[0] - 1e-9:
            s = pending[1]
            pending = None
            enter_since[:] = np.nan
        serving[i] = s
        if pending is not None:
            continue
        cond = l3[i] - thr > l3[i, s]
        cond[s] = False
        enter_since[~cond] = np.nan
        newly = cond & np.isnan(enter_since)
        enter_since[newly] = t[i]
        # the TTT timer expires at enter + TTT; the condition is only known at samples, so it
        # fires if it still holds at the last sample before the expiry
        expiry = enter_since + cfg.a3_ttt_s
        held = np.where(cond & (expiry < t[i] + cfg.step_s - 1e-9))[0]
        if held.size:
            tgt = int(held[np.argmin(expiry[held])])
            t_rep = max(float(expiry[tgt]), float(t[i]))
            pending = (t_rep + cfg.ho_delay_s, tgt)
            events.append((t_rep + cfg.ho_delay_s, s, tgt))
    # reports every report_period_s, GPS every gps_period_s
    rep_every = max(1, int(round(cfg.report_period_s / cfg.step_s)))
    gps_every = max(1, int(round(cfg.gps_period_s / cfg.step_s)))
    gx = x + rng.normal(0.0, cfg.gps_noise_m, size=n)
    gy = y + rng.normal(0.0, cfg.gps_noise_m, size=n)
    lat, lon = _to_latlon(cfg, gx, gy)
    reports: list[MeasurementReport] = []
    cells = net.cells
    for i in range(0, n, rep_every):
        sc = int(serving[i])
        row = l3[i]
        order = np.argsort(-row)
        nbs = []
        for j in order:
            if j == sc:
                continue
            if row[j] < cfg.report_floor_dbm or len(nbs) >= cfg.max_neighbours:
                break
            c = cells[j]
            nbs.append(NeighbourMeas(pci=c.pci, cell_id=c.cell_id if cfg.resolve_neighbour_ids else -1,
                                     rsrp_dbm=float(row[j])))
        fix = i % gps_every == 0
        reports.append(MeasurementReport(
            time=t0 + float(t[i]), ue_id=ue_id, serving_cell=cells[sc].cell_id, rsrp_dbm=float(row[sc]),
            neighbours=tuple(nbs), serving_pci=cells[sc].pci,
            lat=float(lat[i]) if fix else NAN, lon=float(lon[i]) if fix else NAN,
            speed_mps=route.speed_mps if fix else NAN, heading_deg=float(hd[i]) if fix else NAN,
            e2_node=cells[sc].e2_node, connected=True))
    # true handovers: the report time + ho_delay_s (the serving array switches at the next step);
    # row = index of the first report on the target
    rt = np.array([r.time for r in reports])
    hos = []
    for th, a, b in events:
        if th > t[-1]:
            continue
        ca, cb = cells[a], cells[b]
        hos.append(Handover(time=t0 + float(th), source_cell=ca.cell_id, target_cell=cb.cell_id, idle=False,
                            row=int(np.searchsorted(rt, t0 + th - 1e-9)), prev_time=t0 + float(th) - cfg.ho_delay_s,
                            kind="nr-intra-gnb" if ca.site == cb.site else "nr-inter-gnb"))
    return SimResult(ue_id=ue_id, reports=reports, handovers=hos, t=t0 + t, x_m=x, y_m=y, serving=serving,
                     l3_rsrp=l3)


def generate_drives(n: int = 8, duration_s: float = 600.0, speed_mps: float = 14.0, seed: int = 0,
                    net: Network | None = None, n_routes: int | None = None,
                    speed_spread: float = 0.0) -> tuple[Network, list[SimResult]]:
    """``n`` Manhattan drives of ``duration_s`` each through one network (default ``hex_network``).

    Drive k follows route ``k % n_routes`` (``n_routes`` None: every drive its own route; fewer
    routes model commuters repeating theirs) at ``speed_mps`` times a factor drawn uniformly
    from [1 - speed_spread, 1 + speed_spread]; its measurement noise, GPS noise and speed are
    drawn with seed ``seed * 1000 + k``. UE ids are ``sim-<seed>-<k>``; times start at
    ``k * (duration_s + 60)`` so drives never overlap.
    """
    net = net or hex_network(seed=seed)
    nr = n if n_routes is None else max(1, n_routes)
    rng = np.random.default_rng([seed, 0x5EED])
    out = []
    for k in range(n):
        v = speed_mps * (1.0 + speed_spread * (2.0 * rng.random() - 1.0))
        route = manhattan_route(net, v * duration_s + 200.0, v, seed=seed * 1000 + k % nr)
        out.append(generate_drive(net, route, duration_s, seed=seed * 1000 + k, ue_id=f"sim-{seed}-{k}",
                                  t0=k * (duration_s + 60.0)))
    return net, out


__all__ = ["Cell", "RadioConfig", "Network", "Route", "SimResult", "hex_network", "line_network",
           "straight_route", "manhattan_route", "generate_drive", "generate_drives", "uma_path_loss_db",
           "antenna_gain_db"]
