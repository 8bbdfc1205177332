"""Rewards as safety signals: a labelled held-out set from the simulator, and how well each
reward's per-step value tells danger from safety on it (``scripts/bench.py reward-quality``).

    from drivemind.evaluation.reward_quality import HeldoutConfig, collect, evaluate_reward
    data = collect(HeldoutConfig(steps=200), embed=BevClip.load(bev_shape=(15, 96, 96)).embed)
    res, values = evaluate_reward(lambda: make_reward("chen"), data)  # auroc, spearman, ...

**The set.** The lite simulator drives ``towns`` x ``densities`` x ``drivers`` for ``steps`` env
steps each, with seeds from ``seed`` (default 10 000: the shipped BEV-CLIP was trained on the
built-in towns grid/curves and Town02 with seed 0 - ``drivemind.vlm.supervision`` refuses
Town01/03/05 and seeds from 10 000 -, so the CARLA towns Town01/03/05 (shipped with the package)
are unseen and the built-in town's episodes are drawn from another seed). Drivers: ``expert`` (the
built-in autopilot), ``perturbed`` (the expert with the frame collectors' perturbation episodes,
``sim.autopilot.perturb_expert``: drift, rush, brake; the crash-prone rush episodes oversampled,
``PERTURBED_MIX``) and ``random`` (uniform random actions, each held for 5 steps). Every
``every``-th step is kept, and so is every step of the ``keep_s`` seconds before a collision and
every near miss (lead time-to-collision below ``NEAR_MISS_S``): positives are oversampled. An
episode's last step is always kept. The last ``horizon_s`` of an episode cut off by the step
budget are dropped (whether they end in a crash is unknown). Rows are in time order per episode;
each carries the step's facts, the action taken, ``done``, the image embedding of the observation
the step led to (``embedding``, what the agents store) and of the one it was taken in
(``obs_embedding``), and the ground-truth caption (``drivemind.vlm.caption``).

**Labels** (:func:`label_episode`, from ground truth per step):

- ``collision_1s``: a collision happens at this step or within ``horizon_s`` (1 s) after it;
- ``time_to_collision_s``: seconds until the episode's collision (inf: none);
- ``ttc_lead_s``: constant-velocity time to collision with the lead actor in the route corridor
  (``lead_distance`` / closing speed; inf when not closing);
- ``offroad``: a contact with the static world (the env's ``offroad`` fact) or |lateral offset| >=
  ``OFF_LANE_M`` (2.5 m, the lane left; the env ends the episode at 3 m);
- ``red_light_run``: the env's fact of that name (the ego's front bumper crossed the stop line of
  a red light on its route at this step);
- ``speed_band``: 0 stopped (< 1 km/h), 1 below (< 0.75 x ``TARGET_KMH``), 2 at target
  (<= 1.25 x), 3 above; ``TARGET_KMH`` = 22.5 km/h (VLM-RL's and HVFR's target speed);
- ``lane_offset``: |lateral offset| in metres;
- ``safety``: the ground-truth safety score in [0, 1], the smallest of five margins:
  ``min(1, time_to_collision_s / 3)``, ``min(1, ttc_lead_s / 3)``,
  ``clip((2.5 - lane_offset) / 2, 0, 1)`` (1 within 0.5 m of the centre line, 0 at 2.5 m),
  0 when off-road, 0 when running a red light. 1 = nothing threatening within 3 s;
- ``safe``: no collision within 3 s, lead TTC > 3 s, not off-road, no red-light run;
- ``free``: free traffic (no lead actor within 30 m, no red/yellow light within 30 m, safe,
  within 1 m of the centre line).

**Measures** (:func:`evaluate_reward`; higher reward should mean safer):

- ``auroc``: AUROC of ``-reward`` for ``collision_1s`` rows against ``safe`` rows (near misses and
  other in-between rows left out); 1 = every danger frame scores lower than every safe one, 0.5 =
  no signal, < 0.5 = the reward prefers danger. Ties count half (Mann-Whitney).
- ``spearman``: Spearman rank correlation between the reward and ``safety`` over all rows.
- ``standstill_wins``: over free-traffic rows driven at the target speed (``speed_band`` 2), the
  share where a constructed standstill twin (the same frame and embedding - for a tower that reads
  the ego's speed, the frame embedded at speed 0 -, speed 0, no progress
  or route completion, controls at rest, full brake) scores higher than the observed frame (ties
  count half): how often the reward pays for not driving. ``standstill_wins_observed``: the same against observed
  standstill frames in free traffic (all pairs), when the set has both.
- ``term_auroc`` (composites): the same AUROC for each weighted term of ``reward.explain`` on its
  own (e.g. ``task.progress`` against the semantic term), to see which part carries or spoils
  the signal.
- ``signal_auroc`` (rewards with a contrastive score inside: VLM-RL, DriveVLM-RL): ``[AUROC,
  speed-matched AUROC]`` of each part's raw CLG (the VLM's judgement before the reward's formula
  uses it, e.g. as VLM-RL's target speed).
- ``auroc_speed_matched`` (and ``term_auroc_speed_matched``): the AUROC counted only over pairs of
  a danger and a safe row driven at the same speed (:func:`stratified_auroc`, strata
  :func:`speed_strata`: standing, then ``SPEED_BIN_KMH`` bands). A reward that pays for speed
  (progress, a speed target) prefers the faster frames before a crash; this measure asks whether
  it knows danger *beyond* how fast the car goes. ``speed_matched_coverage``: the share of
  danger rows whose stratum has safe rows (the rest take no part).

**Rewards with online state.** Every reward's ``prepare`` runs once over the whole set in time
order before scoring (DriveMind's novelty detector and prompt cache with the generator inline -
``asynchronous=False`` - so prompt ids are deterministic; RoboCLIP's episode column). Rewards
whose ``learn`` trains a model (DriveMind's PCFM world model) are scored in two folds by episode:
the model is trained (``learn_rounds`` rounds, numpy's RNG seeded) on the other fold's
``(obs_embedding, action, embedding)`` triples, so no row is scored by a model that saw it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..facts import FACT_KEYS
from ..sim.snapshot import LightState

HELDOUT_TOWNS = ("Town01", "Town03", "Town05", "grid")
DRIVERS = ("expert", "perturbed", "random")  # what _drive knows how to drive


def check_drivers(drivers) -> None:
    """One clear error for a driver ``_drive`` does not know."""
    bad = [d for d in drivers if d not in DRIVERS]
    if bad:
        raise ValueError(f"unknown driver(s) {bad}; valid: {', '.join(DRIVERS)}")


def check_drive_plan(towns, densities, drivers) -> None:
    """``check_drivers`` plus: every list names at least one."""
    check_drivers(drivers)
    if not towns or not densities or not drivers:
        raise ValueError("towns, densities and drivers must each name at least one")


TARGET_KMH = 22.5
STOPPED_KMH = 1.0
OFF_LANE_M = 2.5
NEAR_MISS_S = 3.0
MARGIN_S = 3.0  # time margins at which the safety score saturates
FREE_GAP_M = 30.0
HOLD_RANDOM = 5  # steps a random action is held
# the perturbed driver's episode mix: the frame collectors' modes (sim.autopilot.PERTURBATIONS) with
# full-throttle "rush" episodes - the ones that end in crashes - oversampled
PERTURBED_MIX = (("expert", 0.3), ("drift", 0.2), ("rush", 0.4), ("brake", 0.1))
LABEL_KEYS = ("collision_1s", "time_to_collision_s", "ttc_lead_s", "offroad", "red_light_run",
              "speed_band", "lane_offset", "safety", "safe", "free")


@dataclass(frozen=True)
class HeldoutConfig:
    towns: tuple = HELDOUT_TOWNS
    densities: tuple = ("regular", "dense", "drivevlm")
    drivers: tuple = DRIVERS
    steps: int = 250  # env steps per town x density x driver
    every: int = 4  # keep every n-th step (plus the oversampled danger / near-miss steps)
    keep_s: float = 2.0  # seconds before a collision kept in full
    horizon_s: float = 1.0  # "collision within 1 s"
    seed: int = 10_000
    bev: str = "cpu"
    map_path: str | None = None
    traffic: tuple = ()  # (key, value) pairs of sim.traffic settings, e.g. (("walker_velocity", "crossing"),)

    def __post_init__(self):
        check_drive_plan(self.towns, self.densities, self.drivers)
        if self.traffic:
            from ..sim.config import SimConfig

            SimConfig.from_dict({"traffic": dict(self.traffic)})  # one error naming the bad setting
        if int(self.steps) < 2 or int(self.every) < 1:
            raise ValueError(f"steps must be >= 2 and every >= 1, got {self.steps}, {self.every}")
        if not (self.horizon_s > 0 and self.keep_s >= self.horizon_s):
            raise ValueError(f"need 0 < horizon_s <= keep_s, got {self.horizon_s}, {self.keep_s}")


@dataclass
class HeldoutSet:
    facts: dict  # fact name -> (N,)
    labels: dict  # LABEL_KEYS -> (N,)
    action: np.ndarray  # (N, 2)
    done: np.ndarray  # (N,) the episode ended at this row
    episode: np.ndarray  # (N,) episode index
    source: list  # per row "town/density/driver"
    captions: list
    embedding: np.ndarray | None = None  # (N, D) of the observation the step led to
    obs_embedding: np.ndarray | None = None  # (N, D) of the observation the action was taken in
    meta: dict = field(default_factory=dict)
    # (N, D), towers that read the ego's speed only: ``embedding``'s frame embedded at speed 0 (the
    # constructed standstill twin's embedding); None: the twin keeps the row's embedding
    standstill_embedding: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.done)

    def batch(self, rows=None) -> dict:
        """The reward batch of ``rows`` (default all): facts, action, done, env, slot, embeddings."""
        rows = np.arange(len(self)) if rows is None else np.asarray(rows)
        b = {k: v[rows] for k, v in self.facts.items()}
        b.update(action=self.action[rows], done=self.done[rows].astype(np.float64),
                 env=np.zeros(len(rows)), slot=rows.astype(np.float64))
        if self.embedding is not None:
            b["embedding"], b["obs_embedding"] = self.embedding[rows], self.obs_embedding[rows]
        return b


# ----------------------------------------------------------------------------- labels
def label_episode(infos, dt: float = 0.1, horizon_s: float = 1.0) -> dict:
    """Ground-truth labels (module docstring) for one episode's per-step facts, in order. The
    episode's collision is its first step with ``collision`` > 0."""
    n = len(infos)
    f = {k: np.array([float(i.get(k, 0.0)) for i in infos]) for k in
         ("collision", "offroad", "speed_kmh", "lead_speed_kmh", "lead_distance", "lateral_offset",
          "light_state", "light_distance", "red_light_run")}
    hit = np.flatnonzero(f["collision"] > 0)
    t = np.arange(n)
    ttc = np.full(n, np.inf)
    if len(hit):
        c = hit[0]
        ttc[: c + 1] = (c - t[: c + 1]) * dt
    coll_1s = ttc <= horizon_s + 1e-9
    closing = (f["speed_kmh"] - f["lead_speed_kmh"]) / 3.6
    with np.errstate(divide="ignore", invalid="ignore"):
        ttc_lead = np.where(closing > 0.1, f["lead_distance"] / np.maximum(closing, 0.1), np.inf)
    lane = np.abs(f["lateral_offset"])
    offroad = (f["offroad"] > 0) | (lane >= OFF_LANE_M)
    run = f["red_light_run"] > 0
    red, ls, ld = int(LightState.RED), f["light_state"], f["light_distance"]
    v = f["speed_kmh"]
    band = np.where(v < STOPPED_KMH, 0, np.where(v < 0.75 * TARGET_KMH, 1,
                                                 np.where(v <= 1.25 * TARGET_KMH, 2, 3)))
    safety = np.minimum.reduce([np.minimum(1.0, ttc / MARGIN_S), np.minimum(1.0, ttc_lead / MARGIN_S),
                                np.clip((OFF_LANE_M - lane) / 2.0, 0.0, 1.0),
                                np.where(offroad, 0.0, 1.0), np.where(run, 0.0, 1.0)])
    safe = (ttc > MARGIN_S) & (ttc_lead > MARGIN_S) & ~offroad & ~run
    light_near = (np.isin(ls, (red, int(LightState.YELLOW)))) & (ld < FREE_GAP_M)
    free = safe & (f["lead_distance"] >= FREE_GAP_M) & ~light_near & (lane < 1.0)
    return {"collision_1s": coll_1s, "time_to_collision_s": ttc, "ttc_lead_s": ttc_lead,
            "offroad": offroad, "red_light_run": run, "speed_band": band.astype(np.int64),
            "lane_offset": lane, "safety": safety, "safe": safe, "free": free}


