"""DriveSAC and DrivePPO learn without leaving SB3's ``SB3-<date>`` folders in the system temp dir
(SB3's default logger when none is configured), keep SB3's console output with ``verbose=1``, and
leave a logger that was set explicitly (or a ``tensorboard_log`` folder) alone."""

from __future__ import annotations

import tempfile

import gymnasium as gym
import pytest
from stable_baselines3 import SAC
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import DummyVecEnv

import drivemind  # noqa: F401
from drivemind.agents import DriveExtractor, DriveSAC
from drivemind.agents.ppo import DrivePPO
from drivemind.agents.sb3_logger import quiet_logger, use_default_logger
from drivemind.rewards import make_reward

pytestmark = pytest.mark.usefixtures("one_torch_thread")

def pk():  # SB3 writes into policy_kwargs: a fresh dict per model
    return dict(net_arch=[16], features_extractor_class=DriveExtractor,
                features_extractor_kwargs=dict(bev_dim=16, state_dim=8))


def venv():
    return DummyVecEnv([lambda: gym.make("DriveMind-v0", town="grid", density="empty",
                                         bev={"preset": "cpu", "size": 48}, max_episode_steps=20)])


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The system temp dir pointed at an empty folder (TMPDIR, and tempfile's cached value)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    assert tempfile.gettempdir() == str(tmp)
    return tmp


def sb3_folders(tmp):
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("SB3-"))


def test_stock_sb3_would_leave_a_folder(temp_dir):
    """The check below can fail: stock SAC learning with no logger makes SB3-<date> here."""
    m = SAC("MultiInputPolicy", venv(), buffer_size=100, batch_size=4, learning_starts=5,
            policy_kwargs={"net_arch": [8]}, device="cpu", seed=0)
    m.learn(6)
    assert len(sb3_folders(temp_dir)) == 1
    use_default_logger(m)  # what scripts/bench.py does for its stock SAC
    m.learn(6)
    assert len(sb3_folders(temp_dir)) == 1


def test_drive_sac_and_ppo_learn_without_temp_folders(temp_dir, tmp_path):
    env = venv()
    sac = DriveSAC(env=env, reward_fn=make_reward("chen"), buffer_size=100, batch_size=4,
                   learning_starts=5, seed=0, device="cpu", policy_kwargs=pk())
    sac.learn(10)
    sac.save(tmp_path / "sac.zip")
    loaded = DriveSAC.load(tmp_path / "sac.zip", env=env, reward_fn=make_reward("chen"), device="cpu")
    loaded.learn(5, reset_num_timesteps=False)  # a loaded model has no logger set either
    ppo = DrivePPO(env=env, reward_fn="chen", n_steps=8, batch_size=4, n_epochs=1, seed=0,
                   device="cpu", policy_kwargs=pk())
    ppo.learn(8)
    ppo.save(tmp_path / "ppo.zip")
    DrivePPO.load(tmp_path / "ppo.zip", env=env, reward_fn="chen", device="cpu").learn(8)
    assert sb3_folders(temp_dir) == []
    assert sac.logger.get_dir() is None and ppo.logger.output_formats == []


def test_verbose_keeps_the_console_table(temp_dir, capsys):
    ppo = DrivePPO(env=venv(), reward_fn="chen", n_steps=8, batch_size=4, n_epochs=1, seed=0,
                   device="cpu", policy_kwargs=pk(), verbose=1)
    ppo.learn(8)
    assert "total_timesteps | 8" in capsys.readouterr().out  # SB3's table, as with its own logger
    assert sb3_folders(temp_dir) == []


def test_explicit_logger_and_tensorboard_folder_are_kept(temp_dir, tmp_path):
    env = venv()
    mine = Logger(folder=str(tmp_path / "mine"), output_formats=[])
    ppo = DrivePPO(env=env, reward_fn="chen", n_steps=8, batch_size=4, n_epochs=1, seed=0,
                   device="cpu", policy_kwargs=pk())
    ppo.set_logger(mine)
    ppo.learn(8)
    assert ppo.logger is mine
    tb = DrivePPO(env=env, reward_fn="chen", n_steps=8, batch_size=4, n_epochs=1, seed=0,
                  device="cpu", policy_kwargs=pk(), tensorboard_log=str(tmp_path / "tb"))
    tb.learn(8)
    assert list((tmp_path / "tb").glob("*/events.out.tfevents.*"))  # SB3's own TensorBoard logger
    assert sb3_folders(temp_dir) == []
    assert quiet_logger(0).output_formats == [] and len(quiet_logger(1).output_formats) == 1
