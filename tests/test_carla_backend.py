"""The CARLA backend (drivemind.carla_backend).

No CARLA server can run here. What is real and what is doubled:
  * REAL: the ``carla`` 0.9.16 client's Client where no server is needed (a closed port: the
    connection error and its timing), every carla value type (Transform, Location, Rotation,
    Vector3D, BoundingBox, VehicleControl, WorldSettings, OpendriveGenerationParameters,
    TrafficLightState) and every map-side path: the worlds' maps are real ``carla.Map`` objects
    parsed from OpenDRIVE (the built-in towns, and Town01/Town02 as shipped), so the
    backend's RoadMap (``to_opendrive()`` -> our loader), spawn heights (``get_waypoint``), the
    traffic lights' stop waypoints and the lane markings of lane-invasion events are the client's.
  * DOUBLED (tests/carla_double.py): the server side — Client, World, actors, sensors and their
    events, blueprints, the Traffic Manager and batch commands — with the world moved by the
    embedded simulator (LiteWorld). See that module's docstring for exactly how.
"""

from __future__ import annotations

import logging
import math
import socket
import time
import warnings

import numpy as np
import pytest

import drivemind.carla_backend.backend as backend_mod
from carla_double import CLIENT_VERSION, FakeCollisionEvent, FakeServer, make_api
from drivemind.carla_backend import (CarlaBackend, CarlaBackendError, CarlaConfig,
                                     CarlaConnectionError, CarlaVersionWarning, SensorQueue)
from drivemind.carla_backend.actors import actor_class
from drivemind.envs.routes import map_fingerprint
from drivemind.maps import MapError, load_town
from drivemind.maps.towns import builtin_town_xodr
from drivemind.sim import ActorClass, LiteWorld, SimConfig, density_config
from drivemind.sim.autopilot import Autopilot

FAST = {"reconnect_wait": 0.0}


@pytest.fixture
def server():
    """A doubled CARLA server whose default world is a stand-in map (the built-in curves town)."""
    return FakeServer({"DoubleDefault": builtin_town_xodr("curves")})


def make(server, town="grid", density="regular", **carla):
    return CarlaBackend(town, density_config(density), {**FAST, **carla}, api=make_api(server))


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# --------------------------------------------------------------------------- connection (real client)
def test_no_server_one_clear_error_within_the_timeout():
    """The real carla.Client against a closed local port: one error, within the timeout, naming
    host:port, the timeout, how to start a server and sim=lite."""
    port = closed_port()
    t = time.monotonic()
    with pytest.raises(CarlaConnectionError) as ei:
        CarlaBackend("grid", SimConfig(), {"host": "127.0.0.1", "port": port, "timeout": 1.0})
    took = time.monotonic() - t
    assert took < 1.0 + 2.0, f"took {took:.1f} s with a 1 s timeout"
    msg = str(ei.value)
    for part in (f"127.0.0.1:{port}", "1 s timeout", "docker compose", "-RenderOffScreen",
                 f"-carla-rpc-port={port}", "sim=lite"):
        assert part in msg, (part, msg)


def test_no_server_through_the_env():
    from drivemind.envs import DriveEnv
    port = closed_port()
    with pytest.raises(CarlaConnectionError, match=f"127.0.0.1:{port}"):
        DriveEnv("grid", "empty", backend="carla", carla={"host": "127.0.0.1", "port": port,
                                                          "timeout": 0.5})


def test_version_mismatch_warns_naming_both(server):
    server.version = "0.9.14"
    with pytest.warns(CarlaVersionWarning, match=f"client {CLIENT_VERSION} and server 0.9.14"):
        make(server).close()
    server.version = "0.9.10"
    with pytest.warns(CarlaVersionWarning) as rec:
        make(server).close()
    msgs = [str(r.message) for r in rec]
    assert any("outside the versions this backend supports (0.9.13-0.9.16)" in m for m in msgs)
    assert any(f"client {CLIENT_VERSION} and server 0.9.10" in m for m in msgs)
    server.version = CLIENT_VERSION
    with warnings.catch_warnings():
        warnings.simplefilter("error", CarlaVersionWarning)
        make(server).close()


