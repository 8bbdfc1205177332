"""The RoadMap: a lane graph as flat numpy arrays.

A RoadMap is built by a loader (today: :mod:`drivemind.maps.opendrive`, which parses OpenDRIVE with
the ``carla`` client) from a list of :class:`LaneRecord`. Everything downstream (simulator, router,
BEV renderer, env) reads only this type, never ``carla``.

Coordinates are CARLA's: x forward/east, y to the right (a left-handed frame seen from above),
yaw in radians with the forward vector ``(cos yaw, sin yaw)``. A positive steering angle turns
right, as in CARLA.

Layout: lane ``l`` owns points ``offset[l]:offset[l+1]`` of the point arrays, spaced uniformly
``ds[l]`` (<= 1 m) apart along the lane's direction of travel, so the point at arc length ``s`` is
found in O(1) without search.
"""

from __future__ import annotations

import dataclasses

import math
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np


class MarkingType(IntEnum):
    """Lane-marking types (the OpenDRIVE/CARLA set)."""

    NONE = 0
    OTHER = 1
    BROKEN = 2
    SOLID = 3
    SOLID_SOLID = 4
    SOLID_BROKEN = 5
    BROKEN_SOLID = 6
    BROKEN_BROKEN = 7
    BOTTS_DOTS = 8
    GRASS = 9
    CURB = 10


SOLID_MARKINGS = (MarkingType.SOLID, MarkingType.SOLID_SOLID, MarkingType.SOLID_BROKEN,
                  MarkingType.BROKEN_SOLID, MarkingType.CURB)
BROKEN_MARKINGS = (MarkingType.BROKEN, MarkingType.BROKEN_BROKEN, MarkingType.BOTTS_DOTS)
# painted lines with a solid part (a kerb is solid too, but not a line one may cross)
PAINTED_SOLID = (MarkingType.SOLID, MarkingType.SOLID_SOLID, MarkingType.SOLID_BROKEN,
                 MarkingType.BROKEN_SOLID)


class MapError(ValueError):
    """A map could not be loaded or is unusable. The message names the map and what failed."""


@dataclass
class LaneRecord:
    """One driving lane (one lane of one lane section) as a loader reads it."""

    key: tuple[int, int, int]  # (road_id, section_id, lane_id) as in OpenDRIVE
    points: np.ndarray  # (n, 2) centre line in driving direction
    width: np.ndarray  # (n,)
    mark_left: np.ndarray  # (n,) MarkingType codes
    mark_right: np.ndarray  # (n,)
    junction: int  # junction id or -1
    successors: list[tuple[int, int, int]]
    left: tuple[int, int, int] | None = None  # neighbouring driving lane keys
    right: tuple[int, int, int] | None = None
    z: np.ndarray | None = None  # (n,) height of the centre line (None: not read; checks only)
    speed_limit: float | None = None  # m/s: the lane's OpenDRIVE speed (None: the file gives none)


@dataclass
class TrafficLightLandmark:
    """A traffic-light signal as it appears in the map (position only; control is inferred)."""

    x: float
    y: float
    road_id: int


