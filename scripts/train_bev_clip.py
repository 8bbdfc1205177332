#!/usr/bin/env python
"""Train BEV-CLIP (drivemind.vlm.bev_clip) on embedded-sim frames captioned from ground truth.

Drives DriveMind-v0 with the built-in expert plus perturbations (steering drift, throttle
bursts that close on lead vehicles or run lights, braking), captions every kept frame from its
``info`` facts, trains the image tower against frozen all-MiniLM-L6-v2 caption embeddings, and
reports held-out image-to-text top-1 retrieval accuracy against chance. Held-out frames come
from whole episode segments never seen in training. The last stdout line is one JSON object.

    python scripts/train_bev_clip.py                       # default: ~/.cache/drivemind/bev_clip_cpu.pt
    python scripts/train_bev_clip.py --steps 600 --epochs 3 --out /tmp/bev_clip.pt   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def collect(town: str, density: str, steps: int, seed: int, every: int = 2, segment: int = 100,
            progress=None):
    """Drive ``steps`` env steps; keep every ``every``-th frame. Returns frames (uint8), infos
    and a segment id per frame (consecutive ``segment``-step chunks, for the held-out split)."""
    import gymnasium as gym

    import drivemind  # noqa: F401  (registers DriveMind-v0)

    env = gym.make("DriveMind-v0", town=town, density=density, bev="cpu")
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    frames, infos, segs = [], [], []
    mode, left, bias = "expert", 0, 0.0
    for t in range(steps):
        if left <= 0:  # choose the next perturbation episode
            u = rng.random()
            mode = ("expert" if u < 0.45 else "drift" if u < 0.7 else "rush" if u < 0.9
                    else "brake")
            left = int(rng.integers(10, 40))
            bias = float(rng.choice([-1, 1]) * rng.uniform(0.05, 0.3))
        left -= 1
        a = env.unwrapped.expert_action().astype(np.float64)
        a[0] += rng.normal(0, 0.05)
        if mode == "drift":
            a[0] += bias
        elif mode == "rush":
            a[1] = 1.0
        elif mode == "brake":
            a[1] = -1.0
        obs, _, term, trunc, info = env.step(np.clip(a, -1, 1))
        if t % every == 0 or info["collision"] > 0:
            frames.append(obs["bev"])
            infos.append(info)
            segs.append(f"{town}/{density}/{seed}/{t // segment}")
        if progress is not None:
            progress.update(1)
        if term or trunc:
            obs, info = env.reset()
            mode, left = "expert", 0
    env.close()
    return frames, infos, segs


def main(argv=None) -> dict:
    from drivemind.vlm.bev_clip import default_weights_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--towns", default="grid,curves,avenue", help="comma-separated towns")
    ap.add_argument("--densities", default="regular,dense", help="comma-separated densities")
    ap.add_argument("--steps", type=int, default=2000, help="env steps per town x density")
    ap.add_argument("--every", type=int, default=2, help="keep every n-th frame")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--val-frac", type=float, default=0.2, help="held-out fraction of segments")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--paraphrase", action="store_true",
                    help="train on paraphrased captions (held-out uses the canonical wording)")
    ap.add_argument("--out", default=str(default_weights_path()))
    args = ap.parse_args(argv)

    import torch
    from tqdm.auto import tqdm

    from drivemind.vlm import MiniLMTextEncoder, caption, retrieval_accuracy, train_bev_clip

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    towns = [t for t in args.towns.split(",") if t]
    dens = [d for d in args.densities.split(",") if d]
    frames, infos, segs = [], [], []
    with tqdm(total=len(towns) * len(dens) * args.steps, desc="collect", unit="step") as bar:
        for i, town in enumerate(towns):
            for j, d in enumerate(dens):
                f, inf, s = collect(town, d, args.steps, args.seed + 100 * i + j, args.every,
                                    progress=bar)
                frames += f
                infos += inf
                segs += s
    frames = np.stack(frames)
    t_collect = time.time() - t0
    rng = np.random.default_rng(args.seed)
    useg = sorted(set(segs))
    val_segs = set(rng.choice(useg, max(1, int(round(args.val_frac * len(useg)))), replace=False))
    val = np.array([s in val_segs for s in segs])
    canon = [caption(i) for i in infos]
    train_caps = ([caption(i, rng) for i in infos] if args.paraphrase else canon)
    text = MiniLMTextEncoder()
    tr_idx, va_idx = np.flatnonzero(~val), np.flatnonzero(val)
    print(f"{len(frames)} frames ({len(tr_idx)} train, {len(va_idx)} held-out), "
          f"{len(set(canon))} distinct captions, collected in {t_collect:.0f} s", file=sys.stderr)
    t1 = time.time()
    model = train_bev_clip(frames[tr_idx], [train_caps[k] for k in tr_idx], text,
                           epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                           seed=args.seed, progress=True)
    t_train = time.time() - t1
    held = retrieval_accuracy(model, frames[va_idx], [canon[k] for k in va_idx], text)
    train = retrieval_accuracy(model, frames[tr_idx], [canon[k] for k in tr_idx], text)
    out = model.save(args.out, towns=towns, densities=dens, frames=int(len(frames)),
                     heldout=held, seed=args.seed)
    common = Counter(canon[k] for k in va_idx).most_common(1)[0][0]
    res = {"out": str(out), "weights_bytes": os.path.getsize(out), "frames": int(len(frames)),
           "train_frames": int(len(tr_idx)), "heldout_frames": int(len(va_idx)),
           "heldout_accuracy": round(held["accuracy"], 4), "chance": round(held["chance"], 4),
           "majority": round(held["majority"], 4), "heldout_captions": held["n_captions"],
           "clause_accuracy": round(held["clause_accuracy"], 4),
           "clause_majority": round(held["clause_majority"], 4),
           "train_accuracy": round(train["accuracy"], 4), "most_common_heldout": common,
           "collect_s": round(t_collect, 1), "train_s": round(t_train, 1),
           "total_s": round(time.time() - t0, 1)}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