def test_bad_options_fail_with_the_valid_ones():
    with pytest.raises(ValueError, match="unknown sim.carla option.*'hots'.*valid.*'host'"):
        CarlaConfig.from_dict({"hots": "x"})
    with pytest.raises(ValueError, match="unknown sim.carla.camera option.*'widht'"):
        CarlaConfig.from_dict({"camera": {"widht": 3}})
    with pytest.raises(ValueError, match="port must be a port number"):
        CarlaConfig.from_dict({"port": 0})
    with pytest.raises(ValueError, match="timeout must be a positive"):
        CarlaConfig.from_dict({"timeout": -1})
    from drivemind.envs import DriveEnv
    with pytest.raises(ValueError, match="need backend='carla'"):
        DriveEnv("grid", "empty", carla={"port": 2000})


# --------------------------------------------------------------------------- towns and the RoadMap
def test_builtin_town_is_generated_from_opendrive_once(server):
    w = make(server, "grid")
    kind, params = server.loads[-1]
    assert kind == "generate"
    assert params.vertex_distance == pytest.approx(2.0) and params.enable_pedestrian_navigation
    assert server.world.text == builtin_town_xodr("grid")
    w.close()
    make(server, "grid").close()  # the server already runs exactly this OpenDRIVE: no regeneration
    assert len(server.loads) == 1
    make(server, "grid", reload_world=True).close()
    assert len(server.loads) == 2
    make(server, "random-3").close()  # a town generated from a seed is generated on the server too
    assert server.loads[-1][0] == "generate" and server.world.text == builtin_town_xodr("random-3")


@pytest.mark.parametrize("town", ["grid", "avenue"])
def test_roadmap_from_the_server_is_the_embedded_simulators(server, town):
    w = make(server, town, density="empty")
    assert w.map.name == town
    assert map_fingerprint(w.map) == map_fingerprint(load_town(town))
    np.testing.assert_allclose(w.map.pts, load_town(town).pts)
    w.close()


def test_carla_town_loaded_by_name_and_its_map_is_the_xodr(shared_maps):
    text = (shared_maps / "Town02.xodr").read_text()
    server = FakeServer({"DoubleDefault": builtin_town_xodr("curves"), "Town02": text})
    w = make(server, "Town02")
    assert server.loads == [("load_world", "Town02")]
    assert map_fingerprint(w.map) == map_fingerprint(load_town(str(shared_maps / "Town02.xodr")))
    w.close()
    make(server, "Town02").close()  # already loaded: not loaded again
    assert len(server.loads) == 1


def test_unknown_town_lists_the_servers(server):
    with pytest.raises(MapError, match="no town 'Town99'.*DoubleDefault.*Built-in towns"):
        make(server, "Town99")
    assert server.world.settings["synchronous_mode"] is False  # nothing left changed


def test_town_the_server_lacks_is_generated_from_the_map_path(shared_maps, server):
    w = CarlaBackend("Town01", SimConfig(), FAST, api=make_api(server), map_path=str(shared_maps))
    assert server.loads[-1][0] == "generate"
    assert server.world.text == (shared_maps / "Town01.xodr").read_text()
    w.close()


def test_lights_from_real_stop_waypoints_match_the_map(shared_maps):
    """Town02's traffic lights: the stop waypoints are real carla.Waypoints of the map; each
    controls lanes that end at a junction, as the embedded simulator's light table says."""
    text = (shared_maps / "Town02.xodr").read_text()
    server = FakeServer({"Town02": text})
    w = make(server, "Town02", density="empty")
    lite = LiteWorld(w.map, SimConfig())
    assert len(w.lights.actors) == len(lite.lights.junction_of_light) > 0
    np.testing.assert_array_equal(w.lights.lane_light, lite.lights.lane_light)
    np.testing.assert_allclose(w.lights.pos, lite.lights.pos, atol=0.05)
    w.close()


# --------------------------------------------------------------------------- settings and clean-up
def test_synchronous_mode_and_traffic_manager_then_restored(server):
    w = make(server, "grid", tm_port=8123, hybrid_radius=55.0, tm_speed_difference=10.0)
    s, tm = server.world.settings, server.tms[8123]
    assert s["synchronous_mode"] and s["fixed_delta_seconds"] == pytest.approx(0.1)
    assert s["no_rendering_mode"]  # no camera: the server need not render
    assert s["fixed_delta_seconds"] <= s["max_substep_delta_time"] * s["max_substeps"] + 1e-9
    assert tm.synchronous and tm.hybrid and tm.hybrid_radius == 55.0
    assert tm.leading_distance == 2.5 and tm.speed_difference == 10.0
    w.reset(seed=4)
    assert tm.seed == 4 and server.world.pedestrian_seed == 4
    for _ in range(3):
        w.step((0.0, 0.3))
    assert len(server.live_actors("vehicle.")) == 21 and len(server.live_actors("sensor.")) == 2
    w.close()
    assert not s["synchronous_mode"] and s["fixed_delta_seconds"] is None
    assert not s["no_rendering_mode"] and not tm.synchronous
    for prefix in ("vehicle.", "walker.", "sensor.", "controller."):
        assert server.live_actors(prefix) == [], prefix
    w.close()  # twice is fine


