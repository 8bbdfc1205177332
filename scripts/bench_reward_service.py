#!/usr/bin/env python
"""Benchmark: BEV-CLIP embedding in-process vs through the asynchronous reward service.

    python scripts/bench_reward_service.py --frames 512 --threads 1

Frames: 15x96x96 BEV masks (``bev=cpu``) from the lite env (Town02, regular traffic, autopilot).
Prints one JSON object on the last line of stdout (medians over ``--rounds`` interleaved rounds):

- ``in_process.batch32`` / ``in_process.batch1``: ``BevClip.embed`` on batches of 32 / single
  frames in this process: frames_per_s, latency (one call) mean/p95 ms.
- ``service.burst``: every frame submitted as fast as back-pressure allows (max_batch 32,
  max_wait 10 ms, max_pending 64); ``service.stream``: one frame submitted per step, the learner
  polling between steps and doing ``--learner-ms`` of its own work per step (stand-in for an env
  step). One service serves all rounds (spawned and warmed up once, untimed). Each:
  frames_per_s (end to end), latency mean/p95 ms (submit -> result sent by the worker),
  mean_batch_size, learner_ms_per_frame (time the learner spent in submit/poll, blocking
  included), blocked_s, worker_busy_share.
- ``max_abs_diff``: largest difference between the service's embeddings and in-process ones.

Torch uses ``--threads`` threads in this process and in the worker.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def collect_frames(n: int, town: str, density: str, seed: int):
    import gymnasium as gym
    import numpy as np

    import drivemind  # noqa: F401  (registers DriveMind-v0)

    env = gym.make("DriveMind-v0", town=town, density=density, bev="cpu")
    u = env.unwrapped
    obs, _ = env.reset(seed=seed)
    frames = []
    while len(frames) < n:
        obs, _, term, trunc, _ = env.step(u.expert_action())
        frames.append(obs["bev"].copy())
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    return np.stack(frames)


def lat_summary(lat_s) -> dict:
    import numpy as np

    a = 1e3 * np.asarray(lat_s)
    return {"latency_mean_ms": round(float(a.mean()), 2), "latency_p95_ms": round(float(np.percentile(a, 95)), 2)}


def bench_in_process(model, frames, batch: int) -> dict:
    lat = []
    t0 = time.perf_counter()
    for a in range(0, len(frames), batch):
        t = time.perf_counter()
        model.embed(frames[a:a + batch], batch_size=batch)
        lat.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    return {"frames_per_s": round(len(frames) / total, 1), **lat_summary(lat)}


def bench_service(svc, frames, mode: str, learner_ms: float) -> tuple[dict, dict]:
    import numpy as np

    out: dict[int, np.ndarray] = {}
    svc.reset_stats()
    busy = 0.0
    t0 = time.perf_counter()
    if mode == "burst":
        ids = np.arange(len(frames))
        step = svc.max_pending
        for a in range(0, len(frames), step):
            t = time.perf_counter()
            svc.submit(ids[a:a + step], frames[a:a + step])
            got, emb = svc.poll()
            busy += time.perf_counter() - t
            out.update(zip(got.tolist(), emb))
    else:
        for i in range(len(frames)):
            t = time.perf_counter()
            svc.submit([i], frames[i:i + 1])
            got, emb = svc.poll()
            busy += time.perf_counter() - t
            out.update(zip(got.tolist(), emb))
            spin_until = time.perf_counter() + learner_ms / 1000  # the learner's own work
            while time.perf_counter() < spin_until:
                pass
    t = time.perf_counter()
    got, emb = svc.drain(timeout=300)
    busy += time.perf_counter() - t
    out.update(zip(got.tolist(), emb))
    total = time.perf_counter() - t0
    st = svc.stats()
    n = len(frames)
    # latency p95 over the last 4096 requests: all the timed ones when --frames <= 4096
    res = {"frames_per_s": n / total, "latency_mean_ms": st["latency_mean_ms"],
           "latency_p95_ms": st["latency_p95_ms"], "mean_batch_size": st["mean_batch_size"],
           "learner_ms_per_frame": 1e3 * busy / n, "blocked_s": st["blocked_s"],
           "worker_busy_share": st["worker_busy_share"],
           "worker_queue_high_water": st["worker_queue_high_water"]}
    return res, out


def median_of(runs: list[dict], digits: int = 3) -> dict:
    import numpy as np

    return {k: round(float(np.median([r[k] for r in runs])), digits) for k in runs[0]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, here and in the worker")
    ap.add_argument("--town", default="Town02")
    ap.add_argument("--density", default="regular")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-wait-ms", type=float, default=10.0)
    ap.add_argument("--max-pending", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--learner-ms", type=float, default=5.0,
                    help="stream mode: the learner's own work per step (busy wait), in ms")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from bench import machine
    from drivemind.reward_service import RewardService, bev_clip_embedder
    from drivemind.vlm.bev_clip import BevClip

    torch.set_num_threads(args.threads)
    frames = collect_frames(args.frames, args.town, args.density, args.seed)
    shape = tuple(frames.shape[1:])
    model = BevClip.load(bev_shape=shape)
    model.embed(frames[:64], batch_size=32)  # warm-up
    ref = model.embed(frames, batch_size=256)
    factory = bev_clip_embedder(shape, threads=args.threads)
    runs: dict[str, list[dict]] = {"batch32": [], "batch1": [], "burst": [], "stream": []}
    diff = 0.0
    with RewardService(factory, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                       max_pending=args.max_pending, name="bench") as svc:
        warm = min(64, len(frames))  # untimed: the worker's first batches pay torch's one-off costs
        svc.submit(np.arange(warm) + 10**9, frames[:warm])
        svc.drain(timeout=300)
        for _ in range(args.rounds):  # interleaved, so a change in machine load hits all alike
            runs["batch32"].append(bench_in_process(model, frames, 32))
            runs["batch1"].append(bench_in_process(model, frames, 1))
            for mode in ("burst", "stream"):
                res, out = bench_service(svc, frames, mode, args.learner_ms)
                if sorted(out) != list(range(len(frames))):
                    raise RuntimeError(f"{mode}: {len(out)} of {len(frames)} results came back")
                got = np.stack([out[i] for i in range(len(frames))])
                diff = max(diff, float(np.abs(got - ref).max()))
                runs[mode].append(res)
    result = {"what": "reward-service", "machine": machine(),
              "load_avg_1min": round(os.getloadavg()[0], 2), "frames": len(frames),
              "bev_shape": list(shape), "threads": args.threads, "rounds": args.rounds,
              "checkpoint": str(model.path), "max_batch": args.max_batch,
              "max_wait_ms": args.max_wait_ms, "max_pending": args.max_pending,
              "learner_ms_per_step": args.learner_ms,
              "in_process": {k: median_of(runs[k], 2) for k in ("batch32", "batch1")},
              "service": {k: median_of(runs[k]) for k in ("burst", "stream")},
              "max_abs_diff": diff}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
