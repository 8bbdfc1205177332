"""Kinematic and baseline rewards as batch functions over facts: formulas on hand-made facts,
term-by-term explanations, re-weighting without touching the facts, and agreement with the env's
own task reward on a real rollout."""

from __future__ import annotations

import numpy as np
import pytest

from drivemind.envs import FACT_KEYS, DriveEnv
from drivemind.rewards import HVFR, REWARDS, Composite, Revolve, Task, make_reward, reward_params
from table_text import HashText


def facts(n=4, **cols):
    b = {k: np.zeros(n) for k in FACT_KEYS}
    b["lead_distance"][:] = 50.0
    b["light_state"][:] = -1
    b["light_distance"][:] = 50.0
    for k, v in cols.items():
        b[k] = np.asarray(v, float)
    return b


def test_baseline_formulas():
    b = facts(speed_kmh=[0, 25, 10, 0], lateral_offset=[0, -1, 0.5, 0], steer=[0, 0.4, -1, 0],
              collision=[0, 0, 0, 1], offroad=[0, 0, 0, 1], progress=[0, 2.5, 1, 0],
              overtakes=[0, 1, 0, 0], jerk=[0, 10, -20, 0], lateral_accel=[0, 4, 0, 0])
    assert np.allclose(make_reward("tirl")(b), [0, 0, 0, -1])
    assert np.allclose(make_reward("chen")(b), [0, 1 - 2 - 0.2, 0.4 - 1 - 0.5, -10])
    assert np.allclose(make_reward("asap")(b), [0, 2.5 + 2, 1, -3])  # off-road counted once
    assert np.allclose(make_reward("chatscene")(b), [0.1, 0.1 - 0.5 - 0.5, 0.1 - 1.0, 0.1 - 5])




def test_explain_sums_to_the_reward_for_every_reward():
    rng = np.random.default_rng(0)
    n = 50
    b = {k: rng.uniform(-3, 3, n) for k in FACT_KEYS}
    b["speed_kmh"] = rng.uniform(0, 40, n)
    b["risk_id"] = rng.integers(-1, 10, n).astype(float)
    for name in REWARDS:
        r = make_reward(name)
        r.bind_encoder(HashText())
        emb, oemb = rng.normal(size=(2, n, 384))
        bn = {**b, "embedding": emb / np.linalg.norm(emb, axis=1, keepdims=True),
              "obs_embedding": oemb / np.linalg.norm(oemb, axis=1, keepdims=True),
              "action": rng.uniform(-1, 1, (n, 2)), "done": np.zeros(n), "env": np.zeros(n),
              "slot": np.arange(n), **{k: np.zeros(n) for k in r.columns}}
        parts = r.explain(bn)
        assert all(v.shape == (n,) for v in parts.values()), name
        assert np.allclose(sum(parts.values()), r(bn)), name


def test_hvfr_factors_veto_and_context_speed():
    r = HVFR()
    b = facts(speed_kmh=[22.5, 22.5, 22.5, 0.0], lateral_offset=[0, 2.5, 0, 0],
              light_state=[-1, -1, -1, 2], light_distance=[50, 50, 50, 1.0])
    v = r(b)
    assert v[0] == pytest.approx(1.0)
    assert v[1] == 0.0  # 2.5 m off centre: the product is vetoed
    assert np.all((v >= 0) & (v <= 1))
    assert v[3] == pytest.approx(1.0)  # standing before a red stop line is the ideal
    b = facts(n=2, speed_kmh=[22.5, 22.5], lead_distance=[50.0, 3.0])
    v = r(b)
    assert v[0] > v[1]  # full speed 3 m behind a car is not
    f = r.factors(facts(n=1, heading_error=[np.pi / 8], lateral_oscillation=[0.25]))
    assert f["angle"][0] == pytest.approx(0.5) and f["stability"][0] == pytest.approx(0.5)


