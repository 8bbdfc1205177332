"""Checkpoint selection on validation routes (``validation.every``; docs/training.md).

A SAC policy's route completion moves a lot from one checkpoint to the next late in a short run
(Town02 regular, 15 minutes: 0.9 at 56k env steps, 0.1 at 64k, 0.8 at 72k on one seed). With
``validation.every=N`` the run drives its deterministic policy every N env steps on
``validation.routes`` routes of the training town, seeded apart from the town's fixed evaluation
routes and with other traffic seeds (:func:`drivemind.envs.routes.make_validation_routes`), writes
each result to ``logs/validation.csv`` and keeps the best policy so far as
``checkpoints/best.zip`` (``best.json`` beside it). The final policy is validated too. Evaluate it
with ``checkpoint=best`` (``scripts/eval.py``, ``bench.py learn --checkpoint best``); ``latest``
stays the default everywhere.

The validation drives are part of the run: their wall time counts in the run's time budget
(``max_minutes``; the final drive comes after it) and in its summary. They use their own env, so
the training env's episodes and random state are untouched.

Measured on the fast path's 15-minute figure (docs/benchmarks.md, "Stop 38"): no gain (the
selected policy never beat the latest over eight paired runs), at 9-17 % of the run's time; hence
off by default.
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

from stable_baselines3.common.callbacks import BaseCallback

from ..paths import write_text_atomic

BEST, BEST_JSON, ROUTES_FILE = "best.zip", "best.json", "validation_routes.json"
FIELDS = ("steps", "wall_s", "RC", "SR", "CR", "completion", "AS", "validate_s", "best")


def score(m: dict) -> tuple[float, float]:
    """What selection maximises: route completion on the validation routes, then the mean share
    of each route driven (a policy that arrives nowhere but gets further ranks higher)."""
    return float(m["RC"]), float(m["completion"])


def better(m: dict, best: dict | None) -> bool:
    """The selection rule: ``m`` replaces ``best`` when its :func:`score` is at least as high (a
    tie goes to the later policy)."""
    return best is None or score(m) >= score(best)


def validation_env_kwargs(env_kwargs: dict, run_dir: Path, town: str, n: int = 10) -> dict:
    """``env_kwargs`` (the run's, :func:`..build.env_kwargs`) for an eval-mode env that drives the
    run's validation routes with their traffic seeds (``VALIDATION_TRAFFIC_SEED`` + i)."""
    from ..envs.routes import VALIDATION_TRAFFIC_SEED

    return {**env_kwargs, "routes_file": validation_route_file(run_dir, town, env_kwargs.get("map_path"), n),
            "config": {**(env_kwargs.get("config") or {}), "eval_traffic_seed": VALIDATION_TRAFFIC_SEED}}


def validation_route_file(run_dir: Path, town: str, map_path=None, n: int = 10) -> Path:
    """``<run>/validation_routes.json``: written once per run (a resumed run keeps its routes)."""
    from ..envs.routes import eval_routes, make_validation_routes, write_routes
    from ..maps import load_town

    p = Path(run_dir) / ROUTES_FILE
    if not p.exists():
        rm = load_town(town, search_path=map_path)
        _, eval_file = eval_routes(rm)
        write_routes(make_validation_routes(rm, n, json.loads(Path(eval_file).read_text())), p)
    return p


class ValidateEvery(BaseCallback):
    """Every ``every`` env steps (and once when :meth:`final` is called), drive the deterministic
    policy on the run's validation routes; keep the best in ``checkpoints/best.zip``."""

    def __init__(self, run_dir: Path, every: int, town: str, density: str, env_kwargs: dict,
                 n_routes: int = 10, max_steps_per_route: int = 6000, wall=None):
        super().__init__()
        self.run_dir, self.every, self.n_routes = Path(run_dir), int(every), int(n_routes)
        self.town, self.density, self.max_steps = town, density, int(max_steps_per_route)
        self.env_kwargs = env_kwargs
        self.wall = wall or (lambda: None)  # the run's wall time so far (its record), for the CSV
        self.csv = self.run_dir / "logs" / "validation.csv"
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.best: dict | None = None
        self.rows: list[dict] = []
        self._last = 0
        self._env = None

    # -------------------------------------------------------------------- callback
    def _on_training_start(self):
        steps = self.model.num_timesteps
        self._last = steps
        best = self.ckpt_dir / BEST_JSON
        # a resumed run: its best so far counts (unless it came after the checkpoint resumed from)
        if best.exists():
            b = json.loads(best.read_text())
            self.best = b if b["steps"] <= steps else None
        if self.csv.exists():  # rows after the resumed checkpoint are driven again
            with open(self.csv, newline="") as f:
                self.rows = [r for r in csv.DictReader(f) if int(r["steps"]) <= steps]
            self._write_csv()

    def _on_step(self) -> bool:
        if self.every > 0 and self.model.num_timesteps - self._last >= self.every:
            self.validate()
        return True

    def final(self) -> dict | None:
        """Validate the final policy (unless it was just validated); the best entry."""
        if not self.rows or int(self.rows[-1]["steps"]) != self.model.num_timesteps:
            self.validate()
        self.close()
        return self.best

    def close(self):
        if self._env is not None:
            self._env.close()
            self._env = None

    # -------------------------------------------------------------------- work
    def env(self):
        if self._env is None:
            from ..envs import DriveEnv

            kw = validation_env_kwargs(self.env_kwargs, self.run_dir, self.town, self.n_routes)
            self._env = DriveEnv(self.town, self.density, mode="eval", **kw)
        return self._env

    def validate(self) -> dict:
        from ..evaluation.metrics import compute_metrics
        from ..evaluation.runner import run_route

        t = time.perf_counter()
        env, model = self.env(), self.model

        def act(obs):
            return model.predict(obs, deterministic=True)[0]

        records = [run_route(env, act, i, max_steps=self.max_steps)
                   for i in range(len(env.eval_route_list))]
        m = compute_metrics(records, mode="test")
        steps = int(model.num_timesteps)
        is_best = better(m, self.best)
        row = {"steps": steps, "wall_s": self.wall(), **{k: round(float(m[k]), 4) for k in
                                                         ("RC", "SR", "CR", "completion", "AS")},
               "validate_s": round(time.perf_counter() - t, 2), "best": int(is_best)}
        if is_best:
            tmp = self.ckpt_dir / f".{BEST}"
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            model.save(tmp)
            os.replace(tmp, self.ckpt_dir / BEST)
            self.best = {k: row[k] for k in ("steps", "wall_s", "RC", "SR", "CR", "completion", "AS")}
            write_text_atomic(self.ckpt_dir / BEST_JSON, json.dumps(self.best))
        self.rows.append(row)
        self._write_csv()
        self._last = steps
        return row

    def _write_csv(self):
        self.csv.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.csv.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(self.rows)
        os.replace(tmp, self.csv)
