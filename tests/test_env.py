"""The Gymnasium env: registration and the env checker, spaces, determinism, route following,
every termination and truncation, the per-step facts, eval routes, bad input, vector envs and
rendering. Runs on the embedded simulator (built-in towns; CARLA's Town02 as shipped).
"""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import drivemind  # noqa: F401  (registers DriveMind-v0)
from drivemind.envs import FACT_KEYS, DriveEnv
from drivemind.envs.routes import make_fixed_routes, map_fingerprint, routes_from_spec, write_routes
from drivemind.envs.tracker import RouteTracker, corridor_lead, route_stops
from drivemind.maps import load_town, plan_route
from drivemind.sim.snapshot import ActorClass, Actors, LightState, TrafficLights

CPU = {"preset": "cpu"}  # 15 x 96 x 96: the same view, cheaper, for tests that do not look at it


def make(**kw):
    kw.setdefault("town", "grid")
    kw.setdefault("density", "empty")
    kw.setdefault("bev", CPU)
    return DriveEnv(**kw)


def drive(env, action, steps):
    """Apply a fixed action until the episode ends; returns the last step's result."""
    for _ in range(steps):
        out = env.step(action)
        if out[2] or out[3]:
            return out
    return out


def teleport(env, fwd=0.0, right=0.0, yaw=0.0, speed=None):
    """Move the lite world's ego relative to its pose (white-box: the lite backend's state)."""
    e = env.world.ego
    c, s = math.cos(e["yaw"]), math.sin(e["yaw"])
    e["x"] += fwd * c - right * s
    e["y"] += fwd * s + right * c
    e["yaw"] += yaw
    if speed is not None:
        e["v"] = speed


# ---------------------------------------------------------------------------------------- API
def test_registered_and_passes_env_checker():
    env = gym.make("DriveMind-v0", town="grid", density="regular", bev=CPU, render_mode="rgb_array")
    assert isinstance(env.unwrapped, DriveEnv)
    check_env(env.unwrapped)
    env.close()


def test_spaces_and_observations_stay_inside():
    env = make(density="regular", bev=None)
    assert env.observation_space["bev"].shape == (15, 192, 192)
    assert env.observation_space["waypoints"].shape == (10, 2)
    assert env.action_space.shape == (2,) and env.action_space.dtype == np.float32
    obs, info = env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(60):
        assert env.observation_space.contains(obs)
        obs, r, term, trunc, info = env.step(rng.uniform(-1, 1, 2))
        if term or trunc:
            obs, info = env.reset()
    assert obs["bev"].dtype == np.uint8 and obs["bev"][0].any()  # road is visible


def test_same_seed_same_episode():
    def run():
        env = make(density="regular")
        obs, _ = env.reset(seed=11)
        rng = np.random.default_rng(5)
        trace = [obs]
        for _ in range(80):
            a = env.expert_action() if rng.random() < 0.8 else rng.uniform(-1, 1, 2)
            obs, r, term, trunc, info = env.step(a)
            trace.append((obs, r, info["lateral_offset"], info["lead_distance"]))
        return trace

    a, b = run(), run()
    for x, y in zip(a[1:], b[1:]):
        assert np.array_equal(x[0]["bev"], y[0]["bev"]) and x[1:] == y[1:]
    env = make(density="regular")
    o1, _ = env.reset(seed=11)
    o2, _ = env.reset(seed=12)
    assert not np.array_equal(o1["waypoints"], o2["waypoints"]) or not np.array_equal(o1["bev"], o2["bev"])


