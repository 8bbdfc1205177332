"""Semantic rewards, first piece: DriveMind's static anchor (Eq. 1) over stored image embeddings.

    r_static = (alpha cos(v, u_I) - beta cos(v, u_P) + 1) / 2        (normalise=True)

``v`` is the stored 384-d embedding of a transition's BEV (batch key ``embedding``), ``u_I`` /
``u_P`` the MiniLM embeddings of the ideal / present prompts. **Encoders:** the paper uses
OpenCLIP ViT-bigG-14 on camera images; here ``v`` comes from our compact BEV-CLIP
(:class:`drivemind.vlm.BevClip`, aligned to frozen all-MiniLM-L6-v2) and the prompts from that same
MiniLM (:class:`drivemind.vlm.MiniLMTextEncoder`), so the cosines live in MiniLM's sentence space.

Normalisation maps [-1, 1] to [0, 1] by (x + 1) / 2; that range is exact for alpha + beta = 1
(the defaults 1/2, 1/2). The two terms are ``ideal = (alpha cos_I + 1/2) / 2`` and
``present = (-beta cos_P + 1/2) / 2`` (each in [0, 1/2] by default); they sum to the value. With
``normalise=False`` they are ``alpha cos_I`` and ``-beta cos_P``.

An all-zero embedding (a frame never embedded) has no direction: its cosines are NaN, so the
replay buffer marks such a transition invalid instead of inventing a reward.
"""

from __future__ import annotations

import numpy as np

from .base import Composite, Reward
from .kinematic import HVFR, Task

_TEXT_ENCODER = None


def shared_text_encoder():
    """One lazily created :class:`MiniLMTextEncoder` for every semantic reward (it caches prompts)."""
    global _TEXT_ENCODER
    if _TEXT_ENCODER is None:
        from ..vlm.text import MiniLMTextEncoder
        _TEXT_ENCODER = MiniLMTextEncoder()
    return _TEXT_ENCODER


def _cosine(v: np.ndarray, u: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, v @ u / np.where(norm > 0, norm, 1.0) / np.linalg.norm(u), np.nan)


class AICRStatic(Reward):
    """DriveMind's static AICR anchor on BEV-CLIP image embeddings (module docstring).

    ``text_encoder``: any object with ``encode(list[str]) -> (N, D)`` (default: the shared frozen
    MiniLM, created on first use). Prompt vectors are computed once per prompt pair; changing
    ``present`` / ``ideal`` (attributes or ``set_prompts``) only re-encodes the text."""

    name = "aicr_static"
    needs = ("embedding",)

    def __init__(self, present: str = "the car is about to crash", ideal: str = "no collisions occur",
                 alpha: float = 0.5, beta: float = 0.5, normalise: bool = True, text_encoder=None):
        for k, w in (("alpha", alpha), ("beta", beta)):
            if not np.isfinite(w):
                raise ValueError(f"{k} must be finite, got {w}")
        for k, p in (("present", present), ("ideal", ideal)):
            if not isinstance(p, str) or not p.strip():
                raise ValueError(f"the {k} prompt must be a non-empty string, got {p!r}")
        self.present, self.ideal = present, ideal
        self.alpha, self.beta, self.normalise = float(alpha), float(beta), bool(normalise)
        self.text_encoder = text_encoder
        self._prompt_cache: tuple[tuple[str, str], np.ndarray, np.ndarray] | None = None

    def bind_encoder(self, encoder) -> None:
        """Embed the prompts with ``encoder``'s text tower (the image encoder's own space)."""
        self.text_encoder = encoder
        self._prompt_cache = None

    def set_prompts(self, present: str | None = None, ideal: str | None = None) -> None:
        if present is not None:
            self.present = present
        if ideal is not None:
            self.ideal = ideal

    def prompt_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(u_I, u_P) as float64 vectors, encoded once per prompt pair."""
        key = (self.ideal, self.present)
        if self._prompt_cache is None or self._prompt_cache[0] != key:
            enc = self.text_encoder if self.text_encoder is not None else shared_text_encoder()
            u = np.asarray(enc.encode([self.ideal, self.present]), np.float64)
            self._prompt_cache = (key, u[0], u[1])
        return self._prompt_cache[1], self._prompt_cache[2]

    def terms(self, batch):
        v = np.asarray(batch["embedding"], np.float64)
        if v.ndim != 2:
            raise ValueError(f"'embedding' must be (N, D), got shape {v.shape}")
        u_i, u_p = self.prompt_vectors()
        if v.shape[1] != len(u_i):
            raise ValueError(f"image embeddings are {v.shape[1]}-d but the prompt embeddings are "
                             f"{len(u_i)}-d: the image and text encoders must share one space")
        ideal = self.alpha * _cosine(v, u_i)
        present = -self.beta * _cosine(v, u_p)
        if self.normalise:
            ideal, present = (ideal + 0.5) / 2, (present + 0.5) / 2
        return {"ideal": ideal, "present": present}

    def __getstate__(self):  # the shared encoder is not pickled; it is re-created on use
        state = dict(self.__dict__)
        if state.get("text_encoder") is _TEXT_ENCODER:
            state["text_encoder"] = None
        return state


def drivemind_static(rho1: float = 1.0, rho2: float = 1.0, present: str = "the car is about to crash",
                     ideal: str = "no collisions occur", alpha: float = 0.5, beta: float = 0.5,
                     normalise: bool = False) -> Composite:
    """DriveMind without novelty-triggered prompts and PCFM: task + rho1 HVFR + rho2 AICRStatic.
    The AICR term is raw (``normalise=False``) as in DriveMind's Eq. 3: mapped to [0, 1] it is a
    near-constant per-step bonus for staying alive (see :mod:`drivemind.rewards.drivemind`)."""
    aicr = AICRStatic(present=present, ideal=ideal, alpha=alpha, beta=beta, normalise=normalise)
    return Composite({"task": (1.0, Task()), "hvfr": (float(rho1), HVFR()),
                      "aicr": (float(rho2), aicr)}, name="drivemind_static")
