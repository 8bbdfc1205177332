"""A* routing on the lane graph, and the Route type the env and the autopilot follow.

Nodes are lanes; an edge is either a successor link (cost: the successor's length) or a change to
a same-direction neighbouring lane (cost: ``lane_change_cost`` metres), which is how a route reaches
a turn only the other lane of a multi-lane road can make. The heuristic is the straight-line
distance from a lane's end to the goal, which never overestimates the distance by road.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from .roadmap import MIN_SPAWN_WIDTH, MapError, RoadMap


class RouteError(MapError):
    """No route: the goal is unreachable, or no acceptable route could be sampled."""


LANE_CHANGE_GAP = 8.0  # metres travelled while changing lane (between lanes up to LANE_CHANGE_REF
#                        apart)
LANE_CHANGE_REF = 4.0  # m between two lanes' centre lines up to which a change takes
#                        LANE_CHANGE_GAP; further apart, proportionally longer (the same angle:
#                        across 8 m wide lanes an 8 m change ran at 45 degrees, and a car coming
#                        up behind in the lane met the expert; scenariogeneration's
#                        road_with_changing_lane_width). No lanes of the CARLA towns are over
#                        3.84 m apart
CLOSED_END_COST = 1000.0  # m a route pays to go on through a lane's end where it has closed up
# where a route changes lanes (plan_route's lane_changes): spread: n changes in a row over one
# stretch at 1/(n+1), 2/(n+1), ... of it (one change: its middle); middle: each at the middle of
# what is left of the stretch (the second of two at three quarters, close to the next junction:
# the placement before, which route files written before it was added keep)
LANE_CHANGES = ("spread", "middle")


@dataclass
class Route:
    """A lane-level route: segments ``(lane, s_from, s_to)`` and a dense polyline along them."""

    segments: list[tuple[int, float, float]]
    pts: np.ndarray  # (N, 2) polyline at ~1 m spacing
    yaw: np.ndarray  # (N,)
    cum: np.ndarray  # (N,) arc length from the route start
    lanes: np.ndarray  # (N,) lane of each polyline point

    @property
    def length(self) -> float:
        return float(self.cum[-1])

    @property
    def start(self) -> tuple[float, float, float]:
        return float(self.pts[0, 0]), float(self.pts[0, 1]), float(self.yaw[0])

    @property
    def goal(self) -> tuple[float, float]:
        return float(self.pts[-1, 0]), float(self.pts[-1, 1])

    def lane_sequence(self) -> list[int]:
        return [seg[0] for seg in self.segments]


def _segments_polyline(rm: RoadMap, segments, keep_empty: bool = False) -> Route:
    """The polyline through ``segments``. ``keep_empty``: a segment of no length after another
    (a lane change that lands at the goal, or straight into the next one) still gets its diagonal
    and its point, so the route ends on the goal's lane; without it (route files written before
    ``lane_changes``) such segments were dropped, and the route ended on an earlier lane."""
    pts, lanes = [], []
    for lane, s0, s1 in segments:
        if s1 - s0 < 1e-6 and not keep_empty:
            continue
        n = max(2, int(math.ceil((s1 - s0) / 1.0)) + 1)
        if pts:  # a lane change: fill the diagonal between the two lanes at 1 m spacing
            x, y, _ = rm.pose_at(lane, s0)
            gap = math.hypot(x - pts[-1][0], y - pts[-1][1])
            if gap > 1.0:
                x0, y0 = pts[-1]
                m = int(math.ceil(gap))
                for k in range(1, m):
                    pts.append((x0 + (x - x0) * k / m, y0 + (y - y0) * k / m))
                    lanes.append(lane)
        for s in np.linspace(s0, s1, n):
            x, y, _ = rm.pose_at(lane, s)
            if pts and abs(pts[-1][0] - x) < 1e-6 and abs(pts[-1][1] - y) < 1e-6:
                continue
            pts.append((x, y))
            lanes.append(lane)
    if len(pts) < 2:
        lane, s0, _ = segments[0]
        x, y, yaw = rm.pose_at(lane, s0)
        pts = [(x, y), (x + 0.01 * math.cos(yaw), y + 0.01 * math.sin(yaw))]
        lanes = [lane, lane]
    p = np.asarray(pts, float)
    d = np.diff(p, axis=0)
    cum = np.concatenate([[0.0], np.cumsum(np.hypot(d[:, 0], d[:, 1]))])
    tang = np.gradient(p, axis=0) if len(p) > 2 else np.repeat(d, 2, axis=0)
    return Route(list(segments), p, np.arctan2(tang[:, 1], tang[:, 0]), cum,
                 np.asarray(lanes, np.int64))


def _change_targets(rm: RoadMap, lane: int) -> list[int]:
    """The lanes a route may change to from ``lane``: its neighbours of the same direction,
    outside junctions."""
    if rm.junction[lane] >= 0:
        return []
    return [int(nb) for nb, same in ((rm.left[lane], rm.left_same_dir[lane]),
                                     (rm.right[lane], rm.right_same_dir[lane])) if nb >= 0 and same]


def plan_route(rm: RoadMap, start: tuple[int, float], goal: tuple[int, float], *,
               lane_change_cost: float = 25.0, lane_changes: str = "spread") -> Route:
    """Shortest route from ``(lane, s)`` to ``(lane, s)``. Raises RouteError if unreachable.
    ``lane_changes``: where its lane changes lie on their stretch (``LANE_CHANGES``)."""
    if lane_changes not in LANE_CHANGES:
        raise ValueError(f"lane_changes must be one of {', '.join(LANE_CHANGES)}; got "
                         f"{lane_changes!r}")
    l0, s0 = int(start[0]), float(start[1])
    lg, sg = int(goal[0]), float(goal[1])
    for lane, s, what in ((l0, s0, "start"), (lg, sg, "goal")):
        if not 0 <= lane < rm.n_lanes:
            raise RouteError(f"{what} lane {lane} does not exist in map {rm.name!r} "
                             f"(it has lanes 0..{rm.n_lanes - 1})")
        if not -1e-6 <= s <= rm.length[lane] + 1e-6:
            raise RouteError(f"{what} s={s:.2f} is outside lane {lane} (length {rm.length[lane]:.2f} m)")
    if l0 == lg and sg >= s0:
        return _segments_polyline(rm, [(l0, s0, sg)])
    gx, gy, _ = rm.pose_at(lg, sg)
    ends = rm.pts[rm.offset[1:] - 1]
    h = np.hypot(ends[:, 0] - gx, ends[:, 1] - gy)
    # g[node] = cost from the start to the END of that lane. Node START is the start lane
    # entered at s0; the start lane entered from a predecessor is the ordinary node l0.
    START = -1
    g = {START: rm.length[l0] - s0}
    parent: dict[int, tuple[int, str]] = {}
    heap = [(g[START] + h[l0], START)]
    closed = set()
    while heap:
        _, node = heapq.heappop(heap)
        if node in closed:
            continue
        closed.add(node)
        lane = l0 if node == START else node
        if lane == lg and node != START:
            break  # popped with f = true cost (h is 0 on the goal lane in the adjusted key)
        # on through a lane's end where it has closed up (a lane drop the file links on to the
        # lane it merges into: esmini's two_plus_one) only where no change before it leads there:
        # the expert followed such a link along the taper and stood in it, across the lane
        # coming the other way
        shut = CLOSED_END_COST if rm.width[rm.offset[lane + 1] - 1] < MIN_SPAWN_WIDTH else 0.0
        edges = [(int(n), rm.length[n] + shut, "succ") for n in rm.successors(lane)]
        edges += [(nb, lane_change_cost, "change") for nb in _change_targets(rm, lane)]
        for nxt, cost, kind in edges:
            if nxt == START:
                continue
            ng = g[node] + cost
            if ng < g.get(nxt, math.inf):
                g[nxt] = ng
                parent[nxt] = (node, kind)
                key = ng - (rm.length[nxt] - sg) if nxt == lg else ng + h[nxt]
                heapq.heappush(heap, (key, nxt))
    else:
        raise RouteError(f"goal (lane {lg}, s={sg:.1f}) is unreachable from start (lane {l0}, "
                         f"s={s0:.1f}) in map {rm.name!r}")
    if lg not in parent:
        raise RouteError(f"goal (lane {lg}, s={sg:.1f}) is unreachable from start (lane {l0}, "
                         f"s={s0:.1f}) in map {rm.name!r}")
    chain = [(lg, "end")]
    node = lg
    while node != START:
        prev, kind = parent[node]
        chain.append((prev, kind))
        node = prev
    chain.reverse()  # [(node, kind of edge leaving it), ...]
    segments: list[list] = []
    s_in = s0
    for i, (node, kind) in enumerate(chain):
        lane = l0 if node == START else node
        if kind == "end":
            segments.append([lane, s_in, sg])
        elif kind == "succ":
            segments.append([lane, s_in, float(rm.length[lane])])
            s_in = 0.0
        else:  # lane change to the next node's lane
            nxt = chain[i + 1][0]
            la, lb = float(rm.length[lane]), float(rm.length[nxt])
            # spread: r changes in a row from here (this one included) share the rest of the
            # lane, this one at 1 / (r + 1) of it (one change: the middle), or, where the goal
            # lies on the lane they lead to, the stretch up to the goal, so that the last lands
            # before it; middle: r = 1 always, over the rest of the lane (the changes before the
            # last ignore the goal: a goal two lanes over within the stretch was driven past)
            r, end = 1, la
            if lane_changes == "spread":
                while chain[i + r][1] == "change":
                    r += 1
                if chain[i + r][1] == "end":
                    end = min(la, sg * la / float(rm.length[lg]))

            def place(gap):
                s_out = s_in + max(0.0, (end - s_in) / (r + 1) - gap / 2)
                if chain[i + 1][1] == "end":  # must be on the goal lane before the goal
                    s_out = min(s_out, max(s_in, sg * la / lb - gap))
                # up to where the route leaves the lane it changes to (the goal, or its end)
                e_b = sg if chain[i + 1][1] == "end" else (lb if chain[i + 1][1] == "succ" else None)
                return _open_change(rm, lane, nxt, s_in, s_out, e_b,
                                    sg * la / lb - gap if chain[i + 1][1] == "end" else la, gap)

            gap = LANE_CHANGE_GAP
            s_out = place(gap)
            wide = _change_length(rm, lane, nxt, s_out, lb / la)
            if wide > gap:  # lanes far apart where it changes: a longer change, placed again
                gap = wide
                s_out = place(gap)
            segments.append([lane, s_in, s_out])
            s_in = min(lb, (s_out + gap) * lb / la)
    segs = [(int(a), float(b), float(max(b, c))) for a, b, c in segments]
    return _segments_polyline(rm, segs, keep_empty=lane_changes == "spread")


def _thin(rm: RoadMap, lane: int) -> np.ndarray:
    """Arc lengths of the points where ``lane`` is narrower than a car drives in."""
    o0, o1 = int(rm.offset[lane]), int(rm.offset[lane + 1])
    return rm.s[o0:o1][rm.width[o0:o1] < MIN_SPAWN_WIDTH]


def _change_length(rm: RoadMap, a: int, b: int, s: float, ratio: float) -> float:
    """The travel (m) a change from lane ``a`` at ``s`` to lane ``b`` (at ``s * ratio``) takes:
    ``LANE_CHANGE_GAP``, longer in proportion where the two lanes are over ``LANE_CHANGE_REF``
    apart there or a standard change's length on."""
    gap = LANE_CHANGE_GAP
    far = 0.0
    for d in (0.0, gap):  # across lane a's heading (the two lanes' points need not be abreast)
        xa, ya, ha = rm.pose_at(a, min(s + d, float(rm.length[a])))
        xb, yb, _ = rm.pose_at(b, min((s + d) * ratio, float(rm.length[b])))
        far = max(far, abs(-(xb - xa) * math.sin(ha) + (yb - ya) * math.cos(ha)))
    return gap * max(1.0, far / LANE_CHANGE_REF)


