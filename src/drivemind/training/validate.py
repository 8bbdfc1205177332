"""Settings checked before a run starts: a nonsense value (a batch of 0, a negative budget, a
``learning_starts`` past the budget, ``tau`` outside (0, 1], ...) fails with one line naming the
key, the value given and the valid range, before anything is built or written.

    from drivemind.training.validate import validate_config
    validate_config(cfg)        # raises ConfigError (a ValueError) listing every bad value

``scripts/train.py`` runs the same check from a Hydra callback (:class:`ValidateBeforeRun`) before
Hydra creates the run directory, so a rejected run leaves nothing behind; ``train()`` runs it too
(for Python callers and resumed runs). Only keys that are present are checked (a missing one takes
its documented default downstream), except ``total_timesteps`` and ``algo.name``, which a run
needs. Keys this module does not know are left to the code that reads them (SB3 names an unknown
``algo`` argument).
"""

from __future__ import annotations

import math
import re
import sys
from numbers import Integral, Real
from typing import Any

from hydra.experimental.callback import Callback

ALGOS = ("sac", "ppo", "minddrive")
VEC_ENVS = ("dummy", "subproc")
LOG_FORMATS = ("stdout", "csv", "tensorboard", "log", "json")
WANDB_MODES = ("offline", "online", "disabled")
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
_MISSING = object()


class ConfigError(ValueError):
    """Settings outside their valid ranges; the message is one line (problems joined by "; ")."""


