"""Where the ego is on its route, and what lies ahead on it: the one implementation of route
location, stop lines and the corridor lead.

Reads only a Route, the ego's pose and a WorldSnapshot, so it serves every backend. Used by the
env (``envs.tracker`` re-exports it) for its observations and per-step facts, and by the autopilot
(``sim.autopilot``) to drive; it lives in the sim layer because the sim layer may not import the
envs.
"""

from __future__ import annotations

import math

import numpy as np

from ..maps.routing import Route
from . import kernels
from .snapshot import ActorClass, Actors, TrafficLights

LOCATE_BACK, LOCATE_AHEAD = 5, 60  # route points searched around the last position (1 m apart)
SAME_CROSSING = 10.0  # m: stops of one light closer than this along a route are one crossing
PARALLEL_DEG = 10.0  # an actor this close to the route's heading (either way) drives along it


def route_stops(route: Route, lights: TrafficLights, *, max_dist: float = 1.5,
                max_dyaw: float = math.radians(60)) -> list[tuple[float, int]]:
    """``(arc length, light index)`` of every stop line the route crosses, in route order.

    A route crosses a light's stop line where one of its points lies within ``max_dist`` of a
    stop-line segment while heading the way the light's traffic goes."""
    seg, owner = lights.stop_line_segments()
    if len(seg) == 0:
        return []
    a, b = seg[:, 0], seg[:, 1]  # (S, 2)
    ab = b - a
    L2 = np.maximum((ab ** 2).sum(1), 1e-9)
    p = route.pts
    # points near any stop line at all (cheap prefilter on the segment midpoints)
    mid = 0.5 * (a + b)
    reach = np.sqrt(L2) / 2 + max_dist
    stops = []
    for k in range(len(seg)):
        near = np.flatnonzero(np.abs(p[:, 0] - mid[k, 0]) + np.abs(p[:, 1] - mid[k, 1]) < 2 * reach[k])
        if len(near) == 0:
            continue
        ap = p[near] - a[k]
        t = np.clip((ap @ ab[k]) / L2[k], 0.0, 1.0)
        d = np.hypot(*(ap - t[:, None] * ab[k]).T)
        li = int(owner[k])
        dyaw = np.abs((route.yaw[near] - lights.yaw[li] + np.pi) % (2 * np.pi) - np.pi)
        sel = (d < max_dist) & (dyaw < max_dyaw)
        cn = route.cum[near]
        while sel.any():  # one stop per crossing: a route may pass the same light again later
            first = cn[sel][0]
            group = sel & (cn < first + 2 * max_dist)  # this crossing, not a later one
            stops.append((float(cn[group][np.argmin(d[group])]), li))
            sel &= ~group
    # a light with several stop-line segments (one per lane) is one stop per crossing, the first
    out: list[tuple[float, int]] = []
    for c, li in sorted(set(stops)):
        if not any(l2 == li and c - c2 < SAME_CROSSING for c2, l2 in out):
            out.append((c, li))
    return out


def next_stop(stops: list[tuple[float, int]], s: float, offset: float = 0.0,
              behind: float = 0.0) -> tuple[float, int]:
    """The first stop of ``stops`` (:func:`route_stops`) not yet passed at arc length ``s``:
    ``(cum - s - offset, light index)``, where a stop counts as passed once that distance is below
    ``-behind``; ``(inf, -1)`` past the last one."""
    for cum, li in stops:
        d = cum - s - offset
        if d >= -behind:
            return d, li
    return math.inf, -1


