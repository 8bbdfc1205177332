"""The study tooling (issue 16): scripts/report.py over run directories, run and sweep names that
show every swept key, the experiment=study_* configs, and scripts/study.py's resumable evaluation.

One real tiny training run (48 px BEV, 100 env steps on the built-in grid town, no traffic) gives
the real file formats; more seeds and methods are its copies with edited configs, summaries and
evaluation reports written by the real ``write_reports``.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from drivemind.evaluation import compute_metrics, write_reports
from drivemind.evaluation.metrics import EpisodeRecord
from drivemind.evaluation.study import build_report, find_runs, flatten, method_curves
from drivemind.naming import MAX_LEN
from drivemind.training import train
from drivemind.training.build import with_reward_window
from drivemind.training.evaluate import evaluate_run
from script_loader import load_script

REPO = Path(__file__).resolve().parents[1]
TINY = ["logger=quiet", "progress_bar=false", "density=empty", "obs.bev.size=48", "obs.features=null",
        "algo.policy_kwargs.features_extractor_kwargs.bev_dim=32", "algo.policy_kwargs.net_arch=[32]",
        "+env.max_episode_steps=30", "log_interval=1", "algo.learning_starts=50", "algo.batch_size=16",
        "algo.buffer_size=1000", "checkpoint_every=0"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def compose_cfg(*overrides: str, hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)


def resolved(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_cfg(*overrides), resolve=True)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A real 100-step training run, evaluated for real on one grid route."""
    run_dir = tmp_path_factory.mktemp("real") / "run"
    train(resolved(*TINY, "total_timesteps=100"), run_dir)
    evaluate_run(run_dir, "grid", "empty", routes=[0], video_route=None, max_steps_per_route=30)
    return run_dir


def test_evaluating_a_run_uses_its_torch_threads(real_run, tmp_path):
    """An evaluation runs with the run's ``torch_threads`` (1 here), not torch's default of every
    core, which oversubscribes the cores beside a study's training runs."""
    import torch as th

    assert yaml.safe_load((real_run / "config.yaml").read_text())["torch_threads"] == 1
    before = th.get_num_threads()
    try:
        th.set_num_threads(2)
        evaluate_run(real_run, "grid", "empty", routes=[0], video_route=None, max_steps_per_route=5,
                     out_dir=tmp_path / "ev")
        assert th.get_num_threads() == 1
    finally:
        th.set_num_threads(before)


def test_a_town_given_as_a_file_keeps_its_reports_inside_the_run(real_run, tmp_path):
    """town=custom town.name=/abs/path.xodr: the reports go to <run>/eval/<stem>-<density>, not
    beside the map file (an absolute path joined to the run's folder replaced it)."""
    from drivemind.maps.resolve import VENDORED_DIR
    from drivemind.training.evaluate import eval_folder

    src = tmp_path / "maps" / "Town02.xodr.xz"
    src.parent.mkdir()
    shutil.copy(VENDORED_DIR / "Town02.xodr.xz", src)
    res = evaluate_run(real_run, str(src), "empty", routes=[0], video_route=None, max_steps_per_route=5)
    assert res["out"] == real_run / "eval" / "Town02-empty" and (res["out"] / "metrics.json").is_file()
    assert sorted(p.name for p in src.parent.iterdir()) == ["Town02.xodr.xz"]
    assert eval_folder("Town05", "dense") == "Town05-dense"
    assert eval_folder("/maps/my town.xodr", "regular") == "my town-regular"
    shutil.rmtree(res["out"])


def records(arrived: int, collided: int, n: int = 10, speed: float = 20.0) -> list[EpisodeRecord]:
    """``n`` route records: the first ``arrived`` reach their goal, the last ``collided`` collide."""
    out = []
    for i in range(n):
        hit = i >= n - collided
        out.append(EpisodeRecord(route_index=i, steps=100, distance_m=100.0 * (i + 1), duration_s=10.0,
                                 mean_speed_kmh=speed, arrived=i < arrived, completion=1.0 if i < arrived else 0.5,
                                 routes_completed=float(i < arrived), collisions=int(hit),
                                 collision_speeds_kmh=[speed / 2] if hit else [],
                                 termination="collision" if hit else ""))
    return out


def make_run(real: Path, dest: Path, *, seed: int, reward: dict, algo: str = "sac", evals=None,
             status: str = "finished", extra: dict | None = None) -> Path:
    """A copy of the real run with another config/summary and the given evaluations
    ``{(town, density): records}`` written by the real report writer."""
    shutil.copytree(real, dest, ignore=shutil.ignore_patterns("eval", "checkpoints", "wandb"))
    cfg = yaml.safe_load((dest / "config.yaml").read_text())
    cfg["seed"], cfg["reward"] = seed, reward
    cfg["algo"]["name"] = algo
    for k, v in (extra or {}).items():
        node = cfg
        *path, last = k.split(".")
        for p in path:
            node = node[p]
        node[last] = v
    (dest / "config.yaml").write_text(yaml.safe_dump(cfg))
    summary = json.loads((dest / "summary.json").read_text())
    summary["status"] = status
    (dest / "summary.json").write_text(json.dumps(summary))
    for (town, density), recs in (evals or {}).items():
        write_reports(dest / "eval" / f"{town}-{density}", compute_metrics(recs),
                      recs, {"town": town, "density": density, "policy": dest.name})
    return dest


DM = {"name": "drivemind", "ablate": "none", "params": {"rho1": 1.0}}
DM_AICR = {"name": "drivemind", "ablate": "aicr", "params": {"rho1": 1.0}}
CHEN = {"name": "chen", "params": {"w_speed": 1.0}}
T2, T1D = ("Town02", "regular"), ("Town01", "dense")


@pytest.fixture(scope="module")
def study(real_run, tmp_path_factory):
    """Two sweeps: DriveMind full and NoAICR (3 seeds; one NoAICR seed lacks Town01-dense), Chen
    (2 finished seeds and a failed one)."""
    root = tmp_path_factory.mktemp("study")
    a, b = root / "sweep_a", root / "sweep_b"
    sr = {0: (2, 0), 1: (5, 1), 2: (9, 2)}  # seed -> (arrived, collided) on Town02
    for s in range(3):
        make_run(real_run, a / f"{s}-dm-s{s}", seed=s, reward=DM,
                 evals={T2: records(*sr[s]), T1D: records(s, 0)})
        make_run(real_run, a / f"{3 + s}-dm-noaicr-s{s}", seed=s, reward=DM_AICR,
                 evals={T2: records(1, 3 + s), **({T1D: records(0, 2)} if s != 1 else {})})
    make_run(real_run, b / "0-chen-s0", seed=0, reward=CHEN, evals={T2: records(0, 10, speed=30)})
    make_run(real_run, b / "1-chen-s1", seed=1, reward=CHEN, evals={T2: records(1, 9, speed=25)})
    make_run(real_run, b / "2-chen-s2", seed=2, reward=CHEN, status="failed: RuntimeError: boom")
    return root, a, b


