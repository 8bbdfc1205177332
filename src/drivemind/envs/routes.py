"""Fixed evaluation routes: 10 per town, seeded, stored in a JSON file so that every method is
tested on the same routes.

A file records each route's start and goal as OpenDRIVE lane keys ``(road, section, lane)`` plus
arc length (stable for a given .xodr) and the map's fingerprint; loading re-plans the routes with
A* and refuses a file made for a different map. Files for the towns we can load are shipped in
``drivemind/envs/routes/``; for any other town the first evaluation writes one to the user cache
(``$DRIVEMIND_CACHE`` or ``~/.cache/drivemind``) and says where.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from ..maps.roadmap import RoadMap
from ..paths import cache_dir, write_text_atomic
from ..maps.routing import LANE_CHANGES, Route, RouteError, plan_route, random_route

log = logging.getLogger(__name__)

SHIPPED = Path(__file__).resolve().parent / "routes"
N_ROUTES, SEED, MIN_LENGTH, MAX_LENGTH = 10, 0, 150.0, 3000.0
# checkpoint selection's validation routes (drivemind.training.selection): another route seed and
# other traffic seeds than the fixed evaluation routes (route i runs with traffic VALIDATION_TRAFFIC_SEED + i)
VALIDATION_SEED, VALIDATION_TRAFFIC_SEED = 1, 1000


def map_fingerprint(rm: RoadMap) -> str:
    h = hashlib.sha1()
    for key, length in zip(rm.keys, rm.length):
        h.update(f"{key}:{length:.2f};".encode())
    return h.hexdigest()[:16]


def make_fixed_routes(rm: RoadMap, n: int = N_ROUTES, seed: int = SEED, *,
                      min_length: float = MIN_LENGTH, max_length: float = MAX_LENGTH) -> dict:
    """``n`` distinct random A* routes between spawn points (seeded), as a JSON-ready dict."""
    if n < 1:
        raise ValueError(f"number of routes must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    routes, seen = [], set()
    for _ in range(50 * n):
        if len(routes) == n:
            break
        r = random_route(rm, rng, min_length=min_length, max_length=max_length)
        (l0, s0, _), (l1, _, s1) = r.segments[0], r.segments[-1]
        ident = (l0, round(s0, 1), l1, round(s1, 1))
        if ident in seen:
            continue
        seen.add(ident)
        routes.append({"start": {"lane": list(rm.keys[l0]), "s": round(float(s0), 3)},
                       "goal": {"lane": list(rm.keys[l1]), "s": round(float(s1), 3)},
                       "length_m": round(r.length, 1),
                       "start_xy": [round(float(v), 2) for v in r.pts[0]],
                       "goal_xy": [round(float(v), 2) for v in r.pts[-1]]})
    if len(routes) < n:
        raise RouteError(f"map {rm.name!r} gave only {len(routes)} distinct routes of "
                         f"{min_length:.0f}-{max_length:.0f} m; asked for {n}")
    return {"town": rm.name, "map_fingerprint": map_fingerprint(rm), "seed": seed, "n": n,
            "lane_changes": "spread", "routes": routes}


def _ident(r: dict) -> tuple:
    return (tuple(r["start"]["lane"]), r["start"]["s"], tuple(r["goal"]["lane"]), r["goal"]["s"])


def make_validation_routes(rm: RoadMap, n: int = N_ROUTES, exclude: dict | None = None) -> dict:
    """``n`` seeded routes for checkpoint selection (``VALIDATION_SEED``), none of them one of
    ``exclude``'s (the town's fixed evaluation routes): a policy is selected on other routes than
    the ones it is reported on. A clear error when the map has too few distinct routes."""
    if n < 1:
        raise ValueError(f"number of validation routes must be >= 1, got {n}")
    taken = {_ident(r) for r in (exclude or {}).get("routes", [])}
    want = n + len(taken)
    try:
        spec = make_fixed_routes(rm, want, seed=VALIDATION_SEED)
    except RouteError as exc:
        raise RouteError(f"map {rm.name!r} has too few distinct routes for {n} validation route{'s' * (n != 1)} "
                         f"apart from its {len(taken)} evaluation routes ({exc}); ask for fewer "
                         f"(validation.routes=<n>)") from None
    spec["routes"] = [r for r in spec["routes"] if _ident(r) not in taken][:n]
    return {**spec, "n": n, "purpose": "validation (checkpoint selection)"}


def routes_from_spec(rm: RoadMap, spec: dict, source: str = "route file") -> list[Route]:
    fp = map_fingerprint(rm)
    if spec.get("map_fingerprint") != fp:
        raise ValueError(f"{source} was made for map {spec.get('town')!r} with fingerprint "
                         f"{spec.get('map_fingerprint')}, but the loaded map {rm.name!r} has "
                         f"{fp}; regenerate it with `python scripts/make_routes.py --town "
                         f"{rm.name} --out <file>`")
    # where the routes change lanes: as when the file was written (a file from before the key
    # existed was drawn with 'middle'), so that a route file always gives the same polylines
    lc = spec.get("lane_changes", "middle")
    if lc not in LANE_CHANGES:
        raise ValueError(f"{source}: lane_changes must be one of {', '.join(LANE_CHANGES)}; got "
                         f"{lc!r}")
    out = []
    for i, r in enumerate(spec["routes"]):
        try:
            a = rm.key_index[tuple(r["start"]["lane"])]
            b = rm.key_index[tuple(r["goal"]["lane"])]
        except KeyError as exc:
            raise ValueError(f"{source}: route {i} names lane {exc.args[0]} which map "
                             f"{rm.name!r} does not have") from None
        out.append(plan_route(rm, (a, r["start"]["s"]), (b, r["goal"]["s"]), lane_changes=lc))
    return out


def eval_routes(rm: RoadMap, path: str | os.PathLike | None = None) -> tuple[list[Route], Path]:
    """The fixed routes of ``rm``: from ``path`` if given (created there if missing), else the
    shipped file for the town, else a file in the user cache (created on first use)."""
    if path is not None:
        p = Path(path)
        if not p.exists():
            write_routes(make_fixed_routes(rm), p)
            log.warning("wrote %d fixed evaluation routes for %s to %s", N_ROUTES, rm.name, p)
    else:
        p = SHIPPED / f"{rm.name}.json"
        if not p.exists() or _fingerprint_of(p) != map_fingerprint(rm):
            p = cache_dir() / "routes" / f"{rm.name}-{map_fingerprint(rm)}.json"
            if not p.exists():
                write_routes(make_fixed_routes(rm), p)
                log.warning("wrote %d fixed evaluation routes for %s to %s (keep this file to "
                            "evaluate every method on the same routes)", N_ROUTES, rm.name, p)
    try:
        spec = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read route file {p}: {exc}") from exc
    return routes_from_spec(rm, spec, str(p)), p


def _fingerprint_of(p: Path):
    try:
        return json.loads(p.read_text()).get("map_fingerprint")
    except (OSError, json.JSONDecodeError):
        return None


def write_routes(spec: dict, path: str | os.PathLike) -> Path:
    """Write a route file whole (:func:`drivemind.paths.write_text_atomic`): processes creating
    the same cache file at once (parallel evaluations, test workers) each replace it whole."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(p, json.dumps(spec, indent=1) + "\n")
