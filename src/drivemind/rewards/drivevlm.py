"""DriveVLM-RL's reward (seed 001): a static BEV pathway plus a dynamic pathway gated by a detector.

    R_static  = alpha cos(v, l_pos) - beta cos(v, l_neg)                       (CLG on the BEV)
    R_dynamic = g_t [alpha cos(v_dyn, l_pos) - beta cos(v_dyn, l_dyn,t)]      (0 when g_t = 0)
    r'        = (clip(R_static + R_dynamic, th_min, th_max) - th_min) / (th_max - th_min)   Phase I
    R_synth   = r_speed f_center f_angle f_stability, v_target = r' v_max                    Phase II
    r         = task (progress, failure penalty) + rho R_synth

g_t is the detector's gate (any critical class: person, bicycle, motorcycle, animals) and l_dyn,t
the reasoner's risk description from the vocabulary ``drivemind.vlm.reasoners.RISK_VOCABULARY``
("a pedestrian is crossing the road ahead", ...).

**Slots.** ``detector="privileged"`` and ``reasoner="privileged"`` (defaults; **stand-ins** for
YOLOv8 and Qwen3-VL-4B) run in the env at every step on ground truth and arrive as the facts
``critical_count`` and ``risk_id``. ``detector="yolo"`` and/or ``reasoner="qwen_vl"`` run the real
models on the stored frames (the forward camera when the backend has one, else the BEV colour
view; the reasoner gets the last K+1 = 4 frames of the episode) and store their results as the
columns ``dyn_gate`` / ``dyn_risk``; their descriptions are snapped to the vocabulary (one outside
it gives no dynamic term and is counted). Where the models run:

- inline (default): in ``prepare``, in the learner's process, before each labelling round;
- in a worker process (``algo.reward_service.enabled=true``: the agent calls ``use_service``):
  :class:`DriveVLMLabeller` builds the models there once and answers requests (the frame window of
  one transition) in micro-batches; the learner submits without blocking (back-pressure at
  ``max_pending``) and labels only the transitions whose answers are back (``ctx.limit``); the rest
  stay pending and are never sampled. A failed batch is sent again (counted); a dead worker falls
  back to inline (warned).

**View.** The paper's dynamic pathway reads a forward camera. Where the backend has one (CARLA with
``sim.carla.camera.enabled=true``: ``info["front_rgb"]``) and the image encoder embeds RGB
(``vlm=openclip``; BEV-CLIP embeds BEVs only), the agent stores each step's camera embedding as
``view_embedding`` and v_dyn is that embedding; the models above read the camera frame. Otherwise
v_dyn = v, the BEV embedding: the paper's "w/o First-View" variant, warned once. The share of
labelled rows that had a camera embedding is logged as ``drivevlm/first_view``.

**Window.** The paper's (-0.1, 0.2) belongs to its encoder; ours is set for the shipped BEV-CLIP
by ``scripts/calibrate_reward.py reward=drivevlm_rl`` (the same quantiles as VLM-RL's).
"""

from __future__ import annotations

import logging
import math
import time
import warnings

import numpy as np

from .base import Composite, LabelContext
from .contrastive import VLMRL_NEGATIVE, VLMRL_POSITIVE, VLMRLSynth, _finite, unit_rows
from .kinematic import Task
from .windows import CLG_WINDOWS

log = logging.getLogger(__name__)

PAPER_WINDOW = (-0.1, 0.2)
BEVCLIP_WINDOW = CLG_WINDOWS["drivevlm_rl"]["bev_clip_cpu.pt"]  # the default tower's: (-0.3472, 0.1951)
DETECTORS = ("privileged", "yolo")
REASONERS = ("privileged", "qwen_vl", "tiny_qwen_vl")


WINDOW = 4  # K + 1 frames for the reasoner