def test_context_manager_cleans_up_on_an_exception(server):
    with pytest.raises(KeyError):
        with make(server, "grid", density="drivevlm") as w:
            w.reset(seed=1)
            assert len(server.live_actors("walker.")) == 20
            raise KeyError("boom")
    assert not server.world.settings["synchronous_mode"]
    assert server.live_actors("vehicle.") == server.live_actors("walker.") == []
    assert server.live_actors("controller.") == []


def test_atexit_hook_closes_an_open_backend(server):
    w = make(server, "grid")
    w.reset(seed=0)
    w._atexit()  # what the interpreter runs at exit
    assert w._closed and not server.world.settings["synchronous_mode"]
    assert server.live_actors("vehicle.") == []


def test_failed_ego_spawn_is_clear_and_leaves_nothing(server):
    w = make(server, "grid")
    w.reset(seed=0)
    server.spawn_refuse = {"vehicle.lincoln.mkz_2020"}
    with pytest.raises(CarlaBackendError, match=r"could not spawn the ego .*x=.*localhost:2000"):
        w.reset(seed=1)
    assert server.live_actors("vehicle.") == server.live_actors("sensor.") == []
    w.close()


def test_unknown_ego_blueprint_lists_the_servers_and_restores(server):
    with pytest.raises(CarlaBackendError, match="no blueprint 'vehicle.nope'.*vehicle.audi.tt"):
        make(server, ego_blueprint="vehicle.nope")
    assert not server.world.settings["synchronous_mode"] and not server.tms[8000].synchronous


# --------------------------------------------------------------------------- spawning traffic
def test_drivevlm_preset_spawns_every_class_by_batch(server):
    w = make(server, "grid", density="drivevlm")
    snap = w.reset(seed=2)
    assert w.spawned == dict(vehicles=20, motorcycles=20, bicycles=20, walkers=20)
    counts = {c: int((snap.actors.cls == int(c)).sum()) for c in
              (ActorClass.CAR, ActorClass.MOTORCYCLE, ActorClass.BICYCLE, ActorClass.WALKER)}
    assert set(counts.values()) == {20}
    autos = [a for a in server.live_actors("vehicle.") if a.autopilot == 8000]
    assert len(autos) == 60  # SpawnActor(...).then(SetAutopilot(FutureActor, True, tm_port))
    ctrls = server.live_actors("controller.ai.walker")
    assert len(ctrls) == 20 and all(c.started and c.destination is not None for c in ctrls)
    lo, hi = density_config("drivevlm").traffic.walker_speed
    assert all(lo <= c.max_speed <= hi for c in ctrls)
    assert server.world.cross_factor == pytest.approx(0.3)
    w.close()


def test_spawn_points_are_seeded_and_spread(server):
    def spawns(seed):
        w = make(server, "grid", density="dense")
        server.spawned.clear()
        w.reset(seed=seed, ego_pose=0)
        out = [(x, y) for bp, x, y, _, _ in server.spawned if bp.startswith("vehicle.")]
        w.close()
        return np.array(out)

    a, b, c = spawns(7), spawns(7), spawns(8)
    np.testing.assert_allclose(a, b)
    assert len(a) == 41 and not np.allclose(a, c)  # the ego and 40 vehicles
    ego, others = a[0], a[1:]
    gap = SimConfig().traffic.spawn_gap
    d = np.hypot(*(others[:, None] - others[None]).transpose(2, 0, 1)) + np.eye(len(others)) * 1e9
    assert d.min() >= gap - 1e-6 and np.hypot(*(others - ego).T).min() >= gap - 1e-6


