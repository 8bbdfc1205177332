"""SAC on DriveMind-v0: SB3's SAC with a shared encoder and the relabelling replay buffer.

Differences from stock SB3 SAC (``SAC("MultiInputPolicy", env)``):

- **Rewards from the reward package.** Before a round of gradient steps, once ``label_every``
  transitions (1: any) were stored since the last labelling, they are scored in one batch by
  ``reward_fn`` (``label_pending``); the env's reward is not used and only labelled transitions
  are sampled. A reward with a model of its own (DriveMind's world model) learns once per
  ``reward_learn_every`` gradient steps (1: per SAC batch, the paper's). ``set_reward(fn)``
  re-scores the whole buffer. The mean of each reward term is logged under ``reward/``.
  Everything between the stored transitions and their rewards (image embeddings, the reward
  service, the reward's ``prepare`` / ``learn`` / ``state_dict``, camera frames) is
  ``self.labeller``, a :class:`drivemind.agents.labelling.Labeller` (its module docstring has the
  details).
- **One shared encoder** (``DriveExtractor``), trained by the critic loss; the actor reads detached
  features, and the next observations are encoded once without gradients for both the target
  critic and the next action (as DrQ-v2 does). Per gradient step that is two CNN forward passes and
  one backward pass; stock SB3 (separate actor, critic and target encoders) runs five forward
  passes and three backward passes through CNNs. On the fast path (an extractor with ``reads_bev =
  False``, e.g. ``FeatureExtractor``) the policy reads the frozen encoder's features and the buffer
  neither decodes nor (kinematic rewards) stores the masks.
- **Compact storage**: see :mod:`drivemind.agents.buffer`.
- **VLM action guidance** (``guidance="vmr" | "awag" | "both"``, Found-RL): a value-margin term in
  the critic loss and an advantage-weighted log-likelihood term in the actor loss toward the
  buffer's suggested actions, masked by their availability (:mod:`drivemind.agents.guidance`).
  With ``guidance="none"`` (the default) the update is the plain one above, unchanged.

Everything else (entropy tuning, target updates, ``learn``, callbacks, save/load, gSDE) is SB3's.
"""

from __future__ import annotations

import contextlib
import copy
import numbers
from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import SAC
from stable_baselines3.common.torch_layers import create_mlp
from stable_baselines3.common.type_aliases import TrainFreq, TrainFrequencyUnit
from stable_baselines3.common.utils import polyak_update
from stable_baselines3.sac.policies import LOG_STD_MAX, LOG_STD_MIN, MultiInputPolicy
from torch import nn
from torch.nn import functional as F

from . import AUTOCAST
from .buffer import LABELLED, RelabelReplayBuffer
from .embedding import needs_embedding, needs_obs_embedding, wants_view_embedding
from .extractor import DriveExtractor
from .guidance import ACTION_CLIP, GuidanceConfig, awag_loss, awag_weights, vmr_loss
from .labelling import Labeller, delegate, loaded_fields, saving
from .sb3_logger import use_default_logger


