"""Per-map tables the traffic model needs, computed once per RoadMap and cached on it:
junction conflict matrix, curvature speed limits, traffic-light groups, walker crossing sites."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..maps.roadmap import MIN_SPAWN_WIDTH, RoadMap


# traffic.junction_conflict='boxes': the box two ways through are tested with, the largest background
# vehicle's half length and half width (world.CLASS_PARAMS' car), and the margin added to its half
# width on each side
VEHICLE_BOX = (2.45, 1.0)
BOX_MARGIN = 0.1
POSE_SUBSTEPS = 4  # poses tested per segment between two lane points


class JunctionPairs:
    """A table over pairs of lanes of one junction, stored junction by junction: the sum over
    junctions of (its lane count)^2 entries, where an L x L array grows with the square of the
    whole town (about 3.6 GB for the conflict and clear-point tables of a 20,000-lane town).

    ``index`` (L, 3) int64 per lane: the offset of its junction's block in ``data`` (-1 outside
    junctions), its position in the block (lanes in index order), and the block's lane count.
    ``table[a, b]`` reads like the dense array it replaces (scalars, or index arrays that
    broadcast, as ``np.ix_`` gives): ``fill`` for two lanes not of one junction. The kernels read
    it through :func:`kernels.pair_at` on ``data`` and ``index``."""

    def __init__(self, junction: np.ndarray, dtype, fill):
        self.fill = fill
        index = np.full((len(junction), 3), -1, np.int64)
        self._lanes: dict[int, np.ndarray] = {}  # block offset -> its lanes
        base = 0
        for j in np.unique(junction[junction >= 0]):
            lanes = np.flatnonzero(junction == j)
            n = len(lanes)
            index[lanes, 0] = base
            index[lanes, 1] = np.arange(n)
            index[lanes, 2] = n
            self._lanes[base] = lanes
            base += n * n
        index[junction < 0, 2] = 0
        self.size, self.index = base, index
        self.data = np.full(self.size, fill, dtype)

    def like(self, dtype, fill) -> "JunctionPairs":
        """An empty table over the same blocks."""
        out = JunctionPairs.__new__(JunctionPairs)
        out.fill, out.index, out.size, out._lanes = fill, self.index, self.size, self._lanes
        out.data = np.full(self.size, fill, dtype)
        return out

    def copy(self) -> "JunctionPairs":
        out = self.like(self.data.dtype, self.fill)
        out.data[:] = self.data
        return out

    def astype(self, dtype) -> "JunctionPairs":
        out = self.like(dtype, np.asarray(self.fill).astype(dtype)[()])
        out.data[:] = self.data.astype(dtype)
        return out

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.index), len(self.index))

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.index.nbytes)

    def block(self, lanes: np.ndarray) -> np.ndarray:
        """The (n, n) view of the block of one junction's lanes (all of them, in index order)."""
        first = self.index[lanes[0]]
        if first[0] < 0 or len(lanes) != first[2]:
            raise ValueError("block() takes all the lanes of one junction, in index order")
        n = int(first[2])
        return self.data[first[0]:first[0] + n * n].reshape(n, n)

    def row(self, a: int) -> tuple[np.ndarray, np.ndarray]:
        """The lanes of ``a``'s junction and ``table[a, those]`` (empty outside junctions)."""
        base, pos, n = (int(x) for x in self.index[a])
        if base < 0:
            return np.zeros(0, np.int64), self.data[:0]
        return self._lanes[base], self.data[base + pos * n:base + (pos + 1) * n]

    def partners(self, a: int) -> np.ndarray:
        """The lanes ``b`` with ``table[a, b]`` nonzero (as ``np.flatnonzero(dense[a])``)."""
        lanes, vals = self.row(a)
        return lanes[vals != 0]

    def _flat(self, key):
        a, b = key
        if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
            ia, ib = self.index[a], self.index[b]
            same = bool(ia[0] >= 0 and ia[0] == ib[0])
            return np.asarray(ia[0] + ia[1] * ia[2] + ib[1] if same else -1), np.asarray(same)
        A, B = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
        ia, ib = self.index[A], self.index[B]
        same = (ia[..., 0] >= 0) & (ia[..., 0] == ib[..., 0])
        flat = np.where(same, ia[..., 0] + ia[..., 1] * ia[..., 2] + ib[..., 1], -1)
        return flat, same

    def __getitem__(self, key):
        flat, same = self._flat(key)
        out = np.where(same, self.data[np.where(same, flat, 0)] if self.size else self.fill,
                       self.fill).astype(self.data.dtype)
        return out[()] if out.ndim == 0 else out

    def __setitem__(self, key, value):
        flat, same = self._flat(key)
        value = np.broadcast_to(np.asarray(value, self.data.dtype), flat.shape)
        if (~same & (value != self.fill)).any():
            raise ValueError("a JunctionPairs table holds only pairs of lanes of one junction")
        self.data[flat[same]] = value[same]

    def dense(self) -> np.ndarray:
        """The L x L array (small maps and tests only)."""
        L = len(self.index)
        return self[np.arange(L)[:, None], np.arange(L)[None, :]]


