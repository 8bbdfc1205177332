"""Found-RL's CLIP reward: conditional contrastive action alignment (Found-RL Sec. 4.3, App. A).

Context c_t = (command, speed bin): 6 route commands x 4 speed bins; 30 action phrases per
context (6 longitudinal x 5 lateral); 720 prompts in all, embedded once. For a transition:

    P(a | I, c) = softmax over the context's 30 actions of tau cos(E_I(I), E_T(T_{c,a}))
    r_raw       = max(0, P(a_t) - max over a not in N(a_t) of P(a))
    r_vlm       = clip((r_raw - mu) / sigma, -1, 1)              running mean / std of r_raw
    r_final     = r_env + lambda r_vlm                              (``found_rl_clip``)

- **I, c_t and a_t.** I is the stored embedding of the frame the step's facts describe (the BEV the
  action led to; its history planes show the motion the action caused); the context comes from
  the same step's facts (``command``, ``speed_kmh``) and a_t from the applied controls
  (``steer``, ``throttle``, ``brake`` facts = the action, clipped). One time index for all three,
  so nothing extra is stored; the speed bin differs from the pre-action speed by at most one
  step's acceleration.
- **Discretisation** (App. A, Tables 9-11): speed < 0.1, < 2.0, < 4.5, else "high" (m/s, as in
  Roach's CARLA stack); brake > 0.5 "braking hard", > 0.05 "braking", throttle > 0.8
  "accelerating fast", > 0.3 "accelerating", > 0.05 "accelerating gently", else "idling"; steer
  |s| < 0.05 "going straight", within 0.3 "turning left/right", beyond "sharply" (+ right). The
  paper's Table 11 row "-1 <= throttle <= -0.3: turning left" is read as the left mirror of the
  right rows.
- **Neighbours** N(a): the action itself and the actions that differ from it only by one step of
  intensity of the same manoeuvre on either axis ("braking" ~ "braking hard", "accelerating" ~
  "accelerating fast" / "gently", "turning left" ~ "turning left sharply"; "idling" and "going
  straight" have none), combined across the two axes; every other action is a competitor.
- **Commands**: the env's ``command`` fact (CARLA ``RoadOption`` codes 1-6, ``envs.tracker.
  route_commands``); any other value is read as "follow the current lane" (4).
- **Running mean / std** (mu, sigma = sqrt(var + eps)): updated by ``prepare`` - the replay
  buffer's labelling hook - once per new transition, in time order, before those transitions are
  scored; re-scoring old transitions uses the current statistics (Found-RL also adds the bonus
  with its current statistics). A reward whose ``prepare`` is never called (a plain call, PPO)
  updates them on every scoring call instead. Saved with ``state_dict``.

Defaults the paper leaves open: the prompt wording (``template``), tau = 100 (OpenCLIP's logit
scale, which Found-RL's released code uses; the shipped BEV-CLIP learned 15.2), lambda = 0.25 (the
released code's bonus scale), task reward = our ``task`` (progress + failure penalty).
"""

from __future__ import annotations

import numpy as np

from .base import Composite, LabelContext
from .contrastive import ContrastiveReward, _finite
from .kinematic import Task

#: command code (the env's ``command`` fact) -> phrase (Found-RL App. A)
COMMAND_PHRASES = {
    1: "turn left at the intersection", 2: "turn right at the intersection",
    3: "go straight at the intersection", 4: "follow the current lane",
    5: "change to the left lane", 6: "change to the right lane",
}
COMMAND_CODES = tuple(COMMAND_PHRASES)
FOLLOW_LANE = 4
SPEED_PHRASES = ("The car is currently stopped", "The car is moving slowly",
                 "The car is driving at a moderate speed", "The car is driving at a high speed")
SPEED_BINS_MS = (0.1, 2.0, 4.5)
LONGITUDINAL = ("braking hard", "braking", "idling", "accelerating gently", "accelerating",
                "accelerating fast")
LATERAL = ("turning left sharply", "turning left", "going straight", "turning right",
           "turning right sharply")
