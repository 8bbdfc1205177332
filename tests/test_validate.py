"""Settings checked before a run starts (``drivemind.training.validate``): one rule per test case on
the real Hydra configs, ``train()`` refusing before it writes, and ``scripts/train.py`` exiting
with one line and no run directory (single run, multirun, resume)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hydra_config import config

from drivemind.training import ConfigError, config_problems, train, validate_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def base():
    return {"sac": config(), "ppo": config("algo=ppo")}


def with_values(cfg: dict, **values) -> dict:
    """A copy of ``cfg`` with dotted keys set (``algo__batch_size=0`` sets algo.batch_size)."""
    cfg = copy.deepcopy(cfg)
    for key, v in values.items():
        *path, last = key.split("__")
        node = cfg
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    return cfg


@pytest.mark.parametrize("algo, values, expected", [
    # the run
    ("sac", {"total_timesteps": 0}, "total_timesteps=0 is invalid: must be an integer >= 1"),
    ("sac", {"total_timesteps": -5}, "total_timesteps=-5 is invalid: must be an integer >= 1"),
    ("sac", {"total_timesteps": 12.5}, "total_timesteps=12.5 is invalid: must be an integer >= 1"),
    ("sac", {"total_timesteps": "many"}, "total_timesteps='many' is invalid"),
    ("sac", {"n_envs": 0}, "n_envs=0 is invalid: must be an integer >= 1"),
    ("sac", {"vec_env": "threads"}, "vec_env='threads' is invalid: valid: dummy, subproc"),
    ("sac", {"device": "gpu"}, "device='gpu' is invalid: valid: auto, cpu, cuda, cuda:<index>, mps"),
    ("sac", {"seed": -1}, "seed=-1 is invalid: must be an integer in [0, 4294967295]"),
    ("sac", {"torch_threads": -1}, "torch_threads=-1 is invalid: must be an integer >= 0"),
    ("sac", {"checkpoint_every": -1}, "checkpoint_every=-1 is invalid: must be an integer >= 0"),
    ("sac", {"metrics_window": 0}, "metrics_window=0 is invalid: must be an integer >= 1"),
    ("sac", {"log_interval": 0}, "log_interval=0 is invalid: must be an integer >= 1"),
    ("sac", {"verbose": 3}, "verbose=3 is invalid: must be an integer in [0, 2]"),
    ("sac", {"progress_bar": "yes"}, "progress_bar='yes' is invalid: must be true or false"),
    ("sac", {"env__max_distance": 0.0}, "env.max_distance=0.0 is invalid: must be a number > 0"),
    ("sac", {"env__stuck_time": -1.0}, "env.stuck_time=-1.0 is invalid: must be a number > 0"),
    ("sac", {"eval__routes": []}, "eval.routes=[] is invalid"),
    ("sac", {"logger__formats": ["stdout", "xml"]}, "logger.formats=['stdout', 'xml'] is invalid"),
    ("sac", {"logger__wandb__mode": "on"}, "logger.wandb.mode='on' is invalid: valid: offline, online, disabled"),
    ("sac", {"algo__name": "td3"}, "algo.name='td3' is invalid: valid: sac, ppo"),
    ("sac", {"reward__name": "nope"}, "reward.name='nope' is invalid: valid: "),
    ("sac", {"reward__params": {"w_sped": 1}}, "unknown parameter(s) ['w_sped'] under reward.params"),
    # SAC
    ("sac", {"algo__batch_size": 0}, "algo.batch_size=0 is invalid: must be an integer >= 1"),
    ("sac", {"algo__buffer_size": 0}, "algo.buffer_size=0 is invalid: must be an integer >= 1"),
    ("sac", {"algo__batch_size": 512, "algo__buffer_size": 256},
     "algo.batch_size=512 is invalid: must be <= algo.buffer_size=256"),
    ("sac", {"algo__buffer_size": 2, "algo__batch_size": 1, "n_envs": 4},
     "algo.buffer_size=2 is invalid: must be >= n_envs=4"),
    ("sac", {"algo__learning_rate": 0.0}, "algo.learning_rate=0.0 is invalid: must be a number > 0"),
    ("sac", {"algo__learning_rate": -3e-4}, "algo.learning_rate=-0.0003 is invalid: must be a number > 0"),
    ("sac", {"algo__learning_starts": -1}, "algo.learning_starts=-1 is invalid: must be an integer >= 0"),
    ("sac", {"total_timesteps": 1200, "algo__learning_starts": 1200},
     "algo.learning_starts=1200 is invalid: must be < total_timesteps=1200"),
    ("sac", {"algo__tau": 0.0}, "algo.tau=0.0 is invalid: must be a number in (0, 1]"),
    ("sac", {"algo__tau": 1.5}, "algo.tau=1.5 is invalid: must be a number in (0, 1]"),
    ("sac", {"algo__gamma": 0.0}, "algo.gamma=0.0 is invalid: must be a number in (0, 1]"),
    ("sac", {"algo__gamma": 1.01}, "algo.gamma=1.01 is invalid: must be a number in (0, 1]"),
    ("sac", {"algo__train_freq": 0}, "algo.train_freq=0 is invalid: must be an integer >= 1 or [n, step|episode]"),
    ("sac", {"algo__train_freq": [1, "epoch"]}, "algo.train_freq=[1, 'epoch'] is invalid"),
    ("sac", {"algo__gradient_steps": 0}, "algo.gradient_steps=0 is invalid: must be an integer >= 1 or -1"),
    ("sac", {"algo__gradient_steps": -2}, "algo.gradient_steps=-2 is invalid"),
    ("sac", {"algo__ent_coef": -0.1}, "algo.ent_coef=-0.1 is invalid: must be auto, auto_<initial value > 0>"),
    ("sac", {"algo__ent_coef": "auto_x"}, "algo.ent_coef='auto_x' is invalid"),
    ("sac", {"algo__target_entropy": "high"}, "algo.target_entropy='high' is invalid: must be auto"),
    ("sac", {"algo__target_entropy": float("nan")}, "algo.target_entropy=nan is invalid"),
    ("sac", {"algo__palette_size": 300}, "algo.palette_size=300 is invalid: must be an integer in [2, 256]"),
    ("sac", {"algo__embedding_dim": 0}, "algo.embedding_dim=0 is invalid: must be an integer >= 1 or null"),
    ("sac", {"algo__reward_learn_every": 0}, "algo.reward_learn_every=0 is invalid: must be an integer >= 1"),
    ("sac", {"algo__label_every": 0}, "algo.label_every=0 is invalid: must be an integer >= 1"),
    ("sac", {"algo__reward_service__max_batch": 0}, "algo.reward_service.max_batch=0 is invalid"),
    ("sac", {"algo__reward_service__wait_s": 0}, "algo.reward_service.wait_s=0 is invalid: must be a number > 0"),
    ("sac", {"algo__policy_kwargs__critic_layer_norm": "yes"},
     "algo.policy_kwargs.critic_layer_norm='yes' is invalid: must be true or false"),
    # PPO
    ("ppo", {"algo__policy_kwargs__critic_layer_norm": True},
     "algo.policy_kwargs.critic_layer_norm=True is invalid: is a SAC setting"),
    ("ppo", {"algo__reward_learn_every": 3}, "algo.reward_learn_every=3 is invalid: is a SAC setting"),
    ("ppo", {"algo__label_every": 4}, "algo.label_every=4 is invalid: is a SAC setting"),
    ("ppo", {"algo__n_steps": 0}, "algo.n_steps=0 is invalid: must be an integer >= 1"),
    ("ppo", {"algo__batch_size": 1}, "algo.batch_size=1 is invalid: must be an integer >= 2"),
    ("ppo", {"algo__batch_size": 100}, "algo.batch_size=100 is invalid: must divide the rollout "
                                       "n_steps * n_envs = 512 * 1 = 512 (otherwise the last "
                                       "mini-batch is truncated), e.g. algo.batch_size=64"),
    ("ppo", {"algo__batch_size": 1024}, "algo.batch_size=1024 is invalid: must divide the rollout"),
    ("ppo", {"algo__n_steps": 1, "algo__batch_size": 2}, "algo.n_steps=1 is invalid: must make n_steps * n_envs >= 2"),
    ("ppo", {"algo__n_epochs": 0}, "algo.n_epochs=0 is invalid: must be an integer >= 1"),
    ("ppo", {"algo__gae_lambda": 1.5}, "algo.gae_lambda=1.5 is invalid: must be a number in [0, 1]"),
    ("ppo", {"algo__clip_range": 0.0}, "algo.clip_range=0.0 is invalid: must be a number > 0"),
    ("ppo", {"algo__ent_coef": -0.01}, "algo.ent_coef=-0.01 is invalid: must be a number >= 0"),
    ("ppo", {"algo__gamma": 0}, "algo.gamma=0 is invalid: must be a number in (0, 1]"),
    ("ppo", {"algo__learning_rate": 0}, "algo.learning_rate=0 is invalid: must be a number > 0"),
])
def test_each_rule_names_key_value_and_range(base, algo, values, expected):
    problems = config_problems(with_values(base[algo], **values))
    assert len(problems) == 1, problems
    assert expected in problems[0]
    with pytest.raises(ConfigError) as e:
        validate_config(with_values(base[algo], **values))
    assert "\n" not in str(e.value) and expected in str(e.value)


@pytest.mark.parametrize("overrides", [
    [], ["algo=ppo"], ["experiment=paper"], ["experiment=paper_ppo"], ["experiment=learning_check"],
    ["reward=drivemind", "algo.reward_service.enabled=true"],
])
def test_shipped_configs_pass(overrides):
    assert config_problems(config(*overrides)) == []


@pytest.mark.parametrize("reward", sorted(p.stem for p in (REPO / "configs" / "reward").glob("*.yaml")))
def test_every_reward_config_passes(reward):
    assert config_problems(config(f"reward={reward}")) == []


def test_values_that_look_odd_but_are_valid(base):
    ok = with_values(base["sac"], total_timesteps=1e6, algo__gradient_steps=-1, algo__ent_coef="auto_0.1",
                     algo__target_entropy=-1.0,
                     algo__train_freq=[1, "episode"], algo__gamma=1.0, algo__tau=1.0, device="cuda:1",
                     checkpoint_every=0, algo__learning_starts=0, algo__embedding_dim=None,
                     algo__reward_service=None)
    assert config_problems(ok) == []
    ppo = with_values(base["ppo"], n_envs=4, algo__n_steps=96, algo__batch_size=128)  # 384 = 3 x 128
    assert config_problems(ppo) == []


def test_every_problem_on_one_line(base):
    bad = with_values(base["sac"], total_timesteps=-5, algo__batch_size=0, algo__tau=2)
    with pytest.raises(ConfigError) as e:
        validate_config(bad)
    msg = str(e.value)
    assert "\n" not in msg and msg.count("; ") == 2
    for part in ("total_timesteps=-5", "algo.batch_size=0", "algo.tau=2"):
        assert part in msg


def test_missing_budget_and_algo_are_named():
    problems = config_problems({"reward": {"name": "chen"}})
    assert any(p.startswith("total_timesteps is missing") for p in problems)
    assert any(p.startswith("algo.name=None is invalid") for p in problems)


def test_train_refuses_before_writing(base, tmp_path):
    run_dir = tmp_path / "runs" / "bad"
    with pytest.raises(ConfigError, match=r"algo\.batch_size=0 is invalid"):
        train(with_values(base["sac"], algo__batch_size=0, total_timesteps=1200), run_dir)
    assert not (tmp_path / "runs").exists()


def test_resume_of_nothing_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train({"total_timesteps": 10}, tmp_path / "missing", resume=True)
    assert not (tmp_path / "missing").exists()


# ---------------------------------------------------------------------------- scripts/train.py


def run_train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    env.pop("DRIVEMIND_DEBUG", None)
    return subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def test_train_script_rejects_with_one_line_and_no_run_dir(tmp_path):
    # default hydra.run.dir (outputs/runs/<day>/<time>-<name>, relative to the cwd)
    res = run_train(tmp_path, "algo.batch_size=0", "total_timesteps=12000")
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "error: algo.batch_size=0 is invalid: must be an integer >= 1"]
    assert "[drivemind] run directory" not in res.stdout  # the task never started
    assert list(tmp_path.iterdir()) == []  # no outputs/, no .hydra, no run directory

    res = run_train(tmp_path, "-m", "total_timesteps=-5", "seed=0,1")  # a sweep: no sweep dir either
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "total_timesteps=-5 is invalid: must be an integer >= 1" in lines[0]
    assert list(tmp_path.iterdir()) == []

    res = run_train(tmp_path, f"resume={tmp_path / 'nope'}")
    assert res.returncode == 2 and "nothing to resume" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_run_may_stop_before_learning_starts(base):
    """learning_starts cannot be changed on resume, so it is not held against a resumed budget."""
    cfg = with_values(base["sac"], total_timesteps=500, algo__learning_starts=1000)
    assert config_problems(cfg, resumed=True) == []
    assert len(config_problems(cfg)) == 1