def test_classes_without_base_type_as_on_0_9_13():
    server = FakeServer({"DoubleDefault": builtin_town_xodr("curves")}, base_type=False)
    w = make(server, "grid", density="drivevlm")
    snap = w.reset(seed=0)
    for c in (ActorClass.MOTORCYCLE, ActorClass.BICYCLE):
        assert (snap.actors.cls == int(c)).sum() == 20
    w.close()


def test_actor_class_of_carla_type_ids():
    assert actor_class("walker.pedestrian.0007") == ActorClass.WALKER
    assert actor_class("vehicle.x.y", type("A", (), {"attributes": {"base_type": "Bicycle"}})) \
        == ActorClass.BICYCLE
    assert actor_class("vehicle.kawasaki.ninja", type("A", (), {"attributes": {
        "number_of_wheels": "2"}})) == ActorClass.MOTORCYCLE
    assert actor_class("vehicle.gazelle.omafiets", type("A", (), {"attributes": {
        "number_of_wheels": "2"}})) == ActorClass.BICYCLE
    assert actor_class("vehicle.carlamotors.firetruck", type("A", (), {"attributes": {
        "base_type": "truck"}})) == ActorClass.CAR
    assert actor_class("static.prop.streetbarrier") == ActorClass.STATIC
    assert actor_class("traffic.traffic_light") == ActorClass.STATIC
    assert actor_class("sensor.other.collision") is None


# --------------------------------------------------------------------------- snapshots
def test_each_tick_gives_the_embedded_simulators_snapshot(server):
    """Driven by the autopilot for 150 steps, the backend's snapshots equal those of a LiteWorld
    run with the same seed, ego pose and actions (to float32, the precision of carla types)."""
    w = make(server, "grid", density="drivevlm")
    rm = w.map
    from drivemind.maps.routing import random_route
    route = random_route(rm, np.random.default_rng(3))
    snap = w.reset(seed=11, ego_pose=route.start)
    lite = LiteWorld(load_town("grid"), density_config("drivevlm", offroad_margin=None))
    ref = lite.reset(seed=11, ego_pose=route.start)
    ids = {}  # lite actor id -> CARLA actor id, through the double's binding
    for lid, a in server.world._bind.items():
        ids[lid] = a.id
    pilot = Autopilot(rm, route, w.lights.lane_light)
    for step in range(150):
        assert snap.backend == "carla" and snap.frame == ref.frame == step
        assert snap.time == pytest.approx(ref.time) and snap.dt == ref.dt
        e, r = snap.ego, ref.ego
        np.testing.assert_allclose([e.x, e.y, e.speed, e.yaw_rate, e.accel, e.steer, e.throttle,
                                    e.brake], [r.x, r.y, r.speed, r.yaw_rate, r.accel, r.steer,
                                               r.throttle, r.brake], atol=2e-3)
        assert abs((e.yaw - r.yaw + math.pi) % (2 * math.pi) - math.pi) < 1e-5
        np.testing.assert_allclose(e.extent, r.extent, atol=1e-6)
        order = np.argsort(snap.actors.id)
        mapped = np.array([ids[int(i)] for i in ref.actors.id])
        rorder = np.argsort(mapped)
        np.testing.assert_array_equal(snap.actors.id[order], mapped[rorder])
        np.testing.assert_array_equal(snap.actors.cls[order], ref.actors.cls[rorder])
        np.testing.assert_allclose(snap.actors.pos[order], ref.actors.pos[rorder], atol=1e-3)
        np.testing.assert_allclose(snap.actors.velocity[order], ref.actors.velocity[rorder],
                                   atol=1e-3)
        np.testing.assert_allclose(snap.actors.extent[order], ref.actors.extent[rorder], atol=1e-6)
        dyaw = (snap.actors.yaw[order] - ref.actors.yaw[rorder] + math.pi) % (2 * math.pi) - math.pi
        assert np.abs(dyaw).max() < 1e-5
        np.testing.assert_array_equal(snap.lights.state, ref.lights.state)
        assert [c.other_class for c in snap.collisions] == [c.other_class for c in ref.collisions]
        action = pilot.act(snap)
        snap, ref = w.step(action), lite.step(action)
    w.close()


