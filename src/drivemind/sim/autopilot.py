"""A route-following autopilot: pure pursuit for steering, IDM for speed.

It reads only a WorldSnapshot, the RoadMap and a Route, so it drives the ego of any backend. It
stops for actors in its corridor along the route and for red (and stoppable yellow) lights at the
stop lines its route crosses; where it is on its route, the stop lines and the corridor come from
:mod:`drivemind.sim.tracking`, the same code as the env's facts. Before a junction it gives way
to every vehicle on a junction lane that crosses or merges with its own way through (inside the
junction, or coming up to it and due at the crossing before the ego would be through); once it
can no longer stop comfortably short of the junction it goes on. Before a lane change of its
route it waits while the target lane is taken beside it. It passes an actor that stands in its
lane, not queued, where a same-direction lane beside it is free (:meth:`Autopilot._plan_pass`),
else waits behind it. Used as the sanity baseline, to collect frames, and to drive the ego in
simulator benchmarks and demos.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..maps.roadmap import RoadMap
from ..maps.routing import Route, RouteError, plan_route, random_route
from ..maps.spatial import lane_grid, nearest_point
from .config import EgoParams, SimConfig
from .kernels import obb_overlap
from .tables import linked_roadmap
from .snapshot import VEHICLE_CLASSES, ActorClass, Actors, LightState, WorldSnapshot
from .tracking import RouteTracker, corridor_lead, lane_changes, next_stop, route_stops
from .world import LiteWorld


JUNCTION_LOOKAHEAD = 25.0  # m from our nose to a junction within which we decide who goes first
NEXT_ROUTE_MIN = 50.0  # m: the shortest next route new_route_from takes
COMMIT_DECEL = 6.0  # m/s^2: braking it would take to stop before the junction beyond which we go on
YIELD_MARGIN = 1.5  # s: we let a vehicle go first unless we are through the crossing this long
#                     before it reaches it
CLEARANCE = 2.8  # m: lane centre lines closer than this cannot be driven side by side
SHORT_LINK_MARGIN = 2.0  # m beyond our length a stretch between two junctions needs for us to
#                          stand on it (shorter: the two are crossed as one)
EXIT_TAIL = 6.0  # m of our exit lane counted as part of the crossing (vehicles merging in)
PASS_AFTER = 3.0  # s the actor ahead in our lane has stood before we pass it
PASS_RANGE = 30.0  # m: we plan a pass when the standing actor is at most this far ahead
PASS_OFFSET = 2.75  # m: the most we move over (inside the env's 3 m off-route limit: we are then
#                     most of the way into the next lane, a car-sized actor's side 0.6 m clear)
PASS_SIDE = 0.3  # m: planned side clearance to the actor we pass (less: no pass)
PASS_BACK = 12.0  # m over which we move back in, ending this far past the standing actor + 3 m
PASS_CLEAR = 10.0  # m past the end of the pass with no junction, stop line or lane change
CHAIN_STEPS = 4  # lanes on along which the lane beside is still the one a lane change moves onto
QUEUE_SPEED = 1.0  # m/s: a vehicle ahead in the lane we change to, slower than this, is joined
#                    from behind rather than waited for (_lane_taken)
WALKER_AHEAD = 1.5  # s: we keep clear of where a walker on the move will be this soon (as the
#                     traffic does, traffic.walker_anticipate): seen only where it was, a walker
#                     stepping in from the side entered our corridor too late to stop (Town05
#                     drivevlm seed 1)
_VEHICLE = np.zeros(256, bool)  # indexed by ActorClass code
_VEHICLE[[int(c) for c in VEHICLE_CLASSES]] = True


class Autopilot:
    def __init__(self, roadmap: RoadMap, route: Route, lane_light: np.ndarray | None = None,
                 ego: EgoParams | None = None, target_speed: float = 8.0, lat_accel: float = 2.0,
                 s0: float = 3.0, T: float = 1.4, a: float = 2.0, b: float = 3.5,
                 pass_standing: bool = True):
        # the links the traffic follows (a map whose links leave dead ends, or point back to the
        # lane's own start, is continued geometrically): the same lanes; the junctions' approach
        # lanes, which we give way to, are then the ones the traffic comes in on
        self.map, self.ego = linked_roadmap(roadmap), ego or EgoParams()
        self.pass_standing = pass_standing
        self.passes = 0  # passes started
        self.lane_light = lane_light
        self.target_speed, self.lat_accel = target_speed, lat_accel
        self.s0, self.T, self.a, self.b = s0, T, a, b
        self._grid = lane_grid(roadmap)
        self._last = (-2, np.zeros(0, np.int64), np.zeros(0))  # frame, actor ids and speeds
        self._moved_to = None  # (x, y) restart_elsewhere put the ego at, until a snapshot shows it
        self.set_route(route)

    def set_route(self, route: Route) -> None:
        self.route = route
        self.tracker = RouteTracker(route)
        self._pass = None  # the pass in progress: dict (see _plan_pass)
        self._stood = (-1, 0.0)  # id of the actor ahead in our corridor, seconds it has stood
        r = route
        yaw = np.unwrap(r.yaw)
        w = 3
        kappa = np.zeros(len(yaw))
        if len(yaw) > w:
            seg = np.maximum(r.cum[w:] - r.cum[:-w], 1e-3)
            kappa[:-w] = np.abs(yaw[w:] - yaw[:-w]) / seg
        self.vcurve = np.sqrt(self.lat_accel / np.maximum(kappa, 1e-4))
        self.in_junction = self.map.junction[r.lanes] >= 0
        # the stop lines the route crosses (sim.tracking.route_stops), from the first snapshot's
        # lights (every backend's snapshot carries them)
        self.stops: list[tuple[float, int]] | None = None
        self.crossings = [_crossing(self.map, r, i, self.vcurve) for i in range(len(r.lanes) - 1)
                          if self.in_junction[i + 1] and not self.in_junction[i]]
        # lane changes: (arc length where the diagonal starts, where it ends, lateral offset of
        # the target lane, + to the right)
        self.changes = []
        rm = self.map
        for i, _ in lane_changes(r, rm):
            a, b = int(r.lanes[i]), int(r.lanes[i + 1])
            qb = rm.lane_points(b)
            j = i + 1  # the first point on lane b's centre line: where the diagonal ends
            while j + 1 < len(r.lanes) and _polyline_distance(qb, *r.pts[j]) > 0.3:
                j += 1
            qa = rm.lane_points(a)
            ka = int(np.argmin(np.hypot(qa[:, 0] - r.pts[i, 0], qa[:, 1] - r.pts[i, 1])))
            ha = float(rm.yaw[rm.offset[a] + ka])
            # lane b's offset beside lane a where the diagonal starts, across lane a's heading
            # there: from the diagonal's chord (before), a change inside a bend (Town06) read as
            # 0.5 m over instead of 3.5 m, and the check looked for cars in the wrong place
            kb = int(np.argmin(np.hypot(qb[:, 0] - r.pts[i, 0], qb[:, 1] - r.pts[i, 1])))
            dx, dy = qb[kb, 0] - qa[ka, 0], qb[kb, 1] - qa[ka, 1]
            side = -dx * math.sin(ha) + dy * math.cos(ha)
            self.changes.append((float(r.cum[i]), float(r.cum[j]), float(side)))

    def new_route_from(self, rng: np.random.Generator, x: float, y: float,
                       max_length: float = 3000.0) -> Route:
        """Follow a new random route from where the current one ends (the ego's own lane, so it
        does not cut across to a spawn point on the next lane), to a random spawn point; if none
        of 50 draws can be reached from there, to the nearest spawn point ahead of (x, y) that can
        (:func:`route_ahead`). Raises :class:`RouteError` when there is none (an open road end: the
        caller starts the ego elsewhere, :func:`clear_start`). Before, the route started at the
        nearest spawn point ahead itself, and the ego cut across the lanes between (esmini's
        e6mini-lht: two lanes at 7 m/s, into a motorcycle). Planned on the links the
        traffic follows (:func:`~drivemind.sim.tables.linked_roadmap`: a map whose links leave
        dead ends still gives a route on)."""
        rm = linked_roadmap(self.map)
        lane, _, s_end = self.route.segments[-1]
        route = None
        for _ in range(50):
            b = int(rng.integers(len(rm.spawn)))
            try:
                r = plan_route(rm, (int(lane), float(s_end)), (rm.spawn_lane[b], rm.spawn_s[b]))
            except RouteError:
                continue
            if NEXT_ROUTE_MIN <= r.length <= max_length:
                route = r
                break
        if route is None:
            route = route_ahead(rm, (int(lane), float(s_end)), x, y, float(self.route.yaw[-1]),
                                max_length)
        if route is None:
            raise RouteError(f"no route on from ({x:.1f}, {y:.1f}) on map {rm.name!r}: the lane "
                             f"ends in an open road end and no spawn point ahead in the driving "
                             f"direction can be reached (restart elsewhere: clear_start)")
        self.set_route(route)
        return self.route

    def restart_elsewhere(self, world: LiteWorld, rng: np.random.Generator) -> bool:
        """After :meth:`new_route_from` raised :class:`RouteError` (an open road end): take a
        random route whose start no actor is near (:func:`clear_start`) and move the ego there;
        False when there is none now: the ego leaves the network until there is
        (:meth:`LiteWorld.park_ego`), and the caller asks again later."""
        route = clear_start(world, rng)
        if route is None:
            if not world.ego_parked:
                world.park_ego()
            return False
        self.set_route(route)
        world.place_ego(route.start)
        self._moved_to = route.start[:2]
        return True

    @property
    def idx(self) -> int:
        """The route point we are at (:meth:`RouteTracker.locate`)."""
        return self.tracker.idx

    @property
    def progress(self) -> float:
        return float(self.route.cum[self.idx])

    @property
    def done(self) -> bool:
        return self.route.length - self.progress < 3.0

    def act(self, snap: WorldSnapshot) -> tuple[float, float]:
        if self._moved_to is not None:
            # just moved (restart_elsewhere): a snapshot taken before shows the ego where it
            # was; located from there, it found itself at its new route's end, 60 m ahead,
            # planned on from there, and drove through a queue it did not look at (esmini's
            # simple_4way_intersection). It stands until a snapshot shows it at its new start.
            if math.hypot(snap.ego.x - self._moved_to[0], snap.ego.y - self._moved_to[1]) > 1.0:
                return 0.0, -1.0
            self._moved_to = None
        e, r, p = snap.ego, self.route, self.ego
        self.tracker.locate(e.x, e.y, e.yaw)
        if self.stops is None:
            self.stops = route_stops(r, snap.lights)
        here = r.cum[self.idx]
        if self._pass is not None and here >= self._pass["s3"]:
            self._pass = None  # back on the route's lane
        # --- steering: pure pursuit on a point ld metres ahead (moved over while passing), from
        # a point half-way between the box centre and the rear axle, on a point 1 m + 0.5 s x
        # speed ahead (2-12 m): from the box centre, 4-12 m ahead (before), the ego cut 1.2 m
        # inside a 6.5 m hairpin (on Town07, into the oncoming lane); from the rear axle, as the
        # law is derived, it swung 0.7 m wide on the way out; half-way, within 0.3 m
        ld = float(np.clip(1.0 + 0.5 * e.speed, 2.0, 12.0))
        if any(c0 - ld <= here <= c1 for c0, c1, _ in self.changes):
            # through a lane change of the route the point stays 4-12 m ahead, as before: the
            # route's diagonal can be steep (25 degrees on parking_demo), and followed closely
            # the ego was over before the lane-change check had seen the car beside it
            ld = float(np.clip(3.0 + 0.6 * e.speed, 4.0, 12.0))
        rx = e.x - 0.25 * p.wheelbase * math.cos(e.yaw)
        ry = e.y - 0.25 * p.wheelbase * math.sin(e.yaw)
        j = min(int(np.searchsorted(r.cum, here + ld)), len(r.pts) - 1)
        dx, dy = r.pts[j, 0] - rx, r.pts[j, 1] - ry
        if self._pass is not None:
            o = self._pass_offset(float(r.cum[j]))
            dx -= o * math.sin(r.yaw[j])
            dy += o * math.cos(r.yaw[j])
        c, s = math.cos(e.yaw), math.sin(e.yaw)
        lx, ly = dx * c + dy * s, -dx * s + dy * c
        alpha = math.atan2(ly, max(lx, 1e-3))
        delta = math.atan2(2.0 * p.wheelbase * math.sin(alpha), max(math.hypot(lx, ly), 1e-3))
        steer = float(np.clip(delta / p.max_steer, -1.0, 1.0))
        # --- speed: curvature over the next 25 m, then IDM against the nearest obstacle
        k = min(int(np.searchsorted(r.cum, here + 25.0)), len(r.pts) - 1)
        v0 = min(self.target_speed, float(self.vcurve[self.idx:k + 1].min()) if k > self.idx else
                 self.target_speed)
        v0 = max(v0, 2.0)
        remaining = r.length - here
        gap = remaining + self.s0 - 1.0  # come to rest about a metre past the goal
        gap = min(gap, self._corridor_gap(snap, here))
        if self._pass is not None:
            gap = min(gap, self._passed_gap(snap))
        gap = min(gap, self._light_gap(snap, here))
        gap = min(gap, self._junction_gap(snap, here))
        gap = min(gap, self._lane_change_gap(snap, here))
        v = e.speed
        ss = self.s0 + max(0.0, v * self.T + v * v / (2 * math.sqrt(self.a * self.b)))
        acc = self.a * (1 - (v / v0) ** 4 - (ss / max(gap, 0.05)) ** 2)
        acc = max(acc, -p.brake_max)
        if acc >= 0:
            tb = (acc + p.rolling + p.drag * v * v) / p.accel_max
        else:
            tb = acc / p.brake_max
        if gap < 0.5:
            tb = -1.0
        self._last = (snap.frame, snap.actors.id, np.hypot(snap.actors.velocity[:, 0],
                                                            snap.actors.velocity[:, 1]))
        return steer, float(np.clip(tb, -1.0, 1.0))

    def _accel(self, snap, a: int, v: float) -> float:
        """Actor a's acceleration since the last snapshot we acted on (0 if unknown)."""
        frame, ids, speed = self._last
        if frame != snap.frame - 1:
            return 0.0
        k = np.flatnonzero(ids == snap.actors.id[a])
        return (v - float(speed[k[0]])) / snap.dt if len(k) else 0.0

    def _corridor_gap(self, snap, here) -> float:
        """Gap to the nearest actor in our corridor, 40 m ahead (measured cautiously: where it
        first reaches into the corridor); while passing, along the path moved over, without the
        actor we pass (:meth:`_passed_gap` keeps us clear of it). Starts a pass when the actor
        ahead has stood long enough and the road allows (:meth:`_plan_pass`)."""
        e, p = snap.ego, self.ego
        route, ignore = self.route, -1
        if self._pass is not None:
            route = self._pass["path"]
            k = np.flatnonzero(snap.actors.id == self._pass["id"])
            ignore = int(k[0]) if len(k) else -1
        actors, moving = _walkers_ahead(snap.actors)
        gap, who = corridor_lead(route, self.idx, here, e.x, e.y, actors, p.length / 2,
                                 p.width / 2, horizon=40.0, search=45.0, measure="entry",
                                 ignore=ignore, parallel_reach=True,
                                 in_junction=self.in_junction, boxes=True)
        if who >= len(snap.actors):
            who = int(moving[who - len(snap.actors)])  # where a walker will be: that walker
        if self.pass_standing and self._pass is None:
            if who >= 0 and math.hypot(*snap.actors.velocity[who]) < 0.3:
                aid = int(snap.actors.id[who])
                t = self._stood[1] + snap.dt if self._stood[0] == aid else snap.dt
                self._stood = (aid, t)
                # (tried twice a second: queued at a light, the checks would otherwise run on
                # every step)
                if (t >= PASS_AFTER and gap < PASS_RANGE and round(t / snap.dt) % 5 == 0
                        and self._plan_pass(snap, here, who)):
                    return self._corridor_gap(snap, here)  # the way ahead, moved over
            else:
                self._stood = (-1, 0.0)
        return gap

    def _pass_offset(self, s: float) -> float:
        """Our lateral offset (m, + right) from the route at arc length s during the pass."""
        ps = self._pass
        return ps["o"] * float(np.interp(s, ps["knots"], (0.0, 1.0, 1.0, 0.0)))

    def _plan_pass(self, snap, here: float, who: int) -> bool:
        """Start passing the standing actor ``who`` ahead in our lane if the road allows: no
        junction, stop line or lane change of the route from here to PASS_CLEAR m past the end of
        the pass (it is not queued at a light or junction, and we are back on our lane before our
        next turn), nobody standing or driving ahead of it in our lane up to there (not a queue),
        a same-direction lane beside ours all the way (left first), and that lane free: the
        lane-change gap check from behind us to the end of the pass."""
        act, r, rm, p = snap.actors, self.route, self.map, self.ego
        ox, oy = float(act.pos[who, 0]), float(act.pos[who, 1])
        i_far = min(int(np.searchsorted(r.cum, here + PASS_RANGE + 45.0)), len(r.pts) - 1)
        w = slice(self.idx, i_far + 1)  # its place along the route, searched ahead of us only
        io = self.idx + int(np.argmin(np.hypot(r.pts[w, 0] - ox, r.pts[w, 1] - oy)))
        cum_o, hl_o = float(r.cum[io]), float(act.extent[who, 0])
        s2 = cum_o + hl_o + p.length + 3.0  # our centre when our rear is 3 m past its front
        s3 = s2 + PASS_BACK
        if cum_o - here < 9.0 or s3 + PASS_CLEAR > r.length:
            return False
        i3 = min(int(np.searchsorted(r.cum, s3 + PASS_CLEAR)), len(r.pts) - 1)
        if self.in_junction[self.idx:i3 + 1].any():
            return False
        if any(here - 1.0 < c0 < s3 + PASS_CLEAR for c0, _, _ in self.changes):
            return False
        d, li = next_stop(self.stops, here)
        if li >= 0 and d < s3 + PASS_CLEAR - here:
            return False
        ahead, _ = corridor_lead(r, io, cum_o, ox, oy, act, hl_o, p.width / 2,
                                 horizon=s3 + PASS_CLEAR - cum_o)
        if ahead < math.inf:
            return False  # a queue, or someone in the way back
        lanes = np.unique(r.lanes[self.idx:i3 + 1])
        for nb, same, sign in ((rm.left, rm.left_same_dir, -1.0), (rm.right, rm.right_same_dir, 1.0)):
            if not all(nb[L] >= 0 and same[L] for L in lanes):
                continue
            L = int(r.lanes[self.idx])
            side = sign * 0.5 * float(rm.width[rm.offset[L]] + rm.width[rm.offset[int(nb[L])]])
            if self._lane_taken(snap, here, side, here, s3):
                continue
            o = sign * min(abs(side), PASS_OFFSET)
            if abs(o) - p.width / 2 - float(act.extent[who, 1]) < PASS_SIDE:
                continue  # too wide to pass without leaving our route's reach
            knots = (here, cum_o, s2, s3)
            self._pass = dict(id=int(act.id[who]), o=o, knots=knots, s3=s3)
            off = o * np.interp(r.cum, knots, (0.0, 1.0, 1.0, 0.0))
            pts = r.pts + np.stack([-np.sin(r.yaw), np.cos(r.yaw)], 1) * off[:, None]
            self._pass["path"] = Route(r.segments, pts, r.yaw, r.cum, r.lanes)
            self.passes += 1
            return True
        return False

    def _passed_gap(self, snap) -> float:
        """While passing: how far we can go on along our heading before our box (0.1 m wider
        each side, unless we are already that close) would touch the actor we pass, as an IDM gap
        that stops us 0.5 m short of it (inf when it is clear for 10 m). Checked along our
        heading, which turns out as we move over, so we can creep past its corner."""
        act, e, p = snap.actors, snap.ego, self.ego
        k = np.flatnonzero(act.id == self._pass["id"])
        if not len(k):
            return math.inf
        a = int(k[0])
        c, s = math.cos(e.yaw), math.sin(e.yaw)
        ax, ay = float(act.pos[a, 0]), float(act.pos[a, 1])
        ca, sa = math.cos(act.yaw[a]), math.sin(act.yaw[a])
        hl, hw = float(act.extent[a, 0]), float(act.extent[a, 1])
        if math.hypot(ax - e.x, ay - e.y) > 10.0 + p.length + hl + hw:
            return math.inf
        # the 0.1 m margin, unless we are already that close (then only a real touch counts)
        m = 0.0 if obb_overlap(e.x, e.y, c, s, p.length / 2, p.width / 2 + 0.1,
                               ax, ay, ca, sa, hl, hw) else 0.1
        for d in np.arange(0.25, 10.0, 0.25):
            if obb_overlap(e.x + d * c, e.y + d * s, c, s, p.length / 2, p.width / 2 + m,
                           ax, ay, ca, sa, hl, hw):
                return max(d - 0.5, 0.0) + self.s0 - 0.5
        return math.inf

    def _light_gap(self, snap, here) -> float:
        """Gap to the next stop line while its light is red, or yellow and we can still stop."""
        v, b = snap.ego.speed, self.b
        d, li = next_stop(self.stops, here, behind=0.5)
        if li < 0 or d > 60.0:
            return math.inf
        st = int(snap.lights.state[li]) if li < len(snap.lights) else LightState.GREEN
        front = d - self.ego.length / 2
        if st == LightState.RED or (st == LightState.YELLOW and front > v * v / (2 * b)):
            return front
        return math.inf

    def _junction_gap(self, snap, here) -> float:
        """Stop line of the next junction while we must give way there: a vehicle inside it is on a
        lane that crosses or merges with ours and has not yet cleared the crossing, or one coming
        up to it would reach the crossing before we are through. Once we can no longer stop
        comfortably before the junction we are committed (the corridor still brakes for whatever
        is in our way)."""
        e, r, half = snap.ego, self.route, self.ego.length / 2
        v = e.speed
        # where we are along the route, finer than its 1 m points
        k = self.idx
        at = here + ((e.x - r.pts[k, 0]) * math.cos(r.yaw[k])
                     + (e.y - r.pts[k, 1]) * math.sin(r.yaw[k]))
        for n, cr in enumerate(self.crossings):
            front = cr.entry - at - half
            if front < -0.5:
                continue  # our nose is in it (or it is behind us)
            if front > JUNCTION_LOOKAHEAD:
                break
            if v * v / (2.0 * COMMIT_DECEL) > front + 0.5:
                return math.inf  # we could not stop short of it any more
            # still in the junction before, joined to this one by a stretch too short to stand
            # on: we wait there only for vehicles that move. One standing in this junction is
            # not waited for: if it stands in our way the corridor stops us at it; where it does
            # not, it may be waiting for us to leave the junction we stand in (CommonRoad's
            # roundabout, four junctions on a two-way ring: the expert stood a minute in the one
            # before while the vehicle it waited for waited for a third that waited for it)
            moving = (n > 0 and cr.entry - self.crossings[n - 1].exit
                      < self.ego.length + SHORT_LINK_MARGIN
                      and at - half < self.crossings[n - 1].exit)
            if self._must_yield(cr, snap, here, moving_only=moving):
                return front
            # junctions joined by a stretch too short to stand on are crossed as one: we also
            # wait before the first while a vehicle in one after it is on a lane crossing our way
            # (standing at the second's stop line inside the first, we kept a vehicle that waited
            # for us in the second from leaving it: Town07). Those still coming up to the later
            # one are left to when we are there (timed from here, every one would come first)
            last = cr
            for nxt in self.crossings[n + 1:]:
                if nxt.entry - last.exit >= self.ego.length + SHORT_LINK_MARGIN:
                    break
                if self._must_yield(nxt, snap, here, inside_only=True, moving_only=moving):
                    return front
                last = nxt
            return math.inf
        return math.inf

    def _must_yield(self, cr: "_Crossing", snap, here, inside_only: bool = False,
                    moving_only: bool = False) -> bool:
        """Whether we give way at junction ``cr``: a vehicle in it is on a lane crossing or
        merging with our way and not yet past that stretch, or the first vehicle of a
        conflicting approach would reach it before we are through. ``inside_only``: vehicles
        in the junction only; ``moving_only``: of those, the ones that move (under 0.3 m/s they
        are left to the corridor)."""
        act = snap.actors
        if len(act) == 0:
            return False
        rm, half = self.map, self.ego.length / 2
        pos = act.pos
        near = _VEHICLE[act.cls] & (
            np.hypot(pos[:, 0] - cr.centre[0], pos[:, 1] - cr.centre[1]) < cr.radius + 45.0)
        if not near.any():
            return False
        speed = np.hypot(act.velocity[:, 0], act.velocity[:, 1])
        grid = self._grid
        first: dict = {}  # approach lane into the junction -> (distance to it, actor, feeds)
        for a in np.flatnonzero(near):
            x, y, yaw = float(pos[a, 0]), float(pos[a, 1]), float(act.yaw[a])
            hl = float(act.extent[a, 0])
            on = _match_lanes(rm, cr, x, y, yaw)
            if on is not None:  # inside the junction, on these lanes
                if moving_only and speed[a] < 0.3:
                    continue
                for lane, s in on:
                    c = cr.conflicts.get(lane)
                    if c is not None and s - hl < c[1]:
                        return True
                continue
            if inside_only:
                continue
            p = nearest_point(*grid.args(), rm.pts, rm.yaw, x, y, yaw, 0.6, 2.5)
            if p < 0:
                if self._crossing_fallback(cr, x, y, yaw, speed[a]):
                    return True
                continue
            lane = int(rm.point_lane[p])
            feeds = cr.feeders.get(lane)
            if feeds:
                to_end = float(rm.length[lane] - rm.s[p])
                for app, extra, group in feeds:
                    d = to_end + extra
                    if app not in first or d < first[app][0]:
                        first[app] = (d, a, group)
        # the first vehicle of each approach: it stops for its red light or its turn to go, or it
        # comes on (those behind it cannot be there before it)
        lights = snap.lights
        for app, (d, a, group) in first.items():
            v, hl = float(speed[a]), float(act.extent[a, 0])
            if v < 0.5:
                continue
            acc = self._accel(snap, a, v)
            if acc < -0.3 and v * v / (-2.0 * acc) < d - hl + 0.5:
                continue  # braking to stop short of the junction
            li = int(self.lane_light[app]) if self.lane_light is not None else -1
            if 0 <= li < len(lights):
                st = int(lights.state[li])
                if (st == LightState.RED or st == LightState.YELLOW) and d - hl > v * v / 6.0 + 1.0:
                    continue
            for lane in group:
                s0, s1, c0, c1 = cr.conflicts[lane]
                t_them = _time_to(d + s0 - hl, v, 0.5, max(9.5, v))
                t_us = _time_to(c1 - here + half, snap.ego.speed, 1.5, cr.vmax)
                if t_them < t_us + YIELD_MARGIN:
                    return True
        return False

    def _crossing_fallback(self, cr, x, y, yaw, speed) -> bool:
        """A moving vehicle on no lane of the map (another backend's odd one): give way while it
        is near our path through the junction and not heading our way."""
        if speed < 0.3:
            return False
        d = np.hypot(cr.path[:, 0] - x, cr.path[:, 1] - y)
        k = int(np.argmin(d))
        return bool(d[k] < 4.0 and math.cos(yaw - cr.path_yaw[k]) < 0.9)

    def _lane_change_gap(self, snap, here) -> float:
        """Wait before a lane change of the route while the target lane is taken beside us: a
        vehicle there overlapping where we will merge in, or coming up from behind too close."""
        e, half = snap.ego, self.ego.length / 2
        for c0, c1, side in self.changes:
            front = c0 - here - half
            if front < 0.3:
                continue
            if front > 30.0:
                break
            if front < e.speed * e.speed / (2.0 * COMMIT_DECEL):
                return math.inf
            return front if self._lane_taken(snap, here, side, c0, c1, join=True) else math.inf
        return math.inf

    def _route_shift(self, s):
        """How far (m, + right) the route has moved across by arc length ``s`` (scalar or array)
        through its lane changes, from where it starts."""
        out = np.zeros(np.shape(s))
        for c0, c1, side in self.changes:
            out = out + side * np.clip((np.asarray(s) - c0) / max(c1 - c0, 1e-9), 0.0, 1.0)
        return out

    def _beside_spacing(self, k: int, side: float, target: int) -> float | None:
        """The spacing (m) of the route's lane at route point ``k`` and the lane beside it on the
        side of ``side`` (+ right), from their widths there: half the one plus half the other,
        where that lane is ``target`` or leads into it within CHAIN_STEPS lanes (None: no such
        lane)."""
        rm, r = self.map, self.route
        lane = int(r.lanes[k])
        nb, same = (rm.right[lane], rm.right_same_dir[lane]) if side > 0 else (
            rm.left[lane], rm.left_same_dir[lane])
        if nb < 0 or not same:
            return None
        ahead, found = {int(nb)}, int(nb) == target
        for _ in range(CHAIN_STEPS):
            if found:
                break
            ahead = {int(s) for a in ahead for s in rm.successors(a)}
            found = target in ahead
        if not found:
            return None
        half = 0.0
        for L in (lane, int(nb)):
            o0, o1 = int(rm.offset[L]), int(rm.offset[L + 1])
            m = int(np.argmin(np.hypot(rm.pts[o0:o1, 0] - r.pts[k, 0], rm.pts[o0:o1, 1] - r.pts[k, 1])))
            half += 0.5 * float(rm.width[o0 + m])
        return half

    def _lane_taken(self, snap, here, side, c0, c1, join: bool = False) -> bool:
        """A vehicle in the lane ``side`` m beside ours (+ right) overlaps our route's stretch
        c0..c1 (arc lengths), or comes up from behind too close to it. ``join`` (a lane change of
        the route, not a pass): the route moves over to that lane along c0..c1, and a vehicle
        standing ahead of our nose does not count.

        Vehicles are placed along our route (arc length, offset across it and heading against
        the route's there), not in our own frame: in a bend a car 10 m behind in the next lane
        is 40 degrees off our heading and metres off its lane's line in our frame, and was
        missed (Town06: the expert changed lanes into it)."""
        act, e, half = snap.actors, snap.ego, self.ego.length / 2
        if len(act) == 0:
            return False
        veh = _VEHICLE[act.cls]
        near = veh & (np.hypot(act.pos[:, 0] - e.x, act.pos[:, 1] - e.y) < 80.0)
        if not near.any():
            return False
        r = self.route
        i0 = int(np.searchsorted(r.cum, min(here, c0) - 70.0))
        i1 = min(int(np.searchsorted(r.cum, max(here, c1) + 70.0)), len(r.pts) - 1)
        idx = np.flatnonzero(near)
        pts = r.pts[i0:i1 + 1]
        d = np.hypot(act.pos[idx, 0, None] - pts[None, :, 0], act.pos[idx, 1, None] - pts[None, :, 1])
        k = i0 + np.argmin(d, axis=1)
        c, s = np.cos(r.yaw[k]), np.sin(r.yaw[k])
        dx, dy = act.pos[idx, 0] - r.pts[k, 0], act.pos[idx, 1] - r.pts[k, 1]
        along = r.cum[k] + dx * c + dy * s  # its place along our route
        across = -dx * s + dy * c
        if join:  # the lane we move onto, from the route where it is: where the route runs
            # diagonally over, the lane comes closer; over an earlier change of a chain of them
            # (a route starting with two in 15 m), the lane is further than one lane over
            want = self._route_shift(c1) - self._route_shift(along)
            # behind the change (no other change between), the lane beside as far over as it is
            # there: where lanes widen along the road the offset at the change's start is not
            # the offset 30 m back (lanes 4 m apart there and 7 m at the change: a car coming up
            # fast in the lane beside was not seen, and met the expert on the diagonal;
            # scenariogeneration's road_with_changing_lane_width)
            behind = (along < c0) & (self._route_shift(along) == self._route_shift(c0 - 1e-6))
            target = int(r.lanes[min(int(np.searchsorted(r.cum, c1)), len(r.lanes) - 1)])
            at_c0 = max(int(np.searchsorted(r.cum, c0)) - 1, 0)
            ref = self._beside_spacing(at_c0, side, target)
            for n in np.flatnonzero(behind) if ref is not None else ():
                there = self._beside_spacing(int(k[n]), side, target)
                if there is not None:
                    want[n] += math.copysign(1.0, side) * (there - ref)
        else:
            want = np.full(len(idx), side)
        beside = (np.cos(act.yaw[idx] - r.yaw[k]) > 0.8) & (np.abs(across - want) < 1.8) \
            & (np.abs(along - here) < 60.0)
        for n in np.flatnonzero(beside):
            a, ax = int(idx[n]), float(along[n])
            hl = float(act.extent[a, 0])
            va = float(np.hypot(*act.velocity[a]))
            if join and va < QUEUE_SPEED and ax - hl > here + half + self.s0:
                # standing ahead of our nose (a queue before a junction): we go in behind it and
                # follow it (the corridor brakes for it), as drivers join a queue; waiting for
                # the stretch beside us to clear can take as long as the queue stands
                continue
            back = 4.0 + 1.5 * va + 2.0 * max(0.0, va - e.speed)
            if c0 - half - hl - back < ax < c1 + half + hl + 2.0:
                return True
        return False


