"""Roach-style BEV masks and a colour rendering of the same view, from RoadMap + WorldSnapshot.

    bev = BevRenderer(roadmap, BevConfig())
    bev.reset()
    masks = bev.step(snapshot, route_ahead)   # (C, H, W) uint8, once per env step
    image = bev.rgb()                          # (H', W', 3) uint8 of the same step, on demand

Static layers come from a town raster built once (:mod:`.raster`) and sampled by the ego's pose;
actors, stop lines and the route are drawn by numba kernels straight into the output planes.
The renderer keeps the history of actors and light states that the history channels need.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

import numpy as np

from ..maps.roadmap import RoadMap
from ..sim.snapshot import ActorClass, WorldSnapshot
from . import kernels as K
from .config import ALL_CHANNELS, BevConfig
from .raster import town_raster

VEHICLE_CLS = np.array([int(ActorClass.CAR), int(ActorClass.MOTORCYCLE), int(ActorClass.BICYCLE)],
                       np.int8)  # consecutive codes: a range test selects them
assert np.array_equal(VEHICLE_CLS, np.arange(VEHICLE_CLS.min(), VEHICLE_CLS.max() + 1))
LIGHT_VALUES = np.array([80, 170, 255, 0], np.uint8)  # GREEN, YELLOW, RED, OFF

# colour rendering, drawn in this order (later layers on top); history layers fade with age
_BASE = {"road": (60, 64, 70), "route": (120, 124, 132), "solid": (250, 250, 250),
         "broken": (190, 190, 190), "green": (40, 210, 70), "yellow": (250, 200, 30),
         "red": (235, 40, 40), "vehicle": (40, 110, 250), "walker": (0, 230, 230),
         "ego": (255, 255, 255)}


def _tint(rgb, f):
    return tuple(int(round(c + (255 - c) * f)) for c in rgb)


def palette(cfg: BevConfig):
    """Colour look-up for ``cfg``'s mask stack: (plane order, lut (C, 256, 3), paint (C, 256)).
    Channels ``cfg`` does not have are skipped; history planes fade with age."""
    H = len(cfg.history)
    idx, n = cfg.plane_start, cfg.n_channels
    lut = np.zeros((n, 256, 3), np.uint8)
    paint = np.zeros((n, 256), np.bool_)
    order = []

    def add(name, k, values, rgb):
        if name not in idx:
            return
        plane = idx[name] + k
        lut[plane, values] = rgb
        paint[plane, values] = True
        if plane not in order:
            order.append(plane)

    add("road", 0, slice(1, 256), _BASE["road"])
    add("route", 0, slice(1, 256), _BASE["route"])
    add("lane", 0, 120, _BASE["broken"])
    add("lane", 0, 255, _BASE["solid"])
    for k in range(H):
        fade = (H - 1 - k) * 0.2  # older steps paler, as in Roach's rendering
        for val, name in ((80, "green"), (170, "yellow"), (255, "red")):
            add("light", k, val, _tint(_BASE[name], fade))
    for name in ("vehicle", "walker"):
        for k in range(H):
            add(name, k, slice(1, 256), _tint(_BASE[name], (H - 1 - k) * 0.2))
    add("ego", 0, slice(1, 256), _BASE["ego"])
    return np.array(order, np.int64), lut, paint


def masks_to_rgb(masks: np.ndarray, config: BevConfig | None = None) -> np.ndarray:
    """Colour stored uint8 masks without a renderer: (C, H, W) -> (H, W, 3), or (N, C, H, W) ->
    (N, H, W, 3) uint8, with the colours of :meth:`BevRenderer.rgb` (``config``: the BevConfig
    the masks were rendered with; default Roach's 15 channels)."""
    cfg = config if config is not None else BevConfig()
    if not isinstance(cfg, BevConfig):
        raise TypeError(f"config must be a BevConfig, got {type(cfg).__name__}")
    arr = np.asarray(masks)
    single = arr.ndim == 3
    if single:
        arr = arr[None]
    if arr.ndim != 4 or arr.dtype != np.uint8 or arr.shape[1] != cfg.n_channels:
        raise ValueError(f"expected uint8 BEV masks (N, {cfg.n_channels}, H, W) or "
                         f"({cfg.n_channels}, H, W) for channels {list(cfg.channels)}, got "
                         f"{arr.dtype} {arr.shape}; pass the BevConfig the masks were rendered with")
    order, lut, paint = palette(cfg)
    out = np.zeros((arr.shape[0], arr.shape[2], arr.shape[3], 3), np.uint8)
    for i in range(arr.shape[0]):
        K.colorize(np.ascontiguousarray(arr[i]), order, lut, paint, out[i])
    return out[0] if single else out


class _Frame:
    __slots__ = ("pos", "yaw", "ext", "vehicle", "walker", "light_state")

    def __init__(self, snap: WorldSnapshot):
        a = snap.actors
        self.pos, self.yaw, self.ext = a.pos, a.yaw, a.extent
        self.vehicle = (a.cls >= VEHICLE_CLS.min()) & (a.cls <= VEHICLE_CLS.max())
        self.walker = a.cls == int(ActorClass.WALKER)
        self.light_state = np.asarray(snap.lights.state, np.uint8)


class BevRenderer:
    def __init__(self, roadmap: RoadMap, config: BevConfig | None = None):
        self.map = roadmap
        self.cfg = config if config is not None else BevConfig()
        if not isinstance(self.cfg, BevConfig):
            raise TypeError(f"config must be a BevConfig, got {type(self.cfg).__name__}")
        # the colour view draws every channel (the ego too) over the same window
        self.rgb_cfg = replace(self.cfg.scaled(self.cfg.rgb_size), channels=ALL_CHANNELS)
        # one raster serves both views; take the finer resolution
        self.raster = town_raster(roadmap, max(self.cfg.pixels_per_meter,
                                               self.rgb_cfg.pixels_per_meter),
                                  self.cfg.marking_width)
        self._hist: deque[_Frame] = deque(maxlen=-min(self.cfg.history))
        self._seg = np.zeros((0, 2, 2))
        self._seg_light = np.zeros(0, np.int64)
        self._lights_key = None
        self._last = None  # (snapshot, route_ahead) of the latest step, for rgb()
        self._rgb_cache = None
        self._palette_arrays = self._palette()

    # ------------------------------------------------------------------ public
    @property
    def shape(self) -> tuple[int, int, int]:
        return self.cfg.shape

    def reset(self) -> None:
        self._hist.clear()
        self._last = None
        self._rgb_cache = None

    def step(self, snap: WorldSnapshot, route_ahead: np.ndarray | None = None) -> np.ndarray:
        """Record ``snap`` in the history and return this step's masks (a new array)."""
        self._hist.append(_Frame(snap))
        self._set_lights(snap)
        self._last = (snap, route_ahead)
        self._rgb_cache = None
        return self._render(self.cfg, snap, route_ahead)

    def rgb(self) -> np.ndarray:
        """Colour rendering (rgb_size px, HxWx3 uint8) of the latest step, computed once."""
        if self._last is None:
            raise RuntimeError("BevRenderer.rgb() needs a step() first")
        if self._rgb_cache is None:
            snap, route = self._last
            masks = self._render(self.rgb_cfg, snap, route)
            out = np.zeros((self.rgb_cfg.size, self.rgb_cfg.size, 3), np.uint8)
            K.colorize(masks, *self._palette_arrays, out)
            self._rgb_cache = out
        return self._rgb_cache

    # ------------------------------------------------------------------ internals
    def _set_lights(self, snap):
        lt = snap.lights
        key = (id(lt.stop_lines), len(lt))
        if key == self._lights_key:
            return
        self._seg, self._seg_light = lt.stop_line_segments()
        self._lights_key = key

    def _frames(self):
        n = len(self._hist)
        return [self._hist[max(h, -n)] for h in self.cfg.history]

    def _render(self, cfg: BevConfig, snap: WorldSnapshot, route_ahead) -> np.ndarray:
        ch = cfg.plane_start
        out = np.zeros(cfg.shape, np.uint8)
        e = snap.ego
        geo = (float(e.x), float(e.y), float(e.yaw), cfg.size, float(cfg.pixels_per_meter),
               cfg.ego_from_bottom)
        ppm = float(cfg.pixels_per_meter)
        if "road" in ch or "lane" in ch:
            r = self.raster
            # the world box the view covers (the ego's reference point is off its centre)
            reach = math.hypot(cfg.size / 2.0, max(cfg.size - cfg.ego_from_bottom,
                                                   cfg.ego_from_bottom)) / ppm + 1.0
            r.ensure(e.x - reach, e.y - reach, e.x + reach, e.y + reach)
            K.gather_static(r.tiles, r.tile_of, r.shift, *r.shape, r.origin[0], r.origin[1],
                            r.ppm, *geo, out, ch.get("road", -1), ch.get("lane", -1))
        if "route" in ch and route_ahead is not None and len(route_ahead):
            K.draw_polyline(out[ch["route"]], 255, np.ascontiguousarray(route_ahead, float),
                            cfg.route_width * ppm, *geo)
        frames = self._frames() if ("vehicle" in ch or "walker" in ch or "light" in ch) else ()
        vals = np.empty(len(self._seg_light), np.uint8)
        for k, f in enumerate(frames):
            if "vehicle" in ch and len(f.pos):
                K.draw_boxes(out[ch["vehicle"] + k], 255, f.pos, f.yaw, f.ext, f.vehicle, 1.0, *geo)
            if "walker" in ch and len(f.pos):
                K.draw_boxes(out[ch["walker"] + k], 255, f.pos, f.yaw, f.ext, f.walker,
                             float(cfg.walker_scale), *geo)
            if "light" in ch and len(vals):
                K.light_values(self._seg_light, f.light_state, LIGHT_VALUES, vals)
                K.draw_segments(out[ch["light"] + k], self._seg, vals, cfg.stop_line_width * ppm, *geo)
        if "ego" in ch:
            K.draw_boxes(out[ch["ego"]], 255, np.array([[e.x, e.y]]), np.array([e.yaw]),
                         np.array([e.extent], float), np.ones(1, np.bool_), 1.0, *geo)
        return out

    def _palette(self):
        """Colour look-up per (plane, value) of the ALL_CHANNELS mask stack, and the plane order."""
        return palette(self.rgb_cfg)
