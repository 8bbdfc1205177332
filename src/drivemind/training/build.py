"""From a resolved config (a plain dict, as Hydra gives it) to envs, reward and agent.

The config layout (``configs/``): ``sim``, ``town``, ``density``, ``obs`` and ``env`` describe the
env; ``reward`` names a reward and its parameters; ``algo`` names the algorithm and its SB3
arguments. Every bad choice fails here with the valid ones listed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym

ALGOS = ("sac", "ppo", "minddrive")  # minddrive: agents/minddrive_train.py (not an SB3 model)


def _sub(cfg: dict, key: str) -> dict:
    v = cfg.get(key) or {}
    if not isinstance(v, dict):
        raise ValueError(f"config '{key}' must be a mapping, got {v!r}")
    return dict(v)


def apply_torch_threads(cfg: dict) -> None:
    """Set torch's intra-op threads to the config's ``torch_threads`` (0 or absent: torch's
    default, every core). Training and evaluation alike: the default oversubscribes the cores
    beside other jobs (docs/evaluation.md)."""
    if int(cfg.get("torch_threads") or 0) > 0:
        import torch as th

        th.set_num_threads(int(cfg["torch_threads"]))


def study_world(cfg: dict) -> dict:
    """``cfg`` (a saved run's config) with the traffic settings added after the study began
    (``sim.config.STUDY_TRAFFIC``) set to their old values when it is a study run whose config
    predates them (lacks them): such a run trained in the old world, so it is evaluated and
    resumed in it. Other configs are returned unchanged: a plain run's config names each setting
    with the default it trained with (configs/sim/lite.yaml); one saved before it did gets today's
    default."""
    if not cfg.get("study"):
        return cfg
    from ..sim.config import STUDY_TRAFFIC

    traffic = dict((cfg.get("sim") or {}).get("traffic") or {})
    missing = {k: v for k, v in STUDY_TRAFFIC.items() if k not in traffic}
    if not missing:
        return cfg
    return {**cfg, "sim": {**(cfg.get("sim") or {}), "traffic": {**traffic, **missing}}}


def env_kwargs(cfg: dict) -> dict:
    """Keyword arguments for ``DriveEnv`` from the config's sim/obs/env sections (not town,
    density or mode)."""
    sim, obs = _sub(cfg, "sim"), _sub(cfg, "obs")
    backend = sim.pop("backend", "lite")
    carla = sim.pop("carla", None)  # sim=carla: where the server is (configs/sim/carla.yaml)
    sim.pop("name", None)
    bev = obs.pop("bev", None)
    features = obs.pop("features", None)  # obs.features=bev_encoder: the fast path's frozen encoder
    if isinstance(bev, dict):  # null entries mean "the preset's value"
        bev = {k: v for k, v in bev.items() if v is not None}
    kw: dict[str, Any] = {"backend": backend, "sim": sim or None, "bev": bev}
    if features:
        kw["features"] = features
    if obs.pop("corridor", False):  # obs.corridor=true: the BEV readout along the route (bev.corridor)
        kw["corridor"] = True
    if carla is not None:
        kw["carla"] = carla
    obs.pop("name", None)
    kw["config"] = {**_sub(cfg, "env"), **obs}  # waypoints etc. live in obs, the rest in env
    if cfg.get("map_path"):
        kw["map_path"] = cfg["map_path"]
    return kw


def guidance_source(cfg: dict) -> str | None:
    """Where DriveSAC's action suggestions come from (``algo.guidance_kwargs.source``), or None
    when ``algo.guidance`` is none / absent."""
    algo = _sub(cfg, "algo")
    if algo.get("name") != "sac" or algo.get("guidance") in (None, False, "none"):
        return None
    return str((algo.get("guidance_kwargs") or {}).get("source", "privileged"))


def town_density(cfg: dict) -> tuple[str, str]:
    town, density = _sub(cfg, "town"), _sub(cfg, "density")
    if "name" not in town or "name" not in density:
        raise ValueError("config needs town.name and density.name (choose town=<name> density=<name>)")
    return str(town["name"]), str(density["name"])


def make_env_fn(cfg: dict, rank: int = 0, mode: str = "train"):
    """A picklable env constructor (for SubprocVecEnv) wrapped in SB3's Monitor."""
    from stable_baselines3.common.monitor import Monitor

    import drivemind  # noqa: F401  (registers DriveMind-v0)

    town, density = town_density(cfg)
    kw = env_kwargs(cfg)
    if mode == "train" and guidance_source(cfg) == "privileged":
        # Found-RL's action guidance from the privileged teacher (a stand-in for the VLM): each
        # step's facts carry the autopilot's action for the step's observation
        kw["config"] = {**kw["config"], "suggest_action": True}

    def make():
        from ..envs import DriveEnv
        return Monitor(DriveEnv(town, density, mode=mode, **kw))

    return make


def make_vec_env(cfg: dict):
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    n = int(cfg.get("n_envs", 1))
    if n < 1:
        raise ValueError(f"n_envs must be >= 1, got {n}")
    kind = cfg.get("vec_env", "dummy")
    if kind not in ("dummy", "subproc"):
        raise ValueError(f"unknown vec_env {kind!r}; valid: dummy, subproc")
    fns = [make_env_fn(cfg, i) for i in range(n)]
    venv = SubprocVecEnv(fns) if kind == "subproc" and n > 1 else DummyVecEnv(fns)
    venv.seed(int(cfg.get("seed", 0)))
    return venv