_LON_FAMILY = (0, 0, 1, 2, 2, 2)  # braking | idling | accelerating
_LAT_FAMILY = (0, 0, 1, 2, 2)  # left | straight | right
TEMPLATE = "Command: {command}. {speed}. The car is {longitudinal} and {lateral}."


def _axis_neighbours(family) -> np.ndarray:
    n = len(family)
    m = np.eye(n, dtype=bool)
    for i in range(n - 1):
        if family[i] == family[i + 1]:
            m[i, i + 1] = m[i + 1, i] = True
    return m


def neighbour_matrix() -> np.ndarray:
    """(30, 30) bool: ``[a, b]`` is True when b is in N(a) (a itself included). Action index =
    longitudinal index x 5 + lateral index."""
    lon, lat = _axis_neighbours(_LON_FAMILY), _axis_neighbours(_LAT_FAMILY)
    return np.einsum("ij,kl->ikjl", lon, lat).reshape(30, 30).astype(bool)


def longitudinal_index(throttle, brake) -> np.ndarray:
    t, b = np.asarray(throttle, np.float64), np.asarray(brake, np.float64)
    return np.select([b > 0.5, b > 0.05, t > 0.8, t > 0.3, t > 0.05], [0, 1, 5, 4, 3], 2)


def lateral_index(steer) -> np.ndarray:
    s = np.asarray(steer, np.float64)
    return np.select([s < -0.3, s <= -0.05, s < 0.05, s <= 0.3], [0, 1, 2, 3], 4)


def speed_index(speed_kmh, bins_ms=SPEED_BINS_MS) -> np.ndarray:
    return np.searchsorted(np.asarray(bins_ms, np.float64), np.asarray(speed_kmh, np.float64) / 3.6,
                           side="right")


def command_index(command) -> np.ndarray:
    c = np.nan_to_num(np.asarray(command, np.float64), nan=FOLLOW_LANE).round().astype(np.int64)
    c = np.where(np.isin(c, COMMAND_CODES), c, FOLLOW_LANE)
    return c - 1


class RunningMeanStd:
    """Mean and variance of everything seen so far (parallel update, batches of any size)."""

    def __init__(self):
        self.mean, self.var, self.count = 0.0, 1.0, 0

    def update(self, x) -> None:
        x = np.asarray(x, np.float64)
        x = x[np.isfinite(x)]
        if not len(x):
            return
        bm, bv, n = float(x.mean()), float(x.var()), len(x)
        if self.count == 0:
            self.mean, self.var, self.count = bm, bv, n
            return
        tot = self.count + n
        delta = bm - self.mean
        m2 = self.var * self.count + bv * n + delta * delta * self.count * n / tot
        self.mean, self.var, self.count = self.mean + delta * n / tot, m2 / tot, tot

    def state_dict(self):
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, s):
        self.mean, self.var, self.count = float(s["mean"]), float(s["var"]), int(s["count"])


