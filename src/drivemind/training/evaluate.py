"""Load a trained run's policy, frozen, for evaluation on the fixed routes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch as th
import yaml

from .build import apply_torch_threads, check_compatible, study_world
from .callbacks import latest_checkpoint


def eval_folder(town: str, density: str) -> str:
    """The report folder's name, ``<town>-<density>``; a town given as a file (``town=custom
    town.name=/path/map.xodr``, as :func:`drivemind.maps.resolve.is_town_file` tells) by its
    file's stem, so its reports stay inside the run (an absolute path joined to the run's folder
    would put them beside the map file)."""
    from ..maps.opendrive import xodr_stem
    from ..maps.resolve import is_town_file

    return f"{xodr_stem(town) if is_town_file(town) else town}-{density}"


ACTORS = ("auto", "online")


def load_policy(run_dir: str | Path, checkpoint: str = "latest", device: str = "auto",
                actor: str = "auto"):
    """(policy(obs) -> action, model) from ``run_dir``'s latest checkpoint, its best on the
    validation routes (``"best"``, a run trained with ``validation.every``; :mod:`.selection`) or
    the given ``model_<steps>.zip``. The network is put in eval mode with gradients off; the action is
    the deterministic one: the moving average's of the actor weights when the run kept one
    (SAC's ``algo.policy_kwargs.actor_ema``) unless ``actor="online"``, then the online actor's."""
    if actor not in ACTORS:
        raise ValueError(f"unknown actor {actor!r}; valid: {', '.join(ACTORS)}")
    run_dir = Path(run_dir)
    cfg_file = run_dir / "config.yaml"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{run_dir} is not a training run directory (no config.yaml); pass "
                                f"run=<the directory scripts/train.py printed>")
    cfg = yaml.safe_load(cfg_file.read_text())
    if checkpoint == "latest":
        entry = latest_checkpoint(run_dir)
        if entry is None:
            raise FileNotFoundError(f"no checkpoint in {run_dir / 'checkpoints'} (latest.json missing)")
        path = entry["model"]
    elif checkpoint == "best":  # checkpoint selection on the validation routes (.selection)
        from .selection import BEST
        path = run_dir / "checkpoints" / BEST
        if not path.exists():
            raise FileNotFoundError(
                f"{run_dir} has no best checkpoint ({path} missing): only a run trained with "
                f"validation.every=<env steps> keeps one; evaluate checkpoint=latest instead")
    else:
        path = checkpoint
    if not Path(path).exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if cfg["algo"]["name"] == "minddrive":  # the language-action agent (not an SB3 model)
        return _load_minddrive(run_dir, path, cfg)
    from ..agents import DriveSAC
    from ..agents.ppo import DrivePPO
    cls = {"sac": DriveSAC, "ppo": DrivePPO}[cfg["algo"]["name"]]
    model = cls.load(path, device=device)
    model.policy.set_training_mode(False)
    if actor == "online" and getattr(model.policy, "use_actor_ema", False):
        model.policy.use_actor_ema = False
    return _frozen_policy(model, run_dir, cfg), model


def _frozen_policy(model, run_dir: Path, cfg: dict):
    """A callable obs -> deterministic action of ``model`` (gradients off), carrying the model,
    the run's config and its observation signature."""
    for p in model.policy.parameters():
        p.requires_grad_(False)

    def policy(obs):
        with th.no_grad():
            action, _ = model.predict(obs, deterministic=True)
        return np.asarray(action, np.float32)

    policy.model = model
    policy.config = cfg
    policy.obs_signature = json.loads((run_dir / "obs_signature.json").read_text()) \
        if (run_dir / "obs_signature.json").exists() else None
    return policy


def _load_minddrive(run_dir: Path, path, cfg: dict):
    """MindDrive's frozen policy: deterministic meta-actions (the most likely one), read from the
    step's facts, which the evaluation runner hands it through ``policy.observe(info)``."""
    from ..agents.minddrive import MindDriveAgent

    model = MindDriveAgent.load(path)
    policy = _frozen_policy(model, run_dir, cfg)
    policy.observe = model.observe
    return policy, model


def check_policy_env(policy, env_space, where):
    """A clear error when the env's observations differ from the checkpoint's."""
    if policy.obs_signature is not None:
        check_compatible(policy.obs_signature, env_space, where)


def evaluate_run(run_dir: str | Path, town: str | None = None, density: str | None = None, *,
                 checkpoint: str = "latest", device: str = "auto", map_path: str | None = None,
                 out_dir: str | Path | None = None, meta: dict | None = None, sim: dict | None = None,
                 validation: bool = False, actor: str = "auto", **kwargs) -> dict:
    """Evaluate a training run's checkpoint on the fixed routes of ``town`` x ``density`` (default:
    the run's own) with the run's obs/env settings (``sim``: another backend's config, e.g. a CARLA
    server for a policy trained on the embedded sim); reports go to ``<run>/eval/<town>-<density>``
    (:func:`eval_folder`) unless ``out_dir``. ``validation``: the run's validation routes and
    their traffic seeds instead (:mod:`.selection`; the training town only, reports under
    ``<run>/eval/validation`` unless ``out_dir``). ``actor``: as :func:`load_policy`. ``kwargs`` go to
    :func:`drivemind.evaluation.evaluate`. Returns its result plus ``out`` (the report folder)."""
    from ..evaluation import evaluate
    from .build import env_kwargs

    run_dir = Path(run_dir)
    policy, _ = load_policy(run_dir, checkpoint, device, actor)
    cfg = policy.config
    # the run's torch threads, as it trained (an evaluation beside one busy process: 23 s at torch's
    # default of 2 threads, 12 s at 1; beside a study's training runs up to 17x slower)
    apply_torch_threads(cfg)
    town = town or cfg["town"]["name"]
    density = density or cfg["density"]["name"]
    if not sim:  # a study run from before a traffic setting existed: the old world
        cfg = study_world(cfg)
    kw = env_kwargs({**cfg, "map_path": map_path or cfg.get("map_path"), **({"sim": sim} if sim else {})})
    out = Path(out_dir) if out_dir else run_dir / "eval" / eval_folder(town, density)
    if validation:
        from .selection import validation_env_kwargs

        if town != cfg["town"]["name"]:
            raise ValueError(f"validation routes are the training town's ({cfg['town']['name']}), "
                             f"not {town}'s: leave town unset")
        kw = validation_env_kwargs(kw, run_dir, town, int((cfg.get("validation") or {}).get("routes", 10)))
        out = Path(out_dir) if out_dir else run_dir / "eval" / "validation"
    res = evaluate(policy, town=town, density=density, out_dir=out, env_kwargs=kw,
                   meta={"run": str(run_dir), "checkpoint": checkpoint, "policy": run_dir.name,
                         **({"actor": actor} if actor != "auto" else {}),
                         **(meta or {})},
                   # a clear error before any route runs, from the evaluation's own env
                   check_env=lambda env: check_policy_env(policy, env.observation_space, run_dir),
                   **kwargs)
    return {**res, "out": out}