# ----------------------------------------------------------------------------- collection
def _drive(env, driver: str, steps: int, rng: np.random.Generator):
    """Yield ``(prev_obs, action, obs, info, ended)`` for ``steps`` steps, resetting at episode
    ends (``ended``: terminated or truncated; ``"cut"`` with ``obs = info = None`` when the env
    found no new route from a reached goal - that episode ends unlabelled at its tail)."""
    from ..maps.routing import RouteError
    from ..sim.autopilot import perturb_expert

    names, probs = zip(*PERTURBED_MIX)
    base = env.unwrapped
    obs, _ = env.reset(seed=int(rng.integers(2**31)))
    mode, left, bias, held = "expert", 0, 0.0, None
    for t in range(steps):
        if driver == "random":
            if t % HOLD_RANDOM == 0 or held is None:
                held = rng.uniform(-1, 1, 2)
            a = held.astype(np.float64)
        else:
            a = np.asarray(base.expert_action(), np.float64)
            if driver == "perturbed":
                if left <= 0:
                    mode = str(rng.choice(names, p=probs))
                    left = int(rng.integers(10, 40))
                    bias = float(rng.choice([-1, 1]) * rng.uniform(0.05, 0.3))
                left -= 1
                a = perturb_expert(a, mode, bias, rng)
            a = np.clip(a, -1, 1)
        try:
            nxt, _, term, trunc, info = env.step(a.astype(np.float32))
        except RouteError:  # no new route from the goal reached (a dead end): end the episode there
            yield obs, a, None, None, "cut"
            obs, _ = env.reset(seed=int(rng.integers(2**31)))
            mode, left, held = "expert", 0, None
            continue
        yield obs, a, nxt, info, bool(term or trunc)
        obs = nxt
        if term or trunc:
            obs, _ = env.reset(seed=int(rng.integers(2**31)))
            mode, left, held = "expert", 0, None


