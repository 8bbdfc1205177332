"""bench.py learn-summary: many `bench.py learn` results per variant, read from the JSON files they
printed (docs/results/learn_15min/), with the study's bootstrap intervals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from script_loader import load_script
from drivemind.evaluation.learn_summary import read_learn_json, resolve, summarize


def _row(seed, arrived, collided=0, n=10, town="Town02", reward="drivemind_kinematic"):
    """One per-seed row as `bench.py learn` writes it (the keys learn-summary reads)."""
    return {"seed": seed, "town": town, "density": "regular", "reward": reward,
            "env_steps": 80000 + seed, "env_steps_per_s": 90.0, "mean_speed_kmh": 20.0 + seed,
            "route_completion": arrived / n, "collision_rate": collided / n,
            "endings": {"arrived": arrived, "collision": collided, "off_route": n - arrived - collided,
                        "stuck": 0, "other": 0}}


def _write(path, rows, minutes=15.0, log=False):
    obj = {"what": "learn", "minutes": minutes, "route_completion": float(np.mean([r["route_completion"] for r in rows])),
           "per_seed": rows}
    text = json.dumps(obj)
    # a log: what the run printed before its last line stays in front of it
    path.write_text(("[drivemind] training...\n{\"partial\": 1\n" + text + "\n") if log else text)
    return path


def test_means_goal_counts_and_intervals_follow_the_runs(tmp_path):
    rng = np.random.default_rng(3)
    a = rng.integers(3, 11, size=8)  # arrived routes of 10, per run
    b = np.clip(a - 3, 0, 10)
    for i, k in enumerate(a):
        _write(tmp_path / f"a-s{i}.json", [_row(i, int(k), collided=int(10 - k) // 2)])
    # variant b: two seeds per file, one file written as a log
    for j in range(0, 8, 2):
        _write(tmp_path / f"b-{j}.log", [_row(j, int(b[j])), _row(j + 1, int(b[j + 1]))], log=j == 0)
    arms = resolve({"a": [str(tmp_path / "a-s*.json")], "b": [str(tmp_path / "b-*.log")]})
    out = summarize(arms, ref="a", goal=0.8, n=2000, seed=1)
    A, B = out["arms"]["a"], out["arms"]["b"]
    assert A["runs"] == B["runs"] == 8
    assert A["route_completion"] == pytest.approx(np.mean(a) / 10)
    assert B["route_completion"] == pytest.approx(np.mean(b) / 10)
    assert A["at_goal"] == int(np.sum(a >= 8)) and B["at_goal"] == int(np.sum(b >= 8))
    assert A["route_completion_sd"] == pytest.approx(np.std(a / 10, ddof=1), abs=1e-4)
    assert A["collision_rate"] == pytest.approx(np.mean((10 - a) // 2) / 10)
    assert A["mean_speed_kmh"] == pytest.approx(20.0 + np.mean(np.arange(8)))
    assert A["env_steps_range"] == [80000, 80007] and A["seeds"] == list(range(8))
    for arm in (A, B):
        lo, hi = arm["route_completion_ci"]
        assert lo <= arm["route_completion"] <= hi and hi - lo > 0.02
    d = out["vs_ref"]["b"]
    assert d["route_completion"] == pytest.approx(B["route_completion"] - A["route_completion"], abs=1e-4)
    lo, hi = d["route_completion_ci"]
    assert hi < 0 and d["route_completion_p_greater"] < 0.05  # b is 3 routes of 10 worse on every run
    assert "a" not in out["vs_ref"]
    # deterministic for its seed; another seed draws other intervals
    assert summarize(arms, ref="a", n=2000, seed=1) == out
    assert summarize(arms, ref="a", n=2000, seed=2)["arms"]["a"]["route_completion_ci"] != A["route_completion_ci"] \
        or summarize(arms, ref="a", n=2000, seed=2)["arms"]["b"]["route_completion_ci"] != B["route_completion_ci"]


def _machine(zen4: bool):
    return {"cpu": "AMD EPYC", "cpu_family_model": "25/17" if zen4 else "25/1",
            "cpu_flags": ["avx2", "avx512f", "avx512_bf16"] if zen4 else ["avx2"]}


def test_a_runs_other_policy_is_a_variant_and_two_policies_of_the_same_runs_are_paired(tmp_path):
    """NAME@online reads each run's online actor (bench.py learn prints it beside a moving average
    of the actor); the same runs on both sides get a paired difference per run."""
    ema = [9, 8, 7, 9, 6, 10]     # arrived routes of 10 with the average
    online = [8, 8, 5, 7, 6, 9]   # the same runs' online actor: never better
    for i, (e, o) in enumerate(zip(ema, online)):
        row = {**_row(i, e), "run_dir": f"/runs/s{i}",
               "online": {"route_completion": o / 10, "collision_rate": 0.1, "mean_speed_kmh": 21.0}}
        if i % 2:  # newer runs print the online actor's endings too; older ones do not
            row["online"]["endings"] = {"arrived": o, "collision": 1, "off_route": 9 - o, "stuck": 0, "other": 0}
        (tmp_path / f"e-s{i}.json").write_text(json.dumps({"what": "learn", "minutes": 15.0,
                                                           "per_seed": [row], **_machine(False)}))
    pat = [str(tmp_path / "e-s*.json")]
    out = summarize(resolve({"ema": pat, "ema@online": pat}), ref="ema@online", n=2000)
    assert out["arms"]["ema"]["route_completion"] == pytest.approx(np.mean(ema) / 10, abs=1e-4)
    assert out["arms"]["ema@online"]["route_completion"] == pytest.approx(np.mean(online) / 10, abs=1e-4)
    assert out["arms"]["ema@online"]["collision_rate"] == pytest.approx(0.1)
    assert out["arms"]["ema"]["cpus"] == {"AMD EPYC, family/model 25/1, avx2": 6}
    d = out["vs_ref"]["ema"]
    assert d["same_cpus"]
    p = d["paired"]
    assert p["runs"] == 6 and p["route_completion"] == pytest.approx((sum(ema) - sum(online)) / 60, abs=1e-4)
    assert (p["runs_up"], p["runs_down"], p["runs_same"]) == (4, 0, 2)
    lo, hi = p["route_completion_ci"]
    assert 0 < lo <= p["route_completion"] <= hi and p["route_completion_p_greater"] > 0.99
    # the independent intervals ignore the pairing and are wider
    assert hi - lo < d["route_completion_ci"][1] - d["route_completion_ci"][0]


def test_runs_on_other_cpus_are_flagged_and_bad_policy_names_are_refused(tmp_path):
    for i, zen4 in enumerate((True, False)):
        (tmp_path / f"m{i}.json").write_text(json.dumps({"what": "learn", "minutes": 15.0,
                                                         "per_seed": [_row(i, 7)], **_machine(zen4)}))
    (tmp_path / "old.json").write_text(json.dumps({"what": "learn", "minutes": 15.0,
                                                   "per_seed": [_row(5, 8)], "cpu": "AMD EPYC"}))
    out = summarize(resolve({"z4": [str(tmp_path / "m0.json")], "z3": [str(tmp_path / "m1.json")],
                             "old": [str(tmp_path / "old.json")]}), ref="z4", n=200)
    assert out["vs_ref"]["z3"]["same_cpus"] is False and out["vs_ref"]["old"]["same_cpus"] is False
    assert out["arms"]["old"]["cpus"] == {"AMD EPYC, family/model not recorded": 1}
    assert "paired" not in out["vs_ref"]["z3"]  # different runs: no pairing
    with pytest.raises(ValueError, match="after '@' comes one of online, latest"):
        summarize(resolve({"a@best": [str(tmp_path / "m0.json")]}), n=200)
    with pytest.raises(ValueError, match="has no 'online' figures"):
        summarize(resolve({"a@online": [str(tmp_path / "m0.json")]}), n=200)


def test_one_run_keeps_the_route_spread(tmp_path):
    _write(tmp_path / "one.json", [_row(0, 5)])
    out = summarize(resolve({"x": [str(tmp_path / "one.json")]}), n=2000)
    lo, hi = out["arms"]["x"]["route_completion_ci"]
    assert lo < 0.5 < hi and hi - lo > 0.3  # ten routes at 0.5: a wide interval, not a point
    assert out["arms"]["x"]["route_completion_sd"] is None and "vs_ref" not in out


def test_bad_input_gets_one_clear_error(tmp_path):
    _write(tmp_path / "t2.json", [_row(0, 8)])
    _write(tmp_path / "t1.json", [_row(1, 8, town="Town01")])
    (tmp_path / "other.json").write_text(json.dumps({"what": "sim", "npc_mean_speed_kmh": 12.0}))
    (tmp_path / "empty.log").write_text("no json here\n")
    bad = dict(_row(2, 8)); bad["route_completion"] = 0.3
    _write(tmp_path / "bad.json", [bad])
    with pytest.raises(FileNotFoundError, match=r"x=.*nothing-\*\.json matches no file"):
        resolve({"x": [str(tmp_path / "nothing-*.json")]})
    with pytest.raises(ValueError, match="mixes runs with different town.*Town01, Town02"):
        summarize(resolve({"x": [str(tmp_path / "t*.json")]}), n=200)
    with pytest.raises(ValueError, match="not a `bench.py learn` result.*'sim'"):
        read_learn_json(tmp_path / "other.json")
    with pytest.raises(ValueError, match="no JSON object"):
        read_learn_json(tmp_path / "empty.log")
    with pytest.raises(ValueError, match="route_completion 0.3 is not the share of arrived routes"):
        summarize({"x": [tmp_path / "bad.json"]}, n=200)
    with pytest.raises(ValueError, match=r"--goal is a route completion in \[0, 1\], got 80"):
        summarize({"x": [tmp_path / "t2.json"]}, goal=80)
    with pytest.raises(ValueError, match="--ref 'y' is not one of the variants: x"):
        summarize({"x": [tmp_path / "t2.json"]}, ref="y")


def test_the_command_prints_the_summary_last(tmp_path, capsys):
    for i, k in enumerate((6, 9, 10)):
        _write(tmp_path / f"d-s{i}.json", [_row(i, k)])
        _write(tmp_path / f"v-s{i}.json", [_row(i, k - 2)])
    bench = load_script("bench")
    res = bench.main(["learn-summary", f"default={tmp_path}/d-s0.json,{tmp_path}/d-s[12].json",
                      f"v={tmp_path}/v-s*.json", "--ref", "default", "--draws", "500"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(res))
    assert res["arms"]["default"]["runs"] == 3 and res["arms"]["default"]["at_goal"] == 2
    assert res["vs_ref"]["v"]["route_completion"] == pytest.approx(-0.2)
    with pytest.raises(SystemExit, match="is not NAME=PATTERN"):
        bench.main(["learn-summary", f"{tmp_path}/d-s0.json"])
    with pytest.raises(SystemExit, match="variant 'v' given twice"):
        bench.main(["learn-summary", f"v={tmp_path}/v-s0.json", f"v={tmp_path}/v-s1.json"])


def test_bench_records_the_cpus_family_model_and_vector_features():
    """bench.py's machine info reads the first processor of /proc/cpuinfo: a Zen 3 and a Zen 4 VM
    both say "AMD EPYC", and only the family/model and the flags tell them apart."""
    bench = load_script("bench")
    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
            "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16\n\n"
            "processor\t: 1\ncpu family\t: 99\nmodel name\t: other\nflags\t\t: amx_bf16\n")
    assert bench.cpu_info(text) == {"cpu": "AMD EPYC", "cpu_family_model": "25/17",
                                    "cpu_flags": ["avx2", "avx512f", "avx512_bf16"]}
    assert bench.cpu_info("\nmodel name : X\nflags : sse2\n")["cpu_flags"] == []
