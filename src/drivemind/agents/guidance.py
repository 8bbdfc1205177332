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
copied into the buffer's guidance slot when the transition is stored). ``http`` (the HTTP
teacher) and ``smolvlm`` (the SmolVLM slot; ``teacher.tiny: true`` for the random tiny one) —
asked asynchronously through the reward service (:class:`GuidanceRequester`; answers written
back by slot and write stamp with ``set_guidance``; :mod:`drivemind.vlm.action_teacher`).
"""

from __future__ import annotations

import numpy as np
import torch as th

from ..reward_service import SERVICE_DEFAULTS
from .guidance_config import (  # noqa: F401  (re-exported: the settings live there, torch-free)
    ASYNC_SOURCES, MODES, SOURCES, GuidanceConfig, cosine_weight)

# the VLM action is clamped inside the tanh squashing's support before its log-likelihood
ACTION_CLIP = 0.999


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


class GuidanceRequester:
    """The learner's side of an asynchronous action teacher (``source=http``): every
    transition stored since the last call is sent to the reward service
    (:class:`drivemind.reward_service.RewardService` running
    :class:`drivemind.vlm.action_teacher.ActionTeacherWorker`: micro-batches of at most
    ``max_batch`` requests or ``max_wait_ms``), never more than ``max_pending`` in flight
    (back-pressure: the rest wait here, oldest first, and rows overwritten meanwhile are dropped);
    answers are written back into the buffer by slot with the write stamp taken at request time
    (``RelabelReplayBuffer.set_guidance``). Until its answer is back a row keeps mask 0."""

    def __init__(self, teacher_kind: str, teacher_kwargs: dict | None, service: dict | None = None,
                 bev_config=None):
        from ..vlm.action_teacher import ActionTeacherWorker

        s = {**SERVICE_DEFAULTS, **(service or {})}
        self.max_batch, self.max_wait_ms, self.max_pending = int(s["max_batch"]), float(s["max_wait_ms"]), int(s["max_pending"])
        self.factory = ActionTeacherWorker(teacher_kind, teacher_kwargs, bev_config)
        self.factory.check()  # a bad URL / missing key / unknown option fails here, clearly
        self._svc = None
        self._queue: list[tuple[int, int]] = []  # (slot, stamp) not yet submitted, oldest first
        self._inflight: dict[int, tuple[int, int]] = {}  # request id -> (slot, stamp)
        self._next_id = 0
        self._seen = 0  # buffer write stamps up to this one are queued
        self.requested = self.answered = self.valid = self.dropped = 0

    def service(self):
        if self._svc is None:
            from ..reward_service import RewardService

            self._svc = RewardService(self.factory, max_batch=self.max_batch, max_wait_ms=self.max_wait_ms,
                                      max_pending=self.max_pending, name="guidance-teacher")
        return self._svc

    def pump(self, buffer, timeout: float = 0.0) -> int:
        """Queue the new transitions, submit what fits, write back what came back (waiting up to
        ``timeout`` s for some). Returns how many answers were written."""
        if not buffer.store_images:
            raise ValueError("the asynchronous action teacher needs the stored BEV masks "
                             "(RelabelReplayBuffer(store_images=True))")
        stamps = buffer.guide_stamp.reshape(-1)
        new = np.flatnonzero((stamps > self._seen) & (buffer.guide_mask.reshape(-1) == 0))
        new = new[np.argsort(stamps[new], kind="stable")]
        self._queue.extend((int(s), int(stamps[s])) for s in new)
        self._seen = int(buffer._writes)
        svc = self.service()
        while self._queue and svc.in_flight < self.max_pending:
            room = self.max_pending - svc.in_flight
            take, self._queue = self._queue[:room], self._queue[room:]
            live = [(s, st) for s, st in take if stamps[s] == st]  # overwritten meanwhile: dropped
            self.dropped += len(take) - len(live)
            if not live:
                continue
            batch = buffer.fact_batch(np.array([s for s, _ in live]))
            facts = [{k: float(batch[k][i]) for k in buffer.fact_keys} for i in range(len(live))]
            payloads = [{"bev": buffer.observation(s)["bev"], "facts": f} for (s, _), f in zip(live, facts)]
            ids = np.arange(self._next_id, self._next_id + len(live))
            n = svc.submit(ids, payloads, block=False)
            for i in range(n):
                self._inflight[int(ids[i])] = live[i]
            self._next_id += len(live)
            self.requested += n
            self._queue = live[n:] + self._queue
            if n < len(live):
                break
        got, res = svc.poll(timeout)
        if len(got) == 0:
            return 0
        res = np.asarray(res, np.float32)
        pairs = [self._inflight.pop(int(i)) for i in got]
        slots = np.array([p[0] for p in pairs], np.int64)
        st = np.array([p[1] for p in pairs], np.int64)
        self.answered += len(got)
        self.valid += int((res[:, 2] > 0).sum())
        written = buffer.set_guidance(slots, res[:, :2], res[:, 2], stamps=st)
        self.dropped += len(got) - written
        return written

    def stats(self) -> dict[str, float]:
        return {"guidance/requested": self.requested, "guidance/answered": self.answered,
                "guidance/valid_answers": self.valid, "guidance/dropped": self.dropped,
                "guidance/queued": len(self._queue), "guidance/in_flight": len(self._inflight)}

    def close(self) -> None:
        if self._svc is not None:
            self._svc.close()
            self._svc = None