@dataclass(eq=False)
class RoadMap:
    name: str
    # per lane (L)
    keys: list[tuple[int, int, int]]
    offset: np.ndarray  # (L+1,) int64
    length: np.ndarray  # (L,) metres
    ds: np.ndarray  # (L,) point spacing
    junction: np.ndarray  # (L,) junction id or -1
    succ: np.ndarray  # (L, S) lane indices, -1 padded
    pred: np.ndarray  # (L, P)
    left: np.ndarray  # (L,) neighbouring driving lane on the left, -1 if none
    right: np.ndarray  # (L,)
    left_same_dir: np.ndarray  # (L,) bool: the left neighbour drives the same way
    right_same_dir: np.ndarray
    # per point (P)
    pts: np.ndarray  # (P, 2)
    yaw: np.ndarray  # (P,)
    s: np.ndarray  # (P,)
    width: np.ndarray  # (P,)
    mark_left: np.ndarray  # (P,) uint8
    mark_right: np.ndarray  # (P,) uint8
    point_lane: np.ndarray  # (P,) int32
    # junctions
    junction_ids: np.ndarray  # (J,)
    junction_bbox: np.ndarray  # (J, 4) xmin, ymin, xmax, ymax of its lanes
    light_landmarks: list[TrafficLightLandmark] = field(default_factory=list)
    # derived (filled by finalize)
    spawn: np.ndarray = field(default=None)  # (S, 3) x, y, yaw
    spawn_lane: np.ndarray = field(default=None)
    spawn_s: np.ndarray = field(default=None)
    bounds: np.ndarray = field(default=None)  # xmin, ymin, xmax, ymax
    key_index: dict = field(default=None)
    source: str = ""
    z: np.ndarray = field(default=None)  # (P,) height of each point (0 where the loader read none)
    speed_limit: np.ndarray = field(default=None)  # (L,) m/s, the map's own (NaN where none)

    # ------------------------------------------------------------------ basic queries
    @property
    def n_lanes(self) -> int:
        return len(self.keys)

    def lane_points(self, lane: int) -> np.ndarray:
        return self.pts[self.offset[lane]:self.offset[lane + 1]]

    def successors(self, lane: int) -> np.ndarray:
        row = self.succ[lane]
        return row[row >= 0]

    def predecessors(self, lane: int) -> np.ndarray:
        row = self.pred[lane]
        return row[row >= 0]

    def pose_at(self, lane: int, s: float) -> tuple[float, float, float]:
        """Centre-line position and heading at arc length ``s`` along ``lane``."""
        s = min(max(float(s), 0.0), float(self.length[lane]))
        f = s / self.ds[lane]
        i = min(int(f), int(self.offset[lane + 1] - self.offset[lane]) - 2)
        t = f - i
        a = self.offset[lane] + i
        p = self.pts[a] * (1 - t) + self.pts[a + 1] * t
        return float(p[0]), float(p[1]), float(self.yaw[a])

    def height_at(self, lane: int, s: float) -> float:
        """Height of ``lane``'s centre line at its point at or before arc length ``s``."""
        a, b = int(self.offset[lane]), int(self.offset[lane + 1])
        return float(self.z[min(a + max(int(s / max(float(self.ds[lane]), 1e-6)), 0), b - 1)])

    def lane_polygon(self, lane: int) -> np.ndarray:
        """Drivable-area polygon of one lane: left boundary then the right boundary reversed."""
        a, b = self.offset[lane], self.offset[lane + 1]
        c, yaw, w = self.pts[a:b], self.yaw[a:b], self.width[a:b]
        nrm = np.stack([-np.sin(yaw), np.cos(yaw)], axis=1)  # points to the right in CARLA's frame
        left = c - nrm * (w[:, None] / 2)
        right = c + nrm * (w[:, None] / 2)
        return np.concatenate([left, right[::-1]], axis=0)

    def drivable_polygons(self) -> list[np.ndarray]:
        return [self.lane_polygon(i) for i in range(self.n_lanes)]

    @property
    def total_length(self) -> float:
        return float(self.length.sum())

    def summary(self) -> dict:
        return {
            "name": self.name,
            "lanes": self.n_lanes,
            "junction_lanes": int((self.junction >= 0).sum()),
            "junctions": int(len(self.junction_ids)),
            "lane_km": round(self.total_length / 1000.0, 3),
            "spawn_points": int(len(self.spawn)),
            "traffic_light_landmarks": len(self.light_landmarks),
            "bounds": [round(float(v), 1) for v in self.bounds],
        }


