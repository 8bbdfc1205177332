"""CaRL's simple reward (Jaeger et al. 2025, "CaRL: Learning Scalable Planning Policies with Simple
Rewards", arXiv 2504.17838): route completion, reduced multiplicatively by soft infractions.

Per step::

    r = RC x f_lanes x f_speed x f_ttc x f_comfort x f_center  -  hint x (collision or red light)

- RC: the percentage of the route completed this step (fact ``route_completion``; a whole route
  pays 100).
- f_lanes = ``outside_lanes_factor`` (0) while the ego is outside the route's lanes (opposite lane
  outside a junction, or off every driving lane).
- f_speed = max(0, 1 - (v - limit) / ``max_overspeed_kmh``) above ``speed_limit_kmh``, else 1.
- f_ttc = ``ttc_factor`` (0.5) while a time-to-collision violation is held (``ttc_violation``).
- f_comfort = 1 - ``comfort_factor`` (0.5) x n / 6 for n of nuPlan's six comfort limits exceeded
  within the hold window (``comfort_violations``).
- f_center = ``lane_center_factor`` (0.5) once ``off_center_time`` exceeds
  ``off_center_time_limit`` (3 s: time to change lanes).
- the termination hint: ``terminal_hint`` (1) is subtracted on a collision or a red-light run.

Hard infractions end the episode and nothing more is paid; that is the env's job, chosen by the
config (``configs/reward/carl.yaml`` sets ``env.terminate_red_light``; collisions, leaving the route
and being blocked end every episode already). The values are CaRL's CARLA settings (its public code,
``team_code_roach/rl_config.py`` and ``reward/simple_reward.py``, with the paper's
``use_termination_hint``). Where our facts differ from CaRL's CARLA measurements:

- Route completion is arc length along our route polyline (only gains count), not CARLA's count of
  passed route waypoints; in train mode a new route starts on arrival and pays its own 100.
- Speed limit: our maps carry none, so one limit (``speed_limit_kmh``, CARLA's 30 km/h urban
  default) applies everywhere; CaRL reads the limit of the road the vehicle is on.
- Outside lanes: nearest lane centre farther than half its width, or a nearest lane against the
  route's direction outside a junction; CARLA checks the lane type (sidewalk, shoulder) and lane id
  sign of the waypoint under the vehicle.
- Lane centre distance: to the nearest lane of our RoadMap, as CaRL (CARLA's projected waypoint).
- Comfort: accelerations are the simulator's (longitudinal acceleration, v x yaw rate), not finite
  differences of positions; derivatives are one least-squares polynomial fit per quantity at the
  last sample, where CaRL smooths with a Savitzky-Golay filter first and differentiates the result.
- TTC: only the lead actor in the route corridor, closing at constant speed within 0.9 s; CaRL
  forecasts every vehicle, walker and static object along its heading and tests box overlap.
- Red light: the front bumper crossing a red light's stop line on the route; CARLA tests the
  vehicle's crossing of the light's trigger area. Yellow is not an infraction (as CaRL).
- Not modelled: stop signs (our maps have none as infractions), off-road as a fraction of the box
  (ours: a static collision ends the episode), the leaderboard's 30 m route deviation (ours:
  ``env.max_lateral``, 3 m), blocked = 90 s below 1 km/h (CARLA: 0.1 m/s), CaRL's 1200 s timeout
  (ours: ``env.max_distance`` / ``env.max_episode_steps`` truncation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import Reward


@dataclass
class CaRL(Reward):
    """Route completion x soft-infraction factors - a hint on collision / red light (module doc)."""

    speed_limit_kmh: float = 30.0
    max_overspeed_kmh: float = 2.23 * 3.6  # CaRL: 2.23 m/s over the limit zeroes the step
    outside_lanes_factor: float = 0.0
    ttc_factor: float = 0.5
    comfort_factor: float = 0.5
    lane_center_factor: float = 0.5
    off_center_time_limit: float = 3.0  # s
    terminal_hint: float = 1.0
    name: str = "carl"
    needs = ("route_completion", "outside_lanes", "speed_kmh", "ttc_violation",
             "comfort_violations", "off_center_time", "collision", "red_light_run")

    def __post_init__(self):
        for k in ("outside_lanes_factor", "ttc_factor", "comfort_factor", "lane_center_factor"):
            v = getattr(self, k)
            if not (np.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"reward carl: {k} must be in [0, 1], got {v}")
        for k in ("speed_limit_kmh", "max_overspeed_kmh", "off_center_time_limit"):
            v = getattr(self, k)
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"reward carl: {k} must be a positive number, got {v}")
        if not np.isfinite(self.terminal_hint):
            raise ValueError(f"reward carl: terminal_hint must be finite, got {self.terminal_hint}")

    def factors(self, b) -> dict[str, np.ndarray]:
        """Each soft infraction's factor in [0, 1], in the order they are applied."""
        over = np.maximum(b["speed_kmh"] - self.speed_limit_kmh, 0.0)
        return {
            "outside_lanes": np.where(b["outside_lanes"] > 0.5, self.outside_lanes_factor, 1.0),
            "speeding": np.clip(1.0 - over / self.max_overspeed_kmh, 0.0, 1.0),
            "ttc": np.where(b["ttc_violation"] > 0.5, self.ttc_factor, 1.0),
            "comfort": 1.0 - self.comfort_factor * np.clip(b["comfort_violations"], 0, 6) / 6.0,
            "lane_center": np.where(b["off_center_time"] > self.off_center_time_limit,
                                    self.lane_center_factor, 1.0),
        }

    def terms(self, b):
        """``progress`` (the raw route completion), then what each factor takes away from what is
        left (<= 0), then the termination hint: they sum to the reward."""
        paid = np.asarray(b["route_completion"], np.float64)
        out = {"progress": paid}
        for k, f in self.factors(b).items():
            out[k] = paid * (f - 1.0)
            paid = paid * f
        hard = (b["collision"] > 0.5) | (b["red_light_run"] > 0.5)
        out["terminal"] = -self.terminal_hint * hard.astype(np.float64)
        return out
