"""Contrastive (CLIP-style) rewards over stored image embeddings: VLM-RL and the VLM baselines it
compares against.

Every reward here scores the stored contrastive embedding ``v`` of a transition's BEV (batch key
``embedding``, the frame the step's facts describe) against text prompts embedded once by a text
encoder (``encode(list[str]) -> (N, D)``; by default the shared frozen MiniLM, the text tower our
BEV-CLIP is aligned to; ``bind_encoder(enc)`` swaps in another encoder's text tower, e.g.
OpenCLIP's). Cosines use unit-normalised rows; an all-zero embedding (a frame never embedded)
scores NaN, so the replay buffer marks the transition invalid instead of inventing a reward.

=============  =========================================================================  ==========
name           reward                                                                     source
=============  =========================================================================  ==========
``vlm_rl``     task + rho R_synth; R_synth = r_speed f_center f_angle f_stability with     VLM-RL
               v_target = r' v_max, r' = (clip(CLG, th_min, th_max) - th_min) / (th_max -  Eqs. 7,
               th_min), CLG = alpha cos(v, u_pos) - beta cos(v, u_neg)                     10-12
``vlm_sr``     high if P(goal | v) > threshold else low; P = softmax over the goal and     Baumli
               contrast prompts of tau cos (no contrast prompts: cos(v, u_goal) itself)    et al.
``roboclip``   at an episode's last transition: scale cos(mean of the episode's frame      Sontakke
               embeddings, u_task); 0 elsewhere (``dense=True``: scale cos(v, u_task)      et al.
               every step, VLM-RL's adaptation)
``vlm_rm``     1 - |P (x - t)|^2 / 2, x = v/|v|, t = u_target, P = a d d^T/|d|^2 +         Rocamonde
               (1 - a) I, d = u_target - u_baseline                                        et al.
``lord``       1 - cos(v, u_neg)                                                           Ye et al.
``lord_speed`` lord + k (1 - |v - v_target| / v_target)                                     VLM-RL's
                                                                                           code
=============  =========================================================================  ==========

Default prompts are VLM-RL's (paper and released code); its window (-0.03, 0.0) belongs to
OpenCLIP ViT-bigG-14, so our defaults are calibrated for the shipped BEV-CLIP by
``scripts/calibrate_reward.py reward=vlm_rl`` (docs/rewards.md).
"""

from __future__ import annotations

import math

import numpy as np

from .base import Composite, LabelContext, Reward
from .kinematic import Task
from .windows import CLG_WINDOWS
from . import semantic as _semantic
from .semantic import shared_text_encoder

# VLM-RL's contrasting language goal (paper Sec. 4.3.2 and its code's config)
VLMRL_POSITIVE = "The road is clear with no car accidents"
VLMRL_NEGATIVE = "Two cars have collided with each other on the road"
# VLM-RL's code's prompts for its VLM-SR / RoboCLIP / VLM-RM baselines
SAFE_DRIVING = "A car is driving safely"
A_CAR = "A car"
# The CLG window of the shipped BEV-CLIP (scripts/calibrate_reward.py reward=vlm_rl; docs/rewards.md).
# VLM-RL's own window for ViT-bigG-14 is (-0.03, 0.0).
BEVCLIP_WINDOW = CLG_WINDOWS["vlm_rl"]["bev_clip_cpu.pt"]  # the default tower's: (-0.0779, 0.2492)
PAPER_WINDOW = (-0.03, 0.0)


def _finite(**kw):
    for k, v in kw.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise ValueError(f"{k} must be a finite number, got {v!r}")


def _prompt(kind: str, p) -> str:
    if not isinstance(p, str) or not p.strip():
        raise ValueError(f"the {kind} prompt must be a non-empty string, got {p!r}")
    return p


def unit_rows(v) -> np.ndarray:
    """(N, D) float64 rows scaled to unit length; all-zero rows (never embedded) become NaN."""
    v = np.asarray(v, np.float64)
    if v.ndim != 2:
        raise ValueError(f"'embedding' must be (N, D), got shape {v.shape}")
    norm = np.linalg.norm(v, axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, v / np.where(norm > 0, norm, 1.0), np.nan)