# ---------------------------------------------------------------------------------------- routes
def test_autopilot_follows_routes_and_new_route_starts_on_arrival():
    env = make(density="regular")
    obs, info = env.reset(seed=1)
    lengths, progress = [], 0.0
    for _ in range(4000):
        before = env.route
        obs, r, term, trunc, info = env.step(env.expert_action())
        assert not term, info["termination"]
        assert abs(info["lateral_offset"]) < 1.5
        progress += info["progress"]
        if info["arrived"]:
            assert env.route is not before
            # the next route starts where the last one ended, and the ego is at its start
            assert np.hypot(*(env.route.pts[0] - before.pts[-1])) < 10.0
            assert info["route_progress"] < 10.0
            lengths.append(before.length)
            if len(lengths) == 2:
                break
    assert info["routes_completed"] == 2
    # progress counts every metre of both routes (within the arrival distance of each goal)
    assert progress == pytest.approx(sum(lengths) + info["route_progress"], abs=2 * env.cfg.arrival_distance + 1)


def test_eval_mode_runs_the_fixed_routes_in_order(tmp_path):
    path = tmp_path / "grid.json"
    env = make(mode="eval", routes_file=path, density="regular")
    assert path.exists()
    spec = json.loads(path.read_text())
    assert spec["n"] == 10 and len(spec["routes"]) == 10
    starts = []
    done = 0
    for i in range(3):
        obs, info = env.reset()
        assert info["route_index"] == i
        starts.append(env.route.pts[0].copy())
        for _ in range(3000):
            obs, r, term, trunc, info = env.step(env.expert_action())
            if term or trunc:
                break
        assert term and info["termination"] == "arrived" and info["routes_completed"] == 1
        done += 1
    # the same routes (and traffic seeds) every time, in any env
    env2 = make(mode="eval", routes_file=path, density="regular")
    env2.reset(options={"route_index": 1})
    assert np.allclose(env2.route.pts[0], starts[1])
    with pytest.raises(ValueError, match="route_index 10 out of range"):
        env2.reset(options={"route_index": 10})


def test_fixed_routes_seeded_and_checked_against_the_map(tmp_path):
    grid, avenue = load_town("grid"), load_town("avenue")
    a, b = make_fixed_routes(grid, 10, seed=0), make_fixed_routes(grid, 10, seed=0)
    assert a == b
    assert make_fixed_routes(grid, 10, seed=1) != a
    ids = {(tuple(r["start"]["lane"]), r["start"]["s"], tuple(r["goal"]["lane"]), r["goal"]["s"]) for r in a["routes"]}
    assert len(ids) == 10
    routes = routes_from_spec(grid, a)
    assert all(150 <= r.length <= 3000 for r in routes)
    assert [round(r.length, 1) for r in routes] == [r["length_m"] for r in a["routes"]]
    write_routes(a, tmp_path / "r.json")
    with pytest.raises(ValueError, match="fingerprint"):
        routes_from_spec(avenue, json.loads((tmp_path / "r.json").read_text()))
    assert map_fingerprint(grid) != map_fingerprint(avenue)


def test_route_files_written_at_once_by_many_writers_stay_whole(tmp_path):
    """Parallel evaluations and test workers create the same cached route file at once: every
    write goes through a temporary file of its own, so none fails on another's rename and the
    file is always one writer's whole text, with no temporary file left behind."""
    import threading

    path = tmp_path / "routes" / "Town99-abc.json"
    specs = [{"map_fingerprint": f"w{i}", "routes": [{"n": j} for j in range(200)]} for i in range(8)]
    errors = []

    def writer(spec):
        try:
            for _ in range(25):
                write_routes(spec, path)
                json.loads(path.read_text())  # never half-written
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s,)) for s in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(path.read_text()) in specs
    assert [f.name for f in path.parent.iterdir()] == [path.name]


def test_shipped_route_files_match_their_maps():
    from drivemind.envs.routes import SHIPPED
    files = sorted(SHIPPED.glob("*.json"))
    assert {p.stem for p in files} >= {"grid", "curves", "avenue", "Town01", "Town02", "Town03",
                                       "Town05"}
    for p in files:
        spec = json.loads(p.read_text())
        rm = load_town(spec["town"])  # built-in or shipped CARLA town, no search path needed
        assert len(routes_from_spec(rm, spec, str(p))) == 10