@dataclass
class _Crossing:
    """One junction on the route, and which of its lanes cross or merge with our way through."""

    entry: float  # route arc length of the last point before the junction
    vmax: float  # our curvature speed limit through it
    path: np.ndarray  # our route points from the entry to EXIT_TAIL past the exit
    path_yaw: np.ndarray
    centre: np.ndarray
    radius: float
    points: np.ndarray  # indices of the points of every lane of the junction in the RoadMap
    conflicts: dict  # junction lane -> (s0, s1, c0, c1): its stretch within CLEARANCE of our path
    #                  and our route arc lengths where that happens
    feeders: dict  # lane outside the junction -> [(approach lane, distance from the lane's end to
    #                the junction, conflicting lanes the approach leads into)]
    exit: float = math.inf  # route arc length of the first point after the junction


def _crossing(rm: RoadMap, r: Route, i0: int, vcurve: np.ndarray) -> _Crossing:
    """The junction the route enters after point i0."""
    lj = int(r.lanes[i0 + 1])
    jid = int(rm.junction[lj])
    i1 = i0 + 1
    while i1 < len(r.lanes) and rm.junction[r.lanes[i1]] == jid:
        i1 += 1
    i1 = min(i1, len(r.lanes) - 1)
    i2 = min(int(np.searchsorted(r.cum, r.cum[i1] + EXIT_TAIL)), len(r.lanes) - 1)
    path, cum = r.pts[i0:i2 + 1], r.cum[i0:i2 + 1]
    ours = set(int(v) for v in r.lanes[i0 + 1:i1])
    lanes = np.flatnonzero(rm.junction == jid)
    lane_pts = [rm.lane_points(int(L)) for L in lanes]
    points = np.concatenate([np.arange(rm.offset[L], rm.offset[L + 1]) for L in lanes])
    allp = rm.pts[points]
    centre = allp.mean(axis=0)
    radius = float(np.hypot(allp[:, 0] - centre[0], allp[:, 1] - centre[1]).max())
    conflicts = {}
    for L, q in zip(lanes, lane_pts):
        L = int(L)
        if L in ours:
            continue
        d = np.hypot(q[:, None, 0] - path[None, :, 0], q[:, None, 1] - path[None, :, 1])
        close = d < CLEARANCE
        if close.any():
            rows, cols = np.flatnonzero(close.any(axis=1)), np.flatnonzero(close.any(axis=0))
            conflicts[L] = (float(rows[0] * rm.ds[L]), float(rows[-1] * rm.ds[L]),
                            float(cum[cols[0]]), float(cum[cols[-1]]))
    # a way through can be a chain of junction lanes (a junction road of several sections): the
    # lanes before a conflicting one in its chain lead into the crossing, their stretch lying
    # beyond their own end, so a vehicle on them, and one coming up to them, is given way to too
    # (Town05 dense: the expert crossed in front of a car entering such a chain)
    chained: set = set()
    frontier = list(conflicts)
    while frontier:
        L = frontier.pop(0)
        s0, s1, c0, c1 = conflicts[L]
        for A in rm.predecessors(L):
            A = int(A)
            if rm.junction[A] != jid or A in ours or (A in conflicts and A not in chained):
                continue
            la = float(rm.length[A])
            new = (la + s0, la + s1, c0, c1)
            if A in chained:  # reached along two chains: the nearest crossing and the last one
                old = conflicts[A]
                conflicts[A] = (min(old[0], new[0]), max(old[1], new[1]),
                                min(old[2], new[2]), max(old[3], new[3]))
                continue
            conflicts[A] = new
            chained.add(A)
            frontier.append(A)
    # lanes leading into conflicting ones (two deep: lanes between junctions can be short), but
    # not those of our own way in (the vehicles there are behind us or our leaders)
    j0 = int(np.searchsorted(r.cum, r.cum[i0] - 80.0))
    mine = set(int(v) for v in r.lanes[j0:i0 + 1])
    groups: dict = {}  # approach lane (ends at the junction) -> conflicting lanes it leads into
    for L in conflicts:
        for A in rm.predecessors(L):
            A = int(A)
            if rm.junction[A] < 0 and A not in mine:
                groups.setdefault(A, []).append(L)
    feeders: dict = {}  # lane -> [(approach lane, distance from its end to the junction, lanes)]
    for A, group in groups.items():
        feeders.setdefault(A, []).append((A, 0.0, group))
        if rm.length[A] < 40.0:  # lanes between junctions can be short: look one further back
            for B in rm.predecessors(A):  # (into the junction before, if A is a short link: a
                B = int(B)                # vehicle still in that one is on its way here too)
                if B not in mine and rm.junction[B] != jid:
                    feeders.setdefault(B, []).append((A, float(rm.length[A]), group))
    vmax = float(np.clip(vcurve[i0:i1 + 1].min(), 2.0, 8.0))
    return _Crossing(float(r.cum[i0]), vmax, path, r.yaw[i0:i2 + 1], centre, radius, points,
                     conflicts, feeders, float(r.cum[i1]))