def _resample(points: np.ndarray, max_ds: float) -> tuple[np.ndarray, float, float]:
    """Resample a polyline to uniform spacing <= max_ds; returns (points, spacing, length)."""
    seg = np.linalg.norm(np.diff(points, axis=0), axis=1)
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    length = float(cum[-1])
    n = max(2, int(math.ceil(length / max_ds)) + 1)
    ds = length / (n - 1) if length > 0 else 0.0
    s = np.linspace(0.0, length, n)
    x = np.interp(s, cum, points[:, 0])
    y = np.interp(s, cum, points[:, 1])
    return np.stack([x, y], axis=1), ds, length


def _interp_attr(values: np.ndarray, n_src: int, n_dst: int) -> np.ndarray:
    idx = np.round(np.linspace(0, n_src - 1, n_dst)).astype(np.int64)
    return values[idx]


def finite_points(ln: LaneRecord) -> LaneRecord:
    """``ln`` without its points at no position (NaN), and their widths and markings."""
    pts = np.asarray(ln.points, float).reshape(-1, 2)
    ok = np.isfinite(pts).all(axis=1)
    if ok.all():
        return ln
    return dataclasses.replace(
        ln, points=pts[ok], width=np.asarray(ln.width)[ok], mark_left=np.asarray(ln.mark_left)[ok],
        mark_right=np.asarray(ln.mark_right)[ok], z=None if ln.z is None else np.asarray(ln.z)[ok])


def build_roadmap(name: str, lanes: list[LaneRecord], *, landmarks=(), max_ds: float = 1.0,
                  spawn_spacing: float = 15.0, spawn_margin: float = 6.0, source: str = "") -> RoadMap:
    """Assemble a RoadMap from loader records. Raises MapError if nothing drivable remains.
    Points without a position (NaN: the parser on a broken geometry record, named by
    :func:`drivemind.maps.validate.find_issues`) are left out."""
    lanes = [finite_points(ln) for ln in lanes]
    lanes = [ln for ln in lanes if len(ln.points) >= 2]
    if not lanes:
        raise MapError(f"map {name!r} ({source or 'in memory'}) has no drivable lanes")
    key_index = {ln.key: i for i, ln in enumerate(lanes)}
    L = len(lanes)
    pts, yaws, ss, widths, ml, mr, plane, zs = [], [], [], [], [], [], [], []
    offset = np.zeros(L + 1, np.int64)
    length = np.zeros(L)
    ds = np.zeros(L)
    for i, ln in enumerate(lanes):
        p, d, lng = _resample(np.asarray(ln.points, float), max_ds)
        if lng < 1e-3:
            # a degenerate lane: keep it connected but give it a tiny length so nothing divides by 0
            p = np.stack([ln.points[0], ln.points[0] + 1e-3], axis=0)
            d, lng = 1e-3, 1e-3
        n = len(p)
        tang = np.gradient(p, axis=0) if n > 2 else np.repeat(np.diff(p, axis=0), 2, axis=0)
        yaw = np.arctan2(tang[:, 1], tang[:, 0])
        pts.append(p)
        yaws.append(yaw)
        ss.append(np.linspace(0, lng, n))
        widths.append(_interp_attr(np.asarray(ln.width, float), len(ln.width), n))
        ml.append(_interp_attr(np.asarray(ln.mark_left, np.uint8), len(ln.mark_left), n))
        mr.append(_interp_attr(np.asarray(ln.mark_right, np.uint8), len(ln.mark_right), n))
        plane.append(np.full(n, i, np.int32))
        zs.append(np.zeros(n) if ln.z is None or not len(ln.z)
                  else _interp_attr(np.asarray(ln.z, float), len(ln.z), n))
        offset[i + 1] = offset[i] + n
        length[i], ds[i] = lng, d
    succ_lists = [[key_index[k] for k in ln.successors if k in key_index] for ln in lanes]
    pred_lists: list[list[int]] = [[] for _ in range(L)]
    for i, sl in enumerate(succ_lists):
        for j in sl:
            pred_lists[j].append(i)

    def pad(lists):
        uniq = [sorted(set(x)) for x in lists]
        out = np.full((L, max(1, max(len(u) for u in uniq))), -1, np.int64)
        for i, u in enumerate(uniq):
            out[i, :len(u)] = u
        return out

    def neigh(attr):
        idx = np.full(L, -1, np.int64)
        same = np.zeros(L, bool)
        for i, ln in enumerate(lanes):
            k = getattr(ln, attr)
            if k is not None and k in key_index:
                idx[i] = key_index[k]
                same[i] = (k[2] > 0) == (ln.key[2] > 0)
        return idx, same

    left, left_same = neigh("left")
    right, right_same = neigh("right")
    junction = np.array([ln.junction for ln in lanes], np.int64)
    all_pts = np.concatenate(pts)
    jids = np.unique(junction[junction >= 0])
    jbox = np.zeros((len(jids), 4))
    for k, j in enumerate(jids):
        sel = np.concatenate([pts[i] for i in np.flatnonzero(junction == j)])
        jbox[k] = [sel[:, 0].min(), sel[:, 1].min(), sel[:, 0].max(), sel[:, 1].max()]
    rm = RoadMap(
        name=name, keys=[ln.key for ln in lanes], offset=offset, length=length, ds=ds,
        junction=junction, succ=pad(succ_lists), pred=pad(pred_lists), left=left, right=right,
        left_same_dir=left_same, right_same_dir=right_same, pts=all_pts,
        yaw=np.concatenate(yaws), s=np.concatenate(ss), width=np.concatenate(widths),
        mark_left=np.concatenate(ml), mark_right=np.concatenate(mr),
        point_lane=np.concatenate(plane), junction_ids=jids, junction_bbox=jbox,
        light_landmarks=list(landmarks), key_index=key_index, source=source,
        z=np.concatenate(zs),
        speed_limit=np.array([np.nan if ln.speed_limit is None else float(ln.speed_limit)
                              for ln in lanes]),
    )
    rm.bounds = np.array([all_pts[:, 0].min(), all_pts[:, 1].min(), all_pts[:, 0].max(),
                          all_pts[:, 1].max()])
    _make_spawn_points(rm, spawn_spacing, spawn_margin)
    if len(rm.spawn) == 0:
        raise MapError(f"map {name!r} ({source or 'in memory'}) has no lane to spawn on (need a "
                       f"non-junction lane longer than {2 * spawn_margin:.0f} m and {MIN_SPAWN_WIDTH} m "
                       f"wide or more for {2 * spawn_margin:.0f} m; its widest lane is "
                       f"{float(rm.width.max()):.2f} m wide and its longest outside junctions "
                       f"{_longest_road_lane(rm):.1f} m long)")
    return rm


