"""Training runs end to end: the Hydra configs, ``drivemind.training.train`` (run directory,
checkpoints, logs, resume, SIGINT), the compatibility checks and the command-line entry points
``scripts/train.py`` and ``scripts/eval.py``.

Every run is tiny (48 px BEV, 32-unit heads, a few hundred env steps on the built-in grid town
with no traffic); the trained runs are shared between tests through module fixtures.
"""

from __future__ import annotations

import csv
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml
from hydra_config import config

import drivemind.training.run as run_mod
from drivemind.training import train
from drivemind.training.build import check_compatible, env_kwargs, observation_signature
from drivemind.training.callbacks import EpisodeMetrics, latest_checkpoint, save_checkpoint

REPO = Path(__file__).resolve().parents[1]
TINY = ["logger=quiet", "progress_bar=false", "density=empty", "obs.bev.size=48", "obs.features=null",
        "algo.policy_kwargs.features_extractor_kwargs.bev_dim=32", "algo.policy_kwargs.net_arch=[32]",
        "+env.max_episode_steps=30", "log_interval=1"]
SAC = ["algo.learning_starts=50", "algo.batch_size=16", "algo.buffer_size=1000"]
PPO = ["algo=ppo", "algo.n_steps=64", "algo.batch_size=32", "algo.n_epochs=1"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def script_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env["NUMBA_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env.pop("DRIVEMIND_DEBUG", None)
    return env


def script(name: str, *args: str, timeout: float = 120, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], cwd=cwd,
                          env=script_env(), capture_output=True, text=True, timeout=timeout)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sac") / "run"
    cfg = config(*TINY, *SAC, "total_timesteps=150")
    return run_dir, train(cfg, run_dir)


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ppo") / "run"
    cfg = config(*TINY, *PPO, "total_timesteps=128", "reward=chen")
    return run_dir, train(cfg, run_dir)


# ---------------------------------------------------------------------------- end to end


def check_run_dir(run_dir: Path, summary: dict, algo: str, reward: str, steps: int):
    assert summary["status"] == "finished"
    assert summary["steps"] == summary["total_timesteps"] == steps
    assert summary["algo"] == algo and summary["reward"] == reward
    assert json.loads((run_dir / "summary.json").read_text()) == json.loads(json.dumps(summary, default=str))
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["algo"]["name"] == algo and saved["reward"]["name"] == reward
    assert saved["obs"]["bev"]["size"] == 48 and saved["total_timesteps"] == steps
    sig = json.loads((run_dir / "obs_signature.json").read_text())
    assert sig["bev"][0][1:] == [48, 48] and sig["bev"][1] == "uint8"
    latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    assert latest["steps"] == steps and latest["model"] == f"model_{steps}.zip"
    assert (run_dir / "checkpoints" / latest["model"]).is_file()
    assert summary["checkpoint"]["steps"] == steps
    logs = run_dir / "logs"
    assert list(logs.glob("events.out.tfevents.*")), "no TensorBoard events file"
    rows = read_csv(logs / "progress.csv")
    assert rows and "time/total_timesteps" in rows[0]
    return latest, rows


def test_train_sac_end_to_end(sac_run):
    run_dir, summary = sac_run
    latest, rows = check_run_dir(run_dir, summary, "sac", "drivemind_kinematic", 150)
    assert latest["buffer"] == "buffer_150.pkl" and (run_dir / "checkpoints" / latest["buffer"]).is_file()
    assert any(r.get("train/critic_loss") for r in rows), "SAC never trained (learning_starts=50)"
    assert summary["resumed_from"] is None and summary["nonfinite_rewards"] == 0
    # the code it ran: this checkout's commit (the tests run from the repository)
    import subprocess
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    [code] = summary["code"]
    assert code["commit"] == (head or None) and code["drivemind"] and isinstance(code["dirty"], (bool, type(None)))
    # and the machine it ran on (float rounding depends on the CPU's vector instructions)
    import os

    from drivemind.paths import _ISA_FLAGS, machine_info
    assert code["machine"] == machine_info() and code["machine"]["cores"] == os.cpu_count()
    assert code["machine"]["torch"] and set(code["machine"]["isa"]) <= set(_ISA_FLAGS)


def test_train_ppo_end_to_end(ppo_run):
    run_dir, summary = ppo_run
    latest, rows = check_run_dir(run_dir, summary, "ppo", "chen", 128)
    assert "buffer" not in latest and not list((run_dir / "checkpoints").glob("buffer_*"))
    assert len(rows) == 2 and "reward/mean" in rows[0]  # one row per 64-step rollout
    assert {"reward_terms/speed", "reward_terms/lane", "reward_terms/collision"} <= set(rows[0])


def test_unknown_algo_argument_is_named(tmp_path):
    with pytest.raises(TypeError, match=r"(?s)algo=sac.*nope_arg.*keys under 'algo'"):
        train(config(*TINY, *SAC, "total_timesteps=100", "+algo.nope_arg=1"), tmp_path / "run")


# ---------------------------------------------------------------------------- resume


def test_resume_continues_with_replay_buffer(sac_run, tmp_path):
    src, first = sac_run
    run_dir = tmp_path / "run"
    shutil.copytree(src, run_dir)
    rows_before = read_csv(run_dir / "logs" / "progress.csv")
    episodes_before = read_csv(run_dir / "logs" / "episodes.csv")
    # only total_timesteps is taken from the new config: the rest comes from the run's config.yaml
    summary = train(config("total_timesteps=250", "algo=ppo", "obs.bev.size=64"), run_dir, resume=True)
    assert summary["status"] == "finished" and summary["algo"] == "sac"
    assert summary["resumed_from"] == 150 and summary["steps"] == 250
    assert len(summary["code"]) == 2  # one entry per invocation: the first run's and the resume's
    assert summary["wall_s_total"] == pytest.approx(first["wall_s"] + summary["wall_s"], abs=0.11)
    latest = latest_checkpoint(run_dir)
    assert latest["steps"] == 250
    with open(latest["buffer"], "rb") as f:
        buf = pickle.load(f)
    assert len(buf.slots()) > 150, "the replay buffer was not restored on resume"
    # the logs continue: the rows before the resume are kept, new ones follow
    rows = read_csv(run_dir / "logs" / "progress.csv")
    steps = [int(float(r["time/total_timesteps"])) for r in rows]
    assert len(rows) > len(rows_before) and rows[:len(rows_before)] == [
        {k: r.get(k, "") for k in rows[0]} for r in rows_before]
    assert min(steps) <= 150 < max(steps) <= 250
    assert len(list((run_dir / "logs").glob("events.out.tfevents.*"))) == 2
    episodes = read_csv(run_dir / "logs" / "episodes.csv")
    assert episodes[:len(episodes_before)] == episodes_before
    assert int(episodes[-1]["timesteps"]) > 150


def test_resume_needs_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train(config(*TINY, "total_timesteps=10"), tmp_path, resume=True)


def test_a_new_run_never_overwrites_a_finished_one(sac_run, tmp_path):
    """Training without resume into a directory that holds a run stops before writing anything
    (two `bench.py learn` variants once shared a directory and the second overwrote the first)."""
    src, _ = sac_run
    run_dir = tmp_path / "run"
    shutil.copytree(src, run_dir)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(FileExistsError, match="already holds a training run.*resume="):
        train(config(*TINY, *SAC, "total_timesteps=100"), run_dir)
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def _complete_rows(path: Path) -> list[dict]:
    """The rows of a CSV another process is appending to (a last line without its newline is
    not a row yet)."""
    if not path.exists():
        return []
    text = path.read_text()
    return list(csv.DictReader(text[:text.rfind("\n") + 1].splitlines()))


def test_a_killed_run_resumes_with_its_time_code_and_one_episode_history(tmp_path):
    """SIGKILL (a lost machine, a session's end) leaves no summary and episodes logged after the
    last checkpoint. The resumed run counts the killed invocation's time up to the checkpoint and
    its code, and the episodes it will drive anew leave episodes.csv for episodes.discarded.csv."""
    run_dir = tmp_path / "run"
    args = [*TINY, *SAC, "algo.learning_starts=100000", "total_timesteps=100001", "checkpoint_every=60",
            "eval.at_end=false", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "train.py"), *args], cwd=REPO,
                            env=script_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    latest, episodes = None, []
    try:
        deadline = time.monotonic() + 90
        while True:  # frozen while we look, so no checkpoint or row can land in between
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no episode after a checkpoint within 90 s"
            time.sleep(0.2)
            proc.send_signal(signal.SIGSTOP)
            latest = latest_checkpoint(run_dir)
            episodes = _complete_rows(run_dir / "logs" / "episodes.csv")
            if latest and latest["steps"] >= 120 and any(int(r["timesteps"]) > latest["steps"] for r in episodes):
                proc.kill()
                break
            proc.send_signal(signal.SIGCONT)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    n = latest["steps"]
    assert not (run_dir / "summary.json").exists()
    assert latest["wall_s_total"] > 0 and len(latest["code"]) == 1

    summary = train(config(f"total_timesteps={n + 40}"), run_dir, resume=True)
    assert summary["status"] == "finished" and summary["resumed_from"] == n and summary["steps"] == n + 40
    assert set(summary["checkpoint"]) == {"steps", "model", "buffer"}  # the record is the summary's own
    assert len(summary["code"]) == 2 and summary["code"][0] == latest["code"][0]
    assert summary["wall_s_total"] == pytest.approx(latest["wall_s_total"] + summary["wall_s"], abs=0.11)
    kept = [r for r in episodes if int(r["timesteps"]) <= n]
    late = [r for r in episodes if int(r["timesteps"]) > n]
    rows = read_csv(run_dir / "logs" / "episodes.csv")
    assert rows[:len(kept)] == kept and len(rows) > len(kept)
    steps = [int(r["timesteps"]) for r in rows]
    walls = [float(r["wall_s"]) for r in rows]
    assert steps == sorted(steps) and walls == sorted(walls), "one history: steps and wall time only go up"
    assert float(rows[len(kept)]["wall_s"]) > latest["wall_s_total"]
    assert read_csv(run_dir / "logs" / "episodes.discarded.csv") == late


