"""The Gymnasium env (registered as ``DriveMind-v0`` when :mod:`drivemind` is imported)."""

from ..facts import FACT_KEYS
from .driving_env import TERMINATIONS, TRUNCATIONS, DriveEnv, EnvConfig

ENV_ID = "DriveMind-v0"

__all__ = ["DriveEnv", "EnvConfig", "ENV_ID", "FACT_KEYS", "TERMINATIONS", "TRUNCATIONS"]