def _open_change(rm: RoadMap, a: int, b: int, s_in: float, s_out: float, e_b: float | None,
                 latest: float, gap: float = LANE_CHANGE_GAP) -> float:
    """Where on lane ``a`` a change to lane ``b`` starts, given the placement ``s_out`` (which
    it keeps where it can): while still partly on ``a`` the route keeps off stretches where
    ``a`` closes up, and it lands on ``b`` past the last stretch where ``b`` closes up before
    ``e_b`` (where the route leaves ``b``; None: not known). A lane that closes up and opens
    again (parking bays along a road: esmini's parking_demo) is a lane a car cannot drive along
    through its closed stretch; a route through it sent the expert into the next lane's traffic.
    No change where neither lane closes up anywhere (every shipped town)."""
    thin_a, thin_b = _thin(rm, a), _thin(rm, b)
    if len(thin_a) == 0 and len(thin_b) == 0:
        return s_out
    la, lb = float(rm.length[a]), float(rm.length[b])
    margin = 2.0
    lo, hi = s_in, min(latest, la - gap)
    after = thin_a[thin_a > s_in]
    if len(after):
        hi = min(hi, float(after.min()) - margin - gap)
    if e_b is not None:
        before = thin_b[thin_b < e_b]
        if len(before):
            lo = max(lo, (float(before.max()) + margin) * la / max(lb, 1e-3))
    if lo > hi:
        # no stretch open on both: where lane a closes within a change's length, at once (a
        # route starting on a lane drop's taper ran to its very end, beside the traffic moving
        # over there, and the expert stood in the taper: esmini's two_plus_one); else as planned
        return max(s_in, hi) if len(after) else s_out
    return min(max(s_out, lo), hi)


