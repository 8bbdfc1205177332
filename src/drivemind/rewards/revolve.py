"""A REvolve-style evolved driving reward (the ``revolve`` baseline of VLM-RL's comparisons).

REvolve (Hazra et al., ICLR 2025) evolves reward *code* with an LLM: each candidate is a Python
function over the vehicle state that returns a total and a dict of components, and REvolve's
driving prompts ask that every transformed component use its own named temperature, e.g.
``np.exp(-|x| / T)``, normalised to a fixed range. VLM-RL compares against "their best-performing
reward function provided in the paper"; that function's text is not in our sources, so this is a
reward *of the form* REvolve evolves, with constants of our choosing (all constructor arguments,
i.e. config values), not the verbatim REvolve function. See docs/rewards.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from .base import Reward


@dataclass
class Revolve(Reward):
    """Weighted sum of temperature-scaled shaping components, each in [0, 1] (progress in
    (-1, 1)), plus penalties::

        speed    w_speed    x exp(-e_v / T_v),  e_v = distance (km/h) of v outside [v_lo, v_hi]
        center   w_center   x exp(-|lateral offset| / T_d)
        heading  w_heading  x exp(-|heading error| / T_psi)
        smooth   w_smooth   x exp(-|jerk| / T_jerk)
        headway  w_headway  x exp(-max(0, safe_gap - lead distance) / T_gap)
        progress w_progress x tanh(progress per step / T_p)
        collision -w_collision x collision            (off-road is a collision with the static world)
        failure   -w_failure x failure x (1 - collision)   (the other failures: off-route, stuck)

    The shaping weights default to a sum of 1, so a step without a failure scores in
    (-w_progress, 1] (about 0.9 when cruising in the lane centre), and a collision costs 10 —
    the scale of ``chen`` (about 1 per step, -10 collision) and of ``hvfr`` ([0, 1]).
    """

    speed_min_kmh: float = 20.0  # the 20-25 km/h plateau of VLM-RL's code (HVFR's target band)
    speed_max_kmh: float = 25.0
    temp_speed_kmh: float = 5.0
    temp_offset: float = 0.5  # m
    temp_heading: float = 0.2  # rad (about 11 degrees)
    temp_jerk: float = 10.0  # m/s^3 (ChatScene's jerk scale)
    safe_gap: float = 10.0  # m to the lead actor below which headway decays
    temp_gap: float = 4.0  # m
    temp_progress: float = 0.5  # m per step (22.5 km/h at 0.1 s is 0.625 m)
    w_speed: float = 0.3
    w_center: float = 0.2
    w_heading: float = 0.1
    w_smooth: float = 0.1
    w_headway: float = 0.1
    w_progress: float = 0.2
    w_collision: float = 10.0
    w_failure: float = 10.0
    name: str = "revolve"
    needs = ("speed_kmh", "lateral_offset", "heading_error", "jerk", "lead_distance", "progress",
             "collision", "failure")

    def __post_init__(self):
        for f in fields(self):
            if f.name == "name":
                continue
            v = getattr(self, f.name)
            if not math.isfinite(v):
                raise ValueError(f"revolve: {f.name} must be finite, got {v}")
            if f.name.startswith("temp_") and v <= 0:
                raise ValueError(f"revolve: temperature {f.name} must be > 0, got {v}")
        if not 0 <= self.speed_min_kmh <= self.speed_max_kmh:
            raise ValueError(f"revolve: need 0 <= speed_min_kmh <= speed_max_kmh, got "
                             f"{self.speed_min_kmh}, {self.speed_max_kmh}")

    def components(self, b):
        """The unweighted components: speed, center, heading, smooth, headway in [0, 1],
        progress in (-1, 1)."""
        v = b["speed_kmh"]
        speed_err = np.maximum(0.0, np.maximum(self.speed_min_kmh - v, v - self.speed_max_kmh))
        close = np.maximum(0.0, self.safe_gap - b["lead_distance"])
        return {
            "speed": np.exp(-speed_err / self.temp_speed_kmh),
            "center": np.exp(-np.abs(b["lateral_offset"]) / self.temp_offset),
            "heading": np.exp(-np.abs(b["heading_error"]) / self.temp_heading),
            "smooth": np.exp(-np.abs(b["jerk"]) / self.temp_jerk),
            "headway": np.exp(-close / self.temp_gap),
            "progress": np.tanh(b["progress"] / self.temp_progress),
        }

    def terms(self, b):
        c = self.components(b)
        return {
            "speed": self.w_speed * c["speed"], "center": self.w_center * c["center"],
            "heading": self.w_heading * c["heading"], "smooth": self.w_smooth * c["smooth"],
            "headway": self.w_headway * c["headway"], "progress": self.w_progress * c["progress"],
            "collision": -self.w_collision * b["collision"],
            "failure": -self.w_failure * b["failure"] * (1.0 - b["collision"]),
        }