def _match_lanes(rm: RoadMap, cr: _Crossing, x: float, y: float, yaw: float):
    """The junction lanes (lane, s) a vehicle at (x, y, yaw) is on; None if on none of them."""
    if math.hypot(x - cr.centre[0], y - cr.centre[1]) > cr.radius + 2.0:
        return None
    p = cr.points
    d = np.hypot(rm.pts[p, 0] - x, rm.pts[p, 1] - y)
    cand = np.flatnonzero((d < 1.5) & (np.cos(rm.yaw[p] - yaw) > 0.8))
    if len(cand) == 0:
        return None
    out = {}
    for k in cand[np.argsort(d[cand])]:
        q = int(p[k])
        lane = int(rm.point_lane[q])
        if lane in out:
            continue
        along = (x - rm.pts[q, 0]) * math.cos(rm.yaw[q]) + (y - rm.pts[q, 1]) * math.sin(rm.yaw[q])
        if q == rm.offset[lane] and along < -0.2:
            continue  # still before the junction
        out[lane] = max(float(rm.s[q]) + along, 0.0)
    return list(out.items()) or None


def _time_to(dist: float, v: float, a: float, vmax: float) -> float:
    """Seconds to cover ``dist`` from speed ``v`` accelerating at ``a`` up to ``vmax``."""
    if dist <= 0.0:
        return 0.0
    v = min(max(v, 0.0), vmax)
    t_acc = (vmax - v) / a
    d_acc = v * t_acc + 0.5 * a * t_acc * t_acc
    if dist <= d_acc:
        return (-v + math.sqrt(v * v + 2.0 * a * dist)) / a
    return t_acc + (dist - d_acc) / vmax


