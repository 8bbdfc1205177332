#!/usr/bin/env python
"""Evaluate a trained policy on the fixed routes of a town (Hydra entry point).

    python scripts/eval.py run=outputs/runs/<day>/<time>-<name> town=Town01 density=dense
    python scripts/eval.py town=Town05 density=dense      # the newest run under ./outputs
    python scripts/eval.py policy=autopilot town=grid density=regular      # the reference driver

Without ``run=`` the newest training run under ``outputs/`` (``outputs/runs`` and
``outputs/sweeps``, as scripts/train.py writes them from the same working directory) is evaluated:
the run whose latest checkpoint was written last. The choice is printed.

Loads the run's latest checkpoint (or checkpoint=<model_<steps>.zip>), freezes it, drives the
town's 10 fixed routes with the same traffic seeds for every method, and writes metrics.json,
routes.csv, metrics.md, metrics.png and route_<i>.gif into <run>/eval/<town>-<density>/ (or out=).
The last line of stdout is the metrics as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402


@hydra.main(config_path="../configs", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    from drivemind.training.cli import run_cli

    return run_cli(_main, cfg)


def _main(cfg: DictConfig) -> dict:
    from drivemind.evaluation import evaluate
    from drivemind.training.build import env_kwargs
    from drivemind.training.evaluate import eval_folder, evaluate_run

    c = OmegaConf.to_container(cfg, resolve=True)
    if c["policy"] not in ("model", "autopilot"):
        raise ValueError(f"unknown policy {c['policy']!r}; valid: model, autopilot")
    common = dict(routes=c.get("routes"), video_route=c.get("video_route"),
                  video_masks=bool(c.get("video_masks", True)),
                  max_steps_per_route=c.get("max_steps_per_route"))
    # town/density default to the run's own; the obs/env settings are always the run's
    town = (c.get("town") or {}).get("name")
    density = (c.get("density") or {}).get("name")
    if c["policy"] == "model":
        run = c.get("run")
        if not run:
            run = newest_run(Path(c.get("outputs") or "outputs"))
            print(f"[drivemind] no run= given: evaluating the newest training run, {run} "
                  f"(pass run=<dir> for another)", flush=True)
        res = evaluate_run(run, town, density, checkpoint=c["checkpoint"], device=c["device"],
                           actor=c.get("actor", "auto"), map_path=c.get("map_path"), out_dir=c.get("out"), sim=c.get("sim"), **common)
    else:
        town, density = town or "grid", density or "regular"
        kw = env_kwargs({"obs": {"bev": {"preset": "cpu"}}, "map_path": c.get("map_path"),
                         "sim": c.get("sim") or {}})
        out = c.get("out") or Path("outputs/eval/autopilot") / eval_folder(town, density)
        res = {**evaluate("autopilot", town=town, density=density, out_dir=out, env_kwargs=kw,
                          meta={"policy": "autopilot"}, **common), "out": out}
    out = res["out"]
    print(f"[drivemind] wrote {', '.join(str(p) for p in res['files'].values())}", flush=True)
    print(json.dumps({"out": str(out), **res["metrics"]}, default=str))
    return res["metrics"]


def newest_run(outputs: Path) -> Path:
    """The training run under ``outputs`` whose latest checkpoint was written last; a clear
    error when there is none."""
    from drivemind.training.callbacks import LATEST

    found = []
    for sub in ("runs", "sweeps"):
        for latest in (outputs / sub).glob(f"**/checkpoints/{LATEST}"):
            run = latest.parent.parent
            if (run / "config.yaml").is_file():
                found.append((latest.stat().st_mtime_ns, str(run), run))
    if not found:
        where = outputs.resolve()
        raise FileNotFoundError(
            f"no trained run to evaluate: no run with a checkpoint under {where}/runs or "
            f"{where}/sweeps. Train one first (python scripts/train.py, from this directory), "
            f"pass run=<training run directory>, or evaluate the reference driver with "
            f"policy=autopilot")
    return max(found)[2].resolve()


if __name__ == "__main__":
    main()
