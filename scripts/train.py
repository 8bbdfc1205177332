#!/usr/bin/env python
"""Train a driving policy (Hydra entry point; configs in configs/).

    python scripts/train.py                                   # CPU defaults: SAC, grid town, regular traffic
    python scripts/train.py reward=chen algo=ppo town=Town02 density=dense
    python scripts/train.py experiment=paper                  # the papers' settings (GPU)
    python scripts/train.py -m reward=chen,revolve seed=0,1,2 # a sweep (one run directory each)
    python scripts/train.py resume=outputs/runs/<day>/<time>-<name>   # continue a killed run

Every run writes its resolved config, checkpoints, logs and metrics into its own directory
(outputs/runs/... or outputs/sweeps/...); Ctrl-C saves a checkpoint and exits. The last line of
stdout is the run's summary as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import drivemind  # noqa: E402,F401  (registers the run-name resolvers of configs/config.yaml)
import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    from drivemind.training.cli import run_cli

    return run_cli(_main, cfg)


def _main(cfg: DictConfig) -> dict:
    from drivemind.training import train

    c = OmegaConf.to_container(cfg, resolve=True)
    resume = c.get("resume")
    run_dir = Path(resume) if resume else Path(HydraConfig.get().runtime.output_dir)
    print(f"[drivemind] run directory: {run_dir}", flush=True)
    if resume:  # only what the command line sets explicitly may change a resumed run
        from drivemind.training.run import resume_changes
        c_train = resume_changes(c, list(HydraConfig.get().overrides.task))
    else:
        c_train = c
    summary = train(c_train, run_dir, resume=bool(resume))
    if resume:  # what follows (evaluation) uses the run's own config, as train() did
        import yaml
        c = yaml.safe_load((run_dir / "config.yaml").read_text())
    ev = c.get("eval") or {}
    if ev.get("at_end") and summary["status"] == "finished":
        from drivemind.training.evaluate import evaluate_run

        res = evaluate_run(run_dir, checkpoint=ev.get("checkpoint") or "latest",
                           routes=ev.get("routes"), video_route=ev.get("video_route", 0),
                           max_steps_per_route=ev.get("max_steps_per_route", 20000))
        summary["eval"] = {k: res["metrics"][k] for k in ("AS", "RC", "TD", "CS", "SR", "CR")}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    if summary["status"] != "finished":
        print(f"[drivemind] {summary['status']}: checkpoint saved at {summary['checkpoint']['steps']} "
              f"steps; continue with: python scripts/train.py resume={run_dir}", flush=True)
    print(json.dumps(summary, default=str))
    return summary


if __name__ == "__main__":
    main()
