#!/usr/bin/env python
"""Write a video of an autopilot rollout in the Gymnasium env: the colour BEV the agent's masks are
drawn from, with the per-step facts written on it, and optionally the 15 masks beside it.

    python scripts/render_rollout.py                                   # grid town, GIF
    python scripts/render_rollout.py --town Town02 --density regular --seconds 60 --out run.mp4
    python scripts/render_rollout.py --masks --out outputs/rollout.gif

MP4 needs imageio-ffmpeg (pip install -e ".[video]"); GIF needs nothing extra.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from drivemind.evaluation.video import (  # noqa: E402  (after the path insert)
    VideoWriter,
    check_video_path,
    mask_panel,  # noqa: F401  (re-exported: tests size the panel through this module)
    render_frame,
)


def main(argv=None) -> dict:
    import gymnasium as gym

    import drivemind  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--town", default="grid")
    ap.add_argument("--density", default="regular")
    ap.add_argument("--seconds", type=float, default=30.0, help="simulated seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=int, default=2, help="upscale of the 224 px colour view")
    ap.add_argument("--masks", action="store_true", help="show the agent's mask planes beside it")
    ap.add_argument("--out", default="outputs/rollout.gif", help=".gif or .mp4")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.suffix.lower() not in (".gif", ".mp4"):
        ap.error(f"--out must end in .gif or .mp4, got {out.name!r}")
    try:
        check_video_path(out)
    except ImportError as e:
        ap.error(str(e))

    env = gym.make("DriveMind-v0", town=args.town, density=args.density, render_mode="rgb_array")
    u = env.unwrapped
    obs, info = env.reset(seed=args.seed)
    writer = VideoWriter(out, fps=1 / u.sim_cfg.dt)
    ends = []
    steps = int(round(args.seconds / u.sim_cfg.dt))
    for t in range(steps):
        obs, r, term, trunc, info = env.step(u.expert_action())
        writer.append(render_frame(env.render(), info, obs["bev"] if args.masks else None, args.scale))
        if term or trunc:
            ends.append(info["termination"] or info["truncation"])
            obs, info = env.reset()
    env.close()
    writer.close()
    result = {"out": str(out), "frames": writer.frames, "town": u.map.name, "density": args.density,
              "routes_completed": int(info["routes_completed"]), "episode_ends": ends}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
