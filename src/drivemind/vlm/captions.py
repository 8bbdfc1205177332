"""Captions of simulator ground truth: what the BEV image tower is aligned to.

``caption(info)`` turns one step's facts (``drivemind.envs.FACT_KEYS``) into a sentence made of
fixed clauses, in this order: the car's state (speed + lane position), the way ahead (lead
vehicle or an imminent crash), the traffic light, and the collision outcome. With an ``rng`` the
clauses are drawn from paraphrases (for training); without one the canonical wording is used
(for evaluation, so that equal situations give equal captions).

The vocabulary (``VOCABULARY``) covers DriveMind's static prompts' situations: "the car is
about to crash" (a lead object closing within ~1.5 s) and "no collisions occur" (clear road,
no contact).
"""

from __future__ import annotations

import math

# thresholds (documented in docs/vlm.md)
STOPPED_KMH, SLOW_KMH, FAST_KMH = 2.0, 20.0, 40.0
CENTRE_M, OFF_LANE_M = 0.5, 1.5  # |lateral offset| bands
LEAD_CLOSE_M, LEAD_AHEAD_M = 10.0, 25.0  # within the 96 px (38.4 m) window's ~30 m ahead
CRASH_TTC_S = 1.5
LIGHT_NEAR_M = 30.0

SPEED = {
    "stopped": ["the car is stopped", "the car is standing still"],
    "slow": ["the car drives slowly", "the car moves at low speed"],
    "moderate": ["the car drives at moderate speed", "the car moves at a moderate pace"],
    "fast": ["the car drives fast", "the car moves at high speed"],
}
LANE = {
    "centre": ["in the centre of its lane", "in the middle of its lane"],
    "left": ["drifting to the left of its lane", "off-centre towards the left"],
    "right": ["drifting to the right of its lane", "off-centre towards the right"],
    "off_left": ["leaving its lane to the left", "far out of its lane on the left"],
    "off_right": ["leaving its lane to the right", "far out of its lane on the right"],
}
AHEAD = {
    "crash": ["the car is about to crash into the vehicle ahead",
              "the car is about to hit the vehicle in front"],
    "close": ["a vehicle is close ahead", "another car is right in front"],
    "ahead": ["a vehicle is ahead at a distance", "there is a car further ahead"],
    "clear": ["the road ahead is clear", "the way ahead is free of traffic"],
}
LIGHT = {
    "none": [""],
    "green": ["the light ahead is green", "the traffic light ahead shows green"],
    "yellow": ["the light ahead is yellow", "the traffic light ahead turns yellow"],
    "red": ["the light ahead is red", "the traffic light ahead shows red"],
}
COLLISION = {
    "none": ["no collisions occur", "nothing is hit"],
    "vehicle": ["the car has crashed into another vehicle", "two vehicles have collided"],
    "walker": ["the car has hit a pedestrian", "a pedestrian was struck by the car"],
    "cyclist": ["the car has hit a cyclist", "a rider was struck by the car"],
    "static": ["the car has driven off the road into an obstacle",
               "the car has crashed into the roadside"],
}
# ActorClass: 1 car, 2 motorcycle, 3 bicycle, 4 walker, 5 static
_COLLISION_CLASS = {1: "vehicle", 2: "cyclist", 3: "cyclist", 4: "walker", 5: "static"}

VOCABULARY = {"speed": SPEED, "lane": LANE, "ahead": AHEAD, "light": LIGHT,
              "collision": COLLISION}


def _f(info: dict, key: str, default: float) -> float:
    v = info.get(key, default)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def situation(info: dict) -> dict[str, str]:
    """The discrete situation behind a caption: one key of each table in ``VOCABULARY``."""
    speed = _f(info, "speed_kmh", 0.0)
    if speed < STOPPED_KMH:
        s = "stopped"
    elif speed < SLOW_KMH:
        s = "slow"
    elif speed < FAST_KMH:
        s = "moderate"
    else:
        s = "fast"
    lat = _f(info, "lateral_offset", 0.0)  # + right (CARLA frame)
    side = "right" if lat > 0 else "left"
    lane = "centre" if abs(lat) < CENTRE_M else (side if abs(lat) < OFF_LANE_M else f"off_{side}")
    gap = _f(info, "lead_distance", math.inf)
    closing = (speed - _f(info, "lead_speed_kmh", 0.0)) / 3.6  # m/s
    if gap < LEAD_CLOSE_M and closing > 0.5 and gap / closing < CRASH_TTC_S:
        ahead = "crash"
    elif gap < LEAD_CLOSE_M:
        ahead = "close"
    elif gap < LEAD_AHEAD_M:
        ahead = "ahead"
    else:
        ahead = "clear"
    ls = int(round(_f(info, "light_state", -1.0)))
    light = "none"
    if ls in (0, 1, 2) and _f(info, "light_distance", math.inf) <= LIGHT_NEAR_M:
        light = ("green", "yellow", "red")[ls]
    coll = "none"
    if _f(info, "offroad", 0.0) > 0:
        coll = "static"
    elif _f(info, "collision", 0.0) > 0:
        coll = _COLLISION_CLASS.get(int(round(_f(info, "collision_class", 1.0))), "vehicle")
    return {"speed": s, "lane": lane, "ahead": ahead, "light": light, "collision": coll}


def caption(info: dict, rng=None) -> str:
    """One sentence for one step's facts; ``rng`` (``numpy.random.Generator``) picks paraphrases."""
    return describe(situation(info), rng)


def describe(sit: dict[str, str], rng=None) -> str:
    """The caption of a situation (one key of each ``VOCABULARY`` table), as ``caption`` writes it."""
    for k, table in VOCABULARY.items():
        if sit.get(k) not in table:
            raise ValueError(f"situation[{k!r}] must be one of {sorted(table)}, got {sit.get(k)!r}")

    def pick(table, key):
        opts = table[key]
        return opts[0] if rng is None else opts[int(rng.integers(len(opts)))]

    parts = [f"{pick(SPEED, sit['speed'])} {pick(LANE, sit['lane'])}", pick(AHEAD, sit["ahead"])]
    light = pick(LIGHT, sit["light"])
    if light:
        parts.append(light)
    parts.append(pick(COLLISION, sit["collision"]))
    return "; ".join(parts)


def caption_vocabulary() -> list[str]:
    """Every clause the captions can contain (canonical and paraphrased)."""
    return [p for table in VOCABULARY.values() for opts in table.values() for p in opts if p]