class ContrastiveReward(Reward):
    """Base of the rewards here: text prompts embedded once per prompt list (cached), cosines of
    stored image embeddings against them. Subclasses list their prompts in ``prompt_texts``."""

    needs = ("embedding",)

    def __init__(self, text_encoder=None):
        self.text_encoder = text_encoder
        self._prompt_cache: tuple[tuple[str, ...], np.ndarray] | None = None

    def prompt_texts(self) -> tuple[str, ...]:
        raise NotImplementedError

    def bind_encoder(self, encoder) -> None:
        """Use ``encoder``'s text tower (``encode(list[str])``) for the prompts from now on."""
        self.text_encoder = encoder
        self._prompt_cache = None

    def encoder(self):
        return self.text_encoder if self.text_encoder is not None else shared_text_encoder()

    def prompt_matrix(self) -> np.ndarray:
        """(K, D) unit prompt embeddings in ``prompt_texts()`` order, encoded once per prompt list."""
        key = tuple(self.prompt_texts())
        if self._prompt_cache is None or self._prompt_cache[0] != key:
            u = np.asarray(self.encoder().encode(list(key)), np.float64)
            if u.ndim != 2 or len(u) != len(key):
                raise ValueError(f"the text encoder returned shape {u.shape} for {len(key)} prompts")
            u = u / np.linalg.norm(u, axis=1, keepdims=True)
            self._prompt_cache = (key, u)
        return self._prompt_cache[1]

    def image_rows(self, batch) -> np.ndarray:
        """The batch's embeddings as unit rows (NaN for never-embedded frames), dimension-checked."""
        x = unit_rows(batch["embedding"])
        d = self.prompt_matrix().shape[1]
        if x.shape[1] != d:
            raise ValueError(f"image embeddings are {x.shape[1]}-d but the prompt embeddings are "
                             f"{d}-d: the image and text encoders must share one space")
        return x

    def cosines(self, batch) -> np.ndarray:
        """(N, K) cosine of each embedding with each prompt (NaN rows for never-embedded frames)."""
        return self.image_rows(batch) @ self.prompt_matrix().T

    def __getstate__(self):  # the shared encoder is not pickled; it is re-created on use
        state = dict(self.__dict__)
        if state.get("text_encoder") is not None and state["text_encoder"] is _semantic._TEXT_ENCODER:
            state["text_encoder"] = None
        return state


# ---------------------------------------------------------------------------------- VLM-RL
class CLG(ContrastiveReward):
    """VLM-RL's contrasting-language-goal reward (Eq. 7): alpha cos(v, u_pos) - beta cos(v, u_neg).
    Terms ``positive`` and ``negative`` sum to it."""

    name = "clg"

    def __init__(self, positive: str = VLMRL_POSITIVE, negative: str = VLMRL_NEGATIVE,
                 alpha: float = 0.5, beta: float = 0.5, text_encoder=None):
        super().__init__(text_encoder)
        _finite(alpha=alpha, beta=beta)
        self.positive, self.negative = _prompt("positive", positive), _prompt("negative", negative)
        self.alpha, self.beta = float(alpha), float(beta)

    def prompt_texts(self):
        return (self.positive, self.negative)

    def clg(self, batch) -> np.ndarray:
        """The raw CLG value per row (what ``scripts/calibrate_reward.py`` collects)."""
        c = self.cosines(batch)
        return self.alpha * c[:, 0] - self.beta * c[:, 1]

    def terms(self, batch):
        c = self.cosines(batch)
        return {"positive": self.alpha * c[:, 0], "negative": -self.beta * c[:, 1]}


