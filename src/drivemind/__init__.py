"""DriveMind: driving-policy RL on VLM and kinematic rewards, with an embedded simulator.

Importing the package registers the Gymnasium env ``DriveMind-v0`` (lazily: the env module loads
on ``gymnasium.make``).
"""

__version__ = "0.1.0"


def _register() -> None:
    try:
        import gymnasium as gym
    except ImportError:  # pragma: no cover - gymnasium is a core dependency
        return
    if "DriveMind-v0" not in gym.registry:
        gym.register(id="DriveMind-v0", entry_point="drivemind.envs.driving_env:DriveEnv")


_register()

from .naming import register_resolvers as _register_resolvers  # noqa: E402

_register_resolvers()  # run/sweep names in configs/config.yaml
