#!/usr/bin/env python
"""Train BEV-CLIP (drivemind.vlm.bev_clip) on embedded-sim frames captioned from ground truth.

Drives DriveMind-v0 with the built-in expert plus perturbations (steering drift, throttle
bursts that close on lead vehicles or run lights, braking), captions every kept frame from its
``info`` facts, trains the image tower against frozen all-MiniLM-L6-v2 caption embeddings, and
reports held-out image-to-text top-1 retrieval accuracy against chance. Held-out frames come
from whole episode segments never seen in training. The last stdout line is one JSON object.

One tower per BEV shape: ``--bev`` picks the BEV (a preset, or a pixel size of Roach's 38.4 m
view; ``--channels`` / ``--history`` change the planes) and the default output is the file
``BevClip.load(bev_shape=...)`` looks for (``drivemind.vlm.bev_clip.weights_name``).

    python scripts/train_bev_clip.py --threads 1              # ~/.cache/drivemind/bev_clip_cpu.pt
    python scripts/train_bev_clip.py --bev roach --threads 1  # ~/.cache/drivemind/bev_clip_roach.pt
    python scripts/train_bev_clip.py --bev paper --threads 1  # ~/.cache/drivemind/bev_clip_paper.pt
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


def bev_config(bev: str, channels: str | None = None, history: str | None = None):
    """The BevConfig for ``--bev`` (preset name or pixel size) and optional ``--channels`` /
    ``--history`` (comma lists). Bad values raise one ValueError listing the valid choices."""
    from drivemind.bev import BEV_PRESETS, BevConfig

    b = str(bev).strip()
    if b in BEV_PRESETS:
        cfg = BEV_PRESETS[b]
    elif b.isdigit() and int(b) > 0:
        cfg = BevConfig().scaled(int(b))  # Roach's 38.4 m window at that many pixels
    else:
        raise ValueError(f"--bev must be a preset ({', '.join(BEV_PRESETS)}) or a pixel size "
                         f"such as 128, got {bev!r}")
    over = {}
    if channels:
        over["channels"] = [c.strip() for c in channels.split(",") if c.strip()]
    if history:
        over["history"] = [int(h) for h in history.split(",") if h.strip()]
    return BevConfig.from_dict({**cfg.to_dict(), **over}) if over else cfg


def _choose_mode(rng) -> str:
    """The next perturbation episode: PERTURBATIONS' shares as cumulative thresholds on one
    rng.random() draw (so a seed's frames stay what they were)."""
    u = rng.random()
    return "expert" if u < 0.45 else "drift" if u < 0.7 else "rush" if u < 0.9 else "brake"


def collect(town: str, density: str, steps: int, seed: int, every: int = 2, segment: int = 100,
            progress=None, bev="cpu", out: np.ndarray | None = None):
    """Drive ``steps`` env steps; keep every ``every``-th frame (and every collision frame).
    Returns frames (uint8), infos and a segment id per frame (consecutive ``segment``-step chunks,
    for the held-out split). With ``out`` (an array with room for ``steps`` frames), frames are
    copied into it as they come and the returned ``frames`` is the filled view ``out[:n]``."""
    import gymnasium as gym

    import drivemind  # noqa: F401  (registers DriveMind-v0)
    from drivemind.sim.autopilot import expert_drive

    env = gym.make("DriveMind-v0", town=town, density=density, bev=bev)
    env.reset(seed=seed)
    frames, infos, segs = [], [], []
    for t, obs, info in expert_drive(env, steps, np.random.default_rng(seed), _choose_mode):
        if t % every == 0 or info["collision"] > 0:
            if out is None:
                frames.append(obs["bev"])
            else:
                out[len(infos)] = obs["bev"]
            infos.append(info)
            segs.append(f"{town}/{density}/{seed}/{t // segment}")
        if progress is not None:
            progress.update(1)
    env.close()
    return (frames if out is None else out[:len(infos)]), infos, segs


def permute_rows(arr: np.ndarray, order: np.ndarray) -> None:
    """In place: ``arr[:] = arr[order]`` with one row of extra memory (follows the cycles)."""
    done = np.zeros(len(order), bool)
    for i in range(len(order)):
        if done[i] or order[i] == i:
            continue
        tmp, j = arr[i].copy(), i
        while True:
            done[j] = True
            k = int(order[j])
            if k == i:
                arr[j] = tmp
                break
            arr[j] = arr[k]
            j = k


def main(argv=None) -> dict:
    from drivemind.vlm.bev_clip import default_weights_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--bev", default="cpu",
                    help="BEV preset (cpu 15x96x96, roach 15x192x192, paper 15x224x224) or a "
                         "pixel size (Roach's 38.4 m view at that size)")
    ap.add_argument("--channels", default=None,
                    help="comma-separated BEV channels (default: the preset's), e.g. road,route,lane,vehicle,walker,light,ego")
    ap.add_argument("--history", default=None, help="comma-separated history offsets, e.g. -16,-11,-6,-1")
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
    ap.add_argument("--out", default=None,
                    help="checkpoint path (default: ~/.cache/drivemind/<the name BevClip.load "
                         "looks for with this BEV's shape>)")
    args = ap.parse_args(argv)
    try:
        bev = bev_config(args.bev, args.channels, args.history)
    except ValueError as e:
        ap.error(str(e))
    out_path = args.out or str(default_weights_path(bev.shape))

    import torch
    from tqdm.auto import tqdm

    from drivemind.vlm import MiniLMTextEncoder, caption, retrieval_accuracy, train_bev_clip

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    towns = [t for t in args.towns.split(",") if t]
    dens = [d for d in args.densities.split(",") if d]
    # frames go straight into one uint8 array (a 224 px set of 6 k frames is 4.2 GiB): room for
    # every step is reserved, but only the pages of kept frames are ever touched
    buf = np.empty((len(towns) * len(dens) * args.steps,) + tuple(bev.shape), np.uint8)
    n, infos, segs = 0, [], []
    with tqdm(total=len(towns) * len(dens) * args.steps, desc="collect", unit="step") as bar:
        for i, town in enumerate(towns):
            for j, d in enumerate(dens):
                f, inf, s = collect(town, d, args.steps, args.seed + 100 * i + j, args.every,
                                    progress=bar, bev=bev, out=buf[n:])
                n += len(f)
                infos += inf
                segs += s
    frames = buf[:n]
    t_collect = time.time() - t0
    rng = np.random.default_rng(args.seed)
    useg = sorted(set(segs))
    val_segs = set(rng.choice(useg, max(1, int(round(args.val_frac * len(useg)))), replace=False))
    val = np.array([s in val_segs for s in segs])
    if val.all() or not val.any():
        ap.error(f"{len(useg)} episode segment(s) of 100 steps cannot be split into training and "
                 f"held-out parts with --val-frac {args.val_frac}; raise --steps (>= 200)")
    canon = [caption(i) for i in infos]
    train_caps = ([caption(i, rng) for i in infos] if args.paraphrase else canon)
    # training frames first, in place, so the splits below are views, not copies
    order = np.concatenate([np.flatnonzero(~val), np.flatnonzero(val)])
    n_tr = int((~val).sum())
    permute_rows(frames, order)
    canon = [canon[k] for k in order]
    train_caps = [train_caps[k] for k in order[:n_tr]]
    tr, va = slice(0, n_tr), slice(n_tr, len(frames))
    text = MiniLMTextEncoder()
    print(f"BEV {bev.shape}: {len(frames)} frames ({n_tr} train, {len(frames) - n_tr} held-out, "
          f"{frames.nbytes / 2**30:.2f} GiB), {len(set(canon))} distinct captions, collected in "
          f"{t_collect:.0f} s", file=sys.stderr)
    t1 = time.time()
    # the model is built inside train_bev_clip, after it seeds torch (a deterministic run)
    model = train_bev_clip(frames[tr], train_caps, text, channel_names=bev.channel_names(),
                           epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                           seed=args.seed, progress=True)
    n_params = sum(p.numel() for p in model.parameters())
    t_train = time.time() - t1
    held = retrieval_accuracy(model, frames[va], canon[va], text)
    train = retrieval_accuracy(model, frames[tr], canon[tr], text)
    out = model.save(out_path, towns=towns, densities=dens, frames=int(len(frames)),
                     heldout=held, seed=args.seed, bev=bev.to_dict(), epochs=args.epochs,
                     steps=args.steps, every=args.every)
    common = Counter(canon[va]).most_common(1)[0][0]
    res = {"out": str(out), "bev_shape": list(bev.shape),
           "stem_stride": model.config["stem_stride"], "params": int(n_params),
           "weights_bytes": os.path.getsize(out), "frames": int(len(frames)),
           "train_frames": n_tr, "heldout_frames": int(len(frames) - n_tr),
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