# ---------------------------------------------------------------------------- SIGINT


def test_sigint_saves_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    args = [*TINY, *SAC, "algo.learning_starts=100000", "total_timesteps=100001", "checkpoint_every=20",
            "eval.at_end=true", "eval.routes=[0]", "eval.video_route=null", "+eval.max_steps_per_route=20",
            f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "train.py"), *args], cwd=REPO,
                            env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "checkpoints" / "latest.json").exists():  # training is under way
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 60 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "stopped by SIGINT"
    n = summary["steps"]
    assert 20 <= n < 100000 and "eval" not in summary
    assert "SIGINT received" in out
    assert f"checkpoint saved at {n} steps" in out and f"resume={run_dir}" in out
    latest = latest_checkpoint(run_dir)
    assert latest["steps"] == n and Path(latest["model"]).is_file() and Path(latest["buffer"]).is_file()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "stopped by SIGINT"

    # continue through the entry point: the run's own config (48 px, eval at the end) applies
    res = script("train.py", f"resume={run_dir}", f"total_timesteps={n + 50}",
                 f"hydra.run.dir={tmp_path / 'hydra_resume'}")
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished" and summary["steps"] == n + 50 and summary["resumed_from"] == n
    assert set(summary["eval"]) >= {"AS", "RC", "TD", "CS", "SR", "CR"}
    assert (run_dir / "eval" / "grid-empty" / "metrics.json").is_file()
    assert latest_checkpoint(run_dir)["steps"] == n + 50