def route_between_points(rm: RoadMap, start_xy, goal_xy, **kw) -> Route:
    """Route between two world points, each snapped to the nearest lane facing any direction."""
    from .spatial import nearest_lane_point

    a = nearest_lane_point(rm, *start_xy)
    b = nearest_lane_point(rm, *goal_xy)
    return plan_route(rm, (a[0], a[1]), (b[0], b[1]), **kw)


def nearest_spawn(rm: RoadMap, x: float, y: float) -> int:
    """Index of the spawn point nearest (x, y) (where the next route of an episode starts)."""
    return int(np.argmin(np.hypot(rm.spawn[:, 0] - x, rm.spawn[:, 1] - y)))


def _out_lanes(rm: RoadMap, lane: int) -> list[int]:
    """:func:`plan_route`'s edges from ``lane``: its successors and :func:`_change_targets`."""
    return [int(n) for n in rm.successors(lane)] + _change_targets(rm, lane)


def _lane_components(rm: RoadMap) -> tuple[np.ndarray, list[list[int]]]:
    """(comp, after): the strongly connected components of the lane graph on
    :func:`plan_route`'s edges (``comp[lane]``, ids in reverse topological order), and for each
    component the components its lanes lead into (itself excluded). Cached on ``rm``."""
    hit = rm.__dict__.get("_lane_components")
    if hit is not None:
        return hit
    L = rm.n_lanes
    out = [_out_lanes(rm, a) for a in range(L)]
    index = np.full(L, -1, np.int64)
    low = np.zeros(L, np.int64)
    comp = np.full(L, -1, np.int64)
    on_stack = np.zeros(L, np.bool_)
    stack: list[int] = []
    n_comp, counter = 0, 0
    for root in range(L):  # Tarjan's algorithm, iterative (a town has tens of thousands of lanes)
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, i = work[-1]
            if i < len(out[v]):
                work[-1] = (v, i + 1)
                w = out[v][i]
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = n_comp
                    if w == v:
                        break
                n_comp += 1
    after: list[set] = [set() for _ in range(n_comp)]
    for a in range(L):
        for b in out[a]:
            if comp[b] != comp[a]:
                after[comp[a]].add(int(comp[b]))
    hit = rm.__dict__["_lane_components"] = (comp, [sorted(x) for x in after])
    return hit


