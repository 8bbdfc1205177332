#!/usr/bin/env python
"""Calibrate a contrastive reward's constants for the configured encoder from a warm-up
distribution of frames (VLM-RL's CLG window for now).

VLM-RL's Phase I window th = (-0.03, 0.0) belongs to OpenCLIP ViT-bigG-14 on camera images; any
other encoder needs its own. This script drives the lite simulator with the expert autopilot plus
perturbations (the mix ``scripts/train_bev_clip.py`` uses: expert 45 %, steering drift 25 %, full
throttle 20 % - closing on leads, running lights, crashing -, full brake 10 %), embeds every
``--every``-th frame (and every collision frame) with the configured encoder, computes the raw CLG
values and sets the window to the ``--low-quantile`` / ``--high-quantile`` quantiles of their
distribution (defaults 0.05 / 0.5; docs/rewards.md says why). It prints the result as
``reward.params`` overrides, writes a reward config (``--out``) if asked, and reports how the
window scores ground-truth clear-road and hazard frames. The last stdout line is one JSON object.

    python scripts/calibrate_reward.py reward=vlm_rl
    python scripts/calibrate_reward.py reward=vlm_rl town=Town02 density=dense --steps 3000 \\
        --out configs/reward/vlm_rl_town02.yaml               # then: train.py reward=vlm_rl_town02

Hydra-style ``key=value`` arguments override ``configs/config.yaml`` (reward, its params, town,
density, obs, vlm); ``--options`` are the script's own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

CALIBRATABLE = ("vlm_rl", "drivevlm_rl")  # rewards with a part that has calibration_values / calibrate


def compose(overrides: list[str]) -> dict:
    """configs/config.yaml with Hydra overrides, resolved to a plain dict (no run directory)."""
    from hydra import compose as h_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    import drivemind  # noqa: F401  (registers the run-name resolvers configs/config.yaml uses)

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = h_compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)


def drive_frames(cfg: dict, town: str, density: str, steps: int, seed: int, every: int = 2,
                 perturb: bool = True, progress=None):
    """Drive ``steps`` env steps of ``town``/``density`` (the config's sim/obs/env settings) with
    the expert and, when ``perturb``, the perturbation mix; keep every ``every``-th frame and every
    collision frame. Returns (frames uint8 (N, C, H, W), infos)."""
    import drivemind  # noqa: F401
    from drivemind.envs import DriveEnv
    from drivemind.sim.autopilot import PERTURBATIONS, expert_drive
    from drivemind.training.build import env_kwargs

    env = DriveEnv(town, density, **env_kwargs(cfg))
    env.reset(seed=seed)
    names, probs = zip(*PERTURBATIONS)
    choose = (lambda rng: str(rng.choice(names, p=probs))) if perturb else None
    frames, infos = [], []
    for t, obs, info in expert_drive(env, steps, np.random.default_rng(seed), choose):
        if t % every == 0 or info["collision"] > 0:
            frames.append(obs["bev"])
            infos.append(info)
        if progress is not None:
            progress.update(1)
    env.close()
    return np.stack(frames), infos


def encoder_for(cfg: dict, bev_shape):
    """(image embed function ``embed(frames, speed_kmh)``, text encoder or None for the rewards'
    default, name): OpenCLIP when the config's ``vlm.encoder.kind`` is ``openclip``, else BEV-CLIP +
    MiniLM (the shipped tower, or ``vlm.encoder.weights``: e.g. ``vlm=bev_clip_speed``). ``speed_kmh``
    (the frames' ``speed_kmh`` facts) is read only by a tower that reads the ego's speed."""
    enc_cfg = dict((cfg.get("vlm") or {}).get("encoder") or {})
    if enc_cfg.get("kind") == "openclip":
        from drivemind.vlm.openclip import OpenClipEncoder
        enc = OpenClipEncoder.from_config(enc_cfg)
        return (lambda frames, speed_kmh: enc.embed(frames)), enc, enc.name
    from drivemind.vlm.bev_clip import BevClip
    model = BevClip.load(enc_cfg.get("weights"), bev_shape=tuple(bev_shape))
    if model.reads_speed:
        return (lambda frames, speed_kmh: model.embed(frames, speed_kmh=speed_kmh)), None, \
            f"bev_clip[{model.path.name}, ego speed]+minilm"
    return (lambda frames, speed_kmh: model.embed(frames)), None, "bev_clip+minilm"


def fact_batch(infos) -> dict:
    from drivemind.envs import FACT_KEYS
    return {k: np.array([float(i[k]) for i in infos]) for k in FACT_KEYS}


def groups(infos) -> dict[str, np.ndarray]:
    """Ground-truth frame groups: ``clear`` (road ahead clear, no contact) and ``hazard`` (a crash
    into the lead within 1.5 s, or a contact this step), from the caption situations."""
    from drivemind.vlm import situation
    sit = [situation(i) for i in infos]
    return {"clear": np.array([s["ahead"] == "clear" and s["collision"] == "none" for s in sit]),
            "hazard": np.array([s["ahead"] == "crash" or s["collision"] != "none" for s in sit])}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                 epilog="key=value arguments are Hydra overrides of configs/config.yaml")
    ap.add_argument("--towns", default=None, help="comma-separated towns (default: the config's town)")
    ap.add_argument("--densities", default="regular,dense", help="comma-separated densities")
    ap.add_argument("--steps", type=int, default=2000, help="env steps per town x density")
    ap.add_argument("--every", type=int, default=2, help="keep every n-th frame")
    ap.add_argument("--low-quantile", type=float, default=0.05)
    ap.add_argument("--high-quantile", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=7, help="(7: not a seed BEV-CLIP was trained on)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default=None, help="write a reward config (yaml) with the calibrated params")
    args, rest = ap.parse_known_args(argv)
    bad = [a for a in rest if "=" not in a or a.startswith("-")]
    if bad:
        ap.error(f"unrecognised arguments {bad}: options are --name value, config overrides key=value")
    if args.steps < 1 or args.every < 1:
        ap.error("--steps and --every must be >= 1")

    import torch
    from tqdm.auto import tqdm

    from drivemind.training.build import make_reward_from_cfg, town_density

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    cfg = compose(rest)
    reward = make_reward_from_cfg(cfg)
    parts = [p for p in reward.parts_iter() if hasattr(p, "calibrate")]
    if not parts:
        raise SystemExit(f"reward {reward.name!r} has no constants to calibrate; calibratable: "
                         f"{', '.join(CALIBRATABLE)} (choose reward=<name>)")
    part = parts[0]
    town, _ = town_density(cfg)
    towns = [t for t in (args.towns or town).split(",") if t]
    dens = [d for d in args.densities.split(",") if d]
    frames, infos = [], []
    with tqdm(total=len(towns) * len(dens) * args.steps, desc="warm-up", unit="step",
              file=sys.stderr) as bar:
        for i, tw in enumerate(towns):
            for j, d in enumerate(dens):
                f, inf = drive_frames(cfg, tw, d, args.steps, args.seed + 100 * i + j, args.every,
                                      progress=bar)
                frames.append(f)
                infos += inf
    frames = np.concatenate(frames)
    t_drive = time.time() - t0
    embed, text, enc_name = encoder_for(cfg, frames.shape[1:])
    if text is not None:
        reward.bind_encoder(text)
    batch = fact_batch(infos)
    batch["embedding"] = embed(frames, batch["speed_kmh"])
    values = part.calibration_values(batch)
    before = {k: getattr(part, k) for k in ("theta_min", "theta_max") if hasattr(part, k)}
    params = part.calibrate(values, args.low_quantile, args.high_quantile)

    g = groups(infos)
    diag = {}
    for name, m in g.items():
        d = {"frames": int(m.sum())}
        if m.any():
            d["median_value"] = round(float(np.median(values[m])), 4)
            for label, win in (("calibrated", params), ("configured", before)):
                if {"theta_min", "theta_max"} <= set(win):
                    lo, hi = win["theta_min"], win["theta_max"]
                    r = (np.clip(values[m], lo, hi) - lo) / (hi - lo)
                    d[f"mean_r_{label}"] = round(float(np.mean(r)), 4)
        diag[name] = d
    overrides = " ".join(f"reward.params.{k}={v}" for k, v in params.items())
    print(f"calibrated {reward.name} on {len(values)} frames ({enc_name}): {overrides}", file=sys.stderr)
    if args.out:
        import yaml
        out = Path(args.out)
        rcfg = {"name": cfg["reward"]["name"], "params": {**(cfg["reward"].get("params") or {}), **params}}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"# {reward.name} calibrated by scripts/calibrate_reward.py on {len(values)} "
                       f"warm-up frames ({enc_name}; towns {','.join(towns)}, densities "
                       f"{','.join(dens)}, quantiles {args.low_quantile}/{args.high_quantile})\n"
                       + yaml.safe_dump(rcfg, sort_keys=False))
    q = np.quantile(values[np.isfinite(values)], [0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99])
    res = {"reward": reward.name, "encoder": enc_name, "towns": towns, "densities": dens,
           "frames": int(len(values)), "quantiles": [args.low_quantile, args.high_quantile],
           "params": params, "overrides": overrides, "configured": before,
           "value_quantiles": {p: round(float(v), 4) for p, v in
                               zip(("q01", "q05", "q25", "q50", "q75", "q95", "q99"), q)},
           "groups": diag, "out": args.out, "drive_s": round(t_drive, 1),
           "total_s": round(time.time() - t0, 1)}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