def _get(cfg: dict, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _is_int(v) -> bool:
    """An integer (bools excluded); an integral float such as 1e6 from the command line counts."""
    if isinstance(v, bool):
        return False
    return isinstance(v, Integral) or (isinstance(v, Real) and math.isfinite(v) and float(v).is_integer())


def _is_num(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)


class _Checker:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.problems: list[str] = []

    def bad(self, key: str, value, want: str):
        self.problems.append(f"{key}={value!r} is invalid: {want}")

    def int(self, key: str, lo: int | None = None, hi: int | None = None, *, none_ok: bool = False,
            also: tuple = (), required: bool = False, why: str = ""):
        """An integer in [lo, hi] (or one of ``also``, or None when ``none_ok``); returns it or
        None when absent / bad."""
        v = _get(self.cfg, key)
        if v is _MISSING:
            if required:
                self.problems.append(f"{key} is missing: set {key}=<integer >= {lo}>")
            return None
        if v is None and none_ok:
            return None
        if _is_int(v) and int(v) in also:
            return int(v)
        ok = _is_int(v) and (lo is None or int(v) >= lo) and (hi is None or int(v) <= hi)
        if not ok:
            rng = (f"in [{lo}, {hi}]" if lo is not None and hi is not None
                   else f">= {lo}" if lo is not None else f"<= {hi}")
            alts = "".join(f" or {a}" for a in also) + (" or null" if none_ok else "")
            self.bad(key, v, f"must be an integer {rng}{alts}{why}")
            return None
        return int(v)

    def num(self, key: str, lo: float | None = None, hi: float | None = None, *,
            lo_open: bool = False, hi_open: bool = False, none_ok: bool = False, why: str = ""):
        """A finite number in the interval (open / closed ends as given)."""
        v = _get(self.cfg, key)
        if v is _MISSING or (v is None and none_ok):
            return None
        if callable(v) and key.endswith("learning_rate"):
            return None  # an SB3 schedule (Python callers)
        ok = _is_num(v)
        if ok and lo is not None:
            ok = v > lo if lo_open else v >= lo
        if ok and hi is not None:
            ok = v < hi if hi_open else v <= hi
        if not ok:
            if lo is not None and hi is not None:
                rng = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
            elif lo is not None:
                rng = f"{'>' if lo_open else '>='} {lo:g}"
            else:
                rng = f"{'<' if hi_open else '<='} {hi:g}"
            self.bad(key, v, f"must be a number {rng}{' or null' if none_ok else ''}{why}")
            return None
        return float(v)

    def choice(self, key: str, valid: tuple[str, ...]):
        v = _get(self.cfg, key)
        if v is _MISSING:
            return None
        if v not in valid:
            self.bad(key, v, f"valid: {', '.join(valid)}")
            return None
        return v

    def flag(self, key: str):
        v = _get(self.cfg, key)
        if v is _MISSING:
            return
        if not (isinstance(v, bool) or (_is_int(v) and int(v) in (0, 1))):
            self.bad(key, v, "must be true or false")


def _check_run(c: _Checker) -> tuple[int | None, int]:
    total = c.int("total_timesteps", 1, required=True)
    n_envs = c.int("n_envs", 1)
    c.choice("vec_env", VEC_ENVS)
    c.int("seed", 0, 2**32 - 1)
    dev = _get(c.cfg, "device")
    if dev is not _MISSING and not (isinstance(dev, str) and _DEVICE.match(dev)):
        c.bad("device", dev, "valid: auto, cpu, cuda, cuda:<index>, mps")
    c.int("torch_threads", 0, why=" (0 = torch's default)")
    c.int("checkpoint_every", 0, why=" (env steps between checkpoints; 0 = only at the end)")
    c.int("checkpoint_keep", 0, why=" (the newest checkpoints kept; 0 = every one)")
    c.num("max_minutes", 0, lo_open=True, none_ok=True, why=" (a wall-time budget; null = none)")
    feats = _get(c.cfg, "obs.features")
    if feats is not _MISSING and feats is not None and not (isinstance(feats, str) and feats):
        c.bad("obs.features", feats, "must be null or the name/path of a BEV encoder (bev_encoder)")
    c.flag("checkpoint_buffer")
    c.int("metrics_window", 1)
    c.int("log_interval", 1)
    c.flag("progress_bar")
    c.int("verbose", 0, 2)
    for k in ("max_distance", "max_route_length", "stuck_time", "max_lateral"):
        c.num(f"env.{k}", 0, lo_open=True)
    c.int("env.max_episode_steps", 1, none_ok=True)
    c.flag("eval.at_end")
    c.int("eval.max_steps_per_route", 1)
    routes = _get(c.cfg, "eval.routes")
    if routes is not _MISSING and routes is not None and not (
            isinstance(routes, (list, tuple)) and routes and all(_is_int(r) and r >= 0 for r in routes)):
        c.bad("eval.routes", routes, "must be null (all routes) or a non-empty list of route "
                                     "indices >= 0, e.g. [0,3]")
    every = c.int("validation.every", 0, why=" (env steps between validations; 0 = off)")
    c.int("validation.routes", 1)
    c.int("validation.max_steps_per_route", 1)
    ck = c.choice("eval.checkpoint", ("latest", "best"))
    if ck == "best" and not every:
        c.bad("eval.checkpoint", ck, "needs validation.every=<env steps> > 0 (only a run that "
                                     "validates keeps a best checkpoint); or eval.checkpoint=latest")
    if every and _get(c.cfg, "algo.name") == "minddrive":
        c.bad("validation.every", every, "is for the SB3 agents (algo=sac, algo=ppo); MindDrive's "
                                         "training loop does not validate: set validation.every=0")
    if every and _get(c.cfg, "sim.backend") == "carla":
        c.bad("validation.every", every, "needs the embedded simulator (sim=lite): validation drives "
                                         "a second world, which one CARLA server cannot hold beside "
                                         "the training run's; set validation.every=0")
    fmts = _get(c.cfg, "logger.formats")
    if fmts is not _MISSING and fmts is not None:
        bad = [f for f in (fmts if isinstance(fmts, (list, tuple)) else [fmts]) if f not in LOG_FORMATS]
        if bad or not isinstance(fmts, (list, tuple)):
            c.bad("logger.formats", fmts, f"must be a list of: {', '.join(LOG_FORMATS)}")
    c.choice("logger.wandb.mode", WANDB_MODES)
    return total, n_envs or 1


def _check_sac(c: _Checker, total: int | None, n_envs: int, resumed: bool):
    c.num("algo.learning_rate", 0, lo_open=True)
    buffer_size = c.int("algo.buffer_size", 1)
    batch = c.int("algo.batch_size", 1)
    if buffer_size is not None and batch is not None and batch > buffer_size:
        c.bad("algo.batch_size", batch, f"must be <= algo.buffer_size={buffer_size}")
    if buffer_size is not None and buffer_size < n_envs:
        c.bad("algo.buffer_size", buffer_size, f"must be >= n_envs={n_envs} (one slot per env at least)")
    c.int("algo.n_steps", 1, why=" (n-step returns; 1 = one-step)")
    starts = c.int("algo.learning_starts", 0)
    if starts is not None and total is not None and starts >= total and not resumed:
        # (a resumed run cannot change learning_starts; a budget cut short there is allowed)
        c.bad("algo.learning_starts", starts,
              f"must be < total_timesteps={total} (no gradient step would run): lower "
              f"algo.learning_starts or raise total_timesteps")
    c.num("algo.tau", 0, 1, lo_open=True)
    c.num("algo.gamma", 0, 1, lo_open=True)
    tf = _get(c.cfg, "algo.train_freq")
    if tf is not _MISSING and not (
            (_is_int(tf) and tf >= 1)
            or (isinstance(tf, (list, tuple)) and len(tf) == 2 and _is_int(tf[0]) and tf[0] >= 1
                and tf[1] in ("step", "episode"))):
        c.bad("algo.train_freq", tf, "must be an integer >= 1 or [n, step|episode] with n >= 1")
    c.int("algo.gradient_steps", 1, also=(-1,), why=" (-1 = as many as env steps collected)")
    c.int("algo.target_update_interval", 1)
    ent = _get(c.cfg, "algo.ent_coef")
    if ent is not _MISSING:
        ok = _is_num(ent) and ent >= 0
        if isinstance(ent, str) and (ent == "auto" or ent.startswith("auto_")):
            try:
                ok = ent == "auto" or float(ent[5:]) > 0
            except ValueError:
                ok = False
        if not ok:
            c.bad("algo.ent_coef", ent, "must be auto, auto_<initial value > 0> or a number >= 0")
    te = _get(c.cfg, "algo.target_entropy")
    if te is not _MISSING and te != "auto" and not (_is_num(te) and math.isfinite(te)):
        c.bad("algo.target_entropy", te, "must be auto (minus the number of action dimensions) or a number")
    c.int("algo.palette_size", 2, 256, why=" (the replay buffer's codes are one byte)")
    c.int("algo.embedding_dim", 1, none_ok=True)
    c.int("algo.reward_learn_every", 1, why=" (SAC gradient steps per update of the reward's own model)")
    c.int("algo.label_every", 1, why=" (transitions stored between labelling rounds)")
    c.flag("algo.policy_kwargs.critic_layer_norm")
    c.num("algo.policy_kwargs.actor_ema", 0, 1, lo_open=True, none_ok=True)
    from ..agents import AUTOCAST
    c.choice("algo.autocast", AUTOCAST)
    svc = _get(c.cfg, "algo.reward_service")
    if isinstance(svc, dict):
        c.flag("algo.reward_service.enabled")
        c.int("algo.reward_service.max_batch", 1)
        c.num("algo.reward_service.max_wait_ms", 0)
        c.int("algo.reward_service.max_pending", 1)
        c.int("algo.reward_service.threads", 1)
        c.num("algo.reward_service.wait_s", 0, lo_open=True)
    elif svc is not _MISSING and svc not in (None, True, False):
        c.bad("algo.reward_service", svc, "must be null, true, false or a mapping of its settings")
    _check_guidance(c)


def _check_guidance(c: _Checker) -> None:
    """algo.guidance / algo.guidance_kwargs (Found-RL's action guidance, agents/guidance.py)."""
    from ..agents.guidance_config import MODES, GuidanceConfig

    mode = _get(c.cfg, "algo.guidance")
    if mode is _MISSING or mode is None:
        return
    if mode not in MODES:
        c.bad("algo.guidance", mode, f"must be one of {', '.join(MODES)}")
        return
    kw = _get(c.cfg, "algo.guidance_kwargs")
    if kw is not _MISSING and kw is not None and not isinstance(kw, dict):
        c.bad("algo.guidance_kwargs", kw, "must be a mapping (source, vmr, awag)")
        return
    try:
        GuidanceConfig.from_config(mode, None if kw is _MISSING else kw)
    except ValueError as e:
        c.problems.append(str(e))


# SAC settings PPO refuses: (key, the values that mean "not set", what it is and what PPO has instead)
_SAC_ONLY = (
    ("algo.policy_kwargs.critic_layer_norm", (None, False), "LayerNorm in the Q heads; PPO has no Q heads"),
    ("algo.policy_kwargs.actor_ema", (None,), "a moving average of the actor's weights for evaluation; "
     "DrivePPO has none"),
    ("algo.reward_learn_every", (None,), "gradient steps per update of the reward's own model; PPO's is "
     "algo.reward_learn_calls, per update"),
    ("algo.label_every", (None,), "transitions between labelling rounds; PPO labels each rollout whole"),
    ("algo.autocast", (None, "none"), "its gradient step in bfloat16; PPO's update runs in float32"),
)


def _check_ppo(c: _Checker, n_envs: int):
    c.num("algo.learning_rate", 0, lo_open=True)
    n_steps = c.int("algo.n_steps", 1)
    batch = c.int("algo.batch_size", 2, why=" (advantages are normalised per mini-batch)")
    if n_steps is not None:
        rollout = n_steps * n_envs
        if rollout < 2:
            c.bad("algo.n_steps", n_steps, f"must make n_steps * n_envs >= 2 (n_envs={n_envs})")
        elif batch is not None and rollout % batch:
            near = max(d for d in range(2, min(batch, rollout) + 1) if rollout % d == 0)
            c.bad("algo.batch_size", batch,
                  f"must divide the rollout n_steps * n_envs = {n_steps} * {n_envs} = {rollout} "
                  f"(otherwise the last mini-batch is truncated), e.g. algo.batch_size={near}")
    c.int("algo.n_epochs", 1)
    c.num("algo.gamma", 0, 1, lo_open=True)
    c.num("algo.gae_lambda", 0, 1)
    c.num("algo.clip_range", 0, lo_open=True)
    c.num("algo.clip_range_vf", 0, lo_open=True, none_ok=True)
    c.num("algo.ent_coef", 0)
    c.num("algo.vf_coef", 0)
    c.num("algo.max_grad_norm", 0, lo_open=True)
    c.num("algo.target_kl", 0, lo_open=True, none_ok=True)
    c.int("algo.reward_learn_calls", 0, none_ok=True, why=" (null = one per PPO mini-batch)")
    for key, unset, why in _SAC_ONLY:
        v = _get(c.cfg, key)
        if v is not _MISSING and v not in unset:
            c.bad(key, v, f"is a SAC setting ({why}): remove it")


def _check_reward(c: _Checker):
    name = _get(c.cfg, "reward.name")
    params = _get(c.cfg, "reward.params")
    if name is _MISSING:
        return  # build.make_reward_from_cfg says what is missing
    from ..rewards import REWARDS, reward_params

    if name not in REWARDS:
        c.bad("reward.name", name, f"valid: {', '.join(REWARDS)}")
        return
    if isinstance(params, dict):
        valid = reward_params(name)
        bad = [k for k in params if k not in valid]
        if bad:
            c.problems.append(f"reward {name!r} got unknown parameter(s) {bad} under reward.params; "
                              f"valid: {', '.join(valid) if valid else '(none)'}")
    elif params not in (_MISSING, None):
        c.bad("reward.params", params, "must be a mapping of the reward's parameters")


def config_problems(cfg: dict, resumed: bool = False) -> list[str]:
    """Every setting in ``cfg`` (a resolved config dict, as ``train()`` takes) outside its valid
    range, one message each; empty when the config is fine. ``resumed``: the config of a run
    being resumed (``learning_starts`` is then not held against the new budget: it cannot be
    changed on resume)."""
    if not isinstance(cfg, dict):
        return [f"the config must be a mapping, got {type(cfg).__name__}"]
    c = _Checker(cfg)
    total, n_envs = _check_run(c)
    algo = _get(cfg, "algo.name")
    if algo is _MISSING or algo not in ALGOS:
        c.problems.append(f"algo.name={None if algo is _MISSING else algo!r} is invalid: "
                          f"valid: {', '.join(ALGOS)} (choose algo=<name>)")
    elif algo == "sac":
        _check_sac(c, total, n_envs, resumed)
    elif algo == "ppo":
        _check_ppo(c, n_envs)
    # minddrive: its options are checked by agents.minddrive when the agent is built
    _check_reward(c)
    return c.problems


def validate_config(cfg: dict, resumed: bool = False) -> None:
    """Raise :class:`ConfigError` (one line naming every bad key, its value and the valid range)
    when ``cfg`` holds a nonsense setting (``resumed``: as in :func:`config_problems`)."""
    problems = config_problems(cfg, resumed)
    if problems:
        raise ConfigError("; ".join(problems))


# ---------------------------------------------------------------------------- Hydra


def _task_config(config) -> dict | None:
    """The job's config without Hydra's own section, resolved (None if it cannot be resolved here:
    ``train()`` checks it again once the job runs)."""
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(config, resolve=False)
    c.pop("hydra", None)
    try:
        return OmegaConf.to_container(OmegaConf.create(c), resolve=True)
    except Exception:  # an interpolation only a running job can resolve
        return None


def _fail(msg: str):
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def _check_job(config, given: list[str], prefix: str = ""):
    cfg = _task_config(config)
    if cfg is None:
        return
    resumed = bool(cfg.get("resume"))
    if resumed:
        from .run import resume_changes, resumed_config

        try:
            cfg, _ = resumed_config(cfg["resume"], resume_changes(cfg, given))
        except FileNotFoundError as e:
            _fail(f"{prefix}{e}")
    problems = config_problems(cfg, resumed)
    if problems:
        _fail(prefix + "; ".join(problems))


class ValidateBeforeRun(Callback):
    """Hydra callback (``hydra.callbacks`` in ``configs/config.yaml``): checks the job's settings
    before Hydra creates its output directory, so a rejected run leaves no directory behind.
    A multirun with Hydra's basic sweeper checks every job before the sweep directory is created;
    other sweepers choose values as they go, and their jobs are checked by ``train()``."""

    def on_run_start(self, config, **kwargs) -> None:
        from omegaconf import OmegaConf

        _check_job(config, OmegaConf.to_container(config.hydra.overrides.task, resolve=False))

    def on_multirun_start(self, config, **kwargs) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf

        target = OmegaConf.select(config, "hydra.sweeper._target_")
        basic = f"{BasicSweeper.__module__}.{BasicSweeper.__name__}"
        if target != basic or not GlobalHydra.instance().is_initialized():
            return
        loader = GlobalHydra.instance().config_loader()
        params = OmegaConf.select(config, "hydra.sweeper.params") or {}
        args = [f"{k}={v}" for k, v in params.items()]
        args += OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(args)
        for batch in BasicSweeper.split_arguments(parsed, None):
            for job in batch:
                job_cfg = loader.load_sweep_config(master_config=config, sweep_overrides=list(job))
                _check_job(job_cfg, list(job), prefix=f"job [{' '.join(job)}]: ")
