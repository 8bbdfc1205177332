"""A fixed readout of the BEV along the route ahead: what is in the ego's path, read from pixels.

The frozen BEV encoder (``bev.encoder``) carries the scene's facts only approximately (its
lead-distance error is several metres, issue 14's notes), and a policy that must stop behind a
queue needs the gap to the car ahead to the metre. This readout samples the BEV masks along the
path the observation's own waypoints describe, with no learned part and no privileged input:

- the path: the polyline from the ego's reference point through the ``waypoints`` (ego frame,
  metres), resampled every ``step`` m up to the top edge of the view;
- a **lane band** (``lane_half_width`` m either side of the path) and a **wide band**
  (``wide_half_width`` m, for walkers and cross traffic), sampled across the path every pixel;
- per band and plane, the first distance along the path where a pixel is set.

Features (``CorridorReadout.names``), each scaled to about [0, 1] or [-1, 1]:

- ``vehicle_gap`` / ``vehicle_present``: first vehicle pixel in the lane band, as the gap ahead
  of the ego's front / range, and whether there is one;
- ``vehicle_speed``: that vehicle's speed along the path, from its first pixel in the current
  plane and in the previous history plane (both are drawn in the current ego frame, so the
  difference is the other vehicle's own motion), / 10 m/s;
- ``walker_gap`` / ``walker_present``: the same for the walker plane in the wide band;
- ``light_gap``, ``light_red``, ``light_yellow``, ``light_green``: the first stop line on the path
  from the ego's reference point on (a line under the bonnet still counts, with a negative gap,
  as the env's light fact does until the ego's centre crosses it) and its state (the renderer's
  light values: green 80, yellow 170, red 255);
- ``vehicle_lane_<i>`` / ``vehicle_wide_<i>``: the share of the band occupied by vehicles in
  ``bins`` equal bins along the path (queues, cross traffic at junctions).

Cost: a few hundred array lookups per frame (numpy), computed once per frame in the env
(``obs.corridor=true`` adds ``bev_corridor`` to the observation).
"""

from __future__ import annotations

import numpy as np

from .config import HISTORY_CHANNELS, BevConfig

LIGHT_GREEN, LIGHT_YELLOW, LIGHT_RED = 80, 170, 255  # bev.renderer.LIGHT_VALUES