def _reach_mask(rm: RoadMap, lane: int) -> np.ndarray:
    """(components,) bool: the components of :func:`_lane_components` whose lanes a route can
    reach from anywhere on ``lane`` after driving off it (each lane it leads into, and all the
    lanes those reach). Cached on ``rm`` per set of components ``lane`` leads into: a town whose
    lanes all reach each other needs one entry (a cache per lane held a set of every lane for each,
    gigabytes in a town of 20,000 lanes)."""
    comp, after = _lane_components(rm)
    starts = tuple(sorted({int(comp[n]) for n in _out_lanes(rm, lane)}))
    cache = rm.__dict__.setdefault("_reach_masks", {})
    hit = cache.get(starts)
    if hit is None:
        hit = np.zeros(len(after), np.bool_)
        todo = list(starts)
        hit[todo] = True
        while todo:
            for d in after[todo.pop()]:
                if not hit[d]:
                    hit[d] = True
                    todo.append(d)
        cache[starts] = hit
    return hit


def reachable_lanes(rm: RoadMap, lane: int) -> frozenset:
    """Lanes a route can reach from anywhere on ``lane`` (after driving off it), on
    :func:`plan_route`'s edges: successors and :func:`_change_targets`."""
    comp, _ = _lane_components(rm)
    return frozenset(np.flatnonzero(_reach_mask(rm, lane)[comp]).tolist())


