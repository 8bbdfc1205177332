"""How sure a study is of a difference: hierarchical bootstrap intervals over seeds and routes.

A study's table cell is a mean over 3 seeds of a metric over 10 fixed routes, and two methods
whose cells differ by 0.1 in SR may or may not differ at all. This module puts a 95 % interval on
a method's metric and on the difference between two methods, from the routes each run drove
(``eval/<town>-<density>/metrics.json``'s ``routes``):

    from drivemind.evaluation.contrasts import contrast
    c = contrast(drivemind_runs, vlm_rl_runs, "SR", [("Town02", "regular")])
    c["diff"]        # {"mean": -0.03, "lo": -0.27, "hi": 0.2}: A - B with its 95 % interval
    c["p_greater"]   # the share of bootstrap draws in which A's SR is above B's (ties count half)

**The bootstrap.** Two stages, as the data were made: a draw picks the method's seeds with
replacement (as many as it has), then, independently for each picked seed, that run's routes
with replacement (as many as it drove); the draw's value is the metric per picked seed, averaged
over the picked seeds, which is how the tables average (mean over seeds of each run's metric).
``DRAWS`` draws per method, percentile interval; the two methods are drawn independently (their
seeds share nothing but the routes and traffic seeds of the evaluation). With one seed the seed
stage is fixed and the interval shows the route-to-route spread only; with three the seed stage
dominates. Deterministic for its ``seed`` argument.

**Metrics** (``KEYS``), per run as ``compute_metrics`` defines them (docs/evaluation.md): SR, RC,
CR as shares of routes, AS time-weighted over the routes' steps, TD and CS per route. Several
evaluations at once (``evals`` with more than one town x density, "the held-out towns") pool
each run's routes over them before the metric is taken; a run counts only where it has every one.
"""

from __future__ import annotations

import numpy as np

KEYS = ("SR", "RC", "CR", "AS", "TD", "CS")
DRAWS = 10000
LEVEL = 0.95


def seed_arrays(run: dict, evals) -> dict | None:
    """One run's routes over ``evals`` as arrays (``arrived``, ``collided``, ``duration``,
    ``speed_time``, ``distance``, ``cs``), or None when it lacks one of the evaluations (or its
    metrics.json holds no routes)."""
    routes = []
    for key in evals:
        rs = (run.get("routes") or {}).get(tuple(key))
        if not rs:
            return None
        routes.extend(rs)
    arrived = np.array([bool(r["arrived"]) for r in routes])
    collided = np.array([int(r["collisions"]) > 0 for r in routes])
    duration = np.array([float(r["duration_s"]) for r in routes])
    return {"arrived": arrived, "collided": collided, "duration": duration,
            "speed_time": np.array([float(r["mean_speed_kmh"]) for r in routes]) * duration,
            "distance": np.array([float(r["distance_m"]) for r in routes]),
            "cs": np.array([float(np.mean(r["collision_speeds_kmh"])) if r.get("collision_speeds_kmh") else 0.0
                            for r in routes])}


def _metric(a: dict, key: str, idx: np.ndarray) -> np.ndarray:
    """``key`` of the routes ``idx`` (rows: draws, columns: routes) of one run's arrays."""
    if key == "SR":
        return (a["arrived"] & ~a["collided"])[idx].mean(axis=-1)
    if key == "RC":
        return a["arrived"][idx].mean(axis=-1)
    if key == "CR":
        return a["collided"][idx].mean(axis=-1)
    if key == "TD":
        return a["distance"][idx].mean(axis=-1)
    if key == "CS":
        return a["cs"][idx].mean(axis=-1)
    if key == "AS":
        dur = a["duration"][idx].sum(axis=-1)
        return np.divide(a["speed_time"][idx].sum(axis=-1), dur, out=np.zeros_like(dur), where=dur > 0)
    raise ValueError(f"unknown metric {key!r} for a contrast; valid: {', '.join(KEYS)}")


def point(seeds: list[dict], key: str) -> float:
    """The table's value: the mean over the runs of each run's metric."""
    return float(np.mean([_metric(a, key, np.arange(len(a["arrived"]))) for a in seeds]))


