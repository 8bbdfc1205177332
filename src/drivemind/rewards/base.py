"""The reward interface: a reward is a batch function over stored per-step facts.

    r = make_reward("chen")
    values = r(batch)                 # batch: {fact name: (N,) array}, as the env's info gives
    terms = r.explain(batch)          # {term name: (N,) weighted contribution}; they sum to values

Facts are the env's ``FACT_KEYS`` (``drivemind.envs``). Rewards never touch the simulator, so a
replay buffer can re-score stored transitions whenever weights change.

Besides the facts, the replay buffer's batches carry (when a reward ``needs`` them):

- ``action`` (N, 2): the action taken; ``done`` (N,): the episode ended at this transition;
  ``env`` (N,): the env column; ``slot`` (N,): the transition's buffer slot.
- ``embedding`` (N, D): the contrastive image embedding of the frame the facts describe (the
  observation the action led to); ``obs_embedding`` (N, D): that of the observation the action
  was taken in (for world models); ``view_embedding`` (N, D): that of the forward camera frame
  taken with the same step, where the backend has a camera and the encoder embeds RGB (rows of
  zeros elsewhere; a reward lists it in ``optional``: the agent provides it when it can).
- any per-transition ``columns`` a reward declares (e.g. DriveMind's ``prompt_id``), filled by its
  ``prepare`` hook.

Hooks for rewards with online state (all optional; the defaults do nothing):

- ``columns``: ``{name: numpy dtype}`` stored per transition by the replay buffer.
- ``prepare(ctx)``: called once per labelling round, before scoring, with the pending transitions
  in time order (:class:`LabelContext`); returns ``{column: (N,) values}`` to store. A reward whose
  columns come back asynchronously (models in the reward service) sets ``ctx.ready`` to the number
  of leading transitions whose values are there; the agent labels only those and passes the rest
  again next round (they stay pending, never sampled).
- ``use_service(config)`` / ``close()``: the agent's ``algo.reward_service`` settings (the reward
  may run its models in a worker process of its own) and the end of the run.
- ``learn(sampler)``: called once per training round (e.g. a world model's update); returns
  ``{log key: value}``.
- ``bind_encoder(encoder)``: the contrastive encoder whose image embeddings are stored; semantic
  rewards take their text embeddings from the same encoder (one embedding space).
- ``state_dict()`` / ``load_state_dict(d)``: state saved with the agent's checkpoint and restored
  on resume (prompt caches, novelty buffers, world-model weights).
- ``stats()``: ``{log key: value}`` for the logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class LabelContext:
    """What ``Reward.prepare`` sees: the transitions about to be labelled, in time order.

    ``batch`` is their reward batch (facts, embeddings, actions...); ``frame(i)`` returns the
    i-th one's next observation (dict of numpy arrays, e.g. ``["bev"]``) for models that read
    pixels (with ``"rgb"``, the forward camera frame, where the backend has one); ``step`` is the
    agent's env-step count. ``timeout``: how long the reward may block waiting for asynchronous
    results (seconds; ``None``: until all are there, as an on-policy agent needs); ``ready``: set
    by the reward to the number of leading transitions it has values for (``None``: all)."""

    slots: np.ndarray
    batch: dict
    frame: object = None  # callable(i) -> dict[str, np.ndarray]
    step: int = 0
    timeout: float | None = 0.0
    ready: int | None = None

    def limit(self, k: int) -> None:
        """Only the first ``k`` transitions are ready (several parts: the smallest count wins)."""
        self.ready = int(k) if self.ready is None else min(self.ready, int(k))


class Reward:
    """Base class: subclasses set ``name`` and ``needs`` and implement ``terms``."""

    name = "reward"
    needs: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()  # batch keys read when present (e.g. ``view_embedding``)
    columns: dict = {}

    def prepare(self, ctx: LabelContext) -> dict[str, np.ndarray]:
        return {}

    def learn(self, sampler) -> dict[str, float]:
        return {}

    def bind_encoder(self, encoder) -> None:
        pass

    def use_service(self, config: dict | None) -> None:
        pass

    def close(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {}

    def parts_iter(self):
        """This reward and every reward inside it (composites recurse)."""
        yield self

    def terms(self, batch: dict) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def explain(self, batch: dict) -> dict[str, np.ndarray]:
        missing = [k for k in self.needs if k not in batch]
        if missing:
            raise KeyError(f"reward {self.name!r} needs fact(s) {missing}; the batch has "
                           f"{sorted(batch)}")
        n = len(np.asarray(batch[self.needs[0]])) if self.needs else None
        out = {}
        keys = (*self.needs, *(k for k in self.optional if k in batch and k not in self.needs))
        for k, v in self.terms({k: np.asarray(batch[k], np.float64) for k in keys}).items():
            v = np.asarray(v, np.float64)
            out[k] = np.broadcast_to(v, (n,)).copy() if n is not None and v.ndim == 0 else v
        return out

    def __call__(self, batch: dict) -> np.ndarray:
        parts = self.explain(batch)
        return np.sum(np.stack(list(parts.values())), axis=0)


@dataclass
class Composite(Reward):
    """Weighted sum of rewards; ``explain`` reports each weighted part as ``<part>.<term>``."""

    parts: dict[str, tuple[float, Reward]] = field(default_factory=dict)
    name: str = "composite"

    def __post_init__(self):
        for key, (w, r) in self.parts.items():
            if not np.isfinite(w):
                raise ValueError(f"weight of {key!r} must be finite, got {w}")
        self.needs = tuple(dict.fromkeys(k for _, r in self.parts.values() for k in r.needs))
        self.optional = tuple(dict.fromkeys(k for _, r in self.parts.values()
                                            for k in getattr(r, "optional", ())))
        self.columns = {k: v for _, r in self.parts.values() for k, v in r.columns.items()}

    def parts_iter(self):
        yield self
        for _, r in self.parts.values():
            yield from r.parts_iter()

    def prepare(self, ctx):  # parts weighted 0 (ablated) are skipped
        out = {}
        for w, r in self.parts.values():
            if w != 0.0:
                out.update(r.prepare(ctx))
        return out

    def learn(self, sampler):
        out = {}
        for w, r in self.parts.values():
            if w != 0.0:
                out.update(r.learn(sampler))
        return out

    def bind_encoder(self, encoder):
        for _, r in self.parts.values():
            r.bind_encoder(encoder)

    def use_service(self, config):
        for w, r in self.parts.values():
            if w != 0.0:
                r.use_service(config)

    def close(self):
        for _, r in self.parts.values():
            r.close()

    def state_dict(self):
        return {key: sd for key, (_, r) in self.parts.items() if (sd := r.state_dict())}

    def load_state_dict(self, state):
        for key, sd in (state or {}).items():
            if key in self.parts:
                self.parts[key][1].load_state_dict(sd)

    def stats(self):
        out = {}
        for _, r in self.parts.values():
            out.update(r.stats())
        return out

    def terms(self, batch):
        out = {}
        for key, (w, r) in self.parts.items():
            if w == 0.0:
                continue
            for t, v in r.explain(batch).items():
                out[f"{key}.{t}"] = w * v
        return out
