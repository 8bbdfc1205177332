"""Training runs: config -> envs, reward, agent; checkpoints, resume, logging, metrics."""

from .run import train
from .validate import ConfigError, config_problems, validate_config

__all__ = ["ConfigError", "config_problems", "train", "validate_config"]
