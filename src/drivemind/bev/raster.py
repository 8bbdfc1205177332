"""The static layers of a town (road, solid and broken lane markings) rasterised once.

One uint8 raster per (town, resolution) holds bit 1 = road, bit 2 = solid marking, bit 4 = broken
marking; the renderer samples it into each view by the ego's pose (a rigid warp). Cached on the
RoadMap object, so every renderer of a town in a process shares it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from ..maps.roadmap import BROKEN_MARKINGS, SOLID_MARKINGS, RoadMap

ROAD, SOLID, BROKEN = 1, 2, 4
DASH = 3.0  # m painted / m gap of broken markings
MARGIN = 20.0  # m of raster around the lanes' bounds


@dataclass
class TownRaster:
    bits: np.ndarray  # (V, U) uint8
    origin: tuple[float, float]  # world x, y of the raster's corner (u = v = 0)
    ppm: float

    @property
    def nbytes(self) -> int:
        return int(self.bits.nbytes)


def town_raster(rm: RoadMap, ppm: float, marking_width: float = 0.3) -> TownRaster:
    cache = rm.__dict__.setdefault("_bev_rasters", {})
    key = (round(float(ppm), 6), round(float(marking_width), 6))
    if key not in cache:
        cache[key] = _build(rm, float(ppm), float(marking_width))
    return cache[key]


def _build(rm: RoadMap, ppm: float, marking_width: float) -> TownRaster:
    x0, y0, x1, y1 = (float(v) for v in rm.bounds)
    ox, oy = x0 - MARGIN, y0 - MARGIN
    nu = int(math.ceil((x1 - x0 + 2 * MARGIN) * ppm))
    nv = int(math.ceil((y1 - y0 + 2 * MARGIN) * ppm))

    def px(xy):  # world -> PIL coordinates (PIL puts integer coordinates on pixel centres)
        xy = np.asarray(xy, float)
        return [((x - ox) * ppm - 0.5, (y - oy) * ppm - 0.5) for x, y in xy]

    road = Image.new("L", (nu, nv), 0)
    d = ImageDraw.Draw(road)
    for lane in range(rm.n_lanes):
        d.polygon(px(rm.lane_polygon(lane)), fill=1, outline=1)
    solid = Image.new("L", (nu, nv), 0)
    broken = Image.new("L", (nu, nv), 0)
    ds, db = ImageDraw.Draw(solid), ImageDraw.Draw(broken)
    w = max(1, int(round(marking_width * ppm)))
    for lane in range(rm.n_lanes):
        if rm.junction[lane] >= 0:
            continue  # no markings inside junctions (as CARLA and Roach)
        a, b = int(rm.offset[lane]), int(rm.offset[lane + 1])
        c, yaw, width, s = rm.pts[a:b], rm.yaw[a:b], rm.width[a:b], rm.s[a:b]
        nrm = np.stack([-np.sin(yaw), np.cos(yaw)], 1)  # to the right
        sides = [(1.0, rm.mark_right[a:b])]
        # a left edge is drawn by this lane only when no other lane draws it: with a
        # same-direction left neighbour its right edge is the same line; with an opposite one,
        # the lower index draws (so broken dashes are not laid twice out of phase)
        nb_ = int(rm.left[lane])
        if nb_ < 0 or (not rm.left_same_dir[lane] and lane < nb_):
            sides.append((-1.0, rm.mark_left[a:b]))
        for side, marks in sides:
            edge = px(c + side * nrm * (width[:, None] / 2))
            for i in range(len(edge) - 1):
                m = int(marks[i])
                if m in SOLID_MARKINGS:
                    ds.line([edge[i], edge[i + 1]], fill=1, width=w)
                elif m in BROKEN_MARKINGS and int(s[i] // DASH) % 2 == 0:
                    db.line([edge[i], edge[i + 1]], fill=1, width=w)
    bits = (np.asarray(road, np.uint8) * ROAD) | (np.asarray(solid, np.uint8) * SOLID) \
        | (np.asarray(broken, np.uint8) * BROKEN)
    return TownRaster(np.ascontiguousarray(bits), (ox, oy), ppm)