def corridor_lead(route: Route, idx: int, here: float, ex: float, ey: float, actors: Actors,
                  ego_half_length: float, ego_half_width: float, horizon: float = 50.0,
                  margin: float = 0.5, *, search: float | None = None, measure: str = "centre",
                  ignore: int = -1, parallel_reach: bool = False,
                  in_junction: np.ndarray | None = None, boxes: bool = False):
    """Nearest actor in the ego's corridor along the route ahead: ``(gap m, index)``, or
    ``(inf, -1)``. Actors beside the ego (not ahead of its front) are ignored.

    The corridor is the route from point ``idx`` (arc length ``here``) to ``horizon`` m ahead,
    ``ego_half_width + margin`` plus the other box's lateral reach either side; only actors within
    ``search`` m of the ego (default ``horizon + 10``) are looked at, and never actor ``ignore``
    (an index into ``actors``; -1: none). ``measure`` says where an
    actor is along the route:

    - ``"centre"`` (the env's lead fact): at the route point nearest its centre, less its half
      length along the route: the gap is bumper to bumper;
    - ``"entry"`` (the autopilot's, cautious): at the first route point where its box reaches
      into the corridor, less its half length: shorter than bumper to bumper by about the
      corridor's half width, a margin the autopilot keeps for actors cutting in.

    An actor's lateral reach is the smaller of its half length and its half width plus 0.6 m
    (it may be turning in). With ``parallel_reach`` an actor heading along the route, either way
    (within ``PARALLEL_DEG`` of the route's heading at the nearest point), reaches by its half
    width only: a car standing in the next lane is not in our way, also where lanes are 3 m wide
    (with the allowance it was: 1 m + 0.5 m + 1 m + 0.6 m > 3 m); once it turns in it is
    counted with the allowance again.

    ``boxes`` (the autopilot's): an actor also counts where its box (not only the disc of its
    lateral reach round its centre) comes within ``ego_half_width + margin`` (plus the turning-in
    allowance, at most its half length less its half width) of a route point, measured from there
    as "entry" does. A car standing in the lane
    the route leaves, at an angle to the route's diagonal, reaches towards it with a rear corner 2 m
    from its centre; at the nearest point to its centre, on the lane beyond, it was "beside"
    (esmini's multi_lane_3way_intersection: the ego changing lanes 15 m before a junction met the
    corner of the car queued there).

    ``in_junction`` (per route point, whether it lies in a junction) applies the world's
    grade-separation rule: a vehicle crossing the route at more than about 45 degrees
    (``kernels.GRADE_SEPARATED_COS``) where the route is outside junctions for its length and 3 m
    more either way passes over or under it (a bridge), and is not in the way. Walkers always are.

    Only actors whose place along the route (the route point nearest their centre) is ahead of the
    ego's front count, with either measure (an actor crossing just ahead enters the corridor
    beside the ego's front: it counts). Gaps are measured from the ego, also where it is still
    behind the route's first point (a route that starts ahead of it).
    """
    if measure not in ("centre", "entry"):
        raise ValueError(f"corridor_lead: unknown measure {measure!r}; valid: 'centre', 'entry'")
    if len(actors) == 0:
        return math.inf, -1
    pos, ext = actors.pos, actors.extent
    near = np.flatnonzero(np.hypot(pos[:, 0] - ex, pos[:, 1] - ey)
                          < (horizon + 10.0 if search is None else search))
    if ignore >= 0:
        near = near[near != ignore]
    if len(near) == 0:
        return math.inf, -1
    k = min(int(np.searchsorted(route.cum, here + horizon)), len(route.pts) - 1)
    pts = route.pts[idx:k + 1]
    if len(pts) == 0:
        return math.inf, -1
    d = np.hypot(pts[None, :, 0] - pos[near, None, 0], pts[None, :, 1] - pos[near, None, 1])
    allowance = np.full(len(near), 0.6)
    if parallel_reach:
        j = np.argmin(d, axis=1)
        dyaw = actors.yaw[near] - route.yaw[idx + j]
        allowance[np.abs(np.cos(dyaw)) >= math.cos(math.radians(PARALLEL_DEG))] = 0.0
    reach = np.minimum(ext[near, 0], ext[near, 1] + allowance)  # lateral reach of the other box
    hit = d < (reach + ego_half_width + margin)[:, None]
    box_only = np.zeros(len(near), np.bool_)
    if boxes:  # each route point's distance to each actor's box
        c, s_ = np.cos(actors.yaw[near])[:, None], np.sin(actors.yaw[near])[:, None]
        dx, dy = pts[None, :, 0] - pos[near, None, 0], pts[None, :, 1] - pos[near, None, 1]
        ox = np.maximum(np.abs(dx * c + dy * s_) - ext[near, 0, None], 0.0)
        oy = np.maximum(np.abs(-dx * s_ + dy * c) - ext[near, 1, None], 0.0)
        # the turning-in allowance, as for the disc, reaches no further than the box is long (a
        # walker, as wide as long, turns in place: it counts by its box only)
        allow = np.minimum(allowance, np.maximum(ext[near, 0] - ext[near, 1], 0.0))
        box_hit = np.hypot(ox, oy) < (ego_half_width + margin + allow)[:, None]
        box_only = box_hit.any(axis=1) & ~hit.any(axis=1)
        hit[box_only] = box_hit[box_only]  # those the disc finds are measured as before
    # the ego behind the route's first point (a route that starts ahead of it: one chained from
    # a goal it has not quite reached, or from the spawn point nearest that goal) is measured from
    # where it is, so an actor just past that point is ahead of it, not beside it
    behind = 0.0
    if idx == 0:
        behind = max(0.0, -((ex - pts[0, 0]) * math.cos(route.yaw[0])
                            + (ey - pts[0, 1]) * math.sin(route.yaw[0])))
    best, who = math.inf, -1
    for a in np.flatnonzero(hit.any(axis=1)):
        k = near[a]
        j = int(np.argmin(d[a]))  # the route point nearest the actor: its place along the route
        place = float(route.cum[idx + j]) - here + behind
        if place <= ego_half_length - 0.5:
            continue  # beside us or behind, not ahead of our front
        if in_junction is not None and actors.cls[k] != ActorClass.WALKER and \
                abs(math.cos(actors.yaw[k] - route.yaw[idx + j])) < kernels.GRADE_SEPARATED_COS:
            c = route.cum[idx + j]
            lo, hi = np.searchsorted(route.cum, (c - ext[k, 0] - 3.0, c + ext[k, 0] + 3.0))
            if not in_junction[lo:hi + 1].any():
                continue  # crossing on another level
        if measure == "entry" or box_only[a]:
            along = float(route.cum[idx + int(np.argmax(hit[a]))]) - here + behind
            half = float(ext[k, 0])
        else:
            along = place
            dyaw = float(actors.yaw[k] - route.yaw[idx + j])
            half = abs(ext[k, 0] * math.cos(dyaw)) + abs(ext[k, 1] * math.sin(dyaw))  # along the route
        g = along - ego_half_length - half
        if g < best:
            best, who = g, int(k)
    return best, who