class VLMRLSynth(CLG):
    """VLM-RL's hierarchical reward synthesis (Phase I + II, Eqs. 10-11), one term ``synth``:

        r'      = (clip(CLG, theta_min, theta_max) - theta_min) / (theta_max - theta_min)
        R_synth = r_speed f_center f_angle f_stability,  r_speed = 1 - |v - r' v_max| / v_max

    Every factor is clipped to [0, 1] (the paper bounds each in [0, 1]; its code leaves r_speed
    unclipped above 2 v_max). f_center = 1 - |lateral offset| / max_offset, f_angle = 1 - |heading
    error| / max_angle, f_stability = 1 - lateral oscillation / max_oscillation; the defaults are
    VLM-RL's code (3 m, 90 degrees, 0.4 m, v_max 25 km/h)."""

    name = "vlm_rl_synth"
    needs = ("embedding", "speed_kmh", "lateral_offset", "heading_error", "lateral_oscillation")
    # the window when none is given: the one measured for the default tower (a run resolves its
    # own tower's from drivemind.rewards.windows before building the reward)
    default_window = BEVCLIP_WINDOW

    def __init__(self, positive: str = VLMRL_POSITIVE, negative: str = VLMRL_NEGATIVE,
                 alpha: float = 0.5, beta: float = 0.5, theta_min: float | None = None,
                 theta_max: float | None = None, v_max_kmh: float = 25.0,
                 max_offset: float = 3.0, max_angle: float = math.pi / 2,
                 max_oscillation: float = 0.4, text_encoder=None):
        super().__init__(positive, negative, alpha, beta, text_encoder)
        if theta_min is None and theta_max is None:  # the default tower's (bev_clip_cpu.pt) window
            theta_min, theta_max = self.default_window
        _finite(theta_min=theta_min, theta_max=theta_max, v_max_kmh=v_max_kmh, max_offset=max_offset,
                max_angle=max_angle, max_oscillation=max_oscillation)
        if not theta_min < theta_max:
            raise ValueError(f"need theta_min < theta_max, got ({theta_min}, {theta_max}); "
                             f"scripts/calibrate_reward.py reward=vlm_rl computes a window")
        for k, v in (("v_max_kmh", v_max_kmh), ("max_offset", max_offset), ("max_angle", max_angle),
                     ("max_oscillation", max_oscillation)):
            if v <= 0:
                raise ValueError(f"{k} must be > 0, got {v}")
        self.theta_min, self.theta_max = float(theta_min), float(theta_max)
        self.v_max_kmh, self.max_offset = float(v_max_kmh), float(max_offset)
        self.max_angle, self.max_oscillation = float(max_angle), float(max_oscillation)

    def semantic(self, batch) -> np.ndarray:
        """Phase I: r' in [0, 1] (NaN for never-embedded frames)."""
        c = self.clg(batch)
        return (np.clip(c, self.theta_min, self.theta_max) - self.theta_min) / (self.theta_max - self.theta_min)

    def factors(self, batch) -> dict[str, np.ndarray]:
        target = self.semantic(batch) * self.v_max_kmh
        return {
            "speed": np.clip(1.0 - np.abs(batch["speed_kmh"] - target) / self.v_max_kmh, 0.0, 1.0),
            "center": np.clip(1.0 - np.abs(batch["lateral_offset"]) / self.max_offset, 0.0, 1.0),
            "angle": np.clip(1.0 - np.abs(batch["heading_error"]) / self.max_angle, 0.0, 1.0),
            "stability": np.clip(1.0 - batch["lateral_oscillation"] / self.max_oscillation, 0.0, 1.0),
        }

    def terms(self, batch):
        f = self.factors(batch)
        return {"synth": f["speed"] * f["center"] * f["angle"] * f["stability"]}

    # calibration (scripts/calibrate_reward.py)
    def calibration_values(self, batch) -> np.ndarray:
        return self.clg(batch)

    @staticmethod
    def calibrate(values: np.ndarray, low_quantile: float = 0.05, high_quantile: float = 0.5) -> dict:
        """The window (theta_min, theta_max) = those quantiles of a warm-up CLG distribution."""
        v = np.asarray(values, np.float64)
        v = v[np.isfinite(v)]
        if len(v) < 2:
            raise ValueError("calibration needs at least 2 finite CLG values")
        if not 0.0 <= low_quantile < high_quantile <= 1.0:
            raise ValueError(f"need 0 <= low_quantile < high_quantile <= 1, got "
                             f"{low_quantile}, {high_quantile}")
        lo, hi = (float(x) for x in np.quantile(v, [low_quantile, high_quantile]))
        if not lo < hi:
            raise ValueError(f"the warm-up CLG values are constant between those quantiles ({lo}); "
                             f"collect more varied frames")
        return {"theta_min": round(lo, 4), "theta_max": round(hi, 4)}


def vlm_rl(rho: float = 1.0, progress_weight: float = 1.0, failure_penalty: float = -10.0,
           positive: str = VLMRL_POSITIVE, negative: str = VLMRL_NEGATIVE, alpha: float = 0.5,
           beta: float = 0.5, theta_min: float | None = None, theta_max: float | None = None,
           v_max_kmh: float = 25.0, max_offset: float = 3.0, max_angle: float = math.pi / 2,
           max_oscillation: float = 0.4) -> Composite:
    """VLM-RL's final reward (Eq. 12): task + rho R_synth (parts ``task`` and ``synth``).
    ``theta_min`` / ``theta_max`` both None: the CLG window measured for the default tower.
    ``progress_weight=0`` leaves only the failure penalty from the task part, which is the
    released code's reward (synthesis reward, -10 on a terminal failure)."""
    _finite(rho=rho)
    synth = VLMRLSynth(positive, negative, alpha, beta, theta_min, theta_max, v_max_kmh, max_offset,
                       max_angle, max_oscillation)
    return Composite({"task": (1.0, Task(progress_weight, failure_penalty)),
                      "synth": (float(rho), synth)}, name="vlm_rl")


