"""Hierarchical bootstrap intervals for a study's claims (drivemind.evaluation.contrasts)."""

from __future__ import annotations

import numpy as np
import pytest

from drivemind.evaluation.contrasts import DRAWS, contrast, draws, point, seed_arrays
from drivemind.evaluation.metrics import EpisodeRecord, compute_metrics

T2 = ("Town02", "regular")
T1 = ("Town01", "dense")


def routes(ok: int, hit: int, n: int = 10, speed=20.0, rng=None) -> list[dict]:
    """``n`` route records as metrics.json stores them: the first ``ok`` arrive, the last ``hit``
    collide; with ``rng`` the durations and speeds vary per route (for the time-weighted AS)."""
    out = []
    for i in range(n):
        dur = 10.0 if rng is None else float(rng.uniform(5, 60))
        v = speed if rng is None else float(rng.uniform(0, 40))
        collided = i >= n - hit
        out.append(EpisodeRecord(route_index=i, steps=int(dur * 10), distance_m=v / 3.6 * dur, duration_s=dur,
                                 mean_speed_kmh=v, arrived=i < ok, completion=1.0 if i < ok else 0.4,
                                 routes_completed=float(i < ok), collisions=int(collided),
                                 collision_speeds_kmh=[v / 2, v] if collided else []).to_dict())
    return out


def run(**evals) -> dict:
    """A run as ``study.load_run`` gives it, with only what contrasts read."""
    return {"routes": {tuple(k.split("-")): v for k, v in evals.items()}}


def test_point_is_the_tables_mean_over_seeds_of_each_runs_metric():
    rng = np.random.default_rng(3)
    runs = [run(**{"Town02-regular": routes(ok, hit, rng=rng)}) for ok, hit in ((2, 0), (5, 1), (9, 2))]
    for key in ("SR", "RC", "CR", "AS", "TD", "CS"):
        per_run = [compute_metrics([EpisodeRecord.from_dict(d) for d in r["routes"][T2]])[key] for r in runs]
        assert point([seed_arrays(r, [T2]) for r in runs], key) == pytest.approx(np.mean(per_run)), key


def test_a_clear_difference_has_an_interval_away_from_zero_and_an_equal_pair_does_not():
    good = [run(**{"Town02-regular": routes(10, 0)}) for _ in range(3)]
    bad = [run(**{"Town02-regular": routes(0, 10)}) for _ in range(3)]
    c = contrast(good, bad, "SR", [T2])
    assert c["diff"] == {"mean": 1.0, "lo": 1.0, "hi": 1.0} and c["p_greater"] == 1.0
    assert c["n_a"] == c["n_b"] == 3 and c["draws"] == DRAWS
    mixed = [run(**{"Town02-regular": routes(k, 0)}) for k in (3, 5, 7)]
    same = contrast(mixed, mixed, "SR", [T2], seed=1)
    assert same["diff"]["mean"] == 0.0 and same["diff"]["lo"] < 0 < same["diff"]["hi"]
    assert 0.4 < same["p_greater"] < 0.6
    assert contrast(mixed, mixed, "SR", [T2], seed=1) == same  # deterministic for its seed
    assert contrast(mixed, mixed, "SR", [T2], seed=2) != same


def test_the_seed_stage_shows_the_spread_between_seeds():
    """Two seeds, one arriving everywhere, one nowhere, no spread between routes: a route-only
    bootstrap would give [0.5, 0.5]; resampling the seeds gives 0, 0.5 or 1 per draw."""
    seeds = [seed_arrays(run(**{"Town02-regular": routes(k, 0)}), [T2]) for k in (0, 10)]
    x = draws(seeds, "SR", 4000, np.random.default_rng(0))
    assert set(np.unique(x)) == {0.0, 0.5, 1.0}
    assert np.mean(x == 0.5) == pytest.approx(0.5, abs=0.03)
    one = draws(seeds[1:], "SR", 100, np.random.default_rng(0))
    assert np.all(one == 1.0)  # one seed, no route spread: nothing left to vary


def test_the_route_stage_shows_the_spread_within_a_seed():
    x = draws([seed_arrays(run(**{"Town02-regular": routes(5, 0)}), [T2])], "SR", 4000,
              np.random.default_rng(0))
    assert x.mean() == pytest.approx(0.5, abs=0.02)
    assert x.std() == pytest.approx(np.sqrt(0.25 / 10), rel=0.1)  # a binomial share of 10 routes


def test_pooled_evaluations_count_only_runs_that_have_every_one():
    full = run(**{"Town02-regular": routes(10, 0), "Town01-dense": routes(0, 0)})
    part = run(**{"Town02-regular": routes(10, 0)})
    c = contrast([full, part], None, "SR", [T2, T1])
    assert c["n_a"] == 1 and c["a"]["mean"] == 0.5 and "diff" not in c
    empty = contrast([part], [full], "SR", [T2, T1])
    assert empty["a"] is None and empty["diff"] is None and empty["p_greater"] is None


def test_bad_requests_say_what_is_wrong():
    r = [run(**{"Town02-regular": routes(1, 0)})]
    with pytest.raises(ValueError, match="unknown metric 'XX'.*SR, RC, CR, AS"):
        contrast(r, r, "XX", [T2])
    with pytest.raises(ValueError, match="at least 100 bootstrap draws"):
        contrast(r, r, "SR", [T2], n=10)