# ---------------------------------------------------------------------------- failures mid-run


def test_crash_mid_run_is_not_reported_finished(tmp_path, monkeypatch):
    class Boom(EpisodeMetrics):
        def _on_step(self):
            if self.model.num_timesteps >= 40:
                raise RuntimeError("boom at 40")
            return super()._on_step()

    monkeypatch.setattr(run_mod, "EpisodeMetrics", Boom)
    before = signal.getsignal(signal.SIGINT)
    threads = threading.active_count()
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="boom at 40"):
        train(config(*TINY, *PPO, "total_timesteps=128"), run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"].startswith("failed") and "boom at 40" in summary["status"]
    assert summary["steps"] == 40 and latest_checkpoint(run_dir)["steps"] == 40
    assert signal.getsignal(signal.SIGINT) is before, "the SIGINT handler was left installed"
    assert threading.active_count() == threads, "the TensorBoard writer thread was left running"


# ---------------------------------------------------------------------------- observations


def dict_space(size: int) -> gym.spaces.Dict:
    return gym.spaces.Dict({"bev": gym.spaces.Box(0, 255, (15, size, size), np.uint8),
                            "ego": gym.spaces.Box(-1, 1, (3,), np.float32)})


def test_check_compatible_names_both_signatures():
    saved = observation_signature(dict_space(48))
    assert saved == {"bev": [[15, 48, 48], "uint8"], "ego": [[3], "float32"]}
    check_compatible(json.loads(json.dumps(saved)), dict_space(48), "run")  # as read back from JSON
    with pytest.raises(ValueError) as e:
        check_compatible(saved, dict_space(40), "some/run")
    msg = str(e.value)
    assert "some/run" in msg and "[15, 48, 48]" in msg and "[15, 40, 40]" in msg and "obs" in msg


def test_resume_with_changed_obs_fails_clearly(ppo_run, tmp_path):
    src, _ = ppo_run
    run_dir = tmp_path / "run"
    shutil.copytree(src, run_dir)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["obs"]["bev"]["size"] = 40
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.raises(ValueError, match=r"(?s)trained on observations .*48, 48.* this config gives .*40, 40"):
        train({"total_timesteps": 200}, run_dir, resume=True)
    assert latest_checkpoint(run_dir)["steps"] == 128  # nothing was overwritten


def test_evaluate_run_refuses_other_observations_before_any_route(sac_run, tmp_path):
    """A run whose config no longer gives the checkpoint's observations (here its BEV size edited)
    stops with the compatibility error from the evaluation's own env, before any route runs or
    any report is written."""
    from drivemind.training.evaluate import evaluate_run

    run_dir = tmp_path / "run"
    shutil.copytree(sac_run[0], run_dir)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["obs"]["bev"]["size"] = 40
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match=f"(?s){run_dir}.*trained on observations"):
        evaluate_run(run_dir, routes=[0], video_route=None, progress=False, device="cpu")
    assert not (run_dir / "eval").exists()