# ---------------------------------------------------------------------------------------- ends
def test_collision_with_a_vehicle_terminates():
    env = make(density="regular")
    env.reset(seed=4)
    w = env.world
    # put the ego right behind background car 0, on its lane, faster than it
    e = w.ego
    e["x"], e["y"], e["yaw"] = w.v_xy[0, 0] - 7.5 * math.cos(w.v_yaw[0]), w.v_xy[0, 1] - 7.5 * math.sin(w.v_yaw[0]), w.v_yaw[0]
    e["v"] = 12.0
    env.cfg = env.cfg.__class__(**{**env.cfg.to_dict(), "max_lateral": 1e3})
    obs, r, term, trunc, info = drive(env, np.array([0.0, 1.0]), 30)
    assert term and not trunc and info["termination"] == "collision"
    assert info["collision"] == 1.0 and info["collision_class"] == int(ActorClass.CAR)
    assert info["collision_speed_kmh"] > 20
    assert r <= env.cfg.terminal_penalty + 2.0  # the penalty is in the task reward


def test_leaving_the_road_is_a_static_collision():
    env = make(max_lateral=100.0)  # let the simulator's off-road check fire first
    env.reset(seed=2)
    teleport(env, speed=8.0)
    obs, r, term, trunc, info = drive(env, np.array([1.0, 0.5]), 300)
    assert term and info["termination"] == "collision"
    assert info["collision_class"] == int(ActorClass.STATIC) and info["offroad"] == 1.0


def test_lateral_deviation_terminates():
    env = make()
    env.reset(seed=2)
    teleport(env, speed=6.0)
    obs, r, term, trunc, info = drive(env, np.array([-0.5, 0.3]), 200)
    assert term and info["termination"] == "off_route"
    assert abs(info["lateral_offset"]) > 3.0


def test_stuck_terminates_after_the_configured_time():
    env = make(stuck_time=5.0)
    env.reset(seed=0)
    stuck = []
    for i in range(100):
        obs, r, term, trunc, info = env.step(np.array([0.0, -1.0]))
        stuck.append(info["stuck_time"])
        if term:
            break
    assert info["termination"] == "stuck"
    assert stuck[-1] > 5.0 and i == pytest.approx(50, abs=2)
    assert np.allclose(np.diff(stuck), 0.1)


def test_truncation_is_reported_apart_from_termination():
    env = make(max_distance=40.0)
    env.reset(seed=0)
    for _ in range(400):
        obs, r, term, trunc, info = env.step(env.expert_action())
        if term or trunc:
            break
    assert trunc and not term and info["truncation"] == "distance" and info["distance"] >= 40.0
    env = make(max_episode_steps=7)
    env.reset(seed=0)
    for i in range(7):
        obs, r, term, trunc, info = env.step(np.zeros(2))
    assert trunc and not term and info["truncation"] == "max_steps"


# ---------------------------------------------------------------------------------------- facts
def test_info_facts_every_step():
    env = make(density="regular")
    obs, info = env.reset(seed=5)
    assert set(FACT_KEYS) <= set(info)
    progress = 0.0
    for _ in range(150):
        obs, r, term, trunc, info = env.step(env.expert_action())
        for k in FACT_KEYS:
            assert type(info[k]) is float and math.isfinite(info[k]), k
        progress += info["progress"]
        assert r == pytest.approx(info["task_reward"]) == pytest.approx(info["progress"])
        assert info["speed_kmh"] == pytest.approx(env.snapshot.ego.speed * 3.6)
    assert progress == pytest.approx(info["route_progress"], abs=0.5)
    assert info["distance"] == pytest.approx(progress, rel=0.05)


