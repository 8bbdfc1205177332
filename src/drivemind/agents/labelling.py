"""Labelling: everything between the transitions an agent stores and the rewards its learner reads.

One :class:`Labeller` per agent (``model.labeller``) owns the reward (``reward_fn``, its name and
saved state), the image tower that embeds frames for semantic rewards (BEV-CLIP or the configured
``encoder``), the frame counters, the reward's online hooks (``prepare``, ``learn``, ``stats``)
and, for DriveSAC, the reward service's embedding worker. The learners keep only the learning:

- **DriveSAC** (replay buffer): ``label_pending(buf, step)`` scores the buffer's pending rows,
  ``wait_for_labels``, ``relabel`` (a new reward over the whole buffer) and
  ``embedding_sampler(buf)`` (the world model's (v_t, a_t, v_t+1) triples).

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
    columns it returns, e.g. prompt ids, are stored per transition); after a training round
    (DriveSAC: once per ``reward_learn_every`` gradient steps) ``reward_fn.learn`` gets a sampler
    of (v_t, a_t, v_t+1) embedding triples (the world model);
    ``reward_fn.state_dict()`` is saved with the model (``reward_state``) and restored by ``load``.
  - **A tower that reads the ego's speed** (``vlm=bev_clip_speed``: ``bev_clip_cpu_speed.pt``,
    ``BevClip.reads_speed``) gets each frame's measured speed beside its BEV: the step's
    ``speed_kmh`` fact for the next observation (the buffer's stored facts), the observation's own
    ``ego`` speed measurement for the observations acted from at episode starts
    (:func:`~drivemind.agents.embedding.ego_speed_unit_kmh`). Such a tower embeds inline, never in
    the reward service's worker.
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
- **DrivePPO** (rollouts): ``start_rollout`` allocates the rollout's embeddings and reward columns;
  ``rollout_step`` embeds each step's next observations (and the observations acted from, carried
  across steps and rollouts) and camera frames, and runs ``prepare`` on the step's batch;
  ``learn(sampler, calls)`` after each update. The rollout's facts, actions, bootstrap and its one
  batch reward call stay in :mod:`drivemind.agents.ppo`.

The labeller is never pickled: the agents save the fields in :data:`Labeller.SAVED` (the reward's
name and ``state_dict``, the encoder and service configs, the counters) under the attribute
names checkpoints have always used, and ``load`` hands them back (:meth:`Labeller.restore`).
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager

import numpy as np

from .buffer import LABELLED, PENDING, RelabelReplayBuffer
from .embedding import (VIEW_KEY, bev_shape, build_image_encoder, can_embed_rgb, check_encoder,
                        ego_speed_unit_kmh, needs_embedding, needs_obs_embedding, run_prepare, sample_triples,
                        wants_view_embedding, warn_bev_only)
from ..reward_service import SERVICE_DEFAULTS


def service_config(cfg) -> dict | None:
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


def delegate(name: str, doc: str = "") -> property:
    """A property of an agent that reads and writes ``self.labeller.<name>``."""
    return property(lambda self: getattr(self.labeller, name),
                    lambda self, v: setattr(self.labeller, name, v), doc=doc or f"``labeller.{name}``")


@contextmanager
def saving(model):
    """While an agent saves: the labeller's :data:`Labeller.SAVED` fields in the agent's
    ``__dict__`` (which SB3 writes to the zip), under the names checkpoints have always used."""
    fields = model.labeller.saved()
    model.__dict__.update(fields)
    try:
        yield
    finally:
        for k in fields:
            model.__dict__.pop(k, None)


def loaded_fields(model) -> dict:
    """After SB3's ``load`` (which puts the zip's fields in ``model.__dict__``): the labeller's
    fields, taken out of the agent's ``__dict__`` (older checkpoints have the same names)."""
    return {k: model.__dict__.pop(k) for k in Labeller.SAVED if k in model.__dict__}