class DriveVLMLabeller:
    """The real detector / reasoner slots as a batch function: ``DriveVLMLabeller(...)()`` builds
    the models (once) and returns ``label(requests) -> [(gate, risk, unmatched), ...]``. A request
    is ``{"frames": [up to 4 HxWx3 uint8 frames, oldest first], "gate": 0/1 or -1, "risk": id}``:
    ``gate`` -1 means the detector decides (YOLO on the last frame), otherwise it is the
    privileged gate; ``risk`` is the privileged risk id, used when the reasoner is privileged and
    no detector ran. Picklable, so the same code runs inline and in the reward service's worker."""

    def __init__(self, detector: str = "yolo", reasoner: str = "privileged", detector_kwargs=None,
                 reasoner_kwargs=None, threads: int | None = None):
        self.detector, self.reasoner = detector, reasoner
        self.detector_kwargs, self.reasoner_kwargs = dict(detector_kwargs or {}), dict(reasoner_kwargs or {})
        self.threads = threads

    def __call__(self):
        from ..vlm.detectors import build_detector, gate
        from ..vlm.reasoners import RISK_VOCABULARY, make_reasoner

        if self.threads:
            import torch
            torch.set_num_threads(int(self.threads))
        det = (build_detector({"kind": self.detector, **self.detector_kwargs})
               if self.detector != "privileged" else None)
        rsn = make_reasoner(self.reasoner, **self.reasoner_kwargs)
        index = {t: i for i, t in enumerate(RISK_VOCABULARY)}
        privileged_reasoner = self.reasoner == "privileged"

        def label(requests):
            dets: list = [None] * len(requests)
            todo = [i for i, r in enumerate(requests) if int(r["gate"]) < 0]
            if todo and det is not None:
                last = [np.asarray(requests[i]["frames"][-1]) for i in todo]
                if len({f.shape for f in last}) == 1:
                    found = det.detect_batch(np.stack(last))
                else:
                    found = [det.detect(f) for f in last]
                for i, d in zip(todo, found):
                    dets[i] = d
            out = []
            for r, d in zip(requests, dets):
                g = gate(d) if d is not None else int(r["gate"]) > 0
                if not g:
                    out.append((0, -1, False))
                elif privileged_reasoner and d is None:
                    out.append((1, int(r["risk"]), False))
                else:
                    k = index.get(rsn.describe(list(r["frames"]), d or []), -1)
                    out.append((1, k, k < 0))
            return out

        return label

    def __repr__(self) -> str:
        return f"DriveVLMLabeller(detector={self.detector!r}, reasoner={self.reasoner!r})"


