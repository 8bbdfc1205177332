#!/usr/bin/env python
"""Compare a reward's per-frame distribution between two frame sets (DriveMind's real-image check,
its Table 3: AICR on BDD100K BEV frames vs Town02; Wasserstein-1 0.028, KS 0.105).

Drives the lite simulator's autopilot in two towns (``--towns A,B``; any town name the map search
path resolves, e.g. Town01 and Town02 from ``$DRIVEMIND_MAP_PATH``), keeps every ``--every``-th
frame, embeds them with the configured encoder (the shipped BEV-CLIP by default, ``vlm=openclip``
for OpenCLIP), scores each frame with the configured reward (default ``aicr_static``, DriveMind's
static anchor) and reports the Wasserstein-1 distance and the two-sample Kolmogorov-Smirnov
statistic (scipy.stats) between the two sets, with each set's mean, standard deviation and size.
``--plot`` writes both histograms. The last stdout line is one JSON object.

    DRIVEMIND_MAP_PATH=../shared/maps python scripts/reward_distribution.py --towns Town01,Town02
    python scripts/reward_distribution.py --towns Town01,Town02 reward.params.normalise=false --plot d.png

Hydra-style ``key=value`` arguments override ``configs/config.yaml`` (reward and its params,
density, obs, vlm); ``--options`` are the script's own. The reward may read any per-step fact too
(each frame carries the step's facts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibrate_reward import REPO, compose, drive_frames, encoder_for, fact_batch  # noqa: E402

sys.path.insert(0, str(REPO / "src"))


def compare(a, b) -> dict:
    """Wasserstein-1 and KS (statistic, p-value) between two samples, and their summaries."""
    from scipy import stats

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"need at least 2 finite values per set, got {len(a)} and {len(b)}")
    ks = stats.ks_2samp(a, b)
    return {"wasserstein1": float(stats.wasserstein_distance(a, b)), "ks": float(ks.statistic),
            "ks_pvalue": float(ks.pvalue),
            "a": {"n": int(len(a)), "mean": float(a.mean()), "std": float(a.std())},
            "b": {"n": int(len(b)), "mean": float(b.mean()), "std": float(b.std())}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="key=value arguments are Hydra overrides of configs/config.yaml")
    ap.add_argument("--towns", default="Town01,Town02", help="the two towns, comma-separated")
    ap.add_argument("--steps", type=int, default=3000, help="env steps per town")
    ap.add_argument("--every", type=int, default=2, help="keep every n-th frame")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--perturb", action="store_true",
                    help="add calibrate_reward.py's perturbations (drift, rush, brake) to the autopilot")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--plot", default=None, help="write the two histograms to this PNG")
    args, rest = ap.parse_known_args(argv)
    bad = [a for a in rest if "=" not in a or a.startswith("-")]
    if bad:
        ap.error(f"unrecognised arguments {bad}: options are --name value, config overrides key=value")
    towns = [t for t in args.towns.split(",") if t]
    if len(towns) != 2:
        ap.error(f"--towns needs exactly two towns, got {towns}")
    if args.steps < 2 or args.every < 1:
        ap.error("--steps must be >= 2 and --every >= 1")

    import torch

    from drivemind.training.build import make_reward_from_cfg, town_density

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    if not any(o.split("=", 1)[0].lstrip("+~") == "reward" for o in rest):
        rest = ["reward=aicr_static", *rest]
    cfg = compose(rest)
    reward = make_reward_from_cfg(cfg)
    _, density = town_density(cfg)
    embed = text = enc_name = None
    values, sets = {}, {}
    for i, town in enumerate(towns):
        frames, infos = drive_frames(cfg, town, density, args.steps, args.seed + i, args.every,
                                     perturb=args.perturb)
        if embed is None:
            embed, text, enc_name = encoder_for(cfg, frames.shape[1:])
            if text is not None:
                reward.bind_encoder(text)
        batch = fact_batch(infos)
        batch["embedding"] = embed(frames, batch["speed_kmh"])
        values[town] = np.asarray(reward(batch), np.float64)
        sets[town] = {"frames": int(len(frames)),
                      "collisions": int(sum(1 for x in infos if x["collision"] > 0))}
    a, b = towns
    res = compare(values[a], values[b])
    res["a"].update(town=a, **sets[a])
    res["b"].update(town=b, **sets[b])
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        lo = min(values[a].min(), values[b].min())
        hi = max(values[a].max(), values[b].max())
        bins = np.linspace(lo, hi, 41)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for t in towns:
            ax.hist(values[t], bins=bins, alpha=0.55, density=True,
                    label=f"{t} (mean {values[t].mean():.3f}, n={len(values[t])})")
        ax.set_xlabel(f"{reward.name} per frame ({enc_name})")
        ax.set_ylabel("density")
        ax.set_title(f"W1 {res['wasserstein1']:.3f}, KS {res['ks']:.3f}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
        plt.close(fig)
    res.update(reward=reward.name, params=(cfg["reward"].get("params") or {}), encoder=enc_name,
               density=density, steps=args.steps, every=args.every, perturb=args.perturb,
               seed=args.seed, plot=args.plot, total_s=round(time.time() - t0, 1))
    print(f"{reward.name}: {a} mean {res['a']['mean']:.4f} vs {b} mean {res['b']['mean']:.4f}; "
          f"W1 {res['wasserstein1']:.4f}, KS {res['ks']:.4f}", file=sys.stderr)
    print(json.dumps(res, default=str))
    return res


if __name__ == "__main__":
    main()