def lane_changes(route: Route, roadmap) -> list[tuple[int, int]]:
    """Every lane change of a route: ``(i, code)`` where point i is the last on the old lane and
    point i + 1 the first on its left (code 5, ``change_left``) or right (6) neighbour."""
    lanes = route.lanes
    out = []
    for i in np.flatnonzero(lanes[1:] != lanes[:-1]):
        a, b = int(lanes[i]), int(lanes[i + 1])
        if roadmap.left[a] == b:
            out.append((int(i), 5))
        elif roadmap.right[a] == b:
            out.append((int(i), 6))
    return out


#: High-level route commands (CARLA's ``RoadOption`` values), the ``command`` fact.
COMMANDS = {1: "left", 2: "right", 3: "straight", 4: "follow", 5: "change_left", 6: "change_right"}


def route_commands(route: Route, roadmap, horizon: float = 20.0,
                   turn_angle: float = math.radians(30)) -> np.ndarray:
    """The command (``COMMANDS`` code) at every route point, computed once per route.

    A junction passage (a run of route points on junction lanes) is a left / right turn when the
    heading changes by more than ``turn_angle`` between entering and leaving it (CARLA's frame:
    a right turn increases yaw), else straight; a lane change is a change to the previous lane's
    left or right neighbour. Each point takes the command of the first such event whose start
    lies within ``horizon`` metres ahead (a junction keeps its command until it is left), else
    follow-lane (4)."""
    n = len(route.pts)
    out = np.full(n, 4, np.int8)
    lanes = route.lanes
    in_junc = roadmap.junction[lanes] >= 0
    events = []  # (first index, last index, code)
    change = {i + 1: code for i, code in lane_changes(route, roadmap)}
    i = 0
    while i < n:
        if in_junc[i]:
            j = i
            while j + 1 < n and in_junc[j + 1]:
                j += 1
            a = max(i - 1, 0)
            dyaw = (route.yaw[j] - route.yaw[a] + math.pi) % (2 * math.pi) - math.pi
            code = 3 if abs(dyaw) <= turn_angle else (2 if dyaw > 0 else 1)
            events.append((i, j, code))
            i = j + 1
            continue
        if i in change and not in_junc[i - 1]:
            events.append((i, i, change[i]))
        i += 1
    cum = route.cum
    for a, b, code in reversed(events):  # nearer events overwrite farther ones
        lo = int(np.searchsorted(cum, cum[a] - horizon, side="left"))
        out[lo:b + 1] = code
    return out