def test_standing_still_on_a_free_road_never_pays_hvfr():
    """The shaping bug that made SAC stand still (issue 14): the paper's speed factor pays
    1 - 22.5/35 = 0.36 per step at rest on a free road; the default ramp pays 0 there, 1 at the
    target and still 1 for a full stop before a red light or a car."""
    free = dict(lead_distance=[50.0] * 3, light_state=[-1.0] * 3, light_distance=[50.0] * 3)
    b = facts(n=3, speed_kmh=[0.0, 11.25, 22.5], progress=[0.0, 0.3125, 0.625], **free)
    for r in (HVFR(), make_reward("drivemind_kinematic")):
        v = r(b)
        assert v[0] == pytest.approx(0.0) and v[0] < v[1] < v[2], r.name
    assert HVFR()(b)[1] == pytest.approx(0.5)
    paper = HVFR(below_target="paper")(b)
    assert paper[0] == pytest.approx(1 - 22.5 / 35)  # the paper's formula, kept as an option
    stop = facts(n=2, speed_kmh=[0.0, 0.0], light_state=[2.0, -1.0], light_distance=[1.0, 50.0],
                 lead_distance=[50.0, 1.5])
    assert np.allclose(HVFR()(stop), 1.0)  # a full stop before a red light / a stopped car
    with pytest.raises(ValueError, match="below_target"):
        HVFR(below_target="flat")


def test_uncapped_progress_pays_speeding_and_the_cap_makes_the_target_pay_most():
    """The mirror of the standstill bug (issue 14): progress pays linearly for speed while HVFR's
    speed factor stops paying above its target, so task + HVFR pays more at 80 km/h on a free
    road than at the target; progress credited at most at ``max_progress_speed_kmh`` makes the
    target the best speed and every speed above the cap worse the faster it gets."""
    free = dict(lead_distance=[50.0] * 6, light_state=[-1.0] * 6, light_distance=[50.0] * 6)
    kmh = np.array([0.0, 22.5, 30.0, 45.0, 60.0, 80.0])
    b = facts(n=6, speed_kmh=kmh, progress=kmh / 3.6 * 0.1, **free)  # one 0.1 s step at each speed
    uncapped = make_reward("drivemind_kinematic")(b)
    assert uncapped[5] > uncapped[1]  # 80 km/h out-pays the target (uncapped: the default)
    capped = make_reward("drivemind_kinematic", max_progress_speed_kmh=30.0)(b)
    assert np.argmax(capped) == 1 and np.all(np.diff(capped[2:]) < 0)
    assert np.allclose(capped[:3], uncapped[:3])  # at or below the cap nothing changes
    task = Task(max_progress_speed_kmh=30.0)
    assert "speed_kmh" in task.needs and "speed_kmh" not in Task().needs
    assert task.terms(b)["progress"][5] == pytest.approx(30.0 / 3.6 * 0.1)  # credited at the cap
    for bad in (0.0, -5.0, float("nan")):
        with pytest.raises(ValueError, match="max_progress_speed_kmh must be a positive speed"):
            Task(max_progress_speed_kmh=bad)


def test_reweighting_rescores_without_touching_facts():
    b = facts(progress=[1.0, 2.0, 0.0, 0.5], failure=[0, 0, 1, 0], speed_kmh=[20, 22, 0, 30])
    before = {k: v.copy() for k, v in b.items()}
    a = Composite({"task": (1.0, Task()), "hvfr": (1.0, HVFR())})(b)
    c = Composite({"task": (1.0, Task(failure_penalty=-50)), "hvfr": (0.2, HVFR())})(b)
    assert not np.allclose(a, c)
    assert c[2] == pytest.approx(-50 + 0.2 * HVFR()(b)[2])
    assert all(np.array_equal(before[k], b[k]) for k in b)


def test_task_reward_matches_the_env():
    env = DriveEnv("grid", "regular", bev={"preset": "cpu"})
    env.reset(seed=3)
    rows, rewards = [], []
    rng = np.random.default_rng(0)
    for i in range(300):
        a = env.expert_action() if i < 250 else np.array([rng.uniform(-1, 1), 1.0])
        obs, r, term, trunc, info = env.step(a)
        rows.append(info)
        rewards.append(r)
        if term or trunc:
            break
    b = {k: np.array([row[k] for row in rows]) for k in FACT_KEYS}
    assert np.allclose(make_reward("task")(b), rewards)