def _longest_road_lane(rm: RoadMap) -> float:
    outside = rm.length[rm.junction < 0]
    return float(outside.max()) if len(outside) else 0.0


MIN_SPAWN_WIDTH = 2.5  # m: no spawn point where the lane is narrower (a lane that begins or ends
#                       with a taper: a vehicle there would overlap the next lane's traffic)


def _make_spawn_points(rm: RoadMap, spacing: float, margin: float) -> None:
    xs, lanes, ss = [], [], []
    for lane in range(rm.n_lanes):
        if rm.junction[lane] >= 0 or rm.length[lane] < 2 * margin:
            continue
        n = int((rm.length[lane] - 2 * margin) // spacing) + 1
        w, ds = rm.width[rm.offset[lane]:rm.offset[lane + 1]], rm.ds[lane]
        for k in range(n):
            s = margin + k * spacing
            lo, hi = int(max(s - margin, 0.0) / ds), int(math.ceil((s + margin) / ds)) + 1
            if w[lo:hi].min() < MIN_SPAWN_WIDTH:
                continue
            xs.append(rm.pose_at(lane, s))
            lanes.append(lane)
            ss.append(s)
    rm.spawn = np.array(xs, float).reshape(-1, 3)
    rm.spawn_lane = np.array(lanes, np.int64)
    rm.spawn_s = np.array(ss, float)
