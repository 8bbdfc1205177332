"""Rewards as batch functions over stored per-step facts (see :mod:`.base`)."""

import inspect

from .base import Composite, Reward
from .kinematic import ASAP, HVFR, TIRL, Chen, ChatScene, Task
from .revolve import Revolve
from .carl import CaRL
from .drivemind import DriveMind
from .drivevlm import DriveVLMSynth, drivevlm_rl
from .semantic import AICRStatic, drivemind_static
from .contrastive import CLG, LORD, VLMRM, VLMSR, LORDSpeed, RoboCLIP, VLMRLSynth, vlm_rl
from .found_rl import FoundRLClip, found_rl_clip


def _kinematic_drivemind(rho1: float = 1.0, below_target: str = "ramp",
                         max_progress_speed_kmh: float | None = None) -> Composite:
    """DriveMind's kinematic part: task + rho1 x HVFR (``below_target``: HVFR's speed factor below
    the target speed, ``ramp`` or the paper's ``paper``; ``max_progress_speed_kmh``: the task's
    progress credited at most at this speed, None uncapped)."""
    return Composite({"task": (1.0, Task(max_progress_speed_kmh=max_progress_speed_kmh)),
                      "hvfr": (rho1, HVFR(below_target=below_target))}, name="drivemind_kinematic")


REWARDS = {
    "task": Task, "hvfr": HVFR, "tirl": TIRL, "chen": Chen, "asap": ASAP, "chatscene": ChatScene,
    "carl": CaRL,
    "revolve": Revolve, "drivemind_kinematic": _kinematic_drivemind,
    "aicr_static": AICRStatic, "drivemind_static": drivemind_static, "drivemind": DriveMind, "drivevlm_rl": drivevlm_rl,
    "vlm_rl": vlm_rl, "vlm_sr": VLMSR, "roboclip": RoboCLIP, "vlm_rm": VLMRM, "lord": LORD,
    "lord_speed": LORDSpeed, "found_rl_clip": found_rl_clip,
}


def reward_params(name: str) -> tuple[str, ...]:
    """The keyword parameters ``make_reward(name, ...)`` accepts (``name`` itself excluded)."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; valid: {', '.join(REWARDS)}")
    sig = inspect.signature(REWARDS[name])
    return tuple(p.name for p in sig.parameters.values()
                 if p.name != "name" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def make_reward(name: str, **kwargs) -> Reward:
    """A reward by name, configured by keyword (e.g. a Hydra ``reward.params`` mapping).

    Unknown names list the valid ones; unknown parameters raise one ``TypeError`` that names
    them and lists the reward's valid parameters."""
    valid = reward_params(name)
    bad = [k for k in kwargs if k not in valid]
    if bad:
        raise TypeError(f"reward {name!r} got unknown parameter(s) {bad}; valid: "
                        f"{', '.join(valid) if valid else '(none)'}")
    return REWARDS[name](**kwargs)


__all__ = ["AICRStatic", "ASAP", "CaRL", "DriveMind", "DriveVLMSynth", "drivevlm_rl", "HVFR", "REWARDS", "TIRL", "Chen", "ChatScene", "Composite",
           "Revolve", "Reward", "Task", "drivemind_static", "make_reward", "reward_params",
           "CLG", "LORD", "LORDSpeed", "RoboCLIP", "VLMRLSynth", "VLMRM", "VLMSR", "vlm_rl",
           "FoundRLClip", "found_rl_clip"]
