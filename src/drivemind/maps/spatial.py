"""Nearest-lane queries on a RoadMap through a uniform grid over its centre-line points."""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .roadmap import RoadMap

CELL = 4.0


class LaneGrid:
    """Uniform grid of centre-line point indices (cell ``CELL`` m), built once per map."""

    def __init__(self, rm: RoadMap, cell: float = CELL):
        self.cell = float(cell)
        self.origin = rm.bounds[:2] - 2 * cell
        span = rm.bounds[2:] - rm.bounds[:2] + 4 * cell
        self.shape = (int(math.ceil(span[0] / cell)) + 1, int(math.ceil(span[1] / cell)) + 1)
        ij = np.floor((rm.pts - self.origin) / cell).astype(np.int64)
        flat = ij[:, 0] * self.shape[1] + ij[:, 1]
        order = np.argsort(flat, kind="stable")
        self.items = order.astype(np.int64)
        counts = np.bincount(flat, minlength=self.shape[0] * self.shape[1])
        self.start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def args(self):
        return (self.origin, self.cell, self.shape[0], self.shape[1], self.start, self.items)

    def near(self, x: float, y: float, radius: float) -> np.ndarray:
        """Indices (ascending) of the centre-line points within ``radius`` of (x, y), and some a
        little farther: those of the cells that can hold such a point."""
        ny = self.shape[1]
        i0, i1, j0, j1 = _cells(self.origin, self.cell, self.shape[0], ny, float(x), float(y),
                                float(radius))
        if i0 >= i1 or j0 >= j1:
            return np.zeros(0, np.int64)
        # a row of cells is one run of items (cell index i * ny + j)
        return np.sort(np.concatenate([self.items[self.start[i * ny + j0]:self.start[i * ny + j1]]
                                       for i in range(i0, i1)]))


def lane_grid(rm: RoadMap) -> LaneGrid:
    grid = getattr(rm, "_lane_grid", None)
    if grid is None:
        grid = LaneGrid(rm)
        rm._lane_grid = grid
    return grid


@nb.njit(cache=True, inline="always")
def _cells(origin, cell, nx, ny, x, y, radius):
    """The grid cells (i0, i1, j0, j1: half-open ranges) that can hold a point within ``radius``
    of (x, y); empty (i0 >= i1) when (x, y) is not finite or far outside the map."""
    if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(radius)):
        return 0, 0, 0, 0
    fx = (x - origin[0]) / cell
    fy = (y - origin[1]) / cell
    r = int(radius // cell) + 1
    if fx < -r - 1 or fy < -r - 1 or fx > nx + r + 1 or fy > ny + r + 1:
        return 0, 0, 0, 0
    ci = int(math.floor(fx))
    cj = int(math.floor(fy))
    return max(ci - r, 0), min(ci + r + 1, nx), max(cj - r, 0), min(cj + r + 1, ny)


@nb.njit(cache=True, inline="always")
def _scan(origin, cell, nx, ny, start, items, pts, yaw, width, x, y, qyaw, max_dyaw, radius,
          edge):
    """One pass over the centre-line points within ``radius`` of (x, y): ``edge`` False, the
    nearest whose heading is within ``max_dyaw`` of ``qyaw`` (index, squared distance); True, the
    least distance minus half the lane's width there (index, that value)."""
    i0, i1, j0, j1 = _cells(origin, cell, nx, ny, x, y, radius)
    best = -1
    r2 = radius * radius
    bd = math.inf if edge else r2
    for i in range(i0, i1):
        for j in range(j0, j1):
            c = i * ny + j
            for k in range(start[c], start[c + 1]):
                p = items[k]
                dx = pts[p, 0] - x
                dy = pts[p, 1] - y
                d = dx * dx + dy * dy
                if edge:
                    if d < r2:
                        g = math.sqrt(d) - 0.5 * width[p]
                        if g < bd:
                            bd = g
                            best = p
                elif d < bd:
                    if max_dyaw < math.pi:
                        dyaw = abs((yaw[p] - qyaw + math.pi) % (2 * math.pi) - math.pi)
                        if dyaw > max_dyaw:
                            continue
                    bd = d
                    best = p
    return best, bd


@nb.njit(cache=True)
def nearest_point(origin, cell, nx, ny, start, items, pts, yaw, x, y, qyaw, max_dyaw, radius):
    """Index of the nearest centre-line point within ``radius`` whose heading is within
    ``max_dyaw`` of ``qyaw`` (pass max_dyaw >= pi to ignore heading); -1 if none."""
    return _scan(origin, cell, nx, ny, start, items, pts, yaw, yaw, x, y, qyaw, max_dyaw, radius,
                 False)[0]


@nb.njit(cache=True)
def edge_clearance(origin, cell, nx, ny, start, items, pts, width, x, y, radius):
    """How far (x, y) lies outside the nearest lane edge: the least, over centre-line points
    within ``radius``, of its distance to the point minus half the lane's width there (<= 0:
    on a lane); inf if no point is that near. Unlike the nearest point's own lane, this counts a
    wide lane whose centre is a little farther than a narrow one's."""
    return _scan(origin, cell, nx, ny, start, items, pts, width, width, x, y, 0.0, 4.0, radius,
                 True)[1]


def off_road(rm: RoadMap, x: float, y: float, margin: float, radius: float = 12.0) -> bool:
    """Whether (x, y) lies more than ``margin`` m outside every lane near it
    (:func:`edge_clearance`): the ego's STATIC contact, on every backend."""
    return edge_clearance(*lane_grid(rm).args(), rm.pts, rm.width, float(x), float(y),
                          radius) > margin


def nearest_lane_point(rm: RoadMap, x: float, y: float, yaw: float | None = None,
                       max_dyaw: float = math.pi / 2, radius: float = 20.0):
    """(lane, s, signed lateral offset [m, + to the right], distance) of the nearest lane point,
    or None when no lane lies within ``radius``."""
    g = lane_grid(rm)
    p = nearest_point(*g.args(), rm.pts, rm.yaw, float(x), float(y),
                      0.0 if yaw is None else float(yaw), 4.0 if yaw is None else max_dyaw, radius)
    if p < 0:
        return None
    lane = int(rm.point_lane[p])
    dx, dy = x - rm.pts[p, 0], y - rm.pts[p, 1]
    c, s_ = math.cos(rm.yaw[p]), math.sin(rm.yaw[p])
    along = dx * c + dy * s_
    lateral = -dx * s_ + dy * c
    s = float(np.clip(rm.s[p] + along, 0.0, rm.length[lane]))
    return lane, s, lateral, math.hypot(dx, dy)
