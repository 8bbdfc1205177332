"""Load a trained run's policy, frozen, for evaluation on the fixed routes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch as th
import yaml

from .build import check_compatible
from .callbacks import latest_checkpoint


def load_policy(run_dir: str | Path, checkpoint: str = "latest", device: str = "auto"):
    """(policy(obs) -> action, model) from ``run_dir``'s latest checkpoint (or the given
    ``model_<steps>.zip``). The network is put in eval mode with gradients off; the action is
    the deterministic one."""
    run_dir = Path(run_dir)
    cfg_file = run_dir / "config.yaml"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{run_dir} is not a training run directory (no config.yaml); pass "
                                f"run=<the directory scripts/train.py printed>")
    cfg = yaml.safe_load(cfg_file.read_text())
    if checkpoint == "latest":
        entry = latest_checkpoint(run_dir)
        if entry is None:
            raise FileNotFoundError(f"no checkpoint in {run_dir / 'checkpoints'} (latest.json missing)")
        path = entry["model"]
    else:
        path = checkpoint
    if not Path(path).exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    from ..agents import DriveSAC
    from ..agents.ppo import DrivePPO
    cls = {"sac": DriveSAC, "ppo": DrivePPO}[cfg["algo"]["name"]]
    model = cls.load(path, device=device)
    model.policy.set_training_mode(False)
    for p in model.policy.parameters():
        p.requires_grad_(False)

    def policy(obs):
        with th.no_grad():
            action, _ = model.predict(obs, deterministic=True)
        return np.asarray(action, np.float32)

    policy.model = model
    policy.config = cfg
    policy.obs_signature = json.loads((run_dir / "obs_signature.json").read_text()) \
        if (run_dir / "obs_signature.json").exists() else None
    return policy, model


def check_policy_env(policy, env_space, where):
    """A clear error when the env's observations differ from the checkpoint's."""
    if policy.obs_signature is not None:
        check_compatible(policy.obs_signature, env_space, where)