def autopilot_episode(rm: RoadMap, config: SimConfig, seed: int, max_length: float = 3000.0):
    """A lite world whose ego follows a random route: ``(world, rng, snapshot, pilot)``.

    ``rng`` (seeded with ``seed``) is the one the route came from; pass it on to
    :meth:`Autopilot.new_route_from` for the next routes.
    """
    world = LiteWorld(rm, config)
    rng = np.random.default_rng(seed)
    route = random_route(rm, rng, max_length=max_length)
    snap = world.reset(seed=seed, ego_pose=route.start)
    return world, rng, snap, Autopilot(rm, route, world.lights.lane_light, world.cfg.ego)


def _walkers_ahead(act: Actors) -> tuple[Actors, np.ndarray]:
    """``act`` plus one row for each walker on the move (over 0.3 m/s): where it will be
    ``WALKER_AHEAD`` s on at its velocity; and the indices of those walkers (row
    ``len(act) + q`` is walker ``moving[q]``)."""
    speed = np.hypot(act.velocity[:, 0], act.velocity[:, 1])
    moving = np.flatnonzero((act.cls == int(ActorClass.WALKER)) & (speed > 0.3))
    if not len(moving):
        return act, moving
    ahead = act.pos[moving] + act.velocity[moving] * WALKER_AHEAD
    return Actors(np.concatenate([act.id, act.id[moving]]), np.concatenate([act.cls, act.cls[moving]]),
                  np.concatenate([act.pos, ahead]), np.concatenate([act.yaw, act.yaw[moving]]),
                  np.concatenate([act.extent, act.extent[moving]]),
                  np.concatenate([act.velocity, act.velocity[moving]])), moving