class FoundRLClip(ContrastiveReward):
    """The normalised action-alignment bonus r_vlm in [-1, 1] (module docstring), term ``bonus``."""

    name = "found_rl_clip_bonus"
    needs = ("embedding", "speed_kmh", "command", "steer", "throttle", "brake")

    def __init__(self, tau: float = 100.0, template: str = TEMPLATE, eps: float = 1e-8,
                 chunk: int = 4096, text_encoder=None):
        super().__init__(text_encoder)
        _finite(tau=tau, eps=eps)
        if tau <= 0 or eps <= 0:
            raise ValueError(f"tau and eps must be > 0, got {tau}, {eps}")
        try:
            template.format(command="c", speed="s", longitudinal="l", lateral="t")
        except (KeyError, IndexError, AttributeError, ValueError) as e:
            raise ValueError(f"template must be a format string with only the fields {{command}}, "
                             f"{{speed}}, {{longitudinal}}, {{lateral}}; got {template!r} ({e!r})") from None
        self.tau, self.template, self.eps, self.chunk = float(tau), template, float(eps), int(chunk)
        self._texts: tuple[str, tuple[str, ...]] | None = None  # (template, its 720 prompts)
        self.neighbours = neighbour_matrix()
        self.rms = RunningMeanStd()
        self._prepared = False

    def prompt_texts(self):
        """The 720-prompt library, ordered (command, speed bin, longitudinal, lateral): built once
        per template (every labelling round asks for it; formatting 720 strings each time was a
        few per cent of a run)."""
        cached = getattr(self, "_texts", None)  # absent in rewards pickled before the cache
        if cached is None or cached[0] != self.template:
            cached = self._texts = (self.template, tuple(
                self.template.format(command=COMMAND_PHRASES[c], speed=s, longitudinal=lo, lateral=la)
                for c in COMMAND_CODES for s in SPEED_PHRASES for lo in LONGITUDINAL for la in LATERAL))
        return cached[1]

    def context_index(self, batch) -> np.ndarray:
        """Index of each row's context (command x 4 + speed bin) in 0..23."""
        return command_index(batch["command"]) * 4 + speed_index(batch["speed_kmh"])

    def action_index(self, batch) -> np.ndarray:
        return longitudinal_index(batch["throttle"], batch["brake"]) * 5 + lateral_index(batch["steer"])

    def probabilities(self, batch) -> np.ndarray:
        """(N, 30) P(a | I, c) over each row's context actions (NaN rows for never-embedded frames)."""
        x = self.image_rows(batch)
        u = self.prompt_matrix()  # (720, D)
        ctx = self.context_index(batch)
        out = np.empty((len(x), 30))
        for a in range(0, len(x), self.chunk):
            cos = (x[a:a + self.chunk] @ u.T).reshape(-1, 24, 30)
            z = self.tau * cos[np.arange(len(cos)), ctx[a:a + self.chunk]]
            z = z - np.max(z, axis=1, keepdims=True)
            p = np.exp(z)
            out[a:a + self.chunk] = p / p.sum(axis=1, keepdims=True)
        return out

    def raw(self, batch) -> np.ndarray:
        """r_raw = max(0, P(a_t) - max over non-neighbours of P) per row."""
        p = self.probabilities(batch)
        act = self.action_index(batch)
        rows = np.arange(len(p))
        others = np.where(self.neighbours[act], -np.inf, p)
        return np.maximum(0.0, p[rows, act] - others.max(axis=1))

    def normalise(self, raw: np.ndarray) -> np.ndarray:
        sigma = np.sqrt(self.rms.var + self.eps)
        return np.clip((raw - self.rms.mean) / sigma, -1.0, 1.0)

    def prepare(self, ctx: LabelContext) -> dict[str, np.ndarray]:
        self._prepared = True
        self.rms.update(self.raw(ctx.batch))
        return {}

    def terms(self, batch):
        raw = self.raw(batch)
        if not self._prepared:
            self.rms.update(raw)
        return {"bonus": self.normalise(raw)}

    def state_dict(self):
        return {"rms": self.rms.state_dict(), "prepared": self._prepared}

    def load_state_dict(self, state):
        if state:
            self.rms.load_state_dict(state["rms"])
            self._prepared = bool(state.get("prepared", False))

    def stats(self):
        return {"found_rl/raw_mean": self.rms.mean, "found_rl/raw_std": float(np.sqrt(self.rms.var)),
                "found_rl/count": self.rms.count}


def found_rl_clip(lam: float = 0.25, tau: float = 100.0, template: str = TEMPLATE,
                  progress_weight: float = 1.0, failure_penalty: float = -10.0) -> Composite:
    """Found-RL's shaped reward: r_env + lambda r_vlm, with our ``task`` reward as r_env
    (parts ``task`` and ``clip``)."""
    _finite(lam=lam)
    return Composite({"task": (1.0, Task(progress_weight, failure_penalty)),
                      "clip": (float(lam), FoundRLClip(tau=tau, template=template))},
                     name="found_rl_clip")
