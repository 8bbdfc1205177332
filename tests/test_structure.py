"""Package layering: the env imports no VLM module; the reward service sits below agents and rewards."""

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _modules_after(code: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\n"
                          "print(json.dumps(sorted(m for m in sys.modules if m.startswith('drivemind'))))"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_env_imports_and_steps_without_the_vlm_package():
    # a real step, so the critical_count / risk_id facts are computed too
    mods = _modules_after(
        "import drivemind.envs as e\n"
        "env = e.DriveEnv(town='grid', density='dense', max_episode_steps=5)\n"
        "obs, info = env.reset(seed=0)\n"
        "obs, r, te, tr, info = env.step(env.action_space.sample())\n"
        "assert set(e.FACT_KEYS) <= set(info) and info['risk_id'] >= -1\n")
    assert "drivemind.envs" in mods and "drivemind.privileged" in mods
    assert not [m for m in mods if m == "drivemind.vlm" or m.startswith("drivemind.vlm.")], mods


def test_settings_are_checked_without_the_learning_stack():
    """The checks that run before a run starts (a Hydra callback) load neither torch nor SB3, so a
    rejected setting is reported in a second or two, not after the learning stack's imports; a
    guidance setting (checked by the torch-free agents.guidance_config) included."""
    mods = _modules_after(
        "from drivemind.training import config_problems\n"
        "p = config_problems({'algo': {'name': 'sac', 'batch_size': 0, 'guidance': 'telepathy',\n"
        "                              'autocast': 'fp16'}})\n"
        "assert any('algo.batch_size=0' in x for x in p) and any('algo.guidance' in x for x in p), p\n"
        "assert any('algo.autocast' in x for x in p), p\n")
    assert "drivemind.training.validate" in mods and "drivemind.agents.guidance_config" in mods
    assert not [m for m in mods if m in ("torch", "stable_baselines3", "drivemind.agents.guidance")], mods
    from drivemind.agents import DriveSAC  # the package's names still load, on first use
    from drivemind.agents.sac import DriveSAC as direct
    assert DriveSAC is direct


def test_reward_service_lives_below_agents_and_rewards():
    mods = _modules_after("import drivemind.reward_service")
    assert not [m for m in mods if m.startswith(("drivemind.agents", "drivemind.rewards"))], mods
    import drivemind.reward_service as rs
    import drivemind.rewards.drivevlm as dv
    src = Path(dv.__file__).read_text()
    assert "agents.reward_service" not in src and "from ..reward_service import" in src
    assert rs.SERVICE_DEFAULTS  # the agents' and DriveVLM-RL's shared settings


def test_stand_ins_are_one_object_wherever_imported():
    from drivemind import facts, privileged
    from drivemind.envs import FACT_KEYS
    from drivemind.vlm import detectors, reasoners
    assert FACT_KEYS is facts.FACT_KEYS
    assert detectors.PrivilegedDetector is privileged.PrivilegedDetector
    assert reasoners.PrivilegedReasoner is privileged.PrivilegedReasoner
    assert reasoners.RISK_VOCABULARY is privileged.RISK_VOCABULARY