def test_vehicle_collision_reaches_the_snapshot_once(server, carla_env):
    """Full throttle along a route rear-ends a vehicle (seed 0 of the dense grid): one CAR event
    naming the CARLA actor, reported once for the contact."""
    env = carla_env("grid", "dense")
    env.reset(seed=0)
    for _ in range(400):
        a = env.expert_action()
        a[1] = 1.0
        _, _, term, trunc, info = env.step(a)
        if term or trunc:
            break
    assert info["termination"] == "collision" and info["collision_class"] == int(ActorClass.CAR)
    ev = env.snapshot.collisions
    assert len(ev) == 1 and ev[0].other_id in {a.id for a in server.live_actors("vehicle.")}
    env.close()


def test_collision_sensor_events_are_one_contact(server):
    w = make(server, "grid", density="regular")
    w.reset(seed=0)
    other = server.live_actors("vehicle.")[-1]
    for _ in range(3):  # the sensor reports a lasting contact every tick
        w._collision_q(FakeCollisionEvent(1, None, other))
    snap = w.step((0.0, 0.0))
    assert [(c.other_id, c.other_class) for c in snap.collisions] == [(other.id, ActorClass.CAR)]
    w._collision_q(FakeCollisionEvent(2, None, other))
    assert w.step((0.0, 0.0)).collisions == []  # the same contact
    for _ in range(11):
        w.step((0.0, 0.0))
    w._collision_q(FakeCollisionEvent(3, None, other))
    assert len(w.step((0.0, 0.0)).collisions) == 1  # > 1 s later: a new one
    prop = type("Prop", (), {"id": 9999, "type_id": "static.prop.bench01", "attributes": {}})()
    w._collision_q(FakeCollisionEvent(4, None, prop))
    assert [(c.other_id, c.other_class) for c in w.step((0.0, 0.0)).collisions] == \
        [(-1, ActorClass.STATIC)]
    w.close()


def test_leaving_the_road_is_a_static_collision_as_in_the_embedded_simulator(server):
    w = make(server, "grid", density="empty")
    lite = LiteWorld(load_town("grid"), SimConfig())
    snap, ref = w.reset(seed=0, ego_pose=5), lite.reset(seed=0, ego_pose=5)
    first = None
    for step in range(200):
        snap, ref = w.step((0.6, 0.5)), lite.step((0.6, 0.5))
        assert [c.other_class for c in snap.collisions] == [c.other_class for c in ref.collisions]
        if snap.collisions and first is None:
            first = step
    assert first is not None  # it did leave the road, and at the same step as LiteWorld
    w.close()


def test_lane_invasion_names_the_real_maps_marking(server):
    """Steering left out of lane -1 of the grid crosses its double yellow centre line (the
    marking comes from the real carla.Map's waypoint)."""
    w = make(server, "grid", density="empty")
    w.reset(seed=0, ego_pose=0)
    seen = []
    for _ in range(60):
        w.step((-0.15, 0.4))
        seen += w.lane_invasions
        if seen:
            break
    assert seen == ["SolidSolid"]
    w.close()


# --------------------------------------------------------------------------- camera
def test_camera_frames_arrive_in_rgb(server):
    w = make(server, "grid", density="empty", camera={"enabled": True, "width": 32, "height": 16})
    assert not server.world.settings["no_rendering_mode"]  # a camera needs rendering
    w.reset(seed=0)
    cam = server.live_actors("sensor.camera")[0]
    assert cam.attributes["image_size_x"] == "32" and cam.attributes["image_size_y"] == "16"
    for _ in range(3):
        w.step((0.0, 0.2))
        img = w.camera_image
        assert img.shape == (16, 32, 3) and img.dtype == np.uint8
        assert tuple(img[0, 0]) == (2, 1, server.world.frame % 256)  # BGRA -> RGB, this tick's
    server.camera_delay = 0.2  # delivered from another thread: waited for, not polled
    w.step((0.0, 0.2))
    assert w.camera_image[0, 0, 2] == server.world.frame % 256
    w.close()


def test_missing_camera_frame_times_out_without_spinning(server, caplog):
    w = make(server, "grid", density="empty", camera={"enabled": True, "width": 8, "height": 8},
             sensor_timeout=0.5)
    w.reset(seed=0)
    before = w.camera_image.copy()
    server.camera_silent = True
    cpu, wall = time.process_time(), time.monotonic()
    with caplog.at_level(logging.WARNING):
        w.step((0.0, 0.2))
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    assert 0.45 < wall < 2.0 and cpu < 0.5 * wall  # blocked on the queue, not busy-waiting
    assert "no camera frame within 0.5 s" in caplog.text
    np.testing.assert_array_equal(w.camera_image, before)
    w.close()


