"""One-way roads of side-by-side lanes, straight along +x or with a bend, built from LaneRecords
for tests."""

from __future__ import annotations

import math

import numpy as np

from drivemind.maps.roadmap import LaneRecord, build_roadmap


def side_by_side(name: str, length: float, lanes, step: float = 0.5):
    """A road ``length`` m long along +x whose lanes (road 1, section 0, ids -1, -2, ... from the
    left) lie at the given ``(y, width)``, each the right neighbour of the one before."""
    xs = np.arange(0.0, length + 1e-9, step)
    n = len(xs)
    none = np.zeros(n, np.uint8)
    keys = [(1, 0, -(k + 1)) for k in range(len(lanes))]
    recs = []
    for k, (y, width) in enumerate(lanes):
        recs.append(LaneRecord(key=keys[k], points=np.stack([xs, np.full(n, float(y))], 1),
                               width=np.full(n, float(width)), mark_left=none, mark_right=none,
                               junction=-1, successors=[],
                               left=keys[k - 1] if k else None,
                               right=keys[k + 1] if k + 1 < len(lanes) else None))
    return build_roadmap(name, recs)


def bent_side_by_side(name: str, radius: float, angle: float, lanes, straight: float = 20.0,
                      step: float = 0.5):
    """Like :func:`side_by_side`, but the road runs ``straight`` m along +x, then turns right
    (clockwise) through ``angle`` radians on an arc of ``radius`` m (its reference line, at
    y = 0), then runs ``straight`` m on. Lane offsets are measured to the left of the reference
    line, as ``side_by_side``'s y."""
    return curved_side_by_side(name, [(radius, -angle)], lanes, straight, step)


def curved_side_by_side(name: str, arcs, lanes, straight: float = 20.0, step: float = 0.5):
    """Like :func:`side_by_side`, but the reference line runs ``straight`` m along +x, then along
    each ``(radius, angle)`` arc in turn (angle in radians, + to the left, - to the right), then
    ``straight`` m on. Lane offsets are measured to the left of the reference line."""
    x, y, h = 0.0, 0.0, 0.0
    xs, ys, hs = [x], [y], [h]

    def advance(length, turn):  # turn: radians per metre
        nonlocal x, y, h
        for _ in range(max(1, int(round(length / step)))):
            d = length / max(1, int(round(length / step)))
            hm = h + 0.5 * turn * d
            x, y, h = x + d * math.cos(hm), y + d * math.sin(hm), h + turn * d
            xs.append(x), ys.append(y), hs.append(h)

    advance(straight, 0.0)
    for radius, angle in arcs:
        advance(radius * abs(angle), math.copysign(1.0 / radius, angle))
    advance(straight, 0.0)
    ref, hdg = np.stack([xs, ys], 1), np.array(hs)
    nrm = np.stack([-np.sin(hdg), np.cos(hdg)], 1)  # to the left
    n = len(ref)
    none = np.zeros(n, np.uint8)
    keys = [(1, 0, -(k + 1)) for k in range(len(lanes))]
    recs = []
    for k, (off, width) in enumerate(lanes):
        recs.append(LaneRecord(key=keys[k], points=ref + float(off) * nrm,
                               width=np.full(n, float(width)), mark_left=none, mark_right=none,
                               junction=-1, successors=[],
                               left=keys[k - 1] if k else None,
                               right=keys[k + 1] if k + 1 < len(lanes) else None))
    return build_roadmap(name, recs)
