"""What DriveSAC and DrivePPO share for semantic rewards: which batch keys a reward reads besides the
env's facts, the image tower that embeds BEV frames, the ``prepare`` hook and the world-model
sampler's rows.

    from drivemind.agents.embedding import split_needs, build_image_encoder
    facts, keys = split_needs(reward)          # ("speed_kmh", ...), ("embedding", "prompt_id")
    tower = build_image_encoder(None, bev_shape=(15, 96, 96))   # BEV-CLIP for that shape

Batch keys (``drivemind.rewards.base``): ``action``, ``done``, ``env``, ``slot``, ``embedding``
(the frame the step's facts describe: the observation the action led to), ``obs_embedding`` (the
observation the action was taken in), ``view_embedding`` (the forward camera frame of the same
step, where the backend has a camera, the encoder embeds RGB and the reward lists it in
``optional``) and the per-transition ``columns`` a reward declares. The agent provides them;
everything else a reward ``needs`` is a fact read from the env's ``info``.
"""

from __future__ import annotations

import numpy as np

from ..rewards.base import LabelContext

BATCH_KEYS = ("action", "done", "env", "slot", "embedding", "obs_embedding", "view_embedding")
VIEW_KEY = "front_rgb"  # the env's info key of the forward camera frame (HxWx3 uint8)
ENCODERS = ("bev_clip", "openclip")


def needs_embedding(reward_fn) -> bool:
    """Whether a reward reads image embeddings (``Composite`` collects its parts' needs)."""
    needs = tuple(getattr(reward_fn, "needs", ())) if reward_fn is not None else ()
    return "embedding" in needs or "obs_embedding" in needs


def needs_obs_embedding(reward_fn) -> bool:
    """Whether a reward reads the embedding of the observation each action was taken in."""
    return reward_fn is not None and "obs_embedding" in tuple(getattr(reward_fn, "needs", ()))


def wants_view_embedding(reward_fn) -> bool:
    """Whether a reward reads forward-camera embeddings when there are any (DriveVLM-RL's
    dynamic pathway)."""
    return reward_fn is not None and "view_embedding" in tuple(getattr(reward_fn, "optional", ()))


def can_embed_rgb(encoder) -> bool:
    """Whether an image tower embeds camera frames (OpenCLIP's ``embed_rgb``; BEV-CLIP embeds
    BEV masks only)."""
    return callable(getattr(encoder, "embed_rgb", None))


def warn_bev_only(encoder, reward_name, stacklevel: int = 3) -> None:
    """The one warning for camera frames that the image encoder cannot embed (BEV-CLIP)."""
    import warnings

    warnings.warn(f"the env gives forward camera frames but the image encoder "
                  f"({type(encoder).__name__}) embeds BEVs only: {reward_name!r} reads the BEV "
                  f"embedding instead (vlm=openclip embeds the camera)", UserWarning,
                  stacklevel=stacklevel + 1)


