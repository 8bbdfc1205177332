"""WorldSnapshot: what a backend returns each step. The lite and CARLA backends fill the same type.

Everything is numpy arrays in CARLA's world frame (see :mod:`drivemind.maps.roadmap`); speeds in
m/s, angles in radians, extents are half-sizes (as CARLA's bounding-box extent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np


class ActorClass(IntEnum):
    NONE = 0
    CAR = 1
    MOTORCYCLE = 2
    BICYCLE = 3
    WALKER = 4
    STATIC = 5


VEHICLE_CLASSES = (ActorClass.CAR, ActorClass.MOTORCYCLE, ActorClass.BICYCLE)


class LightState(IntEnum):
    GREEN = 0
    YELLOW = 1
    RED = 2
    OFF = 3


@dataclass
class EgoState:
    x: float
    y: float
    yaw: float
    speed: float  # m/s, along the heading
    yaw_rate: float  # rad/s
    accel: float  # m/s^2, longitudinal
    steer: float  # applied action, [-1, 1]
    throttle: float  # [0, 1]
    brake: float  # [0, 1]
    extent: tuple[float, float]  # half length, half width

    @property
    def velocity(self) -> np.ndarray:
        return np.array([self.speed * np.cos(self.yaw), self.speed * np.sin(self.yaw)])


@dataclass
class Actors:
    """All actors but the ego, one row each."""

    id: np.ndarray  # (N,) int64, stable over an episode
    cls: np.ndarray  # (N,) int8 ActorClass
    pos: np.ndarray  # (N, 2)
    yaw: np.ndarray  # (N,)
    extent: np.ndarray  # (N, 2) half length, half width
    velocity: np.ndarray  # (N, 2)

    def __len__(self) -> int:
        return len(self.id)

    def of_class(self, *classes) -> np.ndarray:
        return np.isin(self.cls, np.array([int(c) for c in classes], np.int8))

    @classmethod
    def empty(cls) -> "Actors":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros((0, 2)), np.zeros(0),
                   np.zeros((0, 2)), np.zeros((0, 2)))


@dataclass
class TrafficLights:
    id: np.ndarray  # (M,) int64
    pos: np.ndarray  # (M, 2) centre of the stop line(s) this light controls
    yaw: np.ndarray  # (M,) heading of the traffic it controls
    state: np.ndarray  # (M,) uint8 LightState
    stop_lines: list = field(default_factory=list)  # per light: (k, 2, 2) stop-line segments

    def __len__(self) -> int:
        return len(self.id)

    def stop_line_segments(self) -> tuple[np.ndarray, np.ndarray]:
        """All stop lines as one (S, 2, 2) array, and the light index of each segment (S,)."""
        segs = [np.asarray(s, float).reshape(-1, 2, 2) for s in self.stop_lines]
        owner = np.concatenate([np.full(len(s), i, np.int64) for i, s in enumerate(segs)]) \
            if segs else np.zeros(0, np.int64)
        return (np.concatenate(segs) if segs else np.zeros((0, 2, 2))), owner


@dataclass
class CollisionEvent:
    other_id: int
    other_class: ActorClass
    ego_speed: float  # m/s at impact
    other_speed: float
    x: float
    y: float


@dataclass
class WorldSnapshot:
    frame: int
    time: float  # simulated seconds since reset
    dt: float
    ego: EgoState
    actors: Actors
    lights: TrafficLights
    collisions: list[CollisionEvent] = field(default_factory=list)  # new ego contacts this step
    npc_collisions: int = 0  # new contacts among background actors this step (diagnostics)
    backend: str = "lite"