class DriveSACPolicy(MultiInputPolicy):
    """SAC policy with one feature extractor shared by actor and critic, optimised with the critic.
    Defaults: ``DriveExtractor`` and 3-layer heads ([256, 256]: two hidden layers + output).
    ``critic_layer_norm``: a LayerNorm after each hidden linear layer of the Q heads (and their
    targets), before the activation (as in RLPD, Ball et al. 2023); off by default.
    ``actor_ema``: keep an exponential moving average of the actor's weights (its encoder copy
    included), moved toward the actor by this fraction after every gradient step (``None``: none);
    the deterministic action (evaluation, checkpoint selection) is then the average's, while
    collection keeps sampling the online actor, so training is unchanged. ``use_actor_ema = False``
    acts with the online actor instead (``bench.py learn`` evaluates both)."""

    def __init__(self, observation_space, action_space, lr_schedule, net_arch=None,
                 features_extractor_class=DriveExtractor, features_extractor_kwargs=None,
                 share_features_extractor: bool = True, critic_layer_norm: bool = False,
                 actor_ema: float | None = None, **kwargs):
        self.critic_layer_norm = bool(critic_layer_norm)
        if actor_ema is not None and not 0.0 < float(actor_ema) <= 1.0:
            raise ValueError(f"actor_ema must be in (0, 1] (the average's step toward the actor per "
                             f"gradient step) or None, got {actor_ema!r}")
        self.actor_ema_tau = None if actor_ema is None else float(actor_ema)
        self.use_actor_ema = self.actor_ema_tau is not None
        if not share_features_extractor:
            raise ValueError("DriveSACPolicy always shares its encoder; use SB3's MultiInputPolicy "
                             "for separate actor/critic encoders")
        super().__init__(observation_space, action_space, lr_schedule,
                         net_arch=net_arch if net_arch is not None else [256, 256],
                         features_extractor_class=features_extractor_class,
                         features_extractor_kwargs=features_extractor_kwargs,
                         share_features_extractor=True, **kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data["critic_layer_norm"] = self.critic_layer_norm
        data["actor_ema"] = self.actor_ema_tau
        return data

    def make_critic(self, features_extractor=None):
        critic = super().make_critic(features_extractor)
        if self.critic_layer_norm:  # the same heads with LayerNorm between linear and activation
            in_dim = critic.q_networks[0][0].in_features  # features + action
            for i in range(critic.n_critics):
                q_net = nn.Sequential(*create_mlp(in_dim, 1, self.critic_kwargs["net_arch"],
                                                  self.critic_kwargs["activation_fn"],
                                                  post_linear_modules=[nn.LayerNorm]))
                critic.add_module(f"qf{i}", q_net)
                critic.q_networks[i] = q_net
        return critic

    def _build(self, lr_schedule) -> None:
        self.actor = self.make_actor()
        if self.actor_ema_tau is not None:  # before the optimizer, which the copy must not carry
            self.actor_ema = copy.deepcopy(self.actor)  # its own copy of the shared encoder too
            self.actor_ema.requires_grad_(False)
        self.critic = self.make_critic(features_extractor=self.actor.features_extractor)
        # the encoder learns from the critic loss only; the actor optimises its own head
        actor_params = [p for n, p in self.actor.named_parameters() if not n.startswith("features_extractor.")]
        self.actor.optimizer = self.optimizer_class(actor_params, lr=lr_schedule(1), **self.optimizer_kwargs)
        self.critic.optimizer = self.optimizer_class(self.critic.parameters(), lr=lr_schedule(1),
                                                     **self.optimizer_kwargs)
        self.critic_target = self.make_critic(features_extractor=None)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.set_training_mode(False)

    def set_training_mode(self, mode: bool) -> None:
        # SB3 flips the mode around every collection and every gradient step; walking the modules
        # costs ~0.1 ms a time, so only a real change walks them (nothing else sets them apart)
        if mode != self.training:
            super().set_training_mode(mode)

    def obs_to_tensor(self, observation):
        # an extractor that never reads the BEV (the fast path's) gets its keys only: SB3 would
        # deep-copy and convert the masks (15 x 96 x 96) of every observation it acts on
        ex = self.actor.features_extractor
        if isinstance(observation, dict) and not getattr(ex, "reads_bev", True):
            observation = {k: observation[k] for k in ex.keys}
        return super().obs_to_tensor(observation)

    def _predict(self, observation, deterministic: bool = False) -> th.Tensor:
        if deterministic and self.use_actor_ema:
            return self.actor_ema(observation, deterministic)
        return self.actor(observation, deterministic)

    def encode(self, obs, scaled: bool = False) -> th.Tensor:
        """Features of a batch; ``scaled``: images already float in [0, 1] (the replay buffer
        decodes them so), which skips SB3's uint8 -> float -> /255 preprocessing passes."""
        if not scaled:
            return self.actor.extract_features(obs, self.actor.features_extractor)
        return self.actor.features_extractor({k: v.float() for k, v in obs.items()})

    def actor_from_features(self, features: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """(squashed action, log prob) from encoded features (the actor's forward after the
        extractor). Under autocast the hidden layers run in its dtype and the distribution's
        parameters and log prob in float32 (:func:`float32_outputs`)."""
        a = self.actor
        latent = a.latent_pi(features)
        with float32_outputs(latent) as latent:
            mean = a.mu(latent)
            if a.use_sde:
                return a.action_dist.log_prob_from_params(mean, a.log_std, latent_sde=latent)
            log_std = th.clamp(a.log_std(latent), LOG_STD_MIN, LOG_STD_MAX)
            return a.action_dist.log_prob_from_params(mean, log_std)

    def guidance_terms(self, features: th.Tensor, actions: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """(deterministic action tanh(mean), log pi(actions | o)) from encoded features, for
        AWAG (not with gSDE)."""
        a = self.actor
        latent = a.latent_pi(features)
        with float32_outputs(latent) as latent:
            mean = a.mu(latent)
            log_std = th.clamp(a.log_std(latent), LOG_STD_MIN, LOG_STD_MAX)
            dist = a.action_dist.proba_distribution(mean, log_std)
            return th.tanh(mean), dist.log_prob(actions)


@contextlib.contextmanager
def float32_outputs(x: th.Tensor):
    """Run an output layer in float32 inside a ``torch.autocast`` region: yields ``x`` as float32
    with autocast off, so Q values and the action distribution's parameters keep float32's
    precision (bfloat16 keeps 8 significant bits: a Q value of 150 would round to a multiple of
    1, coarser than one step's reward). Outside autocast it yields ``x`` unchanged and costs
    nothing."""
    dev = x.device.type
    if not th.is_autocast_enabled(dev):
        yield x
        return
    with th.autocast(dev, enabled=False):
        yield x.float()


def q_from_features(critic, features: th.Tensor, actions: th.Tensor) -> th.Tensor:
    """Min-able stack of the critic heads' Q values (N x n_critics) on encoded features. Under
    autocast the heads' hidden layers run in its dtype and their output layers in float32
    (:func:`float32_outputs`)."""
    x = th.cat([features, actions], dim=1)
    qs = []
    for q in critic.q_networks:
        *hidden, out = q  # create_mlp's Sequential: [Linear, (LayerNorm,) ReLU] * k, Linear
        h = x
        for layer in hidden:
            h = layer(h)
        with float32_outputs(h) as h:
            qs.append(out(h))
    return th.cat(qs, dim=1)


def q_for_actor(critic, features: th.Tensor, actions: th.Tensor) -> th.Tensor:
    """:func:`q_from_features` for the actor's loss: its graph reaches ``actions`` but not the
    critic heads' weights, so the actor's backward skips the heads' weight gradients (about a
    fifth of the actor step's time at 256-256 heads, batch 256). The updates stay the same bit for
    bit: the critic's optimizer zeroes its gradients before every critic loss, so what the actor's
    backward used to add there was never read."""
    params = [p for q in critic.q_networks for p in q.parameters()]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        return q_from_features(critic, features, actions)
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)


def replay_settings(reward_fn, labeller, replay_buffer_class, replay_buffer_kwargs, policy_kwargs,
                    gamma: float = 0.99, guidance=None):
    """The replay buffer class and kwargs for ``reward_fn``: ``RelabelReplayBuffer`` by default,
    with an embedding slot (and obs embeddings, kept camera frames) for a reward that reads them,
    the reward's columns, and on the fast path (an extractor that does not read the BEV) no decoded
    masks (stored only for a reward that embeds frames)."""
    if replay_buffer_class is None:
        replay_buffer_class = RelabelReplayBuffer
        replay_buffer_kwargs = {"scale_images": True, "gamma": gamma, **(replay_buffer_kwargs or {})}
    if not issubclass(replay_buffer_class, RelabelReplayBuffer):
        if guidance:
            raise ValueError("algo.guidance needs DriveSAC's RelabelReplayBuffer (it stores the "
                             "suggested actions); leave replay_buffer_class unset")
        return replay_buffer_class, replay_buffer_kwargs
    if guidance:  # the suggested-action slot; an asynchronous teacher reads the stored BEVs
        extra = {"store_images": True} if getattr(guidance, "asynchronous", False) else {}
        replay_buffer_kwargs = {"guidance": True, **extra, **(replay_buffer_kwargs or {})}
    if needs_embedding(reward_fn):
        from ..vlm.text import TEXT_DIM
        dim = labeller.tower().dim if labeller.custom_encoder else TEXT_DIM
        replay_buffer_kwargs = {"embedding_dim": dim, **(replay_buffer_kwargs or {})}
        if needs_obs_embedding(reward_fn):
            replay_buffer_kwargs.setdefault("obs_embeddings", True)
        if wants_view_embedding(reward_fn):
            replay_buffer_kwargs.setdefault("keep_views", True)
    ext = (policy_kwargs or {}).get("features_extractor_class")
    if ext is not None and not getattr(ext, "reads_bev", True):
        # the fast path: the policy reads the frozen encoder's features, never the masks; they
        # are stored only for a reward that embeds frames, and never decoded to sample
        replay_buffer_kwargs = {"sample_images": False, "store_images": needs_embedding(reward_fn),
                                **(replay_buffer_kwargs or {})}
    if getattr(reward_fn, "columns", None):
        replay_buffer_kwargs = {"columns": dict(reward_fn.columns), **(replay_buffer_kwargs or {})}
    return replay_buffer_class, replay_buffer_kwargs


def _count(key: str, value, what: str) -> int:
    """``algo.<key>``, an integer >= 1, or one ValueError naming it and what it counts."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"algo.{key}={value!r}: must be an integer >= 1 ({what})")
    return int(value)


class DriveSAC(SAC):
    """See the module docstring. ``reward_fn`` is a :class:`drivemind.rewards.Reward`; labelling
    is ``self.labeller`` (:class:`drivemind.agents.labelling.Labeller`)."""

    policy_aliases = {**SAC.policy_aliases, "DrivePolicy": DriveSACPolicy}
    # the labeller's fields, under the names this agent has always had
    reward_fn = delegate("reward_fn")
    reward_name = delegate("reward_name")
    reward_state = delegate("reward_state")
    reward_service = delegate("reward_service")
    encoder = delegate("encoder")
    embedded_frames = delegate("embedded_frames")
    service_errors = delegate("service_errors")

    def __init__(self, policy="DrivePolicy", env=None, reward_fn=None, *, replay_buffer_class=None,
                 replay_buffer_kwargs: dict | None = None, reward_service: dict | bool | None = None,
                 encoder: dict | None = None, guidance: str = "none", guidance_kwargs: dict | None = None,
                 autocast: str = "none", reward_learn_every: int = 1, label_every: int = 1, **kwargs):
        if autocast not in AUTOCAST:
            raise ValueError(f"algo.autocast={autocast!r}: valid: {', '.join(AUTOCAST)} (bf16: the gradient "
                             "step's hidden layers in bfloat16, docs/training.md)")
        self.autocast = autocast
        self.reward_learn_every = _count("reward_learn_every", reward_learn_every,
                                         "SAC gradient steps per update of the reward's own model, e.g. "
                                         "DriveMind's world model; 1 = one per SAC batch, as the paper")
        self.label_every = _count("label_every", label_every, "transitions stored between labelling "
                                  "rounds; 1 = before every training round")
        self._labelled_at: int | None = None  # num_timesteps at the last labelling round
        self._reward_learn_debt = 0  # gradient steps since the reward's model last learned
        # Found-RL's action guidance (None: the plain SAC update)
        self.guidance_cfg = GuidanceConfig.from_config(guidance, guidance_kwargs)
        if self.guidance_cfg is not None and self.guidance_cfg.use_awag and kwargs.get("use_sde"):
            raise ValueError("algo.guidance=awag|both needs use_sde=false (the log-likelihood of the "
                             "suggested action is computed for the squashed Gaussian policy)")
        self.labeller = Labeller(reward_fn, encoder=encoder, reward_service=reward_service, agent="DriveSAC")
        replay_buffer_class, replay_buffer_kwargs = replay_settings(
            reward_fn, self.labeller, replay_buffer_class, replay_buffer_kwargs, kwargs.get("policy_kwargs"),
            gamma=kwargs.get("gamma", 0.99), guidance=self.guidance_cfg)
        super().__init__(policy, env, replay_buffer_class=replay_buffer_class,
                         replay_buffer_kwargs=replay_buffer_kwargs, **kwargs)
        self.labeller.set_reward(reward_fn)  # the reward service's config

    def autocast_context(self):
        """The gradient step's forward passes: ``torch.autocast`` in bfloat16 with
        ``autocast="bf16"`` (the heads' output layers stay float32: :func:`float32_outputs`), else
        nothing. On a CPU with AVX-512 BF16 a fast-path step takes about a quarter less time
        (docs/benchmarks.md); parameters, optimizer state and losses stay float32."""
        if self.autocast == "bf16":  # a model saved before the setting loads with the default, none
            return th.autocast(self.device.type, dtype=th.bfloat16)
        return contextlib.nullcontext()

    def _setup_learn(self, *args, **kwargs):
        use_default_logger(self)  # no SB3-<date> folder in the system temp dir
        return super()._setup_learn(*args, **kwargs)

    def collect_rollouts(self, env, callback, train_freq, replay_buffer, action_noise=None,
                         learning_starts: int = 0, log_interval=None):
        # SB3 collects train_freq env steps at a time, so a budget off that grid would overshoot
        # (total_timesteps=250 with train_freq=3 ending at 252): the last rollout is cut to what
        # is left, and the run ends on its budget exactly, as with train_freq=1
        left = -(-(self._total_timesteps - self.num_timesteps) // env.num_envs)  # ceil, per env
        if train_freq.unit == TrainFrequencyUnit.STEP and 0 < left < train_freq.frequency:
            train_freq = TrainFreq(left, train_freq.unit)
        return super().collect_rollouts(env, callback, train_freq, replay_buffer, action_noise,
                                        learning_starts, log_interval)

    # ------------------------------------------------------------------ labelling (the labeller's)
    def label_pending(self) -> int:
        """Score the transitions stored since the last call (one batch); returns how many."""
        self.labeller.require_reward(ValueError, "pass reward_fn= (a drivemind Reward, e.g. "
                                     "make_reward('drivemind_kinematic')) to the constructor or to "
                                     "DriveSAC.load, or call set_reward()")
        return self.labeller.label_pending(self.replay_buffer, self.num_timesteps)

    def wait_for_labels(self, n: int) -> int:
        """With the reward service: wait (up to ``reward_service.wait_s``) until at least ``n``
        transitions are labelled (the learner never samples unlabelled ones). Returns the count."""
        return self.labeller.wait_for_labels(self.replay_buffer, n, self.label_pending)

    def set_reward(self, reward_fn) -> None:
        """Switch the reward and re-score every stored transition from its facts (and stored
        embeddings: frames already embedded are not embedded again)."""
        self.labeller.set_reward(reward_fn)
        self.labeller.relabel(self.replay_buffer)

    def embed_missing(self, slots: np.ndarray, batch_size: int = 256) -> int:
        """Embed the stored frames of ``slots`` the reward reads and lacks (``Labeller.embed_missing``)."""
        return self.labeller.embed_missing(self.replay_buffer, slots, batch_size)

    def embed_views(self, slots: np.ndarray, batch_size: int = 64) -> int:
        """Embed the kept camera frames of ``slots`` (``Labeller.embed_views``)."""
        return self.labeller.embed_views(self.replay_buffer, slots, batch_size)

    def embedding_sampler(self, batch_size: int) -> dict | None:
        """(v_t, a_t, v_t+1) for ``batch_size`` random labelled transitions that have both
        embeddings (``obs_embedding``, ``action``, ``embedding``), or None when there are none."""
        return self.labeller.embedding_sampler(self.replay_buffer)(batch_size)

    def bev_clip(self):
        """The image encoder (``Labeller.tower``): BEV-CLIP for this env's BEV shape, or the
        configured ``encoder``."""
        return self.labeller.tower()

    def service(self):
        """The reward service's embedding worker (``Labeller.service``)."""
        return self.labeller.service()

    def close_service(self) -> None:
        """Stop the embedding worker, the reward's own workers and the action teacher's worker
        (end of the run)."""
        self.labeller.close()
        if getattr(self, "_guidance_requester", None) is not None:
            self._guidance_requester.close()
            self._guidance_requester = None

    def guidance_requester(self):
        """The asynchronous action teacher's learner side (``source=http|smolvlm``), built on
        first use."""
        if getattr(self, "_guidance_requester", None) is None:
            from .guidance import GuidanceRequester

            g = self.guidance_cfg
            self._guidance_requester = GuidanceRequester(g.source, g.teacher, g.service)
        return self._guidance_requester

    # ------------------------------------------------------------------ training
    def _setup_model(self) -> None:
        self.labeller.observation_space = self.observation_space
        self.labeller.env_of = lambda: getattr(self, "env", None)  # a speed tower's episode starts
        super()._setup_model()
        if self.labeller.needs_embedding:
            self.labeller.tower()  # a BEV shape the checkpoint was not trained for fails here
        # the target critic's heads (its encoder copy is unused: next features come from the
        # online encoder)
        self._q_params = [p for q in self.critic.q_networks for p in q.parameters()]
        self._q_target_params = [p for q in self.critic_target.q_networks for p in q.parameters()]
        # the actor's moving average (policy_kwargs.actor_ema), stepped as the target critic is
        ema = getattr(self.policy, "actor_ema", None)
        self._actor_ema_params = None if ema is None else (list(self.actor.parameters()), list(ema.parameters()))

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        # label what was stored since the last round, once label_every transitions wait (the
        # newest stay pending meanwhile: never sampled, as with the reward service)
        if self._labelled_at is None or self.num_timesteps - self._labelled_at >= self.label_every:
            self.label_pending()
            self._labelled_at = self.num_timesteps
        if self.reward_service is not None and len(self.replay_buffer.slots(LABELLED)) < batch_size:
            self.wait_for_labels(batch_size)  # DriveVLM-RL: wait for enough ready transitions
        for k, v in self.labeller.logs(self.replay_buffer).items():
            self.logger.record(k, v)
        guide = getattr(self, "guidance_cfg", None)
        if guide is not None and guide.asynchronous:  # the VLM's answers, written back by slot
            req = self.guidance_requester()
            req.pump(self.replay_buffer)
            for k, v in req.stats().items():
                self.logger.record(k, v)
        if not isinstance(self.policy, DriveSACPolicy):  # stock policy: SB3's own update
            if guide is not None:
                raise ValueError("algo.guidance needs DriveSAC's own policy (DrivePolicy)")
            return super().train(gradient_steps, batch_size)
        policy = self.policy
        policy.set_training_mode(True)
        optimizers = [self.actor.optimizer, self.critic.optimizer]
        if self.ent_coef_optimizer is not None:
            optimizers.append(self.ent_coef_optimizer)
        self._update_learning_rate(optimizers)
        ent_coef_losses, ent_coefs, actor_losses, critic_losses = [], [], [], []
        guide_logs: dict[str, list[float]] = {}
        amp = self.autocast_context

        for step in range(gradient_steps):
            if guide is None:
                data = self.replay_buffer.sample(batch_size)
            else:
                data, vlm_actions, vlm_mask = self.replay_buffer.sample_guided(batch_size)
            if self.use_sde:
                self.actor.reset_noise()
            scaled = getattr(self.replay_buffer, "scale_images", False)
            with amp():  # the forward passes (backward and optimizer steps outside)
                features = policy.encode(data.observations, scaled)
                with th.no_grad():
                    next_features = policy.encode(data.next_observations, scaled)

                # entropy coefficient
                actions_pi, log_prob = policy.actor_from_features(features.detach())
                log_prob = log_prob.reshape(-1, 1)
            if self.ent_coef_optimizer is not None and self.log_ent_coef is not None:
                ent_coef = th.exp(self.log_ent_coef.detach())
                ent_coef_loss = -(self.log_ent_coef * (log_prob + self.target_entropy).detach()).mean()
                ent_coef_losses.append(ent_coef_loss.item())
                self.ent_coef_optimizer.zero_grad()
                ent_coef_loss.backward()
                self.ent_coef_optimizer.step()
            else:
                ent_coef = self.ent_coef_tensor
            ent_coefs.append(ent_coef.item())

            # critic (and encoder)
            with amp():
                with th.no_grad():
                    next_actions, next_log_prob = policy.actor_from_features(next_features)
                    next_q = q_from_features(self.critic_target, next_features, next_actions)
                    next_q = th.min(next_q, dim=1, keepdim=True)[0] - ent_coef * next_log_prob.reshape(-1, 1)
                    discount = data.discounts if data.discounts is not None else self.gamma  # n-step
                    target_q = data.rewards + (1 - data.dones) * discount * next_q
                current_q = q_from_features(self.critic, features, data.actions)
                critic_loss = 0.5 * sum(F.mse_loss(current_q[:, i:i + 1], target_q)
                                        for i in range(current_q.shape[1]))
                if guide is not None and guide.use_vmr:  # Found-RL Eq. 12-13
                    q_vlm = q_from_features(self.critic, features, vlm_actions)
                    l_vmr = vmr_loss(q_vlm, current_q, vlm_mask, guide.vmr["margin"])
                    w_vmr = guide.vmr_weight(self.num_timesteps)
                    critic_loss = critic_loss + w_vmr * l_vmr
                    guide_logs.setdefault("guidance/vmr_loss", []).append(l_vmr.item())
                    guide_logs.setdefault("guidance/vmr_weight", []).append(w_vmr)
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self.critic.optimizer.step()

            # actor on detached features (the critic heads are not stepped by this loss)
            with amp():
                q_pi = q_for_actor(self.critic, features.detach(), actions_pi)
                actor_loss = (ent_coef * log_prob - th.min(q_pi, dim=1, keepdim=True)[0]).mean()
                if guide is not None and guide.use_awag:  # Found-RL Eq. 19-23
                    f = features.detach()
                    target = th.clamp(vlm_actions, -ACTION_CLIP, ACTION_CLIP)
                    a_det, logp_vlm = policy.guidance_terms(f, target)
                    with th.no_grad():
                        q_det = th.min(q_from_features(self.critic, f, a_det), dim=1)[0]
                        q_v = th.min(q_from_features(self.critic, f, target), dim=1)[0]
                    w, gate = awag_weights(q_v - q_det, guide.awag["beta"], guide.awag["w_max"])
                    l_awag = awag_loss(logp_vlm, w, gate, vlm_mask)
                    w_awag = guide.awag_weight(self.num_timesteps)
                    actor_loss = actor_loss + w_awag * l_awag
                    guide_logs.setdefault("guidance/awag_loss", []).append(l_awag.item())
                    guide_logs.setdefault("guidance/awag_weight", []).append(w_awag)
                    guide_logs.setdefault("guidance/awag_gate", []).append(
                        float(((vlm_mask.reshape(-1) > 0) & gate).float().mean()))
            if guide is not None:
                guide_logs.setdefault("guidance/available", []).append(float(vlm_mask.mean()))
            actor_losses.append(actor_loss.item())
            self.actor.optimizer.zero_grad()
            actor_loss.backward()
            self.actor.optimizer.step()

            if self._actor_ema_params is not None:
                polyak_update(*self._actor_ema_params, policy.actor_ema_tau)
            if step % self.target_update_interval == 0:
                polyak_update(self._q_params, self._q_target_params, self.tau)
                polyak_update(self.batch_norm_stats, self.batch_norm_stats_target, 1.0)

        # the reward's own model (DriveMind's world model): one update per reward_learn_every
        # gradient steps (1: one per SAC batch, the paper's)
        self._reward_learn_debt += gradient_steps
        calls, self._reward_learn_debt = divmod(self._reward_learn_debt, self.reward_learn_every)
        if calls:
            for k, v in (self.labeller.learn(self.embedding_sampler, calls) or {}).items():
                self.logger.record(k, v)

        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/ent_coef", np.mean(ent_coefs))
        self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        if ent_coef_losses:
            self.logger.record("train/ent_coef_loss", np.mean(ent_coef_losses))
        for k, v in guide_logs.items():
            self.logger.record(k, float(np.mean(v)))

    # ------------------------------------------------------------------ persistence
    def load_replay_buffer(self, path, truncate_last_traj: bool = True) -> None:
        super().load_replay_buffer(path, truncate_last_traj)
        if truncate_last_traj and isinstance(self.replay_buffer, RelabelReplayBuffer):
            # the run continues in new episodes: close the stored ones at their last transition
            self.replay_buffer.truncate_last_trajectory()

    def save(self, path, exclude=None, include=None) -> None:
        with saving(self):  # the reward's name and state_dict, the encoder and service configs
            super().save(path, exclude=exclude, include=include)

    def _excluded_save_params(self) -> list[str]:
        # the labeller (reward, image tower, service) is not pickled; the buffer is saved separately
        return [*super()._excluded_save_params(), "labeller", "_q_params", "_q_target_params",
                "_guidance_requester"]

    @classmethod
    def load(cls, path, env=None, device="auto", custom_objects: dict[str, Any] | None = None,
             reward_fn=None, **kwargs) -> "DriveSAC":
        """SB3's ``load`` plus ``reward_fn`` (not saved; without it the model predicts but cannot
        train). Warns when it differs by name from the reward the model was trained with."""
        model = super().load(path, env=env, device=device, custom_objects=custom_objects, **kwargs)
        model.labeller.restore(loaded_fields(model), reward_fn)
        return model
