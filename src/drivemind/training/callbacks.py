"""Training callbacks: checkpoints (model + replay buffer), SIGINT save-and-exit, the papers'
episode metrics in the logs, and non-finite reward reporting."""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from ..evaluation import EpisodeAccumulator, compute_metrics
from ..paths import write_text_atomic

LATEST = "latest.json"


def save_checkpoint(model, ckpt_dir: Path, with_buffer: bool = True, keep: int = 2,
                    record: dict | None = None) -> dict:
    """``model_<steps>.zip`` (+ ``buffer_<steps>.pkl``) and ``latest.json`` pointing at them.
    Files are written under temporary names and renamed, so a kill mid-save leaves the previous
    checkpoint intact. Only the newest ``keep`` checkpoints are kept. ``record`` (JSON-able: the
    run's wall time and code so far) is stored in ``latest.json`` beside the file names, so a run
    killed before it could write its summary resumes with them."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    n = int(model.num_timesteps)
    entry = {"steps": n, "model": f"model_{n}.zip", **(record or {})}
    tmp = ckpt_dir / f".model_{n}.zip"
    model.save(tmp)
    os.replace(tmp, ckpt_dir / entry["model"])
    if with_buffer and getattr(model, "replay_buffer", None) is not None:
        entry["buffer"] = f"buffer_{n}.pkl"
        tmp = ckpt_dir / f".buffer_{n}.pkl"
        model.save_replay_buffer(tmp)
        os.replace(tmp, ckpt_dir / entry["buffer"])
    write_text_atomic(ckpt_dir / LATEST, json.dumps(entry))
    # prune older checkpoints (never the one just written: stale files from an earlier run in the
    # same directory may carry higher step counts)
    steps = sorted({int(p.stem.split("_")[1]) for p in ckpt_dir.glob("model_*.zip")} - {n})
    for old in steps[:max(len(steps) - (keep - 1), 0)] if keep > 0 else []:
        for p in (ckpt_dir / f"model_{old}.zip", ckpt_dir / f"buffer_{old}.pkl"):
            p.unlink(missing_ok=True)
    return entry


def latest_checkpoint(run_dir: Path) -> dict | None:
    f = Path(run_dir) / "checkpoints" / LATEST
    if not f.exists():
        return None
    entry = json.loads(f.read_text())
    for k in ("model", "buffer"):
        if k in entry:
            entry[k] = str(f.parent / entry[k])
    return entry


class CheckpointEvery(BaseCallback):
    """Checkpoint every ``every`` env steps (0: never, only at the end and on SIGINT); ``record``
    (a callable giving ``save_checkpoint``'s record) is called at each checkpoint."""

    def __init__(self, ckpt_dir: Path, every: int, with_buffer: bool = True, keep: int = 2,
                 record=None):
        super().__init__()
        self.ckpt_dir, self.every, self.with_buffer, self.keep = Path(ckpt_dir), int(every), with_buffer, keep
        self.record = record
        self._last = 0

    def _on_training_start(self):
        self._last = self.model.num_timesteps

    def _on_step(self) -> bool:
        if self.every > 0 and self.model.num_timesteps - self._last >= self.every:
            save_checkpoint(self.model, self.ckpt_dir, self.with_buffer, self.keep,
                            self.record() if self.record is not None else None)
            self._last = self.model.num_timesteps
        return True


class StopAfter(BaseCallback):
    """Stop learning after ``minutes`` of wall time (``max_minutes``: a time budget, e.g. the
    learning benchmark's; the caller saves as at any stop). ``None``/0: no limit."""

    def __init__(self, minutes: float | None):
        super().__init__()
        self.seconds = float(minutes) * 60.0 if minutes else None
        self.reached = False
        self._t0 = 0.0

    def _on_training_start(self):
        self._t0 = time.perf_counter()

    def _on_step(self) -> bool:
        if self.seconds is not None and time.perf_counter() - self._t0 >= self.seconds:
            self.reached = True
            return False
        return True


class StopOnSignal(BaseCallback):
    """On SIGINT (Ctrl-C) or SIGTERM: finish the current step, stop learning; the caller saves.
    A second Ctrl-C interrupts the step at once (the caller still saves)."""

    def __init__(self):
        super().__init__()
        self.received: str | None = None
        self._old = {}

    def _handler(self, signum, frame):
        if self.received is not None:  # second signal: give up on the clean stop
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        print(f"\n[drivemind] {self.received} received: saving a checkpoint, then exiting "
              f"(a second Ctrl-C stops at once; the checkpoint is still written)", flush=True)

    def _on_training_start(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread
                pass

    def _on_training_end(self):
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def _on_step(self) -> bool:
        return self.received is None


def trim_episodes(csv_path: Path, steps: int) -> int:
    """Before a run resumes from its checkpoint at ``steps``: move the rows of ``episodes.csv``
    that ended after it (written by an invocation killed before it could checkpoint again; the
    resumed run drives those steps anew) to ``episodes.discarded.csv`` beside it, so the log keeps
    one row per episode of the run's one history and nothing is deleted. Returns how many moved."""
    csv_path = Path(csv_path)
    if not csv_path.exists():
        return 0
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    kept, late = [], []
    for r in rows:
        (late if int(float(r["timesteps"])) > steps else kept).append(r)
    if not late:
        return 0
    out = csv_path.with_name(csv_path.stem + ".discarded.csv")
    new = not out.exists()
    with open(out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        w.writerows(late)
    tmp = csv_path.with_name(csv_path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(kept)
    os.replace(tmp, csv_path)
    return len(late)


class EpisodeMetrics(BaseCallback):
    """The papers' training metrics (AS, RC, TD, CS, CR, TCF, DCF, ICT, AC) over the last
    ``window`` episodes in the logs (``episode/``), every episode to ``episodes.csv``."""

    def __init__(self, csv_path: Path | None = None, window: int = 20, wall_offset: float = 0.0):
        super().__init__()
        self.wall_offset = float(wall_offset)  # wall time of a resumed run's earlier invocations
        self.csv_path, self.window = csv_path, window
        self.records = []
        self._acc: list[EpisodeAccumulator] = []
        self._fh = None
        self._writer = None

    def _on_training_start(self):
        n = self.training_env.num_envs
        self._t0 = time.perf_counter()
        self._acc = [EpisodeAccumulator() for _ in range(n)]
        self._ret = [0.0] * n  # the env's task reward summed over the episode (curves)
        for a in self._acc:
            a.start(None)

    def _on_step(self) -> bool:
        infos, dones = self.locals["infos"], self.locals["dones"]
        for i, (info, done) in enumerate(zip(infos, dones)):
            self._acc[i].add(info)
            self._ret[i] += float(info.get("task_reward", 0.0))
            if done:
                rec = self._acc[i].finish()
                rec.task_return, self._ret[i] = self._ret[i], 0.0
                self._acc[i] = EpisodeAccumulator()
                self._acc[i].start(None)
                self._record(rec)
        return True

    def _record(self, rec):
        self.records.append(rec)
        self.records = self.records[-self.window:]
        m = compute_metrics(self.records, mode="train")
        for k in ("AS", "RC", "TD", "CS", "CR", "TCF", "DCF", "AC"):
            v = m.get(k)
            if v is not None and np.isfinite(v):
                self.logger.record(f"episode/{k}", v)
        if self.csv_path is not None:
            row = {"timesteps": self.model.num_timesteps,
                   "wall_s": round(self.wall_offset + time.perf_counter() - self._t0, 2),
                   "task_return": round(float(getattr(rec, "task_return", 0.0)), 3), **rec.to_dict()}
            row["collision_speeds_kmh"] = json.dumps(row.get("collision_speeds_kmh", []))
            if self._writer is None:
                new = not Path(self.csv_path).exists()
                self._fh = open(self.csv_path, "a", newline="")
                self._writer = csv.DictWriter(self._fh, fieldnames=list(row))
                if new:
                    self._writer.writeheader()
            self._writer.writerow(row)
            self._fh.flush()

    def _on_training_end(self):
        if self._fh is not None:
            self._fh.close()
            self._fh, self._writer = None, None