def test_lateral_offset_and_heading_error_signs():
    env = make()
    env.reset(seed=6)
    env.step(np.zeros(2))
    teleport(env, right=1.2)
    obs, r, term, trunc, info = env.step(np.zeros(2))
    assert info["lateral_offset"] == pytest.approx(1.2, abs=0.1)  # + is to the right
    teleport(env, right=-2.4, yaw=0.2)
    obs, r, term, trunc, info = env.step(np.zeros(2))
    assert info["lateral_offset"] == pytest.approx(-1.2, abs=0.1)
    assert info["heading_error"] == pytest.approx(0.2, abs=0.03)
    assert info["lateral_oscillation"] > 0.5  # the offset jumped about within the window


def test_waypoints_in_ego_frame():
    env = make()
    obs, _ = env.reset(seed=6)
    tr = env.tracker
    e = env.snapshot.ego
    wp = obs["waypoints"]
    assert wp.shape == (10, 2) and np.all(np.abs(wp) <= 1)
    # undo the scaling and the rotation: back on the route, 5 m apart
    world = []
    c, s = math.cos(e.yaw), math.sin(e.yaw)
    for f, rt in wp * 50.0:
        world.append((e.x + f * c - rt * s, e.y + f * s + rt * c))
    world = np.array(world)
    d = np.hypot(*(world[:, None, :] - tr.route.pts[None, :, :]).transpose(2, 0, 1)).min(axis=1)
    assert d.max() < 0.6
    assert np.allclose(np.hypot(*np.diff(np.vstack([[e.x, e.y], world]), axis=0).T)[1:], 5.0, atol=0.3)
    assert wp[0, 0] == pytest.approx(0.1, abs=0.02)  # first point 5 m straight ahead


def test_lead_vehicle_and_corridor():
    rm = load_town("avenue")
    lane = int(np.argmax(rm.length * (rm.junction < 0)))
    route = plan_route(rm, (lane, 0.0), (lane, float(rm.length[lane])))
    x0, y0, yaw = rm.pose_at(lane, 10.0)

    def actors(*rows):
        n = len(rows)
        return Actors(np.arange(n), np.full(n, int(ActorClass.CAR), np.int8),
                      np.array([r[:2] for r in rows], float), np.array([r[2] for r in rows], float),
                      np.tile([2.0, 1.0], (n, 1)), np.zeros((n, 2)))

    ahead = rm.pose_at(lane, 40.0)
    tr = RouteTracker(route)
    tr.update(x0, y0, yaw)
    gap, who = corridor_lead(route, tr.idx, tr.s, x0, y0, actors(ahead), 2.4, 1.05)
    assert who == 0 and gap == pytest.approx(30.0 - 2.4 - 2.0, abs=0.6)
    c, s = math.cos(ahead[2]), math.sin(ahead[2])
    beside = (ahead[0] - 4.0 * s, ahead[1] + 4.0 * c, ahead[2])  # 4 m to the right: another lane
    behind = rm.pose_at(lane, 2.0)
    assert corridor_lead(route, tr.idx, tr.s, x0, y0, actors(beside, behind), 2.4, 1.05) == (math.inf, -1)


def test_light_ahead_from_stop_lines():
    rm = load_town("grid")
    lane = int(np.argmax(rm.length * (rm.junction < 0)))
    route = plan_route(rm, (lane, 0.0), (lane, float(rm.length[lane])))
    x, y, yaw = rm.pose_at(lane, 30.0)
    c, s = math.cos(yaw), math.sin(yaw)
    line = np.array([[[x - 1.5 * -s, y - 1.5 * c], [x + 1.5 * -s, y + 1.5 * c]]])
    lights = TrafficLights(np.array([0, 1]), np.array([[x, y], [x, y]]), np.array([yaw, yaw + math.pi]),
                           np.array([int(LightState.RED), 0], np.uint8), [line, line])
    stops = route_stops(route, lights)
    assert len(stops) == 1 and stops[0][1] == 0  # the opposite-direction light is not ours
    assert stops[0][0] == pytest.approx(30.0, abs=1.0)


