"""The static layers of a town (road, solid and broken lane markings) rasterised for the BEV.

One uint8 raster per (town, resolution) holds bit 1 = road, bit 2 = solid marking, bit 4 = broken
marking; the renderer samples it into each view by the ego's pose (a rigid warp). Cached on the
RoadMap object, so every renderer of a town in a process shares it.

A town whose raster has at most WHOLE_MAX_PX pixels (every shipped and built-in town) is drawn
whole once, as ever. A larger one (CARLA's Town12 and Town13 are about 10 km across: 3.4 GB at
the colour view's 5.8 px/m, three times that while drawing) is drawn in tiles of TILE x TILE
pixels as views reach them (tiles with nothing on them take no memory), keeping at most
MAX_TILES of them, the least recently used going first. A tile is drawn from the same lane
shapes with its pixels' coordinates shifted by whole pixels, which gave the same views as the
whole drawing on every town compared (tests/test_bev_tiles.py).
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

from ..maps.roadmap import BROKEN_MARKINGS, SOLID_MARKINGS, RoadMap

ROAD, SOLID, BROKEN = 1, 2, 4
DASH = 3.0  # m painted / m gap of broken markings
MARGIN = 20.0  # m of raster around the lanes' bounds
TILE_SHIFT = 8
TILE = 1 << TILE_SHIFT  # px: tiles of 256 x 256
WHOLE_MAX_PX = 64 * 2 ** 20  # a raster of at most this many pixels (64 MB) is drawn whole at once
MAX_TILES = 1024  # tiles a town drawn tile by tile keeps (64 MB)
PAD = 16  # px drawn around a tile drawn on its own (shapes reaching in from outside it)
NOT_DRAWN, EMPTY = -1, -2  # tile_of entries (else the tile's slot in ``tiles``)
WHOLE_SHIFT = 30  # a raster drawn whole is one tile of 2**30 px a side (none is that large)


class TownRaster:
    """A town's static layers in tiles of 2**``shift`` px a side: ``tile_of[tv, tu]`` is the slot
    in ``tiles`` of the tile covering pixels [tv << shift, (tv + 1) << shift) x [tu << shift,
    ...), EMPTY when nothing is on it, NOT_DRAWN when it is not drawn yet (call :meth:`ensure`
    for the world box a view covers). Drawn whole, it is a single tile. ``origin``: the world
    x, y of pixel (u, v) = (0, 0)'s corner; ``shape``: (V, U) pixels."""

    def __init__(self, rm: RoadMap, ppm: float, marking_width: float, whole: bool | None = None):
        x0, y0, x1, y1 = (float(v) for v in rm.bounds)
        self.map, self.ppm, self.marking_width = rm, float(ppm), float(marking_width)
        self.origin = (x0 - MARGIN, y0 - MARGIN)
        nu = int(math.ceil((x1 - x0 + 2 * MARGIN) * ppm))
        nv = int(math.ceil((y1 - y0 + 2 * MARGIN) * ppm))
        self.shape = (nv, nu)
        self.whole = nu * nv <= WHOLE_MAX_PX if whole is None else bool(whole)
        if self.whole:  # one tile, the whole raster (the kernel reads it directly); ensure() no-op
            self.shift = WHOLE_SHIFT
            self.tiles = _draw(rm, self.ppm, self.marking_width, self.origin, 0, 0, nu, nv,
                               np.arange(rm.n_lanes))[None]
            self.tile_of = np.zeros((1, 1), np.int64)
        else:
            self.shift = TILE_SHIFT
            self.tile_of = np.full(((nv + TILE - 1) >> TILE_SHIFT, (nu + TILE - 1) >> TILE_SHIFT),
                                   NOT_DRAWN, np.int64)
            self._tick = 0
            self.tiles = np.zeros((0, TILE, TILE), np.uint8)
            self._last = np.zeros(0, np.int64)
            self._slot_tile = np.zeros((0, 2), np.int64)
            self._used = 0
            # each lane's world box, grown by its widest half width and a marking's width
            a = rm.offset[:-1]
            half = np.maximum.reduceat(rm.width, a) / 2.0 + 2.0 * marking_width + 1.0 / ppm
            self._lo = np.stack([np.minimum.reduceat(rm.pts[:, k], a) for k in (0, 1)], 1) \
                - half[:, None]
            self._hi = np.stack([np.maximum.reduceat(rm.pts[:, k], a) for k in (0, 1)], 1) \
                + half[:, None]

    @property
    def nbytes(self) -> int:
        return int(self.tiles.nbytes + self.tile_of.nbytes)

    def ensure(self, x0: float, y0: float, x1: float, y1: float) -> None:
        """Draw the tiles the world box [x0, x1] x [y0, y1] touches that are not drawn yet."""
        if self.whole:
            return
        ox, oy = self.origin
        nv, nu = self.tile_of.shape
        u0 = max(0, int((x0 - ox) * self.ppm) >> TILE_SHIFT)
        v0 = max(0, int((y0 - oy) * self.ppm) >> TILE_SHIFT)
        u1 = min(nu - 1, int((x1 - ox) * self.ppm) >> TILE_SHIFT)
        v1 = min(nv - 1, int((y1 - oy) * self.ppm) >> TILE_SHIFT)
        if u0 > u1 or v0 > v1:
            return
        self._tick += 1
        view = self.tile_of[v0:v1 + 1, u0:u1 + 1]
        self._last[view[view >= 0]] = self._tick
        for tv, tu in np.argwhere(view == NOT_DRAWN) + (v0, u0):
            self._draw_tile(int(tv), int(tu))

    def _draw_tile(self, tv: int, tu: int) -> None:
        ox, oy = self.origin
        ppm = self.ppm
        pu, pv = tu * TILE - PAD, tv * TILE - PAD
        n = TILE + 2 * PAD
        wx0, wy0 = ox + pu / ppm, oy + pv / ppm
        wx1, wy1 = ox + (pu + n) / ppm, oy + (pv + n) / ppm
        lanes = np.flatnonzero((self._hi[:, 0] >= wx0) & (self._lo[:, 0] <= wx1)
                               & (self._hi[:, 1] >= wy0) & (self._lo[:, 1] <= wy1))
        if not len(lanes):
            self.tile_of[tv, tu] = EMPTY
            return
        bits = _draw(self.map, ppm, self.marking_width, self.origin, pu, pv, n, n, lanes)
        tile = bits[PAD:PAD + TILE, PAD:PAD + TILE]
        if not tile.any():
            self.tile_of[tv, tu] = EMPTY
            return
        if self._used < len(self.tiles):
            slot = self._used
            self._used += 1
        elif len(self.tiles) < MAX_TILES:  # the pool grows by doubling, up to MAX_TILES
            grow = min(MAX_TILES, max(16, 2 * len(self.tiles))) - len(self.tiles)
            self.tiles = np.concatenate([self.tiles, np.zeros((grow, TILE, TILE), np.uint8)])
            self._last = np.concatenate([self._last, np.zeros(grow, np.int64)])
            self._slot_tile = np.concatenate([self._slot_tile, np.full((grow, 2), -1, np.int64)])
            slot = self._used
            self._used += 1
        else:  # the least recently used (never one of this view's: those are used now)
            slot = int(np.argmin(self._last))
        old = self._slot_tile[slot]
        if old[0] >= 0:
            self.tile_of[old[0], old[1]] = NOT_DRAWN
        self.tiles[slot] = tile
        self._slot_tile[slot] = (tv, tu)
        self._last[slot] = self._tick
        self.tile_of[tv, tu] = slot

    def window(self) -> np.ndarray:
        """The (V, U) raster of the tiles drawn so far (tests; drawn whole, the whole raster)."""
        nv, nu = self.shape
        if self.whole:
            return self.tiles[0]
        out = np.zeros((self.tile_of.shape[0] * TILE, self.tile_of.shape[1] * TILE), np.uint8)
        for tv, tu in np.argwhere(self.tile_of >= 0):
            out[tv * TILE:(tv + 1) * TILE, tu * TILE:(tu + 1) * TILE] = \
                self.tiles[self.tile_of[tv, tu]]
        return out[:nv, :nu]