def next_frame(new_obs, infos: list[dict], dones, i: int) -> dict:
    """Env ``i``'s next observation (VecEnv step) as a dict of arrays: the terminal observation when
    its episode ended at this step (the VecEnv has already reset it); with ``"rgb"``, the step's
    forward camera frame, where the backend has one."""
    if dones[i]:
        term = infos[i].get("terminal_observation")
        if term is None:
            raise KeyError(f"env {i} ended an episode without 'terminal_observation' in its "
                           f"info; step DrivePPO with an SB3 VecEnv (DummyVecEnv, "
                           f"SubprocVecEnv), which records it")
        out = dict(term) if isinstance(term, dict) else {"obs": np.asarray(term)}
    elif isinstance(new_obs, dict):
        out = {k: np.asarray(v[i]) for k, v in new_obs.items()}
    else:
        out = {"obs": np.asarray(new_obs[i])}
    view = infos[i].get(VIEW_KEY)
    if view is not None:
        out["rgb"] = np.asarray(view)
    return out


def bev_frames(buf: RelabelReplayBuffer, slots: np.ndarray, next: bool) -> np.ndarray:
    """uint8 BEV frames of the buffer slots' next observations (or observations)."""
    rows, envs = np.divmod(np.asarray(slots, np.int64), buf.n_envs)
    if not next:
        return buf._read_rows(rows, envs, {}, scaled=False)["bev"].numpy()
    done = buf.dones[rows, envs]
    terminal = {i: int(x) for i, x in enumerate(slots) if done[i] and int(x) in buf.terminal}
    return buf._read_rows((rows + 1) % buf.buffer_size, envs, terminal, scaled=False)["bev"].numpy()


BUFFER_STATS_EVERY = 64  # training rounds between two readings of the buffer's stats in logs()


