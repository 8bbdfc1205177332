"""A fixed readout of the ego's lateral offset from the route, read from the BEV's route plane.

The route plane is drawn as a band ``route_width`` wide centred on the route's centre line (the line
the env's ``lateral_offset`` fact is measured against), and the ego's reference point sits at a
fixed place of the view (column ``size / 2``, row ``size - ego_from_bottom``, facing up). So the
offset of the band's centre from the ego's column, at the ego's row, is the lateral offset, read
from pixels only (no learned part, no privileged input):

1. in each pixel row within ``ahead_m`` ahead of and ``behind_m`` behind the reference point, the
   mean column of the route pixels within ``search_m`` either side of the ego's column (one row's
   centre moves in half-pixel steps: the band is a run of pixels);
2. a least-squares line ``right = a + b * fwd`` (metres, ego frame) through the rows that have
   route pixels: averaging over rows whose band edges fall on different pixels gives sub-pixel
   precision when the ego is not parallel to the route, and ``b`` is the route's direction;
3. ``lateral = -a / sqrt(1 + b^2)``: the perpendicular distance from the reference point to that
   line, positive when the ego is to the right of the route (the env's sign convention).

Features (:meth:`RouteOffsetReadout.features`): ``lateral_m`` (metres, + right), ``slope`` (b: the
route's direction against the ego's heading, tan of the angle) and ``valid`` (1 when at least two
rows had route pixels; else the readout is 0, 0, 0). Works on uint8 masks or floats in [0, 1], as
numpy arrays or torch tensors, one frame (C, H, W) or a batch (N, C, H, W).

Its resolution is measured on bench.py reward-quality's held-out set by ``bench.py lane-readout``
(docs/benchmarks.md, "The lane readout").
"""

from __future__ import annotations

import numpy as np
import torch

from .config import BEV_PRESETS, BevConfig

FEATURES = ("lateral_m", "slope", "valid")


class RouteOffsetReadout:
    """The ego's lateral offset from the route, read from the route plane of a BEV (module doc)."""

    def __init__(self, bev_cfg: BevConfig | str = "cpu", *, ahead_m: float = 4.0,
                 behind_m: float = 1.0, search_m: float = 5.5):
        if isinstance(bev_cfg, str):
            if bev_cfg not in BEV_PRESETS:
                raise ValueError(f"unknown bev preset {bev_cfg!r}; valid: {', '.join(BEV_PRESETS)}")
            bev_cfg = BEV_PRESETS[bev_cfg]
        if "route" not in bev_cfg.channels:
            raise ValueError(f"the lane readout reads the BEV's route plane, which bev.channels "
                             f"{list(bev_cfg.channels)} lacks: add 'route'")
        for name, v in (("ahead_m", ahead_m), ("behind_m", behind_m), ("search_m", search_m)):
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        self.cfg = bev_cfg
        self.plane = bev_cfg.plane_start["route"]
        self.ppm = float(bev_cfg.pixels_per_meter)
        size = int(bev_cfg.size)
        self.half = size / 2.0
        self.row0 = size - int(bev_cfg.ego_from_bottom)  # continuous row of the reference point
        r_lo = max(0, int(np.floor(self.row0 - ahead_m * self.ppm)))
        r_hi = min(size, int(np.ceil(self.row0 + behind_m * self.ppm)))
        c_lo = max(0, int(np.floor(self.half - search_m * self.ppm)))
        c_hi = min(size, int(np.ceil(self.half + search_m * self.ppm)))
        if r_hi - r_lo < 2 or c_hi <= c_lo:
            raise ValueError("the readout window is empty: raise ahead_m / behind_m / search_m")
        self.rows = slice(r_lo, r_hi)
        self.cols = slice(c_lo, c_hi)
        # ego-frame coordinates (metres) of the window's pixel centres
        self.fwd = torch.tensor((self.row0 - (np.arange(r_lo, r_hi) + 0.5)) / self.ppm, dtype=torch.float64)
        self.right = torch.tensor((np.arange(c_lo, c_hi) + 0.5 - self.half) / self.ppm, dtype=torch.float64)
        self.names = FEATURES
        self.dim = len(FEATURES)

    def features(self, bev) -> torch.Tensor:
        """(N, C, H, W) or (C, H, W) BEV masks -> (N, 3) float32 ``lateral_m, slope, valid``."""
        x = torch.as_tensor(np.asarray(bev) if not isinstance(bev, torch.Tensor) else bev)
        if x.dim() == 3:
            x = x[None]
        c, h, w = self.cfg.shape
        if x.dim() != 4 or tuple(x.shape[1:]) != (c, h, w):
            raise ValueError(f"the lane readout expects BEV masks (N, {c}, {h}, {w}) of its BEV "
                             f"config, got {tuple(x.shape)}")
        m = (x[:, self.plane, self.rows, self.cols] > 0).to(torch.float64)  # (N, R, K)
        n = m.sum(-1)  # route pixels per row
        has = n > 0
        centre = (m * self.right).sum(-1) / n.clamp_min(1.0)  # mean right offset of each row's band
        wgt = has.to(torch.float64)
        k = wgt.sum(-1)
        f = self.fwd[None].expand_as(centre)
        mf = (wgt * f).sum(-1) / k.clamp_min(1.0)
        mr = (wgt * centre).sum(-1) / k.clamp_min(1.0)
        sff = (wgt * (f - mf[:, None]) ** 2).sum(-1)
        sfr = (wgt * (f - mf[:, None]) * (centre - mr[:, None])).sum(-1)
        b = torch.where(sff > 1e-9, sfr / sff.clamp_min(1e-9), torch.zeros_like(sff))
        a = mr - b * mf  # the line's right offset at fwd = 0 (the reference point's row)
        lateral = -a / torch.sqrt(1.0 + b * b)
        valid = k >= 2
        z = torch.zeros_like(lateral)
        out = torch.stack([torch.where(valid, lateral, z), torch.where(valid, b, z),
                           valid.to(torch.float64)], 1)
        return out.to(torch.float32)

    def lateral(self, bev) -> np.ndarray:
        """Only the lateral offsets (metres, + right) of a batch, as a numpy array."""
        return self.features(bev)[:, 0].numpy()


__all__ = ["FEATURES", "RouteOffsetReadout"]
