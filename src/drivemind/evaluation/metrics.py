"""Episode records and the papers' driving metrics (see PAPERS.md, "Metrics").

An :class:`EpisodeAccumulator` is fed the env's ``info`` dict once per step and yields one
:class:`EpisodeRecord` per episode; :func:`compute_metrics` turns a list of records into the
table below. N episodes, S steps, T simulated seconds, D metres driven and C collisions in total
(a collision = a step whose ``collision`` fact is 1; the env terminates on it, so C counts
episodes with a collision, but nothing here assumes it).

==== ======================== ============================================================
key  unit                      definition
==== ======================== ============================================================
AS   km/h                      mean speed, time-weighted over every step of every episode:
                               sum(speed_kmh x dt) / T (= 3.6 D / T, since the odometer
                               integrates the same speed)
RC   fraction / routes         test mode: fraction of episodes whose route was reached
                               (``arrived``); train mode: mean routes completed per episode
                               (episodes chain routes)
TD   m                         mean distance driven per episode, D / N
CS   km/h                      mean collision speed: per episode the ego's speed at its
                               collision (mean of them if several), 0 for an episode without
                               one, averaged over all N episodes (VLM-RL's tables do this:
                               a run with no collision has CS 0)
SR   fraction                  episodes whose route was reached with no collision
                               (train mode: at least one route reached, no collision)
CR   fraction                  episodes with at least one collision
TCF  collisions / 1000 steps   1000 C / S
DCF  collisions / km           C / (D / 1000); 0 if C = 0, inf if C > 0 and D = 0
ICT  steps                     mean steps between collisions, S / C. With C = 0 it is S, a
                               lower bound, and ``ICT_censored`` is True
AC   collisions / episode      C / N (one episode per route in test mode)
==== ======================== ============================================================

Also in the dict: ``episodes`` N, ``steps`` S, ``distance_km`` D / 1000, ``collisions`` C,
``completion`` (mean fraction of the route progressed), ``ICT_censored``, ``mode``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import numpy as np

METRIC_KEYS = ("AS", "RC", "TD", "CS", "SR", "CR", "TCF", "DCF", "ICT", "AC")
MODES = ("test", "train")


@dataclass
class EpisodeRecord:
    """One episode's outcome (one fixed route in test mode)."""

    route_index: int
    steps: int
    distance_m: float
    duration_s: float
    mean_speed_kmh: float  # time-weighted over the episode's steps
    arrived: bool  # a route's goal was reached during the episode
    completion: float  # fraction of the (last) route progressed, [0, 1]; 1 when it was reached
    routes_completed: float
    collisions: int
    collision_speeds_kmh: list[float] = field(default_factory=list)
    termination: str = ""
    truncation: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EpisodeRecord":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class EpisodeAccumulator:
    """Builds an :class:`EpisodeRecord` from the env's ``info`` dicts, O(1) per step.

        acc = EpisodeAccumulator()
        obs, info = env.reset(...); acc.start(info)
        ... obs, r, term, trunc, info = env.step(a); acc.add(info) ...
        record = acc.finish()

    ``start`` is optional (without it the episode starts at time 0, route index from the steps).
    """

    def __init__(self):
        self.start()

    def start(self, info: dict | None = None) -> None:
        """Begin an episode; ``info`` is the reset's info (optional)."""
        info = info or {}
        self.route_index = int(info.get("route_index", -1))
        self._t0 = self._t = float(info.get("time", 0.0))
        self.steps = 0
        self._speed_time = 0.0  # sum of speed_kmh x dt
        self._distance = float(info.get("distance", 0.0))
        self._route_progress = float(info.get("route_progress", 0.0))
        self._route_length = float(info.get("route_length", 0.0))
        self._routes_completed = float(info.get("routes_completed", 0.0))
        self._arrived_any = False
        self._arrived_last = False
        self.collisions = 0
        self._collision_speeds: list[float] = []  # one entry per collision, not per step
        self._termination = self._truncation = ""

    def add(self, info: dict) -> None:
        """One step's info (after ``env.step``)."""
        t = float(info["time"])
        self._speed_time += float(info["speed_kmh"]) * (t - self._t)
        self._t = t
        self.steps += 1
        self.route_index = int(info.get("route_index", self.route_index))
        self._distance = float(info["distance"])
        self._route_progress = float(info["route_progress"])
        self._route_length = float(info["route_length"])
        self._routes_completed = float(info["routes_completed"])
        if info["collision"]:
            self.collisions += 1
            self._collision_speeds.append(float(info["collision_speed_kmh"]))
        self._arrived_last = bool(info.get("arrived", False))
        self._arrived_any |= self._arrived_last
        self._termination = str(info.get("termination", "") or "")
        self._truncation = str(info.get("truncation", "") or "")

    def finish(self, truncation: str | None = None) -> EpisodeRecord:
        """The episode's record; ``truncation`` overrides the env's (e.g. ``"max_steps"`` when the
        caller stopped the episode)."""
        duration = self._t - self._t0
        if self._arrived_last:  # the last info still describes the route that was reached
            completion = 1.0
        elif self._route_length > 0:
            completion = float(np.clip(self._route_progress / self._route_length, 0.0, 1.0))
        else:
            completion = 0.0
        return EpisodeRecord(
            route_index=self.route_index, steps=self.steps, distance_m=self._distance,
            duration_s=duration,
            mean_speed_kmh=self._speed_time / duration if duration > 0 else 0.0,
            arrived=self._arrived_any, completion=completion,
            routes_completed=self._routes_completed, collisions=self.collisions,
            collision_speeds_kmh=list(self._collision_speeds), termination=self._termination,
            truncation=self._truncation if truncation is None else truncation)


def compute_metrics(records: list[EpisodeRecord], mode: str = "test") -> dict:
    """The ten metrics (module docstring) over ``records``; ``mode`` "test" or "train" (RC, SR)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    records = list(records)
    if not records:
        raise ValueError("compute_metrics needs at least one episode record")
    n = len(records)
    steps = sum(int(r.steps) for r in records)
    if steps <= 0:
        raise ValueError(f"the {n} episode record(s) hold no steps; nothing to measure")
    duration = sum(float(r.duration_s) for r in records)
    distance = sum(float(r.distance_m) for r in records)
    collisions = sum(int(r.collisions) for r in records)
    arrived = np.array([bool(r.arrived) for r in records])
    collided = np.array([r.collisions > 0 for r in records])
    speed_time = sum(float(r.mean_speed_kmh) * float(r.duration_s) for r in records)
    cs = [float(np.mean(r.collision_speeds_kmh)) if r.collision_speeds_kmh else 0.0
          for r in records]
    if mode == "test":
        rc = float(arrived.mean())
    else:
        rc = float(np.mean([float(r.routes_completed) for r in records]))
    if collisions:
        dcf = collisions / (distance / 1000.0) if distance > 0 else math.inf
    else:
        dcf = 0.0
    return {
        "AS": speed_time / duration if duration > 0 else 0.0,
        "RC": rc,
        "TD": distance / n,
        "CS": float(np.mean(cs)),
        "SR": float((arrived & ~collided).mean()),
        "CR": float(collided.mean()),
        "TCF": 1000.0 * collisions / steps,
        "DCF": dcf,
        "ICT": steps / collisions if collisions else float(steps),
        "ICT_censored": collisions == 0,
        "AC": collisions / n,
        "completion": float(np.mean([float(r.completion) for r in records])),
        "episodes": n,
        "steps": steps,
        "distance_km": distance / 1000.0,
        "collisions": collisions,
        "mode": mode,
    }