class Labeller:
    """The reward, its image tower and its reward service for one agent (module docstring).

    :param reward_fn: a ``drivemind.rewards.Reward`` (or None until ``set_reward``).
    :param encoder: the image tower config: None (BEV-CLIP for the env's BEV shape) or
        ``{"kind": "openclip", ...}``.
    :param reward_service: ``algo.reward_service`` (see :func:`service_config`).
    :param agent: the agent's name, for error messages.
    """

    # checkpoint attribute -> labeller attribute (what the agents save and ``restore`` reads)
    SAVED = {"reward_name": "reward_name", "reward_state": "reward_state", "encoder": "encoder",
             "reward_service": "reward_service", "embedded_frames": "embedded_frames",
             "service_errors": "service_errors", "_embed_service_dead": "service_dead",
             "_warned_views": "warned_views"}

    def __init__(self, reward_fn=None, *, encoder: dict | None = None, reward_service=None,
                 agent: str = "the agent"):
        self.agent = agent
        self.encoder = check_encoder(encoder)
        self.reward_service = service_config(reward_service)
        self.reward_fn = reward_fn
        self.reward_name = getattr(reward_fn, "name", None)
        self.reward_state: dict | None = None  # reward_fn.state_dict() as of the last save
        self.observation_space = None  # the agent's, set by its _setup_model
        self.terms: dict[str, float] = {}  # mean of each reward term over the last labelled rows
        self.embedded_frames = 0  # frames through the image tower (or the service's worker)
        self.service_errors = 0  # batches the service's worker failed (sent again)
        self.service_dead = False  # the worker died: embed inline from then on
        self.warned_views = False
        self.image_encoder = None
        # the agent's env, for the km/h per unit of obs["ego"][0] (a speed tower's episode-start
        # frames): a callable the agent sets (None: DriveEnv's default speed_scale)
        self.env_of = None
        self._service = None
        self._in_service: dict[int, int] = {}  # request id -> step when submitted
        self._poll_timeout = 0.0
        # DrivePPO: the rollout's embeddings and reward columns (start_rollout), and the
        # (observation object, its (n_envs, D) embedding) carried from step to step
        self.rollout_embeddings = self.rollout_obs_embeddings = self.rollout_view_embeddings = None
        self.rollout_columns: dict[str, np.ndarray] = {}
        self._carry = None
        self._buffer_stats: dict | None = None  # buffer stats as of the last time logs() took them
        self._logs_calls = 0

    # ------------------------------------------------------------------ reward
    @property
    def needs_embedding(self) -> bool:
        return needs_embedding(self.reward_fn)

    @property
    def custom_encoder(self) -> bool:
        """Whether the tower is not BEV-CLIP (OpenCLIP: the reward's prompts then go through its
        text tower)."""
        return (self.encoder or {}).get("kind", "bev_clip") != "bev_clip"

    def set_reward(self, reward_fn, load_tower: bool = False) -> None:
        """Label with ``reward_fn`` from now on: it gets the reward service's config and, when it
        reads embeddings, the tower (loaded now with ``load_tower``: a BEV shape without a
        checkpoint fails here) as its text encoder where that is not BEV-CLIP."""
        old, self.reward_fn = self.reward_fn, reward_fn
        self.reward_name = getattr(reward_fn, "name", None)
        if reward_fn is not None and self.reward_service is not None and hasattr(reward_fn, "use_service"):
            reward_fn.use_service(self.reward_service)
        if not needs_embedding(reward_fn):
            return
        if load_tower and self.image_encoder is None and self.observation_space is not None:
            self.tower()  # built with this reward: its prompts go through the tower's text tower
        elif self.image_encoder is not None and self.custom_encoder and reward_fn is not old:
            reward_fn.bind_encoder(self.image_encoder)

    def require_reward(self, error=ValueError, hint: str = "") -> None:
        if self.reward_fn is None:
            was = f" (it was trained with {self.reward_name!r})" if self.reward_name else ""
            raise error(f"{self.agent} has no reward function{was}: {hint}")

    def saved(self) -> dict:
        """The fields a checkpoint keeps (:data:`SAVED`), ``reward_state`` refreshed from the
        reward's ``state_dict()``."""
        sd = getattr(self.reward_fn, "state_dict", None)
        if sd is not None:
            self.reward_state = sd() or None
        return {k: getattr(self, a) for k, a in self.SAVED.items()}

    def restore(self, fields: dict, reward_fn, set_reward=None, stacklevel: int = 3) -> None:
        """After ``load``: take back the saved ``fields``, then ``reward_fn`` (None: the model
        predicts but cannot learn) through ``set_reward`` (the agent's; default: this one's,
        loading now only a tower that is not BEV-CLIP, whose text tower the reward needs before its
        state is loaded). Warns when it differs by name from the reward the model was trained
        with; otherwise loads the saved ``reward_state`` into it (prompts, novelty, world model)."""
        for k, a in self.SAVED.items():
            if k in fields:
                setattr(self, a, fields[k])
        self.encoder = check_encoder(self.encoder)
        if reward_fn is None:
            return
        saved = self.reward_name
        if set_reward is None:
            self.set_reward(reward_fn, load_tower=self.custom_encoder)
        else:
            set_reward(reward_fn)
        if saved is not None and saved != self.reward_name:
            warnings.warn(f"the model was trained with reward {saved!r} and is now given "
                          f"{self.reward_name!r}", UserWarning, stacklevel=stacklevel + 1)
        elif self.reward_state and hasattr(self.reward_fn, "load_state_dict"):
            self.reward_fn.load_state_dict(self.reward_state)

    def prepare(self, slots, batch: dict, frame, step: int, timeout: float | None):
        """The reward's ``prepare`` on new transitions in time order (:func:`run_prepare`):
        (columns to store, how many leading transitions are ready)."""
        return run_prepare(self.reward_fn, slots, batch, frame=frame, step=step, timeout=timeout)

    def learn(self, sampler, calls: int = 1) -> dict[str, float] | None:
        """``reward_fn.learn(sampler)`` ``calls`` times (the world model); the mean of each value
        it returns, or None when the reward does not learn."""
        learn = getattr(self.reward_fn, "learn", None)
        if learn is None:
            return None
        logs: dict[str, list[float]] = {}
        for _ in range(calls):
            for k, v in (learn(sampler) or {}).items():
                logs.setdefault(k, []).append(float(v))
        return {k: float(np.mean(v)) for k, v in logs.items()}

    def stats(self) -> dict:
        """The reward's own stats (prompts, novelty, world model, ...)."""
        stats = getattr(self.reward_fn, "stats", None)
        return dict(stats() if stats is not None else {})

    def close(self) -> None:
        """Stop the embedding worker and the reward's own workers (end of the run)."""
        if self._service is not None:
            self._service.close()
            self._service = None
            self._in_service.clear()
        close = getattr(self.reward_fn, "close", None)
        if close is not None:
            close()

    # ------------------------------------------------------------------ image tower
    def tower(self):
        """The contrastive image encoder (loaded on first use): BEV-CLIP for the env's BEV shape
        by default, or the configured ``encoder`` (e.g. OpenCLIP: ``vlm=openclip``), whose text
        tower the reward then uses too. A BEV shape BEV-CLIP was not trained for fails here."""
        if self.image_encoder is None:
            shape = bev_shape(self.observation_space) if self.observation_space is not None else None
            self.image_encoder = build_image_encoder(self.encoder, shape, self.reward_fn)
        return self.image_encoder

    @property
    def custom_bev_clip(self) -> bool:
        """Whether a BEV-CLIP checkpoint other than the shipped one for the BEV's shape was
        configured (``encoder.weights``, e.g. the speed tower): embedded inline, not in the
        reward service's worker (which hosts the shipped one)."""
        return not self.custom_encoder and bool((self.encoder or {}).get("weights"))

    @property
    def tower_reads_speed(self) -> bool:
        """Whether the image tower reads the ego's measured speed beside the BEV (the speed
        tower); only a configured checkpoint can (``custom_bev_clip``)."""
        return self.custom_bev_clip and bool(getattr(self.tower(), "reads_speed", False))

    def _unit(self) -> float:
        return float(ego_speed_unit_kmh(self.env_of() if callable(self.env_of) else None))

    def obs_speed_kmh(self, ego) -> np.ndarray:
        """The measured speeds (km/h) of observations from their ``ego`` vectors (N, 3)."""
        e = np.asarray(ego, np.float64)
        return (e[None] if e.ndim == 1 else e)[:, 0] * self._unit()

    def _tower_embed(self, frames: np.ndarray, speed, batch_size: int) -> np.ndarray:
        """``frames`` through the tower; ``speed`` (a callable giving (N,) km/h) is read only when
        the tower reads the ego's speed."""
        if self.tower_reads_speed:
            return self.tower().embed(frames, batch_size=batch_size, speed_kmh=speed())
        return self.tower().embed(frames, batch_size=batch_size)

    def embed(self, frames: np.ndarray, batch_size: int = 256, speed_kmh=None) -> np.ndarray:
        """BEV frames through the tower (counted in ``embedded_frames``); ``speed_kmh`` (one per
        frame) is passed to a tower that reads the ego's speed (required there)."""
        out = np.asarray(self._tower_embed(frames, lambda: speed_kmh, batch_size), np.float32)
        self.embedded_frames += len(frames)
        return out

    def rgb_tower(self, stacklevel: int = 4):
        """The tower when it embeds camera frames, else None (warned once: BEV-CLIP embeds BEVs
        only, and the reward then reads the BEV embedding)."""
        enc = self.tower()
        if can_embed_rgb(enc):
            return enc
        if not self.warned_views:
            warn_bev_only(enc, self.reward_name, stacklevel=stacklevel)
            self.warned_views = True
        return None

    def embed_rgb(self, frames: np.ndarray) -> np.ndarray:
        """Forward camera frames through the tower (``rgb_tower()`` first: BEV-CLIP cannot)."""
        out = np.asarray(self.tower().embed_rgb(frames), np.float32)
        self.embedded_frames += len(frames)
        return out

    # ------------------------------------------------------------------ DriveSAC: replay buffer
    def label_pending(self, buf, step: int) -> int:
        """Score the buffer's pending transitions (one batch, time order) once what they need is
        there: embeddings (from the service's worker: only the prefix that is back), camera
        embeddings, then ``prepare``'s columns (a reward with models in a worker: only what is
        answered). Returns how many were labelled."""
        if not isinstance(buf, RelabelReplayBuffer):
            return 0
        pending = buf.time_order(buf.slots(PENDING))
        if len(pending) and self.embeds_in_service() and self.needs_embedding:
            pending = self._service_exchange(buf, pending, step)
        if len(pending):
            self.embed_missing(buf, pending)
            self.embed_views(buf, pending)
            cols, k = self.prepare(pending, buf.fact_batch(pending),
                                   lambda i: buf.observation(int(pending[i]), next=True), step,
                                   self._poll_timeout)
            pending = pending[:k]
            for name, v in cols.items():
                buf.set_column(name, pending, v[:k])
            if len(pending):
                self.terms = buf.label(self.reward_fn, pending)
                buf.take_views(pending)
        return len(pending)

    def relabel(self, buf) -> None:
        """Re-score every stored transition with the current reward (frames already embedded are
        not embedded again)."""
        if isinstance(buf, RelabelReplayBuffer):
            self.embed_missing(buf, buf.slots())
            self.terms = buf.relabel(self.reward_fn)

    def wait_for_labels(self, buf, n: int, label) -> int:
        """With the reward service: call ``label`` (blocking briefly on the service) until at
        least ``n`` transitions are labelled, up to ``reward_service.wait_s``. Returns the count."""
        t0 = time.monotonic()
        while len(buf.slots(LABELLED)) < n and buf.counts()["pending"]:
            if time.monotonic() - t0 > self.reward_service["wait_s"]:
                raise TimeoutError(f"the reward service labelled only {len(buf.slots(LABELLED))} of "
                                   f"{n} transitions in {self.reward_service['wait_s']} s; check its "
                                   f"stats ({self._service.stats() if self._service else 'not started'})")
            self._poll_timeout = 0.5  # block briefly on the service while waiting
            try:
                label()
            finally:
                self._poll_timeout = 0.0
        return len(buf.slots(LABELLED))

    def embed_missing(self, buf, slots: np.ndarray, batch_size: int = 256) -> int:
        """Embed the next-observation BEVs of ``slots`` that have no embedding yet, and the
        observation embeddings the reward reads (the same episode's previous next-embedding, else
        embedded); none when the reward needs no embeddings. Returns how many were embedded."""
        if not self.needs_embedding or not isinstance(buf, RelabelReplayBuffer):
            return 0
        if buf.embeddings is None:
            raise ValueError(f"reward {self.reward_name!r} needs image embeddings but this replay "
                             f"buffer has no embedding slot: build the model with this reward "
                             f"(or replay_buffer_kwargs=dict(embedding_dim=384))")
        all_slots = np.asarray(slots, np.int64)
        flat = buf.embeddings.reshape(-1, buf.embedding_dim)
        slots = all_slots[~np.any(flat[all_slots] != 0, axis=1)]
        n = len(slots)
        for a in range(0, len(slots), batch_size):
            s = slots[a:a + batch_size]
            buf.set_embeddings(s, self._tower_embed(bev_frames(buf, s, next=True),
                                                    lambda s=s: self._fact_speed(buf, s), batch_size))
        if buf.obs_embeddings is not None and len(all_slots):
            # v_t of each transition: the same episode's previous next-embedding, else embed obs
            oflat = buf.obs_embeddings.reshape(-1, buf.embedding_dim)
            todo = all_slots[~np.any(oflat[all_slots] != 0, axis=1)]
            prev = buf.predecessors(todo)
            has = prev >= 0
            has[has] = np.any(flat[prev[has]] != 0, axis=1)
            oflat[todo[has]] = flat[prev[has]]
            start = todo[~has]
            for a in range(0, len(start), batch_size):
                s = start[a:a + batch_size]
                frames = bev_frames(buf, s, next=False)
                buf.set_embeddings(s, self._tower_embed(frames, lambda s=s: self._obs_speed(buf, s),
                                                        batch_size), obs=True)
            n += len(start)
        self.embedded_frames += n
        return n

    def _fact_speed(self, buf, slots) -> np.ndarray:
        """The stored ``speed_kmh`` facts of buffer slots (the frames the steps led to)."""
        if "speed_kmh" not in buf.fact_keys:
            raise ValueError(f"the image tower reads the ego's speed, but the replay buffer does not "
                             f"store the 'speed_kmh' fact (fact_keys: {list(buf.fact_keys)}); keep "
                             f"it in fact_keys or use the image-only BEV-CLIP (vlm=none)")
        f = buf.facts.reshape(-1, len(buf.fact_keys))
        return f[np.asarray(slots, np.int64), buf.fact_keys.index("speed_kmh")].astype(np.float64)

    def _obs_speed(self, buf, slots) -> np.ndarray:
        """The measured speeds of buffer slots' observations (acted from), from their ``ego``."""
        if "ego" not in buf.vectors:
            raise ValueError("the image tower reads the ego's speed, but the observations have no "
                             "'ego' measurement vector to read it from")
        rows, envs = np.divmod(np.asarray(slots, np.int64), buf.n_envs)
        return self.obs_speed_kmh(buf._read_rows(rows, envs, {}, images=False)["ego"].numpy())

    def embed_views(self, buf, slots: np.ndarray, batch_size: int = 64) -> int:
        """Embed the kept forward camera frames of ``slots`` (``view_embeddings``) when the reward
        reads them and the encoder embeds RGB; returns how many were embedded."""
        if not (isinstance(buf, RelabelReplayBuffer) and buf.views and wants_view_embedding(self.reward_fn)):
            return 0
        slots = np.asarray([s for s in np.asarray(slots, np.int64).tolist() if s in buf.views], np.int64)
        if not len(slots):
            return 0
        if self.rgb_tower(stacklevel=5) is None:
            return 0
        buf.enable_view_embeddings()
        flat = buf.view_embeddings.reshape(-1, buf.embedding_dim)
        slots = slots[~np.any(flat[slots] != 0, axis=1)]
        for a in range(0, len(slots), batch_size):
            s = slots[a:a + batch_size]
            buf.set_embeddings(s, self.embed_rgb(np.stack([buf.views[int(x)] for x in s])), view=True)
        return len(slots)

    def embedding_sampler(self, buf):
        """The world model's sampler over the buffer: ``sampler(k)`` gives (v_t, a_t, v_t+1) for
        ``k`` random labelled transitions that have both embeddings (``obs_embedding``,
        ``action``, ``embedding``), or None when there are none."""
        def sample(batch_size: int) -> dict | None:
            if not isinstance(buf, RelabelReplayBuffer) or buf.obs_embeddings is None:
                return None
            ok = buf.slots(LABELLED)
            if not len(ok):
                return None
            d = buf.embedding_dim
            return sample_triples(buf.obs_embeddings.reshape(-1, d), buf.actions.reshape(-1, buf.action_dim),
                                  buf.embeddings.reshape(-1, d), batch_size, rows=ok)
        return sample

    def logs(self, buf) -> dict:
        """What the agent logs before a training round: ``reward/<term>``, the reward's stats,
        ``reward_service/<stat>`` and the buffer's stats."""
        out = {f"reward/{k}": v for k, v in self.terms.items()}
        out.update(self.stats())
        if self._service is not None:
            out.update({f"reward_service/{k}": v for k, v in self._service.stats().items()})
        if isinstance(buf, RelabelReplayBuffer):
            # the buffer's counts and size cost O(buffer) (a bincount of every label, the bytes of
            # every stored terminal frame): taken on the first call and every BUFFER_STATS_EVERY-th
            # after it, not on every training round (2-5 % of a study run's time)
            if self._logs_calls % BUFFER_STATS_EVERY == 0:  # the first call reads them too
                self._buffer_stats = buf.stats()
            self._logs_calls += 1
            out.update(self._buffer_stats)
        return out

    # ------------------------------------------------------------------ reward service
    def embeds_in_service(self) -> bool:
        """Whether BEV embeddings go to the reward service's worker: it hosts BEV-CLIP, so other
        encoders embed inline (the reward's own models may still run in a worker of theirs)."""
        return (self.reward_service is not None and not self.service_dead and not self.custom_encoder
                and not self.custom_bev_clip)

    def service(self):
        """The reward service (a separate process embedding BEV frames in micro-batches; started
        on first use when ``reward_service`` is set). docs/reward_service.md."""
        if self._service is None:
            from ..reward_service import RewardService, bev_clip_embedder

            c = self.reward_service
            self._service = RewardService(
                bev_clip_embedder(self.observation_space["bev"].shape, threads=c["threads"],
                                  dtype="float16"),
                max_batch=c["max_batch"], max_wait_ms=c["max_wait_ms"], max_pending=c["max_pending"],
                name="drivemind-embeddings")
        return self._service

    def _service_exchange(self, buf, pending: np.ndarray, step: int) -> np.ndarray:
        """Collect returned embeddings, submit the missing ones (without blocking: back-pressure
        leaves the rest for the next round), and return the longest time-ordered prefix of
        ``pending`` whose embeddings are all there (the rest stays pending: never sampled).
        Request ids: 2 * slot for the next observation, 2 * slot + 1 for the observation (episode
        starts, for ``obs_embedding``)."""
        svc = self.service()
        d = buf.embedding_dim
        flat = buf.embeddings.reshape(-1, d)
        oflat = buf.obs_embeddings.reshape(-1, d) if buf.obs_embeddings is not None else None
        horizon = buf.buffer_size * buf.n_envs  # a result older than this belongs to an overwritten slot
        from ..reward_service import RewardServiceDead, RewardWorkerError
        try:
            ids, emb = svc.poll(self._poll_timeout)
        except RewardWorkerError as err:  # that batch only: resubmit its frames next round
            for i in np.asarray(err.ids).tolist():
                self._in_service.pop(int(i), None)
            self.service_errors += 1
            if self.service_errors == 1:
                warnings.warn(f"the reward service failed a batch ({err}); its frames are sent again "
                              f"(counted in service_errors)", UserWarning, stacklevel=4)
            ids, emb = np.zeros(0, np.int64), []
        except RewardServiceDead as err:  # no worker: embed inline from now on
            warnings.warn(f"the reward service's worker died ({err}); embedding inline from now on",
                          UserWarning, stacklevel=4)
            self._service.close()
            self._service = None
            self._in_service.clear()
            self.service_dead = True
            return pending
        for i, e in zip(ids.tolist(), emb):
            stamp = self._in_service.pop(i, None)
            if stamp is None or step - stamp >= horizon:
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
                    frames[nxt] = bev_frames(buf, slots[nxt], next=True)
                if (~nxt).any():
                    frames[~nxt] = bev_frames(buf, slots[~nxt], next=False)
                n = svc.submit(want, frames, block=False)
                for i in want[:n].tolist():
                    self._in_service[i] = step
        ok = have & (ohave if oflat is not None else True)
        k = len(ok) if ok.all() else int(np.argmin(ok))
        return pending[:k]

    # ------------------------------------------------------------------ DrivePPO: rollouts
    def start_rollout(self, n_steps: int, n_envs: int, last_obs) -> None:
        """Before a rollout: per-step storage for what the reward reads besides the env's facts
        (``rollout_embeddings``, ``rollout_obs_embeddings``: ``(n_steps, n_envs, D)`` float32 where
        the reward reads them; ``rollout_columns``: column -> ``(n_steps, n_envs)``), and the
        embedding of the observations the first actions are taken in (obs embeddings only): the
        last rollout's final next embeddings when ``last_obs`` is the observation they belong to,
        else (first rollout, envs reset by ``learn``) embedded."""
        reward_fn = self.reward_fn
        self.rollout_columns = {k: np.zeros((n_steps, n_envs), dt)
                                for k, dt in (getattr(reward_fn, "columns", None) or {}).items()}
        self.rollout_embeddings = self.rollout_obs_embeddings = self.rollout_view_embeddings = None
        if not needs_embedding(reward_fn):
            return
        dim = int(self.tower().dim)
        self.rollout_embeddings = np.zeros((n_steps, n_envs, dim), np.float32)
        if needs_obs_embedding(reward_fn):
            self.rollout_obs_embeddings = np.zeros((n_steps, n_envs, dim), np.float32)
            if self._carry is None or self._carry[0] is not last_obs:
                self._carry = (last_obs, self._embed_obs(last_obs))

    def rollout_step(self, t: int, batch: dict, new_obs, infos: list[dict], dones, step: int) -> None:
        """After VecEnv step ``t``: its embeddings (next observations, observations acted from,
        camera frames) into the rollout storage and into ``batch`` (the step's facts, ``action``,
        ``done``, ``env``, ``slot``) with the reward's columns, then the reward's ``prepare`` on it
        (the step's transitions in time order: DriveMind's novelty detector and prompt generator;
        ``frame(i)`` = env ``i``'s next observation), whose columns are stored."""
        if self.rollout_embeddings is not None:
            emb, obs_emb = self.embed_step(new_obs, infos, dones)
            self.rollout_embeddings[t] = emb
            batch["embedding"] = self.rollout_embeddings[t]
            if obs_emb is not None:
                self.rollout_obs_embeddings[t] = obs_emb
                batch["obs_embedding"] = self.rollout_obs_embeddings[t]
            if wants_view_embedding(self.reward_fn):
                self._embed_step_views(t, infos)
            if self.rollout_view_embeddings is not None:
                batch["view_embedding"] = self.rollout_view_embeddings[t]
        for k, col in self.rollout_columns.items():
            batch[k] = col[t]
        cols, _ = self.prepare(batch["slot"], batch, lambda i: next_frame(new_obs, infos, dones, i), step,
                               timeout=None)  # on-policy: every value is needed now
        for k, v in cols.items():
            self.rollout_columns[k][t] = v

    def embed_step(self, new_obs, infos: list[dict], dones) -> tuple[np.ndarray, np.ndarray | None]:
        """One VecEnv step's embeddings in one tower call: the next observations (terminal ones
        at episode ends), and with obs embeddings the reset observations of the envs that ended
        an episode. Returns ``(embedding, obs_embedding)``, ``(n_envs, D)`` each (``obs_embedding``:
        of the observations the step's actions were taken in; None when the reward does not read
        it)."""
        n_envs = len(dones)
        current = self._carry[1] if needs_obs_embedding(self.reward_fn) else None
        frames = [next_frame(new_obs, infos, dones, i)["bev"] for i in range(n_envs)]
        starts = np.flatnonzero(dones) if current is not None else np.zeros(0, np.int64)
        frames += [new_obs["bev"][i] for i in starts]
        speed = None
        if self.tower_reads_speed:  # the step's facts; the reset observations' own measurement
            speed = np.concatenate([[float(inf["speed_kmh"]) for inf in infos],
                                    self.obs_speed_kmh(np.asarray(new_obs["ego"])[starts])])
        e = self.embed(np.stack(frames), speed_kmh=speed)
        if current is None:
            return e[:n_envs], None
        nxt = e[:n_envs].copy()
        nxt[starts] = e[n_envs:]
        self._carry = (new_obs, nxt)
        return e[:n_envs], current

    def _embed_obs(self, obs) -> np.ndarray:
        """A VecEnv observation's BEVs through the tower (a speed tower reads its ``ego`` speed)."""
        speed = self.obs_speed_kmh(np.asarray(obs["ego"])) if self.tower_reads_speed else None
        return self.embed(np.asarray(obs["bev"]), speed_kmh=speed)

    def _embed_step_views(self, t: int, infos: list[dict]) -> None:
        """Step ``t``'s forward camera frames into ``rollout_view_embeddings[t]`` (rows of zeros
        for envs without one), when the encoder embeds RGB."""
        have = [i for i, inf in enumerate(infos) if inf.get(VIEW_KEY) is not None]
        if not have or self.rgb_tower(stacklevel=6) is None:
            return
        if self.rollout_view_embeddings is None:
            self.rollout_view_embeddings = np.zeros_like(self.rollout_embeddings)
        self.rollout_view_embeddings[t, have] = self.embed_rgb(
            np.stack([np.asarray(infos[i][VIEW_KEY]) for i in have]))


__all__ = ["Labeller", "bev_frames", "delegate", "loaded_fields", "next_frame", "saving", "service_config"]