def collect(cfg: HeldoutConfig = HeldoutConfig(), embed=None, progress=None,
            embed_speed: bool = False) -> HeldoutSet:
    """Drive and label the held-out set (module docstring). ``embed(bev uint8 (N, C, H, W)) ->
    (N, D)``: the image tower whose embeddings the rewards read (None: no embeddings).
    ``embed_speed``: ``embed`` also takes ``speed_kmh=`` (a BEV-CLIP speed tower): the ego's
    measured speed of each frame (the step's ``speed_kmh`` fact for the observation it led to; the
    observation's own ``ego`` speed measurement for the one it was taken in).
    Deterministic for a config."""
    from ..agents.embedding import ego_speed_unit_kmh
    from ..envs import DriveEnv
    from ..vlm.captions import caption

    facts = {k: [] for k in FACT_KEYS}
    labels = {k: [] for k in LABEL_KEYS}
    actions, dones, episodes, source, caps, emb, oemb, semb = [], [], [], [], [], [], [], []
    counts = {"steps": 0, "episodes": 0, "collisions": 0, "dropped_tail": 0, "route_errors": 0}
    ep_index = 0
    combos = [(t, d, dr) for t in cfg.towns for d in cfg.densities for dr in cfg.drivers]
    for k, (town, density, driver) in enumerate(combos):
        kw = {"map_path": cfg.map_path} if cfg.map_path else {}
        if cfg.traffic:
            kw["sim"] = {"traffic": dict(cfg.traffic)}
        env = DriveEnv(town, density, bev=cfg.bev, **kw)
        dt = env.sim_cfg.dt
        obs_kmh = ego_speed_unit_kmh(env)  # km/h per unit of obs["ego"][0]
        rng = np.random.default_rng([cfg.seed, k])
        episode: list = []

        def flush(ended: bool):
            nonlocal ep_index
            if not episode:
                return
            infos = [e[3] for e in episode]
            lab = label_episode(infos, dt, cfg.horizon_s)
            n = len(episode)
            keep = (np.arange(n) % cfg.every == 0) | (lab["time_to_collision_s"] <= cfg.keep_s) \
                | (lab["ttc_lead_s"] <= NEAR_MISS_S)
            if ended:  # the episode's last step is always kept (its ``done`` row)
                keep[-1] = True
            else:  # cut off by the step budget: the last horizon's labels are unknown
                cut = int(math.ceil(cfg.horizon_s / dt))
                counts["dropped_tail"] += int(keep[max(0, n - cut):].sum())
                keep[max(0, n - cut):] = False
            rows = np.flatnonzero(keep)
            if len(rows):
                for key in FACT_KEYS:
                    facts[key].append(np.array([float(infos[i][key]) for i in rows]))
                for key in LABEL_KEYS:
                    labels[key].append(lab[key][rows])
                actions.append(np.stack([episode[i][1] for i in rows]))
                d = np.zeros(len(rows), bool)
                d[-1] = ended
                dones.append(d)
                episodes.append(np.full(len(rows), ep_index))
                source.extend([f"{town}/{density}/{driver}"] * len(rows))
                caps.extend(caption(infos[i]) for i in rows)
                if embed is not None:
                    kw_next, kw_obs = {}, {}
                    if embed_speed:
                        kw_next = {"speed_kmh": np.array([infos[i]["speed_kmh"] for i in rows])}
                        kw_obs = {"speed_kmh": np.array([episode[i][4] for i in rows])}
                    nxt = np.stack([episode[i][2] for i in rows])
                    emb.append(np.asarray(embed(nxt, **kw_next), np.float32))
                    oemb.append(np.asarray(embed(np.stack([episode[i][0] for i in rows]), **kw_obs),
                                           np.float32))
                    if embed_speed:  # the standstill twin's frame: the same BEV at speed 0
                        semb.append(np.asarray(embed(nxt, speed_kmh=np.zeros(len(rows))), np.float32))
            counts["episodes"] += 1
            counts["collisions"] += int(np.isfinite(lab["time_to_collision_s"]).any())
            ep_index += 1
            episode.clear()

        for prev, a, obs, info, ended in _drive(env, driver, int(cfg.steps), rng):
            if ended == "cut":
                counts["route_errors"] += 1
                flush(False)
                continue
            episode.append((prev["bev"], a, obs["bev"], info, float(prev["ego"][0]) * obs_kmh))
            counts["steps"] += 1
            if progress is not None:
                progress.update(1)
            if ended:
                flush(True)
        flush(False)
        env.close()
    cat = (lambda xs, dt=np.float64: np.concatenate(xs) if xs else np.zeros(0, dt))
    return HeldoutSet(
        facts={k: cat(v) for k, v in facts.items()},
        labels={k: cat(v, bool if k in ("collision_1s", "offroad", "red_light_run", "safe", "free")
                       else np.int64 if k == "speed_band" else np.float64) for k, v in labels.items()},
        action=np.concatenate(actions) if actions else np.zeros((0, 2)),
        done=cat(dones, bool), episode=cat(episodes, np.int64), source=source, captions=caps,
        embedding=np.concatenate(emb) if emb else None,
        obs_embedding=np.concatenate(oemb) if oemb else None,
        standstill_embedding=np.concatenate(semb) if semb else None,
        meta={**counts, "towns": list(cfg.towns), "densities": list(cfg.densities),
              "drivers": list(cfg.drivers), "seed": cfg.seed, "bev": cfg.bev,
              **({"traffic": dict(cfg.traffic)} if cfg.traffic else {})})