class CorridorReadout:
    """Reads ``bev_corridor`` features from one BEV frame and the ego-frame waypoints."""

    def __init__(self, bev_cfg: BevConfig, *, ego_half_length: float = 2.4, step: float = 0.5,
                 lane_half_width: float = 1.2, wide_half_width: float = 3.5, bins: int = 6,
                 frame_dt: float = 0.1):
        missing = [c for c in ("vehicle", "walker", "light") if c not in bev_cfg.channels]
        if missing:
            raise ValueError(f"obs.corridor reads the BEV's {', '.join(missing)} channel(s), which "
                             f"bev.channels {list(bev_cfg.channels)} lacks: add them or set "
                             f"obs.corridor=false")
        self.cfg = bev_cfg
        self.ppm = float(bev_cfg.pixels_per_meter)
        self.size = int(bev_cfg.size)
        self.row0 = self.size - int(bev_cfg.ego_from_bottom)
        self.range = self.row0 / self.ppm  # metres visible ahead of the reference point
        self.ego_half_length = float(ego_half_length)
        self.step = float(step)
        self.bins = int(bins)
        # plane index of each channel's history steps (oldest first, the last one is "now")
        planes, i = {}, 0
        for c in bev_cfg.channels:
            n = len(bev_cfg.history) if c in HISTORY_CHANNELS else 1
            planes[c] = list(range(i, i + n))
            i += n
        self.vehicle_now = planes["vehicle"][-1]
        self.walker_now = planes["walker"][-1]
        self.light_now = planes["light"][-1]
        hist = bev_cfg.history
        self.vehicle_prev = planes["vehicle"][-2] if len(hist) > 1 else None
        self.prev_dt = (hist[-1] - hist[-2]) * frame_dt if len(hist) > 1 else None
        px = 1.0 / self.ppm
        self.lane_off = np.arange(-lane_half_width, lane_half_width + 1e-6, px)
        self.wide_off = np.arange(-wide_half_width, wide_half_width + 1e-6, px)
        self.s = np.arange(0.0, self.range, self.step)
        # the occupancy bins: fixed sample rows ahead of the front, per bin (computed once)
        edges = np.linspace(self.ego_half_length, self.range, int(bins) + 1)
        idx = np.clip(np.searchsorted(edges, self.s, side="right") - 1, 0, int(bins) - 1)
        ahead = self.s > self.ego_half_length
        self._bin_rows = [np.flatnonzero(ahead & (idx == b)) for b in range(int(bins))]
        self.names = (("vehicle_gap", "vehicle_present", "vehicle_speed", "walker_gap",
                       "walker_present", "light_gap", "light_red", "light_yellow", "light_green")
                      + tuple(f"vehicle_lane_{i}" for i in range(self.bins))
                      + tuple(f"vehicle_wide_{i}" for i in range(self.bins)))
        self.dim = len(self.names)

    # -- geometry ---------------------------------------------------------------------------
    def path(self, waypoints_m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Points every ``step`` m along the polyline ego -> waypoints (forward, right in metres)
        and the unit normal (pointing right) at each."""
        pts = np.vstack([[0.0, 0.0], np.asarray(waypoints_m, float).reshape(-1, 2)])
        seg = np.diff(pts, axis=0)
        keep = np.hypot(seg[:, 0], seg[:, 1]) > 1e-6
        pts = np.vstack([pts[:1], pts[1:][keep]])
        if len(pts) < 2:  # no route ahead: straight on
            pts = np.array([[0.0, 0.0], [self.range, 0.0]])
        seg = np.diff(pts, axis=0)
        cum = np.concatenate([[0.0], np.cumsum(np.hypot(seg[:, 0], seg[:, 1]))])
        if cum[-1] < self.range:  # extend the last segment to the edge of the view
            d = seg[-1] / np.hypot(*seg[-1])
            pts = np.vstack([pts, pts[-1] + d * (self.range - cum[-1] + self.step)])
            cum = np.append(cum, self.range + self.step)
        f = np.interp(self.s, cum, pts[:, 0])
        r = np.interp(self.s, cum, pts[:, 1])
        tf, tr = np.gradient(f), np.gradient(r)
        n = np.maximum(np.hypot(tf, tr), 1e-9)
        return np.stack([f, r], 1), np.stack([-tr / n, tf / n], 1)  # normal: (fwd, right) of the tangent rotated right

    def _pixels(self, p: np.ndarray, normal: np.ndarray, offsets: np.ndarray):
        """Row / column indices (n_s x n_off) of the band samples, and a mask of those in view."""
        fwd = p[:, None, 0] + normal[:, None, 0] * offsets[None, :]
        right = p[:, None, 1] + normal[:, None, 1] * offsets[None, :]
        rows = np.floor(self.row0 - fwd * self.ppm).astype(np.int64)
        cols = np.floor(self.size / 2.0 + right * self.ppm).astype(np.int64)
        ok = (rows >= 0) & (rows < self.size) & (cols >= 0) & (cols < self.size)
        return np.clip(rows, 0, self.size - 1), np.clip(cols, 0, self.size - 1), ok

    def _first(self, band: np.ndarray, start: float | None = None) -> float | None:
        """Distance along the path of the first sample row with a set pixel beyond ``start`` (the
        ego's front by default)."""
        hit = band.any(axis=1) & (self.s > (self.ego_half_length if start is None else start))
        k = np.flatnonzero(hit)
        return float(self.s[k[0]]) if len(k) else None

    # -- the readout ------------------------------------------------------------------------
    def read(self, bev: np.ndarray, waypoints_m: np.ndarray) -> np.ndarray:
        p, nrm = self.path(waypoints_m)
        lr, lc, lok = self._pixels(p, nrm, self.lane_off)
        wr, wc, wok = self._pixels(p, nrm, self.wide_off)
        rng = self.range - self.ego_half_length

        def band(plane, rows, cols, ok):
            return (bev[plane][rows, cols] > 0) & ok

        veh_lane = band(self.vehicle_now, lr, lc, lok)
        veh_wide = band(self.vehicle_now, wr, wc, wok)
        out = np.zeros(self.dim, np.float32)
        s_v = self._first(veh_lane)
        if s_v is not None:
            out[0], out[1] = (s_v - self.ego_half_length) / rng, 1.0
            if self.vehicle_prev is not None:
                s_p = self._first(band(self.vehicle_prev, lr, lc, lok))
                if s_p is not None:
                    out[2] = np.clip((s_v - s_p) / self.prev_dt / 10.0, -1.0, 1.0)
        else:
            out[0] = 1.0
        s_w = self._first(band(self.walker_now, wr, wc, wok))
        out[3], out[4] = ((s_w - self.ego_half_length) / rng, 1.0) if s_w is not None else (1.0, 0.0)
        light = np.where(lok, bev[self.light_now][lr, lc], 0)
        s_l = self._first(light > 0, start=-1.0)  # from the reference point: a stop line under the
        if s_l is not None:                        # ego's bonnet still holds it (the env's light fact does)
            k = int(np.searchsorted(self.s, s_l))
            v = int(light[min(k, len(light) - 1)].max())
            out[5] = (s_l - self.ego_half_length) / rng  # >= -ego_half_length: s_l >= 0
            out[6], out[7], out[8] = float(v >= LIGHT_RED), float(LIGHT_YELLOW <= v < LIGHT_RED), \
                float(0 < v < LIGHT_YELLOW)
        else:
            out[5] = 1.0
        for b, rows in enumerate(self._bin_rows):
            if len(rows):
                out[9 + b] = veh_lane[rows].mean()
                out[9 + self.bins + b] = veh_wide[rows].mean()
        return out
