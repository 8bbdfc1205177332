"""CARLA actors and blueprints -> our ActorClass; blueprint choice per class; spawn-point choice."""

from __future__ import annotations

import numpy as np

from ..maps.roadmap import RoadMap
from ..sim.snapshot import ActorClass

# 0.9.13 blueprints carry no base_type: two-wheelers are told apart by model
BICYCLE_MODELS = ("crossbike", "century", "omafiets")


def _attr(obj, name: str) -> str:
    """An attribute of a blueprint (``has_attribute``/``get_attribute``) or an actor
    (``attributes`` dict), as a string ('' when absent)."""
    attrs = getattr(obj, "attributes", None)
    if isinstance(attrs, dict):
        return str(attrs.get(name, ""))
    if hasattr(obj, "has_attribute") and obj.has_attribute(name):
        return str(obj.get_attribute(name).as_str())
    return ""


def actor_class(type_id: str, obj=None) -> ActorClass | None:
    """Our class of a CARLA actor or blueprint: vehicles by ``base_type`` (0.9.14+) or wheel
    count and model, walkers; anything else a collision can be with is STATIC; None for actors
    that are not obstacles (sensors, controllers, the spectator)."""
    t = str(type_id)
    if t.startswith("walker.pedestrian"):
        return ActorClass.WALKER
    if t.startswith("vehicle."):
        base = _attr(obj, "base_type").lower() if obj is not None else ""
        if base in ("bicycle", "bycicle"):  # CARLA spells it both ways
            return ActorClass.BICYCLE
        if base == "motorcycle":
            return ActorClass.MOTORCYCLE
        if base:
            return ActorClass.CAR
        wheels = _attr(obj, "number_of_wheels") if obj is not None else ""
        if wheels == "2":
            return (ActorClass.BICYCLE if any(m in t for m in BICYCLE_MODELS)
                    else ActorClass.MOTORCYCLE)
        return ActorClass.CAR
    if t.startswith(("sensor.", "controller.", "spectator")):
        return None
    return ActorClass.STATIC


def blueprints_by_class(library, vehicle_filter: str = "vehicle.*") -> dict:
    """{ActorClass: [blueprints sorted by id]} for CAR, MOTORCYCLE, BICYCLE and WALKER."""
    out = {c: [] for c in (ActorClass.CAR, ActorClass.MOTORCYCLE, ActorClass.BICYCLE,
                           ActorClass.WALKER)}
    for bp in library.filter(vehicle_filter):
        c = actor_class(bp.id, bp)
        if c in out:
            out[c].append(bp)
    out[ActorClass.WALKER] = list(library.filter("walker.pedestrian.*"))
    for c in out:
        out[c].sort(key=lambda b: b.id)
    return out


def pick_spawn_points(rm: RoadMap, rng: np.random.Generator, n: int, avoid_xy, gap: float):
    """Up to ``n`` of the RoadMap's spawn points in seeded random order, each at least ``gap`` m
    from the others and from ``avoid_xy`` (the ego) — the rule the embedded simulator uses."""
    taken = [np.asarray(avoid_xy, float)]
    chosen = []
    for idx in rng.permutation(len(rm.spawn)):
        if len(chosen) == n:
            break
        p = rm.spawn[idx, :2]
        if all(np.hypot(*(p - q)) >= gap for q in taken):
            chosen.append(int(idx))
            taken.append(p)
    return chosen
