"""A study's report: many training runs (sweeps, batches) grouped by method and aggregated over seeds.

    from drivemind.evaluation.study import find_runs, build_report, write_study_report
    runs = find_runs(["outputs/sweeps/2026-11-24/10-00-00", "outputs/runs/..."])
    report = build_report(runs)
    files = write_study_report(report, "outputs/report")

A run directory is what ``scripts/train.py`` writes (``drivemind.training.run``): ``config.yaml``,
``summary.json`` (``status``: finished / stopped ... / failed: ...), ``logs/episodes.csv`` (one row
per training episode) and ``eval/<town>-<density>/metrics.json`` (``scripts/eval.py``,
``drivemind.evaluation.report``).

**Methods.** Runs are grouped by ``reward.name``, ``reward.ablate`` and ``algo.name``, plus every
other config key whose value differs between the runs and is not already fixed by those three
(``reward.params.*`` differ between rewards but not within one, so they do not split a method;
``algo.learning_rate=1e-4,3e-4`` does). ``seed`` and the keys of ``IGNORED`` (runtime settings:
threads, logging, checkpoints, the ``max_minutes`` safety cap, ``study`` bookkeeping) never do.

**Aggregates.** Per method and evaluation town x density: mean and sample standard deviation
(``ddof=1``; none with one seed) over the method's runs of each metric of ``metrics.json``
(``METRIC_KEYS``). Failed runs are listed, not averaged; a run that lacks an evaluation is named
as missing there (``n`` counts the runs that have it). The evaluations shown are every one found
plus those the runs' ``study.eval`` lists (``configs/experiment/study_*.yaml``).

**Curves.** Per run, the training metrics of ``episodes.csv`` over a sliding window of
``metrics_window`` episodes (``compute_metrics(..., mode="train")``, as TensorBoard's
``episode/``) and the task return, at each episode's end; interpolated onto a common grid of env
steps (no extrapolation past a run's last episode) and averaged over the method's runs, with a
band of one standard deviation.
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from pathlib import Path

import numpy as np
import yaml

from ..naming import ablate_suffix
from .metrics import METRIC_KEYS, EpisodeRecord, compute_metrics
from .published import published_for
from .report import METRIC_COLUMNS, _jsonable, _table

PRIMARY = ("reward.name", "reward.ablate", "algo.name")
# config keys (and key prefixes) that never make two runs different methods
IGNORED = ("seed", "run_name", "progress_bar", "verbose", "torch_threads", "device", "map_path",
           "resume", "log_interval", "checkpoint_every", "checkpoint_buffer", "logger", "eval",
           "study", "max_minutes", "metrics_window", "vec_env")
DENSITY_ORDER = {"empty": 0, "regular": 1, "dense": 2}
CURVE_KEYS = ("AS", "RC", "TD", "CR", "return")
CURVE_LABELS = {"AS": "AS (km/h)", "RC": "RC (routes / episode)", "TD": "TD (m)",
                "CR": "CR (collision rate)", "return": "task return / episode"}
GRID_POINTS = 101
# how an evaluation route ends (its record's ``arrived`` / ``termination``); anything else (a red
# light, a time limit, an ending added later) counts as ``other``
ENDINGS = ("arrived", "collision", "off_route", "stuck", "other")


def route_endings(routes) -> dict[str, int]:
    """``{ending: count}`` over route records (``ENDINGS``, every key present)."""
    counts = dict.fromkeys(ENDINGS, 0)
    for route in routes:
        end = "arrived" if route.get("arrived") else str(route.get("termination") or "")
        counts[end if end in counts else "other"] += 1
    return counts


def endings_cell(counts: dict[str, int]) -> str:
    """``"a / c / o / s / x"``: the share of each of ``ENDINGS``, or ``-`` without routes."""
    n = sum(counts.values())
    return " / ".join(f"{counts[k] / n:.2f}" for k in ENDINGS) if n else "-"


# ---------------------------------------------------------------------------- runs


def _is_run_dir(d: Path) -> bool:
    return (d / "config.yaml").is_file() and any(
        (d / n).exists() for n in ("summary.json", "obs_signature.json", "checkpoints", "logs"))


def find_runs(paths) -> list[dict]:
    """Every training run in or under ``paths`` (run directories or folders holding them: a
    sweep, ``outputs/``), each loaded with :func:`load_run`, sorted by path. A path that does
    not exist or holds no run is one clear error."""
    found: dict[str, Path] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist; pass training run directories or sweep "
                                    f"folders (outputs/sweeps/<day>/<time>)")
        cands = [p] if _is_run_dir(p) else [c.parent for c in sorted(p.rglob("config.yaml"))]
        hits = [d for d in cands if _is_run_dir(d) and not any(
            part.startswith(".") or part in ("eval", "wandb", "checkpoints") for part in d.relative_to(p).parts)]
        if not hits:
            raise FileNotFoundError(f"no training run under {p} (a run directory holds config.yaml "
                                    f"and summary.json, as scripts/train.py writes them)")
        for d in hits:
            found.setdefault(str(d.resolve()), d)
    return [load_run(found[k]) for k in sorted(found)]


def _eval_key(folder: Path, meta: dict) -> tuple[str, str]:
    town, density = meta.get("town"), meta.get("density")
    if not (town and density):
        town, _, density = folder.name.rpartition("-")
    return str(town), str(density)


def load_run(run_dir) -> dict:
    """One run: ``path``, ``name``, ``config`` (dict), ``flat`` (dotted keys), ``seed``,
    ``summary`` (or None), ``status``, ``ok`` (a summary that is neither ``failed`` nor stopped
    by a signal short of its budget: such a run is ``incomplete`` until resumed), ``steps``,
    ``evals`` ``{(town, density): metrics}``, ``routes`` ``{(town, density): [route dicts]}`` (the
    evaluation's per-route records, for :mod:`drivemind.evaluation.contrasts`) and ``episodes``
    (path of episodes.csv or None)."""
    d = Path(run_dir)
    cfg = yaml.safe_load((d / "config.yaml").read_text()) or {}
    summary = None
    if (d / "summary.json").is_file():
        summary = json.loads((d / "summary.json").read_text())
    status = str(summary.get("status", "unknown")) if summary else "incomplete (no summary.json)"
    if status.startswith("stopped by"):  # Ctrl-C / a signal cut it short of its step budget
        status = (f"incomplete ({status} at {summary.get('steps')} of {summary.get('total_timesteps')} "
                  f"env steps; continue it with scripts/train.py resume=<run dir>)")
    evals, routes = {}, {}
    for f in sorted((d / "eval").glob("*/metrics.json")):
        doc = json.loads(f.read_text())
        m = dict(doc.get("metrics") or {})
        if "DCF" in m and m["DCF"] is None:  # written as null: inf (collisions over no distance)
            m["DCF"] = math.inf
        key = _eval_key(f.parent, doc.get("meta") or {})
        evals[key], routes[key] = m, list(doc.get("routes") or [])
    ep = d / "logs" / "episodes.csv"
    # ``flat`` is the world the run trained in: a study run saved before a traffic setting existed
    # gets its old value (training.build.study_world), so it is grouped with the runs that pin it
    from ..training.build import study_world

    return {"path": d, "name": d.name, "config": cfg, "flat": flatten(study_world(cfg)), "seed": cfg.get("seed"),
            "summary": summary, "status": status,
            "ok": summary is not None and not status.startswith(("failed", "incomplete")),
            "steps": (summary or {}).get("steps"), "wall_s": (summary or {}).get("wall_s_total"),
            "code": code_label((summary or {}).get("code")),
            "machine": machines_label((summary or {}).get("code")),
            "evals": evals, "routes": routes, "episodes": ep if ep.is_file() else None}


def _runs_of(labels) -> str:
    """Per-invocation labels joined by ", ", each consecutive repeat left out."""
    out = []
    for label in labels:
        if not out or out[-1] != label:
            out.append(label)
    return ", ".join(out)


def code_label(code) -> str:
    """The commits a run was trained at, short, oldest first (``+dirty``: tracked files differed
    from the commit; ``?``: not known); ``-`` for runs from before the code was recorded."""
    if not code:
        return "-"
    def commit(c: dict) -> str:
        return (c.get("commit") or "?")[:7] + ("+dirty" if c.get("dirty") else "")

    return _runs_of(commit(c or {}) for c in code)


def machines_label(code) -> str:
    """The machines a run was trained on, oldest first (``-`` for invocations from before the
    machine was recorded): float rounding, and so a run's details, depend on the CPU's vector
    instructions (docs/simulator.md, "Determinism")."""
    from ..paths import machine_label

    return _runs_of(machine_label((c or {}).get("machine")) for c in code or [None])


def flatten(d: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become JSON text."""
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else v
    return out


def _ignored(key: str) -> bool:
    return any(key == i or key.startswith(i + ".") for i in IGNORED)


_MISSING = "<unset>"


def method_keys(runs: list[dict]) -> list[str]:
    """The config keys that make methods: ``PRIMARY`` plus every other key that varies across
    ``runs`` and is not constant within each group of equal ``PRIMARY`` values."""
    keys = sorted({k for r in runs for k in r["flat"]} - set(PRIMARY))
    extra = []
    for k in keys:
        if _ignored(k):
            continue
        if len({repr(r["flat"].get(k, _MISSING)) for r in runs}) < 2:
            continue
        groups: dict[tuple, set] = {}
        for r in runs:
            groups.setdefault(tuple(repr(r["flat"].get(p)) for p in PRIMARY), set()).add(
                repr(r["flat"].get(k, _MISSING)))
        if any(len(v) > 1 for v in groups.values()):
            extra.append(k)
    return [*PRIMARY, *extra]


def _ablate(v):
    return None if v in (None, "", "none") else str(v)


def method_label(values: dict) -> str:
    """``drivemind-noaicr-sac``, then ``k=v`` for the other keys that split methods."""
    base = f"{values.get('reward.name')}{ablate_suffix(values.get('reward.ablate'))}-{values.get('algo.name')}"
    extra = [f"{k}={values[k]}" for k in values if k not in PRIMARY]
    return base + (f" [{', '.join(extra)}]" if extra else "")


def _fmt(key: str, v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return METRIC_COLUMNS[key][1].format(v)


def _mean_std(vals: list) -> tuple:
    vals = [float(v) for v in vals if v is not None]
    if not vals:
        return None, None
    a = np.asarray(vals, dtype=float)
    mean = float(np.mean(a))
    if len(a) < 2:
        return mean, None
    with np.errstate(invalid="ignore"):
        std = float(np.std(a, ddof=1))
    return mean, (std if math.isfinite(std) else None)


def _eval_sort(key: tuple[str, str]):
    return key[0], DENSITY_ORDER.get(key[1], 9), key[1]


def build_report(runs: list[dict]) -> dict:
    """Group ``runs`` by method and aggregate their evaluations (module docstring). Returns
    ``{"runs", "methods": [{"label", "values", "runs", "ok", "failed"}], "keys", "evals",
    "rows": [one per method x evaluation], "published": [...]}``."""
    if not runs:
        raise ValueError("no runs to report")
    keys = method_keys(runs)
    methods: dict[tuple, dict] = {}
    for r in runs:
        vals = {k: r["flat"].get(k, _MISSING if k not in PRIMARY else None) for k in keys}
        vals["reward.ablate"] = _ablate(vals["reward.ablate"])
        ident = tuple(repr(vals[k]) for k in keys)
        m = methods.setdefault(ident, {"values": vals, "label": method_label(vals), "runs": []})
        m["runs"].append(r)
        r["method"] = m["label"]
    mlist = sorted(methods.values(), key=lambda m: m["label"])
    for m in mlist:
        m["ok"] = [r for r in m["runs"] if r["ok"]]
        m["failed"] = [r for r in m["runs"] if not r["ok"]]
        m["seeds"] = sorted({r["seed"] for r in m["ok"]}, key=str)
    evals = {k for r in runs for k in r["evals"]}
    for r in runs:  # what the study meant to evaluate, even where nothing is on disk yet
        for e in ((r["config"].get("study") or {}).get("eval") or []):
            town, _, density = str(e).rpartition("-")
            if town:
                evals.add((town, density))
    evals = sorted(evals, key=_eval_sort)
    rows, published = [], []
    for (town, density) in evals:
        for m in mlist:
            have = [r for r in m["ok"] if (town, density) in r["evals"]]
            row = {"method": m["label"], "reward": m["values"]["reward.name"],
                   "ablate": m["values"]["reward.ablate"], "algo": m["values"]["algo.name"],
                   "extra": {k: v for k, v in m["values"].items() if k not in PRIMARY},
                   "town": town, "density": density, "n": len(have), "runs": len(m["ok"]),
                   "seeds": sorted({r["seed"] for r in have}, key=str), "trained_seeds": m["seeds"],
                   "missing": [r["name"] for r in m["ok"] if (town, density) not in r["evals"]],
                   "failed": [r["name"] for r in m["failed"]]}
            for k in METRIC_KEYS:
                row[k], row[f"{k}_std"] = _mean_std([r["evals"][(town, density)].get(k) for r in have])
            row["endings"] = route_endings(x for r in have for x in r["routes"].get((town, density), []))
            rows.append(row)
            for p in published_for(row["reward"], row["ablate"], row["algo"], town, density):
                published.append({**p, "method": m["label"]})
    return {"runs": runs, "methods": mlist, "keys": keys, "evals": evals, "rows": rows,
            "published": published}


ARCHIVED = ("config.yaml", "summary.json", "obs_signature.json", "logs/episodes.csv",
            "logs/episodes.discarded.csv", "eval/*/metrics.json", "eval/*/routes.csv", "eval/*/metrics.md")


def archive_runs(runs: list[dict], dest) -> list[Path]:
    """Copy what a report needs of each run (``ARCHIVED``: config, summary, episodes (and those a
    killed invocation drove after its last checkpoint, where any), evaluation JSON/CSV/markdown;
    no checkpoints, logs or videos) to ``dest/<run name>/`` (``<parent>-<run name>`` where two
    runs share a name), so the report can be rebuilt from ``dest`` alone
    (``docs/results/runs``). An archive grows batch by batch: a folder already in ``dest`` that
    holds the same run (the same config, and an ``episodes.csv`` the run's starts with) is updated
    in place (episodes and evaluations added since), and one holding another run is never
    overwritten (the new one gets a ``-2`` suffix). Runs still ``incomplete`` (in training, or
    stopped by a signal) are not archived: they are archived once finished.
    Returns the folders written."""
    import filecmp
    import shutil
    from collections import Counter

    dest = Path(dest)
    out, used = [], set()
    count = Counter(r["name"] for r in runs)
    for r in runs:
        if str(r.get("status", "")).startswith("incomplete"):
            continue
        name = r["name"] if count[r["name"]] == 1 else f"{r['path'].parent.name}-{r['name']}"
        base, i = name, 1
        while name in used or _holds_other_run(dest / name, r["path"], filecmp):
            i += 1
            name = f"{base}-{i}"
        used.add(name)
        target = dest / name
        for pattern in ARCHIVED:
            for f in r["path"].glob(pattern):
                rel = f.relative_to(r["path"])
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target / rel)
        out.append(target)
    return out


def _holds_other_run(target: Path, source: Path, filecmp) -> bool:
    """``target`` exists and is not an earlier copy of ``source``: the same config, and an
    ``episodes.csv`` that is the source's or a beginning of it (the run went on since)."""
    if not target.exists():
        return False
    ca, cb = target / "config.yaml", source / "config.yaml"
    if not (ca.is_file() and cb.is_file() and filecmp.cmp(ca, cb, shallow=False)):
        return True
    a, b = target / "logs" / "episodes.csv", source / "logs" / "episodes.csv"
    if not (a.is_file() and b.is_file()):
        return True
    old, new = a.read_bytes(), b.read_bytes()
    return not new.startswith(old)


# ---------------------------------------------------------------------------- curves


def _read_episodes(path: Path) -> tuple[np.ndarray, list[EpisodeRecord], np.ndarray]:
    steps, recs, rets = [], [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            d = dict(row)
            try:
                d["collision_speeds_kmh"] = json.loads(d.get("collision_speeds_kmh") or "[]")
            except json.JSONDecodeError:
                d["collision_speeds_kmh"] = []
            for k in ("route_index", "steps", "collisions"):
                d[k] = int(float(d[k]))
            for k in ("distance_m", "duration_s", "mean_speed_kmh", "completion", "routes_completed"):
                d[k] = float(d[k])
            d["arrived"] = str(d["arrived"]).strip().lower() in ("true", "1")
            recs.append(EpisodeRecord.from_dict(d))
            steps.append(int(float(row["timesteps"])))
            rets.append(float(row.get("task_return") or 0.0))
    return np.asarray(steps, dtype=float), recs, np.asarray(rets, dtype=float)


def run_curve(run: dict, max_points: int = 400) -> dict | None:
    """``{"steps": x, "AS": y, ...}`` of one run (None without episodes): the training metrics over
    the last ``metrics_window`` episodes at (at most ``max_points``) episode ends."""
    if run["episodes"] is None:
        return None
    steps, recs, rets = _read_episodes(run["episodes"])
    if not len(recs):
        return None
    w = max(int(run["config"].get("metrics_window") or 20), 1)
    idx = np.unique(np.linspace(0, len(recs) - 1, min(len(recs), max_points)).round().astype(int))
    out = {"steps": steps[idx], **{k: np.empty(len(idx)) for k in CURVE_KEYS}}
    for j, i in enumerate(idx):
        win = recs[max(0, i - w + 1): i + 1]
        m = compute_metrics(win, mode="train")
        for k in ("AS", "RC", "TD", "CR"):
            out[k][j] = m[k]
        out["return"][j] = float(np.mean(rets[max(0, i - w + 1): i + 1]))
    return out


def method_curves(report: dict, points: int = GRID_POINTS) -> dict:
    """``{"grid": steps, "methods": {label: {key: (mean, std, n)}}}`` on one env-step grid from 0
    to the longest run's last episode; a run contributes only inside its own step range."""
    per_run = {id(r): run_curve(r) for m in report["methods"] for r in m["ok"]}
    ends = [c["steps"][-1] for c in per_run.values() if c is not None]
    if not ends:
        return {"grid": np.zeros(0), "methods": {}}
    grid = np.linspace(0.0, float(max(ends)), points)
    out = {}
    for m in report["methods"]:
        curves = [per_run[id(r)] for r in m["ok"] if per_run.get(id(r)) is not None]
        if not curves:
            continue
        res = {}
        for k in CURVE_KEYS:
            ys = np.full((len(curves), len(grid)), np.nan)
            for i, c in enumerate(curves):
                inside = (grid >= c["steps"][0]) & (grid <= c["steps"][-1])
                ys[i, inside] = np.interp(grid[inside], c["steps"], c[k])
            n = np.sum(np.isfinite(ys), axis=0)
            with warnings.catch_warnings():  # columns with one run (ddof) or none (all NaN)
                warnings.simplefilter("ignore", RuntimeWarning)
                mean = np.nanmean(ys, axis=0)
                sd = np.nanstd(ys, axis=0, ddof=1)
            res[k] = (mean, np.where(n >= 2, np.nan_to_num(sd), 0.0), n)
        out[m["label"]] = res
    return {"grid": grid, "methods": out}


# ---------------------------------------------------------------------------- files


def _cell(row: dict, k: str) -> str:
    if row["n"] == 0:
        return "missing"
    mean, std = row[k], row.get(f"{k}_std")
    if mean is None:
        return "-"
    return _fmt(k, mean) + (f" ± {_fmt(k, std)}" if std is not None else "")


def _pub_cell(p: dict, k: str) -> str:
    if k not in p["metrics"]:
        return ""
    mean, std = p["metrics"][k]
    return f"{mean:g} ± {std:g}"


def report_markdown(report: dict, curves_png: str | None, eval_pngs: dict) -> str:
    runs, methods = report["runs"], report["methods"]
    nseeds = [len(m["seeds"]) for m in methods]
    failed = [r for r in runs if not r["ok"]]
    lines = ["# Study report", "",
             f"- runs: {len(runs)} ({len(runs) - len(failed)} usable, {len(failed)} failed or incomplete)",
             f"- methods: {len(methods)}; seeds per method: min {min(nseeds)}, max {max(nseeds)}",
             f"- methods are told apart by: {', '.join(report['keys'])}",
             "- cells: mean ± sample std over the method's runs (no std with one run); "
             "`missing`: no run of the method has that evaluation; published rows are the papers' "
             "(CARLA, mean ± std over 3 seeds); ICT of a run without collision is its step count, a "
             "lower bound", ""]
    lines += ["## Runs", "", "Paths: `runs.csv`.", "", *_table(
        ["method", "seed", "status", "env steps", "wall (min)", "code", "machine", "evaluations", "run"],
        [[r.get("method", "?"), str(r["seed"]), r["status"], str(r["steps"] if r["steps"] is not None else "-"),
          f"{r['wall_s'] / 60:.1f}" if r["wall_s"] is not None else "-", r.get("code", "-"), r.get("machine", "-"),
          ", ".join(f"{t}-{d}" for t, d in sorted(r["evals"], key=_eval_sort)) or "none", r["name"]]
         for m in methods for r in m["runs"]]), ""]
    if failed:
        lines += ["Failed or incomplete runs (not averaged): " +
                  "; ".join(f"{r['name']} ({r['status']})" for r in failed), ""]
    header = ["method", "seeds", *(METRIC_COLUMNS[k][0] for k in METRIC_KEYS),
              "routes end: arrived / collision / off route / stuck / other"]
    for town, density in report["evals"]:
        rows = [r for r in report["rows"] if (r["town"], r["density"]) == (town, density)]
        body = []
        for row in rows:
            body.append([row["method"], f"{row['n']}/{row['runs']}", *(_cell(row, k) for k in METRIC_KEYS),
                         endings_cell(row["endings"])])
            for p in report["published"]:
                if p["method"] == row["method"] and (p["town"], p["density"]) == (town, density):
                    body.append([f"↳ published: {p['label']} ({p['source']})", "3",
                                 *(_pub_cell(p, k) for k in METRIC_KEYS), ""])
        lines += [f"## {town} × {density}", "", *_table(header, body), ""]
        miss = [f"{row['method']}: {', '.join(row['missing'])}" for row in rows if row["missing"]]
        if miss:
            lines += ["Missing evaluations (run without this town x density): " + "; ".join(miss), ""]
        if (town, density) in eval_pngs:
            lines += [f"![{town} {density}]({eval_pngs[(town, density)]})", ""]
    if curves_png:
        lines += ["## Learning curves", "",
                  "Training metrics over the last `metrics_window` episodes against env steps: mean "
                  "over the method's runs, band ± one std.", "", f"![learning curves]({curves_png})", ""]
    return "\n".join(lines)


def _colors(n):
    from matplotlib import colormaps
    cmap = colormaps["tab20" if n > 10 else "tab10"]
    return [cmap(i % cmap.N) for i in range(n)]


def plot_curves(curves: dict, path: Path) -> bool:
    from matplotlib.figure import Figure

    if not curves["methods"]:
        return False
    labels = list(curves["methods"])
    fig = Figure(figsize=(4.0 * len(CURVE_KEYS), 4.2))
    axes = fig.subplots(1, len(CURVE_KEYS))
    x = curves["grid"]
    for color, label in zip(_colors(len(labels)), labels):
        for ax, k in zip(axes, CURVE_KEYS):
            mean, std, n = curves["methods"][label][k]
            ok = n > 0
            ax.plot(x[ok], mean[ok], color=color, label=label, lw=1.3)
            ax.fill_between(x[ok], (mean - std)[ok], (mean + std)[ok], color=color, alpha=0.2, lw=0)
    for ax, k in zip(axes, CURVE_KEYS):
        ax.set_title(CURVE_LABELS[k], fontsize=9)
        ax.set_xlabel("env steps")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def plot_eval(rows: list[dict], path: Path, title: str) -> None:
    from matplotlib.figure import Figure

    keys = ("SR", "RC", "CR", "AS")
    labels = [r["method"] for r in rows]
    fig = Figure(figsize=(4.0 * len(keys), 1.2 + 0.28 * max(len(rows), 4)))
    axes = fig.subplots(1, len(keys), sharey=True)
    y = np.arange(len(rows))
    for ax, k in zip(axes, keys):
        means = [r[k] if r[k] is not None and math.isfinite(r[k]) else 0.0 for r in rows]
        errs = [r[f"{k}_std"] or 0.0 for r in rows]
        ax.barh(y, means, xerr=errs, color=["tab:blue" if r["n"] else "lightgray" for r in rows])
        ax.set_title(METRIC_COLUMNS[k][0], fontsize=9)
        for i, r in enumerate(rows):
            if r["n"] == 0:
                ax.text(0, i, " missing", va="center", fontsize=7, color="gray")
    axes[0].set_yticks(y, labels, fontsize=7)
    axes[0].invert_yaxis()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _csv(path: Path, rows: list[dict], fields: list[str]):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else
                            ("" if v is None else v)) for k, v in r.items()})