def test_load_policy_checks_env(sac_run):
    from drivemind.envs import DriveEnv
    from drivemind.training.evaluate import check_policy_env, load_policy

    run_dir, _ = sac_run
    policy, model = load_policy(run_dir, device="cpu")
    assert not model.policy.training
    assert all(not p.requires_grad for p in model.policy.parameters())
    assert policy.config["algo"]["name"] == "sac" and policy.obs_signature["bev"][0] == [15, 48, 48]
    kw = env_kwargs(policy.config)
    env = DriveEnv("grid", "empty", mode="eval", **kw)
    try:
        check_policy_env(policy, env.observation_space, run_dir)  # its own obs: fine
        obs, _ = env.reset(seed=0)
        a = policy(obs)
        assert a.shape == (2,) and np.array_equal(a, policy(obs))  # deterministic
    finally:
        env.close()
    kw["bev"] = {**kw["bev"], "size": 40}
    other = DriveEnv("grid", "empty", mode="eval", **kw)
    try:
        with pytest.raises(ValueError, match=f"(?s){run_dir}.*trained on observations"):
            check_policy_env(policy, other.observation_space, run_dir)
    finally:
        other.close()
    with pytest.raises(FileNotFoundError, match="not a training run directory"):
        load_policy(run_dir / "checkpoints")


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("override, expected", [
    ("reward=nope", ["chen", "revolve", "drivemind_kinematic"]),
    ("algo=nope", ["sac", "ppo"]),
    ("town=nope", ["grid", "Town01"]),
    ("density=nope", ["regular", "empty"]),
])
def test_unknown_group_choice_lists_options(override, expected):
    res = script("train.py", override, "--cfg", "job", timeout=60)
    assert res.returncode != 0
    text = res.stdout + res.stderr
    assert f"{override.split('=')[0]}/nope" in text
    for name in expected:
        assert f"\t{name}\n" in text or f" {name}\n" in text, (name, text)


def test_known_group_choice_composes():
    res = script("train.py", "reward=revolve", "algo=ppo", "--cfg", "job", timeout=60)
    assert res.returncode == 0, res.stderr
    cfg = yaml.safe_load(res.stdout)
    assert cfg["reward"]["name"] == "revolve" and cfg["algo"]["name"] == "ppo"


