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

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

LIGHTS = {-1: "-", 0: "green", 1: "yellow", 2: "red"}


def mask_panel(masks: np.ndarray, height: int) -> Image.Image:
    """The mask planes tiled in rows of 5, scaled to ``height``."""
    c, h, w = masks.shape
    cols = 5
    rows = -(-c // cols)
    tiles = np.zeros((rows * h, cols * w), np.uint8)
    for i in range(c):
        r, k = divmod(i, cols)
        tiles[r * h:(r + 1) * h, k * w:(k + 1) * w] = masks[i]
        tiles[r * h:(r + 1) * h, k * w] = 60  # tile borders
        tiles[r * h, k * w:(k + 1) * w] = 60
    img = Image.fromarray(tiles).convert("RGB")
    return img.resize((int(img.width * height / img.height), height), Image.NEAREST)


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
    if out.suffix.lower() == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            ap.error('MP4 needs imageio-ffmpeg: pip install -e ".[video]" (or write a .gif)')

    env = gym.make("DriveMind-v0", town=args.town, density=args.density, render_mode="rgb_array")
    u = env.unwrapped
    obs, info = env.reset(seed=args.seed)
    frames, ends = [], []
    steps = int(round(args.seconds / u.sim_cfg.dt))
    for t in range(steps):
        obs, r, term, trunc, info = env.step(u.expert_action())
        img = Image.fromarray(env.render())
        img = img.resize((img.width * args.scale, img.height * args.scale), Image.NEAREST)
        d = ImageDraw.Draw(img)
        d.text((6, 6), f"t={info['time']:.1f}s  {info['speed_kmh']:.0f} km/h  "
                       f"route {info['route_progress']:.0f}/{info['route_length']:.0f} m", fill=(255, 255, 0))
        d.text((6, 20), f"light {LIGHTS[int(info['light_state'])]}  lead {info['lead_distance']:.0f} m  "
                        f"routes done {int(info['routes_completed'])}", fill=(255, 255, 0))
        if args.masks:
            panel = mask_panel(obs["bev"], img.height)
            both = Image.new("RGB", (img.width + panel.width, img.height))
            both.paste(img, (0, 0))
            both.paste(panel, (img.width, 0))
            img = both
        frames.append(np.asarray(img))
        if term or trunc:
            ends.append(info["termination"] or info["truncation"])
            obs, info = env.reset()
    env.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    import imageio.v2 as imageio

    if out.suffix.lower() == ".gif":
        imageio.mimsave(out, frames, duration=1000 * u.sim_cfg.dt, loop=0)
    else:
        imageio.mimsave(out, frames, fps=round(1 / u.sim_cfg.dt))
    result = {"out": str(out), "frames": len(frames), "town": u.map.name, "density": args.density,
              "routes_completed": int(info["routes_completed"]), "episode_ends": ends}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