def test_sensor_queue_takes_the_frame_asked_for():
    q = SensorQueue()
    for f in (3, 4, 6):
        q(type("D", (), {"frame": f})())
    assert q.wait_frame(5, 0.1).frame == 6
    assert q.wait_frame(7, 0.05) is None
    q(type("D", (), {"frame": 8})())
    assert [d.frame for d in q.drain()] == [8] and q.drain() == []


# --------------------------------------------------------------------------- losing the server
@pytest.fixture
def carla_env(server, monkeypatch):
    """DriveEnv(backend="carla") on the doubled server (the backend's default ``carla`` module is
    swapped for the double, as a config-built env would import it)."""
    from drivemind.envs import DriveEnv
    api = make_api(server)
    monkeypatch.setattr(backend_mod, "default_api", lambda: api)

    def build(town="grid", density="regular", **carla):
        return DriveEnv(town, density, backend="carla", bev={"preset": "cpu"},
                        carla={**FAST, **carla})
    return build


def test_lost_server_truncates_the_episode_and_the_run_goes_on(server, carla_env):
    env = carla_env("grid", "regular")
    env.reset(seed=0)
    for _ in range(5):
        env.step(env.expert_action())
    pose = (env.snapshot.ego.x, env.snapshot.ego.y)
    server.crash(restart_after=2)  # comes back as a fresh server: default map, asynchronous
    _, _, term, trunc, info = env.step(env.expert_action())
    assert trunc and not term and info["truncation"] == "server_lost"
    assert env.world.reconnects == 1
    assert server.loads[-1][0] == "generate"  # the town was put back on the restarted server
    assert server.world.settings["synchronous_mode"] and server.tms[8000].synchronous
    assert len(server.live_actors("vehicle.")) == 21
    assert math.hypot(env.snapshot.ego.x - pose[0], env.snapshot.ego.y - pose[1]) < 3.0
    env.reset()
    for _ in range(5):
        _, _, term, trunc, info = env.step(env.expert_action())
    assert info["truncation"] == "" and env.world.interrupted == ""
    env.close()
    assert server.live_actors("vehicle.") == [] and not server.world.settings["synchronous_mode"]


def test_server_that_stays_away_is_one_clear_error(server, caplog):
    w = make(server, "grid", reconnect_attempts=2)
    w.reset(seed=0)
    server.crash()
    with pytest.raises(CarlaConnectionError, match=r"lost the CARLA server at localhost:2000 .*"
                       r"2 reconnection attempt\(s\).*sim=lite"):
        w.step((0.0, 0.5))
    destroyed = len(server.destroyed)
    with caplog.at_level(logging.WARNING):
        w.close()  # the server is gone: one check, no request per actor, no exception
    assert "is gone" in caplog.text and len(server.destroyed) == destroyed


def test_outage_without_restart_leaves_no_actors_behind(server):
    """The server comes back as it was (a network outage): the actors of the interrupted
    episode are destroyed through the new connection, then the episode is started again."""
    w = make(server, "grid", density="drivevlm")
    w.reset(seed=0)
    server.crash(restart_after=3, fresh=False)
    snap = w.step((0.0, 0.5))
    assert w.interrupted == "server_lost" and len(server.loads) == 1  # same world, not reloaded
    assert len(server.live_actors("vehicle.")) == 61 and len(server.live_actors("walker.")) == 20
    assert len(server.live_actors("controller.")) == 20 and len(server.live_actors("sensor.")) == 2
    assert len(snap.actors) == 80
    assert w.step((0.0, 0.5)).frame == 1 and w.interrupted == ""
    w.close()


# --------------------------------------------------------------------------- the env, end to end
def test_env_with_sim_carla_matches_sim_lite_step_for_step(carla_env):
    """DriveMind-v0 on the doubled server and on the embedded simulator, same seed and autopilot:
    the same observations (BEV masks to a few float32 pixels), rewards and facts."""
    from drivemind.envs import DriveEnv
    envc = carla_env("grid", "dense")
    envl = DriveEnv("grid", "dense", bev={"preset": "cpu"})
    oc, ic = envc.reset(seed=7)
    ol, il = envl.reset(seed=7)
    for _ in range(120):
        a = envl.expert_action()
        np.testing.assert_allclose(envc.expert_action(), a, atol=1e-4)
        oc, rc, tc, trc, ic = envc.step(a)
        ol, rl, tl, trl, il = envl.step(a)
        assert (oc["bev"] != ol["bev"]).mean() < 1e-3
        np.testing.assert_allclose(oc["waypoints"], ol["waypoints"], atol=1e-4)
        assert rc == pytest.approx(rl, abs=1e-4) and (tc, trc) == (tl, trl)
        for k, v in il.items():
            if isinstance(v, float):
                assert ic[k] == pytest.approx(v, abs=2e-3), k
    envc.close()
    envl.close()


