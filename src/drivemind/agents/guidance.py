"""Found-RL's VLM action guidance for DriveSAC (seed 004, Sec. 4.2): ``algo.guidance``.

A *suggested action* ``a_vlm`` and its availability mask ``m`` are stored per transition in the
replay buffer (``RelabelReplayBuffer(guidance=True)``: ``guide_actions`` / ``guide_mask``). Rows
with ``m = 0`` (no suggestion, or one not yet scored) contribute nothing to either loss and are
never used as targets.

- **VMR** (value-margin regularisation, Eq. 12-14): the critic loss gains
  ``lambda(step) * sum_i mean_{m=1} (Q_i(o, a_vlm) - (stopgrad(Q_i(o, a)) + margin))^2``.
- **AWAG** (advantage-weighted action guidance, Eq. 19-24): with ``A = min_i Q_i(o, a_vlm) -
  min_i Q_i(o, a_pi)`` (``a_pi`` the actor's deterministic action), gate ``g = 1{A > 0}`` and
  weight ``w = min(exp(A / beta), w_max)`` (both constants), the actor loss gains
  ``iota(step) * -mean_{m=1, g=1} w * log pi(a_vlm | o)``.
- Both coefficients follow the paper's cosine schedule :func:`cosine_weight`
  (``end + (start - end) * (1 + cos(pi * min(step / steps, 1) ** power)) / 2``), stepped by the
  agent's env steps (``num_timesteps``).

The paper gives beta = 2 and w_max = 20; it gives no number for the margin or the schedules. The
defaults (margin 2, VMR weight 1 -> 0, AWAG weight 0.01 held constant, as the paper says its SAC
variant keeps it) are read from the authors' public code; they are settings, not tuned here.

Where the suggestion comes from (``guidance_kwargs.source``): ``privileged`` — a **stand-in**
for the VLM, the env's autopilot computed from ground truth (``DriveEnv(suggest_action=True)``
puts it in the facts ``vlm_action_steer`` / ``vlm_action_accel`` / ``vlm_action_available``,
copied into the buffer's guidance slot when the transition is stored). ``smolvlm`` and ``http``
(the tiny VLM and the HTTP teacher through the reward service) are not implemented yet: the
buffer's ``set_guidance(slots, actions, mask)`` is where their answers would be written back by
id; choosing them fails with a clear error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch as th

MODES = ("none", "vmr", "awag", "both")
SOURCES = ("privileged", "smolvlm", "http")
READY_SOURCES = ("privileged",)
# the VLM action is clamped inside the tanh squashing's support before its log-likelihood
ACTION_CLIP = 0.999


def cosine_weight(step: float, start: float, end: float, steps: float, power: float = 1.0) -> float:
    """Found-RL's cosine-decayed coefficient (Eq. 14 / 24): ``start`` at step 0, ``end`` from
    ``steps`` on; ``power`` < 1 decays faster early."""
    p = min(max(float(step), 0.0) / float(steps), 1.0) ** float(power)
    return float(end + (start - end) * (1.0 + math.cos(math.pi * p)) / 2.0)


def masked_mean(x: th.Tensor, mask: th.Tensor) -> th.Tensor:
    """Mean of ``x`` over the rows where ``mask`` is 1 (0 when there are none; those rows get no
    gradient either way)."""
    mask = mask.reshape(x.shape[0], *([1] * (x.dim() - 1))).to(x.dtype)
    n = mask.sum() * (x[0].numel() if x.dim() > 1 else 1)
    return (x * mask).sum() / th.clamp(n, min=1.0)


def vmr_loss(q_vlm: th.Tensor, q_data: th.Tensor, mask: th.Tensor, margin: float) -> th.Tensor:
    """Eq. 12: ``q_vlm``, ``q_data``: (B, n_critics) values of the suggested and the replayed
    action; the replayed values are detached. Summed over critic heads, averaged over rows with a
    suggestion."""
    err = (q_vlm - (q_data.detach() + margin)) ** 2
    return sum(masked_mean(err[:, i], mask) for i in range(err.shape[1]))


def awag_weights(advantage: th.Tensor, beta: float, w_max: float) -> tuple[th.Tensor, th.Tensor]:
    """Eq. 20-21: (weights ``min(exp(A / beta), w_max)``, Q-filter gate ``A > 0``), both
    constants (no gradient)."""
    a = advantage.detach()
    return th.clamp(th.exp(a / beta), max=w_max), (a > 0)


def awag_loss(log_prob_vlm: th.Tensor, weights: th.Tensor, gate: th.Tensor, mask: th.Tensor) -> th.Tensor:
    """Eq. 22: ``-mean w * log pi(a_vlm | o)`` over the rows with a suggestion whose advantage
    passes the gate."""
    keep = (mask.reshape(-1) > 0) & gate.reshape(-1)
    return -masked_mean(weights.reshape(-1) * log_prob_vlm.reshape(-1), keep)


def _vmr_default():
    return {"margin": 2.0, "start": 1.0, "end": 0.0, "steps": 150_000, "power": 1.0}


def _awag_default():
    return {"beta": 2.0, "w_max": 20.0, "start": 0.01, "end": 0.01, "steps": 150_000, "power": 1.0}


@dataclass
class GuidanceConfig:
    """``algo.guidance`` + ``algo.guidance_kwargs`` (configs/algo/sac.yaml)."""

    mode: str = "none"
    source: str = "privileged"
    vmr: dict = field(default_factory=_vmr_default)
    awag: dict = field(default_factory=_awag_default)

    @classmethod
    def from_config(cls, mode, kwargs: dict | None = None) -> "GuidanceConfig | None":
        """None for ``mode`` none (the default path); otherwise a checked config. Bad values
        raise one ``ValueError`` naming the key and the valid choices."""
        mode = "none" if mode in (None, False) else str(mode)
        if mode not in MODES:
            raise ValueError(f"unknown algo.guidance {mode!r}; valid: {', '.join(MODES)}")
        if mode == "none":
            return None
        kw = dict(kwargs or {})
        unknown = set(kw) - {f.name for f in fields(cls)} - {"mode"}
        if unknown:
            raise ValueError(f"unknown algo.guidance_kwargs key(s) {sorted(unknown)}; valid: source, vmr, awag")
        source = str(kw.get("source", "privileged"))
        if source not in SOURCES:
            raise ValueError(f"unknown algo.guidance_kwargs.source {source!r}; valid: {', '.join(SOURCES)}")
        if source not in READY_SOURCES:
            raise ValueError(f"algo.guidance_kwargs.source={source} is not implemented yet (the "
                             f"asynchronous {source} teacher through the reward service); use "
                             f"source=privileged (the env's autopilot, a stand-in for the VLM)")
        sub = {}
        for name, default in (("vmr", _vmr_default()), ("awag", _awag_default())):
            given = dict(kw.get(name) or {})
            bad = set(given) - set(default)
            if bad:
                raise ValueError(f"unknown algo.guidance_kwargs.{name} key(s) {sorted(bad)}; "
                                 f"valid: {', '.join(default)}")
            merged = {**default, **given}
            for k, v in merged.items():
                lo_ok = v > 0 if k in ("steps", "power", "beta", "w_max") else v >= 0
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo_ok:
                    want = "> 0" if k in ("steps", "power", "beta", "w_max") else ">= 0"
                    raise ValueError(f"algo.guidance_kwargs.{name}.{k} must be a number {want}, got {v!r}")
            sub[name] = merged
        return cls(mode=mode, source=source, vmr=sub["vmr"], awag=sub["awag"])

    @property
    def use_vmr(self) -> bool:
        return self.mode in ("vmr", "both")

    @property
    def use_awag(self) -> bool:
        return self.mode in ("awag", "both")

    def vmr_weight(self, step: float) -> float:
        v = self.vmr
        return cosine_weight(step, v["start"], v["end"], v["steps"], v["power"])

    def awag_weight(self, step: float) -> float:
        a = self.awag
        return cosine_weight(step, a["start"], a["end"], a["steps"], a["power"])

    def to_dict(self) -> dict:
        return {"source": self.source, "vmr": dict(self.vmr), "awag": dict(self.awag)}