def with_reward_window(cfg: dict) -> dict:
    """``cfg`` with a ``null`` CLG window of ``reward.params`` (VLM-RL, DriveVLM-RL) replaced by
    the window measured for the image tower the config embeds with (``vlm`` and the BEV's shape;
    :mod:`drivemind.rewards.windows`); any other config comes back as it is. ``train`` applies it
    before it saves a run's config, so the run keeps the numbers it trained with."""
    from ..rewards.windows import CLG_WINDOWS, resolve_window, tower_name

    r = cfg.get("reward") or {}
    params = r.get("params") if isinstance(r, dict) else None
    if r.get("name") not in CLG_WINDOWS or not isinstance(params, dict):
        return cfg
    if params.get("theta_min") is not None and params.get("theta_max") is not None:
        return cfg
    from ..envs.driving_env import _bev_config

    shape = _bev_config(env_kwargs(cfg)["bev"]).shape  # the BEV the env will render
    tower = tower_name(cfg.get("vlm"), shape)
    return {**cfg, "reward": {**r, "params": resolve_window(str(r["name"]), params, tower)}}


def make_reward_from_cfg(cfg: dict):
    from ..rewards import make_reward

    r = _sub(with_reward_window(cfg), "reward")
    if "name" not in r:
        raise ValueError("config needs reward.name (choose reward=<name>)")
    name, params = str(r["name"]), dict(r.get("params") or {})
    ablate = r.get("ablate")
    if ablate not in (None, "none", ""):
        from ..rewards import reward_params
        if "ablate" not in reward_params(name):
            raise ValueError(f"reward.ablate={ablate} is not available for reward={name}: only "
                             f"rewards with ablations (reward=drivemind) accept it")
        params["ablate"] = str(ablate)
    return make_reward(name, **params)


def _policy_kwargs(algo: dict, space=None) -> dict:
    from ..agents import DriveExtractor, FeatureExtractor

    pk = dict(algo.pop("policy_kwargs", None) or {})
    kind = pk.pop("extractor", "drive")
    if kind == "auto":  # the frozen encoder's features when the obs carries them (obs.features)
        has = space is not None and "bev_features" in getattr(space, "spaces", {})
        kind = "features" if has else "drive"
    if kind == "drive":
        pk.setdefault("features_extractor_class", DriveExtractor)
    elif kind == "features":  # the fast path: MLP heads over the frozen encoder's features
        pk.setdefault("features_extractor_class", FeatureExtractor)
        pk.pop("features_extractor_kwargs", None)
    else:
        raise ValueError(f"unknown algo.policy_kwargs.extractor {kind!r}; valid: auto, drive, features")
    return pk


def make_model(cfg: dict, env, reward_fn, tensorboard_log: str | None = None):
    """The agent named by ``algo.name`` with the config's SB3 arguments."""
    algo = _sub(cfg, "algo")
    name = algo.pop("name", None)
    if name not in ALGOS:
        raise ValueError(f"unknown algo {name!r}; valid: {', '.join(ALGOS)}")
    if name == "minddrive":
        raise ValueError("algo=minddrive is trained by drivemind.agents.minddrive_train."
                         "train_minddrive (training.train calls it), not built as an SB3 model")
    pk = _policy_kwargs(algo, getattr(env, "observation_space", None))
    seed = int(cfg.get("seed", 0))
    device = cfg.get("device", "auto")
    common = dict(env=env, reward_fn=reward_fn, policy_kwargs=pk, seed=seed, device=device,
                  tensorboard_log=tensorboard_log, verbose=int(cfg.get("verbose", 0)))
    from ..agents.embedding import needs_embedding

    # the image encoder (vlm=openclip; default BEV-CLIP) matters only to rewards that read embeddings
    enc = (_sub(cfg, "vlm") or {}).get("encoder") if needs_embedding(reward_fn) else None
    try:
        if name == "sac":
            from ..agents import DriveSAC
            rb = {"palette_size": algo.pop("palette_size", 64), "n_steps": algo.pop("n_steps", 1)}
            emb = algo.pop("embedding_dim", None)
            if emb is not None:  # None: DriveSAC sizes the slot from the reward (384 if it needs one)
                rb["embedding_dim"] = emb
            service = algo.pop("reward_service", None)
            if not needs_embedding(reward_fn):
                service = None  # nothing to embed: the service would idle
            return DriveSAC(replay_buffer_kwargs=rb, reward_service=service, encoder=enc, **common, **algo)
        from ..agents.ppo import DrivePPO
        pk.setdefault("share_features_extractor", True)
        return DrivePPO("MultiInputPolicy", encoder=enc, **common, **algo)
    except TypeError as e:  # an unknown SB3 argument in algo/<name>.yaml or on the command line
        raise TypeError(f"algo={name}: {e}. Check the keys under 'algo' in the config") from None


def observation_signature(space: gym.spaces.Dict) -> dict:
    """What a checkpoint's observation space must match (shapes and dtypes per key)."""
    return {k: [list(sp.shape), str(sp.dtype)] for k, sp in space.spaces.items()}


def check_compatible(saved: dict, space: gym.spaces.Dict, where: str | Path):
    now = observation_signature(space)
    if saved != now:
        raise ValueError(f"the checkpoint in {where} was trained on observations {saved} but this "
                         f"config gives {now}; use the run's own obs settings (obs=..., "
                         f"obs.bev.*) or train a new model")