def test_unknown_reward_param_names_valid_ones(tmp_path):
    run_dir = tmp_path / "run"
    res = script("train.py", *TINY, *SAC, "reward=chen", "+reward.params.w_sped=1",
                 "total_timesteps=100", f"hydra.run.dir={run_dir}")
    assert res.returncode != 0
    text = res.stdout + res.stderr
    assert "w_sped" in text
    for p in ("w_speed", "v_max_kmh", "w_collision", "w_lane", "w_steer"):
        assert p in text
    assert not run_dir.exists()  # checked before Hydra creates the run directory


# ---------------------------------------------------------------------------- evaluation


def test_eval_script_on_trained_run(sac_run):
    run_dir, _ = sac_run
    res = script("eval.py", f"run={run_dir}", "routes=[0]", "max_steps_per_route=50", "video_route=0",
                 "device=cpu")
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads(res.stdout.strip().splitlines()[-1])
    out = run_dir / "eval" / "grid-empty"
    assert Path(metrics["out"]) == out
    for k in ("AS", "RC", "TD", "CS", "SR", "CR"):
        assert k in metrics
    assert 0.0 <= metrics["RC"] <= 1.0 and metrics["episodes"] == 1
    assert 1 <= metrics["steps"] <= 50
    for f in ("metrics.json", "routes.csv", "metrics.md", "metrics.png", "route_0.gif"):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["metrics"]["RC"] == metrics["RC"] and saved["meta"]["routes"] == [0]
    assert len(read_csv(out / "routes.csv")) == 1


def test_eval_script_autopilot(tmp_path):
    out = tmp_path / "ap"
    res = script("eval.py", "policy=autopilot", "town=grid", "density=empty", "routes=[0]",
                 "video_route=null", f"out={out}")
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads(res.stdout.strip().splitlines()[-1])
    assert metrics["RC"] == 1.0 and metrics["CS"] == 0.0 and metrics["episodes"] == 1
    assert (out / "metrics.json").is_file() and (out / "routes.csv").is_file()


def test_eval_script_without_any_run_says_what_to_do(tmp_path):
    res = script("eval.py", "routes=[0]", timeout=60, cwd=tmp_path)  # no outputs/ here
    text = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in text
    assert "no trained run to evaluate" in text and str(tmp_path / "outputs") in text
    for hint in ("python scripts/train.py", "run=", "policy=autopilot"):
        assert hint in text


def test_card_eval_line_right_after_train(tmp_path):
    """The project card's two lines, from a fresh directory: `python scripts/train.py`, then
    `python scripts/eval.py town=Town05 density=dense` (no run=, no map path: the newest run and
    the shipped Town05). Kept tiny: 200 steps, one route, 30 steps of it."""
    env_no_maps = {"DRIVEMIND_MAP_PATH": "", "CARLA_ROOT": ""}
    old = {k: os.environ.get(k) for k in env_no_maps}
    os.environ.update(env_no_maps)
    try:
        res = script("train.py", *TINY, *SAC, "total_timesteps=200", cwd=tmp_path, timeout=240)
        assert res.returncode == 0, res.stderr[-3000:]
        (newest,) = (tmp_path / "outputs" / "runs").glob("*/*")
        # an older run (its checkpoint written an hour before) and a later one with no checkpoint
        # yet (still starting, or crashed): neither is picked
        older = newest.parent / "00-00-00-older"
        shutil.copytree(newest, older)
        t = time.time() - 3600
        os.utime(older / "checkpoints" / "latest.json", (t, t))
        (newest.parent / "23-59-59-no-checkpoint").mkdir()
        shutil.copy(newest / "config.yaml", newest.parent / "23-59-59-no-checkpoint")
        ev = script("eval.py", "town=Town05", "density=dense", "routes=[0]", "max_steps_per_route=30",
                    "video_route=null", "device=cpu", cwd=tmp_path, timeout=240)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert f"evaluating the newest training run, {newest.resolve()}" in ev.stdout
    metrics = json.loads(ev.stdout.strip().splitlines()[-1])
    assert Path(metrics["out"]) == newest.resolve() / "eval" / "Town05-dense"
    assert (newest / "eval" / "Town05-dense" / "metrics.json").is_file()
    assert metrics["episodes"] == 1 and 1 <= metrics["steps"] <= 30


# ---------------------------------------------------------------------------- checkpoints


