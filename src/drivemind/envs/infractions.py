"""Per-step infraction facts for CaRL's route-completion reward (Jaeger et al. 2025).

CaRL's reward (``drivemind.rewards.carl``) reads facts that need a little history, which a reward
over single stored transitions cannot keep; the env computes them here, once per step:

- ``route_completion``: the percentage of the current route newly completed this step (CARLA's
  route completion only grows: driving back and forth pays once).
- ``red_light_run``: 1 on the step the ego's front bumper crosses the stop line of a red light on
  its route (the env ends the episode there when ``env.terminate_red_light`` is set, in train mode).
- ``outside_lanes``: 1 while the ego's centre is off every driving lane (verge, sidewalk) or on a
  lane that runs against the route's direction outside a junction (CaRL's outside-route-lanes test).
- ``off_center_time``: CaRL's lane-centre counter in seconds: it grows by one step while the ego is
  more than ``env.lane_center_grace`` m from the nearest lane centre outside junctions and shrinks
  by one step (to 0) otherwise.
- ``comfort_violations``: how many of nuPlan's six comfort limits (longitudinal acceleration, lateral
  acceleration, jerk magnitude, longitudinal jerk, yaw rate, yaw acceleration) were exceeded within
  the last ``env.penalty_hold`` seconds (0..6).
- ``ttc_violation``: 1 while a time-to-collision violation (the lead actor in the route corridor
  reached within ``TTC_HORIZON`` s at constant speeds) happened within the last ``env.penalty_hold``
  seconds.

The limits are CaRL's (its ``rl_config``: nuPlan's comfort limits, a 0.9 s TTC horizon, 500 ticks
of penalty at 10 Hz). Where these facts differ from CaRL's CARLA measurements is listed in
docs/rewards.md (section "carl").
"""

from __future__ import annotations

import math
from collections import deque
from functools import lru_cache

import numpy as np

from ..maps.spatial import nearest_lane_point
from ..sim.snapshot import LightState

# nuPlan's comfort limits, as CaRL uses them (SI units)
COMFORT_LIMITS = {
    "lon_accel": (-4.05, 2.40),  # m/s^2
    "lat_accel": 4.89,  # m/s^2, absolute
    "jerk": 8.37,  # m/s^3, magnitude
    "lon_jerk": 4.13,  # m/s^3
    "yaw_rate": 0.95,  # rad/s
    "yaw_accel": 1.93,  # rad/s^2
}
COMFORT_HISTORY = 15  # steps kept for the comfort derivatives
COMFORT_MIN_HISTORY = 8  # no comfort verdict before this many steps (as CaRL)
TTC_HORIZON = 0.9  # s: CaRL forecasts 0.1 ... 0.9 s ahead
TTC_MIN_SPEED = 0.1  # m/s: a (nearly) stopped ego has no TTC violation


@lru_cache(maxsize=None)
def _fit_weights(n: int, order: int, deriv: int, dt: float) -> np.ndarray:
    """Weights w with w @ y = the ``deriv``-th derivative, at the last sample, of the
    least-squares polynomial of ``order`` through the last ``n`` samples ``y`` spaced ``dt``
    (the last point of a Savitzky-Golay filter)."""
    t = (np.arange(n) - (n - 1)) * dt  # the last sample at t = 0
    order = min(order, n - 1)
    vander = np.vander(t, order + 1, increasing=True)  # columns 1, t, t^2, ...
    pinv = np.linalg.pinv(vander)  # (order+1, n): coefficients from samples
    if deriv > order:
        return np.zeros(n)
    return math.factorial(deriv) * pinv[deriv]  # d^k/dt^k of sum c_j t^j at t=0 is k! c_k


def _fit(y, order: int, deriv: int, dt: float, window: int) -> float:
    y = np.asarray(y, np.float64)[-window:]
    return float(_fit_weights(len(y), order, deriv, float(dt)) @ y)


