"""BEV-CLIP's training signal: labelled frames from the simulator and the caption families the
papers' rewards read (``scripts/train_bev_clip.py``; docs/vlm.md "Training").

**Frames** (:func:`collect_frames`): the lite simulator drives ``towns`` x ``densities`` x
``drivers`` (expert, perturbed expert, random: the drivers of
``drivemind.evaluation.reward_quality``) for ``steps`` env steps each. Every ``every``-th step is
kept, and so is every step of the ``keep_s`` seconds before a collision and every near miss
(lead time to collision <= 3 s): crashes and near misses are oversampled. Each kept frame is the
observation the step led to (what the agents store and the rewards score) with that step's facts.
Labels come from the episode's ground truth (``reward_quality.label_episode``).

**Caption families** (:func:`frame_targets`), one target per frame in each:

- ``scene``: the ground-truth caption (``drivemind.vlm.captions``, paraphrased with an rng), with
  a *hard negative*: the same caption with its danger clauses flipped (clear road <-> about to
  crash into the vehicle ahead, no collision <-> crashed into another vehicle);
- ``polarity``: +1 safe (no collision within 3 s, lead TTC > 3 s, on the road, no red-light run),
  -1 danger (a collision within ``danger_s`` seconds, the crash step included), 0 neither. The
  image must sit closer to every *safe* prompt than to every *danger* prompt (safe frames) or the
  reverse (danger frames): the prompts are those of ``configs/reward/*.yaml``
  (:func:`config_prompts`: DriveMind's / AICR's present and ideal, VLM-RL's and DriveVLM-RL's
  positive and negative, VLM-SR's goal and contrast, RoboCLIP's task, VLM-RM's target) plus
  paraphrases (``SAFE_PARAPHRASES`` / ``DANGER_PARAPHRASES``);
- ``teacher``: DriveMind's generated prompts for the frame (``PrivilegedTeacher``: present = its
  risks, ideal = the goal situation), ordered by the same polarity;
- ``action``: Found-RL's action caption of the step's context and applied action (one of the
  context's 30 prompts, ``drivemind.rewards.found_rl``'s template and tables);
- ``risk``: DriveVLM-RL's risk description (the env's ``risk_id`` fact, ``RISK_VOCABULARY``).

Nothing here reads the held-out set of ``bench.py reward-quality``; the training script refuses
its towns (Town01, Town03, Town05) and seeds (10 000 and up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .captions import describe, situation

DRIVERS = ("expert", "perturbed", "random")
# reward config params whose prompt describes the safe (goal) state / the dangerous one
SAFE_FIELDS = ("ideal", "positive", "goal", "task", "target")
DANGER_FIELDS = ("present", "negative", "contrast")
SAFE_PARAPHRASES = (
    "no collisions occur", "the car drives safely on a clear road", "a car is driving safely",
    "the road is clear and nothing is hit", "the car keeps a safe distance from other road users",
    "there is no accident on the road", "the car drives on without any collision",
    "a safe drive with free road ahead",
)
DANGER_PARAPHRASES = (
    "the car is about to crash", "two cars have collided with each other on the road",
    "the car is about to collide", "a crash is about to happen",
    "the car is heading for a collision", "a car accident on the road",
    "the car is going to hit something", "an accident is imminent",
)
DANGER_S = 1.5  # "about to crash": a collision within this many seconds (the crash step included)
KEEP_S = 2.0
NEAR_MISS_S = 3.0
HELDOUT_TOWNS = ("Town01", "Town03", "Town05")  # bench.py reward-quality's unseen towns
HELDOUT_SEED = 10_000  # and its seeds (10 000 and up)
_FLIP_AHEAD = {"clear": "crash", "ahead": "crash", "close": "crash", "crash": "clear"}


def config_prompts(config_dir: str | Path | None = None) -> tuple[list[str], list[str]]:
    """(safe prompts, danger prompts) of every ``configs/reward/*.yaml`` (params named in
    ``SAFE_FIELDS`` / ``DANGER_FIELDS``; a list param contributes each entry), in file order."""
    import yaml

    d = Path(config_dir) if config_dir else Path(__file__).resolve().parents[3] / "configs" / "reward"
    if not d.is_dir():
        raise FileNotFoundError(f"no reward config folder {d}; pass config_dir= (configs/reward)")
    safe, danger = [], []
    for f in sorted(d.glob("*.yaml")):
        params = (yaml.safe_load(f.read_text()) or {}).get("params") or {}
        for fields, out in ((SAFE_FIELDS, safe), (DANGER_FIELDS, danger)):
            for k in fields:
                v = params.get(k)
                for t in (v if isinstance(v, list) else [v]):
                    if isinstance(t, str) and t.strip() and t not in out:
                        out.append(t)
    return safe, danger


def polarity_prompts(config_dir=None) -> tuple[list[str], list[str]]:
    """The configs' prompts plus the paraphrases, without repeats: (safe, danger)."""
    safe, danger = config_prompts(config_dir)
    return (list(dict.fromkeys(safe + list(SAFE_PARAPHRASES))),
            list(dict.fromkeys(danger + list(DANGER_PARAPHRASES))))


def flipped_situation(sit: dict) -> dict:
    """The hard negative of a situation: its danger clauses flipped (a crash scene becomes a
    clear, collision-free one and the other way round)."""
    out = dict(sit)
    out["ahead"] = _FLIP_AHEAD[sit["ahead"]]
    out["collision"] = "vehicle" if sit["collision"] == "none" else "none"
    return out


@dataclass
class FrameSet:
    """Kept frames and their per-frame ground truth (all arrays have one row per frame)."""

    frames: np.ndarray  # (N, C, H, W) uint8
    infos: list  # the step's facts
    polarity: np.ndarray  # (N,) +1 safe, -1 danger, 0 neither
    segment: list  # "town/density/driver/episode/chunk": the unit of the train / held-out split
    source: list  # "town/density/driver"

    def __len__(self) -> int:
        return len(self.infos)


def check_training_towns(towns, seed: int) -> None:
    """Refuse the held-out towns and seeds of ``bench.py reward-quality`` (one ValueError)."""
    bad = [t for t in towns if t in HELDOUT_TOWNS]
    if bad:
        raise ValueError(f"towns {bad} are bench.py reward-quality's held-out towns; train on the "
                         f"built-in towns (grid, curves, avenue) and Town02 or other CARLA towns")
    if int(seed) >= HELDOUT_SEED:
        raise ValueError(f"seed {seed} is in bench.py reward-quality's held-out range "
                         f"({HELDOUT_SEED} and up); use a seed below {HELDOUT_SEED}")


BLOCK_FRAMES = 1024  # collect_frames' block size


def collect_frames(towns, densities, drivers=DRIVERS, steps: int = 1000, every: int = 4,
                   seed: int = 0, bev="cpu", segment: int = 100, danger_s: float = DANGER_S,
                   keep_s: float = KEEP_S, progress=None, max_frames: int | None = None) -> FrameSet:
    """Drive and label the training frames (module docstring). Deterministic for its arguments."""
    from ..envs import DriveEnv
    from ..evaluation.reward_quality import _drive, check_drivers, label_episode

    check_training_towns(towns, seed)
    check_drivers(drivers)
    combos = [(t, d, dr) for t in towns for d in densities for dr in drivers]
    # frames go into blocks of BLOCK_FRAMES (a buffer for the worst case, every step kept, is more
    # than a 192 px preset's memory allows), copied into one array at the end block by block
    blocks, infos, pol, segs, srcs = [], [], [], [], []
    cap = max_frames or len(combos) * int(steps)
    for k, (town, density, driver) in enumerate(combos):
        env = DriveEnv(town, density, bev=bev)
        dt = env.sim_cfg.dt
        rng = np.random.default_rng([int(seed), k])
        episode, ep = [], 0

        def flush(ended: bool):
            nonlocal ep
            if not episode:
                return
            inf = [e[1] for e in episode]
            lab = label_episode(inf, dt, danger_s)
            n = len(inf)
            keep = ((np.arange(n) % every == 0) | (lab["time_to_collision_s"] <= keep_s)
                    | (lab["ttc_lead_s"] <= NEAR_MISS_S))
            p = np.where(lab["collision_1s"], -1, np.where(lab["safe"], 1, 0))
            if not ended:  # cut by the step budget: whether the tail ends in a crash is unknown
                p[max(0, n - int(math.ceil(NEAR_MISS_S / dt))):] = 0
            for i in np.flatnonzero(keep):
                if len(infos) >= cap:
                    break
                j = len(infos) % BLOCK_FRAMES
                if j == 0:
                    blocks.append(np.empty((min(BLOCK_FRAMES, cap - len(infos)),) + episode[i][0].shape,
                                           np.uint8))
                blocks[-1][j] = episode[i][0]
                infos.append(inf[i])
                pol.append(int(p[i]))
                segs.append(f"{town}/{density}/{driver}/{ep}/{i // segment}")
                srcs.append(f"{town}/{density}/{driver}")
            ep += 1
            episode.clear()

        for _prev, _a, obs, info, ended in _drive(env, driver, int(steps), rng):
            if ended == "cut":
                flush(False)
                continue
            episode.append((obs["bev"], info))
            if progress is not None:
                progress.update(1)
            if ended:
                flush(True)
        flush(False)
        env.close()
    n = len(infos)
    if not blocks:
        return FrameSet(np.zeros((0, 1, 1, 1), np.uint8), infos, np.asarray(pol, np.int64), segs, srcs)
    frames = np.empty((n,) + blocks[0].shape[1:], np.uint8)
    at = 0
    while blocks:  # freed as copied: the peak is the frames plus one block
        b = blocks.pop(0)[: n - at]
        frames[at: at + len(b)] = b
        at += len(b)
    return FrameSet(frames, infos, np.asarray(pol, np.int64), segs, srcs)


def frame_targets(infos, polarity, rng=None) -> dict:
    """Per-frame texts of every caption family (module docstring): ``scene``, ``scene_canonical``, ``scene_flip``,
    ``present``, ``ideal``, ``action`` (text), ``action_context`` (0..23), ``action_index``
    (0..29), ``risk`` (index into RISK_VOCABULARY, -1 none) and ``polarity``. With ``rng`` the
    scene captions are paraphrased (training); without, canonical (evaluation)."""
    from ..privileged import RISK_VOCABULARY
    from ..rewards.found_rl import FoundRLClip
    from .prompts import PrivilegedTeacher

    found = FoundRLClip()  # its prompt library, contexts and action bins (no encoder needed)
    library = found.prompt_texts()
    batch = {k: np.array([float(i.get(k, 0.0)) for i in infos]) for k in
             ("command", "speed_kmh", "steer", "throttle", "brake", "risk_id")}
    ctx = found.context_index(batch)
    act = found.action_index(batch)
    teacher = PrivilegedTeacher()
    scene, canon, flip, present, ideal = [], [], [], [], []
    for info in infos:
        sit = situation(info)
        canon.append(describe(sit))
        scene.append(describe(sit, rng) if rng is not None else canon[-1])
        flip.append(describe(flipped_situation(sit)))
        ps = teacher.prompts(info)
        present.append(ps.present)
        ideal.append(ps.ideal)
    risk = batch["risk_id"].round().astype(np.int64)
    risk = np.where((risk >= 0) & (risk < len(RISK_VOCABULARY)), risk, -1)
    return {"scene": scene, "scene_canonical": canon, "scene_flip": flip, "present": present, "ideal": ideal,
            "action": [library[c * 30 + a] for c, a in zip(ctx, act)],
            "action_context": ctx.astype(np.int64), "action_index": act.astype(np.int64),
            "risk": risk, "polarity": np.asarray(polarity, np.int64), "library": library}


__all__ = ["DANGER_FIELDS", "DANGER_PARAPHRASES", "DRIVERS", "FrameSet", "SAFE_FIELDS",
           "SAFE_PARAPHRASES", "check_training_towns", "collect_frames", "config_prompts",
           "flipped_situation", "frame_targets", "polarity_prompts"]
