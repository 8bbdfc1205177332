"""Training runs: config -> envs, reward, agent; checkpoints, resume, logging, metrics.

``train`` is imported on first use (PEP 562): the config checks of :mod:`.validate` run as a Hydra
callback before a run starts, and loading them should not pull in torch and Stable-Baselines3 (a
rejected setting is reported in about a second instead of after the learning stack's imports)."""

from .validate import ConfigError, config_problems, validate_config

__all__ = ["ConfigError", "config_problems", "train", "validate_config"]


def __getattr__(name: str):
    if name == "train":
        from .run import train

        return train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
