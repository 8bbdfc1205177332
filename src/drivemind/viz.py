"""Top-down pictures of the world for people (demo strips, debugging). Not the agent's BEV.

The map layer (lanes, markings) is drawn once per view and reused; each frame adds actors and
light states. Pure PIL, no GUI.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

from .maps.roadmap import BROKEN_MARKINGS, SOLID_MARKINGS, RoadMap
from .sim.snapshot import ActorClass, WorldSnapshot

COLORS = {
    "ground": (38, 41, 46), "road": (92, 95, 102), "junction": (104, 107, 114),
    "solid": (235, 235, 235), "broken": (170, 170, 170), "route": (60, 130, 220),
    "ego": (240, 70, 60), ActorClass.CAR: (70, 200, 240), ActorClass.MOTORCYCLE: (250, 170, 40),
    ActorClass.BICYCLE: (160, 230, 80), ActorClass.WALKER: (250, 250, 120),
    "light": {0: (40, 220, 60), 1: (250, 210, 40), 2: (240, 40, 40), 3: (120, 120, 120)},
}


class TopDown:
    """A fixed world window: ``center`` (x, y) in metres, ``size`` px square, ``ppm`` px/m."""

    def __init__(self, rm: RoadMap, center=None, size: int = 512, ppm: float | None = None):
        self.map = rm
        x0, y0, x1, y1 = rm.bounds
        self.center = np.array(center if center is not None else ((x0 + x1) / 2, (y0 + y1) / 2), float)
        self.size = int(size)
        self.ppm = float(ppm) if ppm else 0.95 * size / max(x1 - x0 + 10, y1 - y0 + 10)
        self._base = self._draw_map()

    def to_px(self, xy) -> np.ndarray:
        xy = np.asarray(xy, float)
        return (xy - self.center) * self.ppm + self.size / 2

    def _draw_map(self) -> Image.Image:
        rm = self.map
        img = Image.new("RGB", (self.size, self.size), COLORS["ground"])
        d = ImageDraw.Draw(img)
        for lane in range(rm.n_lanes):
            poly = self.to_px(rm.lane_polygon(lane))
            key = "junction" if rm.junction[lane] >= 0 else "road"
            d.polygon([tuple(p) for p in poly], fill=COLORS[key])
        for lane in range(rm.n_lanes):
            if rm.junction[lane] >= 0:
                continue
            a, b = rm.offset[lane], rm.offset[lane + 1]
            c, yaw, w = rm.pts[a:b], rm.yaw[a:b], rm.width[a:b]
            nrm = np.stack([-np.sin(yaw), np.cos(yaw)], 1)
            for side, marks in ((-1, rm.mark_left[a:b]), (1, rm.mark_right[a:b])):
                edge = self.to_px(c + side * nrm * (w[:, None] / 2))
                for i in range(len(edge) - 1):
                    m = marks[i]
                    if m in SOLID_MARKINGS:
                        d.line([tuple(edge[i]), tuple(edge[i + 1])], fill=COLORS["solid"], width=1)
                    elif m in BROKEN_MARKINGS and (i // 3) % 2 == 0:
                        d.line([tuple(edge[i]), tuple(edge[i + 1])], fill=COLORS["broken"], width=1)
        return img

    @staticmethod
    def _box(x, y, yaw, hl, hw):
        c, s = math.cos(yaw), math.sin(yaw)
        return [(x + c * a - s * b, y + s * a + c * b) for a, b in ((hl, hw), (hl, -hw), (-hl, -hw), (-hl, hw))]

    def frame(self, snap: WorldSnapshot, route=None, title: str | None = None) -> Image.Image:
        img = self._base.copy()
        d = ImageDraw.Draw(img)
        if route is not None:
            d.line([tuple(p) for p in self.to_px(route.pts)], fill=COLORS["route"], width=2)
        lt = snap.lights
        for i in range(len(lt)):
            for seg in lt.stop_lines[i]:
                p = self.to_px(seg)
                d.line([tuple(p[0]), tuple(p[1])], fill=COLORS["light"][int(lt.state[i])], width=3)
        a = snap.actors
        for k in range(len(a)):
            box = self.to_px(self._box(a.pos[k, 0], a.pos[k, 1], a.yaw[k], max(a.extent[k, 0], 0.5),
                                       max(a.extent[k, 1], 0.5)))
            d.polygon([tuple(p) for p in box], fill=COLORS.get(ActorClass(int(a.cls[k])), (255, 255, 255)))
        e = snap.ego
        box = self.to_px(self._box(e.x, e.y, e.yaw, *e.extent))
        d.polygon([tuple(p) for p in box], fill=COLORS["ego"], outline=(255, 255, 255))
        if title:
            d.text((6, 6), title, fill=(255, 255, 255))
        return img


def strip(frames: list[Image.Image], cols: int = 4) -> Image.Image:
    """Tile frames into one picture, ``cols`` per row."""
    w, h = frames[0].size
    rows = math.ceil(len(frames) / cols)
    out = Image.new("RGB", (w * min(cols, len(frames)), h * rows), (0, 0, 0))
    for i, f in enumerate(frames):
        out.paste(f, ((i % cols) * w, (i // cols) * h))
    return out
