"""Training runs: config -> envs, reward, agent; checkpoints, resume, logging, metrics."""

from .run import train

__all__ = ["train"]