def row(report, method, town, density):
    [r] = [r for r in report["rows"] if r["method"] == method and (r["town"], r["density"]) == (town, density)]
    return r


# ---------------------------------------------------------------------------- the report


def test_report_groups_by_method_and_aggregates_over_seeds(study):
    root, a, b = study
    runs = find_runs([a, b])
    assert len(runs) == 9
    rep = build_report(runs)
    assert rep["keys"] == ["reward.name", "reward.ablate", "algo.name"]  # reward.params do not split
    assert [m["label"] for m in rep["methods"]] == ["chen-sac", "drivemind-noaicr-sac", "drivemind-sac"]
    full = row(rep, "drivemind-sac", *T2)
    srs = [2 / 10, 5 / 10, 8 / 10]  # arrived without collision: (2,0), (5,1), (9,2): route 8 both
    assert full["n"] == 3 and full["SR"] == pytest.approx(np.mean(srs))
    assert full["SR_std"] == pytest.approx(np.std(srs, ddof=1))
    assert full["RC"] == pytest.approx(np.mean([0.2, 0.5, 0.9]))
    assert full["CR"] == pytest.approx(np.mean([0.0, 0.1, 0.2]))
    # how its 30 routes end: 16 arrive (route 8 of seed 2 after its collision), 2 end in a
    # collision, the other 12 end otherwise (these records name no termination)
    assert full["endings"] == {"arrived": 16, "collision": 2, "off_route": 0, "stuck": 0, "other": 12}
    chen = row(rep, "chen-sac", *T2)  # the failed seed is listed, not averaged
    assert chen["n"] == chen["runs"] == 2 and chen["failed"] == ["2-chen-s2"]
    assert chen["AS"] == pytest.approx(27.5) and chen["AS_std"] == pytest.approx(np.std([30, 25], ddof=1))
    # a run without Town01-dense is named as missing there, not dropped
    noaicr = row(rep, "drivemind-noaicr-sac", *T1D)
    assert noaicr["n"] == 2 and noaicr["runs"] == 3 and noaicr["missing"] == ["4-dm-noaicr-s1"]
    # a method with no run evaluated there: the row exists with n = 0
    assert row(rep, "chen-sac", *T1D)["n"] == 0 and row(rep, "chen-sac", *T1D)["SR"] is None
    # the published numbers beside ours (DriveMind Table 1 and 2, Town02 regular)
    pub = {(p["method"], p["source"]) for p in rep["published"]}
    assert ("drivemind-sac", "DriveMind (Wasif et al.) Table 1") in pub
    assert ("drivemind-noaicr-sac", "DriveMind (Wasif et al.) Table 2") in pub
    assert ("chen-sac", "DriveMind (Wasif et al.) Table 1") in pub


