#!/usr/bin/env python
"""Train BEV-CLIP (drivemind.vlm.bev_clip) on simulator frames and every caption family the rewards read.

Drives the lite simulator on the training towns (built-in grid, curves, avenue and Town02; never
bench.py reward-quality's held-out Town01/03/05 or its seeds 10000+) x every density x three
drivers (expert, perturbed expert, random), oversampling the seconds before crashes and near
misses (drivemind.vlm.supervision). Each frame gets its ground-truth scene caption (paraphrased,
with a flipped hard negative), a safe / danger polarity checked against the prompts of
configs/reward/*.yaml plus paraphrases, DriveMind's generated prompts, Found-RL's action caption
and DriveVLM-RL's risk description; the image tower is trained against frozen
all-MiniLM-L6-v2 embeddings (drivemind.vlm.bev_clip_train). Held-out frames come from whole
100-step segments never seen in training. The last stdout line is one JSON object.

One tower per BEV shape: ``--bev`` picks the BEV (a preset, or a pixel size of Roach's 38.4 m
view; ``--channels`` / ``--history`` change the planes) and the default output is the file
``BevClip.load(bev_shape=...)`` looks for (``drivemind.vlm.bev_clip.weights_name``).

    python scripts/train_bev_clip.py --threads 1              # ~/.cache/drivemind/bev_clip_cpu.pt
    python scripts/train_bev_clip.py --bev roach --threads 1  # ~/.cache/drivemind/bev_clip_roach.pt
    python scripts/train_bev_clip.py --bev paper --threads 1  # ~/.cache/drivemind/bev_clip_paper.pt
    python scripts/train_bev_clip.py --steps 200 --epochs 1 --out /tmp/bev_clip.pt   # smoke run
    python scripts/train_bev_clip.py --speed-input --threads 1  # ~/.cache/drivemind/bev_clip_cpu_speed.pt
    python scripts/train_bev_clip.py --speed-input --lane-input --threads 1  # .../bev_clip_cpu_speed_lane.pt

``--speed-input`` trains the opt-in tower that also reads the ego's measured speed (each frame's
``speed_kmh`` fact: the car's speedometer, a measurement as Roach gives its policy beside the BEV)
and writes ``bev_clip_<preset>_speed.pt``; the default tower and file are untouched.
``--lane-input`` adds the fixed route-band readout of each frame's own BEV (drivemind.bev.lane_offset:
the ego's lateral offset from the route read from the route plane's pixels, no ground truth) as a
second input (``..._lane.pt``, e.g. ``bev_clip_cpu_speed_lane.pt`` with ``--speed-input``).
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


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


def main(argv=None) -> dict:
    from drivemind.vlm.bev_clip import default_weights_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--bev", default="cpu",
                    help="BEV preset (cpu 15x96x96, roach 15x192x192, paper 15x224x224) or a "
                         "pixel size (Roach's 38.4 m view at that size)")
    ap.add_argument("--channels", default=None,
                    help="comma-separated BEV channels (default: the preset's), e.g. road,route,lane,vehicle,walker,light,ego")
    ap.add_argument("--history", default=None, help="comma-separated history offsets, e.g. -16,-11,-6,-1")
    ap.add_argument("--towns", default="grid,curves,avenue,Town02",
                    help="comma-separated training towns (not Town01/03/05: held out)")
    ap.add_argument("--densities", default="empty,regular,dense,drivevlm", help="comma-separated densities")
    ap.add_argument("--drivers", default="expert,perturbed,random", help="comma-separated drivers")
    ap.add_argument("--steps", type=int, default=1000, help="env steps per town x density x driver")
    ap.add_argument("--every", type=int, default=4,
                    help="keep every n-th frame (plus the 2 s before a crash and near misses)")
    ap.add_argument("--max-frames", type=int, default=None, help="stop keeping frames at this many")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--val-frac", type=float, default=0.1, help="held-out fraction of segments")
    ap.add_argument("--seed", type=int, default=0, help="below 10000 (reward-quality's seeds)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--speed-input", action="store_true",
                    help="train the speed tower: the ego's measured speed (km/h) is an input beside "
                         "the BEV (default out: bev_clip_<preset>_speed.pt)")
    ap.add_argument("--lane-input", action="store_true",
                    help="the tower also reads the route-band lateral readout of its BEV "
                         "(drivemind.bev.lane_offset; default out: bev_clip_<preset>[_speed]_lane.pt)")
    ap.add_argument("--canonical", action="store_true",
                    help="train on the canonical caption wording (default: paraphrases)")
    ap.add_argument("--reward-configs", default=str(REPO / "configs" / "reward"),
                    help="folder of reward configs whose prompts the polarity loss uses")
    ap.add_argument("--out", default=None,
                    help="checkpoint path (default: ~/.cache/drivemind/<the name BevClip.load "
                         "looks for with this BEV's shape>)")
    args = ap.parse_args(argv)
    split = (lambda v: [x.strip() for x in v.split(",") if x.strip()])
    towns, dens, drivers = split(args.towns), split(args.densities), split(args.drivers)
    try:
        bev = bev_config(args.bev, args.channels, args.history)
        from drivemind.vlm.supervision import DRIVERS, check_training_towns
        check_training_towns(towns, args.seed)
        bad = [d for d in drivers if d not in DRIVERS]
        if bad or not drivers:
            raise ValueError(f"--drivers: unknown {bad or drivers}; valid: {', '.join(DRIVERS)}")
    except ValueError as e:
        ap.error(str(e))
    if args.lane_input and "route" not in bev.channels:
        ap.error(f"--lane-input reads the BEV's route plane; --channels {','.join(bev.channels)} lacks 'route'")
    out_path = args.out or str(default_weights_path(bev.shape, speed=args.speed_input,
                                                    lane=args.lane_input))

    import torch
    from tqdm.auto import tqdm

    from drivemind.vlm import MiniLMTextEncoder
    from drivemind.vlm.bev_clip_train import evaluate, train_multi
    from drivemind.vlm.supervision import collect_frames, frame_targets, polarity_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    with tqdm(total=len(towns) * len(dens) * len(drivers) * args.steps, desc="collect",
              unit="step") as bar:
        data = collect_frames(towns, dens, drivers, steps=args.steps, every=args.every,
                              seed=args.seed, bev=bev, progress=bar, max_frames=args.max_frames)
    t_collect = time.time() - t0
    rng = np.random.default_rng(args.seed)
    useg = sorted(set(data.segment))
    val_segs = set(rng.choice(useg, max(1, int(round(args.val_frac * len(useg)))), replace=False))
    val = np.array([s in val_segs for s in data.segment])
    if val.all() or not val.any():
        ap.error(f"{len(useg)} episode segment(s) of 100 steps cannot be split into training and "
                 f"held-out parts with --val-frac {args.val_frac}; raise --steps (>= 200)")
    tr, va = np.flatnonzero(~val), np.flatnonzero(val)
    safe, danger = polarity_prompts(args.reward_configs)
    sub = (lambda t, rows: {k: (v if k == "library" else [v[i] for i in rows] if isinstance(v, list)
                                else v[rows]) for k, v in t.items()})
    tgt = frame_targets(data.infos, data.polarity, None if args.canonical else rng)
    canon = tgt["scene_canonical"]
    speed = (np.array([float(i["speed_kmh"]) for i in data.infos], np.float32)
             if args.speed_input else None)
    text = MiniLMTextEncoder()
    print(f"BEV {bev.shape}: {len(data)} frames ({len(tr)} train, {len(va)} held-out, "
          f"{data.frames.nbytes / 2**30:.2f} GiB), {len(set(canon))} distinct captions, "
          f"{int((data.polarity < 0).sum())} danger / {int((data.polarity > 0).sum())} safe frames, "
          f"{len(safe)} safe / {len(danger)} danger prompts, collected in {t_collect:.0f} s",
          file=sys.stderr)
    t1 = time.time()
    # the training rows are read batch by batch (rows=tr), not copied out: half the peak memory
    model = train_multi(data.frames, sub(tgt, tr), text, safe=safe, danger=danger, rows=tr,
                        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                        seed=args.seed, channel_names=bev.channel_names(), progress=True,
                        speed_kmh=None if speed is None else speed[tr],
                        lane_input=args.lane_input, lane_bev=bev.to_dict() if args.lane_input else None,
                        log=lambda ep, parts: print(f"epoch {ep}: " + ", ".join(
                            f"{k} {v:.3f}" for k, v in parts.items()), file=sys.stderr))
    n_params = sum(p.numel() for p in model.parameters())
    t_train = time.time() - t1
    va_tgt = sub(tgt, va)
    sp = (lambda rows: None if speed is None else speed[rows])
    held = evaluate(model, data.frames[va], va_tgt, [canon[i] for i in va], text, speed_kmh=sp(va))
    trs = tr[:: max(1, len(tr) // max(len(va), 1))]  # a train subset as large as the held-out one
    train = evaluate(model, data.frames[trs], sub(tgt, trs), [canon[i] for i in trs], text,
                     speed_kmh=sp(trs))
    hr = held["retrieval"]
    out = model.save(out_path, towns=towns, densities=dens, drivers=drivers,
                     frames=int(len(data)), heldout=hr, heldout_measures=_plain(held),
                     seed=args.seed, bev=bev.to_dict(), epochs=args.epochs, steps=args.steps,
                     every=args.every, speed_input=bool(args.speed_input),
                     lane_input=bool(args.lane_input),
                     recipe="multi-family v2 (drivemind.vlm.bev_clip_train)"
                            + (" + ego speed input" if args.speed_input else "")
                            + (" + route-band lane readout" if args.lane_input else ""))
    common = Counter(canon[i] for i in va).most_common(1)[0][0]
    res = {"out": str(out), "bev_shape": list(bev.shape),
           "stem_stride": model.config["stem_stride"], "speed_input": bool(args.speed_input),
           "lane_input": bool(args.lane_input),
           "params": int(n_params),
           "weights_bytes": os.path.getsize(out), "frames": int(len(data)),
           "train_frames": int(len(tr)), "heldout_frames": int(len(va)),
           "danger_frames": int((data.polarity < 0).sum()), "safe_frames": int((data.polarity > 0).sum()),
           "heldout_accuracy": round(hr["accuracy"], 4), "chance": round(hr["chance"], 4),
           "majority": round(hr["majority"], 4), "heldout_captions": hr["n_captions"],
           "clause_accuracy": round(hr["clause_accuracy"], 4),
           "clause_majority": round(hr["clause_majority"], 4),
           "train_accuracy": round(train["retrieval"]["accuracy"], 4),
           "heldout": {k: v for k, v in _plain(held).items() if k != "retrieval"},
           "most_common_heldout": common,
           "collect_s": round(t_collect, 1), "train_s": round(t_train, 1),
           "total_s": round(time.time() - t0, 1)}
    print(json.dumps(res))
    return res


def _plain(d):
    """Rounded floats, NaN as None (strict JSON)."""
    if isinstance(d, dict):
        return {k: _plain(v) for k, v in d.items()}
    if isinstance(d, float):
        return None if d != d else round(d, 4)
    return d


if __name__ == "__main__":
    main()
