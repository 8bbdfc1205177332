"""algo.autocast=bf16: SAC's gradient step under torch.autocast in bfloat16 on the real fast path
(DriveSAC, the shipped BEV encoder's features, the embedded simulator); the Q heads' and the
actor's output layers stay float32."""

from __future__ import annotations

import pytest
import torch as th
from stable_baselines3.common.torch_layers import create_mlp
from torch import nn

import drivemind  # noqa: F401
from drivemind.agents import DriveSAC
from drivemind.agents.sac import float32_outputs, q_from_features
from drivemind.rewards import make_reward
from drivemind.training import train
from drivemind.training.validate import ConfigError, validate_config

from hydra_config import config

BF16 = dict(device_type="cpu", dtype=th.bfloat16)


class _Critic(nn.Module):  # what q_from_features reads of SB3's ContinuousCritic
    def __init__(self, in_dim: int, bias: float):
        super().__init__()
        th.manual_seed(0)
        self.q_networks = [nn.Sequential(*create_mlp(in_dim, 1, [64, 64], nn.ReLU)) for _ in range(2)]
        for q in self.q_networks:
            nn.init.constant_(q[-1].bias, bias)


def test_q_values_keep_float32_precision_under_bf16_autocast():
    """Under autocast the hidden layers run in bfloat16 and the output layer in float32: Q values
    near 150 come out float32 and close to the float32 network's, not rounded to bfloat16's grid
    (spacing 1.0 there: coarser than one step's reward)."""
    critic = _Critic(10, bias=150.0)
    g = th.Generator().manual_seed(1)
    feats, acts = th.randn(256, 8, generator=g), th.rand(256, 2, generator=g) * 2 - 1
    hidden_dtypes = []
    hook = critic.q_networks[0][0].register_forward_hook(lambda m, i, o: hidden_dtypes.append(o.dtype))
    exact = q_from_features(critic, feats, acts)
    with th.autocast(**BF16):
        mixed = q_from_features(critic, feats, acts)
        naive = th.cat([q(th.cat([feats, acts], 1)) for q in critic.q_networks], 1)
    hook.remove()
    assert exact.dtype == th.float32 and hidden_dtypes[:2] == [th.float32, th.bfloat16]
    assert mixed.dtype == th.float32 and naive.dtype == th.bfloat16
    err, err_naive = (mixed - exact).abs().max().item(), (naive.float() - exact).abs().max().item()
    assert err < 0.1, err
    assert err < err_naive / 2, (err, err_naive)  # the float32 output layer is what buys it
    assert len(th.unique(naive)) < len(th.unique(mixed))  # bfloat16 outputs sit on a coarse grid


def test_float32_outputs_is_a_no_op_outside_autocast():
    x = th.randn(4, 3)
    with float32_outputs(x) as y:
        assert y is x and not th.is_autocast_enabled("cpu")
    with th.autocast(**BF16):
        with float32_outputs(x.bfloat16()) as y:
            assert y.dtype == th.float32 and not th.is_autocast_enabled("cpu")
        assert th.is_autocast_enabled("cpu")


def test_bf16_fast_path_trains_float32_weights_with_bf16_hidden_layers_and_survives_a_reload(tmp_path, monkeypatch):
    """A short `experiment=fast` run with algo.autocast=bf16: the gradient steps' hidden layers ran
    in bfloat16 (a hook on the critic's first layer saw it), every weight and Adam state is float32
    and finite and moved, the losses are finite, and the saved model keeps the setting for a
    resumed run."""
    cfg = config("experiment=fast", "town=grid", "logger=quiet", "progress_bar=false",
                 "total_timesteps=120", "algo.learning_starts=60", "algo.batch_size=16",
                 "algo.buffer_size=1000", "checkpoint_every=0", "+env.max_episode_steps=40",
                 "algo.autocast=bf16")
    run = tmp_path / "run"
    seen = []
    real_train = DriveSAC.train

    def spy(self, gradient_steps, batch_size=64):
        if not seen:
            self.critic.q_networks[0][0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
            self._start = [p.detach().clone() for p in self.policy.parameters()]
        return real_train(self, gradient_steps, batch_size)

    models = []
    real_init = DriveSAC._setup_model

    def keep(self):
        models.append(self)
        return real_init(self)

    monkeypatch.setattr(DriveSAC, "train", spy)
    monkeypatch.setattr(DriveSAC, "_setup_model", keep)
    train(cfg, run)
    model = models[0]
    assert model.autocast == "bf16"
    assert th.bfloat16 in seen  # the gradient steps' hidden layers
    params = list(model.policy.parameters())
    assert all(p.dtype == th.float32 and th.isfinite(p).all() for p in params)
    assert any(not th.equal(p, p0) for p, p0 in zip(params, model._start))
    for opt in (model.actor.optimizer, model.critic.optimizer):
        for st in opt.state.values():
            assert st["exp_avg"].dtype == th.float32 and th.isfinite(st["exp_avg"]).all()
    from drivemind.training.callbacks import latest_checkpoint

    back = DriveSAC.load(latest_checkpoint(run)["model"], reward_fn=make_reward("drivemind_kinematic"))
    assert back.autocast == "bf16"


def test_bad_autocast_settings_say_what_is_valid():
    with pytest.raises(ConfigError, match=r"algo\.autocast.*fp16.*valid: none, bf16"):
        validate_config(config("experiment=fast", "algo.autocast=fp16"))
    with pytest.raises(ConfigError, match=r"algo\.autocast.*SAC setting"):
        validate_config(config("algo=ppo", "+algo.autocast=bf16"))
    with pytest.raises(ValueError, match="valid: none, bf16"):
        DriveSAC("DrivePolicy", None, reward_fn=make_reward("drivemind_kinematic"), autocast="half",
                 _init_setup_model=False)