class DriveVLMSynth(VLMRLSynth):
    """Phase I + II over the static + gated dynamic CLG (module docstring)."""

    name = "drivevlm_synth"
    needs = ("embedding", "speed_kmh", "lateral_offset", "heading_error", "lateral_oscillation",
             "critical_count", "risk_id")
    optional = ("view_embedding",)
    default_window = BEVCLIP_WINDOW

    def __init__(self, positive: str = VLMRL_POSITIVE, negative: str = VLMRL_NEGATIVE,
                 alpha: float = 0.5, beta: float = 0.5, theta_min: float | None = None,
                 theta_max: float | None = None, v_max_kmh: float = 25.0,
                 max_offset: float = 3.0, max_angle: float = math.pi / 2, max_oscillation: float = 0.4,
                 detector: str = "privileged", reasoner: str = "privileged",
                 detector_kwargs: dict | None = None, reasoner_kwargs: dict | None = None,
                 text_encoder=None):
        super().__init__(positive, negative, alpha, beta, theta_min, theta_max, v_max_kmh, max_offset,
                         max_angle, max_oscillation, text_encoder)
        if detector not in DETECTORS:
            raise ValueError(f"detector must be one of {list(DETECTORS)}, got {detector!r}")
        if reasoner not in REASONERS:
            raise ValueError(f"reasoner must be one of {list(REASONERS)}, got {reasoner!r}")
        from ..vlm.reasoners import RISK_VOCABULARY

        self.vocabulary = tuple(RISK_VOCABULARY)
        self.detector_kind, self.reasoner_kind = detector, reasoner
        self.detector_kwargs, self.reasoner_kwargs = dict(detector_kwargs or {}), dict(reasoner_kwargs or {})
        self.models_in_prepare = detector != "privileged" or reasoner != "privileged"
        self.columns = {"dyn_gate": np.int8, "dyn_risk": np.int16} if self.models_in_prepare else {}
        self.needs = (*type(self).needs, *self.columns)  # the models' answers replace the facts
        self._label_fn = None  # the inline batch function (DriveVLMLabeller()())
        self._service = None
        self._service_cfg: dict | None = None
        self._reset_queues()
        self._warned_view = False
        self.gated = 0
        self.seen = 0
        self.first_view = 0
        self.unmatched = 0
        self.service_errors = 0
        self.labelled_remote = 0

    def _reset_queues(self):
        self._window: dict[int, list] = {}  # env -> the episode's last frames
        self._results: dict[int, tuple] = {}  # slot -> (gate, risk, unmatched)
        self._unsent: dict[int, dict] = {}  # slot -> request not yet accepted by the service
        self._inflight: dict[int, dict] = {}  # slot -> request the service is working on

    def prompt_texts(self):
        return (self.positive, self.negative, *self.vocabulary)

    def combined(self, batch) -> np.ndarray:
        """R_static + R_dynamic per row (what the calibration collects)."""
        c = self.cosines(batch)  # columns: l_pos, l_neg, then the vocabulary
        static = self.alpha * c[:, 0] - self.beta * c[:, 1]
        cd = c  # the dynamic pathway's cosines: the forward camera's where there is one
        view = batch.get("view_embedding")
        has_view = np.zeros(len(c), bool) if view is None else np.any(np.asarray(view) != 0, axis=1)
        if has_view.any():
            cd = c.copy()
            cd[has_view] = unit_rows(np.asarray(view)[has_view]) @ self.prompt_matrix().T
        if "dyn_gate" in batch:
            g, risk = np.asarray(batch["dyn_gate"]) > 0, np.asarray(batch["dyn_risk"]).astype(np.int64)
        else:
            g, risk = np.asarray(batch["critical_count"]) > 0, np.asarray(batch["risk_id"]).astype(np.int64)
        g = g & (risk >= 0) & (risk < len(self.vocabulary))
        if not self._warned_view and len(c):
            if has_view.any():
                log.info("DriveVLM-RL's dynamic pathway reads the forward camera's embeddings "
                         "(view_embedding)")
            else:
                warnings.warn("DriveVLM-RL's dynamic pathway reads the BEV embedding: no forward camera "
                              "embeddings are stored (the paper's 'w/o First-View' variant; a camera "
                              "needs sim=carla with sim.carla.camera.enabled=true and vlm=openclip)",
                              UserWarning, stacklevel=4)
            self._warned_view = True
        rows = np.arange(len(c))
        dyn_neg = np.where(g, cd[rows, 2 + np.clip(risk, 0, len(self.vocabulary) - 1)], 0.0)
        dynamic = np.where(g, self.alpha * cd[:, 0] - self.beta * dyn_neg, 0.0)
        self.seen += len(g)
        self.gated += int(g.sum())
        self.first_view += int(has_view.sum())
        return static + dynamic

    def clg(self, batch) -> np.ndarray:
        return self.combined(batch)

    def calibration_values(self, batch) -> np.ndarray:
        return self.combined(batch)

    # ---------------------------------------------------------------- real detector / reasoner
    def labeller(self, threads: int | None = None) -> DriveVLMLabeller:
        return DriveVLMLabeller(self.detector_kind, self.reasoner_kind, self.detector_kwargs,
                                self.reasoner_kwargs, threads)

    def use_service(self, config: dict | None) -> None:
        """Run the real models in a worker process (``config``: the agent's reward-service
        settings, ``SERVICE_DEFAULTS``' keys); None: inline. Nothing to do with privileged slots
        only."""
        if not self.models_in_prepare:
            return
        from ..reward_service import SERVICE_DEFAULTS

        self.close()
        self._service_cfg = (None if config is None else
                             {**SERVICE_DEFAULTS, **{k: config[k] for k in SERVICE_DEFAULTS if k in config}})

    def service(self):
        """The worker process running :class:`DriveVLMLabeller` (started on first use)."""
        if self._service is None:
            from ..reward_service import RewardService
            c = self._service_cfg
            self._service = RewardService(self.labeller(c["threads"]), max_batch=c["max_batch"],
                                          max_wait_ms=c["max_wait_ms"], max_pending=c["max_pending"],
                                          name="drivevlm-models")
        return self._service

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
            self._service = None
        self._unsent.update(self._inflight)  # asked again (inline or by a new worker) if still pending
        self._inflight.clear()

    def _request(self, ctx: LabelContext, i: int, env: int) -> dict | None:
        """Advance env's frame window with transition i; its request, or None when the answer is
        known without a model (privileged detector, no critical object: no dynamic term)."""
        from ..bev.renderer import masks_to_rgb

        b = ctx.batch
        privileged_gate = self.detector_kind == "privileged"  # (then the reasoner is a model)
        frame = ctx.frame(i)
        img = frame.get("rgb")
        if img is None:
            img = masks_to_rgb(frame["bev"])
        win = self._window.setdefault(env, [])
        win.append(img)
        del win[:-WINDOW]
        if privileged_gate and not float(b["critical_count"][i]) > 0:
            return None
        return {"frames": list(win), "gate": 1 if privileged_gate else -1, "risk": int(b["risk_id"][i])}

    def prepare(self, ctx: LabelContext) -> dict[str, np.ndarray]:
        if not self.models_in_prepare:
            return {}
        slots = np.asarray(ctx.slots, np.int64)
        n = len(slots)
        live = set(slots.tolist())
        for table in (self._results, self._unsent, self._inflight):  # labelled since: forget
            for s in [s for s in table if s not in live]:
                del table[s]
        envs = np.asarray(ctx.batch.get("env", np.zeros(n)), np.int64)
        done = np.asarray(ctx.batch.get("done", np.zeros(n)))
        new = []
        for i, s in enumerate(slots.tolist()):
            if s in self._results or s in self._unsent or s in self._inflight:
                continue  # seen in an earlier round: its answer is known or on its way
            req = self._request(ctx, i, int(envs[i]))
            if req is None:
                self._results[s] = (0, -1, False)
            else:
                new.append((s, req))
            if done[i]:
                self._window.pop(int(envs[i]), None)
        if self._service_cfg is None:
            self._run_inline(new)
        else:
            self._unsent.update(new)
            self._exchange(ctx.timeout)
        k = next((i for i, s in enumerate(slots.tolist()) if s not in self._results), n)
        ctx.limit(k)
        gates, risks = np.zeros(n, np.int8), np.full(n, -1, np.int16)
        for i, s in enumerate(slots[:k].tolist()):
            gates[i], risks[i] = self._results[s][:2]
        return {"dyn_gate": gates, "dyn_risk": risks}

    def _store(self, slots, answers) -> None:
        for s, (g, r, unmatched) in zip(slots, answers):
            self._results[int(s)] = (int(g), int(r), bool(unmatched))
            self.unmatched += int(bool(unmatched))

    def _run_inline(self, items) -> None:
        if not items:
            return
        if self._label_fn is None:
            self._label_fn = self.labeller()()
        self._store([s for s, _ in items], self._label_fn([r for _, r in items]))

    def _exchange(self, timeout: float | None) -> None:
        """Send what is unsent (no blocking: what does not fit waits), collect answers; with
        ``timeout`` None, until every transition seen has its answer."""
        from ..reward_service import RewardServiceDead, RewardWorkerError

        limit = self._service_cfg["wait_s"]
        t0 = time.monotonic()
        while True:
            try:
                svc = self.service()
                if self._unsent:
                    ids = list(self._unsent)
                    room = max(svc.max_pending - svc.in_flight, 0)
                    ids = ids[:room]
                    if ids:
                        m = svc.submit(np.asarray(ids, np.int64), [self._unsent[s] for s in ids], block=False)
                        for s in ids[:m]:
                            self._inflight[s] = self._unsent.pop(s)
                wait = 0.5 if timeout is None else float(timeout)
                got, answers = svc.poll(wait if self._inflight else 0.0)
                got = [int(s) for s in np.asarray(got).tolist()]
                keep = [(s, a) for s, a in zip(got, answers) if self._inflight.pop(s, None) is not None]
                self._store([s for s, _ in keep], [a for _, a in keep])
                self.labelled_remote += len(keep)
            except RewardWorkerError as err:  # that batch only: ask again
                for s in np.asarray(err.ids).tolist():
                    if int(s) in self._inflight:
                        self._unsent[int(s)] = self._inflight.pop(int(s))
                self.service_errors += 1
                if self.service_errors == 1:
                    warnings.warn(f"DriveVLM-RL's model worker failed a batch ({err}); its requests are "
                                  f"sent again (counted in drivevlm/service_errors)", UserWarning, stacklevel=3)
            except RewardServiceDead as err:  # no worker: run the models inline from now on
                warnings.warn(f"DriveVLM-RL's model worker died ({err}); running the detector and "
                              f"reasoner inline from now on", UserWarning, stacklevel=3)
                self.close()
                self._service_cfg = None
                items = list(self._unsent.items())
                self._unsent.clear()
                self._run_inline(items)
                return
            if timeout is not None or not (self._unsent or self._inflight):
                return
            if time.monotonic() - t0 > limit:
                raise TimeoutError(f"DriveVLM-RL's model worker answered none of {len(self._inflight)} "
                                   f"requests in {limit} s (algo.reward_service.wait_s); its stats: "
                                   f"{self._service.stats() if self._service else 'not started'}")

    def stats(self) -> dict[str, float]:
        out = {"drivevlm/gate_rate": self.gated / max(self.seen, 1),
               "drivevlm/first_view": self.first_view / max(self.seen, 1),
               "drivevlm/unmatched_descriptions": self.unmatched}
        if self._service_cfg is not None:
            out.update({"drivevlm/service_errors": self.service_errors,
                        "drivevlm/in_service": len(self._inflight) + len(self._unsent)})
        return out

    def __getstate__(self):
        state = super().__getstate__()
        state["_label_fn"] = state["_service"] = None
        for k in ("_window", "_results", "_unsent", "_inflight"):
            state[k] = {}
        return state


def drivevlm_rl(rho: float = 1.0, progress_weight: float = 1.0, failure_penalty: float = -10.0,
                positive: str = VLMRL_POSITIVE, negative: str = VLMRL_NEGATIVE, alpha: float = 0.5,
                beta: float = 0.5, theta_min: float | None = None,
                theta_max: float | None = None, v_max_kmh: float = 25.0,
                max_offset: float = 3.0, max_angle: float = math.pi / 2, max_oscillation: float = 0.4,
                detector: str = "privileged", reasoner: str = "privileged",
                detector_kwargs: dict | None = None, reasoner_kwargs: dict | None = None) -> Composite:
    """DriveVLM-RL: task (collision/failure penalty, progress) + rho R_synth over the combined
    static + dynamic pathways (parts ``task`` and ``synth``)."""
    _finite(rho=rho)
    synth = DriveVLMSynth(positive, negative, alpha, beta, theta_min, theta_max, v_max_kmh, max_offset,
                          max_angle, max_oscillation, detector, reasoner, detector_kwargs, reasoner_kwargs)
    r = Composite({"task": (1.0, Task(progress_weight, failure_penalty)), "synth": (float(rho), synth)},
                  name="drivevlm_rl")
    return r
