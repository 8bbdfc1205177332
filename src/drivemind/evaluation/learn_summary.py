"""Many ``bench.py learn`` runs at once: each variant's route completion with a 95 % interval, how
many runs reached the goal, and each variant against a reference (``bench.py learn-summary``).

A 15-minute learning run is one draw from a wide spread (route completion 0.3-1.0 for one
setting, seed to seed), so a setting is judged over many runs, often made over several sessions
and kept as the JSON ``bench.py learn`` prints. This reads those files, as many as a variant has:

    arms = {"default": ["docs/results/learn_15min/stop39-default-s*.json"],
            "bf16": ["docs/results/learn_15min/stop39-bf16-s*.json"]}
    summarize(resolve(arms), ref="default")

A file is one ``bench.py learn`` JSON object (the last line of its stdout, or a log whose last
line is one); each of its ``per_seed`` rows is one run. The intervals are the study's
(:mod:`drivemind.evaluation.contrasts`): a two-stage bootstrap, runs with replacement, then each
picked run's routes with replacement, rebuilt from how its routes ended (``endings``: arrived or
not) and its collision rate; the variants are drawn independently. Deterministic for ``seed``.

A variant named ``NAME@online`` (or ``NAME@latest``) reads, from each run, the figures of its
online actor (a run that kept a moving average of the actor, ``algo.policy_kwargs.actor_ema``) or
of its latest checkpoint (a run evaluated with ``--checkpoint best``) instead of the main ones:
``ema=<files> ema@online=<the same files>`` compares two policies of the same runs, and such a
pair (the same runs in both variants) also gets a paired difference, per run, over the runs drawn
with replacement (``paired`` in ``vs_ref``), which the independent draws overstate the spread of.

Each variant lists the CPUs its runs were made on (``cpus``: model name, family/model and vector
features, as ``bench.py`` records them): a 15-minute run on a Zen 3 without AVX-512 gets about 60 %
of the env steps of one on a Zen 4, so variants made on different CPUs are not compared by their
minutes (``vs_ref`` says ``same_cpus: false``).
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np

from .contrasts import DRAWS, LEVEL, _interval, difference, draws, point

METRICS = {"RC": "route_completion", "CR": "collision_rate"}
# what the runs of one variant must share: a variant mixing towns or rewards is a mistake
SAME = ("reward", "town", "density")
# NAME@<this>: each run's figures of another policy of it, as bench.py learn prints them
POLICIES = ("online", "latest")


def _policy_of(name: str) -> str | None:
    """``online`` / ``latest`` for a variant named ``NAME@online`` / ``NAME@latest``, else None."""
    base, sep, which = name.rpartition("@")
    if not sep:
        return None
    if which not in POLICIES or not base:
        raise ValueError(f"learn-summary: variant {name!r}: after '@' comes one of "
                         f"{', '.join(POLICIES)} (the runs' other policy), after a name")
    return which


def _other_policy(row: dict, which: str, where: Path) -> dict:
    """A run's row with the figures of its ``which`` policy (``online`` / ``latest``) in place of
    the main ones; its routes are the same, so their number comes from the main endings."""
    alt = row.get(which)
    if not isinstance(alt, dict):
        raise ValueError(f"{where}: seed {row.get('seed')} has no {which!r} figures (only a run with "
                         f"algo.policy_kwargs.actor_ema has 'online', one evaluated with "
                         f"--checkpoint best 'latest')")
    n = int(sum((row.get("endings") or {}).values()))
    arrived = int(round(float(alt["route_completion"]) * n))
    endings = alt.get("endings") or {"arrived": arrived, "not_arrived": n - arrived}
    return {**row, **{k: alt[k] for k in ("route_completion", "collision_rate", "mean_speed_kmh")
                      if k in alt}, "endings": endings}


def cpu_label(res: dict) -> str:
    """One ``bench.py learn`` result's CPU: model name, family/model, vector features (older
    results recorded the model name only)."""
    parts = [str(res.get("cpu", "unknown CPU"))]
    if res.get("cpu_family_model"):
        parts.append(f"family/model {res['cpu_family_model']}")
        parts.append("+".join(res.get("cpu_flags") or []) or "no AVX2")
    else:
        parts.append("family/model not recorded")
    return ", ".join(parts)


def resolve(arms: dict[str, list[str]]) -> dict[str, list[Path]]:
    """Each variant's glob patterns as the files they match (sorted, each once); a pattern that
    matches nothing is an error naming it."""
    out = {}
    for name, patterns in arms.items():
        files: list[Path] = []
        for pat in patterns:
            hits = sorted(glob.glob(pat))
            if not hits:
                raise FileNotFoundError(f"learn-summary: {name}={pat} matches no file (relative paths "
                                        f"are from {Path.cwd()})")
            files += [Path(h) for h in hits if Path(h) not in files]
        out[name] = files
    return out


def read_learn_json(path: Path) -> dict:
    """One ``bench.py learn`` result: the file's JSON, or its last line that parses as JSON."""
    text = Path(path).read_text()
    for candidate in [text] + text.strip().splitlines()[::-1]:
        try:
            obj = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            if obj.get("what") != "learn" or not obj.get("per_seed"):
                raise ValueError(f"{path}: not a `bench.py learn` result (its 'what' is "
                                 f"{obj.get('what')!r}, and it needs 'per_seed' rows)")
            return obj
    raise ValueError(f"{path}: no JSON object in it (expected what `bench.py learn` prints last)")