def _polyline_distance(q: np.ndarray, x: float, y: float) -> float:
    """Distance from (x, y) to the polyline through the points ``q`` (its segments, not only its
    points: a map's lane points can lie 1 m apart, so a point on the line may be 0.5 m from both
    ends of its segment)."""
    if len(q) < 2:
        return float(np.hypot(q[:, 0] - x, q[:, 1] - y).min())
    a, d = q[:-1], np.diff(q, axis=0)
    t = np.clip(((x - a[:, 0]) * d[:, 0] + (y - a[:, 1]) * d[:, 1])
                / np.maximum((d * d).sum(1), 1e-12), 0.0, 1.0)
    return float(np.hypot(a[:, 0] + t * d[:, 0] - x, a[:, 1] + t * d[:, 1] - y).min())


def spawns_ahead(rm: RoadMap, x: float, y: float, yaw: float,
                 max_turn: float = math.pi / 4) -> np.ndarray:
    """Indices of the spawn points that lie ahead of (x, y) (not behind) and face within
    ``max_turn`` of ``yaw``, nearest first: where a driver at the end of its route may head next
    without turning round."""
    dx, dy = rm.spawn[:, 0] - x, rm.spawn[:, 1] - y
    ahead = dx * math.cos(yaw) + dy * math.sin(yaw) >= 0.0
    dyaw = np.abs((rm.spawn[:, 2] - yaw + math.pi) % (2 * math.pi) - math.pi)
    ok = np.flatnonzero(ahead & (dyaw <= max_turn))
    return ok[np.argsort(np.hypot(dx[ok], dy[ok]), kind="stable")]


