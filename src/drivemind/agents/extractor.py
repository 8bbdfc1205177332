"""The papers' feature extractor: a BEV CNN, an ego-state MLP and a waypoint MLP, concatenated.

    BEV (C x H x W uint8)  -> Conv(C,32,8,4) - Conv(32,64,4,2) - Conv(64,64,3,1) - FC(bev_dim)
    ego (speed, steer, yaw rate)   -> FC128 - FC(state_dim)
    waypoints (K x 2, ego frame)    -> FC128 - FC(state_dim)
    features = concat(...)          -> actor and critic heads (3-layer MLPs in the papers)

DriveMind shares this extractor between actor and critic; ``DriveSAC`` trains it with the critic
loss only (the actor reads detached features), so one CNN pass per batch serves both. The papers use
``bev_dim`` 1024; the CPU default is 256 (the same as SB3's NatureCNN, so the two compare fairly).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch as th
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn


def _check_space(space: gym.spaces.Dict) -> tuple[int, int, int]:
    if not isinstance(space, gym.spaces.Dict) or "bev" not in space.spaces:
        raise ValueError("DriveExtractor needs a Dict observation with a 'bev' image (the "
                         f"DriveMind-v0 observation); got {space}")
    shape = space["bev"].shape
    if len(shape) != 3:
        raise ValueError(f"obs['bev'] must be C x H x W, got shape {shape}")
    return shape


class DriveExtractor(BaseFeaturesExtractor):
    """BEV CNN + ego MLP + waypoint MLP (see the module docstring). ``bev`` arrives scaled to
    [0, 1] by SB3's preprocessing (uint8 image spaces are divided by 255)."""

    def __init__(self, observation_space: gym.spaces.Dict, bev_dim: int = 256, state_dim: int = 64,
                 hidden: int = 128):
        c, h, w = _check_space(observation_space)
        if min(h, w) < 36:
            raise ValueError(f"the BEV CNN (8/4, 4/2, 3/1 convolutions) needs at least 36 x 36 px; "
                             f"obs['bev'] is {h} x {w}: use a larger bev.size")
        extra = {k: int(np.prod(sp.shape)) for k, sp in observation_space.spaces.items() if k != "bev"}
        super().__init__(observation_space, features_dim=bev_dim + state_dim * len(extra))
        self.cnn = nn.Sequential(
            nn.Conv2d(c, 32, 8, 4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1), nn.ReLU(),
            nn.Flatten(),
        )
        with th.no_grad():
            n_flat = self.cnn(th.zeros(1, c, h, w)).shape[1]
        self.bev_fc = nn.Sequential(nn.Linear(n_flat, bev_dim), nn.ReLU())
        # one MLP per vector input (ego, waypoints, and any other key the env adds)
        self.mlps = nn.ModuleDict({
            k: nn.Sequential(nn.Flatten(), nn.Linear(n, hidden), nn.ReLU(), nn.Linear(hidden, state_dim),
                             nn.ReLU())
            for k, n in extra.items()})

    def forward(self, obs: dict[str, th.Tensor]) -> th.Tensor:
        parts = [self.bev_fc(self.cnn(obs["bev"]))]
        parts += [mlp(obs[k]) for k, mlp in self.mlps.items()]
        return th.cat(parts, dim=1)


class FeatureExtractor(BaseFeaturesExtractor):
    """The fast path's extractor: no CNN. It reads the frozen BEV encoder's ``bev_features``
    (computed once per frame in the env, ``obs.features=bev_encoder``) and the vector inputs
    (ego, waypoints), flattened and concatenated; the actor and critic heads are the MLPs. It
    never reads ``bev``, so the replay buffer does not decode (or, with a reward that needs no
    frames, even store) the masks."""

    reads_bev = False

    def __init__(self, observation_space: gym.spaces.Dict):
        if not isinstance(observation_space, gym.spaces.Dict) or "bev_features" not in observation_space.spaces:
            raise ValueError("policy_kwargs.extractor=features needs the BEV encoder's features in the "
                             "observation: set obs.features=bev_encoder (experiment=fast does)")
        self.keys = [k for k, sp in observation_space.spaces.items()
                     if k != "bev" and not (sp.dtype == np.uint8 and len(sp.shape) == 3)]
        dim = sum(int(np.prod(observation_space[k].shape)) for k in self.keys)
        super().__init__(observation_space, features_dim=dim)

    def forward(self, obs: dict[str, th.Tensor]) -> th.Tensor:
        return th.cat([obs[k].flatten(1).float() for k in self.keys], dim=1)
