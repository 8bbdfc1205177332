"""The Gymnasium driving env: routes, termination, observations and per-step facts.

    env = gymnasium.make("DriveMind-v0", town="Town02", density="regular")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())

It reads only ``WorldSnapshot``s from a backend and the RoadMap, so the backend can be swapped.
The reward it returns is the task reward (progress along the route, a penalty on failure); every
other reward is computed later from the facts in ``info`` (see ``FACT_KEYS``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, fields

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..bev import BevConfig, BevRenderer
from ..facts import FACT_KEYS  # noqa: F401  (the per-step facts in ``info``; re-exported)
from ..maps import load_town
from ..maps.routing import RouteError, nearest_spawn, random_route
from ..privileged import CriticalFacts
from ..sim.config import DENSITIES, SimConfig, check_options, density_config
from ..sim.snapshot import ActorClass, LightState, WorldSnapshot
from ..sim.world import LiteWorld
from .infractions import InfractionMonitor
from .routes import eval_routes
from .tracker import RouteTracker, corridor_lead, next_stop, route_commands, route_stops

BACKENDS = ("lite", "carla")
MODES = ("train", "eval")

TERMINATIONS = ("collision", "off_route", "stuck", "red_light", "arrived")
TRUNCATIONS = ("distance", "max_steps", "server_lost", "no_route")


@dataclass(frozen=True)
class EnvConfig:
    waypoints: int = 10  # K route points in the observation (DriveMind: 10 every 5 m)
    waypoint_spacing: float = 5.0  # m
    max_distance: float = 3000.0  # m driven per episode, then truncation
    max_route_length: float = 3000.0  # m; longer random routes are resampled
    min_route_length: float = 50.0
    arrival_distance: float = 5.0  # m before the goal that counts as arrival
    max_lateral: float = 3.0  # m off the route centre line: termination
    stuck_speed_kmh: float = 1.0
    stuck_time: float = 90.0  # s below stuck_speed_kmh: termination
    oscillation_window: int = 10  # steps of lateral offset whose std is lateral_oscillation
    light_range: float = 50.0  # m ahead searched for a traffic light (else light_state -1)
    lead_range: float = 50.0  # m ahead searched for a lead actor (else lead_distance = range)
    progress_weight: float = 1.0  # task reward per metre of progress along the route
    terminal_penalty: float = -10.0  # task reward added on a failure termination
    speed_scale: float = 10.0  # m/s per unit of the observed speed
    max_episode_steps: int | None = None  # optional step limit (truncation)
    eval_traffic_seed: int = 0  # eval mode: route i runs with traffic seed eval_traffic_seed + i
    # train mode only (evaluation keeps one protocol for every reward): running a red light ends
    # the episode (reward=carl sets it, as CaRL's env does)
    terminate_red_light: bool = False
    # train mode only: standing (below stuck_speed_kmh) this many seconds with a free road ahead (no
    # lead actor and no red or yellow light within idle_gap m) ends the episode as "stuck" (a
    # failure). None: off. Without it, standing still is a safe haven early in training: the
    # 90 s stuck rule's penalty lies too far ahead to matter (docs/env.md)
    idle_time: float | None = None
    idle_gap: float = 10.0  # m
    lane_center_grace: float = 0.5  # m from the nearest lane centre before off_center_time grows
    penalty_hold: float = 50.0  # s a comfort / TTC violation stays in its fact (CaRL: 500 ticks)
    # Found-RL's action guidance: each step's facts carry the built-in autopilot's action for the
    # observation the step starts from (vlm_action_*; the privileged teacher, a stand-in for the
    # VLM). Set by training when algo.guidance is not none.
    suggest_action: bool = False

    def __post_init__(self):
        if isinstance(self.waypoints, bool) or not isinstance(self.waypoints, int) or self.waypoints < 1:
            raise ValueError(f"env.waypoints must be a positive integer, got {self.waypoints!r}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("waypoints", "max_episode_steps", "eval_traffic_seed", "terminal_penalty",
                          "terminate_red_light", "suggest_action") or (f.name == "idle_time" and v is None):
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"env.{f.name} must be a positive number, got {v!r}")
        if not isinstance(self.suggest_action, bool):
            raise ValueError(f"env.suggest_action must be true or false, got {self.suggest_action!r}")
        if not isinstance(self.terminate_red_light, bool):
            raise ValueError(f"env.terminate_red_light must be true or false, got "
                             f"{self.terminate_red_light!r}")
        if self.max_episode_steps is not None and (not isinstance(self.max_episode_steps, int)
                                                   or self.max_episode_steps < 1):
            raise ValueError(f"env.max_episode_steps must be a positive integer or None, got "
                             f"{self.max_episode_steps!r}")
        if self.min_route_length >= self.max_route_length:
            raise ValueError("env.min_route_length must be below env.max_route_length")

    @classmethod
    def from_dict(cls, d: dict | None) -> "EnvConfig":
        d = dict(d or {})
        check_options(cls, d, "env")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


def _bev_config(bev) -> BevConfig:
    if bev is None:
        return BevConfig()
    if isinstance(bev, BevConfig):
        return bev
    if isinstance(bev, str):
        return BevConfig.from_dict({"preset": bev})
    if isinstance(bev, dict):
        return BevConfig.from_dict(bev)
    raise TypeError(f"bev must be a BevConfig, a preset name or a dict, got {type(bev).__name__}")


def _sim_config(density: str, sim) -> SimConfig:
    if density not in DENSITIES:
        raise ValueError(f"unknown density {density!r}; valid: {', '.join(DENSITIES)}")
    if sim is None:
        return density_config(density)
    if isinstance(sim, SimConfig):
        return density_config(density, base=sim)
    if isinstance(sim, dict):
        d = dict(sim)
        counts = {k: d.pop(k) for k in ("vehicles", "walkers", "motorcycles", "bicycles") if k in d}
        return density_config(density, base=SimConfig.from_dict(d), **counts)
    raise TypeError(f"sim must be a SimConfig or a dict, got {type(sim).__name__}")


class DriveEnv(gym.Env):
    """Route following in traffic. Observation dict: ``bev`` (uint8 CxHxW masks), ``ego``
    (speed / speed_scale, steering, yaw rate), ``waypoints`` (K x 2, ego frame, [-1, 1]).
    Action: Box([-1, 1]^2) = (steer, throttle > 0 / brake < 0)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, town: str = "grid", density: str = "regular", *, mode: str = "train",
                 backend: str = "lite", sim=None, bev=None, config=None, routes_file=None,
                 map_path=None, render_mode: str | None = None, carla=None, features=None, corridor: bool = False,
                 **overrides):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"unknown render_mode {render_mode!r}; valid: "
                             f"{', '.join(self.metadata['render_modes'])} or None")
        if isinstance(config, EnvConfig):
            config = config.to_dict()
        self.cfg = EnvConfig.from_dict({**(config or {}), **overrides})
        self.bev_cfg = _bev_config(bev)
        self.sim_cfg = _sim_config(density, sim)
        self.town, self.density, self.mode = town, density, mode
        self.render_mode = render_mode
        if backend == "carla":  # the server loads the town; its map becomes the RoadMap
            from ..carla_backend import CarlaBackend
            self.world = CarlaBackend(town, self.sim_cfg, carla, map_path=map_path)
            self.map = self.world.map
        else:
            if carla:
                raise ValueError("CARLA server options (carla=...) need backend='carla' (sim=carla)")
            self.map = load_town(town, search_path=map_path)
            self.world = LiteWorld(self.map, self.sim_cfg)
        self.bev = BevRenderer(self.map, self.bev_cfg)
        self._routes_file = routes_file
        self._detector = None  # privileged detector + reasoner (facts critical_count, risk_id)
        self._suggestion = None  # the privileged teacher's action for this step (suggest_action)
        self._eval_routes = None
        self._eval_i = 0
        if mode == "eval":  # load (or write) the fixed routes now, so a bad file fails here
            _ = self.eval_route_list
        c = self.cfg
        ego = self.sim_cfg.ego
        self.observation_space = spaces.Dict({
            "bev": spaces.Box(0, 255, self.bev_cfg.shape, np.uint8),
            "ego": spaces.Box(np.array([0.0, -1.0, -5.0], np.float32),
                              np.array([ego.max_speed / c.speed_scale, 1.0, 5.0], np.float32),
                              dtype=np.float32),
            "waypoints": spaces.Box(-1.0, 1.0, (c.waypoints, 2), np.float32),
        })
        # features=<encoder>: the frozen BEV encoder's features of each frame (the fast path)
        self.features = None
        if features:
            from ..bev.encoder import BevEncoder
            self.features = BevEncoder.load(features, bev_shape=self.bev_cfg.shape)
            self.observation_space.spaces["bev_features"] = spaces.Box(-1.0, 1.0, (self.features.dim,),
                                                                       np.float32)
        # corridor=True: a fixed readout of the BEV along the route ahead (bev.corridor)
        self.corridor = None
        if corridor:
            from ..bev.corridor import CorridorReadout
            self.corridor = CorridorReadout(self.bev_cfg, ego_half_length=self.sim_cfg.ego.length / 2)
            self.observation_space.spaces["bev_corridor"] = spaces.Box(-1.0, 1.0, (self.corridor.dim,),
                                                                       np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._pilot = None
        self.snapshot: WorldSnapshot | None = None
        self.tracker: RouteTracker | None = None

    # ------------------------------------------------------------------ routes
    @property
    def route(self):
        return self.tracker.route if self.tracker else None

    @property
    def eval_route_list(self):
        if self._eval_routes is None:
            self._eval_routes, self.eval_routes_path = eval_routes(self.map, self._routes_file)
        return self._eval_routes

    def _set_route(self, route, snap: WorldSnapshot):
        self.tracker = RouteTracker(route)
        self._stops = route_stops(route, snap.lights)
        self._commands = route_commands(route, self.map)
        self._route_in_junction = self.map.junction[route.lanes] >= 0
        e = snap.ego
        self.tracker.update(e.x, e.y, e.yaw)

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        c = self.cfg
        if self.mode == "eval":
            routes = self.eval_route_list
            i = options.pop("route_index", None)
            i = self._eval_i if i is None else int(i)
            if not 0 <= i < len(routes):
                raise ValueError(f"route_index {i} out of range 0..{len(routes) - 1}")
            self._eval_i = (i + 1) % len(routes)
            self.route_index = i
            route = routes[i]
            world_seed = c.eval_traffic_seed + i
        else:
            route = random_route(self.map, self.np_random, max_length=c.max_route_length,
                                 min_length=c.min_route_length)
            self.route_index = -1
            world_seed = int(self.np_random.integers(2 ** 31 - 1))
        if options:
            raise ValueError(f"unknown reset option(s) {sorted(options)}; valid: route_index (eval)")
        snap = self.world.reset(seed=world_seed, ego_pose=route.start)
        self.snapshot = snap
        self._set_route(route, snap)
        self.steps = 0
        self.distance = 0.0
        self.routes_completed = 0
        self.stuck_time = 0.0
        self.idle_time = 0.0
        self._free_ahead = False
        self._lat_hist = deque([self.tracker.lateral], maxlen=c.oscillation_window)
        self._prev_accel = 0.0
        self._beside: dict[int, float] = {}  # actor id -> along-heading offset, for overtakes
        self._infr = InfractionMonitor(self.map, c.lane_center_grace, c.penalty_hold, snap.dt)
        self._red_run, self._route_completion = False, 0.0
        self.bev.reset()
        if self._pilot is not None:
            self._pilot.set_route(route)
        self._suggestion = None
        obs = self._observe(snap)
        info = self._facts(snap, 0.0, None, 0.0, False)
        info.update(termination="", truncation="", route_index=self.route_index, arrived=False)
        return obs, info

    def step(self, action):
        a = np.asarray(action, dtype=np.float64)
        if a.size != 2:
            raise ValueError(f"action must have 2 values (steer, throttle_brake), got shape {a.shape}")
        a = a.reshape(2)
        if not np.all(np.isfinite(a)):
            raise ValueError(f"action contains a non-finite value: {a.tolist()}; check the policy "
                             f"output (NaN/inf usually means diverged network weights)")
        a = np.clip(a, -1.0, 1.0)
        # the teacher's suggestion for the observation this step starts from (before it moves)
        self._suggestion = self.expert_action() if self.cfg.suggest_action else None
        snap = self.world.step(a)
        lost = getattr(self.world, "interrupted", "")  # the backend restarted the world (CARLA)
        self.snapshot = snap
        c, e = self.cfg, snap.ego
        self.steps += 1
        s_before = self.tracker.s
        progress = self.tracker.update(e.x, e.y, e.yaw)
        self._route_completion = self._infr.route_completion(self.tracker)
        self._red_run = self._infr.red_light_run(self._stops, snap.lights.state, s_before,
                                                 self.tracker.s, e.extent[0])
        self.distance += e.speed * snap.dt
        self._lat_hist.append(self.tracker.lateral)
        self.stuck_time = self.stuck_time + snap.dt if e.speed * 3.6 < c.stuck_speed_kmh else 0.0
        # idle: standing with a free road ahead (judged on the previous step's facts)
        self.idle_time = (self.idle_time + snap.dt if e.speed * 3.6 < c.stuck_speed_kmh and self._free_ahead
                          else 0.0)
        collision = max(snap.collisions, key=lambda ev: ev.ego_speed) if snap.collisions else None
        termination = ""
        if collision is not None:
            termination = "collision"
        elif abs(self.tracker.lateral) > c.max_lateral:
            termination = "off_route"
        elif self.stuck_time > c.stuck_time:
            termination = "stuck"
        elif c.idle_time is not None and self.mode == "train" and self.idle_time > c.idle_time:
            termination = "stuck"
        elif self._red_run and c.terminate_red_light and self.mode == "train":
            termination = "red_light"
        arrived = not termination and self.tracker.remaining < c.arrival_distance
        if arrived:
            self.routes_completed += 1
            if self.mode == "eval":
                termination = "arrived"
        truncation = ""
        if lost:  # the server was lost and reconnected: this episode ends here, the run goes on
            termination, truncation = "", lost
        elif not termination:
            if self.distance >= c.max_distance:
                truncation = "distance"
            elif c.max_episode_steps is not None and self.steps >= c.max_episode_steps:
                truncation = "max_steps"
        if arrived and self.mode == "train" and not truncation:
            try:
                self._new_route(snap)
            except RouteError:  # an open road end: nothing to drive on to from here
                truncation = "no_route"
        reward = c.progress_weight * progress
        if termination and termination != "arrived":
            reward += c.terminal_penalty
        obs = self._observe(snap)
        info = self._facts(snap, progress, collision, reward,
                           bool(termination) and termination != "arrived")
        info.update(termination=termination, truncation=truncation, route_index=self.route_index,
                    arrived=bool(arrived))
        self._free_ahead = self._is_free_ahead(info)
        front = self.front_rgb()
        if front is not None:  # the backend's forward camera (CARLA with sim.carla.camera)
            info["front_rgb"] = front
        return obs, float(reward), bool(termination), bool(truncation), info

    def front_rgb(self):
        """The backend's forward camera frame for the current step (HxWx3 uint8), or None when it
        has none (the embedded simulator; CARLA without ``sim.carla.camera.enabled``). Steps put
        it in ``info["front_rgb"]`` (DriveVLM-RL's dynamic pathway reads it)."""
        get = getattr(self.world, "front_rgb", None)
        return get() if callable(get) else None

    def _new_route(self, snap):
        c = self.cfg
        goal = self.route.pts[-1]
        start = nearest_spawn(self.map, goal[0], goal[1])
        route = random_route(self.map, self.np_random, max_length=c.max_route_length,
                             min_length=c.min_route_length, start=start)
        self._set_route(route, snap)
        if self._pilot is not None:
            self._pilot.set_route(route)

    # ------------------------------------------------------------------ observation and facts
    def _observe(self, snap: WorldSnapshot) -> dict:
        e, c = snap.ego, self.cfg
        ahead = self.tracker.points_ahead(self.bev_cfg.route_ahead)
        bev = self.bev.step(snap, ahead)
        ego = np.array([min(e.speed / c.speed_scale, self.observation_space["ego"].high[0]),
                        e.steer, min(max(e.yaw_rate, -5.0), 5.0)], np.float32)
        wp = self.tracker.waypoints(e.x, e.y, e.yaw, c.waypoints, c.waypoint_spacing)
        obs = {"bev": bev, "ego": ego, "waypoints": wp}
        if self.features is not None:
            obs["bev_features"] = self.features.encode(bev)
        if self.corridor is not None:
            obs["bev_corridor"] = self.corridor.read(bev, wp * (c.waypoints * c.waypoint_spacing))
        return obs

    def _is_free_ahead(self, info: dict) -> bool:
        """No lead actor and no red or yellow light within ``idle_gap`` m ahead (``idle_time``)."""
        gap = self.cfg.idle_gap
        held = info["light_state"] in (1, 2) and info["light_distance"] < gap
        return info["lead_distance"] >= gap and not held

    def _overtakes(self, snap: WorldSnapshot) -> int:
        """Vehicles that went from ahead of the ego's front to behind its rear since the last step,
        within 6 m laterally, while the ego was faster (ASAP's overtake count)."""
        e, a = snap.ego, snap.actors
        hl = e.extent[0]
        c, s = math.cos(e.yaw), math.sin(e.yaw)
        dx, dy = a.pos[:, 0] - e.x, a.pos[:, 1] - e.y
        along, lat = dx * c + dy * s, -dx * s + dy * c
        near = np.flatnonzero((np.abs(along) < 30.0) & (np.abs(lat) < 6.0)
                              & (a.cls != int(ActorClass.WALKER)))
        count, now = 0, {}
        for k in near:
            aid, x = int(a.id[k]), float(along[k])
            now[aid] = x
            before = self._beside.get(aid)
            speed = math.hypot(a.velocity[k, 0], a.velocity[k, 1])
            if (before is not None and before > hl + a.extent[k, 0] - 1.0
                    and x < -(hl + a.extent[k, 0]) + 1.0 and e.speed > speed):
                count += 1
                now[aid] = -math.inf  # counted once
            elif before == -math.inf:
                now[aid] = -math.inf
        self._beside = now
        return count

    def _facts(self, snap: WorldSnapshot, progress: float, collision, reward: float,
               failure: bool) -> dict:
        e, c, tr = snap.ego, self.cfg, self.tracker
        hl, hw = e.extent
        # traffic light ahead on the route
        light_state, light_dist = -1, c.light_range
        d, li = next_stop(self._stops, tr.s, offset=hl, behind=hl)  # passed once our centre is
        if li >= 0 and d <= c.light_range:
            st = int(snap.lights.state[li])
            if st != LightState.OFF:
                light_state, light_dist = st, max(d, 0.0)
        gap, who = corridor_lead(tr.route, tr.idx, tr.s, e.x, e.y, snap.actors, hl, hw, c.lead_range,
                                 in_junction=self._route_in_junction)
        lead_speed = float(np.hypot(*snap.actors.velocity[who])) if who >= 0 else 0.0
        lat = self._lat_hist
        n = len(lat)
        mean = sum(lat) / n
        osc = math.sqrt(sum((v - mean) ** 2 for v in lat) / n) if n > 1 else 0.0
        jerk = (e.accel - self._prev_accel) / snap.dt
        self._prev_accel = e.accel
        return {
            "speed_kmh": e.speed * 3.6, "steer": e.steer, "throttle": e.throttle, "brake": e.brake,
            "accel": e.accel, "yaw_rate": e.yaw_rate, "lateral_accel": e.speed * e.yaw_rate,
            "jerk": jerk, "lateral_offset": tr.lateral, "heading_error": tr.heading_error,
            "lateral_oscillation": osc,
            "progress": progress, "route_progress": tr.s, "route_length": tr.route.length,
            "route_remaining": tr.remaining, "distance": self.distance,
            "routes_completed": float(self.routes_completed),
            "collision": float(collision is not None),
            "collision_class": float(int(collision.other_class)) if collision else 0.0,
            "collision_speed_kmh": collision.ego_speed * 3.6 if collision else 0.0,
            "collision_other_speed_kmh": collision.other_speed * 3.6 if collision else 0.0,
            "offroad": float(collision is not None and collision.other_class == ActorClass.STATIC),
            "stuck_time": self.stuck_time, "light_state": float(light_state),
            "light_distance": float(light_dist),
            "lead_distance": float(min(gap, c.lead_range)), "lead_speed_kmh": lead_speed * 3.6,
            "overtakes": float(self._overtakes(snap)), "failure": float(failure),
            "task_reward": float(reward), "time": snap.time,
            "command": float(self._commands[tr.idx]),
            **self._critical(snap),
            "route_completion": float(self._route_completion),
            "red_light_run": float(self._red_run),
            **self._suggestion_facts(),
            **self._infr.facts(snap, tr, gap, lead_speed),
        }

    def _suggestion_facts(self) -> dict:
        s = self._suggestion
        if s is None:
            return {"vlm_action_steer": 0.0, "vlm_action_accel": 0.0, "vlm_action_available": 0.0}
        return {"vlm_action_steer": float(s[0]), "vlm_action_accel": float(s[1]),
                "vlm_action_available": 1.0}

    def _critical(self, snap: WorldSnapshot) -> dict:
        """DriveVLM-RL's dynamic-pathway gate and risk description from ground truth: the
        privileged detector (stand-in for YOLOv8: critical-class actors in a forward cone) and the
        privileged reasoner (stand-in for the LVLM: the canonical risk description, as an index
        into ``drivemind.privileged.RISK_VOCABULARY``); no VLM module is imported."""
        if self._detector is None:
            self._detector = CriticalFacts()
        return self._detector(snap)

    # ------------------------------------------------------------------ extras
    def render(self):
        if self.render_mode == "rgb_array":
            if self.snapshot is None:
                raise RuntimeError("call reset() before render()")
            return self.bev.rgb()
        return None

    def expert_action(self) -> np.ndarray:
        """The built-in autopilot's action for the current step (pure pursuit + IDM)."""
        if self.snapshot is None:
            raise RuntimeError("call reset() before expert_action()")
        if self._pilot is None:
            from ..sim.autopilot import Autopilot
            # the backend's table of which light ends each lane (None: the pilot does not know
            # the other approaches' lights when it gives way at junctions)
            lane_light = getattr(getattr(self.world, "lights", None), "lane_light", None)
            self._pilot = Autopilot(self.map, self.route, lane_light, self.sim_cfg.ego)
        if self._pilot.route is not self.route:
            self._pilot.set_route(self.route)
        return np.array(self._pilot.act(self.snapshot), np.float32)

    def close(self):
        self.world.close()