# ----------------------------------------------------------------------------- measures
def auroc(scores, positive) -> float:
    """Area under the ROC curve of ``scores`` for the boolean ``positive`` (Mann-Whitney U over
    average ranks: ties count half). NaN when either class is empty."""
    from scipy.stats import rankdata

    s, y = np.asarray(scores, np.float64), np.asarray(positive, bool)
    npos, nneg = int(y.sum()), int((~y).sum())
    if npos == 0 or nneg == 0:
        return float("nan")
    r = rankdata(s)
    return float((r[y].sum() - npos * (npos + 1) / 2) / (npos * nneg))


SPEED_BIN_KMH = 5.0  # speed strata of ``auroc_speed_matched``


def speed_strata(speed_kmh) -> np.ndarray:
    """Stratum per row for the speed-matched AUROC: -1 standing (< ``STOPPED_KMH``), else the
    ``SPEED_BIN_KMH``-wide speed band (0: 1-5 km/h, 1: 5-10 km/h, ...)."""
    v = np.asarray(speed_kmh, np.float64)
    return np.where(v < STOPPED_KMH, -1, np.floor(v / SPEED_BIN_KMH)).astype(np.int64)


def stratified_auroc(scores, positive, strata) -> tuple[float, float]:
    """AUROC of ``scores`` for ``positive`` over the pairs of a positive and a negative row in the
    same stratum only (each stratum's Mann-Whitney AUROC weighted by its number of pairs), and the
    share of positive rows whose stratum has negatives. NaN when no stratum has both."""
    s, y, g = np.asarray(scores, np.float64), np.asarray(positive, bool), np.asarray(strata)
    num = den = 0.0
    covered = 0
    for k in np.unique(g[y]):
        m = g == k
        npos, nneg = int((y & m).sum()), int((~y & m).sum())
        if nneg == 0:
            continue
        covered += npos
        num += auroc(s[m], y[m]) * npos * nneg
        den += npos * nneg
    cover = covered / max(int(y.sum()), 1)
    return (num / den if den else float("nan")), float(cover)


