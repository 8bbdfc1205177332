"""The CARLA backend: a live CARLA server (0.9.13-0.9.16) behind the embedded simulator's surface.

    with CarlaBackend("Town02", density_config("regular"), {"host": "gpu-box", "port": 2000}) as w:
        snap = w.reset(seed=0, ego_pose=route.start)      # WorldSnapshot, as LiteWorld's
        snap = w.step((steer, throttle_brake))

``sim=carla`` makes the env build this instead of ``LiteWorld``; nothing downstream knows which
ran. It puts the town on the server (``load_world`` for CARLA towns, ``generate_opendrive_world``
for built-in towns and .xodr files), reads the RoadMap back from the server's map through the
same OpenDRIVE loader the embedded simulator uses, runs the world synchronously at SimConfig.dt
with the Traffic Manager synchronous, seeded and in hybrid physics, spawns the density's vehicles,
motorcycles and bicycles (batch commands, autopilot) and walkers (batch commands, AI controllers),
and turns every tick into a WorldSnapshot. Sensors (collision, lane invasion, an optional forward
RGB camera) deliver through callbacks into queues that are drained or read with a timeout.

Every carla call goes through ``api`` (the ``carla`` module unless a test passes a stand-in).
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import queue
import time
import weakref

import numpy as np

from ..maps.spatial import lane_grid, nearest_point, off_road
from ..sim.config import SimConfig
from ..sim.snapshot import (ActorClass, Actors, CollisionEvent, EgoState, LightState,
                            TrafficLights, WorldSnapshot)
from ..sim.world import validate_action
from .actors import actor_class, blueprints_by_class, pick_spawn_points
from .config import CarlaConfig
from .connection import (CarlaConnectionError, connect, how_to_start, put_town,
                         roadmap_from_server)

log = logging.getLogger(__name__)

LIGHT_STATES = {"Red": LightState.RED, "Yellow": LightState.YELLOW, "Green": LightState.GREEN,
                "Off": LightState.OFF, "Unknown": LightState.OFF}
CONTACT_MEMORY = 1.0  # s: a collision with the same actor within this is the same contact


class CarlaBackendError(RuntimeError):
    """The server answered but refused something (spawning the ego, a sensor)."""


def default_api():
    import carla  # noqa: PLC0415  (only this package and drivemind.maps.opendrive import carla)

    return carla


class SensorQueue:
    """A sensor callback that puts data into a queue; read without spinning."""

    def __init__(self):
        self.q: queue.Queue = queue.Queue()

    def __call__(self, data):
        self.q.put(data)

    def drain(self) -> list:
        """Everything delivered so far (returns at once)."""
        out = []
        while True:
            try:
                out.append(self.q.get_nowait())
            except queue.Empty:
                return out

    def wait_frame(self, frame: int, timeout: float):
        """The first item of ``frame`` or later, waiting at most ``timeout`` s (None if none came);
        older items are dropped."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                item = self.q.get(timeout=left)
            except queue.Empty:
                return None
            if item.frame >= frame:
                return item


class _LightTable:
    """The server's traffic lights in a fixed order, with the lane each one ends (the autopilot
    reads ``lane_light`` as it reads the embedded simulator's table)."""

    def __init__(self, actors, lane_light, pos, yaw, stop_lines):
        self.actors, self.lane_light = actors, lane_light
        self.pos, self.yaw, self.stop_lines = pos, yaw, stop_lines
        self.ids = np.array([a.id for a in actors], np.int64)


def _close_ref(ref):
    obj = ref()
    if obj is not None:
        obj.close()


