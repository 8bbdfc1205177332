"""Pre-train the frozen BEV encoder of the fast learning path (drivemind.bev.encoder).

    python scripts/train_bev_encoder.py --bev cpu            # writes ~/.cache/drivemind/bev_encoder_cpu.pt
    python scripts/train_bev_encoder.py --bev cpu --out src/drivemind/bev/weights/bev_encoder_cpu.pt

Frames come from the expert with the frame collectors' perturbations (sim.autopilot.expert_drive;
no actions are kept or learned) on the built-in towns and Town02 (the training town of the study;
Town01, Town03 and Town05 stay unseen), at regular and dense traffic. The last 10 % of each
(town, density) drive is held out and scored. Deterministic for a seed with --threads 1.
Prints one JSON object (the held-out figures) on the last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def choose_mode(rng) -> str:
    u = rng.random()
    return "expert" if u < 0.45 else "drift" if u < 0.7 else "rush" if u < 0.9 else "brake"


def collect(town: str, density: str, steps: int, seed: int, bev, every: int = 2):
    import gymnasium as gym

    import drivemind  # noqa: F401
    from drivemind.bev.encoder import scene_targets
    from drivemind.sim.autopilot import expert_drive

    env = gym.make("DriveMind-v0", town=town, density=density, bev=bev)
    env.reset(seed=seed)
    base = env.unwrapped
    frames, regs, lights = [], [], []
    for t, obs, info in expert_drive(env, steps, np.random.default_rng(seed), choose_mode):
        if t % every == 0 or info["collision"] > 0:
            r, li = scene_targets(info, base.snapshot, base.cfg.lead_range, base.cfg.light_range)
            frames.append(obs["bev"])
            regs.append(r)
            lights.append(li)
    env.close()
    return np.stack(frames), np.stack(regs), np.asarray(lights, np.int64)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bev", default="cpu", help="BEV preset (cpu, roach, paper)")
    ap.add_argument("--towns", default="grid,curves,avenue,Town02")
    ap.add_argument("--densities", default="regular,dense")
    ap.add_argument("--steps", type=int, default=5000, help="env steps per town x density")
    ap.add_argument("--every", type=int, default=2, help="keep every n-th frame (and collisions)")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="output file (default ~/.cache/drivemind/<name>)")
    args = ap.parse_args(argv)

    import torch

    from drivemind.bev import BevConfig
    from drivemind.bev.encoder import BevEncoder, train_encoder, weights_name
    from drivemind.paths import weights_cache_dir

    torch.set_num_threads(args.threads)
    bev = BevConfig.from_dict({"preset": args.bev})
    towns = [t for t in args.towns.split(",") if t]
    dens = [d for d in args.densities.split(",") if d]
    t0 = time.perf_counter()
    parts = []
    for i, town in enumerate(towns):
        for j, d in enumerate(dens):
            f, r, li = collect(town, d, args.steps, args.seed + 1000 + 100 * i + j, bev.to_dict(), args.every)
            held = np.zeros(len(f), bool)
            held[int(0.9 * len(f)):] = True
            parts.append((f, r, li, held))
            print(f"collected {town}/{d}: {len(f)} frames", file=sys.stderr)
    frames = np.concatenate([p[0] for p in parts])
    targets = np.concatenate([p[1] for p in parts])
    lights = np.concatenate([p[2] for p in parts])
    held = np.concatenate([p[3] for p in parts])
    collect_s = time.perf_counter() - t0
    del parts
    enc, metrics = train_encoder(frames, targets, lights, dim=args.dim, epochs=args.epochs, seed=args.seed,
                                 heldout=held, progress=True, log=lambda s: print(s, file=sys.stderr))
    enc.meta.update({"towns": towns, "densities": dens, "frames": int(len(frames)), "bev": bev.to_dict(),
                     "steps": args.steps, "every": args.every})
    out = Path(args.out) if args.out else weights_cache_dir() / weights_name(bev.shape)
    enc.save(out)
    BevEncoder.load(out, bev_shape=bev.shape)  # round trip
    res = {"what": "train_bev_encoder", "out": str(out), "frames": int(len(frames)),
           "collect_s": round(collect_s, 1), "total_s": round(time.perf_counter() - t0, 1),
           "heldout": metrics.get("heldout"), "train_light_accuracy": metrics["train"]["light_accuracy"]}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