def test_hydra_sim_carla_trains_and_survives_a_lost_server(server, monkeypatch, tmp_path):
    """`sim=carla` through the real Hydra configs and the training loop (tiny SAC), with the
    doubled server dying once mid-run: the run finishes, the server is left clean."""
    from hydra_config import config

    from drivemind.training import train
    from drivemind.training.build import env_kwargs

    api = make_api(server)
    monkeypatch.setattr(backend_mod, "default_api", lambda: api)
    cfg = config("sim=carla", "sim.carla.port=2100", "sim.carla.reconnect_wait=0", "density=regular",
                 "logger=quiet", "progress_bar=false", "obs.bev.size=48", "obs.features=null",
                 "algo.policy_kwargs.features_extractor_kwargs.bev_dim=32",
                 "algo.policy_kwargs.net_arch=[32]", "+env.max_episode_steps=30", "log_interval=1",
                 "algo.learning_starts=30", "algo.batch_size=8", "algo.buffer_size=200",
                 "total_timesteps=50", "checkpoint_every=0", "torch_threads=1")
    kw = env_kwargs(cfg)
    assert kw["backend"] == "carla" and kw["carla"]["port"] == 2100
    assert "carla" not in (kw["sim"] or {})
    server.crash_at_tick = 35
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "finished" and summary["steps"] == 50
    assert ("localhost", 2100) in server.connections
    assert [k for k, _ in server.loads] == ["generate", "generate"]  # again after the restart
    import csv
    with open(tmp_path / "run" / "logs" / "episodes.csv", newline="") as fh:
        ends = [r["truncation"] for r in csv.DictReader(fh)]
    assert ends.count("server_lost") == 1
    assert server.live_actors("vehicle.") == [] and not server.world.settings["synchronous_mode"]