class RouteTracker:
    """The ego's position along a route: arc length, signed lateral offset (+ right), heading
    error, and the route ahead."""

    def __init__(self, route: Route):
        self.route = route
        self.idx = 0
        self.s = 0.0
        self.lateral = 0.0
        self.heading_error = 0.0

    @property
    def remaining(self) -> float:
        return float(self.route.length - self.s)

    def locate(self, x: float, y: float, yaw: float | None = None) -> int:
        """The route point nearest (x, y), searched a few points back and ``LOCATE_AHEAD`` ahead
        of the last one (so a route that passes near itself is followed in order); sets and
        returns ``idx``. ``yaw`` (the expert's): only among the points whose heading is within
        90 degrees of it, where there are any: a route into a roundabout, once round it and out
        again along the arm it came by passes its own way out where it enters the ring, 40 m on,
        and the expert located there left out the ring and drove off the road (CommonRoad's
        roundabout)."""
        r = self.route
        lo, hi = max(self.idx - LOCATE_BACK, 0), min(self.idx + LOCATE_AHEAD, len(r.pts))
        d = (r.pts[lo:hi, 0] - x) ** 2 + (r.pts[lo:hi, 1] - y) ** 2
        if yaw is not None:
            facing = np.cos(r.yaw[lo:hi] - yaw) > 0.0
            if facing.any():
                d = np.where(facing, d, np.inf)
        self.idx = lo + int(np.argmin(d))
        return self.idx

    def update(self, x: float, y: float, yaw: float) -> float:
        """Locate the ego; returns the arc-length progress since the last update (m)."""
        r = self.route
        n = len(r.pts)
        i = self.locate(x, y)
        # project onto the segment after (or before) the nearest point
        j = max(i if i + 1 < n else i - 1, 0)
        p0, seg, L, t = self._project(j, x, y)
        if t < 0.0 and j > 0:
            j -= 1
            p0, seg, L, t = self._project(j, x, y)
        t = min(max(t, 0.0), 1.0)
        s = float(r.cum[j] + t * L)
        if L > 1e-9:
            tx, ty = seg[0] / L, seg[1] / L
        else:
            tx, ty = math.cos(r.yaw[j]), math.sin(r.yaw[j])
        qx, qy = p0[0] + t * seg[0], p0[1] + t * seg[1]
        self.lateral = float(-(x - qx) * ty + (y - qy) * tx)  # + to the right (CARLA's frame)
        self.heading_error = float((yaw - math.atan2(ty, tx) + math.pi) % (2 * math.pi) - math.pi)
        progress = s - self.s
        self.s = s
        return progress

    def _project(self, j: int, x: float, y: float):
        """Segment j of the route (start, vector, length) and the position of (x, y) along it
        as a fraction of its length (unclipped)."""
        pts = self.route.pts
        p0 = pts[j]
        seg = pts[min(j + 1, len(pts) - 1)] - p0
        L = math.hypot(seg[0], seg[1])
        t = ((x - p0[0]) * seg[0] + (y - p0[1]) * seg[1]) / (L * L) if L > 1e-9 else 0.0
        return p0, seg, L, t

    def points_ahead(self, length: float) -> np.ndarray:
        r = self.route
        k = min(int(np.searchsorted(r.cum, self.s + length)) + 1, len(r.pts))
        return r.pts[max(self.idx - 1, 0):k]

    def waypoints(self, x: float, y: float, yaw: float, k: int, spacing: float) -> np.ndarray:
        """The next ``k`` route points every ``spacing`` m in the ego frame (forward, right),
        scaled by ``k * spacing`` and clipped to [-1, 1]. Past the goal they repeat the goal."""
        r = self.route
        s = self.s + spacing * np.arange(1, k + 1)
        px = np.interp(s, r.cum, r.pts[:, 0]) - x
        py = np.interp(s, r.cum, r.pts[:, 1]) - y
        c, sn = math.cos(yaw), math.sin(yaw)
        out = np.empty((k, 2), np.float32)
        scale = 1.0 / (k * spacing)
        out[:, 0] = (px * c + py * sn) * scale
        out[:, 1] = (-px * sn + py * c) * scale
        return np.clip(out, -1.0, 1.0, out=out)
