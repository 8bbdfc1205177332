"""Rewards from kinematic facts: the task reward, DriveMind's hierarchical vehicle-state fusion
(HVFR, also VLM-RL's Phase II synthesis), and the classic baselines the papers compare against.

Formulas the papers leave open are our choices, documented in docs/rewards.md and kept as
constructor arguments (and, with the training stack, Hydra config values).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import Reward


@dataclass
class Task(Reward):
    """Progress along the route (m) x ``progress_weight`` + ``failure_penalty`` on a failure
    termination: the env's own task reward, recomputable with other weights.

    ``max_progress_speed_kmh`` (None: uncapped, the papers' reading and the default): a step's
    progress is credited at most at this speed, progress x min(1, cap / speed), so driving faster
    than the cap earns no more distance per step. Uncapped, progress pays linearly for speed
    without bound, and a sum with a speed term that stops paying above its target (HVFR) pays
    *more* at 80 km/h than at the target (docs/rewards.md "Speeding")."""

    progress_weight: float = 1.0
    failure_penalty: float = -10.0
    max_progress_speed_kmh: float | None = None
    name: str = "task"
    needs = ("progress", "failure")

    def __post_init__(self):
        cap = self.max_progress_speed_kmh
        if cap is not None:
            if not (np.isfinite(cap) and cap > 0):
                raise ValueError(f"task max_progress_speed_kmh must be a positive speed in km/h or "
                                 f"null (uncapped), got {cap!r}")
            self.needs = (*type(self).needs, "speed_kmh")

    def terms(self, b):
        progress = b["progress"]
        if self.max_progress_speed_kmh is not None:
            v = np.abs(b["speed_kmh"])
            progress = progress * np.minimum(1.0, self.max_progress_speed_kmh / np.maximum(v, 1e-6))
        return {"progress": self.progress_weight * progress,
                "failure": self.failure_penalty * b["failure"]}


def _ramp(x, lo, hi):
    """0 at ``lo``, 1 at ``hi`` (linear, clipped); works for lo > hi (a falling ramp)."""
    return np.clip((x - lo) / (hi - lo), 0.0, 1.0)


@dataclass
class HVFR(Reward):
    """R_synth = r_speed x f_center x f_angle x f_stability, each in [0, 1] (a product: any factor
    at 0 vetoes the whole term).

    - r_speed: below the target (``below_target="ramp"``, the default) v / v_target, so standing
      still on a free road pays 0 and a full stop before an obstacle pays 1; above it
      1 - (v - v_target) / v_max. v_target is ``target_kmh`` scaled down towards 0 as the gap to an
      obstacle that requires stopping (lead actor, red or yellow light) shrinks below
      ``stop_distance`` ("context-appropriate target velocities"). ``below_target="paper"`` is the
      paper's 1 - |v - v_target| / v_max on both sides: it pays 0.36 per step for standing on a free
      road, which made SAC learn to stand still (docs/rewards.md).
    - f_center: 1 - |lateral offset| / ``max_offset``.
    - f_angle: 1 - |heading error| / ``max_angle``.
    - f_stability: 1 - lateral oscillation (std of recent offsets) / ``max_oscillation``.
    """

    target_kmh: float = 22.5  # VLM-RL's code: full speed reward between 20 and 25 km/h
    v_max_kmh: float = 35.0
    stop_distance: float = 15.0  # m: gap below which the target speed falls linearly to 0
    standstill_gap: float = 2.0  # m: gap at which the target is 0
    max_offset: float = 2.0  # m
    max_angle: float = np.pi / 4
    max_oscillation: float = 0.5  # m
    below_target: str = "ramp"  # ramp: 0 at rest -> 1 at the target; paper: 1 - |v - target| / v_max
    name: str = "hvfr"
    needs = ("speed_kmh", "lateral_offset", "heading_error", "lateral_oscillation", "lead_distance",
             "light_state", "light_distance")

    def __post_init__(self):
        if self.below_target not in ("ramp", "paper"):
            raise ValueError(f"hvfr below_target must be 'ramp' or 'paper', got {self.below_target!r}")

    def speed_factor(self, v, target):
        paper = np.clip(1.0 - np.abs(v - target) / self.v_max_kmh, 0.0, 1.0)
        if self.below_target == "paper":
            return paper
        ramp = np.where(target > 0, v / np.maximum(target, 1e-6), 1.0)
        return np.where(v < target, np.clip(ramp, 0.0, 1.0), paper)

    def factors(self, b):
        light_stop = (b["light_state"] == 1) | (b["light_state"] == 2)
        gap = np.minimum(b["lead_distance"], np.where(light_stop, b["light_distance"], np.inf))
        target = self.target_kmh * _ramp(gap, self.standstill_gap, self.stop_distance)
        return {
            "speed": self.speed_factor(b["speed_kmh"], target),
            "center": np.clip(1.0 - np.abs(b["lateral_offset"]) / self.max_offset, 0.0, 1.0),
            "angle": np.clip(1.0 - np.abs(b["heading_error"]) / self.max_angle, 0.0, 1.0),
            "stability": np.clip(1.0 - b["lateral_oscillation"] / self.max_oscillation, 0.0, 1.0),
        }

    def terms(self, b):
        f = self.factors(b)
        return {"synth": f["speed"] * f["center"] * f["angle"] * f["stability"]}


@dataclass
class TIRL(Reward):
    """-1 on a collision, else 0."""

    name: str = "tirl"
    needs = ("collision",)

    def terms(self, b):
        return {"collision": -1.0 * b["collision"]}


@dataclass
class Chen(Reward):
    """-10 collision + v / v_max - 2 |lateral offset| - 0.5 |steer| (Chen et al., as in VLM-RL)."""

    v_max_kmh: float = 25.0
    w_collision: float = 10.0
    w_speed: float = 1.0
    w_lane: float = 2.0
    w_steer: float = 0.5
    name: str = "chen"
    needs = ("collision", "speed_kmh", "lateral_offset", "steer")

    def terms(self, b):
        return {"collision": -self.w_collision * b["collision"],
                "speed": self.w_speed * b["speed_kmh"] / self.v_max_kmh,
                "lane": -self.w_lane * np.abs(b["lateral_offset"]),
                "steer": -self.w_steer * np.abs(b["steer"])}


@dataclass
class ASAP(Reward):
    """1 progress + 2 overtakes - 5 collision - 3 off-road (ASAP-RL's weights)."""

    name: str = "asap"
    needs = ("progress", "overtakes", "collision", "offroad")

    def terms(self, b):
        vehicle_or_walker = b["collision"] * (1.0 - b["offroad"])  # off-road has its own term
        return {"progress": b["progress"], "overtake": 2.0 * b["overtakes"],
                "collision": -5.0 * vehicle_or_walker, "offroad": -3.0 * b["offroad"]}


@dataclass
class ChatScene(Reward):
    """-0.5 |longitudinal jerk| - 0.5 |lateral acceleration| - 5 collision + 0.1 (ChatScene's
    smoothness reward). Jerk in m/s^3 and acceleration in m/s^2 are scaled by ``jerk_scale`` and
    ``accel_scale`` so a comfortable drive costs about as much as the 0.1 bonus."""

    jerk_scale: float = 10.0
    accel_scale: float = 4.0
    name: str = "chatscene"
    needs = ("jerk", "lateral_accel", "collision")

    def terms(self, b):
        return {"jerk": -0.5 * np.abs(b["jerk"]) / self.jerk_scale,
                "lateral_accel": -0.5 * np.abs(b["lateral_accel"]) / self.accel_scale,
                "collision": -5.0 * b["collision"], "alive": np.float64(0.1)}
