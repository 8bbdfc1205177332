"""SAC on DriveMind-v0: SB3's SAC with a shared encoder and the relabelling replay buffer.

Differences from stock SB3 SAC (``SAC("MultiInputPolicy", env)``):

- **Rewards from the reward package.** Before each round of gradient steps, the transitions stored
  since the last round are scored in one batch by ``reward_fn`` from their stored facts
  (``RelabelReplayBuffer.label_pending``); the env's reward is not used. ``set_reward(fn)``
  re-scores the whole buffer. The mean of each reward term is logged under ``reward/``.
- **One shared encoder** (``DriveExtractor``), trained by the critic loss; the actor reads detached
  features, and the next observations are encoded once without gradients for both the target
  critic and the next action (as DrQ-v2 does). Per gradient step that is two CNN forward passes and
  one backward pass; stock SB3 (separate actor, critic and target encoders) runs five forward
  passes and three backward passes through CNNs.
- **Compact storage**: see :mod:`drivemind.agents.buffer`.
- **Image embeddings for semantic rewards.** When ``"embedding" in reward_fn.needs`` (e.g.
  ``aicr_static``, ``drivemind_static``), the buffer gets a 384-d embedding slot and, before
  scoring, each stored transition without an embedding gets one: its next observation's BEV (the
  frame the action led to, which the step's facts also describe) through BEV-CLIP
  (``BevClip.load(bev_shape=...)``, loaded once; a BEV shape it was not trained for is refused when
  the model is built). Each transition is embedded once; ``set_reward`` with new prompts re-scores
  from the stored embeddings. ``embedded_frames`` counts the frames embedded so far. A reward
  that needs ``obs_embedding`` (DriveMind's PCFM world model) also gets the embedding of the
  observation each action was taken in: copied from the same episode's previous transition, or
  embedded at episode starts.
- **Rewards with online state** (``drivemind.rewards.base``): before scoring, the new transitions
  go to ``reward_fn.prepare`` in time order (DriveMind's novelty detector and prompt cache; the
  columns it returns, e.g. prompt ids, are stored per transition); after each training round
  ``reward_fn.learn`` gets a sampler of (v_t, a_t, v_t+1) embedding triples (the world model);
  ``reward_fn.state_dict()`` is saved with the model (``reward_state``) and restored by ``load``.
- **Forward camera.** A reward that reads ``view_embedding`` (DriveVLM-RL's dynamic pathway) makes
  the buffer keep each step's camera frame (``info["front_rgb"]``: CARLA with a camera) while the
  transition is pending: the reward's models read it (``frame(i)["rgb"]``), and an encoder that
  embeds RGB (``vlm=openclip``) embeds it once into the ``view_embeddings`` slot; BEV-CLIP cannot,
  which is warned once (the reward then reads the BEV embedding).
- **Reward service.** ``reward_service`` (``algo.reward_service``) sends the BEV embeddings to a
  worker process (BEV-CLIP only; other encoders embed inline) and is passed to the reward's
  ``use_service`` (DriveVLM-RL's real detector and reasoner then run in a worker of their own).
  Transitions are labelled only once everything they need is back; until then they stay pending
  and are never sampled.

Everything else (entropy tuning, target updates, ``learn``, callbacks, save/load, gSDE) is SB3's.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import SAC
from stable_baselines3.common.utils import polyak_update
from stable_baselines3.sac.policies import LOG_STD_MAX, LOG_STD_MIN, MultiInputPolicy
from torch.nn import functional as F

from .buffer import LABELLED, PENDING, RelabelReplayBuffer
from .embedding import (ENCODERS, bev_shape, build_image_encoder, can_embed_rgb, check_encoder,  # noqa: F401
                        needs_embedding, needs_obs_embedding, run_prepare, sample_triples,
                        wants_view_embedding, warn_bev_only)
from .extractor import DriveExtractor
from .reward_service import SERVICE_DEFAULTS
from .sb3_logger import use_default_logger


class DriveSACPolicy(MultiInputPolicy):
    """SAC policy with one feature extractor shared by actor and critic, optimised with the critic.
    Defaults: ``DriveExtractor`` and 3-layer heads ([256, 256]: two hidden layers + output)."""

    def __init__(self, observation_space, action_space, lr_schedule, net_arch=None,
                 features_extractor_class=DriveExtractor, features_extractor_kwargs=None,
                 share_features_extractor: bool = True, **kwargs):
        if not share_features_extractor:
            raise ValueError("DriveSACPolicy always shares its encoder; use SB3's MultiInputPolicy "
                             "for separate actor/critic encoders")
        super().__init__(observation_space, action_space, lr_schedule,
                         net_arch=net_arch if net_arch is not None else [256, 256],
                         features_extractor_class=features_extractor_class,
                         features_extractor_kwargs=features_extractor_kwargs,
                         share_features_extractor=True, **kwargs)

    def _build(self, lr_schedule) -> None:
        self.actor = self.make_actor()
        self.critic = self.make_critic(features_extractor=self.actor.features_extractor)
        # the encoder learns from the critic loss only; the actor optimises its own head
        actor_params = [p for n, p in self.actor.named_parameters() if not n.startswith("features_extractor.")]
        self.actor.optimizer = self.optimizer_class(actor_params, lr=lr_schedule(1), **self.optimizer_kwargs)
        self.critic.optimizer = self.optimizer_class(self.critic.parameters(), lr=lr_schedule(1),
                                                     **self.optimizer_kwargs)
        self.critic_target = self.make_critic(features_extractor=None)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.set_training_mode(False)

    def encode(self, obs, scaled: bool = False) -> th.Tensor:
        """Features of a batch; ``scaled``: images already float in [0, 1] (the replay buffer
        decodes them so), which skips SB3's uint8 -> float -> /255 preprocessing passes."""
        if not scaled:
            return self.actor.extract_features(obs, self.actor.features_extractor)
        return self.actor.features_extractor({k: v.float() for k, v in obs.items()})

    def actor_from_features(self, features: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """(squashed action, log prob) from encoded features (the actor's forward after the
        extractor)."""
        a = self.actor
        latent = a.latent_pi(features)
        mean = a.mu(latent)
        if a.use_sde:
            return a.action_dist.log_prob_from_params(mean, a.log_std, latent_sde=latent)
        log_std = th.clamp(a.log_std(latent), LOG_STD_MIN, LOG_STD_MAX)
        return a.action_dist.log_prob_from_params(mean, log_std)


def q_from_features(critic, features: th.Tensor, actions: th.Tensor) -> th.Tensor:
    """Min-able stack of the critic heads' Q values (N x n_critics) on encoded features."""
    x = th.cat([features, actions], dim=1)
    return th.cat([q(x) for q in critic.q_networks], dim=1)


def _service_config(cfg) -> dict | None:
    """``reward_service``: None/False (embed inline), True (defaults) or a dict of
    ``SERVICE_DEFAULTS`` keys (plus ``enabled``)."""
    if cfg is None or cfg is False:
        return None
    cfg = {} if cfg is True else dict(cfg)
    if not cfg.pop("enabled", True):
        return None
    bad = sorted(set(cfg) - set(SERVICE_DEFAULTS))
    if bad:
        raise ValueError(f"unknown reward_service option(s) {bad}; valid: {sorted(SERVICE_DEFAULTS)} "
                         f"and 'enabled'")
    return {**SERVICE_DEFAULTS, **cfg}


class DriveSAC(SAC):
    """See the module docstring. ``reward_fn`` is a :class:`drivemind.rewards.Reward`."""

    policy_aliases = {**SAC.policy_aliases, "DrivePolicy": DriveSACPolicy}

    def __init__(self, policy="DrivePolicy", env=None, reward_fn=None, *, replay_buffer_class=None,
                 replay_buffer_kwargs: dict | None = None, reward_service: dict | bool | None = None,
                 encoder: dict | None = None, **kwargs):
        self.encoder = check_encoder(encoder)  # None: BEV-CLIP; {"kind": "openclip", ...}
        self.reward_service = _service_config(reward_service)
        self._embed_service_dead = False
        self._warned_views = False
        self._service = None
        self._in_service: dict[int, int] = {}  # request id -> num_timesteps when submitted
        self._poll_timeout = 0.0
        self.service_errors = 0
        self.reward_fn = reward_fn
        self.reward_name = getattr(reward_fn, "name", None)
        self.reward_terms: dict[str, float] = {}
        self._bev_clip = None
        self.embedded_frames = 0
        self.reward_state: dict | None = None
        if replay_buffer_class is None:
            replay_buffer_class = RelabelReplayBuffer
            replay_buffer_kwargs = {"scale_images": True, "gamma": kwargs.get("gamma", 0.99),
                                    **(replay_buffer_kwargs or {})}
        if needs_embedding(reward_fn) and issubclass(replay_buffer_class, RelabelReplayBuffer):
            from ..vlm.text import TEXT_DIM
            dim = TEXT_DIM
            if self.encoder and self.encoder.get("kind", "bev_clip") != "bev_clip":
                self._bev_clip = self._build_encoder(None)
                dim = self._bev_clip.dim
            replay_buffer_kwargs = {"embedding_dim": dim, **(replay_buffer_kwargs or {})}
            if needs_obs_embedding(reward_fn):
                replay_buffer_kwargs.setdefault("obs_embeddings", True)
            if wants_view_embedding(reward_fn):
                replay_buffer_kwargs.setdefault("keep_views", True)
        ext = (kwargs.get("policy_kwargs") or {}).get("features_extractor_class")
        if (ext is not None and not getattr(ext, "reads_bev", True)
                and issubclass(replay_buffer_class, RelabelReplayBuffer)):
            # the fast path: the policy reads the frozen encoder's features, never the masks; they
            # are stored only for a reward that embeds frames, and never decoded to sample
            replay_buffer_kwargs = {"sample_images": False, "store_images": needs_embedding(reward_fn),
                                    **(replay_buffer_kwargs or {})}
        if getattr(reward_fn, "columns", None) and issubclass(replay_buffer_class, RelabelReplayBuffer):
            replay_buffer_kwargs = {"columns": dict(reward_fn.columns), **(replay_buffer_kwargs or {})}
        super().__init__(policy, env, replay_buffer_class=replay_buffer_class,
                         replay_buffer_kwargs=replay_buffer_kwargs, **kwargs)
        if reward_fn is not None and self.reward_service is not None and hasattr(reward_fn, "use_service"):
            reward_fn.use_service(self.reward_service)

    def _setup_learn(self, *args, **kwargs):
        use_default_logger(self)  # no SB3-<date> folder in the system temp dir
        return super()._setup_learn(*args, **kwargs)

    # ------------------------------------------------------------------ rewards
    def _require_reward(self):
        if self.reward_fn is None:
            hint = f" (it was trained with {self.reward_name!r})" if self.reward_name else ""
            raise ValueError(f"DriveSAC has no reward function{hint}: pass reward_fn= (a drivemind "
                             f"Reward, e.g. make_reward('drivemind_kinematic')) to the constructor "
                             f"or to DriveSAC.load, or call set_reward()")

    def label_pending(self) -> int:
        """Score the transitions stored since the last call (one batch); returns how many."""
        self._require_reward()
        buf = self.replay_buffer
        if not isinstance(buf, RelabelReplayBuffer):
            return 0
        pending = buf.time_order(buf.slots(PENDING))
        if len(pending) and self._embeds_in_service() and needs_embedding(self.reward_fn):
            pending = self._service_exchange(pending)  # only the prefix whose embeddings are back
        if len(pending):
            self.embed_missing(pending)
            self.embed_views(pending)
            cols, k = run_prepare(self.reward_fn, pending, buf.fact_batch(pending), step=self.num_timesteps,
                                  frame=lambda i: buf.observation(int(pending[i]), next=True),
                                  timeout=self._poll_timeout)
            pending = pending[:k]  # a reward with models in a worker: only what is answered
            for name, v in cols.items():
                buf.set_column(name, pending, v[:k])
            if len(pending):
                self.reward_terms = buf.label(self.reward_fn, pending)
                buf.take_views(pending)
        return len(pending)

    def _embeds_in_service(self) -> bool:
        """Whether BEV embeddings go to the reward service's worker: it hosts BEV-CLIP, so other
        encoders embed inline (the reward's own models may still run in a worker of theirs)."""
        return (self.reward_service is not None and not getattr(self, "_embed_service_dead", False)
                and (self.encoder or {}).get("kind", "bev_clip") == "bev_clip")

    def embed_views(self, slots: np.ndarray, batch_size: int = 64) -> int:
        """Embed the kept forward camera frames of ``slots`` (``view_embeddings``) when the reward
        reads them and the encoder embeds RGB; returns how many were embedded."""
        buf = self.replay_buffer
        if not (isinstance(buf, RelabelReplayBuffer) and buf.views and wants_view_embedding(self.reward_fn)):
            return 0
        slots = np.asarray([s for s in np.asarray(slots, np.int64).tolist() if s in buf.views], np.int64)
        if not len(slots):
            return 0
        enc = self.bev_clip()
        if not can_embed_rgb(enc):
            if not getattr(self, "_warned_views", False):
                warn_bev_only(enc, self.reward_name)
                self._warned_views = True
            return 0
        buf.enable_view_embeddings()
        flat = buf.view_embeddings.reshape(-1, buf.embedding_dim)
        slots = slots[~np.any(flat[slots] != 0, axis=1)]
        for a in range(0, len(slots), batch_size):
            s = slots[a:a + batch_size]
            buf.set_embeddings(s, enc.embed_rgb(np.stack([buf.views[int(x)] for x in s])), view=True)
        self.embedded_frames += len(slots)
        return len(slots)

    # ------------------------------------------------------------------ asynchronous embeddings
    def service(self):
        """The reward service (a separate process embedding BEV frames in micro-batches; started
        on first use when ``reward_service`` is set). docs/reward_service.md."""
        if self._service is None:
            from .reward_service import RewardService, bev_clip_embedder

            c = self.reward_service
            self._service = RewardService(
                bev_clip_embedder(self.observation_space["bev"].shape, threads=c["threads"],
                                  dtype="float16"),
                max_batch=c["max_batch"], max_wait_ms=c["max_wait_ms"], max_pending=c["max_pending"],
                name="drivemind-embeddings")
        return self._service

    def close_service(self) -> None:
        """Stop the embedding worker and the reward's own workers (end of the run)."""
        if self._service is not None:
            self._service.close()
            self._service = None
            self._in_service.clear()
        close = getattr(self.reward_fn, "close", None)
        if close is not None:
            close()

    def _service_exchange(self, pending: np.ndarray) -> np.ndarray:
        """Collect returned embeddings, submit the missing ones (without blocking: back-pressure
        leaves the rest for the next round), and return the longest time-ordered prefix of
        ``pending`` whose embeddings are all there (the rest stays pending: never sampled).
        Request ids: 2 * slot for the next observation, 2 * slot + 1 for the observation (episode
        starts, for ``obs_embedding``)."""
        buf, svc = self.replay_buffer, self.service()
        d = buf.embedding_dim
        flat = buf.embeddings.reshape(-1, d)
        oflat = buf.obs_embeddings.reshape(-1, d) if buf.obs_embeddings is not None else None
        horizon = buf.buffer_size * buf.n_envs  # a result older than this belongs to an overwritten slot
        from .reward_service import RewardServiceDead, RewardWorkerError
        try:
            ids, emb = svc.poll(self._poll_timeout)
        except RewardWorkerError as err:  # that batch only: resubmit its frames next round
            for i in np.asarray(err.ids).tolist():
                self._in_service.pop(int(i), None)
            self.service_errors += 1
            if self.service_errors == 1:
                warnings.warn(f"the reward service failed a batch ({err}); its frames are sent again "
                              f"(counted in service_errors)", UserWarning, stacklevel=2)
            ids, emb = np.zeros(0, np.int64), []
        except RewardServiceDead as err:  # no worker: embed inline from now on
            warnings.warn(f"the reward service's worker died ({err}); embedding inline from now on",
                          UserWarning, stacklevel=2)
            self._service.close()
            self._service = None
            self._in_service.clear()
            self._embed_service_dead = True
            return pending
        for i, e in zip(ids.tolist(), emb):
            stamp = self._in_service.pop(i, None)
            if stamp is None or self.num_timesteps - stamp >= horizon:
                continue
            slot, kind = divmod(i, 2)
            if buf.labels.reshape(-1)[slot] != PENDING:
                continue
            (oflat if kind else flat)[slot] = e
            self.embedded_frames += 1
        have = np.any(flat[pending] != 0, axis=1)
        if oflat is not None:
            ohave = np.any(oflat[pending] != 0, axis=1)
            prev = buf.predecessors(pending)
            inside = prev >= 0
            ready_prev = inside.copy()
            ready_prev[inside] = np.any(flat[prev[inside]] != 0, axis=1)
            copy = ~ohave & ready_prev
            oflat[pending[copy]] = flat[prev[copy]]
            ohave |= copy
        # submit what is missing and not yet in flight (oldest first)
        want = [2 * int(x) for x in pending[~have]]
        if oflat is not None:
            want += [2 * int(x) + 1 for x in pending[~ohave & ~inside]]
        want = [i for i in want if i not in self._in_service]
        if want:
            want = np.asarray(want, np.int64)
            room = max(svc.max_pending - svc.in_flight, 0)
            want = want[:room]
            if len(want):
                slots, kinds = np.divmod(want, 2)
                frames = np.empty((len(want), *self.observation_space["bev"].shape), np.uint8)
                nxt = kinds == 0
                if nxt.any():
                    frames[nxt] = self._bev_frames(slots[nxt], next=True)
                if (~nxt).any():
                    frames[~nxt] = self._bev_frames(slots[~nxt], next=False)
                n = svc.submit(want, frames, block=False)
                for i in want[:n].tolist():
                    self._in_service[i] = self.num_timesteps
        ok = have & (ohave if oflat is not None else True)
        k = len(ok) if ok.all() else int(np.argmin(ok))
        return pending[:k]

    def _bev_frames(self, slots: np.ndarray, next: bool) -> np.ndarray:
        """uint8 BEV frames of the slots' next observations (or observations)."""
        buf = self.replay_buffer
        rows, envs = np.divmod(np.asarray(slots, np.int64), buf.n_envs)
        if not next:
            return buf._read_rows(rows, envs, {}, scaled=False)["bev"].numpy()
        done = buf.dones[rows, envs]
        terminal = {i: int(x) for i, x in enumerate(slots) if done[i] and int(x) in buf.terminal}
        return buf._read_rows((rows + 1) % buf.buffer_size, envs, terminal, scaled=False)["bev"].numpy()

    def wait_for_labels(self, n: int) -> int:
        """With the reward service: wait (up to ``reward_service.wait_s``) until at least ``n``
        transitions are labelled (the learner never samples unlabelled ones). Returns the count."""
        buf = self.replay_buffer
        t0 = time.monotonic()
        while len(buf.slots(LABELLED)) < n and buf.counts()["pending"]:
            if time.monotonic() - t0 > self.reward_service["wait_s"]:
                raise TimeoutError(f"the reward service labelled only {len(buf.slots(LABELLED))} of "
                                   f"{n} transitions in {self.reward_service['wait_s']} s; check its "
                                   f"stats ({self._service.stats() if self._service else 'not started'})")
            self._poll_timeout = 0.5  # block briefly on the service while waiting
            try:
                self.label_pending()
            finally:
                self._poll_timeout = 0.0
        return len(buf.slots(LABELLED))

    def set_reward(self, reward_fn) -> None:
        """Switch the reward and re-score every stored transition from its facts (and stored
        embeddings: frames already embedded are not embedded again)."""
        self.reward_fn = reward_fn
        self.reward_name = getattr(reward_fn, "name", None)
        if self.reward_service is not None and hasattr(reward_fn, "use_service"):
            reward_fn.use_service(self.reward_service)
        if isinstance(self.replay_buffer, RelabelReplayBuffer):
            self.embed_missing(self.replay_buffer.slots())
            self.reward_terms = self.replay_buffer.relabel(reward_fn)

    # ------------------------------------------------------------------ image embeddings
    def bev_clip(self):
        """The contrastive image encoder (loaded on first use): BEV-CLIP for this env's BEV shape
        by default, or the configured one (``encoder``, e.g. OpenCLIP: ``vlm=openclip``), whose
        text tower the reward then uses too."""
        if self._bev_clip is None:
            self._bev_clip = self._build_encoder(bev_shape(self.observation_space))
        return self._bev_clip

    def _build_encoder(self, shape):
        # OpenCLIP: the reward's prompts then go through the same model's text tower
        return build_image_encoder(self.encoder, shape, self.reward_fn)

    def embed_missing(self, slots: np.ndarray, batch_size: int = 256) -> int:
        """Embed the next-observation BEVs of ``slots`` that have no embedding yet (none when the
        reward needs no embeddings); returns how many were embedded."""
        buf = self.replay_buffer
        if not needs_embedding(self.reward_fn) or not isinstance(buf, RelabelReplayBuffer):
            return 0
        if buf.embeddings is None:
            raise ValueError(f"reward {self.reward_name!r} needs image embeddings but this replay "
                             f"buffer has no embedding slot: build the model with this reward "
                             f"(or replay_buffer_kwargs=dict(embedding_dim=384))")
        all_slots = np.asarray(slots, np.int64)
        flat = buf.embeddings.reshape(-1, buf.embedding_dim)
        slots = all_slots[~np.any(flat[all_slots] != 0, axis=1)]
        n = 0
        model = self.bev_clip() if len(slots) else None
        for a in range(0, len(slots), batch_size):
            s = slots[a:a + batch_size]
            buf.set_embeddings(s, model.embed(self._bev_frames(s, next=True), batch_size=batch_size))
        n += len(slots)
        if buf.obs_embeddings is not None and len(all_slots):
            # v_t of each transition: the same episode's previous next-embedding, else embed obs
            oflat = buf.obs_embeddings.reshape(-1, buf.embedding_dim)
            todo = all_slots[~np.any(oflat[all_slots] != 0, axis=1)]
            prev = buf.predecessors(todo)
            has = prev >= 0
            has[has] = np.any(flat[prev[has]] != 0, axis=1)
            oflat[todo[has]] = flat[prev[has]]
            start = todo[~has]
            if len(start):
                model = model or self.bev_clip()
                for a in range(0, len(start), batch_size):
                    s = start[a:a + batch_size]
                    buf.set_embeddings(s, model.embed(self._bev_frames(s, next=False), batch_size=batch_size),
                                       obs=True)
                n += len(start)
        self.embedded_frames += n
        return n

    def embedding_sampler(self, batch_size: int) -> dict | None:
        """(v_t, a_t, v_t+1) for ``batch_size`` random labelled transitions that have both
        embeddings (``obs_embedding``, ``action``, ``embedding``), or None when there are none."""
        buf = self.replay_buffer
        if not isinstance(buf, RelabelReplayBuffer) or buf.obs_embeddings is None:
            return None
        ok = buf.slots(LABELLED)
        if not len(ok):
            return None
        d = buf.embedding_dim
        return sample_triples(buf.obs_embeddings.reshape(-1, d), buf.actions.reshape(-1, buf.action_dim),
                              buf.embeddings.reshape(-1, d), batch_size, rows=ok)

    def _log_reward(self):
        for k, v in self.reward_terms.items():
            self.logger.record(f"reward/{k}", v)
        stats = getattr(self.reward_fn, "stats", None)
        for k, v in (stats() if stats is not None else {}).items():
            self.logger.record(k, v)
        if self._service is not None:
            for k, v in self._service.stats().items():
                self.logger.record(f"reward_service/{k}", v)
        if isinstance(self.replay_buffer, RelabelReplayBuffer):
            for k, v in self.replay_buffer.stats().items():
                self.logger.record(k, v)

    # ------------------------------------------------------------------ training
    def _setup_model(self) -> None:
        super()._setup_model()
        if needs_embedding(self.reward_fn):
            self.bev_clip()  # a BEV shape the checkpoint was not trained for fails here
        # the target critic's heads (its encoder copy is unused: next features come from the
        # online encoder)
        self._q_params = [p for q in self.critic.q_networks for p in q.parameters()]
        self._q_target_params = [p for q in self.critic_target.q_networks for p in q.parameters()]

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        self.label_pending()
        if self.reward_service is not None and len(self.replay_buffer.slots(LABELLED)) < batch_size:
            self.wait_for_labels(batch_size)  # DriveVLM-RL: wait for enough ready transitions
        self._log_reward()
        if not isinstance(self.policy, DriveSACPolicy):  # stock policy: SB3's own update
            return super().train(gradient_steps, batch_size)
        policy = self.policy
        policy.set_training_mode(True)
        optimizers = [self.actor.optimizer, self.critic.optimizer]
        if self.ent_coef_optimizer is not None:
            optimizers.append(self.ent_coef_optimizer)
        self._update_learning_rate(optimizers)
        ent_coef_losses, ent_coefs, actor_losses, critic_losses = [], [], [], []

        for step in range(gradient_steps):
            data = self.replay_buffer.sample(batch_size)
            if self.use_sde:
                self.actor.reset_noise()
            scaled = getattr(self.replay_buffer, "scale_images", False)
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
            with th.no_grad():
                next_actions, next_log_prob = policy.actor_from_features(next_features)
                next_q = q_from_features(self.critic_target, next_features, next_actions)
                next_q = th.min(next_q, dim=1, keepdim=True)[0] - ent_coef * next_log_prob.reshape(-1, 1)
                discount = data.discounts if data.discounts is not None else self.gamma  # n-step
                target_q = data.rewards + (1 - data.dones) * discount * next_q
            current_q = q_from_features(self.critic, features, data.actions)
            critic_loss = 0.5 * sum(F.mse_loss(current_q[:, i:i + 1], target_q)
                                    for i in range(current_q.shape[1]))
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self.critic.optimizer.step()

            # actor on detached features (the critic heads are not stepped by this loss)
            q_pi = q_from_features(self.critic, features.detach(), actions_pi)
            actor_loss = (ent_coef * log_prob - th.min(q_pi, dim=1, keepdim=True)[0]).mean()
            actor_losses.append(actor_loss.item())
            self.actor.optimizer.zero_grad()
            actor_loss.backward()
            self.actor.optimizer.step()

            if step % self.target_update_interval == 0:
                polyak_update(self._q_params, self._q_target_params, self.tau)
                polyak_update(self.batch_norm_stats, self.batch_norm_stats_target, 1.0)

        learn = getattr(self.reward_fn, "learn", None)
        for k, v in ((learn(self.embedding_sampler) if learn is not None else None) or {}).items():
            self.logger.record(k, v)

        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/ent_coef", np.mean(ent_coefs))
        self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        if ent_coef_losses:
            self.logger.record("train/ent_coef_loss", np.mean(ent_coef_losses))

    # ------------------------------------------------------------------ persistence
    def load_replay_buffer(self, path, truncate_last_traj: bool = True) -> None:
        super().load_replay_buffer(path, truncate_last_traj)
        if truncate_last_traj and isinstance(self.replay_buffer, RelabelReplayBuffer):
            # the run continues in new episodes: close the stored ones at their last transition
            self.replay_buffer.truncate_last_trajectory()

    def save(self, path, exclude=None, include=None) -> None:
        sd = getattr(self.reward_fn, "state_dict", None)
        if sd is not None:
            self.reward_state = sd() or None
        super().save(path, exclude=exclude, include=include)

    def _excluded_save_params(self) -> list[str]:
        # the reward is passed to load again (its name is saved); the buffer is saved separately
        return [*super()._excluded_save_params(), "reward_fn", "reward_terms", "_bev_clip", "_q_params",
                "_q_target_params", "_service", "_in_service", "_poll_timeout"]

    @classmethod
    def load(cls, path, env=None, device="auto", custom_objects: dict[str, Any] | None = None,
             reward_fn=None, **kwargs) -> "DriveSAC":
        """SB3's ``load`` plus ``reward_fn`` (not saved; without it the model predicts but cannot
        train). Warns when it differs by name from the reward the model was trained with."""
        model = super().load(path, env=env, device=device, custom_objects=custom_objects, **kwargs)
        model.reward_terms = {}
        saved = model.reward_name
        model.reward_fn = reward_fn
        model._bev_clip = None
        if reward_fn is not None:
            model.reward_name = getattr(reward_fn, "name", None)
            if getattr(model, "reward_service", None) is not None and hasattr(reward_fn, "use_service"):
                reward_fn.use_service(model.reward_service)
            if getattr(model, "encoder", None) and model.encoder.get("kind", "bev_clip") != "bev_clip" \
                    and needs_embedding(reward_fn):
                model.bev_clip()  # binds the encoder's text tower to the reward
            if saved is not None and saved != model.reward_name:
                warnings.warn(f"the model was trained with reward {saved!r} and is now given "
                              f"{model.reward_name!r}", UserWarning, stacklevel=2)
            elif getattr(model, "reward_state", None) and hasattr(reward_fn, "load_state_dict"):
                reward_fn.load_state_dict(model.reward_state)  # prompts, novelty, world model
        return model