class InfractionMonitor:
    """Keeps the history CaRL's facts need; one per env, reset with each episode."""

    def __init__(self, roadmap, lane_center_grace: float, penalty_hold: float, dt: float):
        self.map = roadmap
        self.grace = float(lane_center_grace)
        self.dt = float(dt)
        self.hold_steps = max(int(round(penalty_hold / self.dt)), 1)
        self.reset()

    def reset(self):
        self._route = None
        self._best_s = 0.0
        self._off_center = 0
        self._lon = deque(maxlen=COMFORT_HISTORY)
        self._lat = deque(maxlen=COMFORT_HISTORY)
        self._mag = deque(maxlen=COMFORT_HISTORY)
        self._yaw = deque(maxlen=COMFORT_HISTORY)
        self._comfort_hold = np.zeros(len(COMFORT_LIMITS), np.int64)
        self._ttc_hold = 0

    # ------------------------------------------------------------------ before termination
    def route_completion(self, tracker) -> float:
        """Percent of the tracker's route newly completed since the last call."""
        if tracker.route is not self._route:
            self._route, self._best_s = tracker.route, 0.0
        gain = max(tracker.s - self._best_s, 0.0)
        self._best_s = max(self._best_s, tracker.s)
        return 100.0 * gain / max(float(tracker.route.length), 1e-6)

    @staticmethod
    def red_light_run(stops, light_state, s_before: float, s_after: float,
                      half_length: float) -> bool:
        """Did the ego's front cross the stop line of a red light on its route this step?"""
        f0, f1 = s_before + half_length, s_after + half_length
        return any(f0 < cum <= f1 and int(light_state[li]) == LightState.RED for cum, li in stops)

    # ------------------------------------------------------------------ per-step facts
    def facts(self, snap, tracker, lead_gap: float, lead_speed: float) -> dict:
        e = snap.ego
        outside, off = self._lanes(e.x, e.y, tracker)
        self._off_center = self._off_center + 1 if off else max(self._off_center - 1, 0)
        return {"outside_lanes": float(outside), "off_center_time": self._off_center * self.dt,
                "comfort_violations": float(self._comfort(e)),
                "ttc_violation": float(self._ttc(e.speed, lead_gap, lead_speed))}

    def _lanes(self, x: float, y: float, tracker) -> tuple[bool, bool]:
        """(outside the route's lanes, farther than the grace from the nearest lane centre)."""
        rm = self.map
        hit = nearest_lane_point(rm, x, y)  # any direction
        if hit is None:
            return True, False
        lane, s, lateral, _ = hit
        junction = rm.junction[lane] >= 0
        p = min(int(rm.offset[lane] + s / max(float(rm.ds[lane]), 1e-6)), int(rm.offset[lane + 1]) - 1)
        off_lanes = abs(lateral) > 0.5 * float(rm.width[p])
        route_yaw = float(tracker.route.yaw[tracker.idx])
        against = abs((float(rm.yaw[p]) - route_yaw + math.pi) % (2 * math.pi) - math.pi) > math.pi / 2
        outside = off_lanes or (against and not junction)
        return outside, (not junction) and abs(lateral) > self.grace

    def _comfort(self, e) -> int:
        self._comfort_hold = np.maximum(self._comfort_hold - 1, 0)
        lat = e.speed * e.yaw_rate
        self._lon.append(e.accel)
        self._lat.append(lat)
        self._mag.append(math.hypot(e.accel, lat))
        yaw = e.yaw if not self._yaw else self._yaw[-1] + (
            (e.yaw - self._yaw[-1] + math.pi) % (2 * math.pi) - math.pi)  # unwrapped
        self._yaw.append(yaw)
        if len(self._lon) >= COMFORT_MIN_HISTORY:
            dt, lim = self.dt, COMFORT_LIMITS
            lon = _fit(self._lon, 2, 0, dt, 8)
            values = (
                not (lim["lon_accel"][0] <= lon <= lim["lon_accel"][1]),
                abs(_fit(self._lat, 2, 0, dt, 8)) > lim["lat_accel"],
                abs(_fit(self._mag, 2, 1, dt, 15)) > lim["jerk"],
                abs(_fit(self._lon, 2, 1, dt, 15)) > lim["lon_jerk"],
                abs(_fit(self._yaw, 2, 1, dt, 5)) > lim["yaw_rate"],
                abs(_fit(self._yaw, 3, 2, dt, 5)) > lim["yaw_accel"],
            )
            self._comfort_hold[np.array(values, bool)] = self.hold_steps
        return int(np.count_nonzero(self._comfort_hold))

    def _ttc(self, speed: float, gap: float, lead_speed: float) -> bool:
        if self._ttc_hold > 0:
            self._ttc_hold -= 1
        closing = speed - lead_speed
        if speed >= TTC_MIN_SPEED and math.isfinite(gap) and gap <= max(closing, 0.0) * TTC_HORIZON:
            self._ttc_hold = self.hold_steps
        return self._ttc_hold > 0
