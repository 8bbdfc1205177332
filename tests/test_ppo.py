"""DrivePPO: rewards come from the reward function over the rollout's facts (one batch call per
rollout), never from the env; SB3's timeout bootstrap is kept; non-finite rewards are replaced and
counted; the rollout otherwise matches stock SB3 PPO; save / load / predict round-trips.

Small and fast: the built-in grid town without traffic, a 48 px BEV and a tiny policy.
"""

from __future__ import annotations

import warnings
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import KVWriter, Logger
from stable_baselines3.common.vec_env import DummyVecEnv

import drivemind  # noqa: F401  (registers DriveMind-v0)
from drivemind.agents.ppo import DrivePPO
from drivemind.agents.sb3_logger import use_default_logger
from drivemind.envs import FACT_KEYS
from drivemind.rewards import Reward, make_reward

BEV = {"preset": "cpu", "size": 48, "rgb_size": 32}  # 15 x 48 x 48: NatureCNN's minimum is 36
TINY = dict(net_arch=[32], features_extractor_kwargs=dict(cnn_output_dim=32))
N_STEPS, N_ENVS = 16, 2


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_venv(n_envs=N_ENVS, **env_kw):
    fn = partial(gym.make, "DriveMind-v0", town="grid", density="empty", bev=BEV, **env_kw)
    return DummyVecEnv([fn] * n_envs)


def make_model(reward, venv=None, cls=DrivePPO, n_steps=N_STEPS, **kw):
    venv = make_venv() if venv is None else venv
    if cls is DrivePPO:
        kw["reward_fn"] = reward
    model = cls("MultiInputPolicy", venv, n_steps=n_steps, batch_size=16, n_epochs=1, seed=0,
                device="cpu", policy_kwargs=TINY, **kw)
    use_default_logger(model)  # stock PPO too: no SB3-<date> folder in the system temp dir
    return model


class Recorder(BaseCallback):
    """Records every step's infos, env rewards and dones, and the value of each truncated
    episode's terminal observation under the policy that is acting (what SB3 bootstraps with)."""

    def __init__(self):
        super().__init__()
        self.infos, self.env_rewards, self.dones, self.terminal_values = [], [], [], []

    def _on_step(self):
        infos, dones = self.locals["infos"], self.locals["dones"]
        self.infos.append([dict(i) for i in infos])
        self.env_rewards.append(np.array(self.locals["rewards"], np.float64))
        self.dones.append(np.array(dones))
        tv = np.zeros(len(infos))
        for i, (info, done) in enumerate(zip(infos, dones)):
            if done and info.get("TimeLimit.truncated", False):
                obs = self.model.policy.obs_to_tensor(info["terminal_observation"])[0]
                with th.no_grad():
                    tv[i] = self.model.policy.predict_values(obs).item()
        self.terminal_values.append(tv)
        return True

    def batch(self, keys=FACT_KEYS):
        """The recorded facts as a reward batch, rows t * n_envs + i (float64, from the infos)."""
        return {k: np.array([[info[k] for info in step] for step in self.infos], np.float64)
                .reshape(-1) for k in keys}

    def truncated(self):
        return np.array([[bool(i.get("TimeLimit.truncated", False)) for i in step]
                         for step in self.infos])


class Capture(KVWriter):
    """An SB3 logger output that keeps every dump."""

    def __init__(self):
        self.dumps = []

    def write(self, key_values, key_excluded, step=0):
        self.dumps.append(dict(key_values))


def capture_logs(model) -> Capture:
    cap = Capture()
    model.set_logger(Logger(folder=None, output_formats=[cap]))
    return cap


# ---------------------------------------------------------------------------------- rewards
def test_rewards_come_from_reward_fn_not_env():
    chen = make_reward("chen")
    model = make_model(chen)
    rec, cap = Recorder(), capture_logs(model)
    model.learn(total_timesteps=N_STEPS, callback=rec)  # one rollout of N_STEPS x N_ENVS

    batch = rec.batch()
    expected = chen(batch).reshape(N_STEPS, N_ENVS)
    env_rewards = np.stack(rec.env_rewards)
    stored = model.rollout_buffer.rewards
    assert stored.shape == (N_STEPS, N_ENVS)
    keep = ~rec.truncated()  # no bootstrap there (this env has no step limit: normally all)
    np.testing.assert_allclose(stored[keep], expected[keep], rtol=1e-5, atol=1e-5)
    assert not np.allclose(stored, env_rewards, atol=1e-3), "the env's task reward was stored"
    assert np.all(model.rollout_bootstrap[keep] == 0.0)

    # the stored facts: (n_steps, n_envs, n_facts) float32 in reward_fn.needs order
    assert model.fact_keys == chen.needs
    assert model.rollout_facts.dtype == np.float32
    assert model.rollout_facts.shape == (N_STEPS, N_ENVS, len(chen.needs))
    for j, k in enumerate(chen.needs):
        np.testing.assert_allclose(model.rollout_facts[:, :, j].reshape(-1), batch[k], rtol=1e-6,
                                   atol=1e-4)

    # each term's rollout mean is logged
    logged = next(d for d in cap.dumps if "reward_terms/speed" in d)
    for term, v in chen.explain(batch).items():
        assert logged[f"reward_terms/{term}"] == pytest.approx(v.mean(), rel=1e-4, abs=1e-5)
    assert logged["reward/mean"] == pytest.approx(expected.mean(), rel=1e-4, abs=1e-5)
    assert logged["reward/nonfinite"] == 0


