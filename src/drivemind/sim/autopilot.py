"""A route-following autopilot: pure pursuit for steering, IDM for speed.

It reads only a WorldSnapshot, the RoadMap and a Route, so it drives the ego of any backend. It
stops for actors in its corridor along the route, for red (and stoppable yellow) lights at the end
of its lane, and before a junction while another vehicle is crossing it. Used as the sanity
baseline, to collect frames, and to drive the ego in simulator benchmarks and demos.
"""

from __future__ import annotations

import math

import numpy as np

from ..maps.roadmap import RoadMap
from ..maps.routing import Route, random_route
from .config import EgoParams, SimConfig
from .snapshot import LightState, WorldSnapshot
from .world import LiteWorld


class Autopilot:
    def __init__(self, roadmap: RoadMap, route: Route, lane_light: np.ndarray | None = None,
                 ego: EgoParams | None = None, target_speed: float = 8.0, lat_accel: float = 2.0,
                 s0: float = 3.0, T: float = 1.4, a: float = 2.0, b: float = 3.5):
        self.map, self.ego = roadmap, ego or EgoParams()
        self.lane_light = lane_light
        self.target_speed, self.lat_accel = target_speed, lat_accel
        self.s0, self.T, self.a, self.b = s0, T, a, b
        self.set_route(route)

    def set_route(self, route: Route) -> None:
        self.route = route
        self.idx = 0
        r = route
        yaw = np.unwrap(r.yaw)
        w = 3
        kappa = np.zeros(len(yaw))
        if len(yaw) > w:
            seg = np.maximum(r.cum[w:] - r.cum[:-w], 1e-3)
            kappa[:-w] = np.abs(yaw[w:] - yaw[:-w]) / seg
        self.vcurve = np.sqrt(self.lat_accel / np.maximum(kappa, 1e-4))
        self.in_junction = self.map.junction[r.lanes] >= 0
        # stop lines: route points where a lane with a light ends and the route goes on into a junction
        self.stops = []
        if self.lane_light is not None:
            for i in range(len(r.lanes) - 1):
                if r.lanes[i] != r.lanes[i + 1] and self.in_junction[i + 1] and not self.in_junction[i]:
                    li = int(self.lane_light[r.lanes[i]])
                    if li >= 0:
                        self.stops.append((float(r.cum[i]), li))
        self.junction_entries = [float(r.cum[i]) for i in range(len(r.lanes) - 1)
                                 if self.in_junction[i + 1] and not self.in_junction[i]]

    def new_route_from(self, rng: np.random.Generator, x: float, y: float,
                       max_length: float = 3000.0) -> Route:
        """Follow a new random route starting at the spawn point nearest (x, y)."""
        sp = self.map.spawn
        start = int(np.argmin(np.hypot(sp[:, 0] - x, sp[:, 1] - y)))
        self.set_route(random_route(self.map, rng, max_length=max_length, start=start))
        return self.route

    @property
    def progress(self) -> float:
        return float(self.route.cum[self.idx])

    @property
    def done(self) -> bool:
        return self.route.length - self.progress < 3.0

    def _locate(self, x, y):
        r = self.route
        lo, hi = max(self.idx - 5, 0), min(self.idx + 60, len(r.pts))
        d = np.hypot(r.pts[lo:hi, 0] - x, r.pts[lo:hi, 1] - y)
        self.idx = lo + int(np.argmin(d))

    def act(self, snap: WorldSnapshot) -> tuple[float, float]:
        e, r, p = snap.ego, self.route, self.ego
        self._locate(e.x, e.y)
        here = r.cum[self.idx]
        # --- steering: pure pursuit on a point ld metres ahead
        ld = float(np.clip(3.0 + 0.6 * e.speed, 4.0, 12.0))
        j = min(int(np.searchsorted(r.cum, here + ld)), len(r.pts) - 1)
        dx, dy = r.pts[j, 0] - e.x, r.pts[j, 1] - e.y
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
        gap = min(gap, self._light_gap(snap, here))
        gap = min(gap, self._junction_gap(snap, here))
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
        return steer, float(np.clip(tb, -1.0, 1.0))

    def _corridor_gap(self, snap, here) -> float:
        act, r, p = snap.actors, self.route, self.ego
        if len(act) == 0:
            return math.inf
        e = snap.ego
        near = np.hypot(act.pos[:, 0] - e.x, act.pos[:, 1] - e.y) < 45.0
        if not near.any():
            return math.inf
        pos, ext = act.pos[near], act.extent[near]
        k = min(int(np.searchsorted(r.cum, here + 40.0)), len(r.pts) - 1)
        pts = r.pts[self.idx:k + 1]
        if len(pts) == 0:
            return math.inf
        d = np.hypot(pts[None, :, 0] - pos[:, None, 0], pts[None, :, 1] - pos[:, None, 1])
        rad = np.minimum(ext[:, 0], ext[:, 1] + 0.6)  # lateral reach of the other box
        hit = d < (rad + p.width / 2 + 0.5)[:, None]
        best = math.inf
        for a in np.flatnonzero(hit.any(axis=1)):
            first = int(np.argmax(hit[a]))
            along = r.cum[self.idx + first] - here
            g = along - p.length / 2 - ext[a, 0]
            if along > p.length / 2 - 0.5:  # ahead of our front, not beside us
                best = min(best, g)
        return best

    def _light_gap(self, snap, here) -> float:
        v, b = snap.ego.speed, self.b
        for cum, li in self.stops:
            d = cum - here
            if d < -0.5:
                continue
            if d > 60.0:
                break
            st = int(snap.lights.state[li]) if li < len(snap.lights) else LightState.GREEN
            front = d - self.ego.length / 2
            if st == LightState.RED or (st == LightState.YELLOW and front > v * v / (2 * b)):
                return front
            return math.inf
        return math.inf

    def _junction_gap(self, snap, here) -> float:
        """Wait at a junction entry while a vehicle not going our way is inside the junction."""
        act = snap.actors
        for cum in self.junction_entries:
            d = cum - here
            if d < 0.5:
                continue
            if d > 15.0:
                break
            r = self.route
            i0 = int(np.searchsorted(r.cum, cum))
            i1 = i0
            while i1 < len(r.lanes) and self.in_junction[i1]:
                i1 += 1
            path = r.pts[i0:i1 + 1]
            if len(path) == 0 or len(act) == 0:
                return math.inf
            moving = np.hypot(act.velocity[:, 0], act.velocity[:, 1]) > 0.3
            dist = np.hypot(path[None, :, 0] - act.pos[:, None, 0],
                            path[None, :, 1] - act.pos[:, None, 1]).min(axis=1)
            heading_ok = np.cos(act.yaw - r.yaw[min(i0, len(r.yaw) - 1)]) > 0.9
            crossing = (dist < 4.0) & moving & ~heading_ok
            if crossing.any():
                return d - self.ego.length / 2
            return math.inf
        return math.inf


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