def test_light_state_fact_on_town02(shared_maps):
    env = DriveEnv("Town02", "empty", bev=CPU, map_path=str(shared_maps))
    seen = set()
    obs, info = env.reset(seed=0)
    for _ in range(3000):
        obs, r, term, trunc, info = env.step(env.expert_action())
        seen.add(int(info["light_state"]))
        if info["light_state"] >= 0:
            assert 0 <= info["light_distance"] <= env.cfg.light_range
        if info["light_state"] == LightState.RED and info["light_distance"] < 1.0:
            assert info["speed_kmh"] < 5.0  # the autopilot stops at red lines
        if term or trunc:
            env.reset()
    assert {-1, int(LightState.RED), int(LightState.GREEN)} <= seen


# ---------------------------------------------------------------------------------------- bad input
def test_bad_actions():
    env = make()
    env.reset(seed=0)
    for bad in ([np.nan, 0.0], [0.0, np.inf]):
        with pytest.raises(ValueError, match="non-finite"):
            env.step(np.array(bad))
    with pytest.raises(ValueError, match="2 values"):
        env.step(np.zeros(3))
    obs, r, term, trunc, info = env.step(np.array([7.0, -3.0]))  # clipped, as Gymnasium expects
    assert info["steer"] == 1.0 and info["brake"] == 1.0


@pytest.mark.parametrize("kw,match", [
    (dict(density="rush"), "valid: empty, regular, dense, drivevlm"),
    (dict(town="Atlantis"), "Atlantis"),
    (dict(mode="test"), "valid: train, eval"),
    (dict(backend="unreal"), "valid: lite"),
    (dict(bev={"size": 0}), "size"),
    (dict(bev={"channels": ["road", "sky"]}), "unknown bev channel"),
    (dict(bev="tiny"), "valid: roach, paper, cpu"),
    (dict(waypoint=3), "unknown env option"),
    (dict(max_lateral=-1.0), "max_lateral"),
    (dict(render_mode="human"), "render_mode"),
])
def test_bad_config_fails_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        make(**kw)


# ---------------------------------------------------------------------------------------- vector, render
def test_subprocess_vector_env():
    fns = [lambda: gym.make("DriveMind-v0", town="grid", density="regular", bev=CPU) for _ in range(2)]
    venv = gym.vector.AsyncVectorEnv(fns)
    try:
        obs, info = venv.reset(seed=[0, 1])
        assert obs["bev"].shape == (2, 15, 96, 96) and obs["waypoints"].shape == (2, 10, 2)
        for _ in range(15):
            obs, r, term, trunc, info = venv.step(np.tile([0.0, 0.5], (2, 1)).astype(np.float32))
        assert r.shape == (2,) and np.all(np.isfinite(r)) and "speed_kmh" in info
        assert not np.array_equal(obs["bev"][0], obs["bev"][1])
    finally:
        venv.close()


def test_render_rgb_array():
    env = make(render_mode="rgb_array", bev=None)
    env.reset(seed=0)
    img = env.render()
    assert img.shape == (224, 224, 3) and img.dtype == np.uint8
    for _ in range(10):
        env.step(np.array([0.0, 1.0]))
    assert not np.array_equal(img, env.render())  # the view moved with the ego
    assert make().render() is None


# ---------------------------------------------------------------------------------------- autopilot, script
@pytest.mark.parametrize("town", ["grid", "avenue"])
def test_autopilot_completes_the_fixed_routes(town):
    env = make(town=town, density="regular", mode="eval")
    arrived = 0
    for i in range(len(env.eval_route_list)):
        env.reset(options={"route_index": i})
        for _ in range(6000):
            obs, r, term, trunc, info = env.step(env.expert_action())
            if term or trunc:
                break
        assert info["termination"] != "collision", (town, i)
        arrived += info["termination"] == "arrived"
    assert arrived >= 9