def test_report_script_writes_files_and_json(study, tmp_path, capsys):
    root, a, b = study
    out = tmp_path / "report"
    res = load_script("report").main([str(a), str(b), "--out", str(out), "--json"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(res))
    assert last["runs"] == 9 and last["seeds_min"] == 2 and last["failed"] == ["2-chen-s2"]
    assert last["methods"] == ["chen-sac", "drivemind-noaicr-sac", "drivemind-sac"]
    assert last["evals"] == ["Town01-dense", "Town02-regular"]
    assert len(last["rows"]) == 3 * 2
    for f in ("report.md", "table.csv", "runs.csv", "curves.csv", "curves.png", "eval_Town02-regular.png"):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    md = (out / "report.md").read_text()
    t1d = md.split("## Town01 × dense")[1].split("##")[0]
    chen_line = next(line for line in t1d.splitlines() if line.startswith("| chen-sac"))
    assert "missing" in chen_line and "| 0/2 |" in chen_line and chen_line.rstrip().endswith("| - |")
    assert "4-dm-noaicr-s1" in t1d  # the run that lacks it is named
    assert "2-chen-s2" in md and "failed: RuntimeError: boom" in md
    t2 = md.split("## Town02 × regular")[1].split("##")[0]
    assert "↳ published: DriveMind (DriveMind (Wasif et al.) Table 1) | 3 | 19.4 ± 2.34" in t2
    with open(out / "table.csv", newline="") as f:
        table = list(csv.DictReader(f))
    ours = [r for r in table if r["source"] == "ours" and r["method"] == "drivemind-sac"
            and r["town"] == "Town02"]
    assert len(ours) == 1 and float(ours[0]["SR"]) == pytest.approx(np.mean([0.2, 0.5, 0.8]))
    assert [ours[0][f"ends_{k}"] for k in ("arrived", "collision", "off_route", "stuck", "other")] == \
        ["16", "2", "0", "0", "12"]
    dm_line = next(line for line in t2.splitlines() if line.startswith("| drivemind-sac |"))
    assert dm_line.rstrip().endswith("| 0.53 / 0.07 / 0.00 / 0.00 / 0.40 |")
    with open(out / "curves.csv", newline="") as f:
        curves = list(csv.DictReader(f))
    assert {r["method"] for r in curves} == set(last["methods"])  # from the real episodes.csv


def test_archive_keeps_what_the_report_needs(study, tmp_path, capsys):
    root, a, b = study
    a = shutil.copytree(a, tmp_path / "a")
    # a run resumed after a kill keeps the episodes its killed invocation drove past the checkpoint
    discarded = a / "0-dm-s0" / "logs" / "episodes.discarded.csv"
    discarded.write_text("timesteps,wall_s\n151,9.5\n")
    out = tmp_path / "results"
    first = load_script("report").main([str(a), str(b), "--out", str(out), "--archive"])
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert len(runs) == 9 and "2-chen-s2" in runs
    assert not list((out / "runs").rglob("*.zip")) and not list((out / "runs").rglob("*.pkl"))
    assert (out / "runs" / "0-dm-s0" / "eval" / "Town02-regular" / "metrics.json").is_file()
    assert (out / "runs" / "0-dm-s0" / "logs" / "episodes.discarded.csv").read_text() == discarded.read_text()
    again = load_script("report").main([str(out / "runs"), "--out", str(tmp_path / "rebuilt")])
    assert again["rows"] == first["rows"] and again["failed"] == first["failed"]


def test_archive_grows_batch_by_batch_and_never_overwrites_another_run(study, tmp_path):
    """The study's workflow: ``report.py docs/results/runs <new batch> --archive``. Runs already in
    the archive stay, the same run given again is updated in place (its later evaluations added),
    and another run that happens to share a folder name is archived beside it, not over it."""
    root, a, b = study
    out = tmp_path / "results"
    report = load_script("report").main
    assert report([str(a), "--out", str(out), "--archive"])["runs"] == 6
    c = tmp_path / "batch3"
    shutil.copytree(b / "0-chen-s0", c / "0-chen-s0")
    write_reports(c / "0-chen-s0" / "eval" / "Town01-dense", compute_metrics(records(4, 0)),
                  records(4, 0), {"town": "Town01", "density": "dense", "policy": "0-chen-s0"})
    other = shutil.copytree(b / "1-chen-s1", tmp_path / "rerun" / "0-dm-s0")  # same name, other run
    with open(other / "logs" / "episodes.csv", "a") as f:
        f.write(open(other / "logs" / "episodes.csv").read().splitlines()[-1] + "\n")
    second = report([str(out / "runs"), str(b), str(tmp_path / "rerun"), "--out", str(out), "--archive"])
    assert second["runs"] == 10
    names = sorted(p.name for p in (out / "runs").iterdir())
    assert "0-dm-s0" in names and "0-dm-s0-2" in names and len(names) == 10
    assert yaml.safe_load((out / "runs" / "0-dm-s0" / "config.yaml").read_text())["reward"] == DM
    third = report([str(out / "runs"), str(c), "--out", str(out), "--archive"])
    assert third["runs"] == 10  # the same chen run again: updated, not counted twice
    assert (out / "runs" / "0-chen-s0" / "eval" / "Town01-dense" / "metrics.json").is_file()
    episodes = c / "0-chen-s0" / "logs" / "episodes.csv"
    with open(episodes, "a") as f:  # it trained on (resumed) since: still the same run
        f.write(episodes.read_text().splitlines()[-1] + "\n")
    late = shutil.copytree(b / "1-chen-s1", c / "1-late-s1")  # a run still in training: no summary
    (late / "summary.json").unlink()
    fourth = report([str(out / "runs"), str(c), "--out", str(out), "--archive"])
    assert fourth["runs"] == 10 and not (out / "runs" / "1-late-s1").exists()
    assert (out / "runs" / "0-chen-s0" / "logs" / "episodes.csv").read_bytes() == episodes.read_bytes()


def test_report_splits_methods_on_any_other_swept_key(real_run, tmp_path):
    for s in range(2):
        for lr in (1e-4, 3e-4):
            make_run(real_run, tmp_path / f"lr{lr}-s{s}", seed=s, reward=CHEN,
                     extra={"algo.learning_rate": lr, "torch_threads": s + 1})  # threads: ignored
    rep = build_report(find_runs([tmp_path]))
    assert rep["keys"] == ["reward.name", "reward.ablate", "algo.name", "algo.learning_rate"]
    assert [m["label"] for m in rep["methods"]] == ["chen-sac [algo.learning_rate=0.0001]",
                                                    "chen-sac [algo.learning_rate=0.0003]"]
    assert all(len(m["seeds"]) == 2 for m in rep["methods"])


def test_learning_curves_mean_and_band_on_a_common_grid(real_run, tmp_path):
    """Two seeds' episodes.csv (window 1): TD 100 m over steps 0..1000 and 300 m over 0..500; the
    mean on the grid is 200 m up to step 500 and 100 m (one run) after it."""
    header = (real_run / "logs" / "episodes.csv").read_text().splitlines()[0].split(",")
    for s, (dist, last) in enumerate(((100.0, 1000), (300.0, 500))):
        run = make_run(real_run, tmp_path / f"s{s}", seed=s, reward=CHEN, extra={"metrics_window": 1})
        with open(run / "logs" / "episodes.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=header)
            w.writeheader()
            for step in np.linspace(0, last, 11):
                w.writerow({**{k: 0 for k in header}, "timesteps": int(step), "steps": 50,
                            "distance_m": dist, "duration_s": 5.0, "mean_speed_kmh": 10.0,
                            "arrived": False, "collisions": 0, "collision_speeds_kmh": "[]",
                            "termination": "", "truncation": ""})
    cur = method_curves(build_report(find_runs([tmp_path])), points=11)
    grid = cur["grid"]
    assert grid[0] == 0 and grid[-1] == 1000
    mean, std, n = cur["methods"]["chen-sac"]["TD"]
    both = grid <= 500
    assert np.allclose(mean[both], 200.0) and np.allclose(std[both], np.std([100, 300], ddof=1))
    assert np.allclose(mean[~both], 100.0) and np.all(n[~both] == 1) and np.allclose(std[~both], 0.0)


def test_report_errors_clearly_without_runs(tmp_path):
    with pytest.raises(FileNotFoundError, match="no training run under"):
        find_runs([tmp_path])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_runs([tmp_path / "nope"])


# ---------------------------------------------------------------------------- names


def test_sweep_folder_names_show_the_ablation_and_other_swept_keys():
    cfg = compose_cfg("reward=drivemind", "reward.ablate=aicr", "seed=2", "algo.learning_rate=1e-4",
                      hydra_cfg=True)
    cfg.hydra.job.num = 7
    sub = OmegaConf.select(cfg, "hydra.sweep.subdir")
    assert cfg.run_name == "drivemind-noaicr-sac-grid-regular-s2"
    assert sub == "7-drivemind-noaicr-sac-grid-regular-s2-algo.learning_rate-1e-4"
    full = compose_cfg("reward=drivemind", "reward.ablate=none", hydra_cfg=True)
    full.hydra.job.num = 0
    assert OmegaConf.select(full, "hydra.sweep.subdir") == "0-drivemind-sac-grid-regular-s0"
    long = compose_cfg("reward=chen", "+env.max_episode_steps=30", "town=custom",
                       "town.name=/maps/My Town.xodr", "algo.policy_kwargs.net_arch=[32,32]",
                       "reward.params.w_speed=1.5", "reward.params.w_lane=2.5", hydra_cfg=True)
    long.hydra.job.num = 1
    name = OmegaConf.select(long, "hydra.sweep.subdir")
    assert long.run_name == "chen-sac-My_Town-regular-s0"
    assert len(name) <= MAX_LEN and not set(name) & set("/\\,=[] ") and name.startswith("1-chen-sac-My_Town")


# ---------------------------------------------------------------------------- study configs

TABLE1 = ["tirl", "vlm_sr", "roboclip", "vlm_rm", "lord", "lord_speed", "chen", "asap", "chatscene",
          "revolve", "vlm_rl", "drivevlm_rl", "found_rl_clip", "drivemind", "carl"]


@pytest.mark.parametrize("exp,algo,rewards", [("study_table1", "sac", TABLE1),
                                              ("study_ablation", "sac", ["drivemind"]),
                                              ("study_ppo", "ppo", ["chen", "vlm_rl", "drivemind", "carl"])])
def test_study_configs_compose_with_one_protocol(exp, algo, rewards):
    from drivemind.rewards import REWARDS, reward_params
    from drivemind.rewards.drivemind import ABLATIONS

    cfg = compose_cfg(f"experiment={exp}", hydra_cfg=True)
    c = OmegaConf.to_container(cfg, resolve=False)
    params = c["hydra"]["sweeper"]["params"]
    assert params["reward"].split(",") == rewards and params["seed"] == "0,1,2"
    for r in rewards:
        assert r in REWARDS and (REWARDS_DIR / f"{r}.yaml").is_file(), r
        one = resolved(f"experiment={exp}", f"reward={r}")  # each job's config composes
        assert one["reward"]["name"] == r and one["algo"]["name"] == algo
        assert one["town"]["name"] == "Town02" and one["density"]["name"] == "regular"
        assert one["obs"]["features"] == "bev_encoder" and one["eval"]["at_end"] is True
        assert one["algo"]["policy_kwargs"]["extractor"] == "features"
        assert one["total_timesteps"] == 100000  # one budget for every method
        assert one["study"]["eval"][0] == "Town02-regular" and {"Town05-dense", "Town03-dense",
                                                                  "Town01-regular"} <= set(one["study"]["eval"])
    if exp == "study_ablation":
        ablate = params["reward.ablate"].split(",")
        assert ablate == ["none", "aicr", "hvfr", "pcfm"] and set(ablate) <= set(ABLATIONS)
        assert "ablate" in reward_params("drivemind")
        one = resolved(f"experiment={exp}", "reward=drivemind", "reward.ablate=hvfr")
        assert one["run_name"] == "drivemind-nohvfr-sac-Town02-regular-s0"


REWARDS_DIR = REPO / "configs" / "reward"


# ---------------------------------------------------------------------------- scripts/study.py


def test_study_script_evaluates_then_skips_what_is_on_disk(real_run, tmp_path, capsys):
    run = tmp_path / "sweep" / "0-run"
    shutil.copytree(real_run, run, ignore=shutil.ignore_patterns("eval"))
    study = load_script("study")
    args = [str(tmp_path / "sweep"), "--evals", "grid-empty,grid-regular", "--routes", "0",
            "--max-steps-per-route", "20", "--out", str(tmp_path / "rep"), "--json"]
    res = study.main(args)
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first == json.loads(json.dumps(res, default=str))
    assert sorted(first["evaluated"]) == ["0-run:grid-empty", "0-run:grid-regular"] and first["skipped"] == 0
    m = json.loads((run / "eval" / "grid-regular" / "metrics.json").read_text())
    assert m["meta"]["density"] == "regular" and m["metrics"]["episodes"] == 1
    assert first["runs"] == 1 and first["evals"] == ["grid-empty", "grid-regular"]
    assert (tmp_path / "rep" / "report.md").is_file()
    before = (run / "eval" / "grid-regular" / "metrics.json").stat().st_mtime_ns
    again = study.main(args)  # resumable: nothing left to do
    assert again["evaluated"] == [] and again["skipped"] == 2
    assert (run / "eval" / "grid-regular" / "metrics.json").stat().st_mtime_ns == before


# Settings added after the study began -> the value that gives the behaviour from before. The archived
# runs' configs predate them (so they lack the keys); the study configs pin exactly these values, so
# that experiment=study_* still trains and evaluates in the same world
# (tests/test_junction_release.py checks that the value reproduces the traffic from before).
ADDED_AFTER_THE_STUDY_BEGAN = {
    "sim.traffic.junction_release": "connector",  # docs/simulator.md, "Junction reservations"
    "sim.traffic.overtake": "never",  # docs/simulator.md, "Overtaking in the oncoming lane"
    "sim.traffic.max_green": None,  # docs/simulator.md, "Traffic lights" (None: green, 10 s)
    "sim.traffic.walker_velocity": "crossing",  # docs/simulator.md, "Walkers"
    "sim.traffic.walker_anticipate": 0.0,  # docs/simulator.md, "Walkers"
    "sim.traffic.ego_turn": None,  # docs/simulator.md, "Junction right of way"
    "sim.traffic.ego_behind": "brake",  # docs/simulator.md, "Background traffic"
    "sim.traffic.lane_change_corridor": "lane",  # docs/simulator.md, "Background traffic"
    "sim.traffic.junction_conflict": "centre",  # docs/simulator.md, "Junction right of way"
    "sim.traffic.diverging_follow": "lane",  # docs/simulator.md, "Junction right of way"
    "sim.traffic.junction_exit": "lane",  # docs/simulator.md, "Junction right of way"
    "sim.traffic.wait_cycle_break": "first",  # docs/simulator.md, "Waits-for cycles"
    "sim.traffic.lane_change_place": "scale",  # docs/simulator.md, "Background traffic"
    "sim.traffic.detector_reach": "lane",  # docs/simulator.md, "Traffic lights"
    "sim.traffic.junction_chain": "none",  # docs/simulator.md, "Junction right of way"
    "sim.traffic.lane_change_follower": "lane",  # docs/simulator.md, "Background traffic"
    "sim.traffic.merge_yield": "none",  # docs/simulator.md, "Background traffic"
    "sim.traffic.overtake_solid": "never",  # docs/simulator.md, "Overtaking in the oncoming lane"
    "sim.traffic.speed_limits": "uniform",  # docs/simulator.md, "Desired speed"
}


def test_the_study_configs_pin_the_settings_added_after_the_study_began():
    from drivemind.envs.driving_env import _sim_config
    from drivemind.sim.config import STUDY_TRAFFIC
    from drivemind.training.build import env_kwargs

    # the same map drives the evaluation of study runs trained before a setting existed
    assert {f"sim.traffic.{k}": v for k, v in STUDY_TRAFFIC.items()} == ADDED_AFTER_THE_STUDY_BEGAN

    for name in ("table1", "ppo", "ablation"):
        cfg = flatten(resolved(f"experiment=study_{name}"))
        for key, old in ADDED_AFTER_THE_STUDY_BEGAN.items():
            assert cfg.get(key, "<absent>") == old, f"experiment=study_{name} must pin {key}={old}"
        # ... and the pin reaches the world the study's env builds
        sim = _sim_config("regular", env_kwargs(resolved(f"experiment=study_{name}"))["sim"])
        assert sim.traffic.junction_release == "connector" and sim.traffic.overtake == "never"
        assert sim.traffic.max_green is None

    # a plain run's config names each of them with its default (configs/sim/lite.yaml), so its saved
    # config records the world it trained in
    from drivemind.sim.config import TrafficParams

    plain = flatten(resolved())
    for key in ADDED_AFTER_THE_STUDY_BEGAN:  # the defaults (new runs) are the new behaviour
        assert plain.get(key, "<absent>") == getattr(TrafficParams(), key.rsplit(".", 1)[1]), key


# settings added after the study ran whose defaults do what its runs did (no validation drives,
# the latest checkpoint evaluated: docs/training.md "Checkpoint selection"); absent from an
# archived run's config and at these values they are no drift, at any other value they are
ADDED_AS_BEFORE = {"validation.every": 0, "validation.routes": 10, "checkpoint_keep": 2,
                   "validation.max_steps_per_route": 6000, "eval.checkpoint": "latest",
                   "algo.autocast": "none", "algo.target_entropy": "auto",
                   "algo.policy_kwargs.actor_ema": None, "algo.reward_learn_every": 1,
                   "algo.label_every": 1}


# what a run shows on the console, not what it trains (a resumed run may change them too): a batch
# started with progress_bar=false is the same protocol
DISPLAY_ONLY = {"progress_bar", "verbose", "log_interval"}


def test_the_study_protocol_is_still_the_one_the_archived_runs_used():
    """The study is run in batches over many sessions, so its settings must not drift: composing
    ``experiment=study_<name>`` with an archived run's reward, ablation and seed gives that run's
    config (apart from the logger and the console's settings). When this fails, a config change (for example to
    ``experiment=fast``, which the study inherits) would make new batches incomparable with the
    archived ones: pin the old value in ``configs/experiment/study_*.yaml`` or start the study
    again, and say so in docs/results.md."""
    runs = sorted((REPO / "docs" / "results" / "runs").glob("*/config.yaml"))
    if not runs:
        pytest.skip("no archived study runs yet")
    for path in runs:
        old = yaml.safe_load(path.read_text())
        overrides = [f"experiment=study_{old['study']['name']}", f"reward={old['reward']['name']}",
                     f"seed={old['seed']}", f"algo={old['algo']['name']}"]
        if old["reward"].get("ablate", "none") != "none":
            overrides.append(f"reward.ablate={old['reward']['ablate']}")
        if old["algo"].get("guidance", "none") != "none":  # the Found-RL guidance row
            overrides.append(f"algo.guidance={old['algo']['guidance']}")
        # as train() saves it: a null CLG window resolved for the run's tower (rewards.windows)
        new = flatten(with_reward_window(resolved(*overrides)))
        old = flatten(old)
        for key, value in {**ADDED_AFTER_THE_STUDY_BEGAN, **ADDED_AS_BEFORE}.items():  # pinned / as before
            if key not in old and key in new and new[key] == value:
                del new[key]
        drift = {k: (old.get(k, "<absent>"), new.get(k, "<absent>")) for k in old.keys() | new.keys()
                 if not k.startswith("logger.") and k not in DISPLAY_ONLY
                 and old.get(k, "<absent>") != new.get(k, "<absent>")}
        assert not drift, f"{path.parent.name}: the study's settings changed since it ran: {drift}"


def test_results_page_tables_are_filled_from_the_report_and_nothing_else_changes(study, tmp_path):
    """scripts/report.py --results-md rewrites only the marked blocks of docs/results.md, from the
    real study configs (sweep lists, seeds, evaluations) and the report's rows."""
    from drivemind.evaluation.results_md import BLOCKS, fill, render_blocks

    root, a, b = study
    page = tmp_path / "results.md"
    prose = "# Results\n\nThe protocol, kept by hand.\n\n"
    page.write_text(prose + "\n\n".join(f"<!-- report:{n} -->\nold\n<!-- /report:{n} -->" for n in BLOCKS)
                    + "\n\nFindings, kept by hand.\n")
    load_script("report").main([str(a), str(b), "--out", str(tmp_path / "rep"), "--results-md", str(page)])
    text = page.read_text()
    assert text.startswith(prose) and text.endswith("Findings, kept by hand.\n") and "\nold\n" not in text
    lines = text.splitlines()
    dm = next(line for line in lines if line.startswith("| drivemind | "))  # Table 1's row
    cells = [c.strip() for c in dm.strip("|").split("|")]
    sr = np.array([0.2, 0.5, 0.8])
    assert cells[1] == "3/3" and cells[6] == f"{sr.mean():.2f} ± {sr.std(ddof=1):.2f}"
    assert cells[-1] == "19.4 / 0.98 / 2083.1 / 0.01 / 0.97"  # DriveMind Table 1
    noaicr = next(line for line in lines if line.startswith("| NoAICR"))
    assert "| 3/3 |" in noaicr and noaicr.rstrip().endswith("| 17.6 / 0.82 / 1.66 / 0.67 |")
    chen = next(line for line in lines if line.startswith("| chen | ") and "/3 |" in line)
    assert "| 2/3 |" in chen  # the failed seed is not counted
    assert next(line for line in lines if line.startswith("| tirl | ")).count("pending") == 6
    heldout = next(line for line in lines if line.startswith("| drivemind | ") and "/3" not in line)
    assert "pending" in heldout and "0.10" in heldout  # Town01 dense: seeds 0/1/2 arrive on 0/1/2 of 10
    # how routes end, over every finished seed's routes: drivemind arrives on 2 + 5 + 9 of 30 Town02
    # routes and ends 0 + 1 + 1 in a collision (seed 2's route 8 arrives after its collision: an
    # arrival); the rest end otherwise; held out only Town01 dense is on disk
    endings = {c[0]: c[1:] for c in ([x.strip() for x in line.strip("|").split("|")] for line in lines)
               if c[0] in ("drivemind", "drivemind NoAICR", "tirl") and len(c) == 5}
    assert endings["drivemind"] == ["3", "0.53 / 0.07 / 0.00 / 0.00 / 0.40", "0.10 / 0.00 / 0.00 / 0.00 / 0.90",
                                    "30 / 30"]
    assert endings["drivemind NoAICR"] == ["3", "0.10 / 0.40 / 0.00 / 0.00 / 0.50",
                                           "0.00 / 0.20 / 0.00 / 0.00 / 0.80", "30 / 20"]
    assert endings["tirl"] == ["0", "pending", "pending", "0 / 0"]
    # the status block counts the same picks: Table 1 has drivemind 3/3 and chen 2/3 (a failed seed
    # is not done) of its 15 rewards x 3 seeds, Table 2 NoAICR 3/3, nothing else is done
    progress = {c[0]: c[1:] for c in ([x.strip() for x in line.strip("|").split("|")] for line in lines
                                      if line.startswith(("| Table ", "| PPO |", "| Found-RL")))}
    n1 = len(load_script("report").study_spec()["table1"]["rewards"])
    t1 = progress["Table 1 (SAC)"]
    assert t1[:2] == [f"5 / {3 * n1}", f"1 / {n1}"] and "chen 2/3" in t1[2] and "tirl 0/3" in t1[2]
    assert "drivemind" not in t1[2]
    assert progress["Table 2 (SAC; its Full row is Table 1's `drivemind`)"] == \
        ["3 / 9", "1 / 3", "NoHVFR 0/3, NoPCFM 0/3"]
    assert progress["Found-RL guidance (`algo.guidance=both`)"] == ["0 / 3", "0 / 1", "found_rl_clip 0/3"]
    assert progress["PPO"][0].startswith("0 / ")
    page.write_text("no markers here\n")
    with pytest.raises(ValueError, match="table1.*put `<!-- report:NAME -->`"):
        fill(page.read_text(), render_blocks(build_report(find_runs([a, b])), load_script("report").study_spec()))
    assert page.read_text() == "no markers here\n"


def test_results_page_states_each_claim_as_a_difference_with_an_interval(study, tmp_path, capsys):
    """The ``contrasts`` block: each paper ordering as A - B with a bootstrap interval on the
    training town (pooled held-out towns pending where the runs lack them); ``--contrast`` gives
    the same for any two methods of a report, one line each and a CSV."""
    from drivemind.evaluation.results_md import BLOCKS

    root, a, b = study
    page = tmp_path / "results.md"
    page.write_text("\n".join(f"<!-- report:{n} -->\n<!-- /report:{n} -->" for n in BLOCKS) + "\n")
    out = load_script("report").main([str(a), str(b), "--out", str(tmp_path / "rep"), "--results-md", str(page),
                                      "--contrast", "drivemind-noaicr-sac", "drivemind-sac"])
    lines = page.read_text().splitlines()
    cr = next(x for x in lines if x.startswith("| without AICR it collides more | CR | Town02 regular |"))
    cells = [c.strip() for c in cr.strip("|").split("|")]
    # NoAICR collides on 3, 4, 5 of 10 routes (0.40), the full reward on 0, 1, 2 (0.10)
    assert cells[3].startswith("drivemind NoAICR: 0.40 [") and cells[4].startswith("drivemind: 0.10 [")
    lo, hi = (float(x) for x in cells[5].split("[")[1].rstrip("]").split(","))
    assert cells[5].startswith("0.30 [") and 0 < lo < 0.3 < hi
    assert float(cells[6]) > 0.95 and cells[7] == "3 / 3" and cells[8] == "-"  # no published CR
    held = next(x for x in lines if x.startswith("| without AICR it collides more | CR | held out (pooled) |"))
    assert "pending" in held  # the fixture's runs lack Town01/03/05 regular
    sr = next(x for x in lines if x.startswith("| DriveMind ≥ VLM-RL | SR | Town02 regular |"))
    assert "vlm_rl: pending" in sr and sr.rstrip().endswith("| 0.04 |")  # 0.97 - 0.93, DriveMind Table 1
    [c] = [c for c in out["contrasts"] if c["key"] == "CR" and c["evals"] == ["Town02-regular"]]
    assert c["diff"]["mean"] == pytest.approx(0.3) and c["n_a"] == c["n_b"] == 3
    assert "contrast drivemind-noaicr-sac - drivemind-sac, CR, Town02-regular: A 0.40" in capsys.readouterr().out
    assert (tmp_path / "rep" / "contrasts.csv").read_text().startswith("a_label,b_label,evals,key")
    with pytest.raises(SystemExit) as ex:
        load_script("report").main([str(a), "--out", str(tmp_path / "rep2"), "--contrast", "nope", "drivemind-sac"])
    assert ex.value.code == 2 and not (tmp_path / "rep2").exists()  # nothing written
    assert "error: no method 'nope' in this report; its methods: drivemind-noaicr-sac, drivemind-sac" \
        in capsys.readouterr().err


def test_report_shows_the_code_each_run_was_trained_at(study, tmp_path):
    from drivemind.evaluation.study import code_label, load_run

    root, a, b = study
    run = load_run(a / "0-dm-s0")  # a copy of a real run trained by this checkout
    commit = (json.loads((a / "0-dm-s0" / "summary.json").read_text())["code"][0]["commit"] or "?")[:7]
    assert run["code"].startswith(commit)
    load_script("report").main([str(a), "--out", str(tmp_path / "rep")])
    with open(tmp_path / "rep" / "runs.csv", newline="") as f:
        assert {r["code"] for r in csv.DictReader(f)} == {run["code"]}
    assert code_label(None) == "-"
    # the machine it was trained on, from the same record
    from drivemind.evaluation.study import machines_label
    from drivemind.paths import machine_info, machine_label

    here = machine_label(machine_info())
    assert run["machine"] == here != "-"
    with open(tmp_path / "rep" / "runs.csv", newline="") as f:
        assert {r["machine"] for r in csv.DictReader(f)} == {here}
    assert "| machine |" in (tmp_path / "rep" / "report.md").read_text()
    xeon = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "isa": ["avx512f", "avx2", "fma"]}
    epyc = {"cpu": "AMD EPYC", "cores": 2, "isa": ["avx2", "fma"]}
    assert machines_label(None) == "-"
    assert machines_label([{"commit": "a" * 40}, {"machine": xeon}, {"machine": xeon}, {"machine": epyc}]) == \
        "-, Intel(R) Xeon(R) Processor x2 (avx512), AMD EPYC x2 (avx2)"
    assert code_label([{"commit": "a" * 40, "dirty": False}, {"commit": "a" * 40, "dirty": False},
                       {"commit": "b" * 40, "dirty": True}]) == "aaaaaaa, bbbbbbb+dirty"


def test_a_run_stopped_by_a_signal_is_incomplete_not_averaged(real_run, tmp_path):
    """A sweep killed at the end of a session leaves runs whose summary says "stopped by SIGTERM"
    short of their budget: the report lists them as incomplete (not averaged) and says how to
    continue them, and study.py does not evaluate them; a run its max_minutes cap stopped stays."""
    from drivemind.evaluation.study import load_run

    for s, status in enumerate(("finished", "stopped by SIGTERM", "stopped after max_minutes=600")):
        run = make_run(real_run, tmp_path / f"{s}-chen-s{s}", seed=s, reward=CHEN, status=status,
                       evals={T2: records(s + 1, 0)})
        shutil.copytree(real_run / "checkpoints", run / "checkpoints")
    cut = load_run(tmp_path / "1-chen-s1")
    assert not cut["ok"] and cut["status"].startswith("incomplete (stopped by SIGTERM at")
    assert "resume=" in cut["status"]
    rep = build_report(find_runs([tmp_path]))
    assert row(rep, "chen-sac", *T2)["seeds"] == [0, 2]
    todo, _, bad = load_script("study").plan(find_runs([tmp_path]))
    assert [r["name"] for r in bad] == ["1-chen-s1"]


def runs_around_a_traffic_setting(real_run: Path, tmp_path: Path) -> list[Path]:
    """Three resumable copies of the real run (configs saved before configs/sim/lite.yaml named the
    setting, but one): a study run whose config predates
    ``sim.traffic.junction_release`` (lacks it), a study run that sets it (to the new value), and a
    run outside the study."""
    runs = []
    before = {"sim": {"backend": "lite"}}  # a config saved before configs/sim/lite.yaml named it
    for name, extra in (("old", {"study": {"name": "table1"}, **before}),
                        ("own", {"study": {"name": "table1"},
                                 "sim": {"backend": "lite", "traffic": {"junction_release": "crossing"}}}),
                        ("plain", before)):
        run = make_run(real_run, tmp_path / name, seed=0, reward=CHEN, extra=extra)
        shutil.copytree(real_run / "checkpoints", run / "checkpoints")
        runs.append(run)
    return runs


def test_a_study_run_from_before_a_traffic_setting_is_evaluated_in_the_old_world(real_run, tmp_path,
                                                                                monkeypatch):
    """A study run trained before a setting of ADDED_AFTER_THE_STUDY_BEGAN existed (its config
    lacks it) is evaluated with the old value; a run whose config sets it keeps its own; a run
    outside the study gets the default."""
    import drivemind.evaluation as ev

    real_evaluate, seen = ev.evaluate, []

    def recording(*a, **kw):
        seen.append(kw["env_kwargs"]["sim"])
        return real_evaluate(*a, **kw)

    monkeypatch.setattr(ev, "evaluate", recording)
    for run in runs_around_a_traffic_setting(real_run, tmp_path):
        evaluate_run(run, "grid", "empty", routes=[0], video_route=None, max_steps_per_route=5)
    traffic = [((s or {}).get("traffic") or {}).get("junction_release") for s in seen]
    assert traffic == ["connector", "crossing", None]
    # a setting the study run names none of gets its old value too
    assert [((s or {}).get("traffic") or {}).get("overtake") for s in seen] == ["never", "never", None]
    assert [((s or {}).get("traffic") or {}).get("max_green", "<absent>") for s in seen] == [
        None, None, "<absent>"]


def test_a_study_run_from_before_a_traffic_setting_is_resumed_in_the_old_world(real_run, tmp_path):
    """Resuming goes on in the world a run was trained in: a study run whose saved config predates
    a setting of ADDED_AFTER_THE_STUDY_BEGAN gets the old value, one that names it keeps its own,
    a run outside the study is left as saved."""
    from drivemind.training.run import resumed_config

    got = []
    for run in runs_around_a_traffic_setting(real_run, tmp_path):
        cfg, entry = resumed_config(run, {"total_timesteps": 500})
        assert entry is not None and cfg["total_timesteps"] == 500
        traffic = ((cfg.get("sim") or {}).get("traffic")) or {}
        got.append((traffic.get("junction_release"), traffic.get("overtake"),
                    traffic.get("max_green", "<absent>")))
    assert got == [("connector", "never", None), ("crossing", "never", None),
                   (None, None, "<absent>")]


def test_a_study_run_from_before_a_traffic_setting_is_one_method_with_the_runs_that_pin_it(real_run, tmp_path):
    """The report groups by the world a run trained in: a study run whose config predates
    ``sim.traffic.junction_release`` and one that pins the old value are one method (two seeds);
    one that sets the new value is another method."""
    for name, seed, traffic in (("old", 0, None), ("pinned", 1, "connector"), ("new", 2, "crossing")):
        extra = {"study": {"name": "table1"}, "sim": {"backend": "lite"}}  # saved before the key
        if traffic:
            extra["sim"] = {"backend": "lite", "traffic": {"junction_release": traffic}}
        make_run(real_run, tmp_path / name, seed=seed, reward=CHEN, extra=extra,
                 evals={T2: records(seed, 0)})
    rep = build_report(find_runs([tmp_path]))
    by_label = {m["label"]: sorted(m["seeds"]) for m in rep["methods"]}
    assert by_label == {"chen-sac [sim.traffic.junction_release=connector]": [0, 1],
                        "chen-sac [sim.traffic.junction_release=crossing]": [2]}


def test_a_plain_run_saves_the_traffic_settings_it_trained_with(real_run):
    """A run trained now records each setting added after the study began in its config.yaml (with
    the default it used), so a later change of default leaves its evaluation and resume alone."""
    from drivemind.sim.config import TrafficParams
    from drivemind.training.run import resumed_config

    saved = flatten(yaml.safe_load((real_run / "config.yaml").read_text()))
    for key in ADDED_AFTER_THE_STUDY_BEGAN:
        assert saved[key] == getattr(TrafficParams(), key.rsplit(".", 1)[1])
    cfg, _ = resumed_config(real_run, {"total_timesteps": 200})
    assert flatten(cfg)["sim.traffic.junction_release"] == saved["sim.traffic.junction_release"]


def test_report_lists_what_the_study_still_lacks_with_the_commands(study, tmp_path, capsys):
    """report.py --todo: per table the seeds not trained (a failed run counts as not trained), with
    the sweep command and the method's mean wall time so far, and the evaluations not on disk."""
    root, a, b = study
    res = load_script("report").main([str(a), str(b), "--out", str(tmp_path / "rep"), "--todo", "--json"])
    out = capsys.readouterr().out
    assert json.loads(out.strip().splitlines()[-1])["todo"] == json.loads(json.dumps(res["todo"]))
    train = {(i["table"], i["method"]): i for i in res["todo"] if i["what"] == "train"}
    ev = {(i["method"], i["eval"]): i["seeds"] for i in res["todo"] if i["what"] == "evaluate"}
    assert ("table1", "drivemind") not in train and ("table2", "drivemind reward.ablate=aicr") not in train
    chen = train["table1", "chen"]
    walls = [json.loads((b / n / "summary.json").read_text())["wall_s_total"] for n in ("0-chen-s0", "1-chen-s1")]
    assert chen["seeds"] == [2] and chen["est_minutes"] == pytest.approx(sum(walls) / 2 / 60, abs=0.05)
    assert chen["command"] == ("python scripts/train.py -m experiment=study_table1 "
                               "'hydra.sweeper.params.reward=\"chen\"' 'hydra.sweeper.params.seed=\"2\"'")
    assert train["table1", "tirl"]["seeds"] == [0, 1, 2] and train["table1", "tirl"]["est_minutes"] is None
    assert train["table2", "drivemind reward.ablate=hvfr"]["command"] == (
        "python scripts/train.py -m experiment=study_table1 reward=drivemind reward.ablate=hvfr seed=0,1,2")
    assert train["ppo", "drivemind"]["command"] == "python scripts/train.py -m experiment=study_ppo reward=drivemind seed=0,1,2"
    assert train["guidance", "found_rl_clip algo.guidance=both"]["command"].endswith(" algo.guidance=both")
    # Town01-dense is on disk for every drivemind seed, and for NoAICR but seed 1; Town03 for none
    assert ("drivemind", "Town01-dense") not in ev and ev["drivemind", "Town03-regular"] == [0, 1, 2]
    assert ev["drivemind reward.ablate=aicr", "Town01-dense"] == [1]
    assert "todo table1: train chen seed(s) 2, ~" in out


def test_todo_resumes_a_run_cut_short_with_a_checkpoint_and_restarts_a_failed_one(study, real_run, tmp_path, capsys):
    """report.py --todo: a seed whose run stopped short (killed: no summary.json) with a checkpoint
    is to be continued (``resume=<run dir>``, the checkpoint's steps), not trained again; a run
    that failed with an error is trained again even with a checkpoint on disk."""
    from drivemind.training.callbacks import latest_checkpoint

    root, a, b = study
    ck = latest_checkpoint(real_run)
    assert ck and ck["steps"] > 0
    killed = make_run(real_run, tmp_path / "c" / "2-chen-s2", seed=2, reward=CHEN)
    (killed / "summary.json").unlink()  # killed with its session: no summary, a checkpoint
    shutil.copytree(real_run / "checkpoints", killed / "checkpoints")
    res = load_script("report").main([str(a), str(b), str(tmp_path / "c"), "--out", str(tmp_path / "rep"),
                                      "--todo"])
    out = capsys.readouterr().out
    [resume] = [i for i in res["todo"] if i["what"] == "resume"]
    assert (resume["table"], resume["method"], resume["seeds"]) == ("table1", "chen", [2])
    assert resume["steps"] == ck["steps"] and resume["command"] == f"python scripts/train.py resume={killed}"
    t1_train = [(i["table"], i["method"]) for i in res["todo"] if i["what"] == "train"]
    assert ("table1", "chen") not in t1_train
    assert f"todo table1: resume chen seed 2 from its checkpoint at {ck['steps']} env steps" in out

    failed = make_run(real_run, tmp_path / "d" / "2-chen-s2", seed=2, reward=CHEN,
                      status="failed: RuntimeError: boom")
    shutil.copytree(real_run / "checkpoints", failed / "checkpoints")
    res = load_script("report").main([str(a), str(b), str(tmp_path / "d"), "--out", str(tmp_path / "rep2"),
                                      "--todo"])
    assert not [i for i in res["todo"] if i["what"] == "resume"]
    [chen] = [i for i in res["todo"] if (i["what"], i["table"], i["method"]) == ("train", "table1", "chen")]
    assert chen["seeds"] == [2]


def test_every_todo_command_composes_as_hydra_composes_it_before_a_sweep(study, tmp_path):
    """Before it sweeps, Hydra composes the command line alone (the sweeper's params not yet
    applied): each training command --todo prints must compose that way, and again with the first
    value of each of its sweeps (a job). `reward.ablate=...` next to a reward only in the params
    failed there ("Key 'ablate' is not in struct")."""
    import shlex

    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    root, a, b = study
    res = load_script("report").main([str(a), str(b), "--out", str(tmp_path / "rep"), "--todo"])
    commands = {i["command"] for i in res["todo"] if i["what"] == "train"}
    assert any("reward.ablate" in c for c in commands) and any("study_ppo" in c for c in commands)
    conf = str(Path(__file__).resolve().parents[1] / "configs")
    for c in commands:
        words = shlex.split(c)
        assert words[:4] == ["python", "scripts/train.py", "-m", words[3]]
        overrides = words[3:]
        plain = [o for o in overrides if not o.startswith("hydra.")]
        with initialize_config_dir(config_dir=conf, version_base=None):
            # the pre-sweep compose, as `train.py -m` does it
            GlobalHydra.instance().hydra.compose_config("config", overrides,
                                                        run_mode=RunMode.MULTIRUN)
            job = [o.split("=", 1)[0] + "=" + o.split("=", 1)[1].strip('"').split(",")[0]
                   for o in plain]
            params = [o.split("=", 1) for o in overrides if o.startswith("hydra.sweeper.params.")]
            job += [k.removeprefix("hydra.sweeper.params.") + "=" + v.strip('"').split(",")[0]
                    for k, v in params]
            cfg = compose("config", overrides=job)
            if "reward.ablate=" in c:
                assert cfg.reward.ablate == c.split("reward.ablate=")[1].split()[0]


def test_a_key_a_table_does_not_set_matches_runs_whose_config_lacks_it():
    """Once a guided SAC run makes ``algo.guidance`` split the report's methods, the PPO runs
    (whose configs have no such key: the report's "<unset>") are still PPO's table rows; a guided
    run is only picked where a block asks for ``both``."""
    from drivemind.evaluation.results_md import pick
    from drivemind.evaluation.study import _MISSING

    def row(reward, algo, guidance):
        return {"reward": reward, "ablate": None, "algo": algo, "town": "Town02", "density": "regular",
                "extra": {"algo.guidance": guidance}, "n": 3}

    ppo, sac, guided = row("chen", "ppo", _MISSING), row("found_rl_clip", "sac", "none"), \
        row("found_rl_clip", "sac", "both")
    rows = [guided, ppo, sac]
    where = dict(town="Town02", density="regular")
    assert pick(rows, {}, reward="chen", algo="ppo", **where) is ppo  # PPO's protocol lacks the key
    assert pick(rows, {"algo.guidance": "none"}, reward="found_rl_clip", algo="sac", **where) is sac
    assert pick(rows, {"algo.guidance": "none"}, reward="found_rl_clip", algo="sac",
                overrides={"algo.guidance": "both"}, **where) is guided
    assert pick(rows, {"algo.guidance": "none"}, reward="chen", algo="ppo", **where) is None
