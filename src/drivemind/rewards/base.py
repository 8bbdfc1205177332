"""The reward interface: a reward is a batch function over stored per-step facts.

    r = make_reward("chen")
    values = r(batch)                 # batch: {fact name: (N,) array}, as the env's info gives
    terms = r.explain(batch)          # {term name: (N,) weighted contribution}; they sum to values

Facts are the env's ``FACT_KEYS`` (``drivemind.envs``). Rewards never touch the simulator, so a
replay buffer can re-score stored transitions whenever weights change. Semantic rewards (image
embeddings) arrive with the reward package issue under the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class Reward:
    """Base class: subclasses set ``name`` and ``needs`` and implement ``terms``."""

    name = "reward"
    needs: tuple[str, ...] = ()

    def terms(self, batch: dict) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def explain(self, batch: dict) -> dict[str, np.ndarray]:
        missing = [k for k in self.needs if k not in batch]
        if missing:
            raise KeyError(f"reward {self.name!r} needs fact(s) {missing}; the batch has "
                           f"{sorted(batch)}")
        n = len(np.asarray(batch[self.needs[0]])) if self.needs else None
        out = {}
        for k, v in self.terms({k: np.asarray(batch[k], np.float64) for k in self.needs}).items():
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

    def terms(self, batch):
        out = {}
        for key, (w, r) in self.parts.items():
            if w == 0.0:
                continue
            for t, v in r.explain(batch).items():
                out[f"{key}.{t}"] = w * v
        return out