def draws(seeds: list[dict], key: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` two-stage bootstrap values of the mean over ``seeds`` of ``key`` (module docstring)."""
    if not seeds:
        raise ValueError("no runs to bootstrap")
    k = len(seeds)
    pick = rng.integers(0, k, size=(n, k))  # the seeds of each draw
    total = np.zeros(n)
    for slot in range(k):
        for j, a in enumerate(seeds):
            rows = np.flatnonzero(pick[:, slot] == j)
            if rows.size:
                m = len(a["arrived"])
                total[rows] += _metric(a, key, rng.integers(0, m, size=(rows.size, m)))
    return total / k


def format_interval(side: dict | None, key: str) -> str:
    """``mean [lo, hi]`` of a contrast's side (``a``, ``b`` or ``diff``) in ``key``'s table
    format; ``pending`` without one."""
    from .report import METRIC_COLUMNS

    if not side:
        return "pending"
    fmt = METRIC_COLUMNS[key][1]
    return f"{fmt.format(side['mean'])} [{fmt.format(side['lo'])}, {fmt.format(side['hi'])}]"


def _interval(x: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(x, [50 * (1 - LEVEL), 100 - 50 * (1 - LEVEL)])
    return float(lo), float(hi)


def difference(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """The interval of A - B from the two sides' independent bootstrap draws, and the share of
    draws in which A is above B (ties count half): ``(lo, hi, p_greater)``."""
    d = a - b
    lo, hi = _interval(d)
    return lo, hi, float(np.mean(d > 0) + 0.5 * np.mean(d == 0))


def contrast(a_runs: list[dict], b_runs: list[dict] | None, key: str, evals, *, n: int = DRAWS,
             seed: int = 0) -> dict:
    """A's ``key`` over ``evals`` with its interval and, given ``b_runs``, A - B with its
    interval and ``p_greater`` (module docstring). Runs are :func:`drivemind.evaluation.study.load_run`
    dicts; those lacking one of ``evals`` are left out (``n_a`` / ``n_b`` count the rest).
    ``None`` values where a side has no run."""
    if key not in KEYS:
        raise ValueError(f"unknown metric {key!r} for a contrast; valid: {', '.join(KEYS)}")
    if n < 100:
        raise ValueError(f"a contrast needs at least 100 bootstrap draws, got {n}")
    evals = [tuple(e) for e in evals]
    rng = np.random.default_rng(seed)
    out = {"key": key, "evals": [f"{t}-{d}" for t, d in evals], "level": LEVEL, "draws": n}
    sides = {}
    for name, runs in (("a", a_runs), ("b", b_runs)):
        if runs is None:
            continue
        seeds = [s for s in (seed_arrays(r, evals) for r in runs) if s is not None]
        out[f"n_{name}"] = len(seeds)
        if not seeds:
            out[name] = None
            continue
        x = draws(seeds, key, n, rng)
        sides[name] = x
        lo, hi = _interval(x)
        out[name] = {"mean": point(seeds, key), "lo": lo, "hi": hi}
    if b_runs is not None:
        if "a" in sides and "b" in sides:
            lo, hi, out["p_greater"] = difference(sides["a"], sides["b"])
            out["diff"] = {"mean": out["a"]["mean"] - out["b"]["mean"], "lo": lo, "hi": hi}
        else:
            out["diff"], out["p_greater"] = None, None
    return out


def method_contrasts(report: dict, a_label: str, b_label: str, keys=("SR", "CR", "AS"),
                     n: int = DRAWS, seed: int = 0) -> list[dict]:
    """A - B for two methods of a study report (``build_report``'s labels, as its tables name
    them) on every evaluation the report has, for each of ``keys``. An unknown label is one
    error listing the report's methods."""
    methods = {m["label"]: m["ok"] for m in report["methods"]}
    unknown = [x for x in (a_label, b_label) if x not in methods]
    if unknown:
        raise ValueError(f"no method {', '.join(map(repr, unknown))} in this report; its methods: "
                         f"{', '.join(methods)}")
    out = []
    for town, density in report["evals"]:
        for key in keys:
            c = contrast(methods[a_label], methods[b_label], key, [(town, density)], n=n, seed=seed)
            out.append({**c, "a_label": a_label, "b_label": b_label})
    return out
