#!/usr/bin/env python
"""Benchmarks. Each prints one JSON object on the last line of stdout.

    python scripts/bench.py sim --town Town02 --density dense --seconds 600

sim: the embedded simulator's world step (ego driven by the autopilot on random routes; only
     world.step is timed, after a warm-up), pinned to one core by default. Reports steps_per_s,
     npc_collisions (new contacts among background actors), actor counts, and how freely
     traffic flowed (mean NPC speed, share of NPCs stopped at the end, npc_max_stuck_s: the
     longest standing time of a vehicle not at a red light, npc_respawns: vehicles moved by the
     last-resort respawn after traffic.stuck_respawn seconds).

    python scripts/bench.py env --town Town02 --density regular --seconds 300

env: the full Gymnasium env step (world + 15x192x192 BEV + observation + facts), the ego driven
     by the built-in autopilot (its own time excluded) and, separately, by uniform random actions;
     then highway-env's intersection-v0 with a 128x128 grayscale observation (stack of 4), the same
     0.1 s per step (simulation and policy frequency 10 Hz) and random continuous actions, in the
     same process on the same core. Reports steps_per_s, highway_env_steps_per_s and
     ratio_vs_highway_env. Resets are not timed for either. Needs the bench extra for the peer:
     pip install -e ".[bench]".

    python scripts/bench.py autopilot --town Town02 --density regular

autopilot: the built-in autopilot on the town's 10 fixed evaluation routes (eval mode: one route
     per episode, the same traffic seeds for every method). Reports route_completion (share of
     routes reached), collisions, and collisions_caused (all but being hit from behind while
     slower than the other actor), with every route's outcome.

    python scripts/bench.py train

train: SAC env steps/s with one gradient step per env step (batch 256, 15x96x96 BEV), ours
     (DriveSAC: shared encoder, relabelling buffer) and stock SB3 SAC("MultiInputPolicy") built on
     the same env, filled past learning_starts untimed, then timed in alternating rounds in the same
     process. Reports steps_per_s, sb3_steps_per_s, ratio_vs_sb3 and replay bytes per transition
     for both (and the size of 100k transitions).

    python scripts/bench.py reward

reward: reward=drivemind against reward=chen, both DriveSAC with one gradient step per env step on
     the same env (15x96x96 BEV), filled past learning_starts untimed, then timed in alternating
     rounds in the same process: steps_per_s for each and ratio (drivemind / chen; target >= 0.8).
     Then a per-component latency table like DriveMind's Table 6, each part timed on its own over
     the run's stored frames: policy (action from an observation), contrastive embedding (one BEV),
     novelty score, prompt-cache lookup, world-model foresight (one prediction) and update (one
     batch), the generator when triggered, and the amortised per-step total at the run's trigger
     rate. ``--generator`` picks the generator slot timed (default: the privileged teacher).

    python scripts/bench.py reward-dist [--towns Town01,Town02 ...]
    python scripts/bench.py reward-service [--frames 512 --threads 1]

reward-dist: the reward-distribution comparison (DriveMind's Table 3 check) between two towns:
     Wasserstein-1, KS and means of aicr_static over autopilot frames (scripts/reward_distribution.py,
     whose options it passes on). reward-service: BEV-CLIP embedding throughput and latency in
     process vs through the reward service (scripts/bench_reward_service.py, options passed on).

    python scripts/bench.py drivevlm-service [--reasoner tiny_qwen_vl --detector privileged]

drivevlm-service: DriveVLM-RL's real model slots (default: the tiny random Qwen2.5-VL reasoner
     behind the privileged gate) run inline in the learner's labelling, then in the reward
     service's worker (algo.reward_service), the same DriveSAC run otherwise (density drivevlm,
     one gradient step per env step). Reports env_steps_per_s, label_ms_per_step (learner time in
     labelling, waits included), gate_rate, the worker's batches and latency, and ratio
     (service / inline).

    python scripts/bench.py learn [--run-dir <a finished experiment=learning_check run>]

learn: SAC with the kinematic reward on the built-in grid town without traffic
     (experiment=learning_check), then the 10 fixed routes: route_completion, success_rate,
     train_steps, train_minutes, and the learning curve (learning_curve.png in the run directory).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def machine() -> dict:
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def pin_one_core() -> bool:
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        return True
    except (AttributeError, OSError):
        return False


def bench_sim(args) -> dict:
    from drivemind.maps import load_town
    from drivemind.sim import density_config
    from drivemind.sim.autopilot import autopilot_episode

    pinned = pin_one_core() if args.cores == 1 else False
    rm = load_town(args.town)
    world, rng, snap, pilot = autopilot_episode(rm, density_config(args.density), args.seed)
    route = pilot.route
    for _ in range(20):  # warm-up: compiled kernels load from the cache
        snap = world.step(pilot.act(snap))
    snap = world.reset(seed=args.seed, ego_pose=route.start)
    pilot.set_route(route)
    steps = int(round(args.seconds / world.cfg.dt))
    t_world = 0.0
    npc_speed = 0.0
    ego_collisions = routes = 0
    t_all = time.perf_counter()
    for _ in range(steps):
        action = pilot.act(snap)
        t = time.perf_counter()
        snap = world.step(action)
        t_world += time.perf_counter() - t
        ego_collisions += len(snap.collisions)
        npc_speed += float(world.v_v.mean()) if len(world.v_v) else 0.0
        if pilot.done:
            routes += 1
            pilot.new_route_from(rng, snap.ego.x, snap.ego.y)
    t_all = time.perf_counter() - t_all
    return {
        "what": "sim", "town": rm.name, "density": args.density, "seed": args.seed,
        "simulated_s": round(steps * world.cfg.dt, 1), "steps": steps,
        "steps_per_s": round(steps / t_world, 1),
        "steps_per_s_with_autopilot": round(steps / t_all, 1),
        "npc_collisions": world.npc_collision_total,
        **world.spawned,
        "npc_mean_speed_kmh": round(3.6 * npc_speed / steps, 2),
        "npc_stopped_share_at_end": round(float((world.v_v < 0.1).mean()) if len(world.v_v) else 0.0, 3),
        "npc_max_stuck_s": round(world.npc_max_stuck_s, 1), "npc_respawns": world.npc_respawns,
        "ego_routes_completed": routes, "ego_collisions": ego_collisions,
        "one_core": pinned, **machine(),
    }


def _timed_steps(env, steps, act, seed):
    """Step ``env`` ``steps`` times; time only env.step. Returns (seconds, resets, stats)."""
    env.reset(seed=seed)
    t_step, resets, stats = 0.0, 0, {}
    for _ in range(steps):
        a = act()
        t = time.perf_counter()
        _, _, term, trunc, info = env.step(a)
        t_step += time.perf_counter() - t
        if term or trunc:
            resets += 1
            why = info.get("termination") or info.get("truncation") or ("terminated" if term else "truncated")
            stats[why] = stats.get(why, 0) + 1
            env.reset()
    return t_step, resets, stats


def bench_env(args) -> dict:
    import gymnasium as gym
    import numpy as np

    import drivemind  # noqa: F401  (registers DriveMind-v0)

    pinned = pin_one_core() if args.cores == 1 else False
    steps = int(round(args.seconds / 0.1))
    env = gym.make("DriveMind-v0", town=args.town, density=args.density, bev=args.bev)
    u = env.unwrapped
    _timed_steps(env, 100, u.expert_action, args.seed)  # warm-up: compiled kernels, raster
    t_pilot, resets_pilot, why_pilot = _timed_steps(env, steps, u.expert_action, args.seed)
    rng = np.random.default_rng(args.seed)
    t_rand, resets_rand, _ = _timed_steps(env, steps, lambda: rng.uniform(-1, 1, 2).astype(np.float32),
                                          args.seed)
    out = {
        "what": "env", "town": u.map.name, "density": args.density, "seed": args.seed,
        "bev_shape": list(u.bev_cfg.shape), "steps": steps, "dt": u.sim_cfg.dt,
        "steps_per_s": round(steps / t_pilot, 1), "steps_per_s_random_actions": round(steps / t_rand, 1),
        "resets_autopilot": resets_pilot, "episode_ends_autopilot": why_pilot,
        "resets_random_actions": resets_rand,
    }
    env.close()
    try:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        import highway_env  # noqa: F401
    except ImportError as exc:
        out.update(highway_env_steps_per_s=None, ratio_vs_highway_env=None,
                   highway_env_error=f"{exc}; install the peer with pip install -e \".[bench]\"")
    else:
        hw_steps = min(steps, args.peer_steps)
        cfg = {"observation": {"type": "GrayscaleObservation", "observation_shape": (128, 128),
                               "stack_size": 4, "weights": [0.2989, 0.5870, 0.1140], "scaling": 1.75},
               "action": {"type": "ContinuousAction", "longitudinal": True, "lateral": True},
               "simulation_frequency": 10, "policy_frequency": 10, "duration": 10_000}
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hw = gym.make("intersection-v0", config=cfg)
            _timed_steps(hw, 20, lambda: rng.uniform(-1, 1, 2).astype(np.float32), args.seed)
            t_hw, resets_hw, _ = _timed_steps(hw, hw_steps,
                                              lambda: rng.uniform(-1, 1, 2).astype(np.float32), args.seed)
        hw_sps = hw_steps / t_hw
        out.update(highway_env_steps_per_s=round(hw_sps, 1), highway_env_steps=hw_steps,
                   highway_env_obs_shape=[4, 128, 128], highway_env_resets=resets_hw,
                   highway_env_version=highway_env.__version__,
                   ratio_vs_highway_env=round(out["steps_per_s"] / hw_sps, 2),
                   ratio_vs_highway_env_random_actions=round(out["steps_per_s_random_actions"] / hw_sps, 2))
        hw.close()
    out.update(one_core=pinned, **machine())
    return out


def bench_autopilot(args) -> dict:
    import math

    import gymnasium as gym

    import drivemind  # noqa: F401

    env = gym.make("DriveMind-v0", town=args.town, density=args.density, mode="eval", bev="cpu")
    u = env.unwrapped
    n = len(u.eval_route_list)
    rows = []
    t0 = time.perf_counter()
    steps_all = 0
    for i in range(n):
        obs, info = env.reset(options={"route_index": i})
        caused = hit = 0
        for t in range(args.max_steps):
            obs, r, term, trunc, info = env.step(u.expert_action())
            for ev in u.snapshot.collisions:
                hit += 1
                e = u.snapshot.ego
                along = (ev.x - e.x) * math.cos(e.yaw) + (ev.y - e.y) * math.sin(e.yaw)
                rear_ended = along < 0 and ev.ego_speed <= ev.other_speed
                caused += not rear_ended
            if term or trunc:
                break
        steps_all += t + 1
        rows.append({"route": i, "length_m": round(info["route_length"], 1),
                     "end": info["termination"] or info["truncation"] or "step_limit",
                     "progress_m": round(info["route_progress"], 1), "time_s": round(info["time"], 1),
                     "mean_speed_kmh": round(info["distance"] / max(info["time"], 1e-9) * 3.6, 1),
                     "collisions": hit, "collisions_caused": caused})
    env.close()
    done = sum(r["end"] == "arrived" for r in rows)
    return {"what": "autopilot", "town": u.map.name, "density": args.density, "routes": n,
            "route_completion": round(done / n, 3),
            "collisions": sum(r["collisions"] for r in rows),
            "collisions_caused": sum(r["collisions_caused"] for r in rows),
            "routes_file": str(u.eval_routes_path), "steps": steps_all,
            "wall_s": round(time.perf_counter() - t0, 1), "per_route": rows, **machine()}


def _replay_bytes(buf) -> float:
    """Bytes per stored transition of an SB3 replay buffer (arrays counted in full)."""
    if hasattr(buf, "bytes_per_transition"):
        return buf.bytes_per_transition()
    arrays = [buf.actions, buf.rewards, buf.dones, buf.timeouts]
    for store in (buf.observations, buf.next_observations):
        arrays += list(store.values()) if isinstance(store, dict) else [store]
    return sum(a.nbytes for a in arrays) / (buf.buffer_size * buf.n_envs)


def _alternate_rounds(models: dict, warmup: int, steps: int, rounds: int) -> dict[str, list[float]]:
    """Fill each model past ``warmup`` env steps (untimed), then time ``rounds`` rounds of
    ``steps`` env steps, alternating between the models so they see the same machine state.
    Returns env steps/s per round for each."""
    for m in models.values():
        m.learn(warmup + 1)
    rates = {k: [] for k in models}
    for _ in range(rounds):
        for k, m in models.items():
            t = time.perf_counter()
            m.learn(steps, reset_num_timesteps=False)
            rates[k].append(steps / (time.perf_counter() - t))
    return rates


def bench_train(args) -> dict:
    import statistics

    import gymnasium as gym
    import torch as th
    from stable_baselines3 import SAC

    import drivemind  # noqa: F401
    from drivemind.agents import DriveSAC
    from drivemind.rewards import make_reward

    if args.threads:
        th.set_num_threads(args.threads)
    common = dict(buffer_size=args.buffer_size, batch_size=args.batch_size, learning_starts=args.warmup,
                  train_freq=1, gradient_steps=1, seed=args.seed, verbose=0)

    def env():
        return gym.make("DriveMind-v0", town=args.town, density=args.density, bev=args.bev)

    models = {
        "drivemind": DriveSAC(env=env(), reward_fn=make_reward(args.reward), **common),
        # stock SB3: MultiInputPolicy (NatureCNN per image + flatten), DictReplayBuffer
        "sb3": SAC("MultiInputPolicy", env(), **common),
    }
    obs_shape = list(models["sb3"].observation_space["bev"].shape)
    rates = _alternate_rounds(models, args.warmup, args.steps, args.rounds)
    ours, sb3 = (statistics.median(rates[k]) for k in ("drivemind", "sb3"))
    bpt = {k: _replay_bytes(m.replay_buffer) for k, m in models.items()}
    return {
        "what": "train", "town": args.town, "density": args.density, "bev": obs_shape,
        "batch_size": args.batch_size, "gradient_steps_per_env_step": 1,
        "steps_per_s": round(ours, 3), "sb3_steps_per_s": round(sb3, 3),
        "ratio_vs_sb3": round(ours / sb3, 2),
        "replay_bytes_per_transition": round(bpt["drivemind"]),
        "sb3_replay_bytes_per_transition": round(bpt["sb3"]),
        "replay_gb_100k": round(bpt["drivemind"] * 1e5 / 1e9, 3),
        "sb3_replay_gb_100k": round(bpt["sb3"] * 1e5 / 1e9, 3),
        "rounds": {k: [round(v, 3) for v in r] for k, r in rates.items()},
        "torch_threads": th.get_num_threads(), "torch": th.__version__, **machine(),
    }


def bench_reward(args) -> dict:
    import copy
    import statistics

    import gymnasium as gym
    import numpy as np
    import torch as th

    import drivemind  # noqa: F401
    from drivemind.agents import LABELLED, DriveSAC
    from drivemind.rewards import make_reward
    from drivemind.vlm.prompts import PromptRequest, parse_prompt_json

    if args.threads:
        th.set_num_threads(args.threads)
    common = dict(buffer_size=args.buffer_size, batch_size=args.batch_size, learning_starts=args.warmup,
                  train_freq=1, gradient_steps=1, seed=args.seed, verbose=0)

    def env():
        return gym.make("DriveMind-v0", town=args.town, density=args.density, bev=args.bev)

    dm = make_reward("drivemind", novelty_warmup=args.novelty_warmup, generator=args.generator)
    service = {"max_batch": 32, "max_wait_ms": 10.0} if args.service else None
    models = {"drivemind": DriveSAC(env=env(), reward_fn=dm, reward_service=service, **common),
              "chen": DriveSAC(env=env(), reward_fn=make_reward("chen"), **common)}
    rates = _alternate_rounds(models, args.warmup, args.steps, args.rounds)  # (+ the novelty warm-up)
    ours, chen = (statistics.median(rates[k]) for k in ("drivemind", "chen"))
    models["drivemind"].close_service()

    # ---- per-component latency (Table 6), each on its own over the stored frames
    m = models["drivemind"]
    dm.wait()
    buf = m.replay_buffer
    slots = buf.slots(LABELLED)[-args.frames:]
    frames = [buf.observation(int(s), next=True) for s in slots]
    emb = buf.embeddings.reshape(-1, buf.embedding_dim)[slots].astype(np.float32)
    acts = buf.actions.reshape(-1, buf.action_dim)[slots]
    clip = m.bev_clip()
    n = len(slots)

    def per_call_ms(fn, items):
        t = time.perf_counter()
        for x in items:
            fn(x)
        return 1e3 * (time.perf_counter() - t) / max(len(items), 1)

    obs1 = [{k: v[None] for k, v in f.items()} for f in frames]
    lat = {
        "policy": per_call_ms(lambda o: m.predict(o, deterministic=False), obs1),
        "embedding": per_call_ms(lambda f: clip.embed(f["bev"][None]), frames),
    }
    nov = copy.deepcopy(dm.novelty)
    lat["novelty"] = per_call_ms(nov.score, list(emb))
    lat["prompt_cache"] = per_call_ms(
        lambda v: dm.bank.vectors(np.array([dm.bank.assign(v)]), buf.embedding_dim), list(emb))
    wm = dm.pcfm.model
    lat["world_model"] = per_call_ms(lambda i: wm.predict(emb[i:i + 1], acts[i:i + 1]), range(n))
    lat["world_model_update"] = per_call_ms(
        lambda _: wm.update(emb[:args.batch_size], acts[:args.batch_size], emb[:args.batch_size]), range(20))
    gen = dm.worker().generator
    batch = buf.fact_batch(slots)
    keys = [k for k, v in batch.items() if np.ndim(v) == 1]
    reqs = [PromptRequest(facts={k: float(batch[k][i]) for k in keys}, bev=frames[i]["bev"])
            for i in range(0, n, max(n // args.gen_calls, 1))][:args.gen_calls]
    malformed = 0

    def gen_once(r):
        nonlocal malformed
        try:
            parse_prompt_json(gen.generate(r))
        except ValueError:
            malformed += 1

    lat["generator_when_triggered"] = per_call_ms(gen_once, reqs)
    rate = dm.novelty.triggers / max(dm.novelty.steps, 1)
    base = sum(lat[k] for k in ("policy", "embedding", "novelty", "prompt_cache", "world_model"))
    lat["total_without_generator"] = base
    lat["amortised"] = base + rate * lat["generator_when_triggered"]
    return {
        "what": "reward", "town": args.town, "density": args.density,
        "bev": list(m.observation_space["bev"].shape), "batch_size": args.batch_size,
        "steps_per_s": round(ours, 3), "chen_steps_per_s": round(chen, 3), "ratio": round(ours / chen, 3),
        "reward_service": bool(args.service),
        "latency_ms": {k: round(v, 3) for k, v in lat.items()},
        "generator": getattr(gen, "name", args.generator), "generator_stand_in": bool(getattr(gen, "stand_in", False)),
        "generator_malformed": malformed, "trigger_rate": round(rate, 4),
        "novelty_threshold": dm.novelty.threshold, "prompt_sets_generated": dm.counts["generated"],
        "frames_timed": n, "rounds": {k: [round(v, 3) for v in r] for k, r in rates.items()},
        "torch_threads": th.get_num_threads(), "torch": th.__version__, **machine(),
    }


def bench_drivevlm_service(args) -> dict:
    """DriveVLM-RL's real model slots inline (in the learner's labelling) vs in the reward service's
    worker: env steps/s and learner milliseconds per env step spent labelling (waits included),
    the same DriveSAC run otherwise."""
    import gymnasium as gym
    import torch as th

    import drivemind  # noqa: F401
    from drivemind.agents import DriveSAC
    from drivemind.rewards import make_reward

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "YOLO_OFFLINE"):
        os.environ.setdefault(k, "1")
    if args.threads:
        th.set_num_threads(args.threads)
    common = dict(buffer_size=args.buffer_size, batch_size=args.batch_size, learning_starts=args.warmup,
                  train_freq=args.train_freq, gradient_steps=args.train_freq, seed=args.seed, verbose=0)
    out: dict = {"detector": args.detector, "reasoner": args.reasoner, "density": args.density,
                 "steps": args.steps, "train_freq": args.train_freq, "machine": machine()}
    for mode in ("inline", "service"):
        reward = make_reward("drivevlm_rl", detector=args.detector, reasoner=args.reasoner)
        synth = reward.parts["synth"][1]
        svc = {"max_batch": 32, "max_wait_ms": 10.0, "threads": 1} if mode == "service" else None
        m = DriveSAC(env=gym.make("DriveMind-v0", town=args.town, density=args.density, bev=args.bev),
                     reward_fn=reward, reward_service=svc, **common)
        spent = [0.0]
        label = m.label_pending

        def timed_label(label=label, spent=spent):
            t = time.perf_counter()
            try:
                return label()
            finally:
                spent[0] += time.perf_counter() - t
        m.label_pending = timed_label
        m.learn(args.warmup + args.train_freq)  # untimed: fills the buffer, builds models and workers
        spent[0] = 0.0
        seen0 = synth.seen
        t = time.perf_counter()
        m.learn(args.steps, reset_num_timesteps=False)
        wall = time.perf_counter() - t
        st = synth.stats()
        row = {"env_steps_per_s": round(args.steps / wall, 2),
               "label_ms_per_step": round(1e3 * spent[0] / args.steps, 1),
               "gate_rate": round(st["drivevlm/gate_rate"], 3), "labelled_rows": synth.seen - seen0,
               "pending_at_end": m.replay_buffer.counts()["pending"]}
        if synth._service is not None:
            w = synth._service.stats()
            row["worker"] = {k: round(float(w[k]), 2) for k in ("requests", "batches", "mean_batch_size",
                                                                 "latency_mean_ms", "latency_p95_ms",
                                                                 "worker_busy_share")}
        m.close_service()
        out[mode] = row
    out["ratio"] = round(out["service"]["env_steps_per_s"] / out["inline"]["env_steps_per_s"], 2)
    return out


def _learning_curve(episodes_csv: Path, out_png: Path) -> list[dict]:
    """Per-episode rows of a run (logs/episodes.csv) and a plot of distance and completion."""
    import csv

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(open(episodes_csv)))
    x = [int(r["timesteps"]) for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.4))
    for a, key, label in ((ax[0], "distance_m", "distance per episode (m)"),
                          (ax[1], "mean_speed_kmh", "mean speed (km/h)"),
                          (ax[2], "routes_completed", "routes completed per episode")):
        y = [float(r[key]) for r in rows]
        a.plot(x, y, ".", alpha=0.35, color="tab:blue")
        k = 10
        if len(y) >= k:
            a.plot(x[k - 1:], [sum(y[i - k + 1:i + 1]) / k for i in range(k - 1, len(y))], color="tab:red",
                   label=f"mean of {k}")
            a.legend(loc="upper left")
        a.set_xlabel("env steps")
        a.set_title(label)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return rows


def bench_learn(args) -> dict:
    """SAC + kinematic reward on a built-in town without traffic (experiment=learning_check):
    train (unless --run-dir names a finished run of it), then evaluate on the 10 fixed routes."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import yaml

    from drivemind.training import train
    from drivemind.training.build import town_density
    from drivemind.training.evaluate import evaluate_run

    root = Path(__file__).resolve().parents[1]
    if args.run_dir:
        run_dir = Path(args.run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
    else:
        with initialize_config_dir(config_dir=str(root / "configs"), version_base="1.3"):
            cfg = compose("config", overrides=["experiment=learning_check", "logger=quiet",
                                               "progress_bar=false", f"seed={args.seed}", *args.override])
        cfg = OmegaConf.to_container(cfg, resolve=True)
        run_dir = Path(args.out) / f"learning_check-s{args.seed}"
        summary = train(cfg, run_dir)
    t = time.perf_counter()
    res = evaluate_run(run_dir, video_route=0, max_steps_per_route=args.max_steps, progress=False)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    town, density = town_density(cfg)
    rows = _learning_curve(run_dir / "logs" / "episodes.csv", run_dir / "learning_curve.png")
    m = res["metrics"]
    return {
        "what": "learn", "run_dir": str(run_dir), "town": town, "density": density,
        "reward": cfg["reward"]["name"], "algo": cfg["algo"]["name"], "bev": cfg["obs"]["bev"],
        "train_steps": summary["steps"], "train_minutes": round(summary.get("wall_s_total", summary["wall_s"]) / 60, 1),
        "episodes": len(rows), "route_completion": m["RC"], "success_rate": m["SR"],
        "collision_rate": m["CR"], "mean_speed_kmh": m["AS"], "route_progress": m["completion"],
        "eval_minutes": round((time.perf_counter() - t) / 60, 1),
        "curve": str(run_dir / "learning_curve.png"), **machine(),
    }


def _script_main(name: str, argv: list[str]) -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main(argv)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = {"reward-dist": "reward_distribution", "reward-service": "bench_reward_service"}
    if argv and argv[0] in passthrough:  # their own scripts print the JSON line
        return _script_main(passthrough[argv[0]], argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)

    def timed(name, help, density, seconds):
        p = sub.add_parser(name, help=help)
        p.add_argument("--town", default="Town02")
        p.add_argument("--density", default=density)
        p.add_argument("--seconds", type=float, default=seconds, help="simulated seconds per measurement")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--cores", type=int, default=1, help="1 pins the process to one core")
        return p

    timed("sim", "embedded simulator world steps/s and background collisions", "dense", 600.0)
    e = timed("env", "full env steps/s, and highway-env intersection-v0 side by side", "regular", 300.0)
    e.add_argument("--bev", default="roach", help="BEV preset: roach (15x192x192), paper, cpu")
    e.add_argument("--peer-steps", type=int, default=1000, help="highway-env steps timed (it is slow)")
    p = sub.add_parser("autopilot", help="autopilot route completion on the fixed evaluation routes")
    p.add_argument("--town", default="Town02")
    p.add_argument("--density", default="regular")
    p.add_argument("--max-steps", type=int, default=20000, help="step limit per route")
    p = sub.add_parser("train", help="SAC env steps/s with gradient steps, ours vs stock SB3, and "
                                     "replay bytes per transition")
    p.add_argument("--town", default="grid")
    p.add_argument("--density", default="regular")
    p.add_argument("--bev", default="cpu", help="BEV preset (cpu: 15x96x96)")
    p.add_argument("--reward", default="drivemind_kinematic")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--buffer-size", type=int, default=100_000)
    p.add_argument("--warmup", type=int, default=300, help="env steps before learning (untimed)")
    p.add_argument("--steps", type=int, default=30, help="env steps (each with one gradient step) per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("reward", help="reward=drivemind vs reward=chen training steps/s, and DriveMind's "
                                      "per-component latency table")
    p.add_argument("--town", default="grid")
    p.add_argument("--density", default="regular")
    p.add_argument("--bev", default="cpu", help="BEV preset (cpu: 15x96x96)")
    p.add_argument("--batch-size", type=int, default=64, help="SAC batch (the CPU default config's)")
    p.add_argument("--buffer-size", type=int, default=20_000)
    p.add_argument("--warmup", type=int, default=600, help="env steps before timing (untimed)")
    p.add_argument("--novelty-warmup", type=int, default=300)
    p.add_argument("--steps", type=int, default=100, help="env steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--frames", type=int, default=500, help="stored frames the components are timed on")
    p.add_argument("--generator", default="privileged_teacher")
    p.add_argument("--gen-calls", type=int, default=20, help="generator calls timed")
    p.add_argument("--service", action="store_true",
                   help="drivemind embeds through the reward service process (algo.reward_service)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("drivevlm-service", help="DriveVLM-RL's real detector/reasoner inline vs in the "
                                                "reward service's worker: env steps/s, learner labelling ms")
    p.add_argument("--town", default="grid")
    p.add_argument("--density", default="drivevlm")
    p.add_argument("--bev", default="cpu", help="BEV preset (cpu: 15x96x96)")
    p.add_argument("--detector", default="privileged", help="privileged or yolo (vision extra)")
    p.add_argument("--reasoner", default="tiny_qwen_vl", help="tiny_qwen_vl, qwen_vl or privileged")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--buffer-size", type=int, default=20_000)
    p.add_argument("--warmup", type=int, default=200, help="env steps before timing (untimed)")
    p.add_argument("--train-freq", type=int, default=10, help="env steps per training round")
    p.add_argument("--steps", type=int, default=300, help="env steps timed")
    p.add_argument("--threads", type=int, default=1, help="torch threads in the learner")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("learn", help="the SAC learning check: train on a built-in town without traffic "
                                     "(experiment=learning_check), then route completion on its fixed routes")
    p.add_argument("--run-dir", default=None, help="evaluate this finished learning_check run instead of training")
    p.add_argument("--out", default="outputs/bench", help="where the training run goes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=6000, help="step limit per evaluation route")
    p.add_argument("override", nargs="*", help="extra Hydra overrides, e.g. total_timesteps=50000")
    sub.add_parser("reward-dist", help="reward distribution W1/KS between two towns "
                                       "(scripts/reward_distribution.py; its options follow)")
    sub.add_parser("reward-service", help="reward service vs in-process embedding throughput "
                                          "(scripts/bench_reward_service.py; its options follow)")
    args = ap.parse_args(argv)
    result = {"sim": bench_sim, "env": bench_env, "autopilot": bench_autopilot,
              "train": bench_train, "reward": bench_reward, "learn": bench_learn,
              "drivevlm-service": bench_drivevlm_service}[args.what](args)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