class FakeModel:
    """What save_checkpoint uses of a model: num_timesteps, save, replay_buffer, save_replay_buffer."""

    def __init__(self, fail_buffer: bool = False):
        self.num_timesteps = 0
        self.replay_buffer = object()
        self.fail_buffer = fail_buffer

    def save(self, path):
        Path(path).write_text(f"model {self.num_timesteps}")

    def save_replay_buffer(self, path):
        Path(path).write_text("partial")
        if self.fail_buffer:
            raise OSError("disk full")


def test_save_checkpoint_keeps_newest(tmp_path):
    ck = tmp_path / "checkpoints"
    m = FakeModel()
    for n in (10, 20, 30):
        m.num_timesteps = n
        entry = save_checkpoint(m, ck, keep=2)
    assert entry == {"steps": 30, "model": "model_30.zip", "buffer": "buffer_30.pkl"}
    assert sorted(p.name for p in ck.iterdir()) == ["buffer_20.pkl", "buffer_30.pkl", "latest.json",
                                                    "model_20.zip", "model_30.zip"]
    latest = latest_checkpoint(tmp_path)
    assert latest["steps"] == 30 and Path(latest["model"]).read_text() == "model 30"
    m.num_timesteps = 40
    save_checkpoint(m, ck, with_buffer=False, keep=1)
    assert sorted(p.name for p in ck.iterdir()) == ["latest.json", "model_40.zip"]
    assert "buffer" not in latest_checkpoint(tmp_path)


def test_stale_tmp_never_becomes_latest(tmp_path):
    ck = tmp_path / "checkpoints"
    m = FakeModel()
    m.num_timesteps = 10
    save_checkpoint(m, ck)
    # leftovers of a save killed half way
    (ck / "latest.json.tmp").write_text(json.dumps({"steps": 999, "model": "model_999.zip"}))
    (ck / ".model_999.zip").write_text("half")
    (ck / ".buffer_999.pkl").write_text("half")
    assert latest_checkpoint(tmp_path)["steps"] == 10
    m.num_timesteps = 20
    save_checkpoint(m, ck)
    assert latest_checkpoint(tmp_path)["steps"] == 20
    assert not (ck / "model_999.zip").exists() and (ck / "model_10.zip").exists()
    # a save that fails half way leaves the previous checkpoint in place
    bad = FakeModel(fail_buffer=True)
    bad.num_timesteps = 30
    with pytest.raises(OSError):
        save_checkpoint(bad, ck)
    latest = latest_checkpoint(tmp_path)
    assert latest["steps"] == 20 and Path(latest["model"]).exists() and Path(latest["buffer"]).exists()
    assert not (ck / "buffer_30.pkl").exists()


def test_save_checkpoint_never_prunes_the_new_one(tmp_path):
    """A new run in a directory that holds an older run's later checkpoints."""
    ck = tmp_path / "checkpoints"
    m = FakeModel()
    for n in (500, 600):
        m.num_timesteps = n
        save_checkpoint(m, ck)
    m.num_timesteps = 50
    save_checkpoint(m, ck, keep=2)
    latest = latest_checkpoint(tmp_path)
    assert latest["steps"] == 50 and Path(latest["model"]).read_text() == "model 50"
    assert Path(latest["buffer"]).exists()
    assert len(list(ck.glob("model_*.zip"))) == 2


# ---------------------------------------------------------------------------- episode metrics


def test_episode_metrics_logged(sac_run):
    run_dir, summary = sac_run
    episodes = read_csv(run_dir / "logs" / "episodes.csv")
    assert len(episodes) >= 150 // 30  # episodes end within 30 steps (env.max_episode_steps)
    steps = [int(r["timesteps"]) for r in episodes]
    assert steps == sorted(steps) and 0 < steps[0] <= 30 and steps[-1] <= 150
    assert all(0 < b - a <= 30 for a, b in zip(steps, steps[1:]))
    assert "collision_speeds_kmh" in episodes[0]
    json.loads(episodes[0]["collision_speeds_kmh"])
    rows = read_csv(run_dir / "logs" / "progress.csv")
    for k in ("episode/AS", "episode/RC", "episode/TD", "episode/CR"):
        assert k in rows[0] and any(r[k] for r in rows), k
    rc = [float(r["episode/RC"]) for r in rows if r["episode/RC"]]
    assert all(0.0 <= v <= 1.0 for v in rc)
    em = summary["episode_metrics"]
    assert em and "RC" in em and em["episodes"] == min(len(episodes), 20)