# ---------------------------------------------------------------------------------- baselines
class VLMSR(ContrastiveReward):
    """VLM-SR (Baumli et al.): a binary success reward. P(goal | v) is the softmax over the goal
    and the ``contrast`` prompts of ``tau`` x cosine; the reward is ``high`` when P > ``threshold``
    else ``low``. With no contrast prompts the raw cosine to the goal is thresholded instead (VLM-RL's
    code: threshold 0.32 on ViT-bigG-14 cosines, low -1, high 1). Term ``success``."""

    name = "vlm_sr"

    def __init__(self, goal: str = SAFE_DRIVING, contrast=(VLMRL_NEGATIVE,), tau: float = 100.0,
                 threshold: float = 0.5, low: float = 0.0, high: float = 1.0, text_encoder=None):
        super().__init__(text_encoder)
        _finite(tau=tau, threshold=threshold, low=low, high=high)
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        if isinstance(contrast, str):
            contrast = [contrast]
        self.goal = _prompt("goal", goal)
        self.contrast = tuple(_prompt("contrast", c) for c in (contrast or ()))
        self.tau, self.threshold = float(tau), float(threshold)
        self.low, self.high = float(low), float(high)

    def prompt_texts(self):
        return (self.goal, *self.contrast)

    def score(self, batch) -> np.ndarray:
        """P(goal | v) (or the goal cosine without contrast prompts)."""
        c = self.cosines(batch)
        if c.shape[1] == 1:
            return c[:, 0]
        z = self.tau * c
        z = z - np.max(z, axis=1, keepdims=True)
        p = np.exp(z)
        return p[:, 0] / p.sum(axis=1)

    def terms(self, batch):
        s = self.score(batch)
        with np.errstate(invalid="ignore"):
            return {"success": np.where(np.isnan(s), np.nan, np.where(s > self.threshold, self.high, self.low))}


class RoboCLIP(ContrastiveReward):
    """RoboCLIP (Sontakke et al.): the similarity of a whole episode to a task description, paid
    once at the episode's end.

    The episode's "video embedding" is the mean of its frames' unit embeddings: ``prepare`` (the
    replay buffer's labelling hook, called on new transitions in time order) keeps a running sum
    and count per env column - bounded state, carried across labelling rounds and saved in
    ``state_dict`` - and at a transition that ends the episode (``done``: termination or
    truncation) stores ``cos(mean, u_task)`` in the reward column ``roboclip_episode`` and resets
    the sum. The reward is ``scale`` x that column at episode ends, 0 elsewhere (term ``episode``).
    Never-embedded frames are skipped; an episode without any valid frame scores NaN. The column
    holds the similarity to the prompt in force when the episode ended: a changed ``task`` applies
    to episodes that end afterwards.

    ``dense=True`` is VLM-RL's adaptation instead: ``scale`` x cos(v, u_task) every step (term
    ``similarity``), no state."""

    name = "roboclip"
    COLUMN = "roboclip_episode"

    def __init__(self, task: str = SAFE_DRIVING, scale: float = 1.0, dense: bool = False,
                 text_encoder=None):
        super().__init__(text_encoder)
        _finite(scale=scale)
        self.task, self.scale, self.dense = _prompt("task", task), float(scale), bool(dense)
        if self.dense:
            self.needs, self.columns = ("embedding",), {}
        else:
            self.needs = ("embedding", "done", self.COLUMN)
            self.columns = {self.COLUMN: np.float32}
        self._sum: dict[int, np.ndarray] = {}
        self._count: dict[int, int] = {}
        self.episodes = 0

    def prompt_texts(self):
        return (self.task,)

    def prepare(self, ctx: LabelContext) -> dict[str, np.ndarray]:
        if self.dense:
            return {}
        b = ctx.batch
        n = len(np.asarray(b["done"]))
        x = self.image_rows(b)
        envs = np.asarray(b.get("env", np.zeros(n)), np.int64)
        done = np.asarray(b["done"]) > 0
        u = self.prompt_matrix()[0]
        out = np.zeros(n, np.float32)
        for i in range(n):
            e = int(envs[i])
            if np.isfinite(x[i, 0]):
                self._sum[e] = self._sum.get(e, 0.0) + x[i]
                self._count[e] = self._count.get(e, 0) + 1
            if done[i]:
                k = self._count.pop(e, 0)
                s = self._sum.pop(e, None)
                if k and np.linalg.norm(s) > 0:
                    out[i] = float(s @ u / np.linalg.norm(s))
                else:
                    out[i] = np.nan
                self.episodes += 1
        return {self.COLUMN: out}

    def episode_embedding(self, env: int = 0) -> np.ndarray | None:
        """The running mean of the current episode's unit frame embeddings in env column ``env``."""
        return self._sum[env] / self._count[env] if self._count.get(env) else None

    def terms(self, batch):
        if self.dense:
            return {"similarity": self.scale * (self.image_rows(batch) @ self.prompt_matrix()[0])}
        done = batch["done"] > 0
        return {"episode": np.where(done, self.scale * batch[self.COLUMN], 0.0)}

    def state_dict(self):
        if self.dense:
            return {}
        return {"sum": {e: s.copy() for e, s in self._sum.items()}, "count": dict(self._count),
                "episodes": self.episodes}

    def load_state_dict(self, state):
        if not state:
            return
        self._sum = {int(e): np.asarray(s, np.float64) for e, s in state.get("sum", {}).items()}
        self._count = {int(e): int(c) for e, c in state.get("count", {}).items()}
        self.episodes = int(state.get("episodes", 0))

    def stats(self):
        return {} if self.dense else {"roboclip/episodes": self.episodes}


