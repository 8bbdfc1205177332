#!/usr/bin/env python
"""Benchmarks. Each prints one JSON object on the last line of stdout.

    python scripts/bench.py sim --town Town02 --density dense --seconds 600

sim: the embedded simulator's world step (ego driven by the autopilot on random routes; only
     world.step is timed, after a warm-up), pinned to one core by default. Reports steps_per_s
     (wall clock), steps_per_cpu_s (the process's CPU time: meaningful on a loaded machine),
     npc_collisions (new contacts among background actors), actor counts, and how freely
     traffic flowed (mean NPC speed, share of NPCs stopped at the end, npc_max_stuck_s: the
     longest standing time of a vehicle not at a red light, npc_respawns: vehicles moved by the
     last-resort respawn after traffic.stuck_respawn seconds, npc_exits: vehicles that reached a
     dead end (an open road end) and were put back at a spawn point, npc_wait_cycles: waits-for cycles
     (deadlocks) found and broken, npc_overtakes / npc_overtake_aborts: overtakes in the oncoming
     lane started / given up). --traffic KEY=VALUE (repeatable) sets a sim.traffic setting
     (src/drivemind/sim/config.py: TrafficParams), e.g. --traffic junction_release=connector for
     the junction rule from before; the JSON echoes them as "traffic". --breakdown adds where
     the NPCs' time goes ("breakdown": shares of vehicle-time moving, split by what limits the
     speed, and standing, by what the queue waits for; mean speed by class; TrafficBreakdown).
     npc_max_standing_s: the longest time any vehicle stood for any reason, red lights included
     (the clock `--backend carla` reads from its snapshots).

    python scripts/bench.py sim --backend carla --carla host=gpu-box --carla port=2000 --town Town02 --density dense --seconds 1800

sim --backend carla: the same run on a CARLA server: its Traffic Manager drives the vehicles, our
     autopilot the ego; the figures a world snapshot gives, measured as on the embedded simulator
     (SnapshotTraffic): npc_mean_speed_kmh (by class), npc_stopped_share_at_end,
     npc_max_standing_s, ego_routes_completed / ego_collisions, server ticks per second. What
     only the embedded simulator knows (npc_collisions, npc_max_stuck_s, npc_respawns) is null.
     --carla KEY=VALUE (repeatable) is a sim.carla setting (configs/sim/carla.yaml).

    python scripts/bench.py env --town Town02 --density regular --seconds 300

env: the full Gymnasium env step (world + 15x192x192 BEV + observation + facts), the ego driven
     by the built-in autopilot (its own time excluded) and, separately, by uniform random actions;
     then highway-env's intersection-v0 with a 128x128 grayscale observation (stack of 4), the same
     0.1 s per step (simulation and policy frequency 10 Hz) and random continuous actions, in the
     same process on the same core. Reports steps_per_s, highway_env_steps_per_s and
     ratio_vs_highway_env. Resets are not timed for either. Needs the bench extra for the peer:
     pip install -e ".[bench]".

    python scripts/bench.py load --grid 20

load: how the simulator's set-up scales with a town's size: seconds to load the town (--town T)
     or a generated N x N lattice of 4-way junctions (--grid N), to build its traffic tables, its
     world and its first reset, ms per world step after that, and the process's peak memory.

    python scripts/bench.py maps path/to/xodr-folder [more folders]

maps: which OpenDRIVE files of some folders load through the loader (as a user's would), and
     why the others do not: files, loaded, failed ("folder/file" -> the error's first line), per_file
     (lanes, lane_km, spawn_points, its map warnings by kind), warning_kinds (files per kind).

    python scripts/bench.py autopilot --town Town02 --density regular

autopilot: the built-in autopilot on the town's 10 fixed evaluation routes (eval mode: one route
     per episode, the same traffic seeds for every method). Reports route_completion (share of
     routes reached), collisions, and collisions_caused (all but being hit from behind while
     slower than the other actor), with every route's outcome.

    python scripts/bench.py train

train: SAC env steps/s with one gradient step per env step (batch 256, 15x96x96 BEV), ours
     (DriveSAC: shared encoder, relabelling buffer), ours on the fast path (frozen BEV encoder
     features, MLP heads: fast_*) and stock SB3 SAC("MultiInputPolicy") built on the same env, filled past learning_starts untimed, then timed in alternating rounds in the same
     process. Reports steps_per_s, sb3_steps_per_s, ratio_vs_sb3 and replay bytes per transition
     for both (and the size of 100k transitions).

    python scripts/bench.py update [--batch-sizes 256,512,1024] [--autocast bf16] [hydra overrides ...]

update: the cost of one SAC gradient step on the fast path (experiment=fast's model: frozen BEV
     encoder features, [256, 256] MLP heads, fused Adam), filled past learning_starts by a short
     real training run, then model.train timed in alternating rounds per batch size: ms_per_update
     and ms_per_256_samples for each (is a bigger batch cheaper per sample on this CPU?);
     --autocast bf16 also times each update with algo.autocast=bf16 (the training setting: the
     forward passes under torch.autocast in bfloat16, the heads' output layers in float32).

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
    python scripts/bench.py drivevlm-service --detector yolo --detector-model yolov8n.yaml

drivevlm-service: DriveVLM-RL's real model slots (default: the tiny random Qwen2.5-VL reasoner
     behind the privileged gate) run inline in the learner's labelling, then in the reward
     service's worker (algo.reward_service), the same DriveSAC run otherwise (density drivevlm,
     one gradient step per env step). Reports env_steps_per_s, label_ms_per_step (learner time in
     labelling, waits included), gate_rate, the worker's batches and latency, and ratio
     (service / inline).

    python scripts/bench.py learn --reward drivemind_kinematic --town Town02 --density regular \
        --minutes 15 [--seed S | --seeds 0,1] [hydra overrides ...]

learn: learning speed. Trains with the fast settings (experiment=fast: frozen BEV encoder, MLP SAC,
     one torch thread) for --minutes of wall time per seed, then evaluates the policy on the town's
     10 fixed routes: route_completion, success_rate, collision_rate, mean_speed_kmh, env_steps,
     wall_s, env_steps_per_s (means over seeds, and per seed), and a PNG of task return, route
     completion and speed per episode against env steps and wall time for every seed.
     --checkpoint best (with validation.every=<env steps>) evaluates the policy selected on the
     validation routes, and the latest one beside it (docs/training.md "Checkpoint selection");
     a run with algo.policy_kwargs.actor_ema is evaluated with its moving average of the actor and
     with the online actor beside it (`online`).

    python scripts/bench.py learn-summary default='docs/results/learn_15min/stop39-default-s*.json' \
        bf16='docs/results/learn_15min/stop39-bf16-s*.json' --ref default [--goal 0.8]

learn-summary: many `learn` runs, kept as the JSON `learn` prints (each NAME=PATTERN[,PATTERN...]
     one variant, its glob patterns; a file may hold several seeds): per variant the runs, mean
     route completion and collision rate with 95 % intervals (the study's two-stage bootstrap:
     runs, then each run's routes), the runs at or above --goal, s.d., env steps, mean speed and
     endings, and the CPUs the runs were made on; with --ref, each variant minus the reference
     with its interval and P(above). NAME@online / NAME@latest reads each run's online actor /
     latest checkpoint (what `learn` printed beside the main figures); two variants of the same
     runs also get the paired difference per run (`paired`).

    python scripts/bench.py checkpoints --run-dir <run trained with checkpoint_keep=0>

checkpoints: every checkpoint a run kept (model_<steps>.zip, and best.zip), each on the town's 10
     fixed routes and on the run's validation routes: route completion against env steps, what
     selection on the validation routes would pick (the rule of validation.every) against the
     latest and the best in hindsight, and how well the two route sets agree (Spearman).

    python scripts/bench.py side-by-side --seconds 240

side-by-side: the fast path's training env steps/s alone on one core, then two runs at once (one
     per core), then one run with n_envs=2 (subprocess envs): the slowdown of two runs side by side
     against what the cores explain (1.0 = none).

    python scripts/bench.py reward-quality [--steps 500 --vlm openclip --model ViT-B-32 --pretrained <file>]
    python scripts/bench.py reward-quality --vlm openclip --model <config.json> --weights-path <file>
    python scripts/bench.py reward-quality --weights-path bev_clip_cpu.pt   # the image-only tower (vlm=none)
    python scripts/bench.py reward-quality --weights-path bev_clip_cpu_speed.pt   # BEV-CLIP's speed tower

reward-quality: every registered reward (or --rewards a,b) as a safety signal on a labelled
     held-out set the simulator drives (drivemind.evaluation.reward_quality: Town01, Town03, Town05
     and the built-in grid town on seeds 10000+, none of which the shipped BEV-CLIP was trained on;
     expert, perturbed-expert and random drivers; crashes and near misses oversampled). Reports
     auroc.<reward> (AUROC of -reward for "collision within 1 s" against safe frames: higher reward
     should mean safer), auroc_speed_matched.<reward> (the same over pairs of a danger and a safe
     frame driven at the same speed: danger known beyond speed; per_reward also gives
     signal_auroc, the AUROC of the VLM's contrastive score inside VLM-RL / DriveVLM-RL before
     their formula uses it), spearman.<reward> (against the
     ground-truth safety score),
     standstill_wins.<reward> (how often a standstill twin out-scores driving at the target speed in
     free traffic), retrieval_top1 (image-to-caption top-1 of the encoder on the set; `retrieval` adds the clause
     and per-facet accuracy, each facet against its majority answer),
     found_rl_p_at / found_rl_top1 (Found-RL's action alignment: mean P(a_t) of the action taken
     and top-1 over its context's 30 action prompts, tau 100; chance 1/30) and a PNG of
     the per-reward distributions (--plot). Town01/03/05 are the package's shipped CARLA towns.
     --vlm openclip embeds with OpenCLIP (configs/vlm/openclip.yaml's encoder, --model /
     --pretrained / --weights-path override; needs the vision extra). --model also takes an
     open_clip model-config .json (an architecture open_clip does not ship, its checkpoint as
     --weights-path); configs/vlm/openclip_tiny.json with --pretrained none is a tiny random
     tower that runs the whole path offline (figures near chance: it knows nothing). With the
     default --vlm bev_clip, the tower is the one training uses by default (configs/config.yaml's
     vlm: bev_clip_<--bev>_speed_lane.pt), --weights-path picks another BEV-CLIP checkpoint; a speed tower
     (bev_clip_cpu_speed.pt) gets each frame's ego speed, its standstill twins speed 0. Rewards take
     configs/reward/<name>.yaml's params; --set reward.param=value overrides one (repeatable).

    python scripts/bench.py lane-readout [--steps 500 --bev cpu]

lane-readout: how well the ego's lateral offset can be read from the BEV's pixels at all. The fixed
     route-band readout (drivemind.bev.lane_offset: the route band's centre near the ego's row,
     a line fitted over rows) on reward-quality's held-out set (same towns, seeds, drivers and
     rows), against the lateral_offset fact: mae_m, median / p90 error, the caption lane facet's
     accuracy it would give (centre < 0.5 m, drifting < 1.5 m, leaving) against the majority
     answer, and both per |offset| band and for frames parallel to the route (|heading| < 0.02).

    python scripts/bench.py distill [--lora-steps 1500 --eval-every 300 --set lora_rank=8]

distill: does the prompt distillation work? A student_smolvlm (a CPU-sized random SmolVLM with a
     BPE tokenizer trained on the teacher's outputs, reading the frozen BEV-CLIP embedding through
     a trained connector and the ego's speed in its prompt; configs/generator/student_smolvlm.yaml)
     distilled online from the privileged teacher, one LoRA step per teacher-labelled scene the
     lite simulator drives (drivemind.evaluation.distill: built-in towns, three drivers, the
     stream capped per teacher answer), measured every --eval-every steps on held-out scenes
     (disjoint seeds). Reports parse_rate (share of answers parse_prompt_json accepts), agreement
     (present and ideal prompts both equal the teacher's on the same scene), agreement_present,
     agreement_ideal, majority_agreement (the stream's most frequent answer's),
     best_constant_agreement (the held-out scenes' own most frequent answer's: the best a constant
     answer could do), distinct_answers, the curve, and a PNG of it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


# CPU features that tell machines apart for the fast path (a Zen 4 with AVX-512 ran 1.7x the env
# steps of a Zen 3 with AVX2 in 15 minutes; bf16 autocast pays only with AVX512_BF16 or AMX)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def machine() -> dict:
    """Python, architecture, CPU count, and the CPU as :func:`cpu_info` reads it."""
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as fh:
            info.update(cpu_info(fh.read()))
    except OSError:
        pass
    return info


def cpu_info(cpuinfo: str) -> dict:
    """The first processor of a ``/proc/cpuinfo`` text: model name (``cpu``), family/model
    numbers and the vector features of :data:`CPU_FLAGS` it has (``cpu_flags``). A cloud VM's model
    name ("AMD EPYC") alone does not tell a Zen 3 from a Zen 4, whose learning runs differ by about
    1.7x in env steps per minute (docs/benchmarks.md, "Stop 42")."""
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the end of the first processor's block
            continue
        k, _, v = line.partition(":")
        fields[k.strip()] = v.strip()
    info = {}
    if "model name" in fields:
        info["cpu"] = fields["model name"]
    if "cpu family" in fields:
        info["cpu_family_model"] = f"{fields['cpu family']}/{fields.get('model', '?')}"
    flags = set(fields.get("flags", "").split())
    info["cpu_flags"] = [f for f in CPU_FLAGS if f in flags]
    return info


def pin_one_core() -> bool:
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        return True
    except (AttributeError, OSError):
        return False


def key_values(items, option: str, what: str) -> dict:
    """``option KEY=VALUE`` (repeatable) as a dict of ``what`` settings (values read as YAML)."""
    import yaml

    out = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        if not sep:
            raise SystemExit(f"{option} takes KEY=VALUE (a {what} setting), got {item!r}")
        out[key] = yaml.safe_load(val)
    return out


def traffic_overrides(args) -> dict:
    """--traffic KEY=VALUE (repeatable) as a dict of sim.traffic settings."""
    return key_values(getattr(args, "traffic", None), "--traffic", "sim.traffic")


class TrafficBreakdown:
    """Where the background vehicles' time goes (``bench.py sim --breakdown``), per vehicle and
    step: moving (>= 0.3 m/s), split by what limits it (a curve: the lane's or the next lane's
    curvature limit below 85% of the road's; an ungranted junction or red light ahead within 45 m;
    a leader, and among those a bicycle; else free), or standing, followed along the waits-for
    edges (``world.v_blocker``) to what the queue waits for: a red or yellow light, a junction
    reservation kept from it by a vehicle in the junction, by one granted the way but not yet in
    it, or by the room beyond the junction, or the ego or a walker."""

    KINDS = ("moving_curve", "moving_to_stop_line", "moving_behind_bicycle", "moving_behind_other",
             "moving_free", "standing_light", "standing_junction_occupied",
             "standing_junction_granted", "standing_junction_room", "standing_ego_or_walker",
             "standing_other")

    def __init__(self, world):
        self.w = world
        self.count = dict.fromkeys(self.KINDS, 0)
        self.moving_speed = 0.0
        self.cls_speed: dict[int, list] = {}

    def add(self):
        from drivemind.sim import kernels as K
        from drivemind.sim.snapshot import ActorClass

        w = self.w
        jn, length, tp = w.map.junction, w.map.length, w.cfg.traffic
        for i in range(len(w.v_v)):
            v, lane, b = float(w.v_v[i]), int(w.v_lane[i]), int(w.v_blocker[i])
            self.cls_speed.setdefault(int(w.v_cls[i]), [0, 0.0])
            self.cls_speed[int(w.v_cls[i])][0] += 1
            self.cls_speed[int(w.v_cls[i])][1] += v
            if v >= 0.3:
                self.moving_speed += v
                road = min(w.v_vfac[i] * tp.speed_limit_kmh / 3.6, w.v_vcap[i])
                v0 = min(w.v_vfac[i] * w.lane_vmax[lane], w.v_vcap[i])
                nxt = int(w.v_path[i, 1])
                if nxt >= 0 and length[lane] - w.v_s[i] < 20.0:
                    v0 = min(v0, w.v_vfac[i] * w.lane_vmax[nxt])
                k = w.junction_entry(i)
                dstop = None
                if k is not None and w.v_grant[i] != w.v_path[i, k]:
                    dstop = length[lane] - w.v_s[i] + sum(length[w.v_path[i, q]] for q in range(1, k))
                if v0 < 0.85 * road:
                    kind = "moving_curve"
                elif dstop is not None and dstop < 45.0:
                    kind = "moving_to_stop_line"
                elif b >= 0:
                    kind = ("moving_behind_bicycle" if w.v_cls[b] == ActorClass.BICYCLE
                            else "moving_behind_other")
                else:
                    kind = "moving_free"
            else:
                j, kind = i, "standing_other"
                for _ in range(len(w.v_v)):  # along the waits-for edges
                    bj = int(w.v_blocker[j])
                    if bj == K.BLOCKED_LIGHT:
                        kind = "standing_light"
                        break
                    if bj in (K.BLOCKED_OTHER, K.BLOCKED_EGO):
                        kind = "standing_ego_or_walker"
                        break
                    if bj < 0:
                        break
                    k = w.junction_entry(j)
                    if k is None or jn[w.v_lane[j]] >= 0 or w.v_lane[bj] in w.v_path[j, :k]:
                        j = bj  # a leader: what does it wait for?
                        continue
                    kind = ("standing_junction_occupied" if jn[w.v_lane[bj]] >= 0 else
                            "standing_junction_granted" if w.v_grant[bj] >= 0 else
                            "standing_junction_room")
                    break
            self.count[kind] += 1

    def result(self) -> dict:
        from drivemind.sim.snapshot import ActorClass

        n = max(sum(self.count.values()), 1)
        moving = sum(c for k, c in self.count.items() if k.startswith("moving"))
        return {"shares": {k: round(c / n, 3) for k, c in self.count.items()},
                "moving_share": round(moving / n, 3),
                "moving_mean_speed_kmh": round(3.6 * self.moving_speed / max(moving, 1), 2),
                "mean_speed_kmh_by_class": {ActorClass(c).name.lower(): round(3.6 * s / max(m, 1), 2)
                                            for c, (m, s) in sorted(self.cls_speed.items())}}


STANDING_BELOW = 0.3  # m/s: a vehicle slower than this stands (its standing clock runs)
STOPPED_BELOW = 0.1  # m/s: stopped, for the share standing at the end of a run


def vehicle_counts(args) -> dict:
    """--vehicles N as a density_config override ({} without it), checked."""
    if getattr(args, "vehicles", None) is None:
        return {}
    if args.vehicles < 0:
        raise SystemExit(f"sim: --vehicles must be >= 0, got {args.vehicles}")
    return {"vehicles": args.vehicles}


class SnapshotTraffic:
    """What the background vehicles did, read from the world's snapshots only (`bench.py sim
    --backend carla` has nothing else to read), by the definitions the embedded run uses on its
    own arrays (a test checks the two give the same figures on the server double): the mean
    speed (per step, the mean over the vehicles), by class, the share standing (< 0.1 m/s) at the
    end, and ``max_standing_s``, the longest time any one vehicle stood (< 0.3 m/s) for any
    reason, red lights included (the embedded simulator's ``npc_max_stuck_s`` leaves out standing
    at a red light, which a snapshot cannot tell)."""

    def __init__(self):
        from drivemind.sim.snapshot import ActorClass

        self.classes = {int(c): c.name.lower() for c in (ActorClass.CAR, ActorClass.MOTORCYCLE,
                                                         ActorClass.BICYCLE)}
        self.steps, self.speed, self.max_standing_s = 0, 0.0, 0.0
        self.cls_speed: dict = {}
        self._cls = np.array(list(self.classes), np.int8)
        self._nc = max(self.classes) + 1
        self.ids = np.zeros(0, np.int64)  # the vehicles of the last step, and
        self.clock = np.zeros(0)  # how long each has stood so far
        self.last = np.zeros(0)

    def add(self, snap) -> None:
        a = snap.actors
        m = np.isin(a.cls, self._cls)
        v = np.hypot(a.velocity[m, 0], a.velocity[m, 1])
        cls, ids = a.cls[m].astype(np.int64), a.id[m]
        self.steps += 1
        self.last = v
        if not len(v):
            self.ids, self.clock = ids, np.zeros(0)
            return
        self.speed += float(v.mean())
        n = np.bincount(cls, minlength=self._nc)
        sums = np.bincount(cls, weights=v, minlength=self._nc)
        for c in np.flatnonzero(n):
            self.cls_speed[int(c)] = self.cls_speed.get(int(c), 0.0) + float(sums[c] / n[c])
        if not np.array_equal(ids, self.ids):  # actors came or went: carry each one's clock over
            old = dict(zip(self.ids.tolist(), self.clock.tolist()))
            self.clock = np.array([old.get(i, 0.0) for i in ids.tolist()])
            self.ids = ids
        self.clock = np.where(v < STANDING_BELOW, self.clock + snap.dt, 0.0)
        self.max_standing_s = max(self.max_standing_s, float(self.clock.max()))

    def result(self) -> dict:
        n = max(self.steps, 1)
        return {"npc_mean_speed_kmh": round(3.6 * self.speed / n, 2),
                "npc_mean_speed_kmh_by_class": {self.classes[c]: round(3.6 * s / n, 2)
                                                for c, s in sorted(self.cls_speed.items())},
                "npc_stopped_share_at_end": round(float((self.last < STOPPED_BELOW).mean()) if len(self.last)
                                                  else 0.0, 3),
                "npc_max_standing_s": round(self.max_standing_s, 1)}


def carla_options(args) -> dict:
    """--carla KEY=VALUE (repeatable) as sim.carla settings, checked."""
    from drivemind.carla_backend import CarlaConfig

    out = key_values(getattr(args, "carla", None), "--carla", "sim.carla")
    try:
        CarlaConfig.from_dict(out)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"sim: --carla: {exc}") from None
    return out


def bench_sim_carla(args) -> dict:
    """`bench.py sim --backend carla`: the same run on a CARLA server, its Traffic Manager
    driving the background vehicles (and its walker AI the walkers), the ego on our autopilot:
    the traffic figures a snapshot gives (SnapshotTraffic), to set CARLA's traffic beside the
    embedded simulator's on the same town, density, seed and simulated time."""
    from drivemind.carla_backend import CarlaBackend, CarlaBackendError, CarlaConnectionError
    from drivemind.maps.routing import RouteError, random_route
    from drivemind.sim import SimConfig, density_config
    from drivemind.sim.autopilot import Autopilot

    if getattr(args, "traffic", None):
        raise SystemExit("sim: --traffic sets the embedded simulator's traffic model; with --backend "
                         "carla the Traffic Manager drives (its settings: --carla "
                         "tm_speed_difference=..., --carla tm_leading_distance=...)")
    if getattr(args, "breakdown", False):
        raise SystemExit("sim: --breakdown reads the embedded simulator's traffic state; it needs "
                         "--backend lite")
    opts = carla_options(args)
    counts = vehicle_counts(args)
    pinned = pin_one_core() if args.cores == 1 else False
    cfg = density_config(args.density, base=SimConfig(), **counts)
    steps = int(round(args.seconds / cfg.dt))
    meter = SnapshotTraffic()
    ego_collisions = routes = 0
    parked_at = None
    t_world = c_world = 0.0
    try:
        world = CarlaBackend(args.town, cfg, opts)
    except (CarlaConnectionError, CarlaBackendError, ValueError) as exc:
        raise SystemExit(f"sim: {exc}") from None
    try:
        rm = world.map
        rng = np.random.default_rng(args.seed)
        route = random_route(rm, rng, max_length=3000.0)
        snap = world.reset(seed=args.seed, ego_pose=route.start)
        pilot = Autopilot(rm, route, world.lights.lane_light, world.cfg.ego)
        t_all = time.perf_counter()
        for _ in range(steps):
            action = pilot.act(snap) if parked_at is None else (0.0, -1.0)
            t, c = time.perf_counter(), time.process_time()
            snap = world.step(action)
            t_world += time.perf_counter() - t
            c_world += time.process_time() - c
            if world.interrupted:
                raise SystemExit(f"sim: the CARLA server at {world.carla.address} went away "
                                 f"after {meter.steps} steps; the run's figures would mix two "
                                 f"worlds, so none are given")
            ego_collisions += len(snap.collisions)
            meter.add(snap)
            if parked_at is None and pilot.done:
                routes += 1
                try:
                    pilot.new_route_from(rng, snap.ego.x, snap.ego.y)
                except RouteError:  # an open road end: the ego stays there, braking
                    parked_at = round(snap.time, 1)
        t_all = time.perf_counter() - t_all
    except (CarlaConnectionError, CarlaBackendError) as exc:
        raise SystemExit(f"sim: {exc}") from None
    finally:
        world.close()
    return {
        "what": "sim", "backend": "carla", "town": args.town, "density": args.density,
        "seed": args.seed, "carla": dict(opts),
        **({"vehicles_asked": args.vehicles} if counts else {}),
        "simulated_s": round(steps * cfg.dt, 1), "steps": steps,
        "steps_per_s": round(steps / max(t_world, 1e-9), 1),
        "steps_per_cpu_s": round(steps / max(c_world, 1e-9), 1),
        "steps_per_s_with_autopilot": round(steps / max(t_all, 1e-9), 1),
        **world.spawned, **meter.result(),
        # what only the embedded simulator knows: contacts among background actors, standing
        # not at a red light, respawns (the Traffic Manager has none)
        "npc_collisions": None, "npc_max_stuck_s": None, "npc_respawns": None,
        "ego_routes_completed": routes, "ego_collisions": ego_collisions,
        "ego_parked_at_s": parked_at, "one_core": pinned, **machine(),
    }


def bench_sim(args) -> dict:
    if getattr(args, "backend", "lite") == "carla":
        return bench_sim_carla(args)
    if getattr(args, "carla", None):
        raise SystemExit("sim: --carla sets a CARLA server's options; it needs --backend carla")
    from drivemind.maps import load_town
    from drivemind.maps.routing import RouteError
    from drivemind.sim import SimConfig, density_config
    from drivemind.sim.autopilot import autopilot_episode

    pinned = pin_one_core() if args.cores == 1 else False
    rm = load_town(args.town)
    traffic = traffic_overrides(args)
    base = SimConfig.from_dict({"traffic": traffic})
    counts = vehicle_counts(args)
    world, rng, snap, pilot = autopilot_episode(rm, density_config(args.density, base=base, **counts), args.seed)
    route = pilot.route
    for _ in range(20):  # warm-up: compiled kernels load from the cache
        snap = world.step(pilot.act(snap))
    world.warm_kernels()  # and those the first steps did not call
    snap = world.reset(seed=args.seed, ego_pose=route.start)
    pilot.set_route(route)
    steps = int(round(args.seconds / world.cfg.dt))
    breakdown = TrafficBreakdown(world) if getattr(args, "breakdown", False) else None
    t_world = c_world = 0.0
    npc_speed = 0.0
    from drivemind.sim.snapshot import ActorClass
    classes = {c.name.lower(): world.v_cls == int(c) for c in (ActorClass.CAR, ActorClass.MOTORCYCLE,
                                                               ActorClass.BICYCLE)}
    classes = {k: m for k, m in classes.items() if m.any()}  # the classes this density has
    class_speed = dict.fromkeys(classes, 0.0)
    ego_collisions = routes = ego_restarts = 0
    waiting, ego_wait_s = False, 0.0  # at an open road end, until a clear start is found
    standing, max_standing = np.zeros(0), 0.0
    t_all = time.perf_counter()
    for step in range(steps):
        action = pilot.act(snap) if not waiting else (0.0, -1.0)
        t, c = time.perf_counter(), time.process_time()
        snap = world.step(action)
        t_world += time.perf_counter() - t
        c_world += time.process_time() - c
        ego_collisions += len(snap.collisions)
        if len(world.v_v):  # each vehicle's standing clock, any cause (SnapshotTraffic's, in place)
            if standing.shape != world.v_v.shape:
                standing = np.zeros_like(world.v_v)
            standing += world.cfg.dt
            standing[world.v_v >= STANDING_BELOW] = 0.0
            max_standing = max(max_standing, float(standing.max()))
        npc_speed += float(world.v_v.mean()) if len(world.v_v) else 0.0
        for k, m in classes.items():
            class_speed[k] += float(world.v_v[m].mean())
        if breakdown is not None:
            breakdown.add()
        if not waiting and pilot.done:
            routes += 1
            try:
                pilot.new_route_from(rng, snap.ego.x, snap.ego.y)
            except RouteError:  # an open road end: the ego starts its next route elsewhere
                waiting = True
        if waiting:
            ego_wait_s += world.cfg.dt
            # once a simulated second: a start no actor is near
            if step % 10 == 0 and pilot.restart_elsewhere(world, rng):
                ego_restarts += 1
                waiting = False
    t_all = time.perf_counter() - t_all
    return {
        "what": "sim", "backend": "lite", "town": rm.name, "density": args.density, "seed": args.seed,
        "traffic": traffic, **({"vehicles_asked": args.vehicles} if counts else {}),
        "simulated_s": round(steps * world.cfg.dt, 1), "steps": steps,
        "steps_per_s": round(steps / t_world, 1),
        "steps_per_cpu_s": round(steps / max(c_world, 1e-9), 1),
        "steps_per_s_with_autopilot": round(steps / t_all, 1),
        "npc_collisions": world.npc_collision_total,
        **world.spawned,
        "npc_mean_speed_kmh": round(3.6 * npc_speed / steps, 2),
        "npc_mean_speed_kmh_by_class": {k: round(3.6 * v / steps, 2) for k, v in class_speed.items()},
        "npc_stopped_share_at_end": round(float((world.v_v < STOPPED_BELOW).mean()) if len(world.v_v) else 0.0, 3),
        "npc_max_stuck_s": round(world.npc_max_stuck_s, 1), "npc_respawns": world.npc_respawns,
        "npc_max_standing_s": round(max_standing, 1),
        "npc_exits": world.npc_exits,
        "npc_wait_cycles": world.npc_wait_cycles,
        "npc_overtakes": world.npc_overtakes, "npc_overtake_aborts": world.npc_overtake_aborts,
        **({"breakdown": breakdown.result()} if breakdown is not None else {}),
        "ego_routes_completed": routes, "ego_collisions": ego_collisions, "ego_restarts": ego_restarts,
        "ego_restart_wait_s": round(ego_wait_s, 1), "one_core": pinned, **machine(),
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

    traffic = traffic_overrides(args)
    env = gym.make("DriveMind-v0", town=args.town, density=args.density, mode="eval", bev="cpu",
                   **({"sim": {"traffic": traffic}} if traffic else {}))
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
            "traffic": traffic,
            "route_completion": round(done / n, 3),
            "collisions": sum(r["collisions"] for r in rows),
            "collisions_caused": sum(r["collisions_caused"] for r in rows),
            "mean_speed_kmh": round(sum(r["mean_speed_kmh"] for r in rows) / max(len(rows), 1), 1),
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


def bench_update(args) -> dict:
    import statistics

    import torch as th

    from drivemind.training.build import make_model, make_reward_from_cfg, make_vec_env

    sizes = [int(b) for b in _csv(args.batch_sizes)]
    if not sizes or min(sizes) < 2:
        raise SystemExit(f"update: --batch-sizes needs integers >= 2, got {args.batch_sizes!r}")
    if args.autocast not in ("none", "bf16"):
        raise SystemExit(f"update: --autocast must be one of none, bf16; got {args.autocast!r}")
    th.set_num_threads(args.threads)
    cfg = _compose([f"experiment={args.experiment}", "logger=quiet", "progress_bar=false",
                    f"reward={args.reward}", f"town={args.town}", f"density={args.density}",
                    f"seed={args.seed}", *args.overrides])
    model = make_model(cfg, make_vec_env(cfg), make_reward_from_cfg(cfg))
    model.learn(total_timesteps=max(args.warmup, int(cfg["algo"]["learning_starts"]) + 2 * max(sizes)))
    dev = model.device.type
    modes = ["fp32"] + (["bf16"] if args.autocast == "bf16" else [])
    if args.compare_decode and dev != "cpu":
        modes += [m + suffix for suffix in ("_host_codes", "_cpu_decode") for m in modes]
    buf = model.replay_buffer

    def use(mode: str) -> None:  # where a sampled batch is gathered and expanded
        buf.decode_on_device = not mode.endswith("_cpu_decode")
        buf.codes_on_device = "auto" if buf.decode_on_device and not mode.endswith("_host_codes") else False

    def run(b: int, mode: str, n: int) -> float:
        use(mode)
        if dev == "cuda":
            th.cuda.synchronize()
        t = time.perf_counter()
        model.autocast = "bf16" if mode.startswith("bf16") else "none"  # algo.autocast, as in training
        model.train(gradient_steps=n, batch_size=b)
        if dev == "cuda":
            th.cuda.synchronize()
        return (time.perf_counter() - t) / n * 1000

    for b in sizes:  # warm every path (allocations, oneDNN kernels) before the clock
        for mode in modes:
            run(b, mode, 3)
    times = {(b, m): [] for b in sizes for m in modes}
    for _ in range(args.rounds):
        for b in sizes:
            for mode in modes:
                times[b, mode].append(run(b, mode, args.updates))

    def sample_ms(b: int, mode: str, n: int) -> float:  # drawing + expanding + moving one batch
        use(mode)
        ts = []
        for _ in range(args.rounds):
            if dev == "cuda":
                th.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                buf.sample(b, env=model._vec_normalize_env)
            if dev == "cuda":
                th.cuda.synchronize()
            ts.append((time.perf_counter() - t) / n * 1000)
        return statistics.median(ts)

    out = {}
    for (b, mode), ts in times.items():
        ms = statistics.median(ts)
        use(mode)
        out[f"{mode}_b{b}"] = {"batch_size": b, "autocast": mode.split("_")[0],
                                "decode": "cpu" if mode.endswith("_cpu_decode") else dev,
                                "codes": "device" if buf.device_codes() is not None else "host",
                                "ms_per_update": round(ms, 2),
                                "ms_per_256_samples": round(ms * 256 / b, 2),
                                "sample_ms": round(sample_ms(b, mode, args.updates), 2),
                                "rounds_ms": [round(t, 2) for t in ts]}
    profile = None
    if args.profile:  # where one step's time goes: torch's profiler over one round at the first size
        from torch.profiler import ProfilerActivity, profile as th_profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
        use("fp32")
        with th_profile(activities=acts) as prof:
            run(sizes[0], "fp32", args.updates)
        key = "self_device_time_total" if dev == "cuda" else "self_cpu_time_total"
        rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0) + e.self_cpu_time_total,
                      reverse=True)[:args.profile]
        profile = [{"op": e.key, "calls": e.count,
                    "self_cpu_ms_per_update": round(e.self_cpu_time_total / 1000 / args.updates, 3),
                    "self_device_ms_per_update": round(getattr(e, key, 0) / 1000 / args.updates, 3)
                    if dev == "cuda" else None} for e in rows]
    use("fp32")
    return {"what": "update", "experiment": args.experiment, "device": str(model.device),
            "reward": args.reward, "town": args.town, "density": args.density,
            "net_arch": cfg["algo"]["policy_kwargs"].get("net_arch"), "updates_per_round": args.updates,
            "results": out, **({"profile": profile} if profile is not None else {}),
            "torch_threads": th.get_num_threads(), "torch": th.__version__, **machine()}


def bench_train(args) -> dict:
    import statistics

    import gymnasium as gym
    import torch as th
    from stable_baselines3 import SAC

    import drivemind  # noqa: F401
    from drivemind.agents import DriveSAC, FeatureExtractor
    from drivemind.agents.sb3_logger import use_default_logger
    from drivemind.rewards import make_reward

    if args.threads:
        th.set_num_threads(args.threads)
    common = dict(buffer_size=args.buffer_size, batch_size=args.batch_size, learning_starts=args.warmup,
                  train_freq=1, gradient_steps=1, seed=args.seed, verbose=0)

    def env(**kw):
        return gym.make("DriveMind-v0", town=args.town, density=args.density, bev=args.bev, **kw)

    models = {
        "drivemind": DriveSAC(env=env(), reward_fn=make_reward(args.reward), **common),
        # stock SB3: MultiInputPolicy (NatureCNN per image + flatten), DictReplayBuffer
        "sb3": SAC("MultiInputPolicy", env(), **common),
    }
    # the fast path: frozen BEV encoder features in the obs, MLP heads, no masks in the buffer;
    # only where this BEV preset has encoder weights (the package ships the cpu preset's)
    try:
        models["fast"] = DriveSAC(env=env(features="bev_encoder"), reward_fn=make_reward(args.reward),
                                  policy_kwargs={"features_extractor_class": FeatureExtractor}, **common)
        no_fast = None
    except FileNotFoundError as e:
        no_fast = str(e)
    use_default_logger(models["sb3"])  # stock SAC would make an SB3-<date> folder in the temp dir
    obs_shape = list(models["sb3"].observation_space["bev"].shape)
    rates = _alternate_rounds(models, args.warmup, args.steps, args.rounds)
    ours, sb3 = (statistics.median(rates[k]) for k in ("drivemind", "sb3"))
    fast = statistics.median(rates["fast"]) if "fast" in rates else None
    bpt = {k: _replay_bytes(m.replay_buffer) for k, m in models.items()}
    return {
        "what": "train", "town": args.town, "density": args.density, "bev": obs_shape,
        "batch_size": args.batch_size, "gradient_steps_per_env_step": 1,
        "device": str(models["drivemind"].device),
        "steps_per_s": round(ours, 3), "sb3_steps_per_s": round(sb3, 3),
        "ratio_vs_sb3": round(ours / sb3, 2),
        "fast_steps_per_s": None if fast is None else round(fast, 3),
        "fast_ratio_vs_sb3": None if fast is None else round(fast / sb3, 2),
        "fast_skipped": no_fast,
        "fast_replay_bytes_per_transition": round(bpt["fast"]) if "fast" in bpt else None,
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
    det_kw = {}
    if args.detector_model is not None:
        det_kw["model"] = args.detector_model
    if args.detector_imgsz is not None:
        det_kw["imgsz"] = args.detector_imgsz
    if det_kw and args.detector != "yolo":
        raise SystemExit("--detector-model / --detector-imgsz go with --detector yolo")
    out: dict = {"detector": args.detector, "reasoner": args.reasoner, "density": args.density,
                 "steps": args.steps, "train_freq": args.train_freq, "machine": machine()}
    if det_kw:
        out["detector_kwargs"] = det_kw
    for mode in ("inline", "service"):
        try:
            reward = make_reward("drivevlm_rl", detector=args.detector, reasoner=args.reasoner,
                                 detector_kwargs=det_kw)
        except (ImportError, ValueError, FileNotFoundError) as e:
            raise SystemExit(f"drivevlm-service: {e}") from None
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


def _learning_curves(runs: dict[str, Path], out_png: Path) -> None:
    """Per-episode curves of one or several runs (their logs/episodes.csv): task return, route
    completion and mean speed against env steps (top) and wall time (bottom); each seed in its own
    colour, with a 10-episode running mean."""
    import csv

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = (("task_return", "task return per episode"), ("completion", "route completion per episode"),
            ("mean_speed_kmh", "mean speed (km/h)"))
    fig, ax = plt.subplots(2, 3, figsize=(14, 6.5))
    for c, (name, run_dir) in enumerate(runs.items()):
        f = run_dir / "logs" / "episodes.csv"
        rows = list(csv.DictReader(open(f))) if f.exists() else []
        for row_i, xkey in enumerate(("timesteps", "wall_s")):
            x = [float(r.get(xkey) or 0) for r in rows]
            for j, (key, title) in enumerate(keys):
                a = ax[row_i, j]
                if not rows or key not in rows[0]:
                    continue
                y = [float(r[key]) for r in rows]
                a.plot(x, y, ".", alpha=0.2, color=f"C{c}")
                k = 10
                if len(y) >= k:
                    a.plot(x[k - 1:], [sum(y[i - k + 1:i + 1]) / k for i in range(k - 1, len(y))],
                           color=f"C{c}", label=name)
                a.set_title(title)
                a.set_xlabel("env steps" if xkey == "timesteps" else "wall time (s)")
        # a run with validation.every: route completion on the validation routes, as it went
        f = run_dir / "logs" / "validation.csv"
        val = list(csv.DictReader(open(f))) if f.exists() else []
        for row_i, xkey in enumerate(("steps", "wall_s")):
            if val:
                ax[row_i, 1].plot([float(r[xkey] or 0) for r in val], [float(r["RC"]) for r in val],
                                  "s--", color=f"C{c}", label=f"{name}: validation RC")
    for a in ax.ravel():
        if a.get_legend_handles_labels()[0]:
            a.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def _figures(res: dict) -> dict:
    """A second policy's figures beside a run's main ones (``latest``, ``online``): rates, mean
    speed, and how its routes ended."""
    from drivemind.evaluation.study import route_endings

    m = res["metrics"]
    return {"route_completion": m["RC"], "success_rate": m["SR"], "collision_rate": m["CR"],
            "mean_speed_kmh": m["AS"], "endings": route_endings([r.to_dict() for r in res["records"]])}


def learn_one(experiment: str, seed: int, overrides: list[str], run_dir: Path,
              max_steps: int, train: bool = True, checkpoint: str = "latest") -> dict:
    """Train one run (unless ``train`` is false: ``run_dir`` holds a finished one) and evaluate
    its policy (``checkpoint``: latest, or best on the validation routes) on the training town's
    10 fixed routes. Returns the figures of ``bench.py learn``; with ``best``, the latest policy's
    figures too (``latest``: the pair from one run); for a run that kept a moving average of the
    actor (evaluated as the main figures), the online actor's (``online``)."""
    import yaml

    from drivemind.evaluation.study import route_endings
    from drivemind.training import train as train_run
    from drivemind.training.build import town_density
    from drivemind.training.evaluate import evaluate_run

    if train:
        cfg = _compose([f"experiment={experiment}", "logger=quiet", "progress_bar=false",
                        f"seed={seed}", *overrides])
        summary = train_run(cfg, run_dir)
    else:
        summary = json.loads((run_dir / "summary.json").read_text())
    t = time.perf_counter()
    res = evaluate_run(run_dir, video_route=None, max_steps_per_route=max_steps, progress=False,
                       checkpoint=checkpoint)
    eval_s = time.perf_counter() - t
    paired = {}
    if checkpoint == "best":
        paired = {"latest": _figures(evaluate_run(run_dir, video_route=None, max_steps_per_route=max_steps,
                                                  progress=False, out_dir=run_dir / "eval" / "latest")),
                  "best_at_steps": (summary.get("validation") or {}).get("best", {}).get("steps")}
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    if ((cfg["algo"].get("policy_kwargs") or {}).get("actor_ema")) is not None:
        # the same run's online actor beside its moving average of the actor (evaluated above)
        paired["online"] = _figures(evaluate_run(run_dir, video_route=None, max_steps_per_route=max_steps,
                                                 progress=False, checkpoint=checkpoint, actor="online",
                                                 out_dir=run_dir / "eval" / "online"))
    town, density = town_density(cfg)
    m = res["metrics"]
    wall = float(summary.get("wall_s_total", summary["wall_s"]))
    # how each route ended, and how fast the policy hit something (a speeding policy shows here)
    routes = [r.to_dict() for r in res["records"]]
    return {
        "run_dir": str(run_dir), "seed": seed, "town": town, "density": density,
        "reward": cfg["reward"]["name"], "algo": cfg["algo"]["name"],
        "features": (cfg.get("obs") or {}).get("features"), "bev": cfg["obs"]["bev"],
        "env_steps": int(summary["steps"]), "wall_s": round(wall, 1),
        "env_steps_per_s": round(summary["steps"] / max(wall, 1e-9), 1), "status": summary["status"],
        "route_completion": m["RC"], "success_rate": m["SR"], "collision_rate": m["CR"],
        "mean_speed_kmh": m["AS"], "route_progress": m["completion"],
        "train_episodes": (summary.get("episode_metrics") or {}).get("episodes"),
        "endings": route_endings(routes),
        "collision_speeds_kmh": [round(float(v), 1) for r in routes for v in r.get("collision_speeds_kmh") or []],
        "eval_s": round(eval_s, 1), "checkpoint": checkpoint, **paired,
    }


def bench_checkpoints(args) -> dict:
    """Every checkpoint ``--run-dir`` kept, on the fixed routes (``test``) and on the run's
    validation routes (``validation``); the checkpoint the validation rule selects (its score, a
    tie to the later one), the latest and the best on the fixed routes in hindsight."""
    from scipy.stats import spearmanr

    from drivemind.training.evaluate import evaluate_run
    from drivemind.training.selection import BEST, BEST_JSON, better

    run = Path(args.run_dir)
    ckpts = sorted(run.glob("checkpoints/model_*.zip"), key=lambda p: int(p.stem.split("_")[1]))
    if not ckpts:
        raise FileNotFoundError(f"no checkpoints/model_<steps>.zip in {run}: train with "
                                f"checkpoint_every=<env steps> checkpoint_keep=0 to keep every one")
    ckpts += [run / "checkpoints" / BEST] if (run / "checkpoints" / BEST).exists() else []
    rows = []
    for p in ckpts:
        row = {"checkpoint": p.name,
               "steps": (json.loads((p.parent / BEST_JSON).read_text())["steps"] if p.name == BEST
                         else int(p.stem.split("_")[1]))}
        for name, val in (("test", False), ("validation", True)):
            m = evaluate_run(run, checkpoint=str(p), validation=val, video_route=None, progress=False,
                             max_steps_per_route=args.max_steps,
                             out_dir=run / "eval" / "checkpoints" / p.stem / name)["metrics"]
            row[name] = {"RC": m["RC"], "SR": m["SR"], "CR": m["CR"], "completion": round(m["completion"], 4)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    drawn = [r for r in rows if r["checkpoint"] != BEST]
    pick = None
    for r in drawn:  # validation.every's rule over the kept checkpoints
        if better(r["validation"], pick and pick["validation"]):
            pick = r
    v, t = [r["validation"]["RC"] for r in drawn], [r["test"]["RC"] for r in drawn]
    rho = spearmanr(v, t)[0] if len(set(v)) > 1 and len(set(t)) > 1 else float("nan")  # undefined for a constant
    return {"what": "checkpoints", "run": str(run), "checkpoints": rows,
            "latest": {"steps": drawn[-1]["steps"], "test_rc": drawn[-1]["test"]["RC"]},
            "selected": {"steps": pick["steps"], "test_rc": pick["test"]["RC"],
                         "validation_rc": pick["validation"]["RC"]},
            "best_in_hindsight_test_rc": max(r["test"]["RC"] for r in drawn),
            "spearman_validation_test": None if np.isnan(rho) else round(float(rho), 3), **machine()}


def bench_learn(args) -> dict:
    """Learning speed: train for ``--minutes`` of wall time with the fast settings
    (``experiment=fast`` unless ``--experiment``), per seed, then evaluate on the training town's
    10 fixed routes; route completion, success and collision rates, env steps and steps/s, and
    curves (PNG) against env steps and wall time for all seeds."""
    from drivemind.naming import sweep_subdir

    seeds = [int(x) for x in str(args.seeds).split(",")] if args.seeds else [args.seed]
    overrides = [f"reward={args.reward}", f"town={args.town}", f"density={args.density}"] if not args.run_dir else []
    if args.minutes and not args.run_dir:
        overrides += [f"max_minutes={args.minutes}", f"total_timesteps={args.max_env_steps}"]
    overrides += list(args.override)
    out = Path(args.out)
    runs, rows = {}, []
    # the extra overrides are part of the name (as a sweep's run names show every swept key), so
    # two variants of one reward and seed never share a run directory
    extra = "_".join(o.replace("=", "-", 1) for o in args.override)
    base = f"{args.experiment}-{args.reward}-{args.town}-{args.density}"
    for seed in seeds:
        if args.run_dir:
            run_dir = Path(args.run_dir)
        else:
            run_dir = out / sweep_subdir("learn", f"{base}-s{seed}", extra)
        rows.append(learn_one(args.experiment, seed, overrides, run_dir, args.max_steps,
                              train=not args.run_dir, checkpoint=args.checkpoint))
        runs[f"seed {seed}"] = run_dir
        print(json.dumps(rows[-1]), file=sys.stderr)
    # named after its seeds: runs of other seeds started beside this one do not overwrite it
    tag = "_".join(str(s) for s in seeds)
    curve = (Path(args.run_dir) if args.run_dir else out) / f"{sweep_subdir('learn', f'{base}-s{tag}', extra)}.png"
    _learning_curves(runs, curve)
    mean = {k: round(float(np.mean([r[k] for r in rows])), 3)
            for k in ("route_completion", "success_rate", "collision_rate", "mean_speed_kmh",
                      "env_steps", "wall_s", "env_steps_per_s")}
    endings = {k: sum(r["endings"][k] for r in rows) for k in rows[0]["endings"]}
    return {"what": "learn", "experiment": args.experiment, "reward": rows[0]["reward"],
            "town": rows[0]["town"], "density": rows[0]["density"], "minutes": args.minutes,
            "seeds": seeds, **mean, "checkpoint": args.checkpoint,
            **({"latest_route_completion": round(float(np.mean([r["latest"]["route_completion"] for r in rows])), 3)}
               if args.checkpoint == "best" else {}),
            **({"online_route_completion": round(float(np.mean([r["online"]["route_completion"] for r in rows])), 3)}
               if all("online" in r for r in rows) else {}),
            "endings": endings, "per_seed": rows, "curve": str(curve), **machine()}


def bench_learn_summary(args) -> dict:
    """Many ``learn`` runs per variant (``drivemind.evaluation.learn_summary``)."""
    from drivemind.evaluation.learn_summary import resolve, summarize

    arms = {}
    for spec in args.arms:
        name, sep, patterns = spec.partition("=")
        if not sep or not name or not patterns:
            raise SystemExit(f"learn-summary: {spec!r} is not NAME=PATTERN[,PATTERN...] (for example "
                             f"default='docs/results/learn_15min/stop39-default-s*.json')")
        if name in arms:
            raise SystemExit(f"learn-summary: variant {name!r} given twice; list its patterns once, "
                             f"comma-separated")
        arms[name] = [p for p in patterns.split(",") if p]
    try:
        return summarize(resolve(arms), ref=args.ref, goal=args.goal, n=args.draws, seed=args.seed)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(str(e)) from None


def driving_score_approx(records) -> float:
    """A Bench2Drive-style driving score: per route, the fraction of the route progressed times
    0.6 per collision (the leaderboard's vehicle-collision factor; the records hold neither the
    collision's kind nor red lights run, so those factors are missing), averaged over routes."""
    if not records:
        raise ValueError("driving_score_approx needs at least one episode record")
    return round(float(np.mean([float(r.completion) * 0.6 ** int(r.collisions) for r in records])), 4)


def bench_minddrive(args) -> dict:
    """MindDrive's learning check: SFT of both experts on the autopilot, then PPO in language
    space for ``--ppo-steps`` env steps (or until ``--minutes`` of the whole run, SFT included);
    the SFT reference and the PPO policy are evaluated on the same fixed routes of
    ``--town``/``--density``. Reports the PPO stage's own budget (env steps, decisions, updates,
    wall time) apart from SFT's, and the last update's ``kl_ref``."""
    import csv

    from drivemind.training import train as train_run
    from drivemind.training.evaluate import evaluate_run

    import yaml

    from drivemind.agents.minddrive import MindDriveAgent, MindDriveConfig

    if args.run_dir:  # evaluate a finished run again (e.g. with --agent-set)
        run_dir = Path(args.run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
    else:
        run_dir = Path(args.out) / f"minddrive-{args.town}-{args.density}-s{args.seed}-{time.strftime('%H%M%S')}"
        minutes = args.minutes if args.minutes and args.minutes > 0 else "null"
        cfg = _compose([
            "algo=minddrive", f"town={args.town}", f"density={args.density}", f"seed={args.seed}",
            "logger=quiet", "progress_bar=false", f"total_timesteps={args.ppo_steps}",
            f"max_minutes={minutes}", f"algo.sft_steps={args.sft_steps}",
            f"algo.sft_epochs={args.sft_epochs}", "checkpoint_every=0", *args.override])
        summary = train_run(cfg, run_dir)
    agent_set = {}
    for item in args.agent_set:  # decision options applied to both checkpoints at evaluation
        key, sep, val = item.partition("=")
        if not sep or key not in MindDriveConfig.__dataclass_fields__:
            raise SystemExit(f"--agent-set wants KEY=VALUE with KEY one of "
                             f"{sorted(MindDriveConfig.__dataclass_fields__)}; got {item!r}")
        agent_set[key] = yaml.safe_load(val)
    original_load = MindDriveAgent.__dict__["load"]
    if agent_set:
        load = original_load.__func__

        def load_with(cls, path, *a, **kw):
            agent = load(cls, path, *a, **kw)
            for k, v in agent_set.items():
                setattr(agent.cfg, k, v)
            return agent
        MindDriveAgent.load = classmethod(load_with)  # until the two evaluations below are done
    routes = [int(r) for r in args.routes.split(",")] if args.routes else None
    ppo = summary.get("ppo") or {}
    progress = run_dir / "logs" / "progress.csv"
    rows = list(csv.DictReader(progress.open())) if progress.exists() else []
    out = {"what": "minddrive", "run_dir": str(run_dir), "town": args.town, "density": args.density,
           "seed": args.seed, "sft_samples": summary["sft"]["samples"],
           "sft_decision_loss": summary["sft"].get("decision_loss"),
           "sft_action_mse": summary["sft"].get("action_mse"), "sft_wall_s": summary.get("sft_wall_s"),
           "ppo_env_steps": summary["steps"], "ppo_decisions": ppo.get("decisions"),
           "ppo_updates": ppo.get("updates"), "ppo_wall_s": ppo.get("wall_s"),
           "ppo_arrivals": sum(int(r["arrivals"]) for r in rows),
           "ppo_penalties": sum(int(r["penalties"]) for r in rows),
           "kl_ref_last": float(rows[-1]["kl_ref"]) if rows else None,
           "train_wall_s": summary["wall_s"], "status": summary["status"], "routes": routes,
           "max_steps_per_route": args.max_steps, "agent_set": agent_set}
    print(json.dumps(out), file=sys.stderr, flush=True)
    try:
        for name, ckpt in (("sft", summary["sft_reference"]), ("ppo", "latest")):
            t = time.perf_counter()
            res = evaluate_run(run_dir, checkpoint=ckpt, routes=routes, video_route=None,
                               max_steps_per_route=args.max_steps, progress=False,
                               out_dir=run_dir / "eval" / (name + "".join(f"-{k}-{v}" for k, v in agent_set.items())))
            m = res["metrics"]
            out.update({f"{name}_route_completion": m["RC"], f"{name}_route_progress": m["completion"],
                        f"{name}_driving_score": driving_score_approx(res["records"]),
                        f"{name}_success_rate": m["SR"], f"{name}_collision_rate": m["CR"],
                        f"{name}_mean_speed_kmh": m["AS"], f"{name}_eval_s": round(time.perf_counter() - t, 1)})
            print(json.dumps({k: v for k, v in out.items() if k.startswith(name)}), file=sys.stderr, flush=True)
    finally:
        MindDriveAgent.load = original_load
    return {**out, **machine()}


def _timed_run(root: Path, out: Path, seconds: float, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, str(root / "scripts" / "train.py"), "experiment=fast", "logger=quiet",
           "progress_bar=false", "checkpoint_every=0", "checkpoint_buffer=false", "total_timesteps=10000000",
           f"max_minutes={seconds / 60:.4f}", f"hydra.run.dir={out}", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _steps_per_s(out: Path, proc: subprocess.Popen) -> float:
    err = proc.communicate()[1]
    if proc.returncode != 0:
        raise RuntimeError(f"training run {out} failed: {err[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    return s["steps"] / max(s["wall_s"], 1e-9)


def bench_side_by_side(args) -> dict:
    """Fast-path training steps/s: alone, two runs at once, one run with n_envs=2 subprocess envs."""
    import tempfile

    root = Path(__file__).resolve().parents[1]
    base = [f"town={args.town}", f"density={args.density}", f"reward={args.reward}"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        p = _timed_run(root, tmp / "alone", args.seconds, base)
        alone = _steps_per_s(tmp / "alone", p)
        ps = [_timed_run(root, tmp / f"pair{i}", args.seconds, base + [f"seed={i}"]) for i in range(2)]
        pair = [_steps_per_s(tmp / f"pair{i}", q) for i, q in enumerate(ps)]
        p = _timed_run(root, tmp / "vec", args.seconds, base + ["n_envs=2", "vec_env=subproc"])
        vec = _steps_per_s(tmp / "vec", p)
    cores = os.cpu_count() or 1
    return {"what": "side-by-side", "reward": args.reward, "town": args.town, "density": args.density,
            "seconds": args.seconds, "alone_steps_per_s": round(alone, 1),
            "pair_steps_per_s": [round(x, 1) for x in pair],
            "pair_slowdown": round(alone / (sum(pair) / 2), 2) if cores >= 2 else None,
            "n_envs2_steps_per_s": round(vec, 1), "n_envs2_speedup": round(vec / alone, 2),
            **machine()}


def _reward_factory(name: str, overrides: dict | None = None, tower: str = "bev_clip_cpu.pt"):
    """A builder of fresh ``name`` rewards with configs/reward/<name>.yaml's params (the ones
    training uses) updated by ``overrides``, a null CLG window being the one measured for the
    image ``tower`` (drivemind.rewards.windows, as training resolves it); DriveMind's prompt
    generator inline (deterministic prompt ids)."""
    from omegaconf import OmegaConf

    from drivemind.rewards import make_reward, reward_params
    from drivemind.rewards.windows import resolve_window

    path = Path(__file__).resolve().parents[1] / "configs" / "reward" / f"{name}.yaml"
    params = {}
    if path.exists():
        params = dict(OmegaConf.to_container(OmegaConf.load(path), resolve=True).get("params") or {})
    params.update(overrides or {})
    try:
        params = resolve_window(name, params, tower)
    except ValueError as e:
        raise TypeError(str(e)) from None
    if "asynchronous" in reward_params(name):
        params["asynchronous"] = False
    make_reward(name, **params)  # an unknown parameter fails here, naming the valid ones
    return lambda: make_reward(name, **params)


def _param_overrides(items, names) -> dict:
    """``--set reward.key=value`` (value parsed as YAML) -> {reward: {key: value}}."""
    import yaml

    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        reward, dot, param = key.partition(".")
        if not sep or not dot or not param:
            raise SystemExit(f"--set wants reward.param=value (e.g. vlm_rl.theta_min=-0.03), got {item!r}")
        if reward not in names:
            raise SystemExit(f"--set {item!r}: {reward!r} is not among the rewards measured "
                             f"({', '.join(names)})")
        out.setdefault(reward, {})[param] = yaml.safe_load(value)
    return out


def _csv(text: str) -> tuple[str, ...]:
    """A comma-separated command-line list as a tuple (blanks dropped)."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _add_heldout_args(p, bev_help: str) -> None:
    """The held-out set's options, shared by reward-quality and lane-readout (one set, one
    definition: drivemind.evaluation.reward_quality.HeldoutConfig)."""
    p.add_argument("--towns", default="Town01,Town03,Town05,grid", help="comma-separated held-out towns")
    p.add_argument("--densities", default="regular,dense,drivevlm")
    p.add_argument("--drivers", default="expert,perturbed,random")
    p.add_argument("--steps", type=int, default=500, help="env steps per town x density x driver")
    p.add_argument("--every", type=int, default=4, help="keep every n-th step (danger and near misses: all)")
    p.add_argument("--seed", type=int, default=10_000, help="first seed (BEV-CLIP is trained below 10000)")
    p.add_argument("--bev", default="cpu", help=bev_help)
    p.add_argument("--map-path", default=None, help="a folder searched first for the towns' .xodr "
                                                    "(default: $DRIVEMIND_MAP_PATH, then the shipped towns)")
    p.add_argument("--traffic", action="append", metavar="KEY=VALUE",
                   help="a sim.traffic setting for the drives (repeatable), e.g. walker_velocity=crossing")


def _compose(overrides=()) -> dict:
    """configs/config.yaml composed with ``overrides`` (Hydra's own compose API) and resolved."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from drivemind.naming import register_resolvers

    register_resolvers()  # the run name's resolvers (dm_ablate, ...)
    root = Path(__file__).resolve().parents[1]
    with initialize_config_dir(config_dir=str(root / "configs"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def _config_tower(bev_shape) -> str | None:
    """The BEV-CLIP checkpoint a training run embeds BEVs of ``bev_shape`` with by default (the
    ``vlm`` choice of configs/config.yaml, e.g. ``bev_clip_<bev>_speed_lane.pt``); None: the
    built-in image-only one (``vlm=none``) or another encoder kind."""
    from drivemind.rewards.windows import tower_name

    vlm = _compose()["vlm"]
    enc = (vlm or {}).get("encoder") or {}
    if enc.get("kind", "bev_clip") != "bev_clip" or not enc.get("weights"):
        return None
    return tower_name(vlm, bev_shape)


def _heldout_config(args, what: str):
    """The HeldoutConfig of ``_add_heldout_args``' options; a bad value exits with one message."""
    from drivemind.evaluation.reward_quality import HeldoutConfig

    try:
        return HeldoutConfig(towns=_csv(args.towns), densities=_csv(args.densities),
                             drivers=_csv(args.drivers), steps=args.steps, every=args.every,
                             seed=args.seed, bev=args.bev, map_path=args.map_path,
                             traffic=tuple(traffic_overrides(args).items()))
    except ValueError as e:
        raise SystemExit(f"{what}: {e}") from None


def bench_reward_quality(args) -> dict:
    import numpy as np
    import torch
    from tqdm.auto import tqdm

    from drivemind.evaluation.reward_quality import (action_alignment, collect, evaluate_reward,
                                                     plot_distributions, retrieval_top1)
    from drivemind.rewards import REWARDS

    if args.threads:
        torch.set_num_threads(args.threads)
    names = _csv(args.rewards) if args.rewards else tuple(REWARDS)
    bad = [n for n in names if n not in REWARDS]
    if bad:
        raise SystemExit(f"unknown reward(s) {bad}; valid: {', '.join(REWARDS)}")
    overrides = _param_overrides(args.set, names)
    cfg = _heldout_config(args, "reward-quality")
    t0 = time.perf_counter()
    embed_speed = False  # the encoder also reads each frame's ego speed (BEV-CLIP's speed tower)
    if args.vlm == "openclip":
        from omegaconf import OmegaConf

        from drivemind.vlm.openclip import OpenClipEncoder

        conf = Path(__file__).resolve().parents[1] / "configs" / "vlm" / "openclip.yaml"
        enc_cfg = dict(OmegaConf.to_container(OmegaConf.load(conf), resolve=True)["encoder"])
        for k, v in (("model_name", args.model), ("pretrained", args.pretrained),
                     ("weights_path", args.weights_path)):
            if v is not None:
                enc_cfg[k] = None if v in ("none", "random", "") and k == "pretrained" else v
        enc_cfg["bev"] = args.bev
        torch.manual_seed(args.seed)  # a random initialisation (--pretrained none) is reproducible
        try:
            enc = OpenClipEncoder.from_config(enc_cfg)
        except (ImportError, ValueError, FileNotFoundError) as e:
            raise SystemExit(f"reward-quality --vlm openclip: {e}") from None
        embed, text, encoder_name = enc.embed, enc, enc.name
        tower = f"openclip:{enc_cfg.get('model_name') or enc_cfg.get('weights_path') or '?'}"
    else:
        from drivemind.bev import BEV_PRESETS
        from drivemind.vlm.bev_clip import BevClip
        from drivemind.vlm.text import MiniLMTextEncoder

        shape = tuple(BEV_PRESETS[args.bev].shape) if args.bev in BEV_PRESETS else None
        if shape is None:
            raise SystemExit(f"--bev must be one of {', '.join(BEV_PRESETS)}, got {args.bev!r}")
        try:
            model = BevClip.load(args.weights_path or _config_tower(shape), bev_shape=shape)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"reward-quality --weights-path: {e}") from None
        embed, text, encoder_name = model.embed, None, "bev_clip+minilm"
        embed_speed = model.reads_speed
        if model.reads_speed:  # the opt-in speed tower (bev_clip_cpu_speed.pt)
            encoder_name = f"bev_clip[{model.path.name}, ego speed]+minilm"
        elif args.weights_path:
            encoder_name = f"bev_clip[{model.path.name}]+minilm"
        tower = model.path.name
    try:  # VLM-RL's / DriveVLM-RL's null window: the one measured for this tower
        factories = {n: _reward_factory(n, overrides.get(n), tower) for n in names}
    except TypeError as e:
        raise SystemExit(f"reward-quality --set: {e}") from None
    total = len(cfg.towns) * len(cfg.densities) * len(cfg.drivers) * cfg.steps
    with tqdm(total=total, desc="held-out set", unit="step", disable=not args.progress) as bar:
        data = collect(cfg, embed=embed, progress=bar,
                       embed_speed=embed_speed)
    t_collect = time.perf_counter() - t0
    lab = data.labels
    out = {"encoder": encoder_name, "rows": len(data), "danger_rows": int(lab["collision_1s"].sum()),
           "safe_rows": int((lab["safe"] & ~lab["collision_1s"]).sum()),
           "near_miss_rows": int(((lab["ttc_lead_s"] <= 3) & ~lab["collision_1s"]).sum()),
           "red_light_rows": int(lab["red_light_run"].sum()), "offroad_rows": int(lab["offroad"].sum()),
           "set": data.meta, "collect_s": round(t_collect, 1)}
    ret = retrieval_top1(data, text if text is not None else MiniLMTextEncoder())
    out["retrieval_top1"] = ret["accuracy"]
    out["retrieval"] = ret
    al = action_alignment(data, text)  # Found-RL's P(a_t) against 1/30
    out["found_rl_p_at"], out["found_rl_top1"] = al["p_mean"], al["top1"]
    out["found_rl_alignment"] = al
    per, plot_vals = {}, {}
    for name in names:
        t1 = time.perf_counter()
        res, vals = evaluate_reward(factories[name], data,
                                    learn_rounds=args.learn_rounds, seed=args.seed, text_encoder=text)
        res["seconds"] = round(time.perf_counter() - t1, 1)
        per[name] = res
        plot_vals[name] = (vals, res["auroc"])
        for k in ("auroc", "auroc_speed_matched", "spearman", "standstill_wins"):
            out[f"{k}.{name}"] = None if not np.isfinite(res[k]) else round(float(res[k]), 4)
    out["per_reward"] = per
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        out["plot"] = plot_distributions(plot_vals, data, args.plot)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out.update(machine())
    return _finite_json(out)


def bench_lane_readout(args) -> dict:
    import numpy as np

    from drivemind.bev.lane_offset import RouteOffsetReadout
    from drivemind.evaluation.reward_quality import collect
    from drivemind.vlm.captions import situation

    cfg = _heldout_config(args, "lane-readout")
    try:
        readout = RouteOffsetReadout(args.bev)
    except ValueError as e:
        raise SystemExit(f"lane-readout: {e}") from None
    t0 = time.perf_counter()
    data = collect(cfg, embed=lambda bev: readout.features(bev).numpy())  # the frames' readouts
    t_collect = time.perf_counter() - t0
    got, valid = data.embedding[:, 0].astype(np.float64), data.embedding[:, 2] > 0
    true, head = data.facts["lateral_offset"], data.facts["heading_error"]
    err = np.abs(got - true)

    def lane(x):
        return np.array([situation({"lateral_offset": float(v)})["lane"] for v in x])

    lt, lg = lane(true), lane(got)
    _, counts = np.unique(lt, return_counts=True)

    def summary(sel):
        n = int(sel.sum())
        return {"n": n, "mae_m": float(err[sel].mean()) if n else None,
                "facet_accuracy": float((lt[sel] == lg[sel]).mean()) if n else None}

    bands = {}
    for lo, hi in ((0, .3), (.3, .5), (.5, .7), (.7, 1), (1, 1.5), (1.5, 2.5), (2.5, np.inf)):
        bands[f"{lo}-{hi}"] = summary((np.abs(true) >= lo) & (np.abs(true) < hi))
    per_class = {k: summary(lt == k) for k in sorted(set(lt))}
    out = {"what": "lane-readout", "bev": args.bev, "rows": len(data), "valid": float(valid.mean()),
           "mae_m": float(err.mean()), "median_m": float(np.median(err)),
           "p90_m": float(np.percentile(err, 90)), "bias_m": float((got - true).mean()),
           "facet_accuracy": float((lt == lg).mean()), "facet_majority": float(counts.max() / len(lt)),
           "parallel": summary(np.abs(head) < 0.02), "oblique": summary(np.abs(head) >= 0.02),
           "by_offset_m": bands, "by_lane": per_class,
           "pixel_m": 1.0 / readout.ppm, "set": data.meta, "collect_s": round(t_collect, 1),
           "seconds": round(time.perf_counter() - t0, 1)}
    out.update(machine())
    return _finite_json(out)


def bench_distill(args) -> dict:
    import torch
    import yaml

    from drivemind.evaluation.distill import DistillConfig, plot_curve, run

    if args.threads:
        torch.set_num_threads(args.threads)
    conf = yaml.safe_load(Path(args.config).read_text()) if args.config else {}
    student = dict((conf or {}).get("kwargs") or {})
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set wants key=value (e.g. lora_rank=8), got {item!r}")
        student[key] = yaml.safe_load(value)
    split = (lambda s: tuple(x.strip() for x in s.split(",") if x.strip()))
    try:
        cfg = DistillConfig(towns=split(args.towns), densities=split(args.densities),
                            drivers=split(args.drivers), env_steps=args.env_steps,
                            heldout_env_steps=args.heldout_env_steps, every=args.every,
                            max_share=args.max_share, lora_steps=args.lora_steps,
                            eval_every=args.eval_every, eval_scenes=args.eval_scenes,
                            seed=args.seed, bev=args.bev, student=student)
    except ValueError as e:
        raise SystemExit(f"distill: {e}") from None

    def progress(m):
        print(f"step {m['step']}: parse_rate {m['parse_rate']:.3f} agreement {m['agreement']:.3f} "
              f"(present {m['agreement_present']:.3f}, ideal {m['agreement_ideal']:.3f}, majority "
              f"{m['majority_agreement']:.3f}, best constant {m['best_constant_agreement']:.3f}) "
              f"distinct {m['distinct_answers']} loss {m['loss']}", file=sys.stderr, flush=True)

    try:
        out = run(cfg, progress=progress)
    except ValueError as e:
        raise SystemExit(f"distill: {e}") from None
    for k in ("parse_rate", "agreement", "agreement_present", "agreement_ideal", "majority_agreement",
              "best_constant_agreement",
              "learn_s_per_step", "collect_s", "seconds"):
        out[k] = round(float(out[k]), 4)
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        out["plot"] = plot_curve(out["curve"], args.plot)
    out.update(machine())
    return _finite_json(out)


def _finite_json(x):
    """NaN / inf -> None, recursively (strict JSON)."""
    import math
    if isinstance(x, dict):
        return {k: _finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_json(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _script_main(name: str, argv: list[str]) -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main(argv)


def grid_town_xodr(n: int, spacing: float = 80.0) -> str:
    """OpenDRIVE of an n x n lattice of 4-way junctions (two-way one-lane streets ``spacing`` m
    apart, every other junction signalised), built with the built-in towns' builder: a town as
    large as asked, for :func:`bench_load`."""
    from drivemind.maps import towns

    b = towns._TownBuilder(f"grid{n}x{n}")

    def nid(i, j):
        return 1000 * i + j

    for i in range(n):
        for j in range(n):
            b.node(nid(i, j), i * spacing, j * spacing, d=towns.LANE_WIDTH + towns.SIDEWALK_WIDTH + 6.0,
                   signalised=(i + j) % 2 == 0)
    for j in range(n):
        for i in range(n - 1):
            b.road(nid(i, j), 0, nid(i + 1, j), 180, lanes=1, shape="line")
    for i in range(n):
        for j in range(n - 1):
            b.road(nid(i, j), 90, nid(i, j + 1), 270, lanes=1, shape="line")
    return b.to_xodr()


def _expand_random(sources) -> list[str]:
    """``sources`` with each ``random-A..B`` replaced by the towns generated from seeds A to B."""
    import re

    from drivemind.maps.towns import RANDOM_PREFIX

    out = []
    for src in sources:
        m = re.fullmatch(re.escape(RANDOM_PREFIX) + r"(\d+)\.\.(\d+)", src)
        if m and int(m[1]) > int(m[2]):
            raise SystemExit(f"{src}: the first seed is above the last; e.g. {RANDOM_PREFIX}0..29")
        out += [f"{RANDOM_PREFIX}{k}" for k in range(int(m[1]), int(m[2]) + 1)] if m else [src]
    return out


def bench_maps(args) -> dict:
    """Which OpenDRIVE files of some folders (and towns named: ``Town02``, ``random-0..99``)
    load, and why the others do not: per map the lanes, km of lane and spawn points it gives,
    its lanes with no way on (``dead_ends``) and the strongly connected components of its lane
    graph (``components``: 1 where every lane is reachable from every other), or its error's
    first line; the MapWarnings per kind. Every file goes through the loader as a user's would
    (the child-process check included)."""
    import re
    import warnings

    from drivemind.maps import load_town
    from drivemind.maps.opendrive import load_xodr_file
    from drivemind.maps.routing import _lane_components
    from drivemind.maps.validate import MapWarning

    maps = []  # (key, how to load it)
    for src in _expand_random(args.dirs):
        if Path(src).is_dir():
            files = _xodr_files(src)
            if not files:
                raise SystemExit(f"no .xodr files in {src}")
            # two folders may hold files of one name
            maps += [(f"{f.parent.name}/{f.name}", functools.partial(load_xodr_file, f)) for f in files]
        else:
            maps.append((src, functools.partial(load_town, src)))
    maps.sort(key=lambda m: m[0])
    per_file, failed, kinds = {}, {}, {}
    t0 = time.perf_counter()
    for key, load in maps:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                rm = load()
            except Exception as exc:  # noqa: BLE001 - the point is to report every failure
                failed[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                continue
        found = []
        for w in caught:
            if issubclass(w.category, MapWarning):
                # "<name> (<path>): <count> <kind>: <ids>" -> the kind
                m = re.match(r".*?\): \d+ (.*?)(?: \(|:)", str(w.message))
                kind = m.group(1) if m else str(w.message)[:80]
                found.append(kind)
                kinds[kind] = kinds.get(kind, 0) + 1
        comp, _ = _lane_components(rm)
        per_file[key] = {"lanes": int(rm.n_lanes), "lane_km": round(float(rm.length.sum()) / 1000, 3),
                         "spawn_points": int(len(rm.spawn)), "warnings": found,
                         "dead_ends": sum(len(rm.successors(i)) == 0 for i in range(rm.n_lanes)),
                         "components": int(comp.max()) + 1 if len(comp) else 0}
    return {"what": "maps", "dirs": list(args.dirs), "files": len(maps), "loaded": len(per_file),
            "failed": failed, "warning_kinds": kinds,
            "not_strongly_connected": sorted(k for k, v in per_file.items() if v["components"] != 1),
            "per_file": per_file, "wall_s": round(time.perf_counter() - t0, 1), **machine()}


SET_KEYS = {  # the figures a set's summary keeps per run (the whole JSON stays in --out)
    "sim": ("npc_mean_speed_kmh", "npc_stopped_share_at_end", "npc_max_stuck_s", "npc_respawns",
            "npc_collisions", "ego_collisions", "ego_routes_completed"),
    "autopilot": ("route_completion", "collisions_caused", "mean_speed_kmh"),
}


def _xodr_files(folder) -> list[Path]:
    """The OpenDRIVE files of a folder (``.xodr``, ``.xodr.xz``, ``.xodr.gz``), sorted."""
    from drivemind.maps.resolve import XODR_SUFFIXES

    return sorted(f for f in Path(folder).iterdir() if f.name.endswith(XODR_SUFFIXES))


def _misses_bars(speed, standing, stuck, npc_collisions, ego_collisions) -> bool:
    """Whether a run's figures (or a network's over its seeds) miss issue 13's bars: NPC mean
    speed >= 15 km/h, standing share at the end <= 0.3, longest standing <= 120 s, no contact."""
    return bool((speed or 0) < 15.0 or (standing or 0) > 0.3 or (stuck or 0) > 120.0
                or npc_collisions or ego_collisions)


def _set_seeds(args) -> list[int] | None:
    """The seeds of ``--seeds`` (None: one run per network and density, at ``--seed``)."""
    if not args.seeds:
        return None
    if args.bench != "sim":
        raise SystemExit("--seeds is for --bench sim (the expert's fixed routes take no seed)")
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--seeds takes comma-separated integers, e.g. 0,1,2; got {args.seeds!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds takes distinct integers, e.g. 0,1,2; got {args.seeds!r}")
    return seeds


def _set_runs(args, seeds: list[int] | None) -> list[tuple[str, str, str | None, str, int]]:
    """(key, town, map folder or None, density, seed) of every run of a set: each OpenDRIVE file
    of each folder named, each other name as a town (built-in, shipped or on the search path),
    and ``random-A..B`` as the towns generated from seeds A to B (``random-A``, ...,
    ``random-B``); with ``seeds`` (:func:`_set_seeds`), each at every seed (its key ending
    ``__s<seed>``)."""
    densities = [d for d in args.densities.split(",") if d]
    runs = []
    for src in _expand_random(args.sources):
        p = Path(src)
        if p.is_dir():
            from drivemind.maps.opendrive import xodr_stem

            files = _xodr_files(p)
            if not files:
                raise SystemExit(f"no .xodr files in {src}")
            for f in files:
                name = xodr_stem(f)
                # by path: by name, a file named as a built-in town (esmini's curves.xodr) gave
                # the built-in town
                runs += [(f"{p.name}__{name}__{d}", str(f.resolve()), str(p.resolve()), d)
                         for d in densities]
        else:
            runs += [(f"{src}__{d}", src, None, d) for d in densities]
    if seeds is None:
        runs = [(*r, args.seed) for r in runs]
    else:
        runs = [(f"{r[0]}__s{s}", *r[1:], s) for r in runs for s in seeds]
    keys = [r[0] for r in runs]
    if len(set(keys)) != len(keys):
        raise SystemExit("two runs of the set share a name (two folders of one name?); "
                         "name each folder once")
    return runs


def _set_run(args, out: Path, run) -> tuple[str, dict, bool]:
    """One run of a set: ``bench.py <bench>`` in a child process (its own DRIVEMIND_MAP_PATH),
    its JSON written to ``out`` as it ends; a run already there is read back (a set resumes).
    A run that fails keeps the last line of its error."""
    key, town, folder, density, seed = run
    path = out / f"{key}.json"
    if path.exists():
        return key, json.loads(path.read_text()), False
    cmd = [sys.executable, str(Path(__file__).resolve()), args.bench, "--town", town,
           "--density", density]
    if args.bench == "sim":
        cmd += ["--seconds", str(args.seconds), "--seed", str(seed), "--cores", "0"]
    for kv in args.traffic or []:
        cmd += ["--traffic", kv]
    env = dict(os.environ)
    if folder is not None:
        env["DRIVEMIND_MAP_PATH"] = folder
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        lines = proc.stdout.strip().splitlines()
        try:
            res = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
        except json.JSONDecodeError:
            res = None
        if res is None:
            err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            res = {"error": (err[-1] if err else f"exit status {proc.returncode}")[:400]}
    except subprocess.TimeoutExpired:
        res = {"error": f"timed out after {args.timeout} s (--timeout)"}
    res["set_wall_s"] = round(time.perf_counter() - t0, 1)
    path.write_text(json.dumps(res))
    return key, res, True


def bench_sim_set(args) -> dict:
    """`sim` (or `autopilot`) on every network of a set: each OpenDRIVE file of the folders named
    and each town named, at each density, ``--jobs`` runs at a time, each in its own process,
    its JSON written to ``--out`` as it ends (run the same command again to resume). Reports per
    run the figures of SET_KEYS (or its error), the totals, the runs that miss the issue-13 bars,
    and with ``--compare`` (an earlier set's JSON) which runs give other figures than there."""
    from concurrent.futures import ThreadPoolExecutor

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = _set_seeds(args)
    runs = _set_runs(args, seeds)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(1, args.jobs)) as ex:
        done = list(ex.map(lambda r: _set_run(args, out, r), runs))
    keys = SET_KEYS[args.bench]
    per_run = {k: ({"error": r["error"]} if "error" in r else {x: r.get(x) for x in keys})
               for k, r, _ in done}
    ok = {k: r for k, r in per_run.items() if "error" not in r}
    result = {"what": "sim-set", "bench": args.bench, "sources": list(args.sources),
              "densities": args.densities, "seed": args.seed if seeds is None else seeds,
              "traffic": args.traffic or [],
              "out": str(out), "runs": len(runs), "ran_now": sum(1 for *_, new in done if new),
              "failed": {k: r["error"] for k, r in per_run.items() if "error" in r}}
    if args.bench == "sim":
        result["seconds"] = args.seconds
        result["totals"] = {x: int(sum(r[x] or 0 for r in ok.values()))
                            for x in ("npc_respawns", "npc_collisions", "ego_collisions")}
        result["mean_npc_speed_kmh"] = (round(float(np.mean([r["npc_mean_speed_kmh"] for r in ok.values()])), 2)
                                        if ok else None)
        result["missing_bars"] = sorted(
            k for k, r in ok.items()
            if _misses_bars(r["npc_mean_speed_kmh"], r["npc_stopped_share_at_end"],
                            r["npc_max_stuck_s"], r["npc_collisions"], r["ego_collisions"]))
        if seeds is not None:
            # each network and density over its seeds: the mean NPC speed and its seeds' figures
            by: dict[str, list] = {}
            for k, r in ok.items():
                by.setdefault(k.rsplit("__s", 1)[0], []).append(r)
            result["over_seeds"] = {
                k: {"seeds": len(rs),
                    "npc_mean_speed_kmh": round(float(np.mean([r["npc_mean_speed_kmh"] for r in rs])), 2),
                    "npc_stopped_share_at_end_max": max(r["npc_stopped_share_at_end"] for r in rs),
                    "npc_max_stuck_s_max": max(r["npc_max_stuck_s"] for r in rs),
                    **{x: int(sum(r[x] or 0 for r in rs))
                       for x in ("npc_respawns", "npc_collisions", "ego_collisions")}}
                for k, rs in by.items()}
            # the bars over the seeds: the mean speed, the worst seed's standing figures, any
            # contact
            result["over_seeds_missing_bars"] = sorted(
                k for k, r in result["over_seeds"].items()
                if _misses_bars(r["npc_mean_speed_kmh"], r["npc_stopped_share_at_end_max"],
                                r["npc_max_stuck_s_max"], r["npc_collisions"], r["ego_collisions"]))
    else:
        result["totals"] = {"collisions_caused": int(sum(r["collisions_caused"] or 0 for r in ok.values()))}
        result["below_0.95"] = sorted(k for k, r in ok.items() if (r["route_completion"] or 0) < 0.95)
    if args.compare:
        base = json.loads(Path(args.compare).read_text())
        base = base.get("per_run", base)
        same, differ, new = [], {}, []
        for k, r in per_run.items():
            if k not in base:
                new.append(k)
            elif all(base[k].get(x) == r.get(x) for x in set(base[k]) | set(r)):
                same.append(k)
            else:
                differ[k] = {x: [base[k].get(x), r.get(x)] for x in sorted(set(base[k]) | set(r))
                             if base[k].get(x) != r.get(x)}
        result["compare"] = {"base": args.compare, "same": len(same), "differ": differ,
                             "not_in_base": new}
    result["per_run"] = per_run
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    return {**result, **machine()}


def bench_load(args) -> dict:
    """Seconds to load a town and build its traffic tables and world, and the memory it takes:
    how the simulator scales with a town's size (--grid N: a generated N x N lattice)."""
    import resource
    import tempfile

    from drivemind.bev import BEV_PRESETS, BevRenderer
    from drivemind.maps import load_town
    from drivemind.sim import density_config
    from drivemind.sim.config import TrafficParams
    from drivemind.sim.tables import traffic_tables
    from drivemind.sim.world import LiteWorld

    pinned = pin_one_core() if args.cores == 1 else False
    name, gen_s = args.town, None
    with tempfile.TemporaryDirectory() as tmp:
        if args.grid:
            t = time.perf_counter()
            text = grid_town_xodr(args.grid)
            gen_s = time.perf_counter() - t
            name = os.path.join(tmp, f"grid{args.grid}x{args.grid}.xodr")
            with open(name, "w") as f:
                f.write(text)
        t0 = time.perf_counter()
        rm = load_town(name)
        t1 = time.perf_counter()
    tab = traffic_tables(rm, TrafficParams())
    t2 = time.perf_counter()
    world = LiteWorld(rm, density_config(args.density))
    t3 = time.perf_counter()
    snap = world.reset(seed=args.seed, ego_pose=0)
    t4 = time.perf_counter()
    for _ in range(20):  # compiled kernels load from the cache
        world.step((0.0, -1.0))
    t5 = time.perf_counter()
    for _ in range(args.steps):
        snap = world.step((0.0, -1.0))
    t6 = time.perf_counter()
    # the BEV (the env's observation): its town raster and the first view (masks and colour)
    bev = BevRenderer(rm, BEV_PRESETS[args.bev])
    bev.step(snap)
    bev.rgb()
    t7 = time.perf_counter()
    return {"what": "load", "town": rm.name, "grid": args.grid, "density": args.density,
            "lanes": int(rm.n_lanes), "junction_lanes": int((rm.junction >= 0).sum()),
            "junctions": int(len(np.unique(rm.junction[rm.junction >= 0]))),
            "generate_s": None if gen_s is None else round(gen_s, 2),
            "load_s": round(t1 - t0, 2), "tables_s": round(t2 - t1, 2),
            "world_s": round(t3 - t2, 2), "reset_s": round(t4 - t3, 2),
            "tables_mb": round(sum(getattr(v, "nbytes", 0) for v in tab.values()) / 2**20, 2),
            "step_ms": round(1000 * (t6 - t5) / max(args.steps, 1), 3),
            "bev": args.bev, "bev_first_view_s": round(t7 - t6, 2),
            "bev_raster_mb": round(bev.raster.nbytes / 2**20, 1),
            "bev_raster_whole": bool(getattr(bev.raster, "whole", True)),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "one_core": pinned, **machine()}


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

    s = timed("sim", "embedded simulator world steps/s and background collisions", "dense", 600.0)
    s.add_argument("--traffic", action="append", metavar="KEY=VALUE",
                   help="a sim.traffic setting (repeatable), e.g. junction_release=connector")
    s.add_argument("--vehicles", type=int, default=None, metavar="N",
                   help="N vehicles instead of the density's (its other actors unchanged): NPC speed "
                        "against the number of vehicles, down to 1 (the lights' and turns' bound)")
    s.add_argument("--breakdown", action="store_true",
                   help="also report where the NPCs' time goes (slow: a Python loop per step)")
    s.add_argument("--backend", choices=("lite", "carla"), default="lite",
                   help="lite: the embedded simulator; carla: a CARLA server, its Traffic Manager "
                        "driving the traffic (the figures a snapshot gives; see --carla)")
    s.add_argument("--carla", action="append", metavar="KEY=VALUE",
                   help="a sim.carla setting with --backend carla (repeatable), e.g. host=gpu-box, "
                        "port=2000, timeout=20, tm_speed_difference=30")
    e = timed("env", "full env steps/s, and highway-env intersection-v0 side by side", "regular", 300.0)
    e.add_argument("--bev", default="roach", help="BEV preset: roach (15x192x192), paper, cpu")
    e.add_argument("--peer-steps", type=int, default=1000, help="highway-env steps timed (it is slow)")
    networks = ("folders of .xodr / .xodr.xz / .xodr.gz files, town names (grid, Town02, ...), and "
                "random-A..B: the towns generated from seeds A to B")
    p = sub.add_parser("maps", help="which OpenDRIVE files of some folders (and towns) load, and why "
                                    "the others do not (lanes, km, spawn points, dead ends, "
                                    "strongly connected components, map warnings per map)")
    p.add_argument("dirs", nargs="+", help=networks)
    p = sub.add_parser("sim-set", help="`sim` (or `autopilot`) on every network of a set (the files "
                                       "of folders, and towns), runs in parallel, resumable, "
                                       "optionally compared with an earlier set")
    p.add_argument("sources", nargs="+", help=networks)
    p.add_argument("--bench", choices=tuple(SET_KEYS), default="sim")
    p.add_argument("--densities", default="dense,drivevlm", help="comma-separated")
    p.add_argument("--seconds", type=float, default=600.0, help="simulated seconds per `sim` run")
    p.add_argument("--seed", type=int, default=0, help="the `sim` runs' seed")
    p.add_argument("--seeds", default=None, metavar="S,S,...",
                   help="run each network and density at each of these seeds (keys end __s<seed>; "
                        "`over_seeds` gives the mean NPC speed per network and density)")
    p.add_argument("--traffic", action="append", metavar="KEY=VALUE",
                   help="a sim.traffic setting for every run (repeatable)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before a run is given up")
    p.add_argument("--out", default="outputs/bench/sim-set",
                   help="folder of the runs' JSON (one file each; runs found there, failed ones "
                        "included, are not re-run: delete a file to run it again)")
    p.add_argument("--compare", default=None, metavar="JSON",
                   help="an earlier sim-set's JSON: which runs give other figures")
    p = sub.add_parser("load", help="seconds to load a town and build its traffic tables and world, "
                                    "and its memory: a town's size against the simulator's set-up")
    p.add_argument("--town", default="Town05")
    p.add_argument("--grid", type=int, default=0, metavar="N",
                   help="a generated N x N lattice of 4-way junctions instead of --town")
    p.add_argument("--density", default="dense")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=200, help="world steps timed after set-up")
    p.add_argument("--bev", default="roach", help="BEV preset whose raster and first view are timed")
    p.add_argument("--cores", type=int, default=1, help="1 pins the process to one core")
    p = sub.add_parser("autopilot", help="autopilot route completion on the fixed evaluation routes")
    p.add_argument("--town", default="Town02")
    p.add_argument("--density", default="regular")
    p.add_argument("--max-steps", type=int, default=20000, help="step limit per route")
    p.add_argument("--traffic", action="append", metavar="KEY=VALUE",
                   help="a sim.traffic setting (repeatable), e.g. junction_release=connector")
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
    p = sub.add_parser("update", help="ms per SAC gradient step on the fast path, per batch size "
                                      "(and under bf16 autocast)")
    p.add_argument("--experiment", default="fast", help="fast (CPU) or paper (GPU: the CNN on the 224 px BEV)")
    p.add_argument("--compare-decode", action="store_true",
                   help="on a GPU, also time the step with the image codes gathered on the CPU and "
                        "expanded on the GPU (_host_codes, stop 32's path) and with the images expanded "
                        "on the CPU and copied over (_cpu_decode, the path before) beside the default "
                        "(codes kept and gathered on the GPU)")
    p.add_argument("--reward", default="drivemind_kinematic")
    p.add_argument("--town", default="Town02")
    p.add_argument("--density", default="regular")
    p.add_argument("--batch-sizes", default="256,512,1024")
    p.add_argument("--autocast", default="none", help="none, or bf16: also time with algo.autocast=bf16")
    p.add_argument("--warmup", type=int, default=3000, help="env steps of real training before timing")
    p.add_argument("--updates", type=int, default=30, help="gradient steps per timed round")
    p.add_argument("--profile", type=int, default=0, metavar="K",
                   help="also run torch's profiler over one round at the first batch size and report "
                        "its K most expensive operators (self time per update)")
    p.add_argument("overrides", nargs="*", help="hydra overrides of the fast path's config, e.g. "
                                                "algo.policy_kwargs.net_arch=[128,128]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
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
    p.add_argument("--detector-model", default=None,
                   help="--detector yolo: a .pt checkpoint (default yolov8n.pt, found locally) or a "
                        ".yaml architecture with random weights (yolov8n.yaml: offline, timing only)")
    p.add_argument("--detector-imgsz", type=int, default=None, help="--detector yolo: inference size")
    p.add_argument("--reasoner", default="tiny_qwen_vl", help="tiny_qwen_vl, qwen_vl or privileged")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--buffer-size", type=int, default=20_000)
    p.add_argument("--warmup", type=int, default=200, help="env steps before timing (untimed)")
    p.add_argument("--train-freq", type=int, default=10, help="env steps per training round")
    p.add_argument("--steps", type=int, default=300, help="env steps timed")
    p.add_argument("--threads", type=int, default=1, help="torch threads in the learner")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("learn", help="learning speed: train for --minutes of wall time with the fast "
                                     "settings (experiment=fast), then RC/SR/CR on the town's fixed routes")
    p.add_argument("--reward", default="drivemind_kinematic")
    p.add_argument("--town", default="Town02")
    p.add_argument("--density", default="regular")
    p.add_argument("--minutes", type=float, default=15.0, help="wall-time budget of training per seed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None, help="comma-separated seeds, run one after the other")
    p.add_argument("--experiment", default="fast", help="experiment config (fast, learning_check, ...)")
    p.add_argument("--max-env-steps", type=int, default=10_000_000,
                   help="total_timesteps (the wall-time budget stops the run first)")
    p.add_argument("--run-dir", default=None, help="evaluate this finished run instead of training")
    p.add_argument("--out", default="outputs/bench", help="where the training runs go")
    p.add_argument("--max-steps", type=int, default=6000, help="step limit per evaluation route")
    p.add_argument("--checkpoint", choices=("latest", "best"), default="latest",
                   help="the policy evaluated: the last one, or the best on the validation routes "
                        "(a run trained with validation.every=<env steps>; the latest's figures "
                        "are printed beside it)")
    p.add_argument("override", nargs="*", help="extra Hydra overrides, e.g. algo.batch_size=128")
    p = sub.add_parser("learn-summary", help="many `learn` runs' JSON: route completion per variant "
                                             "with 95 %% intervals, runs at the goal, against a reference")
    p.add_argument("arms", nargs="+", metavar="NAME=PATTERN[,PATTERN...]",
                   help="a variant and the glob patterns of its `learn` JSON files")
    p.add_argument("--ref", default=None, help="the variant the others are compared with")
    p.add_argument("--goal", type=float, default=0.8, help="route completion a run should reach")
    p.add_argument("--draws", type=int, default=10000, help="bootstrap draws")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    p = sub.add_parser("checkpoints", help="every kept checkpoint of a run on the fixed and the "
                                           "validation routes: what checkpoint selection would pick")
    p.add_argument("--run-dir", required=True, help="a run trained with checkpoint_keep=0")
    p.add_argument("--max-steps", type=int, default=6000, help="step limit per route")
    p = sub.add_parser("minddrive", help="MindDrive learning check: SFT reference vs PPO in language "
                                         "space, route completion on the town's fixed routes")
    p.add_argument("--town", default="grid")
    p.add_argument("--density", default="regular")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sft-steps", type=int, default=3000, help="autopilot env steps for SFT")
    p.add_argument("--sft-epochs", type=int, default=3)
    p.add_argument("--ppo-steps", type=int, default=3000, help="PPO env steps (total_timesteps)")
    p.add_argument("--minutes", type=float, default=0.0,
                   help="wall-time budget of the whole run, SFT included (0: none; PPO stops at --ppo-steps)")
    p.add_argument("--routes", default=None, help="comma-separated fixed-route indices (default all)")
    p.add_argument("--max-steps", type=int, default=3000, help="step limit per evaluation route")
    p.add_argument("--out", default="outputs/bench")
    p.add_argument("--run-dir", default=None, help="evaluate this finished run instead of training")
    p.add_argument("--agent-set", action="append", default=[],
                   help="KEY=VALUE: a decision option set on both checkpoints for evaluation, "
                        "e.g. mask_infeasible=true (repeatable)")
    p.add_argument("override", nargs="*", help="extra Hydra overrides, e.g. algo.n_decisions=32")
    p = sub.add_parser("side-by-side", help="fast-path training steps/s alone, two runs at once, n_envs=2")
    p.add_argument("--seconds", type=float, default=240.0, help="wall time of each training run")
    p.add_argument("--reward", default="drivemind_kinematic")
    p.add_argument("--town", default="Town02")
    p.add_argument("--density", default="regular")
    p = sub.add_parser("reward-quality", help="every reward as a safety signal on a labelled held-out "
                                              "set: AUROC, Spearman, standstill wins, BEV-CLIP retrieval")
    _add_heldout_args(p, "BEV preset (cpu: 15x96x96)")
    p.add_argument("--rewards", default=None, help="comma-separated rewards (default: every registered one)")
    p.add_argument("--learn-rounds", type=int, default=200,
                   help="world-model rounds for rewards that learn (DriveMind's PCFM), per fold")
    p.add_argument("--set", action="append", default=[], metavar="REWARD.PARAM=VALUE",
                   help="override a reward's config param (repeatable), e.g. vlm_rl.theta_min=-0.03")
    p.add_argument("--vlm", default="bev_clip", choices=("bev_clip", "openclip"))
    p.add_argument("--model", default=None, help="--vlm openclip: open_clip model name (e.g. ViT-B-32), "
                   "hf-hub:/local-dir: folder, or a model-config .json file (configs/vlm/openclip_tiny.json)")
    p.add_argument("--pretrained", default=None, help="--vlm openclip: tag, local checkpoint file, or "
                   "none (random weights seeded with --seed)")
    p.add_argument("--weights-path", default=None, help="--vlm openclip: checkpoint file or folder; "
                   "--vlm bev_clip: a BEV-CLIP checkpoint (path or name, e.g. bev_clip_cpu_speed.pt: "
                   "the speed tower; bev_clip_cpu.pt: the image-only one; default: the tower training uses by "
                   "default for --bev, configs/config.yaml's vlm: bev_clip_<bev>_speed_lane.pt)")
    p.add_argument("--plot", default="outputs/bench/reward_quality.png", help="distributions PNG ('' : none)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    p.add_argument("--progress", action="store_true", help="a progress bar on stderr")
    p = sub.add_parser("lane-readout", help="the fixed route-band readout of the ego's lateral offset "
                                            "vs the lateral_offset fact on reward-quality's held-out set")
    _add_heldout_args(p, "BEV preset (cpu 2.5 px/m, roach 5 px/m, paper 5.8 px/m)")
    p = sub.add_parser("distill", help="prompt distillation: a student_smolvlm distilled online from the "
                                       "privileged teacher, parse rate and agreement on held-out scenes")
    p.add_argument("--towns", default="grid,curves,avenue")
    p.add_argument("--densities", default="regular,dense")
    p.add_argument("--drivers", default="expert,perturbed,random")
    p.add_argument("--env-steps", type=int, default=900, help="training drive: env steps per town x density x driver")
    p.add_argument("--heldout-env-steps", type=int, default=150, help="held-out drive: the same")
    p.add_argument("--every", type=int, default=3, help="keep every n-th frame")
    p.add_argument("--max-share", type=float, default=0.2, help="cap of one teacher answer in the training stream")
    p.add_argument("--lora-steps", type=int, default=1500, help="LoRA steps (one per training scene)")
    p.add_argument("--eval-every", type=int, default=300, help="LoRA steps between two points of the curve")
    p.add_argument("--eval-scenes", type=int, default=40, help="held-out scenes answered at each point")
    p.add_argument("--seed", type=int, default=0, help="the student's initial weights and the stream's order")
    p.add_argument("--bev", default="cpu", help="BEV preset (cpu: 15x96x96)")
    p.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs" / "generator"
                                           / "student_smolvlm.yaml"), help="the student's config ('' : code defaults)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a student option (repeatable), e.g. lora_rank=8")
    p.add_argument("--plot", default="outputs/bench/distill.png", help="curve PNG ('' : none)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    sub.add_parser("reward-dist", help="reward distribution W1/KS between two towns "
                                       "(scripts/reward_distribution.py; its options follow)")
    sub.add_parser("reward-service", help="reward service vs in-process embedding throughput "
                                          "(scripts/bench_reward_service.py; its options follow)")
    args = ap.parse_args(argv)
    result = {"sim": bench_sim, "env": bench_env, "autopilot": bench_autopilot, "load": bench_load,
              "maps": bench_maps, "sim-set": bench_sim_set,
              "train": bench_train, "update": bench_update, "reward": bench_reward, "learn": bench_learn,
              "checkpoints": bench_checkpoints, "learn-summary": bench_learn_summary,
              "side-by-side": bench_side_by_side,
              "drivevlm-service": bench_drivevlm_service, "minddrive": bench_minddrive,
              "reward-quality": bench_reward_quality, "distill": bench_distill,
              "lane-readout": bench_lane_readout}[args.what](args)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
