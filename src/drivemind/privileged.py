"""Privileged (ground-truth) stand-ins of DriveVLM-RL's dynamic pathway, below both the env and
``drivemind.vlm``: the env computes its ``critical_count`` and ``risk_id`` facts with them
(:class:`CriticalFacts`) without importing any VLM module, and ``drivemind.vlm.detectors`` /
``drivemind.vlm.reasoners`` present them beside the model-backed detector and reasoner.

- ``PrivilegedDetector`` (a **stand-in for YOLOv8**): ground-truth actors of a ``WorldSnapshot``
  inside a forward field of view of the ego, mapped to COCO names.
- ``PrivilegedReasoner`` (a **stand-in for the LVLM**): the canonical risk description
  (``RISK_VOCABULARY``) of the most critical detection, by fixed rules.
- ``gate(detections)``: True when any detection is one of DriveVLM-RL's critical classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .sim.snapshot import ActorClass, WorldSnapshot

# DriveVLM-RL's critical classes (COCO names)
CRITICAL_CLASSES = frozenset({"person", "bicycle", "motorcycle", "dog", "horse", "sheep", "cow",
                              "elephant", "bear", "zebra", "giraffe"})
# simulator actor class -> COCO name (classes without an entry are never reported)
ACTOR_COCO = {ActorClass.WALKER: "person", ActorClass.BICYCLE: "bicycle",
              ActorClass.MOTORCYCLE: "motorcycle", ActorClass.CAR: "car"}


@dataclass(frozen=True)
class Detection:
    """One detected object. ``box`` is (x1, y1, x2, y2): pixels of the input frame for image
    detectors (``frame="image"``); for the privileged detector (``frame="ego"``) the actor's
    box in the ego frame in metres (x forward, y to the right, CARLA's convention)."""

    cls: str  # COCO class name
    score: float
    box: tuple[float, float, float, float]
    frame: str = "image"
    distance: float | None = None  # m from the ego's centre (privileged only)
    actor_id: int | None = None  # snapshot actor id (privileged only)

    @property
    def critical(self) -> bool:
        return self.cls in CRITICAL_CLASSES


def gate(detections, classes=CRITICAL_CLASSES) -> bool:
    """True when any detection is one of ``classes`` (default: DriveVLM-RL's critical set)."""
    return any(d.cls in classes for d in detections)


# ---------------------------------------------------------------------- privileged stand-in
class PrivilegedDetector:
    """Stand-in for YOLOv8 (named so in logs and configs): the snapshot's actors whose box is
    inside a forward cone of ``fov_deg`` and within ``max_range`` metres of the ego's centre.
    An actor counts as inside when its angular extent seen from the ego overlaps the cone (a
    car half in view is seen). No occlusion: actors behind others are still reported."""

    name = "privileged"
    needs = "snapshot"
    stand_in_for = "YOLOv8 (ultralytics)"

    def __init__(self, fov_deg: float = 90.0, max_range: float = 50.0):
        fov, rng = float(fov_deg), float(max_range)
        if not (0.0 < fov <= 360.0):
            raise ValueError(f"fov_deg must be in (0, 360], got {fov_deg!r}")
        if not (math.isfinite(rng) and rng > 0.0):
            raise ValueError(f"max_range must be a positive number of metres, got {max_range!r}")
        self.fov_deg, self.max_range = fov, rng

    def detect(self, snapshot: WorldSnapshot) -> list[Detection]:
        if not isinstance(snapshot, WorldSnapshot):
            raise TypeError(f"PrivilegedDetector reads a WorldSnapshot, got {type(snapshot).__name__}")
        a, e = snapshot.actors, snapshot.ego
        if not len(a):
            return []
        c, s = math.cos(e.yaw), math.sin(e.yaw)
        d = np.asarray(a.pos, float) - (e.x, e.y)
        fwd = d[:, 0] * c + d[:, 1] * s
        right = -d[:, 0] * s + d[:, 1] * c
        dist = np.hypot(fwd, right)
        radius = np.hypot(a.extent[:, 0], a.extent[:, 1])  # bounding circle of the box
        bearing = np.abs(np.arctan2(right, fwd))
        half = np.arcsin(np.clip(radius / np.maximum(dist, 1e-6), 0.0, 1.0))
        seen = (dist - radius <= self.max_range) & (bearing - half <= math.radians(self.fov_deg) / 2)
        out = []
        for i in np.flatnonzero(seen):
            name = ACTOR_COCO.get(ActorClass(int(a.cls[i])))
            if name is None:
                continue
            # the actor's box corners in the ego frame
            rel = float(a.yaw[i]) - e.yaw
            cr, sr = math.cos(rel), math.sin(rel)
            hl, hw = float(a.extent[i, 0]), float(a.extent[i, 1])
            cx = np.array([hl, hl, -hl, -hl]) * cr - np.array([hw, -hw, hw, -hw]) * sr + fwd[i]
            cy = np.array([hl, hl, -hl, -hl]) * sr + np.array([hw, -hw, hw, -hw]) * cr + right[i]
            out.append(Detection(name, 1.0, (float(cx.min()), float(cy.min()), float(cx.max()),
                                             float(cy.max())), "ego", float(dist[i]), int(a.id[i])))
        out.sort(key=lambda det: det.distance)
        return out

    def detect_batch(self, snapshots) -> list[list[Detection]]:
        return [self.detect(s) for s in snapshots]

    __call__ = detect

    def __repr__(self) -> str:
        return (f"PrivilegedDetector(fov_deg={self.fov_deg}, max_range={self.max_range}; "
                f"stand-in for {self.stand_in_for})")


# ------------------------------------------------------------------ privileged reasoner
RISK_VOCABULARY = (
    "a pedestrian is crossing the road ahead",
    "a pedestrian is walking at the roadside ahead",
    "a group of pedestrians is near the road ahead",
    "a cyclist is merging into the ego lane",
    "a cyclist is riding ahead in the ego lane",
    "a motorcycle is close ahead in the ego lane",
    "a motorcycle is approaching from the side",
    "an animal is on the road ahead",
    "a road user is dangerously close to the car",
    "the road ahead is clear of pedestrians and cyclists",
)
(PED_CROSSING, PED_ROADSIDE, PED_GROUP, CYC_MERGING, CYC_AHEAD, MOTO_AHEAD, MOTO_SIDE, ANIMAL,
 TOO_CLOSE, CLEAR) = RISK_VOCABULARY
ANIMALS = frozenset({"dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe"})
VULNERABLE = frozenset({"person", "bicycle", "motorcycle"}) | ANIMALS


def _positive(name, v):
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive number, got {v!r}")


def _get(d, *keys, default=None):
    for k in keys:
        if isinstance(d, dict):
            if k in d:
                return d[k]
        elif hasattr(d, k):
            return getattr(d, k)
    return default


def detection_record(d) -> dict:
    """A plain record of one detection: cls, score, box, frame, distance."""
    cls = _get(d, "cls", "name", "class")
    if not isinstance(cls, str) or not cls:
        raise ValueError(f"a detection needs a class name ('cls' or 'name'), got {d!r}")
    score = _get(d, "score", "confidence", default=1.0)
    try:
        score = float(score)
    except (TypeError, ValueError):
        raise ValueError(f"detection score must be a number, got {score!r} in {d!r}") from None
    box = _get(d, "box")
    if box is not None:
        box = tuple(float(v) for v in box)
        if len(box) != 4 or not all(math.isfinite(v) for v in box):
            box = None
    dist = _get(d, "distance")
    dist = float(dist) if isinstance(dist, (int, float)) and math.isfinite(dist) else None
    return {"cls": cls.lower(), "score": score if math.isfinite(score) else 0.0, "box": box,
            "frame": _get(d, "frame", default="image" if box is not None else None), "distance": dist}


class PrivilegedReasoner:
    """Stand-in for the LVLM (Qwen3-VL-4B in the paper), named so in configs and logs: the
    canonical description of the most critical detection, by rule.

    Zones (ego-frame boxes, metres): *in lane* when the box overlaps the corridor |y| <=
    ``lane_half_width``, *near* when it overlaps |y| <= ``lane_half_width + margin``, else
    *side*; image-frame boxes use the box centre's horizontal position (middle 30 % in lane,
    middle 60 % near) and treat a box reaching the bottom 10 % and over half the frame's height
    as close. A box within ``close_m`` metres in or near the lane gives "a road user is
    dangerously close to the car". Otherwise the most critical detection (in lane > near > side,
    then nearest) decides: person -> crossing (in lane) or roadside, three or more persons -> a
    group; bicycle -> riding ahead (in lane) or merging; motorcycle -> close ahead (in lane) or
    approaching from the side; an animal -> on the road. Detections below ``min_score`` or not in
    the vulnerable classes are ignored; none left -> the road is clear."""

    name = "privileged"
    stand_in = True
    stand_in_for = "Qwen3-VL-4B (DriveVLM-RL's LVLM)"

    def __init__(self, lane_half_width: float = 1.75, margin: float = 2.0, close_m: float = 5.0,
                 min_score: float = 0.25):
        for n, v in (("lane_half_width", lane_half_width), ("margin", margin), ("close_m", close_m)):
            _positive(n, v)
        if not (isinstance(min_score, (int, float)) and 0.0 <= min_score <= 1.0):
            raise ValueError(f"min_score must be in [0, 1], got {min_score!r}")
        self.lane_half_width, self.margin = float(lane_half_width), float(margin)
        self.close_m, self.min_score = float(close_m), float(min_score)
        self.vocabulary = RISK_VOCABULARY

    def _zone(self, r, image_shape):
        """(zone rank: 0 in lane, 1 near, 2 side; distance or None; close)"""
        b = r["box"]
        if b is None:
            return 0, r["distance"], False  # position unknown: the detector saw it ahead
        if r["frame"] == "ego":
            lo, hi = min(b[1], b[3]), max(b[1], b[3])
            gap = 0.0 if lo <= 0.0 <= hi else min(abs(lo), abs(hi))
            zone = 0 if gap <= self.lane_half_width else 1 if gap <= self.lane_half_width + self.margin else 2
            ahead = max(min(b[0], b[2]), 0.0)
            dist = r["distance"] if r["distance"] is not None else math.hypot(ahead, gap)
            return zone, dist, zone <= 1 and ahead <= self.close_m
        if image_shape is None:
            return 0, None, False
        h, w = image_shape[:2]
        off = abs(0.5 * (b[0] + b[2]) / w - 0.5)
        zone = 0 if off <= 0.15 else 1 if off <= 0.30 else 2
        close = b[3] / h >= 0.9 and (b[3] - b[1]) / h >= 0.5
        return zone, None, zone <= 1 and close

    def choose(self, detections, image_shape=None) -> str:
        recs = [detection_record(d) for d in detections]
        recs = [r for r in recs if r["score"] >= self.min_score and r["cls"] in VULNERABLE]
        if not recs:
            return CLEAR
        scored = [(r, *self._zone(r, image_shape)) for r in recs]
        if any(close for *_, close in scored):
            return TOO_CLOSE
        r, zone, _, _ = min(scored, key=lambda t: (t[1], t[2] if t[2] is not None else math.inf))
        c = r["cls"]
        if c in ANIMALS:
            return ANIMAL
        if c == "person":
            if sum(1 for x in recs if x["cls"] == "person") >= 3:
                return PED_GROUP
            return PED_CROSSING if zone == 0 else PED_ROADSIDE
        if c == "bicycle":
            return CYC_AHEAD if zone == 0 else CYC_MERGING
        return MOTO_AHEAD if zone == 0 else MOTO_SIDE

    def describe(self, frames, detections) -> str:
        shape = None
        if frames is not None and len(frames):
            last = np.asarray(frames[-1])
            shape = last.shape if last.ndim == 3 and last.shape[-1] == 3 else None
        return self.choose(detections, shape)

    def __repr__(self) -> str:
        return f"PrivilegedReasoner(stand-in for {self.stand_in_for})"


class CriticalFacts:
    """The env's ``critical_count`` and ``risk_id`` facts from a snapshot: the number of
    critical-class detections of the privileged detector when its gate fires (else 0) and the
    privileged reasoner's risk description as an index into ``RISK_VOCABULARY`` (-1: gate shut)."""

    def __init__(self):
        self.detector, self.reasoner = PrivilegedDetector(), PrivilegedReasoner()
        self._index = {t: i for i, t in enumerate(RISK_VOCABULARY)}

    def __call__(self, snapshot: WorldSnapshot) -> dict:
        dets = self.detector.detect(snapshot)
        n = sum(1 for d in dets if d.critical) if gate(dets) else 0
        risk = self.reasoner.choose(dets) if n else None
        return {"critical_count": float(n),
                "risk_id": float(self._index[risk]) if risk is not None else -1.0}