def win_rate(a, b) -> float:
    """P(a > b) + P(a == b) / 2 over all pairs of a value of ``a`` and one of ``b`` (NaN when
    either is empty)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not len(a) or not len(b):
        return float("nan")
    return auroc(np.concatenate([a, b]), np.r_[np.ones(len(a), bool), np.zeros(len(b), bool)])


STANDSTILL = {"speed_kmh": 0.0, "progress": 0.0, "route_completion": 0.0, "throttle": 0.0,
              "brake": 1.0, "accel": 0.0, "jerk": 0.0, "lateral_accel": 0.0, "yaw_rate": 0.0,
              "steer": 0.0}


def standstill_twin(batch: dict, embedding=None) -> dict:
    """The batch with every row made a standstill (module docstring); embeddings unchanged, or
    ``embedding`` (the frames embedded at speed 0, for a tower that reads the ego's speed)."""
    out = {k: np.array(v, copy=True) for k, v in batch.items()}
    if embedding is not None and "embedding" in out:
        out["embedding"] = np.array(embedding, np.float32, copy=True)
    for k, v in STANDSTILL.items():
        if k in out:
            out[k][:] = v
    if "action" in out:
        out["action"][:] = (0.0, -1.0)
    return out


def _has_learning(reward) -> bool:
    from ..rewards.base import Composite, Reward
    return any(type(p).learn is not Reward.learn and type(p).learn is not Composite.learn
               for p in reward.parts_iter())


def _score(reward_factory, data: HeldoutSet, learn_rounds: int, seed: int, text_encoder=None):
    """(values for all rows, values of the constructed standstill twins of all rows, each term of
    ``reward.explain`` for all rows, the last fold's ``reward.stats()``)."""
    from ..agents.embedding import run_prepare, sample_triples

    def fresh():
        r = reward_factory()
        if text_encoder is not None:
            r.bind_encoder(text_encoder)
        return r

    n = len(data)
    rows = np.arange(n)
    folds = [rows] if not _has_learning(reward_factory()) else \
        [rows[data.episode % 2 == 0], rows[data.episode % 2 == 1]]
    vals, twins, terms, stats, signals = np.full(n, np.nan), np.full(n, np.nan), {}, {}, {}
    for k, score_rows in enumerate(folds):
        r = fresh()
        batch = data.batch()
        cols, ready = run_prepare(r, rows, batch, frame=None, timeout=None)
        batch.update(cols)
        if len(folds) > 1:
            train = rows[data.episode % 2 != k % 2]
            np.random.seed(seed + k)
            sampler = (lambda size: sample_triples(data.obs_embedding, data.action, data.embedding,
                                                   size, rows=train))
            for _ in range(int(learn_rounds)):
                r.learn(sampler)
        sub = {key: v[score_rows] for key, v in batch.items()}
        parts = r.explain(sub)
        for key, v in parts.items():
            terms.setdefault(key, np.full(n, np.nan))[score_rows] = v
        for key, v in _signals(r, sub).items():
            signals.setdefault(key, np.full(n, np.nan))[score_rows] = v
        vals[score_rows] = np.sum(np.stack(list(parts.values())), axis=0)
        still = None if data.standstill_embedding is None else data.standstill_embedding[score_rows]
        twins[score_rows] = r(standstill_twin(sub, still))
        stats = {k: float(v) for k, v in (r.stats() or {}).items()
                 if isinstance(v, (int, float, np.number))}
        r.close()
    return vals, twins, terms, stats, signals


def _signals(reward, batch) -> dict:
    """The VLM's own judgement inside a reward, before the reward's formula uses it: each part's
    raw contrastive score (``clg``: VLM-RL's and DriveVLM-RL's CLG, higher = safer), keyed
    ``<part>.clg``."""
    parts = reward.parts.items() if hasattr(reward, "parts") else [(reward.name, (1.0, reward))]
    return {f"{name}.clg": np.asarray(part.clg(batch), np.float64)
            for name, (_, part) in parts if hasattr(part, "clg")}


def evaluate_reward(reward_factory, data: HeldoutSet, learn_rounds: int = 200, seed: int = 0,
                    text_encoder=None) -> tuple[dict, np.ndarray]:
    """The measures (module docstring) of one reward (``reward_factory()`` builds a fresh one)
    on ``data``; returns ``(measures, per-row values)``."""
    from scipy.stats import spearmanr

    vals, twins, terms, stats, signals = _score(reward_factory, data, learn_rounds, seed, text_encoder)
    lab = data.labels
    ok = np.isfinite(vals)
    danger, safe = lab["collision_1s"] & ok, lab["safe"] & ~lab["collision_1s"] & ok
    sel = danger | safe
    au = auroc(-vals[sel], danger[sel])
    with warnings.catch_warnings():  # a constant reward (or label) has no rank correlation: NaN
        warnings.simplefilter("ignore")
        sp = spearmanr(vals[ok], lab["safety"][ok]).statistic if ok.sum() > 2 else float("nan")
    cruise = lab["free"] & (lab["speed_band"] == 2) & ok & np.isfinite(twins)
    d, t = vals[cruise], twins[cruise]
    wins = float(np.mean((t > d) + 0.5 * np.isclose(t, d))) if len(d) else float("nan")
    still = lab["free"] & (lab["speed_band"] == 0) & ok
    obs_wins = win_rate(vals[still], vals[cruise]) if still.any() and cruise.any() else float("nan")
    strata = speed_strata(data.facts["speed_kmh"])[sel]
    au_speed, cover = stratified_auroc(-vals[sel], danger[sel], strata)
    res = {"auroc": au, "auroc_speed_matched": au_speed, "speed_matched_coverage": cover,
           "spearman": float(sp), "standstill_wins": wins,
           "standstill_wins_observed": obs_wins, "danger_mean": _mean(vals[danger]),
           "safe_mean": _mean(vals[safe]), "nonfinite": int((~ok).sum()),
           "n_danger": int(danger.sum()), "n_safe": int(safe.sum()), "n_cruise": int(cruise.sum()),
           "n_standstill": int(still.sum())}
    if stats:  # the reward's own counters after scoring (e.g. DriveMind's prompts/generated)
        res["reward_stats"] = stats
    if len(terms) > 1:  # a composite: how each weighted term on its own separates danger from safe
        res["term_auroc"] = {k: auroc(-v[sel], danger[sel]) if np.isfinite(v[sel]).all() else float("nan")
                             for k, v in terms.items()}
        res["term_auroc_speed_matched"] = {
            k: stratified_auroc(-v[sel], danger[sel], strata)[0] if np.isfinite(v[sel]).all()
            else float("nan") for k, v in terms.items()}
    if signals:  # the VLM's score inside the reward: [AUROC, speed-matched AUROC]
        res["signal_auroc"] = {
            k: [auroc(-v[sel], danger[sel]), stratified_auroc(-v[sel], danger[sel], strata)[0]]
            if np.isfinite(v[sel]).all() else [float("nan"), float("nan")] for k, v in signals.items()}
    return res, vals


def _mean(x) -> float:
    return float(np.mean(x)) if len(x) else float("nan")


def retrieval_top1(data: HeldoutSet, text_encoder) -> dict:
    """Image-to-caption top-1 retrieval over the set's distinct captions (its stored embeddings;
    ``drivemind.vlm.bev_clip.retrieval_accuracy``)."""
    from ..vlm.bev_clip import retrieval_accuracy
    if data.embedding is None:
        raise ValueError("the held-out set has no embeddings: collect it with embed=...")
    return retrieval_accuracy(None, None, data.captions, text_encoder, image_embeddings=data.embedding)


def action_alignment(data: HeldoutSet, text_encoder=None, tau: float = 100.0) -> dict:
    """Found-RL's action alignment on the set (``found_rl_clip``'s softmax over the 30 action
    prompts of each row's context, tau as in its config): mean P(a_t) of the action taken,
    top-1 (the taken action ranked first) and their chance level 1/30."""
    from ..rewards.found_rl import FoundRLClip

    if data.embedding is None:
        raise ValueError("the held-out set has no embeddings: collect it with embed=...")
    r = FoundRLClip(tau=tau, text_encoder=text_encoder)
    batch = data.batch()
    p = r.probabilities(batch)
    act = r.action_index(batch)
    rows = np.arange(len(p))
    return {"p_mean": float(p[rows, act].mean()) if len(p) else float("nan"),
            "top1": float((p.argmax(1) == act).mean()) if len(p) else float("nan"),
            "chance": 1.0 / 30, "tau": float(tau), "n": int(len(p))}


def plot_distributions(values: dict, data: HeldoutSet, path) -> str:
    """One panel per reward: histograms of its values on danger (collision within 1 s) and safe
    rows, each reward's AUROC in the title when given as ``values[name] = (vals, auroc)``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(values)
    cols = 4
    rows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
    danger = data.labels["collision_1s"]
    safe = data.labels["safe"] & ~danger
    for ax, name in zip(axes.flat, names):
        v, au = values[name]
        v = np.asarray(v, np.float64)
        fin = np.isfinite(v)
        lo, hi = (np.nanmin(v[fin]), np.nanmax(v[fin])) if fin.any() else (0.0, 1.0)
        bins = np.linspace(lo, hi if hi > lo else lo + 1e-6, 31)
        ax.hist(v[safe & fin], bins, density=True, alpha=0.55, label=f"safe ({int((safe & fin).sum())})")
        ax.hist(v[danger & fin], bins, density=True, alpha=0.55,
                label=f"danger ({int((danger & fin).sum())})")
        ax.set_title(f"{name}  AUROC {au:.2f}", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle("per-step reward: safe frames vs collision within 1 s (AUROC of -reward for danger)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return str(path)


__all__ = ["DRIVERS", "HELDOUT_TOWNS", "LABEL_KEYS", "SPEED_BIN_KMH", "HeldoutConfig", "HeldoutSet",
           "action_alignment", "auroc",
           "collect", "evaluate_reward", "label_episode", "plot_distributions", "retrieval_top1",
           "speed_strata", "standstill_twin", "stratified_auroc", "win_rate"]
