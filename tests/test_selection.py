"""Checkpoint selection on validation routes (``validation.every``, drivemind.training.selection):
validation routes apart from the fixed evaluation routes, the best policy kept and loadable, the
final policy validated, resume, the settings checked, ``bench.py learn --checkpoint best``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from hydra_config import config
from script_loader import load_script
from test_training import SAC, TINY

from drivemind.envs.routes import SHIPPED, make_fixed_routes, make_validation_routes
from drivemind.maps import load_town
from drivemind.training import train
from drivemind.training.evaluate import evaluate_run, load_policy
from drivemind.training.selection import score
from drivemind.training.validate import config_problems

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VALIDATED = [*TINY, *SAC, "validation.every=60", "validation.routes=2", "validation.max_steps_per_route=40"]


def _ident(r):
    return (tuple(r["start"]["lane"]), r["start"]["s"], tuple(r["goal"]["lane"]), r["goal"]["s"])


@pytest.mark.parametrize("town", ["grid", "Town02"])
def test_validation_routes_are_none_of_the_evaluation_routes(town):
    rm = load_town(town)
    fixed = json.loads((SHIPPED / f"{town}.json").read_text())
    spec = make_validation_routes(rm, 10, fixed)
    assert len(spec["routes"]) == spec["n"] == 10
    assert not {_ident(r) for r in spec["routes"]} & {_ident(r) for r in fixed["routes"]}
    assert spec == make_validation_routes(rm, 10, fixed)  # seeded: every run of a town gets them
    # a route of the excluded set is dropped, even one the validation seed draws first
    first = make_fixed_routes(rm, 3, seed=spec["seed"])["routes"]
    kept = make_validation_routes(rm, 10, {"routes": first})["routes"]
    assert len(kept) == 10 and not {_ident(r) for r in kept} & {_ident(r) for r in first}


def test_too_many_validation_routes_is_one_clear_error(monkeypatch):
    import drivemind.envs.routes as routes

    with pytest.raises(ValueError, match=">= 1"):
        make_validation_routes(load_town("grid"), 0)
    # a map with fewer long-enough routes than asked: the real route drawing, with a minimum
    # length no route of the grid town reaches
    real = routes.make_fixed_routes
    monkeypatch.setattr(routes, "make_fixed_routes", lambda rm, n, seed: real(rm, n, seed, min_length=2900))
    with pytest.raises(routes.RouteError, match=r"too few distinct routes for 1 validation route.*validation.routes=<n>"):
        make_validation_routes(load_town("grid"), 1)


def _rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "logs" / "validation.csv", newline="") as f:
        return list(csv.DictReader(f))


def _check_best(rows: list[dict], best: dict):
    """Each row is marked best when its score is at least every earlier one's (a tie: the later
    policy), and best.json is the last row so marked."""
    top = None
    for r in rows:
        s = score({k: float(r[k]) for k in ("RC", "completion")})
        assert int(r["best"]) == int(top is None or s >= top), rows
        top = s if top is None or s >= top else top
    last = [r for r in rows if int(r["best"])][-1]
    assert best["steps"] == int(last["steps"]) and best["RC"] == float(last["RC"])


@pytest.fixture(scope="module")
def validated_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sel") / "run"
    return run_dir, train(config(*VALIDATED, "total_timesteps=150", "checkpoint_every=50",
                                 "checkpoint_keep=0"), run_dir)


def test_a_validated_run_keeps_its_best_policy(validated_run):
    run_dir, summary = validated_run
    rows = _rows(run_dir)
    # every 60 env steps, and the final policy (150) too
    assert [int(r["steps"]) for r in rows] == [60, 120, 150]
    assert all(float(r["validate_s"]) > 0 for r in rows)
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    _check_best(rows, best)
    assert summary["validation"] == {"best": best, "validations": 3}
    routes = json.loads((run_dir / "validation_routes.json").read_text())
    assert len(routes["routes"]) == 2 and routes["purpose"].startswith("validation")
    # the best policy loads and drives the fixed evaluation routes
    policy, model = load_policy(run_dir, "best")
    assert policy.config["validation"]["every"] == 60
    res = evaluate_run(run_dir, checkpoint="best", routes=[0], video_route=None, max_steps_per_route=20,
                       progress=False, out_dir=run_dir / "eval" / "best")
    assert res["metrics"]["episodes"] == 1
    assert json.loads((run_dir / "eval" / "best" / "metrics.json").read_text())["meta"]["checkpoint"] == "best"


def test_bench_checkpoints_compares_every_kept_checkpoint(validated_run, capsys):
    run_dir, _ = validated_run
    # checkpoint_keep=0 kept every checkpoint (the default keeps the newest two)
    kept = sorted(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("model_*.zip"))
    assert kept == [50, 100, 150]
    res = load_script("bench").main(["checkpoints", "--run-dir", str(run_dir), "--max-steps", "15"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(res))
    rows = res["checkpoints"]
    assert [r["checkpoint"] for r in rows] == ["model_50.zip", "model_100.zip", "model_150.zip", "best.zip"]
    for r in rows:  # each on the 10 fixed routes and on the run's 2 validation routes
        test = json.loads((run_dir / "eval" / "checkpoints" / Path(r["checkpoint"]).stem / "test" / "metrics.json").read_text())
        val = json.loads((run_dir / "eval" / "checkpoints" / Path(r["checkpoint"]).stem / "validation" / "metrics.json").read_text())
        assert test["metrics"]["episodes"] == 10 and val["metrics"]["episodes"] == 2
        assert r["test"]["RC"] == test["metrics"]["RC"] and r["validation"]["RC"] == val["metrics"]["RC"]
        assert val["meta"]["routes_file"] == str(run_dir / "validation_routes.json")
    drawn = rows[:3]
    assert res["latest"] == {"steps": 150, "test_rc": drawn[-1]["test"]["RC"]}
    assert res["best_in_hindsight_test_rc"] == max(r["test"]["RC"] for r in drawn)
    top = max(score(r["validation"]) for r in drawn)
    assert res["selected"]["steps"] == [r for r in drawn if score(r["validation"]) == top][-1]["steps"]
    with pytest.raises(FileNotFoundError, match="checkpoint_keep=0"):
        load_script("bench").main(["checkpoints", "--run-dir", str(run_dir / "validation_routes.json")])


def test_resume_keeps_the_best_so_far_and_validates_on(validated_run, tmp_path):
    import shutil

    src, _ = validated_run
    run_dir = tmp_path / "run"
    shutil.copytree(src, run_dir)
    summary = train({"total_timesteps": 240}, run_dir, resume=True)
    rows = _rows(run_dir)
    assert [int(r["steps"]) for r in rows] == [60, 120, 150, 210, 240]
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    _check_best(rows, best)
    assert summary["validation"]["validations"] == 5


def test_best_of_a_run_that_did_not_validate_is_a_clear_error(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"algo": {"name": "sac"}}))
    with pytest.raises(FileNotFoundError, match="validation.every"):
        load_policy(tmp_path, "best")


@pytest.mark.parametrize("overrides, expected", [
    (["validation.every=-1"], "validation.every=-1 is invalid"),
    (["validation.routes=0"], "validation.routes=0 is invalid"),
    (["eval.checkpoint=best"], "needs validation.every"),
    (["eval.checkpoint=newest"], "valid: latest, best"),
    (["sim=carla", "validation.every=1000"], "needs the embedded simulator"),
    (["algo=minddrive", "validation.every=1000"], "MindDrive's training loop does not validate"),
])
def test_selection_settings_are_checked_before_the_run(overrides, expected):
    problems = config_problems(config(*overrides))
    assert any(expected in p for p in problems), problems
    assert not config_problems(config("validation.every=1000", "eval.checkpoint=best"))


def test_bench_learn_evaluates_the_best_and_the_latest(tmp_path, capsys):
    bench = load_script("bench")
    res = bench.main(["learn", "--town", "grid", "--density", "empty", "--minutes", "0.03",
                      "--out", str(tmp_path), "--max-steps", "30", "--checkpoint", "best",
                      "algo.learning_starts=30", "algo.batch_size=16", "checkpoint_every=0",
                      "+env.max_episode_steps=40", "validation.every=40", "validation.routes=1",
                      "validation.max_steps_per_route=30"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(res))
    row = res["per_seed"][0]
    run_dir = Path(row["run_dir"])
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    assert res["checkpoint"] == row["checkpoint"] == "best" and row["best_at_steps"] == best["steps"]
    # two evaluations of the 10 fixed routes: the best policy's, and the latest's beside it
    best_eval = json.loads((run_dir / "eval" / "grid-empty" / "metrics.json").read_text())
    latest_eval = json.loads((run_dir / "eval" / "latest" / "metrics.json").read_text())
    assert best_eval["meta"]["checkpoint"] == "best" and latest_eval["meta"]["checkpoint"] == "latest"
    assert row["route_completion"] == best_eval["metrics"]["RC"]
    assert row["latest"]["route_completion"] == latest_eval["metrics"]["RC"] == res["latest_route_completion"]