def test_render_rollout_script_writes_a_gif(tmp_path):
    from script_loader import load_script

    mod = load_script("render_rollout")
    out = tmp_path / "r.gif"
    res = mod.main(["--seconds", "2", "--masks", "--out", str(out), "--scale", "1"])
    from PIL import Image
    im = Image.open(out)
    assert res["frames"] == 20 and im.n_frames == 20
    assert im.size == (224 + mod.mask_panel(np.zeros((15, 192, 192), np.uint8), 224).width, 224)
    with pytest.raises(SystemExit):
        mod.main(["--out", str(tmp_path / "r.avi")])


def test_overtake_and_failure_facts():
    env = make(density="empty")
    env.reset(seed=4)
    env.world.ego["v"] = 8.0
    env.step(np.zeros(2))
    snap = env.snapshot
    e = snap.ego
    c, s = math.cos(e.yaw), math.sin(e.yaw)
    # a parked car 8 m ahead in the next lane (4 m to the right), then the ego 14 m further on
    snap.actors = Actors(np.array([999]), np.array([int(ActorClass.CAR)], np.int8),
                         np.array([[e.x + 8 * c - 4 * s, e.y + 8 * s + 4 * c]]), np.array([e.yaw]),
                         np.array([[2.0, 1.0]]), np.zeros((1, 2)))
    assert env._overtakes(snap) == 0  # seen ahead
    e.x, e.y = e.x + 14 * c, e.y + 14 * s
    assert env._overtakes(snap) == 1  # now behind our rear: passed
    assert env._overtakes(snap) == 0  # counted once
    env.reset(seed=2)
    teleport(env, speed=6.0)
    obs, r, term, trunc, info = drive(env, np.array([-0.5, 0.3]), 200)
    assert info["termination"] == "off_route" and info["failure"] == 1.0


# ---------------------------------------------------------------------------------------- CaRL's facts
def _red_light_run(mode="train", **kw):
    """Put the ego 8 m before the first red stop line of its route (every light held red) and
    drive through it at full throttle, steering with the autopilot. Returns the steps' infos."""
    env = make(mode=mode, **kw)
    for seed in range(20):
        env.reset(seed=seed) if mode == "train" else env.reset(options={"route_index": seed % 10})
        if env._stops:
            break
    assert env._stops, "no route with a traffic light in 20 tries"
    w = env.world
    w._update_lights = lambda *_: w.light_state.fill(int(LightState.RED))  # white-box: hold red
    w._update_lights()
    cum = env._stops[0][0]
    r = env.route
    i = int(np.searchsorted(r.cum, cum - 8.0 - env.snapshot.ego.extent[0]))
    w.ego["x"], w.ego["y"], w.ego["yaw"], w.ego["v"] = r.pts[i, 0], r.pts[i, 1], r.yaw[i], 6.0
    env.tracker.idx, env.tracker.s = i, float(r.cum[i])
    infos = []
    for _ in range(40):
        a = env.expert_action()
        obs, rew, term, trunc, info = env.step(np.array([a[0], 1.0]))
        infos.append(info)
        if term or trunc:
            break
    return infos


def test_red_light_run_terminates_only_when_configured():
    infos = _red_light_run(terminate_red_light=True)
    last = infos[-1]
    assert last["termination"] == "red_light" and last["red_light_run"] == 1.0
    assert last["failure"] == 1.0 and sum(i["red_light_run"] for i in infos) == 1.0
    # the default keeps every other reward's episodes as they were: the fact, no termination
    infos = _red_light_run()
    assert sum(i["red_light_run"] for i in infos) == 1.0
    assert not any(i["termination"] == "red_light" for i in infos)
    # evaluation keeps one protocol for every reward
    infos = _red_light_run(mode="eval", terminate_red_light=True)
    assert sum(i["red_light_run"] for i in infos) == 1.0
    assert not any(i["termination"] == "red_light" for i in infos)
    with pytest.raises(ValueError, match="terminate_red_light must be true or false"):
        make(terminate_red_light=1)


