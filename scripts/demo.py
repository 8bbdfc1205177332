#!/usr/bin/env python
"""Simulator demo: an autopilot ego drives random routes through traffic on the embedded simulator;
writes an animated GIF and a PNG strip of the whole town.

    python scripts/demo.py                       # built-in 'grid' town, DriveVLM-RL traffic mix
    python scripts/demo.py --town Town02 --density dense --seconds 120
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from drivemind.maps import load_town  # noqa: E402
from drivemind.sim import density_config  # noqa: E402
from drivemind.maps.routing import RouteError  # noqa: E402
from drivemind.sim.autopilot import autopilot_episode  # noqa: E402
from drivemind.viz import TopDown, strip  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--town", default="grid", help="built-in town, CARLA town name on the map path, or .xodr file")
    ap.add_argument("--density", default="drivevlm", help="empty | regular | dense | drivevlm")
    ap.add_argument("--seconds", type=float, default=60.0, help="simulated seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="outputs/demo", help="output folder")
    ap.add_argument("--size", type=int, default=384, help="picture size in pixels")
    ap.add_argument("--fps", type=int, default=10, help="GIF frames per simulated second (<= 10)")
    args = ap.parse_args(argv)

    rm = load_town(args.town)
    world, rng, snap, pilot = autopilot_episode(rm, density_config(args.density), args.seed,
                                                max_length=1500)
    view = TopDown(rm, size=args.size)
    steps = int(round(args.seconds / world.cfg.dt))
    every = max(1, int(round(1.0 / (args.fps * world.cfg.dt))))
    frames, routes_done, collisions = [], 0, 0
    t0 = time.perf_counter()
    waiting = False  # at an open road end, until a start clear of traffic is found
    for k in range(steps):
        snap = world.step(pilot.act(snap) if not waiting else (0.0, -1.0))
        collisions += len(snap.collisions)
        if not waiting and pilot.done:
            routes_done += 1
            try:
                pilot.new_route_from(rng, snap.ego.x, snap.ego.y, max_length=1500)
            except RouteError:
                waiting = True
        if waiting and k % 10 == 0 and pilot.restart_elsewhere(world, rng):
            waiting = False
        if k % every == 0:
            title = f"{rm.name} {args.density}  t={snap.time:5.1f}s  v={snap.ego.speed * 3.6:4.1f} km/h"
            frames.append(view.frame(snap, pilot.route, title))
    wall = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gif = out / "demo.gif"
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=int(1000 / args.fps), loop=0)
    picks = [frames[int(i)] for i in np.linspace(0, len(frames) - 1, min(8, len(frames)))]
    png = out / "strip.png"
    strip(picks, cols=4).save(png)
    result = {"town": rm.name, "density": args.density, "simulated_s": round(steps * world.cfg.dt, 1),
              "wall_s": round(wall, 2), "routes_completed": routes_done, "ego_collisions": collisions,
              "npc_collisions": world.npc_collision_total, **world.spawned, "gif": str(gif), "png": str(png)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
