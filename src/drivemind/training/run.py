"""One training run: its own output directory with the resolved config, checkpoints (model and
replay buffer), logs (TensorBoard, CSV, Weights & Biases offline) and metrics; resumable.

    run_dir/
      config.yaml          the resolved config (resume reads it back)
      checkpoints/         model_<steps>.zip, buffer_<steps>.pkl, latest.json; with validation.every,
                           best.zip + best.json (the best policy on the validation routes, .selection)
      logs/                TensorBoard events, progress.csv, episodes.csv (validation.csv)
      validation_routes.json   with validation.every: the validation routes
      wandb/               Weights & Biases (offline unless logger.wandb.mode=online)
      summary.json         steps, wall time, why it stopped, last episode metrics, the code used
                           (package version, git commit, dirty) per invocation
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import yaml

from ..evaluation import compute_metrics
from ..paths import code_version
from .build import (apply_torch_threads, check_compatible, env_kwargs, make_model, make_reward_from_cfg,
                    make_vec_env, observation_signature, study_world, town_density, with_reward_window)
from .callbacks import (CheckpointEvery, EpisodeMetrics, StopAfter, StopOnSignal, latest_checkpoint,
                        save_checkpoint, trim_episodes)
from .validate import validate_config


def _setup_logger(model, cfg: dict, run_dir: Path, resume: bool = False):
    from stable_baselines3.common.logger import CSVOutputFormat, configure

    lcfg = dict(cfg.get("logger") or {})
    formats = list(lcfg.get("formats") or ["stdout", "csv", "tensorboard"])
    if "tensorboard" not in formats:
        formats.append("tensorboard")  # always
    csv_file = run_dir / "logs" / "progress.csv"
    old = csv_file.read_text() if resume and csv_file.exists() else ""  # the earlier rows
    logger = configure(str(run_dir / "logs"), formats)
    if old.strip():  # SB3 opens progress.csv with "w+": write the old rows back and continue them
        for f in logger.output_formats:
            if isinstance(f, CSVOutputFormat):
                f.file.write(old if old.endswith("\n") else old + "\n")
                f.file.flush()
                f.keys = old.splitlines()[0].split(f.separator)
    model.set_logger(logger)


def _start_wandb(cfg: dict, run_dir: Path, resume_id: str | None):
    w = dict((cfg.get("logger") or {}).get("wandb") or {})
    mode = w.get("mode", "offline")
    if mode == "disabled":
        return None
    if mode not in ("offline", "online"):
        raise ValueError(f"unknown logger.wandb.mode {mode!r}; valid: offline, online, disabled")
    try:
        import wandb
    except ImportError:
        warnings.warn("wandb is not installed: Weights & Biases logging is off (pip install wandb)")
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(project=w.get("project", "drivemind"), entity=w.get("entity"), mode=mode,
                     dir=str(run_dir), name=run_dir.name, config=cfg, sync_tensorboard=True,
                     id=resume_id, resume="allow" if resume_id else None, reinit="finish_previous")
    (run_dir / "wandb_id").write_text(run.id)
    return run


# what a resumed run may change from its saved config (everything else would change the experiment)
RESUME_KEYS = ("total_timesteps", "max_minutes", "torch_threads", "progress_bar", "checkpoint_every", "device",
               "log_interval", "verbose")


def resume_changes(cfg: dict, overrides: list[str]) -> dict:
    """What a resumed run takes from ``cfg``: the ``RESUME_KEYS`` set explicitly by
    ``overrides`` (Hydra's command-line overrides, e.g. ``["total_timesteps=2000"]``)."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    return {k: cfg[k] for k in RESUME_KEYS if k in given and k in cfg}


def resumed_config(run_dir: str | Path, changes: dict) -> tuple[dict, dict]:
    """The config a resumed run continues with (the one saved in ``run_dir`` with the
    ``RESUME_KEYS`` that ``changes`` holds) and its latest checkpoint entry; FileNotFoundError
    when ``run_dir`` holds no run to resume."""
    run_dir = Path(run_dir)
    saved_cfg = run_dir / "config.yaml"
    entry = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if entry is None or not saved_cfg.exists():
        raise FileNotFoundError(f"nothing to resume in {run_dir}: it needs config.yaml and "
                                f"checkpoints/latest.json (was the run started by scripts/train.py?)")
    cfg = {**yaml.safe_load(saved_cfg.read_text()), **{k: changes[k] for k in RESUME_KEYS if k in changes}}
    return study_world(cfg), entry  # a study run from before a traffic setting goes on in the old world


_UNKNOWN_CODE = {"drivemind": None, "commit": None, "dirty": None}


def resume_record(run_dir: Path, entry: dict) -> tuple[float, list]:
    """The wall time and code list of a run's invocations up to the checkpoint ``entry`` it
    resumes from: stored with the checkpoint since they were recorded there (a run killed by
    SIGKILL or a lost machine writes no summary, and its time up to the checkpoint still counts;
    what it did after the checkpoint is driven again and counted then), else from
    ``summary.json``, else unknown (an earlier invocation without a record)."""
    if "wall_s_total" in entry:
        return float(entry["wall_s_total"]), list(entry.get("code") or [_UNKNOWN_CODE])
    f = Path(run_dir) / "summary.json"
    if f.exists():
        old = json.loads(f.read_text())
        return float(old.get("wall_s_total", old.get("wall_s", 0.0))), list(old.get("code") or [_UNKNOWN_CODE])
    return 0.0, [_UNKNOWN_CODE]


def _selection(cfg: dict, run_dir: Path, record):
    """The checkpoint-selection callback when ``validation.every`` > 0, else None."""
    v = cfg.get("validation") or {}
    if not int(v.get("every") or 0):
        return None
    from .selection import ValidateEvery

    town, density = town_density(cfg)
    return ValidateEvery(run_dir, int(v["every"]), town, density, env_kwargs(cfg),
                         n_routes=int(v.get("routes", 10)),
                         max_steps_per_route=int(v.get("max_steps_per_route", 6000)),
                         wall=lambda: record()["wall_s_total"])


def train(cfg: dict, run_dir: str | Path, resume: bool = False) -> dict:
    """Train as ``cfg`` says, writing everything into ``run_dir``. With ``resume``, continue the
    run in ``run_dir`` from its latest checkpoint (model, optimiser state and replay buffer) with
    the config saved there; ``cfg`` then only contributes the ``RESUME_KEYS`` it holds.

    The settings are checked first (``validate.validate_config``): a bad one raises ConfigError
    before ``run_dir`` is created or written."""
    run_dir = Path(run_dir)
    if (cfg.get("algo") or {}).get("name") == "minddrive":  # its own SFT + language-space PPO loop
        from ..agents.minddrive_train import train_minddrive
        run_dir.mkdir(parents=True, exist_ok=True)
        return train_minddrive(cfg, run_dir, resume=resume)
    ckpt_dir = run_dir / "checkpoints"
    entry = None
    if resume:
        cfg, entry = resumed_config(run_dir, cfg)
    validate_config(cfg, resumed=resume)
    cfg = with_reward_window(cfg)  # a null CLG window -> the tower's measured one, saved with the run
    if not resume:
        held = [f for f in ("summary.json", "checkpoints/latest.json") if (run_dir / f).exists()]
        if held:
            raise FileExistsError(
                f"{run_dir} already holds a training run ({', '.join(held)}): a new run there would "
                f"overwrite it. Continue it with `python scripts/train.py resume={run_dir}`, or "
                f"train into another directory")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))

    apply_torch_threads(cfg)
    total = int(cfg["total_timesteps"])
    reward_fn = make_reward_from_cfg(cfg)
    venv = make_vec_env(cfg)
    algo = cfg["algo"]["name"]
    sig = observation_signature(venv.observation_space)
    try:
        if entry is not None:
            from ..agents import DriveSAC
            from ..agents.ppo import DrivePPO
            cls = DriveSAC if algo == "sac" else DrivePPO
            if (run_dir / "obs_signature.json").exists():  # before load: SB3's own error is vaguer
                check_compatible(json.loads((run_dir / "obs_signature.json").read_text()),
                                 venv.observation_space, run_dir)
            model = cls.load(entry["model"], env=venv, reward_fn=reward_fn,
                             device=cfg.get("device", "auto"))
            if entry.get("buffer") and hasattr(model, "load_replay_buffer"):
                model.load_replay_buffer(entry["buffer"])
            done = model.num_timesteps
        else:
            model = make_model(cfg, venv, reward_fn)
            (run_dir / "obs_signature.json").write_text(json.dumps(sig))
            done = 0
        _setup_logger(model, cfg, run_dir, resume=entry is not None)
        wid = (run_dir / "wandb_id").read_text().strip() if resume and (run_dir / "wandb_id").exists() else None
        wb = _start_wandb(cfg, run_dir, wid)
        stop = StopOnSignal()
        budget = StopAfter(cfg.get("max_minutes"))
        # wall time of the earlier invocations of a resumed run (also the curves' x axis) and every
        # invocation's code, oldest first (a resumed run may span commits)
        before, code = resume_record(run_dir, entry) if entry is not None else (0.0, [])
        code = code + [code_version()]
        if entry is not None:
            trim_episodes(run_dir / "logs" / "episodes.csv", int(entry["steps"]))
        metrics = EpisodeMetrics(run_dir / "logs" / "episodes.csv",
                                 window=int(cfg.get("metrics_window", 20)), wall_offset=before)
        t0 = time.perf_counter()

        def record(wall: float | None = None) -> dict:  # stored with each checkpoint: the summary's so far
            wall = time.perf_counter() - t0 if wall is None else wall
            return {"wall_s_total": round(before + wall, 1), "code": code}

        keep = int(cfg.get("checkpoint_keep", 2))
        ck = CheckpointEvery(ckpt_dir, int(cfg.get("checkpoint_every", 0)),
                             with_buffer=bool(cfg.get("checkpoint_buffer", True)), keep=keep, record=record)
        sel = _selection(cfg, run_dir, record)  # validation.every > 0: checkpoint selection
        reason = "failed"
        try:
            model.learn(total_timesteps=max(total - done, 0),
                        callback=[stop, budget, metrics, ck] + ([sel] if sel else []),
                        log_interval=int(cfg.get("log_interval", 4 if algo == "sac" else 1)),
                        progress_bar=bool(cfg.get("progress_bar", True)),
                        reset_num_timesteps=entry is None)
            reason = (f"stopped by {stop.received}" if stop.received
                      else f"stopped after max_minutes={cfg.get('max_minutes')}" if budget.reached else "finished")
            if sel and not stop.received:  # the final policy competes too (its time counts)
                sel.final()
        except BaseException as e:  # the summary must not say "finished" for a crashed run
            reason = f"failed: {type(e).__name__}: {e}"
            raise
        finally:
            stop._on_training_end()  # SB3 skips it when learn raises: restore the signal handlers
            wall = time.perf_counter() - t0
            rec = record(wall)
            entry = save_checkpoint(model, ckpt_dir, bool(cfg.get("checkpoint_buffer", True)), keep=keep,
                                    record=rec)
            summary = {
                "steps": int(model.num_timesteps), "total_timesteps": total, "status": reason,
                "wall_s": round(wall, 1), "wall_s_total": rec["wall_s_total"], "algo": algo, "reward": cfg["reward"]["name"],
                "checkpoint": {k: v for k, v in entry.items() if k not in rec},  # its files; rec is above
                "resumed_from": done if resume else None, "code": code,
                **({"validation": {"best": sel.best, "validations": len(sel.rows)}} if sel else {}),
                "nonfinite_rewards": int(getattr(getattr(model, "replay_buffer", None),
                                                 "nonfinite_rewards",
                                                 getattr(model, "nonfinite_rewards", 0)) or 0),
                "episode_metrics": (compute_metrics(metrics.records, mode="train")
                                    if metrics.records else None),
            }
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
            model.logger.close()  # flushes and ends the TensorBoard writer thread, closes the CSV
            if wb is not None:
                wb.finish()
    finally:
        if locals().get("sel"):
            sel.close()
        close = getattr(model, "close_service", None) if "model" in locals() else None
        if close is not None:
            close()  # the reward service's worker process
        venv.close()
    return summary
