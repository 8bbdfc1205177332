"""Live CARLA (0.9.13-0.9.16) behind the embedded simulator's surface: ``sim=carla``.

The package imports ``carla`` only when a backend is built (``default_api``), so importing it is
cheap and works where the client is not installed. See docs/carla.md.
"""

from .backend import CarlaBackend, CarlaBackendError, SensorQueue
from .config import CameraConfig, CarlaConfig, OpenDriveWorld
from .connection import CarlaConnectionError, CarlaVersionWarning, check_versions, connect

__all__ = ["CameraConfig", "CarlaBackend", "CarlaBackendError", "CarlaConfig",
           "CarlaConnectionError", "CarlaVersionWarning", "OpenDriveWorld", "SensorQueue",
           "check_versions", "connect"]
