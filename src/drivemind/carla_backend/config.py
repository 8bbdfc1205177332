"""Settings of the CARLA backend (``sim.carla`` in ``configs/sim/carla.yaml``).

Everything about *what* is simulated (time step, traffic counts, spawn gap, walker speeds, the
off-road margin) comes from the same :class:`drivemind.sim.SimConfig` the embedded simulator
uses; this file holds only what is particular to a CARLA server: where it is, how long to wait,
Traffic Manager and sensor settings.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field

from ..sim.config import check_options


@dataclass(frozen=True)
class CameraConfig:
    """Optional forward RGB camera on the ego (DriveVLM-RL's dynamic pathway reads it)."""

    enabled: bool = False
    width: int = 448
    height: int = 252
    fov: float = 90.0  # degrees, horizontal
    x: float = 1.5  # m ahead of the ego's centre
    z: float = 2.4  # m above it
    pitch: float = -8.0  # degrees


@dataclass(frozen=True)
class OpenDriveWorld:
    """Parameters of ``client.generate_opendrive_world`` for built-in towns and .xodr files."""

    vertex_distance: float = 2.0  # m between mesh vertices
    max_road_length: float = 50.0  # m per mesh piece
    wall_height: float = 1.0  # m walls at the road edge (0: none)
    additional_width: float = 0.6  # m of extra road surface at the edges
    smooth_junctions: bool = True
    enable_mesh_visibility: bool = True
    enable_pedestrian_navigation: bool = True  # walkers need the navigation mesh


@dataclass(frozen=True)
class CarlaConfig:
    host: str = "localhost"
    port: int = 2000  # the server's RPC port (-carla-rpc-port); it also uses port + 1 and + 2
    timeout: float = 10.0  # s to wait for the server: connecting, every request, every tick
    load_timeout: float = 120.0  # s to wait while the server loads or generates a world
    reload_world: bool = False  # load the town even when the server already has it loaded
    tm_port: int = 8000  # Traffic Manager port
    hybrid_physics: bool = True  # TM: full physics only near the ego
    hybrid_radius: float = 70.0  # m
    tm_leading_distance: float = 2.5  # m: TM's global distance to the leading vehicle
    tm_speed_difference: float | None = None  # % below the speed limit (None: TM's default, 30)
    walker_cross_factor: float = 0.3  # share of walkers that cross roads (CARLA's cross factor)
    ego_blueprint: str = "vehicle.lincoln.mkz_2020"
    spawn_lift: float = 0.5  # m above the road at which actors are spawned
    no_rendering: bool | None = None  # None: on unless the camera is enabled
    sensor_timeout: float = 2.0  # s to wait for the camera frame of a tick
    reconnect_attempts: int = 3  # after losing the server mid-run
    reconnect_wait: float = 5.0  # s between attempts
    camera: CameraConfig = field(default_factory=CameraConfig)
    opendrive: OpenDriveWorld = field(default_factory=OpenDriveWorld)

    def __post_init__(self):
        if not isinstance(self.host, str) or not self.host.strip():
            raise ValueError(f"sim.carla.host must be a host name or address, got {self.host!r}")
        for name in ("port", "tm_port"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 < v < 65536:
                raise ValueError(f"sim.carla.{name} must be a port number 1-65535, got {v!r}")
        for name in ("timeout", "load_timeout", "sensor_timeout"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"sim.carla.{name} must be a positive number of seconds, got {v!r}")
        if not (isinstance(self.reconnect_attempts, int) and self.reconnect_attempts >= 0):
            raise ValueError("sim.carla.reconnect_attempts must be a non-negative integer, got "
                             f"{self.reconnect_attempts!r}")
        if not 0.0 <= float(self.walker_cross_factor) <= 1.0:
            raise ValueError(f"sim.carla.walker_cross_factor must be in [0, 1], got "
                             f"{self.walker_cross_factor!r}")
        if self.reconnect_wait < 0 or self.hybrid_radius <= 0 or self.tm_leading_distance < 0:
            raise ValueError("sim.carla.reconnect_wait and tm_leading_distance must be >= 0 and "
                             "hybrid_radius > 0")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def render(self) -> bool:
        """Whether the server must render (a camera needs it)."""
        return self.camera.enabled if self.no_rendering is None else not self.no_rendering

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: "dict | CarlaConfig | None") -> "CarlaConfig":
        if isinstance(d, CarlaConfig):
            return d
        d = dict(d or {})
        check_options(cls, d, "sim.carla")
        for key, sub in (("camera", CameraConfig), ("opendrive", OpenDriveWorld)):
            if isinstance(d.get(key), dict):
                check_options(sub, d[key], f"sim.carla.{key}")
                d[key] = sub(**d[key])
            elif d.get(key) is None:
                d.pop(key, None)
        return cls(**d)


