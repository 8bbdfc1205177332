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

Cost: a few hundred pixel lookups per frame (one compiled kernel, ``bev.kernels.corridor_read``,
about 10 us), computed once per frame in the env
(``obs.corridor=true`` adds ``bev_corridor`` to the observation).
"""

from __future__ import annotations

import numpy as np

from .config import HISTORY_CHANNELS, BevConfig
from .kernels import corridor_path, corridor_read

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
        rows = [np.flatnonzero(ahead & (idx == b)) for b in range(int(bins))]  # consecutive (s sorted)
        self._bin_lo = np.array([r[0] if len(r) else 0 for r in rows], np.int64)
        self._bin_hi = np.array([r[-1] + 1 if len(r) else 0 for r in rows], np.int64)
        self._planes = np.array([self.vehicle_now, -1 if self.vehicle_prev is None else self.vehicle_prev,
                                 self.walker_now, self.light_now], np.int64)
        self.names = (("vehicle_gap", "vehicle_present", "vehicle_speed", "walker_gap",
                       "walker_present", "light_gap", "light_red", "light_yellow", "light_green")
                      + tuple(f"vehicle_lane_{i}" for i in range(self.bins))
                      + tuple(f"vehicle_wide_{i}" for i in range(self.bins)))
        self.dim = len(self.names)

    # -- geometry ---------------------------------------------------------------------------
    def path(self, waypoints_m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Points every ``step`` m along the polyline ego -> waypoints (forward, right in metres),
        extended along its last segment to the top edge of the view, and the unit normal
        (pointing right) at each."""
        return corridor_path(np.asarray(waypoints_m, np.float64).reshape(-1, 2), self.s, self.range,
                             self.step)

    # -- the readout ------------------------------------------------------------------------
    def read(self, bev: np.ndarray, waypoints_m: np.ndarray) -> np.ndarray:
        """The features (``names``) of one frame (C x H x W uint8) along ``waypoints_m``."""
        out = np.empty(self.dim, np.float32)
        corridor_read(bev, np.asarray(waypoints_m, np.float64).reshape(-1, 2), self.s, self.lane_off,
                      self.wide_off, self._planes, self.row0, self.size, self.ppm, self.range, self.step,
                      self.ego_half_length, self.prev_dt or 1.0, self._bin_lo, self._bin_hi,
                      LIGHT_YELLOW, LIGHT_RED, out)
        return out