class CarlaBackend:
    backend = "carla"

    def __init__(self, town: str, config: SimConfig | None = None, carla=None, *, map_path=None,
                 api=None):
        self.cfg = config or SimConfig()  # what is simulated (as LiteWorld.cfg)
        self.carla = CarlaConfig.from_dict(carla)  # where the server is and how to drive it
        self.town, self.map_path = str(town), map_path
        self.api = api if api is not None else default_api()
        self.rng = np.random.default_rng(0)
        self.interrupted = ""  # set by a step that had to reconnect: "server_lost"
        self.reconnects = 0
        self.lane_invasions: list[str] = []  # marking types the ego crossed in the last step
        self.camera_image: np.ndarray | None = None  # HxWx3 uint8 of the last step (camera on)
        self.spawned = dict(vehicles=0, motorcycles=0, bicycles=0, walkers=0)
        self.frame, self.time = 0, 0.0
        self.client = self.world = self.tm = None
        self._orig_settings = None
        self._ego = None
        self._prev_pose = None
        self._sensors: list = []
        self._controllers: list = []
        self._npc_ids: list[int] = []  # vehicles and walkers we spawned
        self._stale_ids: list[int] = []  # actors of a connection we lost, destroyed when we can
        self._closed = False
        self._atexit = functools.partial(_close_ref, weakref.ref(self))
        atexit.register(self._atexit)
        try:
            self._setup(first=True)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ connection and world
    def _setup(self, first: bool = False):
        cfg, api = self.carla, self.api
        self.client = connect(api, cfg.host, cfg.port, cfg.timeout)
        self.world = put_town(api, self.client, self.town, cfg, self.map_path)
        rm = roadmap_from_server(self.world, self.town, cfg.address)
        self._cmap = self.world.get_map()  # fetched once per world (spawn heights)
        if first:
            self.map = rm
            self._grid = lane_grid(rm)
            self._orig_settings = self.world.get_settings()
        elif rm.n_lanes != self.map.n_lanes or not np.allclose(rm.length, self.map.length):
            raise CarlaConnectionError(f"after reconnecting, the CARLA server at {cfg.address} "
                                       f"runs a different map than {self.town!r}")
        s = self.world.get_settings()
        s.synchronous_mode = True
        s.fixed_delta_seconds = self.cfg.dt
        s.substepping = True
        s.max_substep_delta_time = 0.01
        s.max_substeps = max(1, min(16, math.ceil(self.cfg.dt / 0.01 - 1e-9)))
        s.no_rendering_mode = not cfg.render
        self.world.apply_settings(s)
        tm = self.tm = self.client.get_trafficmanager(cfg.tm_port)
        tm.set_synchronous_mode(True)
        tm.set_hybrid_physics_mode(bool(cfg.hybrid_physics))
        tm.set_hybrid_physics_radius(float(cfg.hybrid_radius))
        tm.set_global_distance_to_leading_vehicle(float(cfg.tm_leading_distance))
        if cfg.tm_speed_difference is not None:
            tm.global_percentage_speed_difference(float(cfg.tm_speed_difference))
        lib = self.world.get_blueprint_library()
        self._bps = blueprints_by_class(lib)
        try:
            self._ego_bp = lib.find(cfg.ego_blueprint)
        except IndexError:
            ids = sorted(b.id for c in (ActorClass.CAR, ActorClass.MOTORCYCLE) for b in self._bps[c])
            raise CarlaBackendError(f"the CARLA server at {cfg.address} has no blueprint "
                                    f"{cfg.ego_blueprint!r} (sim.carla.ego_blueprint); it has: "
                                    f"{', '.join(ids)}") from None
        if self._ego_bp.has_attribute("role_name"):
            self._ego_bp.set_attribute("role_name", "hero")
        self._sensor_bps = {k: lib.find(k) for k in ("sensor.other.collision",
                                                     "sensor.other.lane_invasion",
                                                     "sensor.camera.rgb",
                                                     "controller.ai.walker")}
        self.lights = self._light_table()

    def _light_table(self) -> _LightTable:
        rm = self.map
        tls = sorted(self.world.get_actors().filter("traffic.traffic_light"), key=lambda a: a.id)
        lane_light = np.full(rm.n_lanes, -1, np.int64)
        pos, yaw, lines = [], [], []
        for i, tl in enumerate(tls):
            segs, h0 = [], 0.0
            for wp in tl.get_stop_waypoints():
                loc = wp.transform.location
                h = math.radians(wp.transform.rotation.yaw)
                n = np.array([-math.sin(h), math.cos(h)]) * wp.lane_width / 2
                c = np.array([loc.x, loc.y])
                segs.append([c - n, c + n])
                lane = rm.key_index.get((wp.road_id, wp.section_id, wp.lane_id))
                if lane is None:  # a lane the RoadMap split or dropped: the nearest one
                    p = nearest_point(*self._grid.args(), rm.pts, rm.yaw, loc.x, loc.y, h,
                                      math.pi / 4, 4.0)
                    lane = int(rm.point_lane[p]) if p >= 0 else None
                if lane is not None:
                    lane_light[lane] = i
                h0 = h
            if not segs:  # a light that controls no lane of the map
                tl_loc = tl.get_transform().location
                segs = [[[tl_loc.x, tl_loc.y], [tl_loc.x, tl_loc.y]]]
            segs = np.array(segs, float)
            lines.append(segs)
            pos.append(segs.reshape(-1, 2).mean(0))
            yaw.append(h0)
        return _LightTable(tls, lane_light, np.array(pos, float).reshape(-1, 2),
                           np.array(yaw, float), lines)

    def _transform(self, x: float, y: float, yaw: float):
        api = self.api
        wp = self._cmap.get_waypoint(api.Location(x=x, y=y, z=0.0))
        z = (wp.transform.location.z if wp is not None else 0.0) + self.carla.spawn_lift
        return api.Transform(api.Location(x=x, y=y, z=z), api.Rotation(yaw=math.degrees(yaw)))

    # ------------------------------------------------------------------ reset
    def reset(self, seed: int | None = None, ego_pose=None, ego_speed: float = 0.0) -> WorldSnapshot:
        """Start an episode: the ego at ``ego_pose`` (None: a random spawn point; an index into
        the RoadMap's spawn points; or (x, y, yaw)), background traffic at seeded spawn points."""
        if self._closed:
            raise RuntimeError("this CarlaBackend is closed")
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        rm = self.map
        if ego_pose is None:
            ego_pose = int(self.rng.integers(len(rm.spawn)))
        if isinstance(ego_pose, (int, np.integer)):
            if not 0 <= ego_pose < len(rm.spawn):
                raise ValueError(f"spawn index {ego_pose} out of range 0..{len(rm.spawn) - 1}")
            ego_pose = tuple(rm.spawn[ego_pose])
        pose = tuple(float(v) for v in ego_pose)
        if len(pose) != 3 or not all(math.isfinite(v) for v in pose):
            raise ValueError(f"ego pose must be three finite numbers (x, y, yaw), got {ego_pose}")
        ego_speed = float(ego_speed)
        if not (math.isfinite(ego_speed) and 0.0 <= ego_speed <= self.cfg.ego.max_speed):
            raise ValueError(f"ego_speed must be in [0, {self.cfg.ego.max_speed}] m/s, got {ego_speed}")
        # the Traffic Manager (and walker navigation) get the episode's seed itself
        traffic_seed = (int(seed) if seed is not None else int(self.rng.integers(2 ** 31))) % 2 ** 31
        try:
            return self._start_episode(pose, ego_speed, traffic_seed)
        except RuntimeError as exc:
            if self._server_answers():
                self._destroy_episode_actors()
                raise
            self._reconnect(exc)  # the server went away while we set up: once more, afresh
            return self._start_episode(pose, ego_speed, traffic_seed)

    def _start_episode(self, pose, ego_speed: float, seed: int) -> WorldSnapshot:
        api, cfg, world = self.api, self.carla, self.world
        self._destroy_episode_actors()
        self.interrupted = ""
        x, y, yaw = pose
        if self._ego_bp.has_attribute("role_name"):  # (a client may hand out shared blueprints)
            self._ego_bp.set_attribute("role_name", "hero")
        ego = world.try_spawn_actor(self._ego_bp, self._transform(x, y, yaw))
        if ego is None:
            raise CarlaBackendError(
                f"could not spawn the ego ({self.carla.ego_blueprint}) at x={x:.1f} y={y:.1f} "
                f"yaw={math.degrees(yaw):.0f} deg on {self.town} at {cfg.address}: the spot is "
                f"taken (another client's actors?) or off the road")
        self._ego = ego
        self._collision_q, self._lane_q = SensorQueue(), SensorQueue()
        self._camera_q = SensorQueue() if cfg.camera.enabled else None
        self._attach("sensor.other.collision", self._collision_q)
        self._attach("sensor.other.lane_invasion", self._lane_q)
        if self._camera_q is not None:
            c = cfg.camera
            bp = self._sensor_bps["sensor.camera.rgb"]
            for k, v in (("image_size_x", c.width), ("image_size_y", c.height), ("fov", c.fov)):
                bp.set_attribute(k, str(v))
            self._attach("sensor.camera.rgb", self._camera_q,
                         api.Transform(api.Location(x=c.x, z=c.z), api.Rotation(pitch=c.pitch)))
        if ego_speed > 0:
            ego.set_target_velocity(api.Vector3D(x=ego_speed * math.cos(yaw),
                                                 y=ego_speed * math.sin(yaw), z=0.0))
        self.tm.set_random_device_seed(seed)
        world.set_pedestrians_seed(seed)
        self._spawn_vehicles((x, y))
        walkers = self._spawn_walkers()
        frame = world.tick(cfg.timeout)
        for ctrl, speed in walkers:  # controllers start after the tick that placed them
            ctrl.start()
            dest = world.get_random_location_from_navigation()
            if dest is not None:
                ctrl.go_to_location(dest)
            ctrl.set_max_speed(speed)
        self._track_actors()
        ws = world.get_snapshot()
        self._t0, self._frame0 = ws.timestamp.elapsed_seconds, ws.frame
        self._prev = None
        self._contacts: dict[int, float] = {}
        self._static_contact = False
        self._collision_q.drain()
        self._lane_q.drain()
        return self._observe(frame, (0.0, 0.0, 0.0), ws)

    def _attach(self, bp_id: str, sink: SensorQueue, transform=None):
        bp = self._sensor_bps[bp_id]
        sensor = self.world.spawn_actor(bp, transform or self.api.Transform(), attach_to=self._ego)
        self._sensors.append(sensor)
        sensor.listen(sink)

    def _spawn_vehicles(self, ego_xy):
        api, rng, sim, cfg = self.api, self.rng, self.cfg, self.carla
        want = ([ActorClass.CAR] * sim.vehicles + [ActorClass.MOTORCYCLE] * sim.motorcycles
                + [ActorClass.BICYCLE] * sim.bicycles)
        chosen = pick_spawn_points(self.map, rng, len(want), ego_xy, sim.traffic.spawn_gap)
        if len(chosen) < len(want):
            log.warning("%s has room for %d of %d background vehicles (spawn gap %.0f m)",
                        self.town, len(chosen), len(want), sim.traffic.spawn_gap)
        SpawnActor, SetAutopilot = api.command.SpawnActor, api.command.SetAutopilot
        batch, classes = [], []
        for cls, idx in zip(want, chosen):
            options = self._bps[cls]
            if not options:
                raise CarlaBackendError(f"the CARLA server at {cfg.address} has no {cls.name.lower()} "
                                        f"blueprints (needed by the density)")
            bp = options[int(rng.integers(len(options)))]
            if bp.has_attribute("role_name"):
                bp.set_attribute("role_name", "autopilot")
            if bp.has_attribute("color"):
                colors = bp.get_attribute("color").recommended_values
                if colors:
                    bp.set_attribute("color", colors[int(rng.integers(len(colors)))])
            sx, sy, syaw = self.map.spawn[idx]
            batch.append(SpawnActor(bp, self._transform(sx, sy, syaw)).then(
                SetAutopilot(api.command.FutureActor, True, cfg.tm_port)))
            classes.append(cls)
        got = {c: 0 for c in (ActorClass.CAR, ActorClass.MOTORCYCLE, ActorClass.BICYCLE)}
        errors = []
        for cls, r in zip(classes, self.client.apply_batch_sync(batch, False) if batch else []):
            if r.error:
                errors.append(r.error)
            else:
                self._npc_ids.append(int(r.actor_id))
                got[cls] += 1
        if errors:
            log.warning("%d of %d background vehicles failed to spawn: %s", len(errors),
                        len(batch), errors[0])
        self.spawned.update(vehicles=got[ActorClass.CAR], motorcycles=got[ActorClass.MOTORCYCLE],
                            bicycles=got[ActorClass.BICYCLE], walkers=0)

    def _spawn_walkers(self) -> list:
        api, rng, world, cfg = self.api, self.rng, self.world, self.carla
        n = self.cfg.walkers
        if n == 0:
            return []
        if not self._bps[ActorClass.WALKER]:
            raise CarlaBackendError(f"the CARLA server at {cfg.address} has no walker blueprints")
        world.set_pedestrians_cross_factor(float(cfg.walker_cross_factor))
        SpawnActor = api.command.SpawnActor
        batch = []
        for _ in range(n):
            loc = world.get_random_location_from_navigation()
            if loc is None:  # no navigation mesh (a generated world without pedestrian navigation)
                break
            options = self._bps[ActorClass.WALKER]
            bp = options[int(rng.integers(len(options)))]
            if bp.has_attribute("is_invincible"):
                bp.set_attribute("is_invincible", "false")
            batch.append(SpawnActor(bp, api.Transform(loc, api.Rotation())))
        walker_ids = [int(r.actor_id) for r in (self.client.apply_batch_sync(batch, False)
                                                if batch else []) if not r.error]
        ctrl_bp = self._sensor_bps["controller.ai.walker"]
        resp = self.client.apply_batch_sync(
            [SpawnActor(ctrl_bp, api.Transform(), wid) for wid in walker_ids], False) \
            if walker_ids else []
        pairs = [(w, int(r.actor_id)) for w, r in zip(walker_ids, resp) if not r.error]
        self._npc_ids.extend(w for w, _ in pairs)
        ctrls = list(world.get_actors([c for _, c in pairs])) if pairs else []
        self._controllers.extend(ctrls)
        lo, hi = self.cfg.traffic.walker_speed
        self.spawned["walkers"] = len(pairs)
        if len(pairs) < n:
            log.warning("%d of %d walkers spawned on %s", len(pairs), n, self.town)
        return [(c, float(rng.uniform(lo, hi))) for c in ctrls]

    def _track_actors(self):
        """Class and half-extent of every actor we spawned (fixed over the episode)."""
        self._track = {}
        for a in self.world.get_actors(list(self._npc_ids)) if self._npc_ids else []:
            c = actor_class(a.type_id, a)
            if c is None or c == ActorClass.STATIC:
                continue
            e = a.bounding_box.extent
            self._track[int(a.id)] = (int(c), float(e.x), float(e.y))
        e = self._ego.bounding_box.extent
        self._ego_extent = (float(e.x), float(e.y))

    # ------------------------------------------------------------------ step
    def step(self, action) -> WorldSnapshot:
        steer, tb = validate_action(action)
        if self._ego is None:
            raise RuntimeError("call reset() before step()")
        throttle, brake = max(tb, 0.0), max(-tb, 0.0)
        self.interrupted = ""
        try:
            self._ego.apply_control(self.api.VehicleControl(throttle=throttle, steer=steer,
                                                            brake=brake))
            frame = self.world.tick(self.carla.timeout)
            return self._observe(frame, (steer, throttle, brake))
        except RuntimeError as exc:
            if self._ego_alive():
                raise
            return self._recover(exc)

    def _observe(self, frame: int, control, ws=None) -> WorldSnapshot:
        ws = ws if ws is not None else self.world.get_snapshot()
        dt = self.cfg.dt
        es = ws.find(self._ego.id)
        if es is None:
            raise RuntimeError(f"the ego (actor {self._ego.id}) is gone from the server's world")
        tf, v = es.get_transform(), es.get_velocity()
        x, y, yaw = tf.location.x, tf.location.y, math.radians(tf.rotation.yaw)
        speed = v.x * math.cos(yaw) + v.y * math.sin(yaw)
        if self._prev is None:
            yaw_rate = accel = 0.0
        else:
            pyaw, pspeed = self._prev
            yaw_rate = ((yaw - pyaw + math.pi) % (2 * math.pi) - math.pi) / dt
            accel = (speed - pspeed) / dt
        self._prev = (yaw, speed)
        self._prev_pose = (x, y, yaw)
        self.frame = int(ws.frame - self._frame0)
        self.time = float(ws.timestamp.elapsed_seconds - self._t0)
        ids, cls, pos, yaws, ext, vel = [], [], [], [], [], []
        for aid, (c, hl, hw) in self._track.items():
            a = ws.find(aid)
            if a is None:  # destroyed (e.g. a dormant vehicle the TM removed)
                continue
            atf, av = a.get_transform(), a.get_velocity()
            ids.append(aid)
            cls.append(c)
            pos.append((atf.location.x, atf.location.y))
            yaws.append(math.radians(atf.rotation.yaw))
            ext.append((hl, hw))
            vel.append((av.x, av.y))
        n = len(ids)
        actors = Actors(np.array(ids, np.int64), np.array(cls, np.int8),
                        np.array(pos, float).reshape(n, 2), np.array(yaws, float),
                        np.array(ext, float).reshape(n, 2), np.array(vel, float).reshape(n, 2))
        lt = self.lights
        states = np.array([int(LIGHT_STATES.get(str(tl.state), LightState.OFF)) for tl in lt.actors],
                          np.uint8)
        lights = TrafficLights(lt.ids.copy(), lt.pos, lt.yaw, states, lt.stop_lines)
        ego = EgoState(x, y, yaw, speed, yaw_rate, accel, control[0], control[1], control[2],
                       self._ego_extent)
        events = self._collisions(ego)
        self.lane_invasions = [str(m.type) for ev in self._lane_q.drain()
                               for m in ev.crossed_lane_markings]
        if self._camera_q is not None:
            img = self._camera_q.wait_frame(int(ws.frame), self.carla.sensor_timeout)
            if img is None:
                log.warning("no camera frame within %.1f s (sim.carla.sensor_timeout); keeping "
                            "the previous one", self.carla.sensor_timeout)
            else:
                bgra = np.frombuffer(img.raw_data, np.uint8).reshape(img.height, img.width, 4)
                self.camera_image = bgra[:, :, 2::-1].copy()
        return WorldSnapshot(self.frame, self.time, dt, ego, actors, lights, events, 0, self.backend)

    def _collisions(self, ego: EgoState) -> list[CollisionEvent]:
        """New ego contacts: collision-sensor events (the same actor again within CONTACT_MEMORY s
        is the same contact) plus leaving the road by more than SimConfig.offroad_margin, as the
        embedded simulator counts it (other_id -1, class STATIC)."""
        events, now = [], self.time
        for ev in self._collision_q.drain():
            other = ev.other_actor
            c = actor_class(other.type_id, other) if other is not None else ActorClass.STATIC
            c = ActorClass.STATIC if c is None else c
            oid = int(other.id) if other is not None and c != ActorClass.STATIC else -1
            last = self._contacts.get(oid)
            self._contacts[oid] = now
            if last is not None and now - last <= CONTACT_MEMORY:
                continue
            if oid >= 0:
                ov = other.get_velocity()
                loc = other.get_location()
                events.append(CollisionEvent(oid, c, ego.speed, math.hypot(ov.x, ov.y),
                                             float(loc.x), float(loc.y)))
            else:
                events.append(CollisionEvent(-1, ActorClass.STATIC, ego.speed, 0.0, ego.x, ego.y))
        margin = self.cfg.offroad_margin
        if margin is not None:
            off = off_road(self.map, ego.x, ego.y, margin)
            if off and not self._static_contact and not any(e.other_id == -1 for e in events):
                events.append(CollisionEvent(-1, ActorClass.STATIC, ego.speed, 0.0, ego.x, ego.y))
            self._static_contact = off
        return events

    # ------------------------------------------------------------------ losing the server
    def _server_answers(self) -> bool:
        try:
            self.client.get_server_version()
            return True
        except RuntimeError:
            return False

    def _ego_alive(self) -> bool:
        """The server answers and our ego is still in its world (else the server restarted,
        was lost, or someone reloaded the world under us)."""
        try:
            self.client.get_server_version()
            return self.world.get_actor(self._ego.id) is not None
        except RuntimeError:
            return False

    def _reconnect(self, cause: Exception):
        cfg = self.carla
        log.warning("lost the CARLA server at %s (%s); reconnecting (%d attempts, %.0f s apart)",
                    cfg.address, cause, cfg.reconnect_attempts, cfg.reconnect_wait)
        self._stale_ids += self._forget_episode()  # handles of the old connection: ids only
        last: Exception = cause
        for attempt in range(cfg.reconnect_attempts):
            if attempt:
                time.sleep(cfg.reconnect_wait)
            try:
                self._setup()
                return
            except (CarlaConnectionError, RuntimeError) as exc:
                last = exc
                log.warning("reconnection attempt %d/%d to %s failed: %s", attempt + 1,
                            cfg.reconnect_attempts, cfg.address, exc)
        raise CarlaConnectionError(
            f"lost the CARLA server at {cfg.address} ({cause}) and {cfg.reconnect_attempts} "
            f"reconnection attempt(s) {cfg.reconnect_wait:g} s apart failed (last: {last}). "
            f"{how_to_start(cfg.port)}") from None

    def _recover(self, cause: Exception) -> WorldSnapshot:
        """Reconnect, restart the episode where the ego was, and flag the step: the env ends the
        episode as truncated ("server_lost") and training goes on."""
        pose = self._prev_pose or tuple(self.map.spawn[0])
        self._reconnect(cause)
        snap = self._start_episode(pose, 0.0,
                                   int(self.rng.integers(2 ** 31 - 1)))
        self.interrupted = "server_lost"
        self.reconnects += 1
        return snap

    # ------------------------------------------------------------------ clean-up
    def _forget_episode(self) -> list[int]:
        """Drop our handles of the episode's actors; returns their ids."""
        ids = [a.id for a in self._sensors] + [c.id for c in self._controllers] + self._npc_ids
        if self._ego is not None:
            ids.append(self._ego.id)
        self._sensors, self._controllers, self._npc_ids, self._ego = [], [], [], None
        return ids

    def _destroy_episode_actors(self):
        """Destroy what the last episode spawned (best effort: the server may be gone)."""
        for s in self._sensors:
            try:
                s.stop()
            except RuntimeError:
                pass
        for c in self._controllers:
            try:
                c.stop()
            except RuntimeError:
                pass
        ids = self._forget_episode() + self._stale_ids
        self._stale_ids = []
        if ids and self.client is not None:
            try:
                self.client.apply_batch_sync([self.api.command.DestroyActor(i) for i in ids], False)
            except RuntimeError as exc:
                log.warning("could not destroy %d actors on %s: %s", len(ids), self.carla.address, exc)

    def front_rgb(self) -> np.ndarray | None:
        """The forward camera's last frame (HxWx3 uint8), or None without a camera: what
        DriveVLM-RL's dynamic pathway reads (``drivemind.vlm.detectors.dynamic_view``)."""
        return self.camera_image

    def close(self):
        """Destroy our actors, give the server back asynchronous mode and the Traffic Manager
        back its asynchronous mode. Safe to call twice and when the server is gone."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        if self.client is None or self.world is None:
            return
        if not self._server_answers():  # gone: nothing to restore, and no timeout per actor
            log.warning("the CARLA server at %s is gone; its actors and settings stay as they "
                        "are", self.carla.address)
            return
        self._destroy_episode_actors()
        try:
            s = self.world.get_settings()
            s.synchronous_mode = False
            if self._orig_settings is not None:
                s.fixed_delta_seconds = self._orig_settings.fixed_delta_seconds
                s.no_rendering_mode = self._orig_settings.no_rendering_mode
            self.world.apply_settings(s)
        except RuntimeError as exc:
            log.warning("could not restore asynchronous mode on %s: %s", self.carla.address, exc)
        try:
            if self.tm is not None:
                self.tm.set_synchronous_mode(False)
        except RuntimeError as exc:
            log.warning("could not restore the Traffic Manager on %s: %s", self.carla.address, exc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ helpers (as LiteWorld)
    def light_for_lane(self, lane: int) -> int:
        return int(self.lights.lane_light[lane])
