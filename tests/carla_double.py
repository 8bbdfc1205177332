"""A test double of the CARLA *server side*, driven by the embedded simulator (LiteWorld).

No CARLA server can run where the tests run, so the backend is tested against this stand-in.

Real (the installed ``carla`` 0.9.16 client's own code):
  * every value type the backend builds or reads: Location, Rotation, Transform, Vector3D,
    BoundingBox, VehicleControl, WorldSettings, OpendriveGenerationParameters, TrafficLightState;
  * the map: ``world.get_map()`` is a real ``carla.Map`` parsed offline from the town's OpenDRIVE,
    so ``to_opendrive()``, ``get_waypoint()``, the traffic lights' stop waypoints and the lane
    markings of lane-invasion events are the client's own objects;
  * ``carla.Client`` itself where no server is needed (the connection-failure test).
Doubled (this module):
  * Client (versions, worlds, batches, Traffic Manager), World (settings, tick, snapshots,
    blueprint library, spawning, navigation), the actors, sensors and their events, walker AI
    controllers, traffic-light actors, the Traffic Manager, and ``carla.command`` (the real
    SpawnActor accepts only a blueprint from a live server).
How the doubled world moves: LiteWorld, rebuilt on the first tick after the set of actors
changed. The vehicle with role_name "hero" is LiteWorld's ego and moves under the last
VehicleControl applied to it (steer, throttle - brake); vehicles the backend put on autopilot are
bound, class by class in spawn order, to LiteWorld's vehicles, which LiteWorld places at its own
seeded spawn points (as a Traffic Manager teleport would) — seeded by the Traffic Manager's seed;
walkers are bound to LiteWorld's walkers; traffic-light actors show LiteWorld's light states;
collision events are LiteWorld's new ego contacts; lane-invasion events fire when the ego's lane
(per the real map's waypoint) changes within a road. Sensor data is delivered inside ``tick``
(the camera, optionally, from a timer thread after ``server.camera_delay`` s).
A stopped server (``server.crash()``) answers every request with the real client's time-out
error, immediately (the real one waits the timeout first).
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import math
import threading
import types

import carla
import numpy as np

from drivemind.maps.opendrive import load_xodr_text
from drivemind.sim import LiteWorld, SimConfig, TrafficParams
from drivemind.sim.snapshot import ActorClass, LightState
from drivemind.sim.tables import traffic_tables

CLIENT_VERSION = carla.Client("localhost", 1).get_client_version()  # no server needed

# blueprint id -> (base_type, wheels, half extent x, y, z)
VEHICLES = {
    "vehicle.lincoln.mkz_2020": ("car", 4, 2.45, 1.05, 0.75),
    "vehicle.audi.tt": ("car", 4, 2.09, 1.0, 0.7),
    "vehicle.tesla.model3": ("car", 4, 2.4, 1.05, 0.75),
    "vehicle.carlamotors.carlacola": ("truck", 4, 2.6, 1.3, 1.3),
    "vehicle.yamaha.yzf": ("motorcycle", 2, 1.1, 0.43, 0.63),
    "vehicle.harley-davidson.low_rider": ("motorcycle", 2, 1.18, 0.38, 0.64),
    "vehicle.diamondback.century": ("bicycle", 2, 0.82, 0.19, 0.53),
    "vehicle.bh.crossbike": ("bicycle", 2, 0.74, 0.43, 0.54),
}
WALKERS = [f"walker.pedestrian.{i:04d}" for i in range(1, 5)]
TL_STATE = {LightState.GREEN: carla.TrafficLightState.Green,
            LightState.YELLOW: carla.TrafficLightState.Yellow,
            LightState.RED: carla.TrafficLightState.Red,
            LightState.OFF: carla.TrafficLightState.Off}


def timeout_error(host, port, timeout):
    return RuntimeError(f"time-out of {int(timeout * 1000)}ms while waiting for the simulator, "
                        f"make sure the simulator is ready and connected to {host}:{port}")


# ------------------------------------------------------------------------------------ blueprints
class FakeAttribute:
    def __init__(self, id, value, recommended=(), modifiable=True):
        self.id, self.value, self.recommended_values = id, str(value), list(recommended)
        self.is_modifiable = modifiable

    def as_str(self):
        return self.value

    def as_int(self):
        return int(self.value)

    def as_float(self):
        return float(self.value)


class FakeBlueprint:
    def __init__(self, id, attrs: dict, tags=()):
        self.id, self.tags = id, list(tags)
        self._attrs = {k: (v if isinstance(v, FakeAttribute) else FakeAttribute(k, v))
                       for k, v in attrs.items()}

    def has_attribute(self, name):
        return name in self._attrs

    def get_attribute(self, name):
        return self._attrs[name]

    def set_attribute(self, name, value):
        if name not in self._attrs:
            raise IndexError(f"blueprint {self.id} has no attribute {name!r}")
        a = self._attrs[name]
        if not a.is_modifiable:
            raise RuntimeError(f"attribute {name!r} of {self.id} is not modifiable")
        a.value = str(value)

    def values(self) -> dict:
        return {k: a.value for k, a in self._attrs.items()}

    def __iter__(self):
        return iter(self._attrs.values())


class FakeBlueprintLibrary:
    def __init__(self, base_type: bool = True):
        bps = []
        for bid, (base, wheels, *_ext) in VEHICLES.items():
            attrs = {"role_name": "autopilot", "number_of_wheels": FakeAttribute(
                "number_of_wheels", wheels, modifiable=False),
                "color": FakeAttribute("color", "0,0,0", ["10,20,30", "200,10,10", "5,5,5"])}
            if base_type:  # 0.9.14+; 0.9.13 blueprints have no base_type
                attrs["base_type"] = FakeAttribute("base_type", base, modifiable=False)
            bps.append(FakeBlueprint(bid, attrs))
        for wid in WALKERS:
            bps.append(FakeBlueprint(wid, {"role_name": "pedestrian", "is_invincible": "true",
                                           "speed": FakeAttribute("speed", "1.4", ["1.4", "2.8"])}))
        bps.append(FakeBlueprint("controller.ai.walker", {"role_name": "controller"}))
        bps.append(FakeBlueprint("sensor.other.collision", {"role_name": "front"}))
        bps.append(FakeBlueprint("sensor.other.lane_invasion", {"role_name": "front"}))
        bps.append(FakeBlueprint("sensor.camera.rgb", {"role_name": "front", "image_size_x": 800,
                                                       "image_size_y": 600, "fov": 90}))
        self._bps = {b.id: b for b in bps}

    def filter(self, pattern):
        return [b for b in self._bps.values() if fnmatch.fnmatch(b.id, pattern)]

    def find(self, id):
        if id not in self._bps:
            raise IndexError(f"blueprint {id!r} not found")
        return copy.deepcopy(self._bps[id])  # the real client returns a copy too

    def __iter__(self):
        return iter(self._bps.values())


# ------------------------------------------------------------------------------------ commands
class FutureActor:
    """Stands for the actor a SpawnActor command creates (as carla.command.FutureActor)."""


class SpawnActor:
    def __init__(self, blueprint, transform, parent=None):
        self.bp_id, self.attrs = blueprint.id, blueprint.values()  # described at creation
        self.transform, self.parent, self.then_cmds = transform, parent, []

    def then(self, cmd):
        self.then_cmds.append(cmd)
        return self


class SetAutopilot:
    def __init__(self, actor, enabled=True, tm_port=8000):
        self.actor, self.enabled, self.tm_port = actor, enabled, tm_port


class DestroyActor:
    def __init__(self, actor):
        self.actor = actor


class Response:
    def __init__(self, actor_id=0, error=""):
        self.actor_id, self.error = actor_id, error

    def has_error(self):
        return bool(self.error)


# ------------------------------------------------------------------------------------ actors
class FakeActor:
    def __init__(self, world, id, type_id, attrs, transform, extent=(0.1, 0.1, 0.1), parent=None):
        self.world, self.id, self.type_id, self.attributes = world, id, type_id, dict(attrs)
        self.parent = parent
        self._tf = carla.Transform(carla.Location(x=transform.location.x, y=transform.location.y,
                                                  z=transform.location.z),
                                   carla.Rotation(yaw=transform.rotation.yaw))
        self._vel = carla.Vector3D()
        self._ang = carla.Vector3D()
        self.bounding_box = carla.BoundingBox(carla.Location(), carla.Vector3D(*extent))
        self.is_alive = True
        self.control = carla.VehicleControl()
        self.autopilot = None  # tm port when on autopilot
        self.target_velocity = None

    def _check(self):
        self.world.server.rpc()
        if not self.is_alive or self.id not in self.world.server.world.actors:
            raise RuntimeError(f"trying to operate on a destroyed actor; an actor's function was "
                               f"called, but the actor is already destroyed. (id {self.id})")

    def get_transform(self):
        return self._tf

    def get_location(self):
        return self._tf.location

    def get_velocity(self):
        return self._vel

    def get_angular_velocity(self):
        return self._ang

    def apply_control(self, control):
        self._check()
        self.control = control

    def set_target_velocity(self, v):
        self._check()
        self.target_velocity = v
        self.world._dirty = True

    def set_autopilot(self, enabled=True, port=8000):
        self._check()
        self.autopilot = port if enabled else None
        self.world._dirty = True

    def destroy(self):
        return self.world._destroy(self.id)


class FakeSensor(FakeActor):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.callback = None

    def listen(self, cb):
        self._check()
        self.callback = cb

    def stop(self):
        self.callback = None

    @property
    def is_listening(self):
        return self.callback is not None


class FakeWalkerController(FakeActor):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.started, self.destination, self.max_speed = False, None, None

    def start(self):
        self._check()
        self.started = True

    def stop(self):
        self.started = False

    def go_to_location(self, loc):
        self._check()
        self.destination = loc

    def set_max_speed(self, v):
        self._check()
        self.max_speed = float(v)


class FakeTrafficLight(FakeActor):
    def __init__(self, world, id, index, stop_waypoints, transform):
        super().__init__(world, id, "traffic.traffic_light", {}, transform)
        self.index, self._stop = index, stop_waypoints

    @property
    def state(self):
        lite = self.world.lite
        if lite is None:
            return carla.TrafficLightState.Red
        return TL_STATE[LightState(int(lite.light_state[self.index]))]

    def get_state(self):
        return self.state

    def get_stop_waypoints(self):
        return list(self._stop)


# ------------------------------------------------------------------------------------ events
class FakeCollisionEvent:
    def __init__(self, frame, actor, other_actor):
        self.frame, self.actor, self.other_actor = frame, actor, other_actor
        self.normal_impulse = carla.Vector3D(x=1.0)


class FakeLaneInvasionEvent:
    def __init__(self, frame, actor, markings):
        self.frame, self.actor, self.crossed_lane_markings = frame, actor, markings


class FakeImage:
    """BGRA bytes as carla.Image: B = frame % 256, G = 1, R = 2, A = 255."""

    def __init__(self, frame, width, height, fov):
        self.frame, self.width, self.height, self.fov = frame, width, height, fov
        px = np.empty((height, width, 4), np.uint8)
        px[..., 0], px[..., 1], px[..., 2], px[..., 3] = frame % 256, 1, 2, 255
        self.raw_data = px.tobytes()


class _Timestamp:
    def __init__(self, frame, elapsed):
        self.frame, self.elapsed_seconds, self.delta_seconds = frame, elapsed, 0.0


class _ActorSnapshot:
    def __init__(self, a):
        t = a._tf
        self.id = a.id
        self._tf = carla.Transform(carla.Location(x=t.location.x, y=t.location.y, z=t.location.z),
                                   carla.Rotation(yaw=t.rotation.yaw))
        self._vel = carla.Vector3D(x=a._vel.x, y=a._vel.y, z=a._vel.z)
        self._ang = carla.Vector3D(x=a._ang.x, y=a._ang.y, z=a._ang.z)

    def get_transform(self):
        return self._tf

    def get_velocity(self):
        return self._vel

    def get_angular_velocity(self):
        return self._ang


class FakeWorldSnapshot:
    def __init__(self, world):
        self.frame = world.frame
        self.timestamp = _Timestamp(world.frame, world.elapsed)
        self._actors = {i: _ActorSnapshot(a) for i, a in world.actors.items()}

    def find(self, actor_id):
        return self._actors.get(actor_id)

    def __iter__(self):
        return iter(self._actors.values())

    def __len__(self):
        return len(self._actors)


class FakeActorList(list):
    def filter(self, pattern):
        return FakeActorList(a for a in self if fnmatch.fnmatch(a.type_id, pattern))

    def find(self, actor_id):
        return next((a for a in self if a.id == actor_id), None)


# ------------------------------------------------------------------------------------ world
_ROADMAPS: dict = {}


def _roadmap(text, name):
    key = hashlib.sha1(text.encode()).hexdigest()
    if key not in _ROADMAPS:
        _ROADMAPS[key] = load_xodr_text(text, name, source=f"test double map {name}")
    return _ROADMAPS[key]


class FakeTrafficManager:
    def __init__(self, port):
        self.port, self.synchronous, self.seed = port, False, None
        self.hybrid, self.hybrid_radius, self.leading_distance, self.speed_difference = \
            False, None, None, None

    def get_port(self):
        return self.port

    def set_synchronous_mode(self, on):
        self.synchronous = bool(on)

    def set_random_device_seed(self, seed):
        self.seed = int(seed)

    def set_hybrid_physics_mode(self, on):
        self.hybrid = bool(on)

    def set_hybrid_physics_radius(self, r):
        self.hybrid_radius = float(r)

    def set_global_distance_to_leading_vehicle(self, d):
        self.leading_distance = float(d)

    def global_percentage_speed_difference(self, p):
        self.speed_difference = float(p)


class FakeWorld:
    def __init__(self, server, name, text, navigation=True):
        self.server, self.name, self.text, self.navigation = server, name, text, navigation
        self._map = carla.Map(f"Carla/Maps/{name}", text)  # the real client's map
        self.rm = _roadmap(text, name)
        self.settings = dict(synchronous_mode=False, no_rendering_mode=False,
                             fixed_delta_seconds=None, substepping=True,
                             max_substep_delta_time=0.01, max_substeps=10)
        self.frame, self.elapsed = 0, 0.0
        self.actors: dict[int, FakeActor] = {}
        self.lite = None
        self._dirty = False
        self._bind: dict[int, FakeActor] = {}
        self._lane_key = None
        self.pedestrian_seed, self.cross_factor = None, None
        self._nav = np.random.default_rng(0)
        self.ticks = 0
        lt = traffic_tables(self.rm, TrafficParams())["lights"]
        for i in range(len(lt.junction_of_light)):
            wps = []
            for lane in np.flatnonzero(lt.lane_light == i):
                x, y, _ = self.rm.pose_at(int(lane), float(self.rm.length[lane]) - 1.0)
                wp = self._map.get_waypoint(carla.Location(x=x, y=y, z=0.0))
                wps.append((wp.next_until_lane_end(0.1) or [wp])[-1])  # at the lane's end
            p = lt.pos[i]
            tf = carla.Transform(carla.Location(x=float(p[0]), y=float(p[1])), carla.Rotation())
            aid = server.new_id()
            self.actors[aid] = FakeTrafficLight(self, aid, i, wps, tf)
        aid = server.new_id()
        self.actors[aid] = FakeActor(self, aid, "spectator", {}, carla.Transform())

    # ---- plain requests
    def get_map(self):
        self.server.rpc()
        return self._map

    def get_settings(self):
        self.server.rpc()
        s = carla.WorldSettings()
        for k, v in self.settings.items():
            setattr(s, k, v)
        return s

    def apply_settings(self, s):
        self.server.rpc()
        for k in self.settings:
            self.settings[k] = getattr(s, k)
        return self.frame

    def get_blueprint_library(self):
        self.server.rpc()
        return self.server.library

    def get_actors(self, ids=None):
        self.server.rpc()
        acts = self.actors.values() if ids is None else [self.actors[i] for i in ids
                                                         if i in self.actors]
        return FakeActorList(acts)

    def get_actor(self, actor_id):  # like the real client: asks the server's current episode
        self.server.rpc()
        return self.server.world.actors.get(actor_id)

    def get_snapshot(self):
        self.server.rpc()
        return FakeWorldSnapshot(self.server.world)

    def set_pedestrians_seed(self, seed):
        self.server.rpc()
        self.pedestrian_seed = int(seed)
        self._nav = np.random.default_rng(int(seed))

    def set_pedestrians_cross_factor(self, f):
        self.server.rpc()
        self.cross_factor = float(f)

    def get_random_location_from_navigation(self):
        self.server.rpc()
        if not self.navigation:
            return None
        rm = self.rm
        p = int(self._nav.integers(len(rm.pts)))
        h = rm.yaw[p]
        off = rm.width[p] / 2 + 1.5  # on the sidewalk to the right of a lane
        return carla.Location(x=float(rm.pts[p, 0] - math.sin(h) * off),
                              y=float(rm.pts[p, 1] + math.cos(h) * off), z=0.0)

    # ---- spawning
    def _spawn(self, bp_id, attrs, transform, parent=None):
        if self.server.spawn_refuse and bp_id in self.server.spawn_refuse:
            raise RuntimeError("Spawn failed because of collision at spawn position")
        pid = parent.id if isinstance(parent, FakeActor) else parent
        if pid is not None and pid not in self.actors:
            raise RuntimeError(f"parent actor {pid} not found")
        if bp_id.startswith(("vehicle.", "walker.")):
            p = transform.location
            for a in self.actors.values():
                if a.type_id.startswith(("vehicle.", "walker.")):
                    q = a._tf.location
                    if math.hypot(p.x - q.x, p.y - q.y) < 1.0:
                        raise RuntimeError("Spawn failed because of collision at spawn position")
        aid = self.server.new_id()
        if bp_id.startswith("vehicle."):
            ext = VEHICLES[bp_id][2:]
            a = FakeActor(self, aid, bp_id, attrs, transform, ext)
        elif bp_id.startswith("walker.pedestrian"):
            a = FakeActor(self, aid, bp_id, attrs, transform, (0.3, 0.3, 0.9))
        elif bp_id == "controller.ai.walker":
            a = FakeWalkerController(self, aid, bp_id, attrs, transform, parent=pid)
        elif bp_id.startswith("sensor."):
            a = FakeSensor(self, aid, bp_id, attrs, transform, parent=pid)
        else:
            raise RuntimeError(f"the double cannot spawn {bp_id}")
        self.actors[aid] = a
        self._dirty = True
        self.server.spawned.append((bp_id, transform.location.x, transform.location.y,
                                    transform.rotation.yaw, a.id))
        return a

    def spawn_actor(self, blueprint, transform, attach_to=None):
        self.server.rpc()
        return self._spawn(blueprint.id, blueprint.values(), transform, attach_to)

    def try_spawn_actor(self, blueprint, transform, attach_to=None):
        try:
            return self.spawn_actor(blueprint, transform, attach_to)
        except RuntimeError as exc:
            if "collision" in str(exc):
                return None
            raise

    def _destroy(self, actor_id):
        self.server.rpc()
        a = self.actors.pop(actor_id, None)
        if a is None:
            return False
        a.is_alive = False
        self._dirty = True
        self.server.destroyed.append(a.type_id)
        return True

    # ---- ticking
    def _ego(self):
        return next((a for a in self.actors.values() if a.type_id.startswith("vehicle.")
                     and a.attributes.get("role_name") == "hero"), None)

    def tick(self, seconds=10.0):
        self.server.rpc()
        if self is not self.server.world:  # a handle from before a restart or a load
            return self.server.world.tick(seconds)
        self.server.ticks += 1
        if self.server.ticks == self.server.crash_at_tick:  # dies on this tick, back afterwards
            self.server.crash(restart_after=1)
            self.server.rpc()
        if not self.settings["synchronous_mode"]:
            raise AssertionError("test double: tick() while the world is asynchronous")
        for a in self.actors.values():
            if a.autopilot is not None and not self.server.tms[a.autopilot].synchronous:
                raise AssertionError("test double: autopilot vehicles on an asynchronous TM")
        dt = float(self.settings["fixed_delta_seconds"])
        self.frame += 1
        self.elapsed += dt
        self.ticks += 1
        events = []
        if self._dirty:
            self._dirty = False
            self._build_lite(dt)
        elif self.lite is not None:
            ego = self._ego()
            c = ego.control
            snap = self.lite.step((c.steer, c.throttle - c.brake))
            self._apply(snap)
            events = snap.collisions
        self._deliver(events)
        return self.frame

    def _build_lite(self, dt):
        ego = self._ego()
        self._bind, self.lite, self._lane_key = {}, None, None
        if ego is None:
            return
        autos = sorted((a for a in self.actors.values() if a.autopilot is not None),
                       key=lambda a: a.id)
        by_cls = {ActorClass.CAR: [], ActorClass.MOTORCYCLE: [], ActorClass.BICYCLE: []}
        for a in autos:
            base = VEHICLES[a.type_id][0]
            by_cls[{"motorcycle": ActorClass.MOTORCYCLE, "bicycle": ActorClass.BICYCLE}.get(
                base, ActorClass.CAR)].append(a)
        walkers = sorted((a for a in self.actors.values()
                          if a.type_id.startswith("walker.pedestrian")), key=lambda a: a.id)
        cfg = SimConfig(dt=dt, vehicles=len(by_cls[ActorClass.CAR]),
                        motorcycles=len(by_cls[ActorClass.MOTORCYCLE]),
                        bicycles=len(by_cls[ActorClass.BICYCLE]), walkers=len(walkers),
                        offroad_margin=None)
        self.lite = LiteWorld(self.rm, cfg)
        tms = [self.server.tms[a.autopilot] for a in autos]
        seed = tms[0].seed if tms and tms[0].seed is not None else (self.pedestrian_seed or 0)
        tv = ego.target_velocity
        speed = math.hypot(tv.x, tv.y) if tv is not None else 0.0
        t = ego._tf
        snap = self.lite.reset(seed=seed, ego_pose=(t.location.x, t.location.y,
                                                    math.radians(t.rotation.yaw)), ego_speed=speed)
        queues = {**{int(c): list(v) for c, v in by_cls.items()},
                  int(ActorClass.WALKER): list(walkers)}
        for lid, c, e in zip(snap.actors.id, snap.actors.cls, snap.actors.extent):
            q = queues.get(int(c))
            if q:
                a = q.pop(0)
                self._bind[int(lid)] = a
                a.bounding_box = carla.BoundingBox(carla.Location(),
                                                   carla.Vector3D(x=float(e[0]), y=float(e[1]), z=0.8))
        ego.bounding_box = carla.BoundingBox(carla.Location(), carla.Vector3D(
            x=cfg.ego.length / 2, y=cfg.ego.width / 2, z=0.75))
        self._apply(snap)

    def _apply(self, snap):
        self.last_lite_snapshot = snap
        ego, e = self._ego(), snap.ego
        z = ego._tf.location.z
        ego._tf = carla.Transform(carla.Location(x=e.x, y=e.y, z=z),
                                  carla.Rotation(yaw=math.degrees(e.yaw)))
        ego._vel = carla.Vector3D(x=e.speed * math.cos(e.yaw), y=e.speed * math.sin(e.yaw))
        ego._ang = carla.Vector3D(z=math.degrees(e.yaw_rate))
        A = snap.actors
        for k, lid in enumerate(A.id):
            a = self._bind.get(int(lid))
            if a is None:
                continue
            a._tf = carla.Transform(carla.Location(x=float(A.pos[k, 0]), y=float(A.pos[k, 1]),
                                                   z=a._tf.location.z),
                                    carla.Rotation(yaw=math.degrees(float(A.yaw[k]))))
            a._vel = carla.Vector3D(x=float(A.velocity[k, 0]), y=float(A.velocity[k, 1]))

    def _sensors(self, kind):
        ego = self._ego()
        return [a for a in list(self.actors.values()) if isinstance(a, FakeSensor)
                and a.type_id == kind and ego is not None and a.parent == ego.id and a.callback]

    def _deliver(self, lite_events):
        ego = self._ego()
        for s in self._sensors("sensor.other.collision"):
            for ev in lite_events:
                other = self._bind.get(int(ev.other_id))
                if other is not None:
                    s.callback(FakeCollisionEvent(self.frame, ego, other))
        if ego is not None:
            loc = ego._tf.location
            wp = self._map.get_waypoint(carla.Location(x=loc.x, y=loc.y, z=0.0))
            key = (wp.road_id, wp.lane_id) if wp is not None else None
            if self._lane_key is not None and key is not None and key != self._lane_key \
                    and key[0] == self._lane_key[0]:
                left = self._prev_wp.get_left_lane()
                marking = (self._prev_wp.left_lane_marking
                           if left is not None and left.lane_id == key[1]
                           else self._prev_wp.right_lane_marking)
                for s in self._sensors("sensor.other.lane_invasion"):
                    s.callback(FakeLaneInvasionEvent(self.frame, ego, [marking]))
            self._lane_key, self._prev_wp = key, wp
        for s in self._sensors("sensor.camera.rgb"):
            img = FakeImage(self.frame, int(s.attributes["image_size_x"]),
                            int(s.attributes["image_size_y"]), float(s.attributes["fov"]))
            if self.server.camera_delay:
                threading.Timer(self.server.camera_delay, s.callback, [img]).start()
            elif not self.server.camera_silent:
                s.callback(img)


# ------------------------------------------------------------------------------------ server
class FakeServer:
    """The server-side state shared by every client of one address."""

    def __init__(self, maps: dict[str, str], version: str = CLIENT_VERSION,
                 default_map: str | None = None, base_type: bool = True):
        self.maps, self.version = dict(maps), version
        self.default_map = default_map or next(iter(self.maps))
        self.library = FakeBlueprintLibrary(base_type)
        self.up = True
        self.restart_after = None  # while down: come back (restarted) after this many requests
        self.requests_while_down = 0
        self.ticks = 0  # over all worlds
        self.crash_at_tick: int | None = None  # crash (and come back restarted) on that tick
        self.camera_delay = 0.0
        self.camera_silent = False
        self.spawn_refuse: set = set()
        self.connections: list = []  # (host, port) of every Client made
        self.loads: list = []  # ("load_world", name) / ("generate", params)
        self.spawned: list = []  # (blueprint id, x, y, yaw in degrees, actor id) per spawn
        self.destroyed: list = []
        self.tms: dict[int, FakeTrafficManager] = {}
        self._next_id = 100
        self.world = FakeWorld(self, self.default_map, self.maps[self.default_map])

    def new_id(self):
        self._next_id += 1
        return self._next_id

    def rpc(self, host="localhost", port=2000, timeout=10.0):
        if not self.up:
            self.requests_while_down += 1
            if self.restart_after is not None and self.requests_while_down > self.restart_after:
                self.restart()
            else:
                raise timeout_error(host, port, timeout)

    def crash(self, restart_after: int | None = None, fresh: bool = True):
        """Stop answering; with ``restart_after``, come back once that many more requests have
        failed: as a fresh server (default map, asynchronous, no actors), or with ``fresh=False``
        as it was (a network outage)."""
        self.up = False
        self.restart_after = restart_after
        self.requests_while_down = 0
        self.fresh = fresh

    def restart(self):
        self.up, self.restart_after = True, None
        if getattr(self, "fresh", True):
            self.tms = {}
            self.world = FakeWorld(self, self.default_map, self.maps[self.default_map])

    def live_actors(self, prefix=""):
        return [a for a in self.world.actors.values() if a.type_id.startswith(prefix)]


class FakeClient:
    def __init__(self, server: FakeServer, host, port, worker_threads=0):
        self.server, self.host, self.port, self.timeout = server, host, port, 5.0
        server.connections.append((host, port))

    def _rpc(self):
        self.server.rpc(self.host, self.port, self.timeout)

    def set_timeout(self, seconds):
        self.timeout = float(seconds)

    def get_client_version(self):
        return CLIENT_VERSION

    def get_server_version(self):
        self._rpc()
        return self.server.version

    def get_world(self):
        self._rpc()
        return self.server.world

    def get_available_maps(self):
        self._rpc()
        return [f"/Game/Carla/Maps/{m}" for m in self.server.maps]

    def load_world(self, name, reset_settings=True):
        self._rpc()
        if name not in self.server.maps:
            raise RuntimeError(f"map '{name}' not found")
        self.server.loads.append(("load_world", name))
        self.server.world = FakeWorld(self.server, name, self.server.maps[name])
        return self.server.world

    def generate_opendrive_world(self, opendrive, parameters=None, reset_settings=True):
        self._rpc()
        nav = True if parameters is None else bool(parameters.enable_pedestrian_navigation)
        self.server.loads.append(("generate", parameters))
        self.server.world = FakeWorld(self.server, "OpenDriveMap", opendrive, navigation=nav)
        return self.server.world

    def get_trafficmanager(self, port=8000):
        self._rpc()
        return self.server.tms.setdefault(int(port), FakeTrafficManager(int(port)))

    def apply_batch_sync(self, commands, do_tick=False):
        self._rpc()
        world, out = self.server.world, []
        for cmd in commands:
            if isinstance(cmd, SpawnActor):
                try:
                    a = world._spawn(cmd.bp_id, cmd.attrs, cmd.transform, cmd.parent)
                except RuntimeError as exc:
                    out.append(Response(0, str(exc)))
                    continue
                for t in cmd.then_cmds:
                    self._run(t, a.id)
                out.append(Response(a.id))
            else:
                out.append(self._run(cmd, None))
        if do_tick:
            world.tick()
        return out

    def apply_batch(self, commands):
        self.apply_batch_sync(commands)

    def _run(self, cmd, future_id):
        world = self.server.world
        aid = future_id if cmd.actor is FutureActor else (
            cmd.actor.id if isinstance(cmd.actor, FakeActor) else cmd.actor)
        if isinstance(cmd, DestroyActor):
            return Response(aid, "" if world._destroy(aid) else f"actor {aid} not found")
        if isinstance(cmd, SetAutopilot):
            a = world.actors.get(aid)
            if a is None:
                return Response(aid, f"actor {aid} not found")
            a.autopilot = cmd.tm_port if cmd.enabled else None
            self.server.tms.setdefault(cmd.tm_port, FakeTrafficManager(cmd.tm_port))
            world._dirty = True
            return Response(aid)
        raise AssertionError(f"the double does not run {type(cmd).__name__}")


def make_api(server: FakeServer):
    """A stand-in for the ``carla`` module: the real module's value types, with Client and
    command doubled (see the module docstring)."""
    api = types.SimpleNamespace(**{k: getattr(carla, k) for k in dir(carla) if not k.startswith("_")})
    api.Client = lambda host, port, worker_threads=0: FakeClient(server, host, port, worker_threads)
    api.command = types.SimpleNamespace(SpawnActor=SpawnActor, SetAutopilot=SetAutopilot,
                                        DestroyActor=DestroyActor, FutureActor=FutureActor,
                                        Response=Response)
    return api