def split_needs(reward_fn) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(facts, batch keys)`` of ``reward_fn.needs``: batch keys are :data:`BATCH_KEYS` and the
    reward's ``columns``, provided by the agent; the rest are facts from the env's ``info``."""
    provided = set(BATCH_KEYS) | set(getattr(reward_fn, "columns", None) or {})
    needs = tuple(getattr(reward_fn, "needs", ()))
    return (tuple(k for k in needs if k not in provided), tuple(k for k in needs if k in provided))


BEV_CLIP_KEYS = ("kind", "weights")  # vlm.encoder keys of kind bev_clip (configs/vlm/bev_clip_speed.yaml)


def check_encoder(encoder: dict | None) -> dict | None:
    """A copy of the ``encoder`` config (None: BEV-CLIP); an unknown ``kind`` lists the valid ones.
    Kind ``bev_clip`` takes ``weights``: a checkpoint path or file name (None: the shipped one for
    the BEV's shape; ``bev_clip_cpu_speed.pt``: the opt-in tower that also reads the ego's speed)."""
    encoder = dict(encoder) if encoder else None
    if encoder and encoder.get("kind", "bev_clip") not in ENCODERS:
        raise ValueError(f"unknown encoder kind {encoder.get('kind')!r}; valid: {', '.join(ENCODERS)}")
    if encoder and encoder.get("kind", "bev_clip") == "bev_clip":
        bad = sorted(set(encoder) - set(BEV_CLIP_KEYS))
        if bad:
            raise ValueError(f"unknown option(s) {bad} for encoder kind 'bev_clip'; valid: "
                             f"{', '.join(BEV_CLIP_KEYS)}")
    return encoder


def ego_speed_unit_kmh(env=None) -> float:
    """km/h per unit of the observation's ego speed (``obs["ego"][0]`` is speed / ``speed_scale``
    in m/s): 3.6 x ``env``'s ``cfg.speed_scale`` (a DriveEnv, or a VecEnv of them), else 3.6 x
    DriveEnv's default ``speed_scale``. What a speed tower reads for observations without a step's
    facts (episode starts)."""
    scale = None
    try:
        if hasattr(env, "get_attr"):  # an SB3 VecEnv
            scale = env.get_attr("cfg", indices=[0])[0].speed_scale
        elif env is not None:
            scale = env.unwrapped.cfg.speed_scale
    except (AttributeError, IndexError):
        scale = None
    if scale is None:
        from ..envs.driving_env import EnvConfig
        scale = EnvConfig().speed_scale
    return 3.6 * float(scale)


def bev_shape(observation_space) -> tuple[int, ...]:
    """The (C, H, W) of the ``bev`` observation that semantic rewards embed."""
    if "bev" not in getattr(observation_space, "spaces", {}):
        raise ValueError("semantic rewards embed the 'bev' observation, which this env lacks")
    return tuple(observation_space["bev"].shape)


def build_image_encoder(encoder: dict | None, bev_shape=None, reward_fn=None):
    """The contrastive image tower: BEV-CLIP for ``bev_shape`` by default
    (``BevClip.load(bev_shape=...)``: a shape without a checkpoint fails with BevClip's error
    naming the file, the folders and the training command), or the configured one (``{"kind":
    "openclip", ...}``, ``vlm=openclip``), whose text tower is then bound to ``reward_fn`` so its
    prompts live in the same embedding space. Both have ``embed(bev, batch_size=)`` and ``dim``."""
    kind = (encoder or {}).get("kind", "bev_clip")
    if kind == "bev_clip":
        from ..vlm.bev_clip import BevClip
        return BevClip.load((encoder or {}).get("weights"), bev_shape=bev_shape)
    from ..vlm.openclip import OpenClipEncoder
    enc = OpenClipEncoder.from_config(encoder)
    if reward_fn is not None and hasattr(reward_fn, "bind_encoder"):
        reward_fn.bind_encoder(enc)  # prompts through the same model's text tower
    return enc


def run_prepare(reward_fn, slots, batch: dict, frame=None, step: int = 0,
                timeout: float | None = None) -> tuple[dict[str, np.ndarray], int]:
    """Call ``reward_fn.prepare`` on pending transitions (time order); return the columns it wants
    stored, each checked to be one value per transition and declared in ``reward_fn.columns``, and
    how many leading transitions are ready (a reward whose models answer asynchronously may have
    values for only a prefix; ``timeout``: how long it may wait, None = until all are there)."""
    prepare = getattr(reward_fn, "prepare", None)
    slots = np.asarray(slots, np.int64)
    if prepare is None:
        return {}, len(slots)
    ctx = LabelContext(slots, batch, frame=frame, step=int(step), timeout=timeout)
    out = prepare(ctx) or {}
    declared = getattr(reward_fn, "columns", None) or {}
    cols = {}
    for k, v in out.items():
        if k not in declared:
            raise KeyError(f"reward {getattr(reward_fn, 'name', reward_fn)!r} returned column {k!r} "
                           f"from prepare() but declares only {sorted(declared)} in its 'columns'")
        v = np.asarray(v)
        if v.shape != (len(slots),):
            raise ValueError(f"reward {getattr(reward_fn, 'name', reward_fn)!r} returned column {k!r} "
                             f"of shape {v.shape} for {len(slots)} transitions")
        cols[k] = v
    ready = len(slots) if ctx.ready is None else max(0, min(int(ctx.ready), len(slots)))
    return cols, ready


def sample_triples(obs_embedding: np.ndarray, action: np.ndarray, embedding: np.ndarray,
                   batch_size: int, rows: np.ndarray | None = None) -> dict | None:
    """``batch_size`` random rows (with replacement; numpy's global RNG, which SB3 seeds) of
    ``(obs_embedding, action, embedding)`` as float32 arrays, drawn from ``rows`` (default: all),
    keeping only rows where both embeddings were computed (not all zero); None when none is left.
    The world model's training data (``Reward.learn``'s sampler)."""
    n = len(embedding) if rows is None else len(rows)
    if n == 0:
        return None
    pick = np.random.randint(0, n, size=int(batch_size))
    if rows is not None:
        pick = np.asarray(rows, np.int64)[pick]
    v = np.asarray(obs_embedding[pick], np.float32)
    nxt = np.asarray(embedding[pick], np.float32)
    keep = np.any(v != 0, axis=1) & np.any(nxt != 0, axis=1)
    if not keep.any():
        return None
    a = np.asarray(action[pick], np.float32)
    return {"obs_embedding": v[keep], "embedding": nxt[keep], "action": a[keep]}


__all__ = ["BATCH_KEYS", "BEV_CLIP_KEYS", "ENCODERS", "VIEW_KEY", "bev_shape", "build_image_encoder",
           "can_embed_rgb", "check_encoder", "ego_speed_unit_kmh", "wants_view_embedding", "warn_bev_only", "needs_embedding", "needs_obs_embedding", "run_prepare", "sample_triples", "split_needs"]