def town_raster(rm: RoadMap, ppm: float, marking_width: float = 0.3,
                whole: bool | None = None) -> TownRaster:
    """The town's raster at ``ppm`` (cached on ``rm``). ``whole``: draw it whole (True) or tile
    by tile (False); None: whole up to WHOLE_MAX_PX pixels."""
    cache = rm.__dict__.setdefault("_bev_rasters", {})
    key = (round(float(ppm), 6), round(float(marking_width), 6), whole)
    if key not in cache:
        cache[key] = TownRaster(rm, float(ppm), float(marking_width), whole)
    return cache[key]


def _draw(rm: RoadMap, ppm: float, marking_width: float, origin: tuple[float, float],
          u0: int, v0: int, nu: int, nv: int, lanes: np.ndarray) -> np.ndarray:
    """(nv, nu) uint8 bits of ``lanes`` over the pixels from (u0, v0) on."""
    ox, oy = origin

    def px(xy):  # world -> PIL coordinates (PIL puts integer coordinates on pixel centres)
        xy = np.asarray(xy, float)
        return [((x - ox) * ppm - 0.5 - u0, (y - oy) * ppm - 0.5 - v0) for x, y in xy]

    road = Image.new("L", (nu, nv), 0)
    d = ImageDraw.Draw(road)
    for lane in lanes.tolist():
        d.polygon(px(rm.lane_polygon(lane)), fill=1, outline=1)
    solid = Image.new("L", (nu, nv), 0)
    broken = Image.new("L", (nu, nv), 0)
    ds, db = ImageDraw.Draw(solid), ImageDraw.Draw(broken)
    w = max(1, int(round(marking_width * ppm)))
    for lane in lanes.tolist():
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
    return np.ascontiguousarray(bits)