class VLMRM(ContrastiveReward):
    """VLM-RM (Rocamonde et al.): goal-baseline regularised reward

        r = 1 - |P (x - t)|^2 / 2,   P = a d d^T / |d|^2 + (1 - a) I,   d = t - b

    with x = v / |v| and t, b the unit target / baseline prompt embeddings; ``a`` (``alpha``) = 0
    gives cos(x, t), 1 the projection onto the baseline-to-target direction only. Term ``goal``."""

    name = "vlm_rm"

    def __init__(self, target: str = SAFE_DRIVING, baseline: str = A_CAR, alpha: float = 0.5,
                 text_encoder=None):
        super().__init__(text_encoder)
        _finite(alpha=alpha)
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.target, self.baseline = _prompt("target", target), _prompt("baseline", baseline)
        self.alpha = float(alpha)

    def prompt_texts(self):
        return (self.target, self.baseline)

    def terms(self, batch):
        x = self.image_rows(batch)
        t, b = self.prompt_matrix()
        d = t - b
        dd = float(d @ d)
        e = x - t
        if dd > 0:
            pe = self.alpha * np.outer(e @ d, d) / dd + (1.0 - self.alpha) * e
        else:  # identical prompts: no direction, only the (1 - a) I part
            pe = (1.0 - self.alpha) * e
        return {"goal": 1.0 - 0.5 * np.sum(pe * pe, axis=1)}


class LORD(ContrastiveReward):
    """LORD (Ye et al.): opposite-goal reward 1 - cos(v, u_neg), term ``opposite``."""

    name = "lord"

    def __init__(self, negative: str = VLMRL_NEGATIVE, text_encoder=None):
        super().__init__(text_encoder)
        self.negative = _prompt("negative", negative)

    def prompt_texts(self):
        return (self.negative,)

    def terms(self, batch):
        return {"opposite": 1.0 - self.cosines(batch)[:, 0]}


class LORDSpeed(LORD):
    """LORD-Speed (VLM-RL's adaptation): LORD + k (1 - |v - v_target| / v_target), VLM-RL's code
    (k = 1, v_target = 20 km/h; unclipped, so the speed term falls below 0 above 2 v_target).
    Terms ``opposite`` and ``speed``."""

    name = "lord_speed"
    needs = ("embedding", "speed_kmh")

    def __init__(self, negative: str = VLMRL_NEGATIVE, k: float = 1.0, target_kmh: float = 20.0,
                 text_encoder=None):
        super().__init__(negative, text_encoder)
        _finite(k=k, target_kmh=target_kmh)
        if target_kmh <= 0:
            raise ValueError(f"target_kmh must be > 0, got {target_kmh}")
        self.k, self.target_kmh = float(k), float(target_kmh)

    def terms(self, batch):
        out = super().terms(batch)
        out["speed"] = self.k * (1.0 - np.abs(batch["speed_kmh"] - self.target_kmh) / self.target_kmh)
        return out
