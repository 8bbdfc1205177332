"""PPO that learns from a DriveMind reward computed over the rollout's per-step facts.

    from drivemind.rewards import make_reward
    model = DrivePPO(env=venv, reward_fn=make_reward("chen"), n_steps=512)
    model.learn(100_000)
    model.save("ppo_chen")
    model = DrivePPO.load("ppo_chen", env=venv, reward_fn=make_reward("chen"))

The env's own reward (the task reward) is never learned from. While acting, ``DrivePPO`` stores
the facts its reward needs for every step and env (``rollout_facts``: float32, ``(n_steps,
n_envs, n_facts)``, columns ``fact_keys``, taken from the env's ``info``). When the rollout is
complete it scores all of them in one batch call of ``reward_fn``, writes the result into the
rollout buffer and only then computes returns and advantages. Everything else is Stable-Baselines3
PPO: the policy update, callbacks, logging, save and load.

Timeouts: like SB3, an episode cut short by truncation (``TimeLimit.truncated`` with a
``terminal_observation``) is bootstrapped with ``gamma * V(terminal observation)``. The value is
taken during collection, with the policy that acted, and kept apart in ``rollout_bootstrap``
(``(n_steps, n_envs)``, 0 where there is none); the buffer gets ``reward + bootstrap``.

Non-finite rewards (NaN or inf from a reward function) are replaced by 0 before they reach the
learner, counted in ``nonfinite_rewards``, logged as ``reward/nonfinite`` and reported once in a
warning that names the reward terms that produced them.

Logged per rollout (SB3 logger): ``reward/mean`` (the learned reward per step, without bootstrap),
``reward/nonfinite`` (this rollout), ``reward/nonfinite_total`` and ``reward_terms/<term>``: the
mean of each term of ``reward_fn.explain`` over the rollout (finite values only), so a step's
reward can be read term by term. SB3's ``rollout/ep_rew_mean`` still comes from the Monitor
wrapper and therefore reports the env's task reward.

Save and load: the reward function is not pickled into the zip (semantic rewards can hold
encoders). Its name is saved as ``reward_name``; pass the reward again to ``DrivePPO.load``
(a ``Reward`` or a name for :func:`drivemind.rewards.make_reward`). A model loaded without one
can predict but refuses to learn until :meth:`DrivePPO.set_reward` is called.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from ..rewards import Reward, make_reward


def as_reward(reward_fn) -> Reward:
    """A ``Reward`` from a ``Reward`` or a reward name (``make_reward``'s names)."""
    if isinstance(reward_fn, str):
        return make_reward(reward_fn)
    if isinstance(reward_fn, Reward):
        return reward_fn
    raise TypeError(f"reward_fn must be a drivemind Reward or a reward name, got "
                    f"{type(reward_fn).__name__}")


class DrivePPO(PPO):
    """SB3 PPO whose rewards come from ``reward_fn`` over the facts in the env's ``info``.

    :param policy: as PPO's; ``"MultiInputPolicy"`` by default (DriveEnv's observation is a Dict).
    :param env: as PPO's; every env must report the facts ``reward_fn.needs`` in its ``info``.
    :param args: PPO's other positional arguments (learning_rate, n_steps, ...), unchanged.
    :param reward_fn: the reward learned from: a ``drivemind.rewards.Reward`` or a reward name.
        Required, except on the way through ``load`` (which passes it afterwards).
    :param store_facts: facts stored per step besides the ones ``reward_fn`` needs, e.g.
        ``drivemind.envs.FACT_KEYS`` to relabel a rollout with any other reward.
    :param log_reward_terms: log ``reward_terms/<term>`` means (one ``explain`` call per rollout).
    :param kwargs: PPO's keyword arguments, unchanged.
    """

    def __init__(self, policy="MultiInputPolicy", env=None, *args, reward_fn=None,
                 store_facts: Sequence[str] = (), log_reward_terms: bool = True, **kwargs):
        if env is None and kwargs.get("_init_setup_model", True):
            raise TypeError("DrivePPO needs an env (a VecEnv, a gymnasium env or an env id)")
        if reward_fn is None and kwargs.get("_init_setup_model", True):
            raise TypeError("DrivePPO needs reward_fn (a drivemind Reward or a reward name such as "
                            "'chen'): the env's own reward is never learned from")
        if isinstance(store_facts, str):
            raise TypeError(f"store_facts must be a list of fact names, got the string "
                            f"{store_facts!r}")
        # set before PPO's constructor, which may already build the model
        self.reward_fn: Reward | None = None
        self.reward_name: str | None = None
        self.store_facts = tuple(store_facts)
        self.fact_keys: tuple[str, ...] = ()
        self.log_reward_terms = bool(log_reward_terms)
        self.nonfinite_rewards = 0  # non-finite rewards replaced by 0, over all rollouts
        self._nonfinite_warned = False
        self.rollout_facts: np.ndarray | None = None  # (n_steps, n_envs, len(fact_keys)) float32
        self.rollout_bootstrap: np.ndarray | None = None  # (n_steps, n_envs) float32
        self._rollout_tail = None  # (buffer, last values, last dones) of the last full rollout
        super().__init__(policy, env, *args, **kwargs)
        if reward_fn is not None:
            self.set_reward(reward_fn)

    # ------------------------------------------------------------------ reward
    def set_reward(self, reward_fn) -> None:
        """Learn from ``reward_fn`` from the next rollout on (also used after ``load``)."""
        reward_fn = as_reward(reward_fn)
        self.reward_fn = reward_fn
        self.reward_name = reward_fn.name
        self.fact_keys = tuple(dict.fromkeys([*reward_fn.needs, *self.store_facts]))

    def rollout_batch(self) -> dict[str, np.ndarray]:
        """The last rollout's facts as a reward batch: ``{fact: (n_steps * n_envs,) array}``,
        row ``t * n_envs + i`` = step ``t`` of env ``i``."""
        if self.rollout_facts is None:
            raise RuntimeError("no rollout collected yet")
        facts = self.rollout_facts
        return {k: facts[:, :, j].reshape(-1) for j, k in enumerate(self.fact_keys)}

    def relabel_rollout(self, reward_fn=None) -> np.ndarray:
        """Score the last complete rollout's facts with ``reward_fn`` (default: the model's) in one
        batch call, write ``reward + timeout bootstrap`` into the rollout buffer and recompute
        returns and advantages. Returns the rewards, ``(n_steps, n_envs)``, without bootstrap.

        ``collect_rollouts`` calls it at the end of every rollout; a callback may call it again in
        ``on_rollout_end`` with another reward. After ``train()`` has consumed the buffer it
        raises; score ``rollout_batch()`` directly instead.
        """
        if self._rollout_tail is None:
            raise RuntimeError("no complete rollout to relabel yet")
        buffer, last_values, dones = self._rollout_tail
        if buffer.generator_ready:
            raise RuntimeError("the last rollout was already consumed by train(); relabel it from "
                               "a callback's on_rollout_end, or score rollout_batch() directly")
        reward_fn = self.reward_fn if reward_fn is None else as_reward(reward_fn)
        if reward_fn is None:
            raise RuntimeError("no reward function: pass reward_fn or call set_reward() first")
        missing = [k for k in reward_fn.needs if k not in self.fact_keys]
        if missing:
            raise KeyError(f"reward {reward_fn.name!r} needs fact(s) {missing} that were not "
                           f"stored; stored: {list(self.fact_keys)} (construct DrivePPO with "
                           f"store_facts=drivemind.envs.FACT_KEYS to keep them all)")
        n_steps, n_envs, _ = self.rollout_facts.shape
        batch = self.rollout_batch()

        # the one batch call of the reward function for the whole rollout
        values = np.asarray(reward_fn(batch), np.float64)
        if values.ndim == 0:  # a reward that needs no facts may return a constant
            values = np.full(n_steps * n_envs, float(values))
        if values.shape != (n_steps * n_envs,):
            raise ValueError(f"reward {reward_fn.name!r} returned shape {values.shape} for a batch "
                             f"of {n_steps * n_envs} steps")

        # non-finite rewards never reach the learner
        bad = ~np.isfinite(values)
        n_bad = int(bad.sum())
        if n_bad:
            self.nonfinite_rewards += n_bad
            self._warn_nonfinite(reward_fn, batch, bad)
            values = np.where(bad, 0.0, values)

        self.logger.record("reward/mean", float(values.mean()))
        self.logger.record("reward/nonfinite", n_bad)
        self.logger.record("reward/nonfinite_total", self.nonfinite_rewards)
        if self.log_reward_terms:
            for term, v in reward_fn.explain(batch).items():
                finite = v[np.isfinite(v)]
                self.logger.record(f"reward_terms/{term}",
                                   float(finite.mean()) if finite.size else float("nan"))

        rewards = values.reshape(n_steps, n_envs).astype(np.float32)
        buffer.rewards[:] = rewards + self.rollout_bootstrap
        buffer.compute_returns_and_advantage(last_values=last_values, dones=dones)
        return rewards

    def _warn_nonfinite(self, reward_fn: Reward, batch: dict, bad: np.ndarray) -> None:
        """Warn (once per model) which terms of ``reward_fn`` went non-finite, from the offending
        rows' ``explain``."""
        if self._nonfinite_warned:
            return
        self._nonfinite_warned = True
        rows = {k: v[bad] for k, v in batch.items()}
        terms = [t for t, v in reward_fn.explain(rows).items() if not np.all(np.isfinite(v))]
        where = (f"term(s) {terms}" if terms else
                 "no single term (all are finite: overflow in their sum, or a custom __call__)")
        first = {k: float(v[0]) for k, v in rows.items()}
        warnings.warn(f"reward {reward_fn.name!r} gave {int(bad.sum())} non-finite value(s) in a "
                      f"rollout of {bad.size} steps, from {where}; they are replaced by 0 and "
                      f"counted in nonfinite_rewards / logged as reward/nonfinite (warned once). "
                      f"Facts of the first such step: {first}", RuntimeWarning, stacklevel=3)

    def _read_facts(self, infos: list[dict]) -> np.ndarray:
        """One step's facts, ``(n_envs, len(fact_keys))`` float32, from the envs' infos."""
        try:
            return np.array([[info[k] for k in self.fact_keys] for info in infos], np.float32)
        except KeyError as e:
            raise KeyError(f"fact {e.args[0]!r} (needed by reward {self.reward_name!r} or "
                           f"store_facts) is missing from the env's info, which has "
                           f"{sorted(infos[0])}; DrivePPO needs an env that reports drivemind "
                           f"facts (DriveMind-v0)") from None

    # ------------------------------------------------------------------ rollouts
    def _setup_learn(self, *args, **kwargs):
        if self.reward_fn is None:
            hint = f" (it was trained with {self.reward_name!r})" if self.reward_name else ""
            raise RuntimeError(f"DrivePPO has no reward function{hint}: pass reward_fn to load() "
                               f"or call set_reward() before learn()")
        return super()._setup_learn(*args, **kwargs)

    def collect_rollouts(self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer,
                         n_rollout_steps: int) -> bool:
        """Fill ``rollout_buffer`` with ``n_rollout_steps`` steps per env: SB3's loop, but for
        the reward.

        Per step: act with the current policy, step the envs, count timesteps, run the step
        callback (which may stop the rollout: then False, as in SB3), update the episode info
        buffer, store the step's facts and any timeout bootstrap, and add the transition with a
        placeholder reward. At the end: the value of the last observation, then
        ``relabel_rollout`` (one reward call, bootstrap added, returns and advantages), then the
        callback's ``update_locals`` and ``on_rollout_end``.

        The callbacks see SB3's locals under SB3's names; ``rewards`` there is the env's reward.
        """
        assert self._last_obs is not None, "No previous observation was provided"
        self.policy.set_training_mode(False)  # eval mode for batch norm / dropout while acting

        n_envs = env.num_envs
        facts = np.zeros((n_rollout_steps, n_envs, len(self.fact_keys)), np.float32)
        bootstrap = np.zeros((n_rollout_steps, n_envs), np.float32)
        self.rollout_facts, self.rollout_bootstrap, self._rollout_tail = facts, bootstrap, None
        placeholder = np.zeros(n_envs, np.float32)  # real rewards are written after the rollout

        n_steps = 0
        rollout_buffer.reset()
        if self.use_sde:  # new exploration noise for the rollout
            self.policy.reset_noise(n_envs)

        callback.on_rollout_start()

        while n_steps < n_rollout_steps:
            if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
                self.policy.reset_noise(n_envs)  # and every sde_sample_freq steps if asked

            with th.no_grad():
                obs_tensor = obs_as_tensor(self._last_obs, self.device)
                actions, values, log_probs = self.policy(obs_tensor)
            actions = actions.cpu().numpy()

            # the env gets actions within its bounds; the buffer keeps the sampled ones
            clipped_actions = actions
            if isinstance(self.action_space, spaces.Box):
                if self.policy.squash_output:  # squashed to [-1, 1]: map back to the bounds
                    clipped_actions = self.policy.unscale_action(clipped_actions)
                else:  # an unbounded Gaussian sample: clip
                    low, high = self.action_space.low, self.action_space.high
                    clipped_actions = np.clip(actions, low, high)

            new_obs, rewards, dones, infos = env.step(clipped_actions)  # env rewards: unused

            self.num_timesteps += n_envs

            callback.update_locals(locals())
            if not callback.on_step():
                return False

            self._update_info_buffer(infos, dones)

            facts[n_steps] = self._read_facts(infos)

            # Timeouts: an episode cut short by truncation did not end, so its last reward is
            # bootstrapped with the discounted value of the observation it was cut at (SB3, GitHub
            # issue #633). Kept apart and added after the batch reward.
            for idx, done in enumerate(dones):
                info = infos[idx]
                if (done and info.get("terminal_observation") is not None
                        and info.get("TimeLimit.truncated", False)):
                    terminal_obs = self.policy.obs_to_tensor(info["terminal_observation"])[0]
                    with th.no_grad():
                        terminal_value = self.policy.predict_values(terminal_obs)[0]
                    bootstrap[n_steps, idx] = self.gamma * float(terminal_value.item())

            if isinstance(self.action_space, spaces.Discrete):
                actions = actions.reshape(-1, 1)  # the buffer stores discrete actions as columns

            rollout_buffer.add(self._last_obs, actions, placeholder, self._last_episode_starts,
                               values, log_probs)
            self._last_obs = new_obs
            self._last_episode_starts = dones
            n_steps += 1

        with th.no_grad():  # value of the observation after the last step, for GAE
            values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))

        self._rollout_tail = (rollout_buffer, values, dones)
        self.relabel_rollout()  # rewards from facts, + bootstrap, then returns and advantages

        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    # ------------------------------------------------------------------ save / load
    def _excluded_save_params(self) -> list[str]:
        # the reward is not pickled (it is passed to load again); the rollout is transient
        return super()._excluded_save_params() + [
            "reward_fn", "fact_keys", "rollout_facts", "rollout_bootstrap", "_rollout_tail",
            "_nonfinite_warned"]

    @classmethod
    def load(cls, path, env=None, device="auto", custom_objects=None, print_system_info=False,
             force_reset=True, reward_fn=None, **kwargs) -> "DrivePPO":
        """SB3's ``load`` plus ``reward_fn`` (a ``Reward`` or a name), which is not saved: without
        it the model predicts but cannot learn. ``model.reward_name`` is the saved reward's name."""
        model = super().load(path, env=env, device=device, custom_objects=custom_objects,
                             print_system_info=print_system_info, force_reset=force_reset,
                             **kwargs)
        model.store_facts = tuple(model.store_facts)  # saved as a JSON list
        if reward_fn is not None:
            saved = model.reward_name
            model.set_reward(reward_fn)
            if saved is not None and saved != model.reward_name:
                warnings.warn(f"the model was trained with reward {saved!r} and is now given "
                              f"{model.reward_name!r}", UserWarning, stacklevel=2)
        return model


__all__ = ["DrivePPO", "as_reward"]