def route_ahead(rm: RoadMap, start: tuple[int, float], x: float, y: float, yaw: float,
                max_length: float = 3000.0) -> Route | None:
    """A route from ``start`` (the lane and arc length where the last one ended) to the nearest
    spawn point ahead of (x, y) in the driving direction (:func:`spawns_ahead`: never one behind
    or on the opposite lane, which would ask for a U-turn) that it reaches NEXT_ROUTE_MIN m or
    more on, its lane changes planned and checked like any route's; None if there is none."""
    for b in spawns_ahead(rm, x, y, yaw):
        try:
            r = plan_route(rm, start, (rm.spawn_lane[b], rm.spawn_s[b]))
        except RouteError:
            continue
        if NEXT_ROUTE_MIN <= r.length <= max_length:
            return r
    return None


def clear_start(world: LiteWorld, rng: np.random.Generator, tries: int = 50,
                clear_m: float = 15.0) -> Route | None:
    """A random route (on :func:`~drivemind.sim.tables.linked_roadmap`'s links) whose start has no
    vehicle or walker within ``clear_m`` metres, or None when ``tries`` routes all start near one:
    for an ego whose route ended at an open road end (:meth:`Autopilot.new_route_from` raised
    :class:`RouteError`). On None the ego waits and the caller asks again later, rather than being
    placed onto an actor (``world.place_ego(route.start)`` moves it)."""
    rm = linked_roadmap(world.map)
    actors = np.concatenate([world.v_xy.reshape(-1, 2), world.w_xy.reshape(-1, 2)])
    for _ in range(tries):
        try:
            r = random_route(rm, rng)
        except RouteError:
            continue
        x0, y0, _ = r.start
        if not len(actors) or np.hypot(*(actors - (x0, y0)).T).min() > clear_m:
            return r
    return None