def _reachable_spawns(rm: RoadMap, a: int) -> np.ndarray:
    """Spawn points a route from spawn point ``a`` can reach (ahead on its lane, or on a lane
    reachable from it), ``a`` excluded."""
    la, sa = int(rm.spawn_lane[a]), float(rm.spawn_s[a])
    comp, _ = _lane_components(rm)
    ok = _reach_mask(rm, la)[comp[rm.spawn_lane]] | ((rm.spawn_lane == la) & (rm.spawn_s >= sa))
    ok[a] = False
    return np.flatnonzero(ok)


def random_route(rm: RoadMap, rng: np.random.Generator, *, max_length: float = 3000.0,
                 min_length: float = 50.0, max_tries: int = 200, start: int | None = None) -> Route:
    """A* route between two distinct random spawn points, resampled while over ``max_length``.

    ``start`` fixes the start spawn index (the next route of an episode starts where the last ended).
    On a network where not every spawn point can reach every other (open road ends, one-way
    stubs), a goal drawn out of the start's reach is drawn again among the points it can reach
    (on a network where every point reaches every other, nothing changes: the same draws give the
    same routes).
    """
    n = len(rm.spawn)
    if n < 2:
        raise RouteError(f"map {rm.name!r} has {n} spawn point(s); a route needs two")
    last_err = None
    for _ in range(max_tries):
        a = int(rng.integers(n)) if start is None else int(start)
        b = int(rng.integers(n))
        if a == b:
            continue
        reach = _reachable_spawns(rm, a)
        if not np.isin(b, reach):
            if not len(reach):
                last_err = RouteError(f"no spawn point is reachable from spawn point {a} (lane "
                                      f"{int(rm.spawn_lane[a])}, s={float(rm.spawn_s[a]):.1f})")
                continue
            b = int(reach[rng.integers(len(reach))])
        if math.hypot(*(rm.spawn[a, :2] - rm.spawn[b, :2])) > max_length:
            continue  # no route is shorter than the straight line (a large town: no search)
        try:
            r = plan_route(rm, (rm.spawn_lane[a], rm.spawn_s[a]), (rm.spawn_lane[b], rm.spawn_s[b]))
        except RouteError as exc:
            last_err = exc
            continue
        if min_length <= r.length <= max_length:
            return r
    raise RouteError(f"no route between spawn points of {rm.name!r} with length in "
                     f"[{min_length:.0f}, {max_length:.0f}] m after {max_tries} tries"
                     + (f"; last failure: {last_err}" if last_err else ""))
