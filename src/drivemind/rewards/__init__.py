"""Rewards as batch functions over stored per-step facts (see :mod:`.base`)."""

from .base import Composite, Reward
from .kinematic import ASAP, HVFR, TIRL, Chen, ChatScene, Task


def _kinematic_drivemind(rho1: float = 1.0) -> Composite:
    """DriveMind's kinematic part: task + rho1 x HVFR (the semantic terms arrive later)."""
    return Composite({"task": (1.0, Task()), "hvfr": (rho1, HVFR())}, name="drivemind_kinematic")


REWARDS = {
    "task": Task, "hvfr": HVFR, "tirl": TIRL, "chen": Chen, "asap": ASAP, "chatscene": ChatScene,
    "drivemind_kinematic": _kinematic_drivemind,
}


def make_reward(name: str, **kwargs) -> Reward:
    """A reward by name; unknown names list the valid ones."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; valid: {', '.join(REWARDS)}")
    return REWARDS[name](**kwargs)


__all__ = ["ASAP", "HVFR", "REWARDS", "TIRL", "Chen", "ChatScene", "Composite", "Reward", "Task",
           "make_reward"]