def test_eval_on_a_carla_server_that_is_not_there_fails_in_one_line():
    """scripts/eval.py sim=carla (a policy or the autopilot evaluated on a CARLA server) with no
    server: the real carla client times out and the entry point prints one line naming host:port
    and the timeout (no server runs here, so nothing is doubled in this test)."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    with socket.socket() as s:  # a free local port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run([sys.executable, str(repo / "scripts" / "eval.py"), "policy=autopilot",
                        "town=grid", "density=empty", "routes=[0]", "sim=carla",
                        "sim.carla.host=127.0.0.1", f"sim.carla.port={port}", "sim.carla.timeout=1"],
                       cwd=repo, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert f"127.0.0.1:{port}" in p.stderr and "1 s timeout" in p.stderr and "sim=lite" in p.stderr
    assert "Traceback" not in p.stderr


# --------------------------------------------------------------------------- bench.py sim on CARLA
def test_bench_sim_on_carla_gives_the_embedded_simulators_figures(server, monkeypatch, capsys):
    """`bench.py sim --backend carla` (the Traffic Manager's traffic measured as ours is) against
    the doubled server, whose world the embedded simulator moves: the figures it reads from the
    snapshots equal `bench.py sim` on the embedded simulator for the same town, density, seed and
    simulated time, and the server is left clean."""
    from script_loader import load_script

    api = make_api(server)
    monkeypatch.setattr(backend_mod, "default_api", lambda: api)
    bench = load_script("bench")
    common = ["sim", "--town", "grid", "--density", "dense", "--seconds", "60", "--seed", "3",
              "--cores", "0"]
    lite = bench.main(common)
    carla = bench.main(common + ["--backend", "carla", "--carla", "port=2100",
                                 "--carla", "reconnect_wait=0"])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('{"what": "sim", "backend": "carla"')
    assert lite["backend"] == "lite" and carla["carla"] == {"port": 2100, "reconnect_wait": 0}
    assert ("localhost", 2100) in server.connections
    assert carla["vehicles"] == lite["vehicles"] == 40 and carla["steps"] == lite["steps"] == 600
    assert lite["npc_mean_speed_kmh"] > 5.0  # the traffic moved
    for key in ("npc_mean_speed_kmh", "npc_stopped_share_at_end", "npc_max_standing_s"):
        assert carla[key] == pytest.approx(lite[key], abs=0.011), key
    assert carla["npc_mean_speed_kmh_by_class"] == pytest.approx(lite["npc_mean_speed_kmh_by_class"], abs=0.011)
    assert (carla["ego_collisions"], carla["ego_routes_completed"]) == (lite["ego_collisions"],
                                                                        lite["ego_routes_completed"])
    # the standing clock counts red lights too: never below the simulator's own, which does not
    assert lite["npc_max_standing_s"] >= lite["npc_max_stuck_s"]
    # what only the embedded simulator knows is not made up
    assert carla["npc_collisions"] is None and carla["npc_max_stuck_s"] is None
    assert server.live_actors("vehicle.") == [] and not server.world.settings["synchronous_mode"]


def test_bench_sim_carla_options_fail_in_one_line(monkeypatch):
    from script_loader import load_script

    bench = load_script("bench")
    with pytest.raises(SystemExit, match=r"unknown sim.carla option\(s\) \['prot'\]; valid: .*'port'"):
        bench.main(["sim", "--backend", "carla", "--carla", "prot=2000"])
    with pytest.raises(SystemExit, match="--traffic sets the embedded simulator's .* tm_speed_difference"):
        bench.main(["sim", "--backend", "carla", "--traffic", "idm_T=1.0"])
    with pytest.raises(SystemExit, match="--carla sets a CARLA server's options; it needs --backend carla"):
        bench.main(["sim", "--carla", "port=2000"])
    port = closed_port()  # the real client, nobody listening: host:port and the timeout
    with pytest.raises(SystemExit, match=f"127.0.0.1:{port}.*1 s timeout"):
        bench.main(["sim", "--backend", "carla", "--town", "grid", "--cores", "0", "--carla",
                    "host=127.0.0.1", "--carla", f"port={port}", "--carla", "timeout=1"])


def test_snapshot_traffic_counts_each_vehicles_standing_by_id():
    """bench.py's SnapshotTraffic, fed snapshots by hand: vehicles are told apart by id (rows may
    come, go and reorder, as a server's actor lists do), walkers are left out, a vehicle's standing
    clock restarts when it moves."""
    from types import SimpleNamespace as NS

    from script_loader import load_script

    meter = load_script("bench").SnapshotTraffic()
    car, bike, walker = int(ActorClass.CAR), int(ActorClass.BICYCLE), int(ActorClass.WALKER)

    def snap(rows):  # rows: (id, class, speed)
        ids, cls, v = (np.array(c) for c in zip(*rows))
        return NS(dt=0.5, actors=NS(id=ids.astype(np.int64), cls=cls.astype(np.int8),
                                    velocity=np.stack([v, np.zeros(len(v))], 1)))

    meter.add(snap([(1, car, 0.0), (2, car, 10.0), (9, walker, 0.0)]))
    meter.add(snap([(2, car, 10.0), (1, car, 0.0), (9, walker, 0.0)]))  # reordered
    meter.add(snap([(1, car, 0.0), (3, bike, 0.0), (9, walker, 0.0)]))  # 2 gone, 3 new
    meter.add(snap([(3, bike, 0.0), (1, car, 5.0), (9, walker, 0.0)]))  # 1 drives off
    meter.add(snap([(1, car, 0.0), (3, bike, 0.0), (9, walker, 0.0)]))
    r = meter.result()
    assert r["npc_max_standing_s"] == 1.5  # car 1: three steps of 0.5 s; the walker's 2.5 s not counted
    assert meter.clock.tolist() == [0.5, 1.5]  # car 1 stood again for one step, bicycle 3 for three
    assert r["npc_mean_speed_kmh"] == pytest.approx(3.6 * (5 + 5 + 0 + 2.5 + 0) / 5, abs=0.01)
    # per class, as the embedded run counts it: summed over the steps it was there, over all steps
    assert r["npc_mean_speed_kmh_by_class"] == {"car": pytest.approx(3.6 * 15 / 5, abs=0.01),
                                                "bicycle": 0.0}
    assert r["npc_stopped_share_at_end"] == 1.0