def _routes(row: dict, where: Path) -> dict:
    """One run's routes as the arrays the bootstrap draws from: arrived or not (``endings``),
    collided or not (``collision_rate`` of the routes; which routes does not matter to a share)."""
    endings = row.get("endings") or {}
    n = int(sum(endings.values()))
    if n == 0:
        raise ValueError(f"{where}: seed {row.get('seed')} has no route endings to count")
    arrived = np.zeros(n, bool)
    arrived[:int(endings.get("arrived", 0))] = True
    if abs(arrived.mean() - float(row["route_completion"])) > 1e-6:
        raise ValueError(f"{where}: seed {row.get('seed')}: route_completion {row['route_completion']} "
                         f"is not the share of arrived routes in its endings {endings}")
    collided = np.zeros(n, bool)
    collided[:int(round(float(row["collision_rate"]) * n))] = True
    return {"arrived": arrived, "collided": collided}


def summarize(arms: dict[str, list[Path]], ref: str | None = None, goal: float = 0.8,
              n: int = DRAWS, seed: int = 0) -> dict:
    """Per variant: the runs, mean route completion with its interval, the runs at or above
    ``goal``, s.d., env steps, mean speed on the routes, collision rate with its interval, endings;
    with ``ref``, each other variant minus the reference (route completion and collision rate)
    with its interval and the share of draws in which it is above."""
    if not arms:
        raise ValueError("learn-summary needs at least one variant: NAME=PATTERN[,PATTERN...]")
    if ref is not None and ref not in arms:
        raise ValueError(f"--ref {ref!r} is not one of the variants: {', '.join(arms)}")
    if n < 100:
        raise ValueError(f"learn-summary needs at least 100 bootstrap draws, got {n}")
    if not 0.0 <= goal <= 1.0:
        raise ValueError(f"learn-summary --goal is a route completion in [0, 1], got {goal}")
    rng = np.random.default_rng(seed)
    out = {"what": "learn-summary", "goal": goal, "level": LEVEL, "draws": n, "arms": {}}
    sampled: dict[str, dict[str, np.ndarray]] = {}
    run_values: dict[str, dict[str, float]] = {}
    for name, files in arms.items():
        rows, where, cpus = [], [], {}
        which = _policy_of(name)
        for f in files:
            res = read_learn_json(f)
            for row in res["per_seed"]:
                if which is not None:
                    row = _other_policy(row, which, f)
                rows.append({**row, "minutes": res.get("minutes")})
                where.append(f)
                label = cpu_label(res)
                cpus[label] = cpus.get(label, 0) + 1
        if not rows:
            raise ValueError(f"learn-summary: variant {name} has no runs")
        for key in SAME + ("minutes",):
            seen = sorted({str(r.get(key)) for r in rows})
            if len(seen) > 1:
                raise ValueError(f"learn-summary: variant {name} mixes runs with different {key} "
                                 f"({', '.join(seen)}); give each its own NAME=PATTERN")
        arrays = [_routes(r, w) for r, w in zip(rows, where)]
        rc = np.array([float(r["route_completion"]) for r in rows])
        arm = {"runs": len(rows), "files": [str(f) for f in files],
               **{k: rows[0].get(k) for k in SAME + ("minutes",)}, "cpus": cpus}
        # a run is known by its directory (older rows without one: file and seed)
        run_values[name] = {str(r.get("run_dir") or f"{w}#{r.get('seed')}"): float(r["route_completion"])
                            for r, w in zip(rows, where)}
        sampled[name] = {}
        for key, label in METRICS.items():
            x = draws(arrays, key, n, rng)
            sampled[name][key] = x
            lo, hi = _interval(x)
            arm[label] = round(point(arrays, key), 4)
            arm[f"{label}_ci"] = [round(lo, 4), round(hi, 4)]
        arm.update({
            "route_completion_sd": round(float(rc.std(ddof=1)), 4) if len(rc) > 1 else None,
            "route_completion_per_run": [round(float(v), 3) for v in rc],
            "at_goal": int(np.sum(rc >= goal - 1e-9)),
            "env_steps": round(float(np.mean([float(r["env_steps"]) for r in rows])), 1),
            "env_steps_range": [int(min(float(r["env_steps"]) for r in rows)),
                                int(max(float(r["env_steps"]) for r in rows))],
            "env_steps_per_s": round(float(np.mean([float(r["env_steps_per_s"]) for r in rows])), 1),
            "mean_speed_kmh": (round(float(np.mean([float(r["mean_speed_kmh"]) for r in rows])), 2)
                               if all(r.get("mean_speed_kmh") is not None for r in rows) else None),
            "endings": {k: int(sum((r.get("endings") or {}).get(k, 0) for r in rows))
                        for k in rows[0].get("endings") or {}},
            "seeds": [r.get("seed") for r in rows],
        })
        out["arms"][name] = arm
    if ref is not None:
        out["ref"] = ref
        out["vs_ref"] = {}
        for name in arms:
            if name == ref:
                continue
            cmp = {}
            for key, label in METRICS.items():
                lo, hi, p_greater = difference(sampled[name][key], sampled[ref][key])
                cmp[label] = round(out["arms"][name][label] - out["arms"][ref][label], 4)
                cmp[f"{label}_ci"] = [round(lo, 4), round(hi, 4)]
                cmp[f"{label}_p_greater"] = round(p_greater, 4)
            cmp["same_cpus"] = set(out["arms"][name]["cpus"]) == set(out["arms"][ref]["cpus"])
            if set(run_values[name]) == set(run_values[ref]):  # two policies of the same runs
                cmp["paired"] = paired_difference(run_values[name], run_values[ref], n, rng)
            out["vs_ref"][name] = cmp
    return out


def paired_difference(a: dict[str, float], b: dict[str, float], n: int = DRAWS,
                      rng: np.random.Generator | None = None) -> dict:
    """Route completion of two policies of the same runs (keyed by run): the mean of the per-run
    differences ``a - b``, its interval over the runs drawn with replacement, the share of draws
    above 0 (ties half, as :func:`difference`), and how many runs went up, down or stayed."""
    rng = rng if rng is not None else np.random.default_rng(0)
    keys = sorted(a)
    if sorted(b) != keys or not keys:
        raise ValueError("paired_difference needs the same runs on both sides")
    d = np.array([a[k] - b[k] for k in keys])
    means = d[rng.integers(0, len(d), size=(n, len(d)))].mean(axis=1)
    lo, hi = _interval(means)
    return {"runs": len(d), "route_completion": round(float(d.mean()), 4),
            "route_completion_ci": [round(lo, 4), round(hi, 4)],
            "route_completion_p_greater": round(float(np.mean(means > 0) + 0.5 * np.mean(means == 0)), 4),
            "runs_up": int(np.sum(d > 1e-9)), "runs_down": int(np.sum(d < -1e-9)),
            "runs_same": int(np.sum(np.abs(d) <= 1e-9))}