def test_timeout_bootstrap_is_kept():
    chen, gamma = make_reward("chen"), 0.9
    model = make_model(chen, make_venv(config={"max_episode_steps": 5}), gamma=gamma)
    rec = Recorder()
    model.learn(total_timesteps=N_STEPS, callback=rec)

    trunc = rec.truncated()
    assert trunc.sum() >= 2, "no truncation inside the rollout: the test checks nothing"
    tv = np.stack(rec.terminal_values)
    reward = chen(rec.batch()).reshape(N_STEPS, N_ENVS)
    stored = model.rollout_buffer.rewards
    # truncated steps: reward + gamma * V(terminal obs); elsewhere the reward alone
    np.testing.assert_allclose(stored[trunc], reward[trunc] + gamma * tv[trunc], rtol=1e-5,
                               atol=1e-4)
    np.testing.assert_allclose(stored[~trunc], reward[~trunc], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.rollout_bootstrap, gamma * tv * trunc, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(model.rollout_bootstrap[trunc]) > 0)


def test_rollout_matches_stock_ppo_but_the_reward():
    """Same seed, same envs: the buffers agree with SB3's PPO everywhere (observations, actions,
    values, episode starts, log-probs, timeout bootstrap); only the reward differs."""
    chen, gamma = make_reward("chen"), 0.95
    cfg = {"max_episode_steps": 6}
    rec_ours, rec_stock = Recorder(), Recorder()
    # built and run one after the other: each seeds torch's global RNG, which sampling uses
    ours = make_model(chen, make_venv(config=cfg), gamma=gamma)
    ours.learn(total_timesteps=N_STEPS, callback=rec_ours)
    stock = make_model(None, make_venv(config=cfg), cls=PPO, gamma=gamma)
    stock.learn(total_timesteps=N_STEPS, callback=rec_stock)

    a, b = ours.rollout_buffer, stock.rollout_buffer
    for name in ("actions", "values", "log_probs", "episode_starts"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    for k in a.observations:
        np.testing.assert_array_equal(a.observations[k], b.observations[k])
    assert ours.num_timesteps == stock.num_timesteps == N_STEPS * N_ENVS
    # stock = env reward + bootstrap; ours = chen + the same bootstrap
    stock_bootstrap = b.rewards - np.stack(rec_stock.env_rewards)
    assert rec_stock.truncated().sum() >= 2
    np.testing.assert_allclose(ours.rollout_bootstrap, stock_bootstrap, atol=1e-4)
    np.testing.assert_allclose(a.rewards - ours.rollout_bootstrap,
                               chen(rec_ours.batch()).reshape(N_STEPS, N_ENVS), atol=1e-4)
    # the episode statistics SB3 keeps are unchanged (the Monitor's task-reward returns)
    assert [e["l"] for e in ours.ep_info_buffer] == [e["l"] for e in stock.ep_info_buffer]


class NaNSome(Reward):
    """A finite ``speed`` term and a ``broken`` term that is NaN on rows 0 mod 4 and +inf on rows
    1 mod 4."""

    name = "nan_some"
    needs = ("speed_kmh",)

    def terms(self, b):
        row = np.arange(len(b["speed_kmh"])) % 4
        return {"speed": b["speed_kmh"] / 10.0,
                "broken": np.where(row == 0, np.nan, np.where(row == 1, np.inf, 0.0))}


def test_nonfinite_rewards_are_replaced_counted_logged_and_warned_once():
    reward = NaNSome()
    model = make_model(reward)
    rec, cap = Recorder(), capture_logs(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(total_timesteps=2 * N_STEPS * N_ENVS, callback=rec)  # two rollouts

    rows = N_STEPS * N_ENVS
    bad_per_rollout = rows // 2
    assert model.nonfinite_rewards == 2 * bad_per_rollout
    mine = [w for w in caught if issubclass(w.category, RuntimeWarning) and "non-finite" in
            str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in mine]
    assert "'broken'" in str(mine[0].message) and "'speed'" not in str(mine[0].message)

    # the last rollout: bad rows are 0, the others speed / 10; nothing non-finite reaches PPO
    stored = model.rollout_buffer.rewards - model.rollout_bootstrap
    speed = rec.batch(("speed_kmh",))["speed_kmh"][rows:].reshape(N_STEPS, N_ENVS)
    bad = (np.arange(rows) % 4 < 2).reshape(N_STEPS, N_ENVS)
    assert np.all(np.isfinite(model.rollout_buffer.rewards))
    assert np.all(np.isfinite(model.rollout_buffer.returns))
    assert np.all(stored[bad] == 0.0)
    np.testing.assert_allclose(stored[~bad], speed[~bad] / 10.0, rtol=1e-5, atol=1e-5)

    logs = [d for d in cap.dumps if "reward/nonfinite" in d]
    assert [d["reward/nonfinite"] for d in logs] == [bad_per_rollout, bad_per_rollout]
    assert logs[-1]["reward/nonfinite_total"] == 2 * bad_per_rollout
    assert np.isfinite(logs[-1]["reward_terms/broken"])  # mean of the finite values (0)


class Counting(Reward):
    """Wraps a reward and records the size of every batch it is called on."""

    def __init__(self, inner: Reward):
        self.inner, self.name, self.needs = inner, inner.name, inner.needs
        self.sizes: list[int] = []

    def terms(self, b):
        return self.inner.terms(b)

    def __call__(self, batch):
        self.sizes.append(len(next(iter(batch.values()))))
        return super().__call__(batch)


def test_reward_fn_called_once_per_rollout_on_the_whole_rollout():
    reward = Counting(make_reward("chen"))
    model = make_model(reward)
    model.learn(total_timesteps=3 * N_STEPS * N_ENVS)
    assert reward.sizes == [N_STEPS * N_ENVS] * 3


# ---------------------------------------------------------------------------------- relabel
def test_relabel_from_a_callback_with_another_reward():
    """With every fact stored, a callback can relabel the rollout before the update; the task
    reward recomputed from the facts reproduces the env's own reward."""

    class RelabelTask(Recorder):
        def _on_rollout_end(self):
            self.model.relabel_rollout(make_reward("task"))

    model = make_model(make_reward("chen"), store_facts=FACT_KEYS)
    assert set(model.fact_keys) == set(FACT_KEYS)
    rec = RelabelTask()
    model.learn(total_timesteps=N_STEPS, callback=rec)
    np.testing.assert_allclose(model.rollout_buffer.rewards, np.stack(rec.env_rewards),
                               rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="consumed"):  # train() has flattened the buffer
        model.relabel_rollout()

    narrow = make_model(make_reward("chen"))
    with pytest.raises(KeyError, match="store_facts"):
        narrow._rollout_tail = (narrow.rollout_buffer, None, None)
        narrow.rollout_facts = np.zeros((N_STEPS, N_ENVS, len(narrow.fact_keys)), np.float32)
        narrow.relabel_rollout(make_reward("task"))


def test_bad_construction():
    with pytest.raises(TypeError, match="reward_fn"):
        DrivePPO(env=make_venv(1))
    with pytest.raises(TypeError, match="Reward"):
        DrivePPO(env=make_venv(1), reward_fn=42)
    with pytest.raises(ValueError, match="unknown reward"):
        DrivePPO(env=make_venv(1), reward_fn="nope")


# ---------------------------------------------------------------------------------- end to end
def test_train_save_load_predict(tmp_path):
    venv = make_venv()
    model = make_model("chen", venv, n_steps=64)  # a reward by name works too
    model.learn(total_timesteps=256)  # two rollouts of 64 x 2, two updates
    assert model.num_timesteps == 256
    path = tmp_path / "ppo_chen.zip"
    model.save(path)

    obs = venv.reset()
    action, _ = model.predict(obs, deterministic=True)

    loaded = DrivePPO.load(path, env=venv, reward_fn=make_reward("chen"))
    assert loaded.reward_name == "chen" and loaded.reward_fn is not None
    np.testing.assert_allclose(loaded.predict(obs, deterministic=True)[0], action, atol=1e-6)
    loaded.learn(total_timesteps=64 * N_ENVS, reset_num_timesteps=False)  # it trains on

    # without a reward: predicts, refuses to learn and says which reward it was trained with
    bare = DrivePPO.load(path, env=venv)
    assert bare.reward_fn is None and bare.reward_name == "chen"
    np.testing.assert_allclose(bare.predict(obs, deterministic=True)[0], action, atol=1e-6)
    with pytest.raises(RuntimeError, match="'chen'"):
        bare.learn(total_timesteps=64)
    with pytest.warns(UserWarning, match="trained with reward 'chen'"):
        other = DrivePPO.load(path, env=venv, reward_fn="task")
    assert other.fact_keys == make_reward("task").needs
