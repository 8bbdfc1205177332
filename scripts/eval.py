#!/usr/bin/env python
"""Evaluate a trained policy on the fixed routes of a town (Hydra entry point).

    python scripts/eval.py run=outputs/runs/<day>/<time>-<name> town=Town01 density=dense
    python scripts/eval.py policy=autopilot town=grid density=regular      # the reference driver

Loads the run's latest checkpoint (or checkpoint=<model_<steps>.zip>), freezes it, drives the
town's 10 fixed routes with the same traffic seeds for every method, and writes metrics.json,
routes.csv, metrics.md, metrics.png and route_<i>.gif into <run>/eval/<town>-<density>/ (or out=).
The last line of stdout is the metrics as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "YOLO_OFFLINE"):
    os.environ.setdefault(_k, "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402


@hydra.main(config_path="../configs", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    from drivemind.training.cli import run_cli

    return run_cli(_main, cfg)


def _main(cfg: DictConfig) -> dict:
    from drivemind.envs import DriveEnv
    from drivemind.evaluation import evaluate
    from drivemind.training.build import env_kwargs
    from drivemind.training.evaluate import check_policy_env, load_policy

    c = OmegaConf.to_container(cfg, resolve=True)
    if c["policy"] not in ("model", "autopilot"):
        raise ValueError(f"unknown policy {c['policy']!r}; valid: model, autopilot")
    if c["policy"] == "model":
        if not c.get("run"):
            raise ValueError("pass run=<training run directory> (or policy=autopilot)")
        policy, _ = load_policy(c["run"], c["checkpoint"], c["device"])
        base = policy.config
        name = Path(c["run"]).name
    else:
        policy, base, name = "autopilot", {"obs": {"name": "cpu", "bev": {"preset": "cpu"}}}, "autopilot"
    # the run's own town/density/obs/env settings unless overridden here
    town = (c.get("town") or base.get("town") or {"name": "grid"})["name"]
    density = (c.get("density") or base.get("density") or {"name": "regular"})["name"]
    merged = {**base, "map_path": c.get("map_path") or base.get("map_path")}
    kw = env_kwargs(merged)
    kw.pop("sim", None) if kw.get("sim") is None else None
    if policy != "autopilot":
        probe = DriveEnv(town, density, mode="eval", **kw)
        check_policy_env(policy, probe.observation_space, c["run"])
        probe.close()
    out = c.get("out") or (Path(c["run"]) / "eval" / f"{town}-{density}" if c["policy"] == "model"
                           else Path("outputs/eval/autopilot") / f"{town}-{density}")
    res = evaluate(policy, town=town, density=density, out_dir=out, env_kwargs=kw,
                   routes=c.get("routes"), video_route=c.get("video_route"),
                   video_masks=bool(c.get("video_masks", True)),
                   max_steps_per_route=c.get("max_steps_per_route"),
                   meta={"run": c.get("run"), "checkpoint": c.get("checkpoint"), "policy": name})
    print(f"[drivemind] wrote {', '.join(str(p) for p in res['files'].values())}", flush=True)
    print(json.dumps({"out": str(out), **res["metrics"]}, default=str))
    return res["metrics"]


if __name__ == "__main__":
    main()