def test_bad_input():
    with pytest.raises(ValueError, match="valid: task, hvfr, tirl, chen"):
        make_reward("revolve2")
    with pytest.raises(KeyError, match="lateral_offset"):
        make_reward("chen")({"collision": np.zeros(2), "speed_kmh": np.zeros(2), "steer": np.zeros(2)})
    with pytest.raises(ValueError, match="finite"):
        Composite({"task": (float("nan"), Task())})


def test_revolve_value_by_hand():
    b = facts(speed_kmh=[22.5, 10.0, 22.5, 22.5], lateral_offset=[0, 0.5, 0, 3.5],
              heading_error=[0, -0.2, 0, 0], jerk=[0, 10.0, 0, 0], lead_distance=[50, 6.0, 50, 50],
              progress=[0.5, 0, 0, 0], collision=[0, 0, 1, 0], failure=[0, 0, 1, 1])
    e = np.exp
    want = [0.3 + 0.2 + 0.1 + 0.1 + 0.1 + 0.2 * np.tanh(1.0),  # in band, centred, 0.5 m/step
            0.3 * e(-2) + (0.2 + 0.1 + 0.1 + 0.1) * e(-1),  # each error one temperature (speed 2)
            0.3 + 0.2 + 0.1 + 0.1 + 0.1 - 10,  # collision (its failure is not counted twice)
            0.3 + 0.2 * e(-7) + 0.1 + 0.1 + 0.1 - 10]  # off-route failure, 3.5 m off centre
    r = make_reward("revolve")
    assert np.allclose(r(b), want)
    parts = r.explain(b)
    assert set(parts) == {"speed", "center", "heading", "smooth", "headway", "progress",
                          "collision", "failure"}
    assert np.allclose(sum(parts.values()), want)
    assert np.allclose(parts["collision"], [0, 0, -10, 0])
    assert np.allclose(parts["failure"], [0, 0, 0, -10])
    # the shaping part of a step stays in [-w_progress, 1], like hvfr and a cruising chen step
    rng = np.random.default_rng(1)
    b = facts(n=200, speed_kmh=rng.uniform(0, 60, 200), lateral_offset=rng.uniform(-3, 3, 200),
              heading_error=rng.uniform(-3, 3, 200), jerk=rng.uniform(-50, 50, 200),
              lead_distance=rng.uniform(0, 50, 200), progress=rng.uniform(-1, 2, 200))
    v = r(b)
    assert np.all((v >= -0.2) & (v <= 1.0))


def test_revolve_monotone():
    r = Revolve()
    v = r(facts(n=6, speed_kmh=[0, 10, 15, 19, 20, 22.5]))
    assert np.all(np.diff(v[:5]) > 0)  # closer to the 20-25 km/h band: higher
    assert v[4] == v[5]  # flat inside the band
    v = r(facts(n=4, speed_kmh=[25, 30, 40, 60]))
    assert np.all(np.diff(v) < 0)  # faster than the band: lower
    v = r(facts(n=4, speed_kmh=[22.5] * 4, lateral_offset=[0, 0.5, -1.0, 2.0]))
    assert np.all(np.diff(v) < 0)  # larger offset: lower
    v = r(facts(n=3, speed_kmh=[22.5] * 3, heading_error=[0, 0.1, -0.5]))
    assert np.all(np.diff(v) < 0)
    v = r(facts(n=3, speed_kmh=[22.5] * 3, lead_distance=[50, 8, 2]))
    assert np.all(np.diff(v) < 0)  # closer than the safe gap: lower
    v = r(facts(n=2, speed_kmh=[22.5] * 2, collision=[0, 1], failure=[0, 1]))
    assert v[1] < v[0] - 9  # a collision costs about 10


