"""DriveMind's novelty detector (Eq. 2 / A16): when does the scene call for new prompts?

    Delta_t = min over v' in B of ||v_t - v'||_2        B: FIFO of the K most recent embeddings
    trigger  when Delta_t > delta

``delta`` is a high quantile (``quantile``, default 0.99) of the Delta values seen during a
warm-up of ``warmup`` embeddings (no triggers during warm-up), unless a fixed ``threshold`` is
given. Every embedding enters the FIFO after it is scored ("the K most recent embeddings"). The
paper reports about one trigger per 100 steps, which a 0.99 quantile targets. ``cooldown`` (steps)
optionally spaces triggers out (0 = off, the paper's behaviour).

All state is fixed-size (the FIFO, the warm-up sample) and is saved with the agent
(``state_dict``) so a resumed run keeps its threshold.
"""

from __future__ import annotations

import numpy as np


class NoveltyDetector:
    def __init__(self, capacity: int = 256, warmup: int = 1000, quantile: float = 0.99,
                 threshold: float | None = None, cooldown: int = 0):
        if capacity < 1:
            raise ValueError(f"novelty capacity must be >= 1, got {capacity}")
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"novelty quantile must be in (0, 1), got {quantile}")
        if warmup < 1 and threshold is None:
            raise ValueError("novelty warmup must be >= 1 when no fixed threshold is given")
        self.capacity, self.warmup, self.quantile = int(capacity), int(warmup), float(quantile)
        self.cooldown = int(cooldown)
        self.threshold = None if threshold is None else float(threshold)
        self._fixed = threshold is not None
        self._fifo: np.ndarray | None = None
        self._n = 0  # embeddings pushed
        self._warm: list[float] = []
        self.steps = 0
        self.triggers = 0
        self.skipped_nonfinite = 0
        self._since = 1 << 30
        self.last_delta = float("nan")

    @property
    def warming_up(self) -> bool:
        return self.threshold is None

    def score(self, v: np.ndarray) -> float:
        """Delta for one embedding against the FIFO (inf when it is empty)."""
        if self._fifo is None or self._n == 0:
            return float("inf")
        k = min(self._n, self.capacity)
        d = self._fifo[:k] - v
        return float(np.sqrt(np.min(np.einsum("ij,ij->i", d, d))))

    def push(self, v: np.ndarray) -> None:
        if self._fifo is None:
            self._fifo = np.zeros((self.capacity, len(v)), np.float32)
        self._fifo[self._n % self.capacity] = v
        self._n += 1

    def step(self, v: np.ndarray) -> tuple[float, bool]:
        """Score ``v``, decide, then push it. Returns (Delta, triggered). A non-finite or all-zero
        embedding (never embedded) is skipped and counted, never triggers."""
        v = np.asarray(v, np.float32).ravel()
        if not np.all(np.isfinite(v)) or not np.any(v):
            self.skipped_nonfinite += 1
            return float("nan"), False
        delta = self.score(v)
        self.steps += 1
        self._since += 1
        triggered = False
        if self.threshold is None:
            if np.isfinite(delta):
                self._warm.append(delta)
            if self.steps >= self.warmup and self._warm:
                self.threshold = float(np.quantile(self._warm, self.quantile))
                self._warm = []
        elif delta > self.threshold and self._since > self.cooldown:
            triggered = True
            self.triggers += 1
            self._since = 0
        self.push(v)
        self.last_delta = delta
        return delta, triggered

    def stats(self) -> dict[str, float]:
        return {"novelty/threshold": float("nan") if self.threshold is None else self.threshold,
                "novelty/triggers": self.triggers,
                "novelty/trigger_rate": self.triggers / max(self.steps, 1),
                "novelty/last_delta": self.last_delta}

    def state_dict(self) -> dict:
        return {"fifo": None if self._fifo is None else self._fifo.copy(), "n": self._n,
                "warm": list(self._warm), "threshold": self.threshold, "steps": self.steps,
                "triggers": self.triggers, "since": self._since,
                "skipped_nonfinite": self.skipped_nonfinite}

    def load_state_dict(self, s: dict) -> None:
        self._fifo = None if s.get("fifo") is None else np.asarray(s["fifo"], np.float32).copy()
        if self._fifo is not None and len(self._fifo) != self.capacity:  # capacity changed: keep newest
            old, n = self._fifo, int(s["n"])
            order = [(n - 1 - i) % len(old) for i in range(min(n, len(old), self.capacity))][::-1]
            self._fifo = np.zeros((self.capacity, old.shape[1]), np.float32)
            self._fifo[:len(order)] = old[order]
            s = {**s, "n": len(order)}
        self._n = int(s["n"])
        self._warm = list(s.get("warm", []))
        if not self._fixed:
            self.threshold = s.get("threshold")
        self.steps, self.triggers = int(s.get("steps", 0)), int(s.get("triggers", 0))
        self._since = int(s.get("since", 1 << 30))
        self.skipped_nonfinite = int(s.get("skipped_nonfinite", 0))