def test_route_completion_lanes_and_comfort_facts():
    env = make()
    env.reset(seed=3)
    total = 0.0
    for _ in range(120):
        obs, r, term, trunc, info = env.step(env.expert_action())
        total += info["route_completion"]
        assert info["outside_lanes"] == 0.0 and info["off_center_time"] == 0.0
    # per-step completion sums to the share of the route driven, in percent
    assert total == pytest.approx(100 * info["route_progress"] / info["route_length"], abs=1e-6)
    assert total > 1.0
    # one metre to the right of the lane centre (inside max_lateral): the counter grows per step
    teleport(env, right=1.0)
    times = [env.step(env.expert_action() * [0, 0])[4]["off_center_time"] for _ in range(5)]
    assert np.allclose(np.diff(times), 0.1) and times[-1] >= 0.5
    # on the lane of the opposite direction (3.5 m to the left): outside the route's lanes
    env = make(max_lateral=10.0)
    env.reset(seed=3)
    teleport(env, right=-3.5, speed=3.0)
    assert env.step(np.zeros(2))[4]["outside_lanes"] == 1.0
    # a hard stop from 12 m/s breaks the longitudinal comfort limit, and the violation is held
    env = make(penalty_hold=2.0)
    env.reset(seed=3)
    env.world.ego["v"] = 12.0
    seen = [env.step(np.array([0.0, -1.0]))[4]["comfort_violations"] for _ in range(12)]
    assert max(seen) >= 1.0
    held = [env.step(np.array([0.0, 0.0]))[4]["comfort_violations"] for _ in range(40)]
    assert held[0] >= 1.0 and held[-1] == 0.0  # 2 s of hold, then it lapses


def test_ttc_violation_from_a_stopped_lead():
    env = make(density="regular", max_lateral=1e3)
    env.reset(seed=4)
    assert env._infr.facts(env.snapshot, env.tracker, 20.0, 0.0)["ttc_violation"] == 0.0
    env.snapshot.ego.speed = 10.0
    assert env._infr.facts(env.snapshot, env.tracker, 20.0, 0.0)["ttc_violation"] == 0.0  # 2 s away
    assert env._infr.facts(env.snapshot, env.tracker, 8.0, 0.0)["ttc_violation"] == 1.0  # 0.8 s
    assert env._infr.facts(env.snapshot, env.tracker, 30.0, 0.0)["ttc_violation"] == 1.0  # held
    assert env._infr.facts(env.snapshot, env.tracker, 8.0, 10.0)["ttc_violation"] == 1.0


def test_idle_time_ends_a_training_episode_standing_on_a_free_road_only():
    """env.idle_time (train mode): standing still with nothing ahead ends the episode as 'stuck'
    long before the 90 s stuck rule; off by default, never in evaluation; a red light or a lead
    actor within idle_gap holds the timer."""
    brake = np.array([0.0, -1.0], np.float32)

    def stand(mode, **kw):
        env = DriveEnv("grid", "empty", mode=mode, bev="cpu", **kw)
        env.reset(seed=1)
        for i in range(60):
            _, _, term, _, info = env.step(brake)
            if term:
                return i, info["termination"], env
        return None, None, env

    i, why, env = stand("train", idle_time=2.0)
    assert why == "stuck" and 20 <= i <= 25 and env.stuck_time < 5.0
    assert stand("train")[1] is None                       # off by default
    assert stand("eval", idle_time=2.0)[1] is None        # the evaluation protocol never uses it
    free = {"lead_distance": 50.0, "light_state": -1.0, "light_distance": 50.0}
    assert env._is_free_ahead(free)
    assert not env._is_free_ahead({**free, "lead_distance": 6.0})
    assert not env._is_free_ahead({**free, "light_state": 2.0, "light_distance": 4.0})
    assert env._is_free_ahead({**free, "light_state": 0.0, "light_distance": 4.0})  # green: go
    with pytest.raises(ValueError, match="idle_time"):
        DriveEnv("grid", "empty", idle_time=-1.0)