def test_make_reward_params():
    r = make_reward("revolve", w_collision=20.0, speed_min_kmh=10, speed_max_kmh=30)
    assert r.w_collision == 20.0
    b = facts(n=2, speed_kmh=[12.0, 12.0], collision=[0, 1])
    assert r(b)[0] == pytest.approx(1.0 - 0.2)  # 12 km/h is in the widened band; no progress
    assert r.explain(b)["collision"][1] == -20.0
    assert make_reward("drivemind_kinematic", rho1=0.5).parts["hvfr"][0] == 0.5
    assert "temp_speed_kmh" in reward_params("revolve") and "name" not in reward_params("revolve")
    with pytest.raises(TypeError, match=r"'revolve'.*\['w_sped'\].*valid: speed_min_kmh.*w_collision"):
        make_reward("revolve", w_sped=1.0)
    with pytest.raises(TypeError, match=r"\['bogus'\]; valid: v_max_kmh, w_collision"):
        make_reward("chen", w_lane=1.0, bogus=2)
    with pytest.raises(TypeError, match=r"\['scale'\]; valid: \(none\)"):
        make_reward("tirl", scale=2)
    with pytest.raises(TypeError, match="valid: rho1"):
        make_reward("drivemind_kinematic", rho2=1.0)
    with pytest.raises(ValueError, match="temp_offset"):
        make_reward("revolve", temp_offset=0.0)
    with pytest.raises(ValueError, match="speed_min_kmh"):
        make_reward("revolve", speed_min_kmh=30.0)


def test_carl_progress_pays_and_soft_infractions_multiply():
    """CaRL: route completion (%) x soft factors - 1 on collision / red light (docs/rewards.md)."""
    r = make_reward("carl")
    b = facts(8, route_completion=[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
              speed_kmh=[20, 30 + 2.23 * 3.6 / 2, 20, 20, 20, 20, 50, 20],
              outside_lanes=[0, 0, 1, 0, 0, 0, 0, 0],
              ttc_violation=[0, 0, 0, 1, 0, 0, 0, 0],
              comfort_violations=[0, 0, 0, 0, 3, 0, 0, 0],
              off_center_time=[0, 0, 0, 0, 0, 3.5, 0, 2.9],
              collision=[0, 0, 0, 0, 0, 0, 1, 0], red_light_run=[0, 0, 0, 0, 0, 0, 0, 1])
    # clean progress pays in full; half the overspeed margin halves it; wrong lane zeroes it;
    # TTC halves; 3 of 6 comfort limits take a quarter; off-centre past 3 s halves; far over the
    # limit pays nothing and a collision costs the hint; a red-light run costs the hint
    want = [0.5, 0.25, 0.0, 0.25, 0.375, 0.25, -1.0, 0.5 - 1.0]
    assert np.allclose(r(b), want)
    parts = r.explain(b)
    assert np.allclose(parts["progress"], 0.5) and np.allclose(sum(parts.values()), want)
    assert parts["speeding"][1] == pytest.approx(-0.25) and parts["comfort"][4] == pytest.approx(-0.125)
    # factors multiply: speeding at half margin, TTC and off-centre together leave 1/8
    both = facts(1, route_completion=[2.0], speed_kmh=[30 + 2.23 * 3.6 / 2], ttc_violation=[1],
                 off_center_time=[5.0])
    assert r(both) == pytest.approx(2.0 / 8)
    # no progress, no reward (standing still is never paid), whatever the infractions
    idle = facts(3, speed_kmh=[0, 60, 0], comfort_violations=[0, 6, 0], outside_lanes=[1, 0, 0])
    assert np.allclose(r(idle), 0.0)
    # its parameters are relabelling knobs: a gentler outside-lanes factor re-scores the same facts
    assert make_reward("carl", outside_lanes_factor=0.5)(b)[2] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="ttc_factor must be in"):
        make_reward("carl", ttc_factor=1.5)
    with pytest.raises(ValueError, match="speed_limit_kmh must be a positive"):
        make_reward("carl", speed_limit_kmh=0.0)


def test_carl_config_sets_its_env_termination():
    """configs/reward/carl.yaml names the reward, its params and the env's red-light termination."""
    from pathlib import Path

    import yaml
    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "reward" / "carl.yaml").read_text())
    assert cfg["reward"]["name"] == "carl" and cfg["env"]["terminate_red_light"] is True
    assert set(cfg["reward"]["params"]) == set(reward_params("carl"))
    assert make_reward("carl", **cfg["reward"]["params"])(facts(1, route_completion=[1.0]))[0] == 1.0