def write_study_report(report: dict, out_dir) -> dict:
    """Write ``report.md``, ``table.csv`` (ours and the published rows), ``runs.csv``,
    ``curves.csv``, ``curves.png`` and ``eval_<town>-<density>.png`` into ``out_dir``; returns
    the summary object ``scripts/report.py --json`` prints."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metric_fields = [f for k in METRIC_KEYS for f in (k, f"{k}_std")]
    table = [{"source": "ours", **{k: v for k, v in r.items() if k != "endings"},
              **{f"ends_{k}": v for k, v in r["endings"].items()}} for r in report["rows"]]
    for p in report["published"]:
        table.append({"source": p["source"], "method": p["method"], "label": p["label"],
                      "reward": p["reward"], "ablate": p["ablate"], "algo": p["algo"],
                      "town": p["town"], "density": p["density"], "n": 3,
                      **{f: v for k, (m, s) in p["metrics"].items() for f, v in ((k, m), (f"{k}_std", s))}})
    _csv(out / "table.csv", table, ["source", "method", "label", "reward", "ablate", "algo", "extra",
                                     "town", "density", "n", "runs", "seeds", "missing", "failed",
                                     *metric_fields, *(f"ends_{k}" for k in ENDINGS)])
    _csv(out / "runs.csv", [{"method": r.get("method"), "seed": r["seed"], "status": r["status"],
                             "ok": r["ok"], "steps": r["steps"], "wall_s": r["wall_s"], "code": r.get("code", "-"),
                             "machine": r.get("machine", "-"), "evals": [f"{t}-{d}" for t, d in sorted(r["evals"], key=_eval_sort)],
                             "path": str(r["path"])} for r in report["runs"]],
         ["method", "seed", "status", "ok", "steps", "wall_s", "code", "machine", "evals", "path"])
    curves = method_curves(report)
    crows = []
    for label, res in curves["methods"].items():
        for k, (mean, std, n) in res.items():
            for x, mu, sd, c in zip(curves["grid"], mean, std, n):
                if c > 0:
                    crows.append({"method": label, "metric": k, "step": int(round(x)),
                                  "mean": round(float(mu), 5), "std": round(float(sd), 5), "n": int(c)})
    _csv(out / "curves.csv", crows, ["method", "metric", "step", "mean", "std", "n"])
    curves_png = "curves.png" if plot_curves(curves, out / "curves.png") else None
    eval_pngs = {}
    for town, density in report["evals"]:
        rows = [r for r in report["rows"] if (r["town"], r["density"]) == (town, density)]
        name = f"eval_{town}-{density}.png"
        plot_eval(rows, out / name, f"{town} × {density} (mean ± std over seeds)")
        eval_pngs[(town, density)] = name
    (out / "report.md").write_text(report_markdown(report, curves_png, eval_pngs))
    seeds = [len(m["seeds"]) for m in report["methods"]]
    return _jsonable({
        "out": str(out), "runs": len(report["runs"]),
        "failed": [r["name"] for r in report["runs"] if not r["ok"]],
        "methods": [m["label"] for m in report["methods"]], "seeds_min": min(seeds),
        "keys": report["keys"], "evals": [f"{t}-{d}" for t, d in report["evals"]],
        "files": sorted(p.name for p in out.iterdir()),
        "rows": [{k: v for k, v in r.items()} for r in report["rows"]],
        "published": [{k: p[k] for k in ("method", "label", "source", "town", "density", "metrics")}
                      for p in report["published"]],
    })
