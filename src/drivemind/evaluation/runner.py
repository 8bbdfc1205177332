"""Run a frozen policy on a town's fixed evaluation routes and write the reports.

    from drivemind.evaluation import evaluate
    result = evaluate(policy, town="Town02", density="regular", out_dir="outputs/eval")
    result["metrics"]["RC"], result["files"]["md"]

``policy(obs) -> action`` must be deterministic; ``policy="autopilot"`` drives with the env's
built-in autopilot (``env.expert_action()``), a reference row and a test of the pipeline.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from .. import __version__
from ..envs import DriveEnv
from ..paths import machine_info
from .metrics import EpisodeAccumulator, EpisodeRecord, compute_metrics
from .report import write_reports
from .video import VideoWriter, render_frame

log = logging.getLogger(__name__)

AUTOPILOT = "autopilot"


def _policy_name(policy) -> str:
    if isinstance(policy, str):
        return policy
    return getattr(policy, "__qualname__", None) or type(policy).__qualname__


def _video_lines(acc: EpisodeAccumulator, info: dict) -> list[str]:
    """The third overlay line: route, step, collisions so far, how the episode ended."""
    end = info.get("termination") or info.get("truncation") or ""
    line = f"route {acc.route_index}  step {acc.steps}"
    if acc.collisions:
        line += f"  collisions {acc.collisions}"
    return [line + (f"  [{end}]" if end else "")]


def run_route(env: DriveEnv, act: Callable, route_index: int, *, max_steps: int | None = None,
              video: VideoWriter | None = None, masks: bool = True) -> EpisodeRecord:
    """Drive fixed route ``route_index`` with ``act(obs)`` until the episode ends (or
    ``max_steps``: truncation "max_steps"); frames go to ``video`` when given. An ``act`` with an
    ``observe(info, reset=False)`` attribute is handed each step's facts before it acts."""
    obs, info = env.reset(options={"route_index": route_index})
    observe = getattr(act, "observe", None)  # policies that read the step's facts (MindDrive)
    if observe is not None:
        observe(info, reset=True)
    acc = EpisodeAccumulator()
    acc.start(info)
    while True:
        obs, _, terminated, truncated, info = env.step(act(obs))
        if observe is not None:
            observe(info)
        acc.add(info)
        if video is not None:
            video.append(render_frame(env.render(), info, obs["bev"] if masks else None,
                                      extra=_video_lines(acc, info)))
        if terminated or truncated:
            return acc.finish()
        if max_steps is not None and acc.steps >= max_steps:
            return acc.finish(truncation="max_steps")


def evaluate(policy: Callable | str, *, town: str, density: str, out_dir,
             env_kwargs: dict | None = None, routes: Sequence[int] | None = None,
             video_route: int | None = 0, video_masks: bool = True,
             max_steps_per_route: int | None = None, progress: bool = True,
             meta: dict | None = None, check_env: Callable | None = None) -> dict:
    """Run ``policy`` on the fixed routes of ``town`` at ``density`` (all 10 by default), write
    the reports (and ``route_<video_route>.gif`` unless ``video_route`` is None) to ``out_dir``.
    ``check_env(env)``, if given, runs on the evaluation env before any route (a policy's
    observation check: its error then comes before any work, from the one env built).

    Returns ``{"metrics": dict, "records": [EpisodeRecord], "files": {name: Path}}``; ``files``
    holds json, csv, md, png (see ``write_reports``) and video when one was written.
    """
    if isinstance(policy, str) and policy != AUTOPILOT:
        raise ValueError(f"policy must be a callable policy(obs) -> action or {AUTOPILOT!r}, "
                         f"got {policy!r}")
    if not isinstance(policy, str) and not callable(policy):
        raise TypeError(f"policy must be callable (policy(obs) -> action), got {type(policy).__name__}")
    if max_steps_per_route is not None and max_steps_per_route < 1:
        raise ValueError(f"max_steps_per_route must be a positive integer or None, got "
                         f"{max_steps_per_route!r}")
    env_kwargs = dict(env_kwargs or {})
    clash = {"mode", "render_mode"} & env_kwargs.keys()
    if clash:
        raise ValueError(f"env_kwargs may not set {sorted(clash)}: evaluation fixes them")
    out = Path(out_dir)
    env = DriveEnv(town, density, mode="eval", render_mode="rgb_array", **env_kwargs)
    try:
        if check_env is not None:
            check_env(env)
        n = len(env.eval_route_list)
        routes = list(range(n)) if routes is None else [int(i) for i in routes]
        bad = [i for i in routes if not 0 <= i < n]
        if bad or not routes:
            raise ValueError(f"routes must be a non-empty list of indices in 0..{n - 1}, got {routes}")
        if video_route is not None and video_route not in routes:
            raise ValueError(f"video_route {video_route} is not among the evaluated routes {routes}; "
                             f"pass one of them or None")
        act = (lambda obs: env.expert_action()) if isinstance(policy, str) else policy
        records: list[EpisodeRecord] = []
        video_path = None
        bar = tqdm(routes, desc=f"eval {town}/{density}", unit="route", disable=not progress)
        for i in bar:
            video = None
            if i == video_route:
                video_path = out / f"route_{i}.gif"
                video = VideoWriter(video_path, fps=1.0 / env.sim_cfg.dt, fast_palette=True)
            try:
                rec = run_route(env, act, i, max_steps=max_steps_per_route, video=video,
                                masks=video_masks)
            finally:
                if video is not None:
                    video.close()
            records.append(rec)
            bar.set_postfix(route=i, end=rec.termination or rec.truncation,
                            reached=f"{sum(r.arrived for r in records)}/{len(records)}")
            log.debug("route %d: %s", i, rec)
        routes_file = getattr(env, "eval_routes_path", None)
        map_name = env.map.name
    finally:
        env.close()
    metrics = compute_metrics(records, mode="test")
    meta = {"town": town, "density": density, "map": map_name, "policy": _policy_name(policy),
            "mode": "test", "routes": routes, "max_steps_per_route": max_steps_per_route,
            "env_kwargs": env_kwargs, "routes_file": str(routes_file) if routes_file else None,
            "drivemind_version": __version__, "machine": machine_info(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **(meta or {})}
    files = write_reports(out, metrics, records, meta)
    if video_path is not None:
        files["video"] = video_path
    return {"metrics": metrics, "records": records, "files": files}