def test_experiments_override_the_defaults_and_the_command_line_wins():
    paper = config("experiment=paper")
    assert paper["total_timesteps"] == 1_000_000 and paper["town"]["name"] == "Town02"
    assert paper["obs"]["bev"]["preset"] == "paper" and paper["algo"]["batch_size"] == 256
    assert paper["algo"]["policy_kwargs"]["features_extractor_kwargs"]["bev_dim"] == 1024
    check = config("experiment=learning_check", "reward=hvfr", "total_timesteps=123")
    assert check["density"]["name"] == "empty" and check["eval"]["at_end"] is True
    assert check["reward"]["name"] == "hvfr" and check["total_timesteps"] == 123
    ppo = config("experiment=paper_ppo")
    assert ppo["algo"]["name"] == "ppo" and ppo["vec_env"] == "subproc"
    assert config()["total_timesteps"] == 20000  # the CPU default


def test_multirun_with_the_basic_launcher(tmp_path):
    """`-m` sweeps run one job per combination, each in its own run directory."""
    r = script("train.py", "-m", *TINY, *SAC, "total_timesteps=60", "algo.learning_starts=30",
               "reward=chen,tirl", f"hydra.sweep.dir={tmp_path}", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = sorted(p.parent for p in tmp_path.glob("*/summary.json"))
    assert len(runs) == 2
    rewards = sorted(json.loads((p / "summary.json").read_text())["reward"] for p in runs)
    assert rewards == ["chen", "tirl"]
    assert all((p / "checkpoints" / "latest.json").exists() for p in runs)


def test_default_logger_writes_tensorboard_and_wandb_offline(tmp_path):
    tiny = [o for o in TINY if not o.startswith("logger=")]
    cfg = config(*tiny, *SAC, "total_timesteps=60", "algo.learning_starts=30")
    assert cfg["logger"]["wandb"]["mode"] == "offline"  # the default
    train(cfg, tmp_path / "run")
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert list((tmp_path / "run" / "logs").glob("events.out.tfevents.*"))
    assert (tmp_path / "run" / "wandb_id").read_text().strip()


def test_semantic_reward_through_the_config_gets_an_embedding_slot(tmp_path):
    """reward=drivemind_static with the default (96 px) BEV: the buffer is sized for the shipped
    BEV-CLIP's embeddings without any algo.embedding_dim setting."""
    tiny = [o for o in TINY if not o.startswith("obs.bev.size")]
    cfg = config(*tiny, *SAC, "total_timesteps=60", "algo.learning_starts=30",
                 "reward=drivemind_static")
    assert cfg["algo"]["embedding_dim"] is None
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "finished" and summary["reward"] == "drivemind_static"
    with open(latest_checkpoint(tmp_path / "run")["buffer"], "rb") as f:
        buf = pickle.load(f)
    assert buf.embedding_dim == 384
    lab = buf.slots(2)
    assert len(lab) > 0
    assert np.allclose(np.linalg.norm(buf.embeddings.reshape(-1, 384)[lab].astype(np.float32), axis=1),
                       1.0, atol=1e-2)


@pytest.mark.parametrize("algo", ["sac", "ppo"])
def test_carl_reward_trains_through_the_config(tmp_path, algo):
    """reward=carl from the Hydra config with SAC and PPO: its env keys reach the env, its terms
    reach the logs (relabelled from the stored facts), and nothing non-finite comes out."""
    steps = ["total_timesteps=192"] + (SAC if algo == "sac" else PPO)
    run_dir = tmp_path / "run"
    summary = train(config(*TINY, *steps, "reward=carl", "density=regular"), run_dir)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    assert summary["status"] == "finished" and summary["reward"] == "carl"
    assert summary["nonfinite_rewards"] == 0
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["env"]["terminate_red_light"] is True
    rows = read_csv(run_dir / "logs" / "progress.csv")
    keys = set().union(*rows)
    prefix = "reward/" if algo == "sac" else "reward_terms/"  # each agent's log names
    assert {prefix + t for t in ("progress", "speeding", "comfort", "terminal")} <= keys