PERTURBATIONS = (("expert", 0.45), ("drift", 0.25), ("rush", 0.20), ("brake", 0.10))  # share of episodes


def perturb_expert(action, mode: str, bias: float, rng: np.random.Generator) -> np.ndarray:
    """The expert's action with the frame collectors' perturbation (scripts/train_bev_clip.py,
    scripts/calibrate_reward.py): steering noise N(0, 0.05) always, plus a steering ``bias`` in
    ``drift``, full throttle in ``rush``, full brake in ``brake``; clipped to [-1, 1]."""
    a = np.asarray(action, np.float64).copy()
    a[0] += rng.normal(0, 0.05)
    if mode == "drift":
        a[0] += bias
    elif mode == "rush":
        a[1] = 1.0
    elif mode == "brake":
        a[1] = -1.0
    return np.clip(a, -1, 1)


def expert_drive(env, steps: int, rng: np.random.Generator, choose_mode=None):
    """Drive a DriveMind env (already reset) ``steps`` steps with its expert, yielding
    ``(t, obs, info)`` after each step and resetting at episode ends. With ``choose_mode(rng) ->
    mode`` (one of ``PERTURBATIONS``' names), perturbation episodes of 10-40 steps are drawn and
    applied by :func:`perturb_expert` (the frame collectors' drive); without it the expert drives
    unperturbed and ``rng`` is not used."""
    base = env.unwrapped
    mode, left, bias = "expert", 0, 0.0
    for t in range(steps):
        if choose_mode is not None and left <= 0:
            mode = choose_mode(rng)
            left = int(rng.integers(10, 40))
            bias = float(rng.choice([-1, 1]) * rng.uniform(0.05, 0.3))
        left -= 1
        a = base.expert_action()
        a = perturb_expert(a, mode, bias, rng) if choose_mode is not None else np.clip(a, -1, 1)
        obs, _, term, trunc, info = env.step(a)
        yield t, obs, info
        if term or trunc:
            env.reset()
            mode, left = "expert", 0
