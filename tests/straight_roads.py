"""Straight one-way roads of side-by-side lanes along +x, built from LaneRecords for tests."""

from __future__ import annotations

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
