#!/usr/bin/env python
"""Benchmarks. Each prints one JSON object on the last line of stdout.

    python scripts/bench.py sim --town Town02 --density dense --seconds 600

sim: the embedded simulator's world step (ego driven by the autopilot on random routes; only
     world.step is timed, after a warm-up), pinned to one core by default. Reports steps_per_s,
     npc_collisions (new contacts among background actors), actor counts, and how freely
     traffic flowed (mean NPC speed, share of NPCs stopped at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def machine() -> dict:
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def pin_one_core() -> bool:
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        return True
    except (AttributeError, OSError):
        return False


def bench_sim(args) -> dict:
    from drivemind.maps import load_town
    from drivemind.sim import density_config
    from drivemind.sim.autopilot import autopilot_episode

    pinned = pin_one_core() if args.cores == 1 else False
    rm = load_town(args.town)
    world, rng, snap, pilot = autopilot_episode(rm, density_config(args.density), args.seed)
    route = pilot.route
    for _ in range(20):  # warm-up: compiled kernels load from the cache
        snap = world.step(pilot.act(snap))
    snap = world.reset(seed=args.seed, ego_pose=route.start)
    pilot.set_route(route)
    steps = int(round(args.seconds / world.cfg.dt))
    t_world = 0.0
    npc_speed = 0.0
    ego_collisions = routes = 0
    t_all = time.perf_counter()
    for _ in range(steps):
        action = pilot.act(snap)
        t = time.perf_counter()
        snap = world.step(action)
        t_world += time.perf_counter() - t
        ego_collisions += len(snap.collisions)
        npc_speed += float(world.v_v.mean()) if len(world.v_v) else 0.0
        if pilot.done:
            routes += 1
            pilot.new_route_from(rng, snap.ego.x, snap.ego.y)
    t_all = time.perf_counter() - t_all
    return {
        "what": "sim", "town": rm.name, "density": args.density, "seed": args.seed,
        "simulated_s": round(steps * world.cfg.dt, 1), "steps": steps,
        "steps_per_s": round(steps / t_world, 1),
        "steps_per_s_with_autopilot": round(steps / t_all, 1),
        "npc_collisions": world.npc_collision_total,
        **world.spawned,
        "npc_mean_speed_kmh": round(3.6 * npc_speed / steps, 2),
        "npc_stopped_share_at_end": round(float((world.v_v < 0.1).mean()) if len(world.v_v) else 0.0, 3),
        "ego_routes_completed": routes, "ego_collisions": ego_collisions,
        "one_core": pinned, **machine(),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sim", help="embedded simulator world steps/s and background collisions")
    s.add_argument("--town", default="Town02")
    s.add_argument("--density", default="dense")
    s.add_argument("--seconds", type=float, default=600.0, help="simulated seconds")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--cores", type=int, default=1, help="1 pins the process to one core")
    args = ap.parse_args(argv)
    result = {"sim": bench_sim}[args.what](args)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
