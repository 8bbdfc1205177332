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
models in ``prepare`` on the stored frames (the BEV colour view, or the forward camera when the
backend has one; the reasoner gets the last K+1 = 4 frames of the episode) and store their
results as the columns ``dyn_gate`` / ``dyn_risk``; their descriptions are snapped to the
vocabulary by the reasoner.

**View.** The paper's dynamic pathway reads a forward camera. The embedded simulator has none, and
the replay buffer stores no camera frames yet (``CarlaBackend.front_rgb()`` exists for live use,
``drivemind.vlm.detectors.dynamic_view``), so in training v_dyn = v (the BEV embedding) on either
backend: the paper's "w/o First-View" variant. This is warned once and logged
(``drivevlm/first_view`` = 0).

**Window.** The paper's (-0.1, 0.2) belongs to its encoder; ours is set for the shipped BEV-CLIP
by ``scripts/calibrate_reward.py reward=drivevlm_rl`` (the same quantiles as VLM-RL's).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .base import Composite, LabelContext
from .contrastive import VLMRL_NEGATIVE, VLMRL_POSITIVE, VLMRLSynth, _finite
from .kinematic import Task

PAPER_WINDOW = (-0.1, 0.2)
BEVCLIP_WINDOW = (-0.24, 0.056)  # calibrated: docs/rewards.md (scripts/calibrate_reward.py)
DETECTORS = ("privileged", "yolo")
REASONERS = ("privileged", "qwen_vl", "tiny_qwen_vl")


class DriveVLMSynth(VLMRLSynth):
    """Phase I + II over the static + gated dynamic CLG (module docstring)."""

    name = "drivevlm_synth"
    needs = ("embedding", "speed_kmh", "lateral_offset", "heading_error", "lateral_oscillation",
             "critical_count", "risk_id")

    def __init__(self, positive: str = VLMRL_POSITIVE, negative: str = VLMRL_NEGATIVE,
                 alpha: float = 0.5, beta: float = 0.5, theta_min: float = BEVCLIP_WINDOW[0],
                 theta_max: float = BEVCLIP_WINDOW[1], v_max_kmh: float = 25.0,
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
        self._detector = self._reasoner = None
        self._warned_view = False
        self.gated = 0
        self.seen = 0
        self.unmatched = 0

    def prompt_texts(self):
        return (self.positive, self.negative, *self.vocabulary)

    def combined(self, batch) -> np.ndarray:
        """R_static + R_dynamic per row (what the calibration collects)."""
        c = self.cosines(batch)  # columns: l_pos, l_neg, then the vocabulary
        static = self.alpha * c[:, 0] - self.beta * c[:, 1]
        if "dyn_gate" in batch:
            g, risk = np.asarray(batch["dyn_gate"]) > 0, np.asarray(batch["dyn_risk"]).astype(np.int64)
        else:
            g, risk = np.asarray(batch["critical_count"]) > 0, np.asarray(batch["risk_id"]).astype(np.int64)
        g = g & (risk >= 0) & (risk < len(self.vocabulary))
        if not self._warned_view:
            warnings.warn("DriveVLM-RL's dynamic pathway reads the BEV embedding: the stored observations "
                          "carry no forward camera (the paper's 'w/o First-View' variant)", UserWarning,
                          stacklevel=4)
            self._warned_view = True
        rows = np.arange(len(c))
        dyn_neg = np.where(g, c[rows, 2 + np.clip(risk, 0, len(self.vocabulary) - 1)], 0.0)
        dynamic = np.where(g, self.alpha * c[:, 0] - self.beta * dyn_neg, 0.0)
        self.seen += len(g)
        self.gated += int(g.sum())
        return static + dynamic

    def clg(self, batch) -> np.ndarray:
        return self.combined(batch)

    def calibration_values(self, batch) -> np.ndarray:
        return self.combined(batch)

    # ---------------------------------------------------------------- real detector / reasoner
    def prepare(self, ctx: LabelContext) -> dict[str, np.ndarray]:
        if not self.models_in_prepare:
            return {}
        from ..bev.renderer import masks_to_rgb
        from ..vlm.detectors import build_detector, gate
        from ..vlm.reasoners import make_reasoner

        if self._detector is None:
            self._detector = build_detector({"kind": self.detector_kind, **self.detector_kwargs})
            self._reasoner = make_reasoner(self.reasoner_kind, **self.reasoner_kwargs)
            self._window: dict[int, list] = {}
        n = len(ctx.slots)
        gates, risks = np.zeros(n, np.int8), np.full(n, -1, np.int16)
        envs = np.asarray(ctx.batch.get("env", np.zeros(n)), np.int64)
        done = np.asarray(ctx.batch.get("done", np.zeros(n)))
        index = {t: i for i, t in enumerate(self.vocabulary)}
        for i in range(n):
            frame = ctx.frame(i)
            img = frame.get("rgb")
            if img is None:
                img = masks_to_rgb(frame["bev"])
            win = self._window.setdefault(int(envs[i]), [])
            win.append(img)
            del win[:-4]  # K + 1 = 4 frames
            if self.detector_kind == "privileged":  # ground truth from the env's facts
                g = float(ctx.batch["critical_count"][i]) > 0
                dets = None
            else:
                dets = self._detector.detect(img)
                g = gate(dets)
            if g:
                if self.reasoner_kind == "privileged" and dets is None:
                    r = int(ctx.batch["risk_id"][i])
                else:
                    text = self._reasoner.describe(list(win), dets or [])
                    r = index.get(text, -1)
                    if r < 0:  # outside the vocabulary: no dynamic term (counted)
                        self.unmatched += 1
                gates[i], risks[i] = 1, r
            if done[i]:
                self._window.pop(int(envs[i]), None)
        return {"dyn_gate": gates, "dyn_risk": risks}

    def stats(self) -> dict[str, float]:
        return {"drivevlm/gate_rate": self.gated / max(self.seen, 1), "drivevlm/first_view": 0.0,
                "drivevlm/unmatched_descriptions": self.unmatched}

    def __getstate__(self):
        state = super().__getstate__()
        state["_detector"] = state["_reasoner"] = None
        return state


def drivevlm_rl(rho: float = 1.0, progress_weight: float = 1.0, failure_penalty: float = -10.0,
                positive: str = VLMRL_POSITIVE, negative: str = VLMRL_NEGATIVE, alpha: float = 0.5,
                beta: float = 0.5, theta_min: float = BEVCLIP_WINDOW[0],
                theta_max: float = BEVCLIP_WINDOW[1], v_max_kmh: float = 25.0,
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