def lane_poses(rm: RoadMap, lane: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xy, yaw, s) of the poses a vehicle on ``lane`` takes as :func:`kernels.lane_pose` places
    it: POSE_SUBSTEPS positions on each segment between two lane points, each at the heading of
    the segment's first point (so in a bend a vehicle's box turns in steps, as in the world)."""
    a, b = int(rm.offset[lane]), int(rm.offset[lane + 1])
    p, y, s = rm.pts[a:b], rm.yaw[a:b], rm.s[a:b]
    if len(p) < 2:
        return p, y, s
    t = np.arange(POSE_SUBSTEPS) / POSE_SUBSTEPS
    xy = (p[:-1, None, :] * (1.0 - t)[None, :, None] + p[1:, None, :] * t[None, :, None])
    ss = s[:-1, None] * (1.0 - t)[None, :] + s[1:, None] * t[None, :]
    return (np.concatenate([xy.reshape(-1, 2), p[-1:]]),
            np.concatenate([np.repeat(y[:-1], POSE_SUBSTEPS), y[-2:-1]]),
            np.concatenate([ss.reshape(-1), s[-1:]]))


def boxes_touch(pa: np.ndarray, ya: np.ndarray, pb: np.ndarray, yb: np.ndarray,
                half: tuple[float, float]) -> np.ndarray:
    """(len(pa),) bool: a box of half length and half width ``half`` at pose i of (pa, ya)
    overlaps the box at some pose of (pb, yb) (separating axis test; compiled:
    :func:`kernels.boxes_touch`, the headings' cosines and sines taken here)."""
    from . import kernels as K  # noqa: PLC0415 - numba only when tables are built

    out = np.zeros(len(pa), np.bool_)
    if not len(pa) or not len(pb):
        return out
    hl, hw = half
    reach = 2.0 * math.hypot(hl, hw)
    K.boxes_touch(np.ascontiguousarray(pa, np.float64), np.cos(ya), np.sin(ya),
                  np.ascontiguousarray(pb, np.float64), np.cos(yb), np.sin(yb),
                  float(hl), float(hw), reach * reach, out)
    return out


def _box_half(box: bool) -> tuple[float, float] | None:
    return (VEHICLE_BOX[0], VEHICLE_BOX[1] + BOX_MARGIN) if box else None


MIN_BOX_LANE = 0.1  # m: a shorter lane (a degenerate lane section) has no heading to test a box at


def conflict_matrix(rm: RoadMap, dist: float, succ: np.ndarray | None = None, *,
                    box: bool = False, ways: bool = False) -> JunctionPairs:
    """conflict[a, b] (int8 :class:`JunctionPairs`, nonzero: conflict): junction lanes a and b
    (same junction, a != b) come within ``dist`` m, directly or through the lanes chained to them
    (see :func:`_chain_conflicts`); 2 marks the first lanes of two ways through from one lane (with
    ``ways``: every lane of the one way against every lane of the other).

    ``box`` (traffic.junction_conflict='boxes'): they also conflict where a vehicle's box
    (VEHICLE_BOX, BOX_MARGIN wider on each side) at a pose on one overlaps that box at a pose on
    the other: centre lines further apart than ``dist`` can still bring two bodies together where
    the ways curve (two opposite left turns whose boxes cut inside the bend)."""
    out = JunctionPairs(rm.junction, np.bool_, False)
    half = _box_half(box)
    reach = 2.0 * math.hypot(*half) if half else 0.0
    for j in rm.junction_ids:
        lanes = np.flatnonzero(rm.junction == j)
        if not len(lanes):
            continue
        blk = out.block(lanes)
        P = [rm.lane_points(a) for a in lanes]
        poses: dict = {}
        for ia in range(len(lanes)):
            for ib in range(ia + 1, len(lanes)):
                pa, pb = P[ia], P[ib]
                d2 = ((pa[:, None, :] - pb[None, :, :]) ** 2).sum(-1).min()
                hit = d2 < dist * dist
                if (not hit and half and d2 < reach * reach
                        and min(rm.length[lanes[ia]], rm.length[lanes[ib]]) >= MIN_BOX_LANE):
                    for q in (ia, ib):
                        if q not in poses:
                            poses[q] = lane_poses(rm, int(lanes[q]))
                    hit = bool(boxes_touch(poses[ia][0], poses[ia][1], poses[ib][0],
                                           poses[ib][1], half).any())
                if hit:
                    blk[ia, ib] = blk[ib, ia] = True
    succ = rm.succ if succ is None else succ
    return _mark_siblings(rm, _chain_conflicts(rm, out, succ), succ, ways)


def _chain_conflicts(rm: RoadMap, base: JunctionPairs, succ: np.ndarray) -> JunctionPairs:
    """A way through a junction can be several lanes in a row (a connecting road with several
    lane sections); a vehicle holds it as a whole. So lanes linked within one junction form one
    chain, and two junction lanes conflict when anything of their chains does (and two lanes of
    one chain conflict with each other)."""
    L = rm.n_lanes
    parent = np.arange(L)

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a in range(L):
        if rm.junction[a] < 0:
            continue
        for b in succ[a][succ[a] >= 0]:
            if rm.junction[b] == rm.junction[a]:
                ra, rb = find(a), find(int(b))
                if ra != rb:
                    parent[ra] = rb
    out = base.copy()
    # junction by junction (chains and conflicts stay within one): the products below grow with
    # the cube of the lanes they span, hours for a town of thousands of junction lanes at once
    for j in np.unique(rm.junction[rm.junction >= 0]):
        jl = np.flatnonzero(rm.junction == j)
        roots = np.array([find(a) for a in jl])
        _, comp = np.unique(roots, return_inverse=True)
        M = np.zeros((len(jl), comp.max() + 1), np.int32)
        M[np.arange(len(jl)), comp] = 1
        sub = base.block(jl).astype(np.int32)
        cc = (M.T @ sub @ M) > 0
        np.fill_diagonal(cc, True)
        full = (M @ cc.astype(np.int32) @ M.T) > 0
        np.fill_diagonal(full, False)
        out.block(jl)[:] = full
    return out


def _mark_siblings(rm: RoadMap, conflict: JunctionPairs, succ: np.ndarray,
                   ways: bool = False) -> JunctionPairs:
    """conflict as int8: 1 where two junction lanes conflict, 2 where they are the first lanes of
    two ways through that leave the same lane (they overlap where they start and then diverge: a
    vehicle may follow another into them, as into one lane, rather than wait until it is out);
    with ``ways``, 2 also between every later lane of the one way and of the other (a way of
    several lane sections: the vehicle ahead is followed over all of it, see :func:`way_start`)."""
    out = conflict.astype(np.int8)
    for a in range(rm.n_lanes):
        if rm.junction[a] >= 0:
            continue
        first = [int(b) for b in succ[a][succ[a] >= 0] if rm.junction[b] >= 0]
        for x in first:
            for y in first:
                if x != y and out[x, y]:
                    if ways:
                        wx, wy = _way_lanes(rm, x, succ), _way_lanes(rm, y, succ)
                        if not wx & wy:  # ways that join again are not followed as one
                            ix = np.ix_(sorted(wx), sorted(wy))
                            sub = out[ix]
                            sub[sub != 0] = 2
                            out[ix] = sub
                    out[x, y] = 2
    return out


def _way_lanes(rm: RoadMap, first: int, succ: np.ndarray) -> set[int]:
    """The junction lanes of the way through starting with junction lane ``first``: it and the
    lanes after it within its junction."""
    seen, todo = {first}, [first]
    while todo:
        x = todo.pop()
        for y in succ[x][succ[x] >= 0].tolist():
            if rm.junction[y] == rm.junction[first] and y not in seen:
                seen.add(y)
                todo.append(y)
    return seen


def way_start(rm: RoadMap, succ: np.ndarray) -> np.ndarray:
    """(L,) float64: how far a junction lane starts from the start of its way through (the
    shortest distance over the lanes before it within its junction; 0 for a way's first lane and
    outside junctions). traffic.diverging_follow='way' measures a vehicle on a way that diverges
    from ours by it, as if on our lane."""
    L = rm.n_lanes
    start = np.full(L, np.inf)
    todo = []
    for a in range(L):
        if rm.junction[a] < 0:
            start[a] = 0.0
            for b in succ[a][succ[a] >= 0].tolist():
                if rm.junction[b] >= 0 and start[b] > 0.0:
                    start[b] = 0.0
                    todo.append(b)
    while todo:  # lanes are few per junction: a plain relaxation
        x = todo.pop()
        for y in succ[x][succ[x] >= 0].tolist():
            if rm.junction[y] == rm.junction[x] and start[x] + rm.length[x] < start[y]:
                start[y] = start[x] + rm.length[x]
                todo.append(y)
    start[~np.isfinite(start)] = 0.0  # junction lanes no way leads into
    return start


def conflict_clear_points(rm: RoadMap, dist: float, conflict: JunctionPairs,
                          succ: np.ndarray | None = None, *, box: bool = False) -> JunctionPairs:
    """clear[a, c] (float64 :class:`JunctionPairs` over ``conflict``'s blocks): how far along
    junction lane ``a`` (m from its start) a
    vehicle's rear must be before it no longer stands in the way of a vehicle entering the way
    through that starts with junction lane ``c``: the last point of ``a`` within ``dist`` m of any
    lane of ``c``'s chain (see :func:`_chain_conflicts`), 0 where ``a`` comes near it only through
    the lanes chained before it, and ``inf`` where a lane chained after ``a`` comes near it (the
    vehicle has not passed the crossing yet) or where ``a`` and ``c`` do not conflict. Used by
    ``traffic.junction_release='crossing'``. With ``box`` (as :func:`conflict_matrix`), also the
    rear of the last pose of ``a`` whose box overlaps a box on ``c``'s chain."""
    clear = conflict.like(np.float64, np.inf)
    succ = rm.succ if succ is None else succ
    jl = np.flatnonzero(rm.junction >= 0)
    if not len(jl):
        return clear
    # chains: the lanes linked within one junction, and the lanes after each lane in its chain
    after = {a: _way_lanes(rm, a, succ) - {a} for a in jl.tolist()}
    before: dict[int, set[int]] = {a: set() for a in jl.tolist()}
    for b, lanes in after.items():
        for x in lanes:
            if x in before:
                before[x].add(b)
    comp: dict[int, set[int]] = {}
    for a in jl.tolist():
        if a in comp:
            continue
        group, todo = {a}, [a]
        while todo:  # linked both ways
            x = todo.pop()
            nb = set(after[x]) | before[x]
            for y in nb - group:
                group.add(y)
                todo.append(y)
        for x in group:
            comp[x] = group
    pts = {a: rm.lane_points(a) for a in jl.tolist()}
    s0 = {a: rm.s[rm.offset[a]:rm.offset[a + 1]] for a in jl.tolist()}

    half = _box_half(box)
    poses = {a: lane_poses(rm, a) for a in jl.tolist() if rm.length[a] >= MIN_BOX_LANE} if half \
        else {}

    def near(pa, pb):  # (len(pa),) bool: point of pa within dist of some point of pb
        d2 = ((pa[:, None, :] - pb[None, :, :]) ** 2).sum(-1)
        return d2.min(1) < dist * dist

    memo: dict = {}

    def last_near(a, group):  # the last s of a near the lanes of group (-inf: none)
        key = (a, id(group))  # the groups are shared sets (comp)
        if key not in memo:
            memo[key] = _last_near(a, group)
        return memo[key]

    def _last_near(a, group):
        other = np.concatenate([pts[x] for x in sorted(group)])
        m = near(pts[a], other)
        last = float(s0[a][m].max()) if m.any() else -np.inf
        if half and a in poses:
            mine = poses[a]
            theirs = [poses[x] for x in sorted(group) if x in poses]
            if theirs:
                m = boxes_touch(mine[0], mine[1], np.concatenate([q[0] for q in theirs]),
                                np.concatenate([q[1] for q in theirs]), half)
                if m.any():  # as the rear of that box (the world releases by the rear)
                    last = max(last, float(mine[2][m].max()) - half[0])
        return last

    for a in jl.tolist():
        for c in conflict.partners(a).tolist():
            if rm.junction[c] < 0:
                continue
            if any(last_near(d, comp[c]) > -np.inf for d in after[a]):
                continue  # the crossing is still ahead of a vehicle on a
            clear[a, c] = max(0.0, last_near(a, comp[c]))
    return clear


def lane_speed_limits(rm: RoadMap, limit: float, lat_accel: float, from_map: bool = False) -> np.ndarray:
    """Per lane: min(its limit, sqrt(lat_accel / max curvature)), curvature over a 3 m window.
    Its limit: ``limit`` (m/s), or with ``from_map`` the map's own for the lane
    (``RoadMap.speed_limit``, its OpenDRIVE speed) where it has one."""
    base = np.full(rm.n_lanes, float(limit))
    if from_map and rm.speed_limit is not None:
        own = np.asarray(rm.speed_limit, float)
        base = np.where(np.isfinite(own), own, base)
    out = base.copy()
    for lane in range(rm.n_lanes):
        a, b = rm.offset[lane], rm.offset[lane + 1]
        yaw = np.unwrap(rm.yaw[a:b])
        w = max(1, int(round(3.0 / max(rm.ds[lane], 1e-3))))
        if len(yaw) > w:
            kappa = np.abs(yaw[w:] - yaw[:-w]) / (w * rm.ds[lane])
            k = float(kappa.max())
            if k > 1e-4:
                out[lane] = min(base[lane], float(np.sqrt(lat_accel / k)))
    return np.maximum(out, 2.0)


@dataclass
class LightTable:
    lane_light: np.ndarray  # (L,) light index controlling the end of this lane, -1 if none
    junction_groups: np.ndarray  # (J',) number of lights per signalised junction
    phase: np.ndarray  # (M,) the phase (within its junction's cycle) in which this light is green
    junction_phases: np.ndarray  # (J',) number of phases of each signalised junction's cycle
    junction_of_light: np.ndarray  # (M,) junction id
    pos: np.ndarray  # (M, 2)
    yaw: np.ndarray  # (M,)
    stop_lines: list  # per light: (k, 2, 2) segments across the controlled lanes' ends
    signalised: np.ndarray  # junction ids


OPPOSITE_COS = -0.7  # two approaches are opposite when their headings differ by more than ~134 deg


def light_table(rm: RoadMap, mode: str, landmark_radius: float = 25.0,
                succ: np.ndarray | None = None, phases: str = "opposite") -> LightTable:
    """Traffic lights: every incoming road of a signalised junction gets one light.

    A junction is signalised if ``mode == 'all'`` and it has 3+ incoming roads, or if
    ``mode == 'landmarks'`` and a traffic-light signal of the map lies within ``landmark_radius``
    of it. ``phases``: ``'single'`` turns the lights of a junction green one incoming road at a
    time (CARLA's traffic-light group cycle); ``'opposite'`` pairs each incoming road with the
    most nearly opposite one (headings differing by more than ~134 degrees) and turns the pair
    green together, as a two-phase signal plan does (turning vehicles give way to the oncoming
    ones through the junction reservations); an approach with no opposite one has a phase of its
    own. A 4-way junction thus has 2 phases instead of 4, a T-junction 2 instead of 3.
    """
    L = rm.n_lanes
    succ = rm.succ if succ is None else succ
    lane_light = np.full(L, -1, np.int64)
    incoming: dict[int, dict[int, list[int]]] = {}
    for lane in range(L):
        if rm.junction[lane] >= 0:
            continue
        for n in succ[lane][succ[lane] >= 0]:
            j = int(rm.junction[n])
            if j >= 0:
                incoming.setdefault(j, {}).setdefault(rm.keys[lane][0], []).append(lane)
                break
    lm = np.array([[m.x, m.y] for m in rm.light_landmarks]).reshape(-1, 2)
    groups, jof, pos, yaw, lines, sig, phase, nphases = [], [], [], [], [], [], [], []
    for k, j in enumerate(rm.junction_ids):
        roads = incoming.get(int(j), {})
        if mode == "none" or not roads:
            continue
        if mode == "all":
            if len(roads) < 3:
                continue
        else:
            x0, y0, x1, y1 = rm.junction_bbox[k]
            dx = np.maximum(0, np.maximum(x0 - lm[:, 0], lm[:, 0] - x1))
            dy = np.maximum(0, np.maximum(y0 - lm[:, 1], lm[:, 1] - y1))
            if not len(lm) or np.hypot(dx, dy).min() > landmark_radius:
                continue
        sig.append(int(j))
        groups.append(len(roads))
        order = sorted(roads)
        heading = {r: float(rm.yaw[rm.offset[roads[r][0] + 1] - 1]) for r in order}
        ph: dict[int, int] = {}
        for r in order:
            if r in ph:
                continue
            ph[r] = len(set(ph.values()))
            if phases == "opposite":
                free = [(np.cos(heading[q] - heading[r]), q) for q in order if q not in ph]
                free = [(c, q) for c, q in free if c < OPPOSITE_COS]
                if free:
                    ph[min(free)[1]] = ph[r]
        nphases.append(len(set(ph.values())))
        for road in order:
            phase.append(ph[road])
            idx = len(jof)
            jof.append(int(j))
            segs = []
            for lane in roads[road]:
                lane_light[lane] = idx
                e = rm.offset[lane + 1] - 1
                c, h, w = rm.pts[e], rm.yaw[e], rm.width[e] / 2
                nrm = np.array([-np.sin(h), np.cos(h)])
                segs.append([c - nrm * w, c + nrm * w])
            segs = np.array(segs)
            lines.append(segs)
            pos.append(segs.reshape(-1, 2).mean(0))
            e = rm.offset[roads[road][0] + 1] - 1
            yaw.append(float(rm.yaw[e]))
    return LightTable(lane_light, np.array(groups, np.int64), np.array(phase, np.int64),
                      np.array(nphases, np.int64), np.array(jof, np.int64),
                      np.array(pos, float).reshape(-1, 2), np.array(yaw, float), lines,
                      np.array(sig, np.int64))


def crossing_sites(rm: RoadMap, succ: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Places where walkers cross: (sites (S, 2, 2) kerb-to-kerb segments, at_junction (S,) bool).

    One site where each road meets a junction (a crosswalk) and one mid-block on long roads.
    A site spans every lane of the road, found geometrically (parallel or anti-parallel lane
    points beside the anchor), and ends 1 m beyond the outer lane edges.
    """
    from ..maps.spatial import lane_grid

    succ = rm.succ if succ is None else succ
    anchors = []
    for lane in range(rm.n_lanes):
        if rm.junction[lane] >= 0:
            continue
        to_junction = any(rm.junction[n] >= 0 for n in succ[lane][succ[lane] >= 0])
        if to_junction and rm.length[lane] > 8.0:
            anchors.append((lane, rm.length[lane] - 4.0, True))
        if rm.length[lane] > 40.0:
            anchors.append((lane, rm.length[lane] / 2, False))
    nonj = rm.junction[rm.point_lane] < 0
    grid = lane_grid(rm)  # (a big town has millions of points: look only near each anchor)
    sites, at_j, mids = [], [], []
    for lane, s, isj in anchors:
        x, y, h = rm.pose_at(lane, s)
        t = np.array([np.cos(h), np.sin(h)])
        n = np.array([-np.sin(h), np.cos(h)])
        c = grid.near(x, y, 20.1)
        c = c[nonj[c]]
        d = rm.pts[c] - [x, y]
        near = ((np.abs(d @ t) < 0.8) & (np.abs(d @ n) < 20.0)
                & (np.abs(np.cos(rm.yaw[c] - h)) > 0.9))
        if not near.any():
            continue
        o = d[near] @ n
        lo = float((o - rm.width[c][near] / 2).min()) - 1.0
        hi = float((o + rm.width[c][near] / 2).max()) + 1.0
        mid = np.array([x, y]) + n * (lo + hi) / 2
        if mids and bool((np.hypot(*(np.asarray(mids) - mid).T) < 4.0).any()):
            continue
        ends = np.array([[x + n[0] * lo, y + n[1] * lo], [x + n[0] * hi, y + n[1] * hi]])
        if any(_on_a_lane(rm, e) for e in ends):
            continue  # a kerb end on some lane (a wider road than we saw, a road passing over)
        mids.append(mid)
        sites.append(ends.tolist())
        at_j.append(isj)
    return np.array(sites, float).reshape(-1, 2, 2), np.array(at_j, bool)


PAVE_SPACING = 2.0  # m between pavement points
PAVE_CLEAR = 0.3  # m a pavement point or path keeps from every lane's edge (as a site's kerb end)
PAVE_CORNER = 20.0  # m: longest straight pavement link between two pavement pieces (a corner)


@dataclass
class Pavements:
    """Where walkers walk between crossing sites.

    Nodes are the crossing sites' kerb ends (node ``2 * site + end``, at ``xy[node]``; node
    ``n ^ 1`` is the other end of the same site). ``legs[n]`` lists the walks along the pavement
    from node n to the nearest kerb ends reachable on foot without crossing a lane: ``(node,
    path (P, 2), length m)``, the path from (not including) n's position to the node's."""

    xy: np.ndarray  # (N, 2)
    legs: list  # per node: [(node, path, length)]
    points: np.ndarray  # (M, 2) the pavement points (for tests and plots)


def _clearance(rm: RoadMap, xy: np.ndarray, radius: float = 8.0) -> np.ndarray:
    from ..maps.spatial import lane_grid
    from .kernels import lane_clearance
    out = np.empty(len(xy))
    if len(xy):
        lane_clearance(*lane_grid(rm).args(), rm.pts, rm.width, np.ascontiguousarray(xy, float),
                       radius, out)
    return out


def _segment_clear(rm: RoadMap, a: np.ndarray, b: np.ndarray, step: float = 0.5) -> np.ndarray:
    """For segments a[i] -> b[i]: whether every point along them (every ``step`` m) is off the
    lanes by PAVE_CLEAR."""
    if len(a) == 0:
        return np.zeros(0, bool)
    n = np.maximum(np.ceil(np.hypot(*(b - a).T) / step).astype(np.int64), 1)
    t = np.concatenate([np.arange(k + 1) / k for k in n])
    seg = np.repeat(np.arange(len(a)), n + 1)
    pts = a[seg] + (b - a)[seg] * t[:, None]
    ok = _clearance(rm, pts) >= PAVE_CLEAR
    return np.logical_and.reduceat(ok, np.concatenate([[0], np.cumsum(n + 1)[:-1]]))


def pavement_network(rm: RoadMap, sites: np.ndarray, margin: float = 1.0,
                     max_leg: float = 150.0) -> Pavements:
    """The pavements beside the kerbs and the walks along them between crossing sites.

    A pavement runs beside every outermost driving lane (no driving neighbour on that side), its
    half width plus ``margin`` from its centre line (where the crossing sites' kerb ends are),
    sampled every PAVE_SPACING m; points within PAVE_CLEAR of any lane are dropped, which cuts
    the pavement where a junction's lanes reach it. Consecutive points link along a lane; the
    pieces link to each other by straight walks up to PAVE_CORNER m that stay off every lane
    (round a junction's corner, from one lane section to the next). Legs: Dijkstra from each
    kerb end to the first kerb ends met within ``max_leg`` m."""
    import heapq

    xy_nodes = sites.reshape(-1, 2).astype(float)
    N = len(xy_nodes)
    pts, piece = [], []  # pavement points and the piece (run of consecutive kept points) of each
    k = 0
    for lane in range(rm.n_lanes):
        if rm.junction[lane] >= 0:
            continue
        q = np.arange(rm.offset[lane], rm.offset[lane + 1])
        step = max(int(round(PAVE_SPACING / max(float(rm.ds[lane]), 1e-3))), 1)
        q = np.unique(np.concatenate([q[::step], q[-1:]]))
        for side, nb_ in ((1.0, rm.right[lane]), (-1.0, rm.left[lane])):
            if nb_ >= 0:
                continue
            h = rm.yaw[q]
            off = side * (rm.width[q] / 2 + margin)
            p = rm.pts[q] + np.stack([-np.sin(h), np.cos(h)], 1) * off[:, None]
            keep = _clearance(rm, p) >= PAVE_CLEAR
            run = np.cumsum(np.concatenate([[True], keep[1:] != keep[:-1]]))  # runs of kept points
            for r in np.unique(run[keep]):
                sel = p[run == r]
                pts.append(sel)
                piece.append(np.full(len(sel), k))
                k += 1
    P = np.concatenate(pts) if pts else np.zeros((0, 2))
    piece = np.concatenate(piece) if piece else np.zeros(0, np.int64)
    M = len(P)
    # graph over pavement points (0..M-1) and kerb-end nodes (M..M+N-1)
    V = np.concatenate([P, xy_nodes])
    adj: list[list[tuple[int, float]]] = [[] for _ in range(M + N)]

    def link_clear(a, b):
        """Link the node pairs (a[k], b[k]) whose straight walk stays off the lanes."""
        a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
        if not len(a):
            return
        ok = _segment_clear(rm, V[a], V[b])
        for i, j in zip(a[ok].tolist(), b[ok].tolist()):
            d = float(np.hypot(*(V[i] - V[j])))
            adj[i].append((j, d))
            adj[j].append((i, d))

    # along a piece: consecutive points (checked off the lanes between them)
    same = np.flatnonzero(piece[1:] == piece[:-1]) if M else np.zeros(0, np.int64)
    link_clear(same, same + 1)
    # between pieces: from each piece's ends to the nearest point of each other piece in reach
    if M:
        first = np.flatnonzero(np.concatenate([[True], piece[1:] != piece[:-1]]))
        last = np.concatenate([first[1:] - 1, [M - 1]])
        ends = np.unique(np.concatenate([first, last]))
        cand_a, cand_b = [], []
        for e in ends:
            d = np.hypot(P[:, 0] - P[e, 0], P[:, 1] - P[e, 1])
            near = np.flatnonzero((d < PAVE_CORNER) & (piece != piece[e]))
            if not len(near):
                continue
            order = near[np.lexsort((d[near], piece[near]))]
            firsts = order[np.concatenate([[True], piece[order][1:] != piece[order][:-1]])]
            cand_a.extend([e] * len(firsts))
            cand_b.extend(firsts.tolist())
        link_clear(cand_a, cand_b)
    # kerb ends: to the pavement points within 3 m (off the lanes on the way)
    if M and N:
        na, nb2 = [], []
        for n in range(N):
            d = np.hypot(P[:, 0] - xy_nodes[n, 0], P[:, 1] - xy_nodes[n, 1])
            near = np.flatnonzero(d < 3.0)
            na.extend([M + n] * len(near))
            nb2.extend(near.tolist())
        link_clear(na, nb2)
    # legs: Dijkstra from each kerb end; a kerb end reached ends that branch (walk to it, then cross)
    legs = []
    for n in range(N):
        src = M + n
        dist = {src: 0.0}
        prev = {}
        heap = [(0.0, src)]
        found = []
        while heap:
            d, u = heapq.heappop(heap)
            if d > dist.get(u, math.inf):
                continue
            if u >= M and u != src:
                found.append((u - M, d))
                continue
            for v, w in adj[u]:
                nd = d + w
                if nd <= max_leg and nd < dist.get(v, math.inf):
                    dist[v] = nd
                    prev[v] = u
                    heapq.heappush(heap, (nd, v))
        out = []
        for node, d in found:
            if node == n ^ 1 and d < 1.0:
                continue
            path, u = [], M + node
            while u != src:
                path.append(V[u])
                u = prev[u]
            out.append((node, np.array(path[::-1]), float(d)))
        legs.append(out)
    return Pavements(xy_nodes, legs, P)


def pavements(rm: RoadMap, sites: np.ndarray) -> Pavements:
    """:func:`pavement_network` for these sites, cached on the RoadMap (built on first use: only
    worlds with walkers need it)."""
    cache = rm.__dict__.setdefault("_pavements", {})
    key = np.asarray(sites, float).tobytes()
    if key not in cache:
        cache[key] = pavement_network(rm, np.asarray(sites, float))
    return cache[key]


def _on_a_lane(rm: RoadMap, p: np.ndarray, margin: float = 0.3) -> bool:
    """Whether point p lies on a lane (within its half width + ``margin`` of a centre point)."""
    from ..maps.spatial import edge_clearance, lane_grid

    reach = float(rm.width.max()) / 2 + margin  # no point farther can bring it within margin
    return edge_clearance(*lane_grid(rm).args(), rm.pts, rm.width, float(p[0]), float(p[1]),
                          reach) < margin


def predecessors(succ: np.ndarray) -> np.ndarray:
    """(L, P) the lanes whose successors (``succ``, -1 padded) include each lane, -1 padded."""
    into: list[list[int]] = [[] for _ in range(len(succ))]
    for a in range(len(succ)):
        for b in succ[a][succ[a] >= 0]:
            into[int(b)].append(a)
    out = np.full((len(succ), max(1, max(map(len, into), default=1))), -1, np.int64)
    for b, lanes in enumerate(into):
        out[b, :len(lanes)] = lanes
    return out


LINK_SHORT = 15.0  # m: a stretch outside junctions shorter than this from one junction to the
#                    next makes the two a chain (traffic.junction_chain)


def chain_links(rm: RoadMap, succ: np.ndarray, pred: np.ndarray | None = None) -> np.ndarray:
    """(L,) bool: lanes outside junctions on a stretch (lanes with one way in and one way on)
    that runs from a junction to a junction and is shorter than LINK_SHORT m: a roundabout's ring
    between two of its junctions, or a short link joining two junctions. ``pred``: the
    :func:`predecessors` of ``succ``, if at hand."""
    jn = rm.junction >= 0
    pred = predecessors(succ) if pred is None else pred
    link = np.zeros(rm.n_lanes, np.bool_)
    for lane in np.flatnonzero(~jn).tolist():
        total, ends = rm.length[lane], 0
        for nb in (succ, pred):
            x = lane
            while total < LINK_SHORT:
                nx = nb[x][nb[x] >= 0]
                if not len(nx):
                    break
                if jn[nx].all():
                    ends += 1
                    break
                if len(nx) > 1 or jn[nx].any():
                    break
                x = int(nx[0])
                total += rm.length[x]
        link[lane] = ends == 2 and total < LINK_SHORT
    return link


def chain_ids(rm: RoadMap, succ: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The links of :func:`chain_links` as kernel tables: ``link_id`` (L,) int64, the same number
    for the lanes of one link (a stretch of link lanes each the only way on from the one before),
    -1 for other lanes; ``via`` (L, 2) int64, for a junction lane leading into a link, its first
    and last lane (-1 otherwise)."""
    pred = predecessors(succ)
    link = chain_links(rm, succ, pred)
    jn = rm.junction >= 0
    link_id = np.full(rm.n_lanes, -1, np.int64)
    via = np.full((rm.n_lanes, 2), -1, np.int64)

    def after(x):  # the next lane of x's link, or -1
        nx = succ[x][succ[x] >= 0]
        return int(nx[0]) if len(nx) == 1 and link[nx[0]] else -1

    n = 0
    for lane in np.flatnonzero(link).tolist():
        pr = pred[lane][pred[lane] >= 0]
        if len(pr) == 1 and link[pr[0]] and after(int(pr[0])) == lane:
            continue  # not the first lane of its link
        x = lane
        while x >= 0 and link_id[x] < 0:
            link_id[x] = n
            x = after(x)
        n += 1
    for j in np.flatnonzero(jn).tolist():
        for e in succ[j][succ[j] >= 0].tolist():
            if link[e]:
                last = e
                while after(last) >= 0 and link_id[after(last)] == link_id[e]:
                    last = after(last)
                via[j] = (e, last)
                break
    return link_id, via


def way_storage(rm: RoadMap, succ: np.ndarray, conflict: JunctionPairs, clear: JunctionPairs,
                margin: float) -> np.ndarray:
    """(L,) float: for a junction lane that is a whole way through (its successors lie outside
    the junction), how much of it lies past the last point where a vehicle's rear still stands in
    the way of a crossing or diverging way (``clear`` plus ``margin``): room to queue in without
    blocking anyone but the ways merging with it; 0 for other lanes, and where a lane chained
    after it comes near a crossing way (``clear`` inf)."""
    jn = rm.junction >= 0
    store = np.zeros(rm.n_lanes)
    jl = np.flatnonzero(jn)
    for c in jl.tolist():
        nx = succ[c][succ[c] >= 0]
        if not len(nx) or jn[nx].any():
            continue
        ends = set(nx.tolist())
        top = 0.0
        lanes, row = conflict.row(c)
        _, crow = clear.row(c)
        for q in np.flatnonzero(row).tolist():
            o = int(lanes[q])
            if o == c:
                continue
            onx = succ[o][succ[o] >= 0]
            if row[q] == 1 and ends & set(onx.tolist()):
                continue  # it merges: a vehicle standing there is in the queue the other joins
            top = max(top, float(crow[q]))
        if math.isfinite(top):
            store[c] = max(0.0, float(rm.length[c]) - top - margin)
    return store


def traffic_successors(rm: RoadMap, max_gap: float = 2.5, min_cos: float = 0.9) -> np.ndarray:
    """The map's successor table (L, S), plus geometric continuations of dead ends.

    Exported OpenDRIVE networks often leave a lane with no successor although another lane starts
    where it ends (a link to a lane section the loader skipped as too short, an unlinked road
    border). Traffic following the links would stop there for good, so a lane without successors
    gets the lanes starting within ``max_gap`` m of its end (the nearest ones, within 0.5 m of the
    nearest) heading the same way (cos of the heading difference above ``min_cos``). Lanes with
    no such continuation stay dead ends, and so does a lane that closes up at its end (narrower
    than ``MIN_SPAWN_WIDTH`` there: a lane drop, whose traffic moves over before it; taken as
    continuing into the lane beside, esmini's multi_lanesections sent the expert's route along
    the taper to its very end, where it stood across both lanes)."""
    L = rm.n_lanes
    lists = [list(rm.successors(i)) for i in range(L)]
    dead = [i for i in range(L) if not lists[i]
            and rm.width[rm.offset[i + 1] - 1] >= MIN_SPAWN_WIDTH]
    if dead:
        first = rm.offset[:-1]
        starts, syaw = rm.pts[first], rm.yaw[first]
        for i in dead:
            e = rm.offset[i + 1] - 1
            d = np.hypot(starts[:, 0] - rm.pts[e, 0], starts[:, 1] - rm.pts[e, 1])
            ok = (d < max_gap) & (np.cos(syaw - rm.yaw[e]) > min_cos)
            ok[i] = False
            if ok.any():
                near = d[ok].min() + 0.5
                lists[i] = [int(j) for j in np.flatnonzero(ok & (d <= near))]
    out = np.full((L, max(1, max(len(x) for x in lists))), -1, np.int64)
    for i, x in enumerate(lists):
        out[i, :len(x)] = x
    return out


def linked_roadmap(rm: RoadMap) -> RoadMap:
    """``rm`` with :func:`traffic_successors`' links (and the predecessors they imply), for
    planning routes the way the traffic drives; the same lanes and indices. Cached on ``rm``."""
    view = rm.__dict__.get("_linked_view")
    if view is None:
        succ = traffic_successors(rm)
        if np.array_equal(succ, rm.succ):
            view = rm
        else:
            preds: list[list[int]] = [[] for _ in range(rm.n_lanes)]
            for a in range(rm.n_lanes):
                for b in succ[a][succ[a] >= 0]:
                    preds[int(b)].append(a)
            pred = np.full((rm.n_lanes, max(1, max(len(p) for p in preds))), -1, np.int64)
            for b, p in enumerate(preds):
                pred[b, :len(p)] = sorted(set(p))
            view = replace(rm, succ=succ, pred=pred)
        rm.__dict__["_linked_view"] = view
    return view


def traffic_tables(rm: RoadMap, traffic) -> dict:
    """All tables for a TrafficParams, cached on the RoadMap per relevant parameters."""
    cache = rm.__dict__.setdefault("_traffic_tables", {})
    box = traffic.junction_conflict == "boxes"
    ways = traffic.diverging_follow == "way"
    from_map = traffic.speed_limits == "map"
    key = (traffic.conflict_distance, traffic.speed_limit_kmh, traffic.lateral_accel, traffic.signals,
           traffic.signal_phases, box, ways, from_map)
    if key not in cache:
        succ = traffic_successors(rm)
        sites, at_j = crossing_sites(rm, succ)
        conflict = conflict_matrix(rm, traffic.conflict_distance, succ, box=box, ways=ways)
        cache[key] = dict(
            conflict=conflict,
            vmax=lane_speed_limits(rm, traffic.speed_limit_kmh / 3.6, traffic.lateral_accel,
                                   from_map),
            lights=light_table(rm, traffic.signals, succ=succ, phases=traffic.signal_phases),
            sites=sites,
            site_at_junction=at_j,
            succ=succ,
            # where each junction lane starts along its way through (0 everywhere with 'lane')
            way_start=way_start(rm, succ) if ways else np.zeros(rm.n_lanes),
        )
    tab = cache[key]
    if traffic.junction_release == "crossing" and "clear" not in tab:
        tab["clear"] = conflict_clear_points(rm, traffic.conflict_distance, tab["conflict"],
                                             tab["succ"], box=box)
    if traffic.junction_chain == "queue":
        if "link_id" not in tab:
            tab["link_id"], tab["via"] = chain_ids(rm, tab["succ"])
        skey = ("store", traffic.junction_release, traffic.release_margin)
        if skey not in tab:
            # queueing on a way through needs the points where it stops blocking crossing ways
            tab[skey] = (way_storage(rm, tab["succ"], tab["conflict"], tab["clear"],
                                     traffic.release_margin)
                         if traffic.junction_release == "crossing" else np.zeros(rm.n_lanes))
        tab["store"] = tab[skey]  # this TrafficParams' (the world reads it right after)
    return tab
