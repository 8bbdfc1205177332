"""The embedded ("lite") backend: one fixed step at a time on a RoadMap, returning WorldSnapshots.

    world = LiteWorld(load_town("Town02"), density_config("dense"))
    snap = world.reset(seed=0)
    snap = world.step((steer, throttle_brake))

Ego: kinematic bicycle. Background vehicles (cars, motorcycles, bicycles): IDM along lane paths
with random turns and per-vehicle speed offsets, MOBIL lane changes on multi-lane roads, overtaking
a slow leader in the oncoming lane of a two-way road (``traffic.overtake``), junction
reservations (a connector is entered only when no conflicting connector is reserved or occupied
by a vehicle not yet past the crossing, and the exit has room; long waiters are not starved),
traffic lights (two-phase, vehicle-actuated by default), and as a last resort a respawn of a
vehicle standing too long. Walkers cross at junctions and mid-block with gap acceptance. The same seed gives the same trajectories.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from ..maps.roadmap import BROKEN_MARKINGS, MIN_SPAWN_WIDTH, PAINTED_SOLID, MarkingType, RoadMap
from ..maps.spatial import lane_grid, nearest_point, off_road
from ..maps.validate import LEVEL
from . import kernels as K
from .config import SimConfig
from .snapshot import (ActorClass, Actors, CollisionEvent, EgoState, LightState, TrafficLights,
                       WorldSnapshot)
from .tables import pavements, predecessors as _predecessors, traffic_tables

log = logging.getLogger(__name__)

PATH_LEN = 6  # lanes of look-ahead each vehicle keeps
LC_EVERY = 5  # steps between lane-change decisions (MOBIL at 2 Hz with dt = 0.1 s)
MERGE_REACH = 40.0  # m before the point where its lane narrows from which a vehicle asks to be
#                    let into the lane beside (traffic.merge_yield)
CYCLE_EVERY = 10  # steps between looks for waits-for cycles (1 Hz with dt = 0.1 s)
_NO_CLEAR = np.zeros(0)  # the clear-point table the kernel gets when junction_release reads none
RESPAWN_EGO_GAP = 40.0  # m from the ego to a spawn point a vehicle is put back at ...
RESPAWN_EGO_NEAR = 15.0  # ... or this for one that has stood RESPAWN_NEAR_AFTER s where no
#                          free point is that far (a 150 m road: its cars stood at its open
#                          ends for good)
RESPAWN_NEAR_AFTER = 30.0  # s standing (v_stuck) after which the nearer points are taken
RESPAWN_WALKER_GAP = 6.0  # m from every walker to a spawn point a vehicle is put back at (a car's
#                           half length plus a walker's reach: never onto one crossing there)
EGO_TURN_REACH = 8.0  # m from the ego's nose to its lane's end within which it stands at the
#                       stop line (traffic.ego_turn)

RESPAWN_STOP_MARGIN = 6.5  # m between a respawn point's and a vehicle's centres beyond that
#                            vehicle's braking distance at traffic.brake_max (two half car lengths
#                            and 2 m): 11.8 m at 33 km/h, inside spawn_gap (12 m)
SIGHT_FROM = 9.2  # m/s: on lanes up to this fast (the default 30 km/h + 10 %) the traffic sees
#                   traffic.lookahead ahead (60 m, beyond sight_distance there); faster, sight_distance
SIGHT_DECEL = 3.0  # m/s^2: a vehicle sees far enough ahead to stop at this from its top speed
SIGHT_TIME = 2.0  # s of travel added to that (reaction and the gap kept)
SIGHT_MARGIN = 10.0  # m added to that


def sight_distance(v: float) -> float:
    """Metres a vehicle at ``v`` m/s looks ahead to stop comfortably (``SIGHT_DECEL``) for a
    standing obstacle: ``v**2 / (2 SIGHT_DECEL) + SIGHT_TIME v + SIGHT_MARGIN``."""
    return v * v / (2.0 * SIGHT_DECEL) + SIGHT_TIME * v + SIGHT_MARGIN


# per class: half length, half width, top speed range (m/s), max accel, comfortable decel
CLASS_PARAMS = {
    ActorClass.CAR: ((2.15, 2.45), (0.9, 1.0), (30.0, 30.0), 2.0, 3.0),
    ActorClass.MOTORCYCLE: ((1.05, 1.15), (0.4, 0.5), (30.0, 30.0), 3.0, 3.5),
    ActorClass.BICYCLE: ((0.85, 0.95), (0.3, 0.4), (3.5, 5.5), 1.0, 2.0),
}
WALKER_EXTENT = (0.3, 0.3)


def validate_action(action) -> tuple[float, float]:
    """(steer, throttle_brake) as floats; raises ValueError on bad shape, NaN/inf or |a| > 1."""
    if type(action) in (tuple, list) or (isinstance(action, np.ndarray) and action.ndim == 1):
        if len(action) == 2:  # the common case, without building an array every step
            try:
                steer, tb = float(action[0]), float(action[1])
            except (TypeError, ValueError):
                pass  # nested or odd values: numpy's reading below decides
            else:
                return _checked_action(steer, tb)
    try:
        a = np.asarray(action, dtype=float).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"action must be two numbers (steer, throttle_brake), got {action!r}") from exc
    if a.shape != (2,):
        raise ValueError(f"action must have 2 values (steer, throttle_brake), got shape {a.shape}")
    return _checked_action(float(a[0]), float(a[1]))


def _checked_action(steer: float, tb: float) -> tuple[float, float]:
    if not (math.isfinite(steer) and math.isfinite(tb)):
        raise ValueError(f"action contains a non-finite value: {[steer, tb]}; check the policy output")
    if abs(steer) > 1.0 + 1e-6 or abs(tb) > 1.0 + 1e-6:
        raise ValueError(f"action {[steer, tb]} is outside [-1, 1]^2; clip it (the Gymnasium env does)")
    return steer, tb


class LiteWorld:
    backend = "lite"

    def __init__(self, roadmap: RoadMap, config: SimConfig | None = None):
        self.map = roadmap
        self.cfg = config or SimConfig()
        tp = self.cfg.traffic
        tab = traffic_tables(roadmap, tp)
        self.conflict = tab["conflict"]
        self.way_start = tab["way_start"]
        self._release = tp.junction_release == "crossing"
        self.clear = tab["clear"] if self._release else None  # a JunctionPairs like conflict
        self.lane_vmax = tab["vmax"]
        # how far along its path a vehicle looks for leaders, stop lines and walkers:
        # traffic.lookahead, and where a lane is faster than SIGHT_FROM (traffic.speed_limits=map,
        # a higher speed_limit_kmh) far enough to stop comfortably from the fastest one (100 km/h
        # on a motorway: about 200 m)
        top = float(self.lane_vmax.max()) * (1.0 + max(tp.speed_offset)) if len(self.lane_vmax) else 0.0
        self._lookahead = float(tp.lookahead)
        if top > SIGHT_FROM:
            self._lookahead = max(self._lookahead, sight_distance(top))
        self.lights = tab["lights"]
        self._light_ids = np.arange(len(self.lights.junction_of_light), dtype=np.int64)
        self._light_ids.flags.writeable = False
        # actuated signals: the longest green while another phase has demand
        self._max_green = tp.green if tp.max_green is None else tp.max_green
        # any lane with a neighbour of its own direction (else no lane changes to consider)
        self._multilane = bool(np.any((roadmap.left >= 0) & roadmap.left_same_dir)
                               or np.any((roadmap.right >= 0) & roadmap.right_same_dir))
        # lane changes never into a lane narrower than a spawn point's minimum somewhere (a lane
        # that begins or ends with a taper: a car there overlaps the next lane's traffic)
        narrow = np.array([roadmap.width[roadmap.offset[i]:roadmap.offset[i + 1]].min()
                           < MIN_SPAWN_WIDTH for i in range(roadmap.n_lanes)], np.bool_)
        self._lc_left = np.where((roadmap.left >= 0) & narrow[roadmap.left], -1, roadmap.left)
        self._lc_right = np.where((roadmap.right >= 0) & narrow[roadmap.right], -1, roadmap.right)
        # per lane point: where the lane next becomes too narrow ahead of it, after being wide
        # enough (a merge taper at its end, or bays that close up along it): vehicles stop short
        # of it and change lanes before it, as into a standing obstacle (inf: no taper ahead)
        self.taper_stop = taper_stops(roadmap, narrow)
        self._has_tapers = bool(np.isfinite(self.taper_stop).any())  # a lane narrows somewhere
        self.succ = tab["succ"]  # the map's successors plus geometric continuations of dead ends
        # which light's detector covers each lane, and how far its stop line lies beyond the
        # lane's end (traffic.detector_reach)
        self._det_light, self._det_off = detector_lanes(
            roadmap, self.lights.lane_light, self.succ,
            tp.detector_distance if tp.detector_reach == "upstream" else 0.0)
        # lanes with no way on (open road ends): a vehicle reaching the end of one leaves the
        # network and is put back at a spawn point (SUMO's vehicles leave at the fringe)
        self._dead_end = (self.succ < 0).all(axis=1)
        self._has_dead_ends = bool(self._dead_end.any())
        # ... and those that close up before their end with no lane of their direction beside to
        # move into (CommonRoad's roundabout: an arm's lane narrows to 0.7 m at its open end, and
        # the cars bound for it stood before the taper until respawned, 21-25 times in 600 s):
        # a vehicle standing where its way closes up so leaves there
        beside = (((self._lc_left >= 0) & roadmap.left_same_dir)
                  | ((self._lc_right >= 0) & roadmap.right_same_dir))
        narrows = np.add.reduceat(np.isfinite(self.taper_stop), roadmap.offset[:-1]) > 0
        # ... and so does one that closes up where its way goes on: nobody gets past the taper.
        # A junction's lanes have no lane beside to move into (no lane changes there).
        # scenariogeneration's full_junction_with_LaneDef has a way through narrowing from 4 m
        # onto a road of 1 m lanes: the cars that took it stood in the junction, blocking the
        # ways across until respawned (45 times in 600 s), and the expert stood 400 s behind
        # them. Paths keep off such ways where the lane before offers another (``_succ_choice``)
        closed = narrows & (~beside | (roadmap.junction >= 0))
        self._closed_exit = closed
        self._has_closed_exits = bool(closed.any())
        self._succ_choice = way_choices(self.succ, closed) if self._has_closed_exits else self.succ
        self._overtake = tp.overtake == "oncoming"
        # junctions joined by short links (traffic.junction_chain): which lanes are such links
        # (one id per link), the link each junction lane leads into, and how far a vehicle may
        # queue on each way through past its last crossing
        self._chain = tp.junction_chain == "queue"
        if self._chain:
            self._link_id, self._via, self._store = tab["link_id"], tab["via"], tab["store"]
        else:
            self._link_id = np.full(roadmap.n_lanes, -1, np.int64)
            self._via = np.full((roadmap.n_lanes, 2), -1, np.int64)
            self._store = np.zeros(roadmap.n_lanes)
        if self._overtake:
            # the lanes leading into each lane (on the same links), and where the line on each side
            # of a lane may be crossed to overtake (no solid line, kerb or grass)
            self.pred = _predecessors(self.succ)
            crossable = np.array([int(m) for m in (MarkingType.NONE, *BROKEN_MARKINGS)])
            self._pass_left = np.isin(roadmap.mark_left, crossable)
            self._pass_right = np.isin(roadmap.mark_right, crossable)
            # ... and where it may be crossed to pass a bicycle or a standing vehicle
            # (traffic.overtake_solid): a painted line, solid too (not a kerb or grass)
            lines = np.array([int(m) for m in (*PAINTED_SOLID, *BROKEN_MARKINGS, MarkingType.NONE)])
            self._solid_left = np.isin(roadmap.mark_left, lines)
            self._solid_right = np.isin(roadmap.mark_right, lines)
        else:
            self.pred = np.full((1, 1), -1, np.int64)
            self._pass_left = self._pass_right = np.zeros(1, np.bool_)
            self._solid_left = self._solid_right = self._pass_left
        self._over_solid = tp.overtake_solid == "slow"
        self.sites, self.site_at_junction = tab["sites"], tab["site_at_junction"]
        self._grid = lane_grid(roadmap)
        self._ego_jlanes = np.full(16, -1, np.int64)
        self._ego_lane = -1  # junction lanes the ego may be on
        self._lane_junction, self._lane_length = roadmap.junction.tolist(), roadmap.length.tolist()
        # lanes leading into a junction (traffic.ego_turn)
        self._into_junction = [bool(roadmap.junction[lane] < 0 and any(
            q >= 0 and roadmap.junction[q] >= 0 for q in self.succ[lane]))
            for lane in range(len(roadmap.length))]
        self._m = (roadmap.offset, roadmap.ds, roadmap.length, roadmap.pts, roadmap.yaw)
        self._ego_path = np.full(PATH_LEN, -1, np.int64)  # the ego's lanes ahead (merge_yield)
        self.frame = 0
        self.time = 0.0
        self.rng = np.random.default_rng(0)
        self._ego_contacts: set[int] = set()
        self._npc_contacts: set[int] = set()
        self._static_contact = False
        self._ego_wait = 0.0  # s the ego has stood at a junction's stop line (traffic.ego_turn)
        self.ego_parked = False  # off the network (park_ego) until placed again
        self.npc_collision_total = 0
        self.npc_respawns = 0  # vehicles moved by the last-resort respawn
        self.npc_exits = 0  # vehicles that reached a dead end and were put back at a spawn point
        self.npc_wait_cycles = 0  # waits-for cycles (deadlocks) found and broken
        self.npc_max_stuck_s = 0.0  # longest standing time of a vehicle not at a red light
        self.npc_overtakes = 0  # overtakes in the oncoming lane started (traffic.overtake)
        self.npc_overtake_aborts = 0  # ... and given up (back in behind, or dropped back)
        self.spawned = dict(vehicles=0, motorcycles=0, bicycles=0, walkers=0)

    # ------------------------------------------------------------------ reset
    def reset(self, seed: int | None = None, ego_pose=None, ego_speed: float = 0.0) -> WorldSnapshot:
        """Start a new episode. ``ego_pose``: None (random spawn point), a spawn-point index, or
        (x, y, yaw). Background actors spawn at random spawn points away from the ego."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        rm, rng, cfg = self.map, self.rng, self.cfg
        self.frame, self.time = 0, 0.0
        if ego_pose is None:
            ego_pose = int(rng.integers(len(rm.spawn)))
        if isinstance(ego_pose, (int, np.integer)):
            if not 0 <= ego_pose < len(rm.spawn):
                raise ValueError(f"spawn index {ego_pose} out of range 0..{len(rm.spawn) - 1}")
            ego_pose = tuple(rm.spawn[ego_pose])
        x, y, yaw = (float(v) for v in ego_pose)
        if not all(math.isfinite(v) for v in (x, y, yaw)):
            raise ValueError(f"ego pose must be finite, got {ego_pose}")
        ego_speed = float(ego_speed)
        if not (math.isfinite(ego_speed) and 0.0 <= ego_speed <= cfg.ego.max_speed):
            raise ValueError(f"ego_speed must be in [0, {cfg.ego.max_speed}] m/s, got {ego_speed}")
        self.ego = dict(x=x, y=y, yaw=yaw, v=float(ego_speed), yaw_rate=0.0, accel=0.0, steer=0.0,
                        throttle=0.0, brake=0.0)
        self._spawn_vehicles()
        self._spawn_walkers()
        self.light_offset = rng.uniform(0, 60.0, size=len(self.lights.junction_groups))
        self.light_state = np.zeros(len(self.lights.junction_of_light), np.int64)
        # actuated signals' state, started where the fixed cycle would be at time 0
        tp, lt = cfg.traffic, self.lights
        slot = tp.green + tp.yellow + tp.all_red
        tm = self.light_offset % (slot * np.maximum(lt.junction_phases, 1))
        self.sig_phase = (tm // slot).astype(np.int64)
        ph = tm - self.sig_phase * slot
        self.sig_stage = np.where(ph < tp.green, 0, np.where(ph < tp.green + tp.yellow, 1, 2))
        self.sig_stage = self.sig_stage.astype(np.int64)
        self.sig_timer = ph - np.where(self.sig_stage == 0, 0.0,
                                       np.where(self.sig_stage == 1, tp.green, tp.green + tp.yellow))
        self._demand = np.zeros(len(lt.junction_of_light), np.bool_)
        self._update_lights(0.0, -1, 0.0)
        self._ego_contacts.clear()
        self._npc_contacts.clear()
        self._static_contact = False
        self._ego_wait = 0.0
        self.ego_parked = False
        self.npc_collision_total = 0
        self.npc_respawns = 0
        self.npc_exits = 0
        self.npc_wait_cycles = 0
        self.npc_max_stuck_s = 0.0
        self.npc_overtakes = self.npc_overtake_aborts = 0
        self._fixed_actor_arrays()
        self._actors = self._actor_arrays()
        return self._snapshot([], 0)

    def place_ego(self, pose) -> None:
        """Move the ego to ``pose`` (x, y, yaw) at rest, leaving the traffic as it is: for a driver
        whose route ended where the network offers no route on (an open road end), which starts
        its next route elsewhere (``bench.py sim``)."""
        x, y, yaw = (float(v) for v in pose)
        if not all(math.isfinite(v) for v in (x, y, yaw)):
            raise ValueError(f"ego pose must be finite, got {pose}")
        self.ego.update(x=x, y=y, yaw=yaw, v=0.0, yaw_rate=0.0, accel=0.0, steer=0.0, throttle=0.0, brake=0.0)
        self._ego_contacts = set()
        self._static_contact = False
        self._ego_wait = 0.0
        self.ego_parked = False

    def park_ego(self) -> None:
        """Take the ego off the network, at rest, until :meth:`place_ego` puts it back: for a
        driver whose route ended at an open road end and that waits for a start clear of
        traffic (``Autopilot.restart_elsewhere``), as a background vehicle reaching an open end
        leaves the network. Standing there instead, it held up the queue behind it, and on a
        small busy network no start came clear while it did (scenariogeneration's
        junction_with_varying_lane_widths: a queue stood 500 s behind it). Off the network it
        meets nothing and is no static collision."""
        b = self.map.bounds
        self.place_ego((float(b[2]) + 1000.0, float(b[3]) + 1000.0, 0.0))
        self.ego_parked = True

    def _spawn_vehicles(self):
        rm, rng, cfg = self.map, self.rng, self.cfg
        want = ([ActorClass.CAR] * cfg.vehicles + [ActorClass.MOTORCYCLE] * cfg.motorcycles
                + [ActorClass.BICYCLE] * cfg.bicycles)
        order = rng.permutation(len(rm.spawn))
        taken = [np.array([self.ego["x"], self.ego["y"]])]
        chosen = []
        gap = cfg.traffic.spawn_gap
        for idx in order:
            if len(chosen) == len(want):
                break
            p = rm.spawn[idx, :2]
            if all(np.hypot(*(p - q)) >= gap for q in taken):
                chosen.append(idx)
                taken.append(p)
        want = want[:len(chosen)]  # as many as the map has room for (like CARLA's spawn points)
        n = len(want)
        self.spawned = dict(vehicles=want.count(ActorClass.CAR),
                            motorcycles=want.count(ActorClass.MOTORCYCLE),
                            bicycles=want.count(ActorClass.BICYCLE), walkers=0)
        self.v_cls = np.array([int(c) for c in want], np.int8)
        self.v_lane = rm.spawn_lane[chosen].astype(np.int64) if n else np.zeros(0, np.int64)
        self.v_s = rm.spawn_s[chosen].astype(float) if n else np.zeros(0)
        self.v_v = np.zeros(n)
        self.v_acc = np.zeros(n)
        self.v_grant = np.full(n, -1, np.int64)  # reserved junction connector
        self.v_entered = np.zeros(n, np.bool_)  # already on its reserved connector
        self.v_wait = np.zeros(n)
        self.v_stuck = np.zeros(n)  # s standing, not at a red light
        self.v_blocker = np.full(n, K.NO_BLOCKER, np.int64)  # whom it waits for (traffic_step)
        self._cycle_tries: dict = {}  # waits-for cycle (its members' ids) -> times broken
        self._cycle = np.full(n, -1, np.int64)
        self.v_lat = np.zeros(n)  # m off the lane centre (right +) while changing lanes
        self.v_lcfrom = np.full(n, -1, np.int64)  # lane it is changing away from
        self.v_lctimer = np.zeros(n)  # s since its last lane change
        self.v_merge = np.full(n, -1, np.int64)  # the lane beside it asks to be let into
        self.lane_change_total = 0
        # overtaking in the oncoming lane (kernels.overtakes): state (K.OTK_*), whom it passes,
        # the oncoming lane's centre sideways (right +), that lane, seconds since it began
        self.v_otk = np.zeros(n, np.int64)
        self.v_otk_of = np.full(n, -1, np.int64)
        self.v_otk_off = np.zeros(n)
        self.v_otk_lane = np.full(n, -1, np.int64)
        self.v_otk_t = np.zeros(n)
        self._otk_active = 0  # overtakes under way after the last kernels.overtakes call
        self.v_hl, self.v_hw, self.v_vcap = np.zeros(n), np.zeros(n), np.zeros(n)
        self.v_amax, self.v_b = np.zeros(n), np.zeros(n)
        # each vehicle's own offset around the lane's limit (as the Traffic Manager's per-vehicle
        # speed difference)
        self.v_vfac = 1.0 + rng.uniform(*cfg.traffic.speed_offset, size=n)
        for i, c in enumerate(want):
            hl, hw, vd, a, b = CLASS_PARAMS[c]
            self.v_hl[i], self.v_hw[i] = rng.uniform(*hl), rng.uniform(*hw)
            self.v_vcap[i], self.v_amax[i], self.v_b[i] = rng.uniform(*vd), a, b
        self.v_path = np.full((n, PATH_LEN), -1, np.int64)
        for i in range(n):
            self._fill_path(i)
        self.v_id = np.arange(1, n + 1, dtype=np.int64)
        self.v_xy = np.zeros((n, 2))
        self.v_yaw = np.zeros(n)
        K.poses(*self._m, self.v_lane, self.v_s, self.v_xy, self.v_yaw)

    def _fill_path(self, i: int, k: int = 0) -> None:
        """Vehicle i's path on from its ``k``-th lane (0: its lane, the path drawn anew): random
        successors (``_succ_choice``: none that only leads into a lane closing up, where another
        way on is left)."""
        path, choice = self.v_path[i], self._succ_choice
        if k == 0:
            path[:] = -1
            path[0] = int(self.v_lane[i])
        path[k + 1:] = -1
        lane = int(path[k])
        for q in range(k + 1, PATH_LEN):
            nxt = choice[lane][choice[lane] >= 0]
            if len(nxt) == 0:
                break
            lane = int(nxt[self.rng.integers(len(nxt))])
            path[q] = lane

    def _respawn_stuck(self) -> None:
        """Last resort, as SUMO's teleport: a vehicle standing longer than ``stuck_respawn``
        seconds (not at a red light) is moved to a free spawn point away from the ego, counted in
        ``npc_respawns`` and logged."""
        limit = self.cfg.traffic.stuck_respawn
        if limit is None or not len(self.v_stuck):
            return
        for i in np.flatnonzero(self.v_stuck > limit):
            old = (self.map.keys[int(self.v_lane[i])], round(float(self.v_s[i]), 1))
            k = self._respawn(int(i))
            if k is not None:
                self.npc_respawns += 1
                log.info("t=%.1f s: vehicle %d stood %.0f s at lane %s s=%s; respawned at spawn point %d",
                         self.time, int(self.v_id[i]), limit, old[0], old[1], k)

    def _exit_dead_ends(self) -> None:
        """Vehicles at the end of a lane with no way on (or standing where a lane closes up with
        no lane beside to move into) leave the network: each is put back at a free spawn
        point away from the ego, counted in ``npc_exits`` (a vehicle that finds no free point
        stays and tries again next step)."""
        lane = self.v_lane
        at_end = self._dead_end[lane] & (self.v_s >= self.map.length[lane] - 0.05)
        if self._has_closed_exits:
            for i in np.flatnonzero((self.v_v < 0.1) & (self.v_blocker == K.BLOCKED_OTHER)):
                at_end[i] |= self._at_closed_exit(int(i))
        for i in np.flatnonzero(at_end):
            if self._respawn(int(i)) is not None:
                self.npc_exits += 1

    def _at_closed_exit(self, i: int) -> bool:
        """Vehicle ``i`` stands with its front within the standstill gap and a metre of where a
        lane of its path (its own, or one of the next two) closes up with no lane beside to move
        into (``_closed_exit``)."""
        rm, s = self.map, float(self.v_s[i])
        ahead = -s  # metres from the vehicle to the start of the path's lane k
        for k in range(3):
            li = int(self.v_path[i, k]) if k else int(self.v_lane[i])
            if li < 0:
                return False
            if self._closed_exit[li]:
                ts = K._taper_ahead(self.taper_stop, rm.offset, rm.ds, li, s if k == 0 else 0.0)
                return ahead + ts - self.v_hl[i] < self.cfg.traffic.idm_s0 + 1.0
            ahead += self._lane_length[li]
            if ahead > 5.0:
                return False
        return False

    def _respawn(self, i: int) -> int | None:
        """Move vehicle ``i`` to a free spawn point (``spawn_gap`` from every vehicle and beyond
        its braking distance at ``brake_max`` plus ``RESPAWN_STOP_MARGIN``,
        ``RESPAWN_WALKER_GAP`` from every walker, over ``RESPAWN_EGO_GAP`` m from the ego, or
        ``RESPAWN_EGO_NEAR`` for a vehicle that has stood ``RESPAWN_NEAR_AFTER`` s where no free
        point is that far) at rest with a new path; returns the spawn point, None if none is
        free."""
        rm, gap = self.map, self.cfg.traffic.spawn_gap
        de = np.hypot(rm.spawn[:, 0] - self.ego["x"], rm.spawn[:, 1] - self.ego["y"])
        dv = np.hypot(rm.spawn[:, None, 0] - self.v_xy[None, :, 0],
                      rm.spawn[:, None, 1] - self.v_xy[None, :, 1])
        # nor where a vehicle could not stop for it braking at its hardest (at 33 km/h that lies
        # within spawn_gap; on faster lanes, traffic.speed_limits=map, it reaches further)
        reach = self.v_v ** 2 / (2.0 * self.cfg.traffic.brake_max) + RESPAWN_STOP_MARGIN
        ok = (dv.min(axis=1) >= gap) & (dv >= reach[None, :]).all(axis=1)
        if len(self.w_xy):  # nor onto a walker (one crossing there, or waiting at the kerb)
            dw = np.hypot(rm.spawn[:, None, 0] - self.w_xy[None, :, 0],
                          rm.spawn[:, None, 1] - self.w_xy[None, :, 1]).min(axis=1)
            ok &= dw >= RESPAWN_WALKER_GAP
        free = np.flatnonzero(ok & (de > RESPAWN_EGO_GAP))
        if not len(free) and self.v_stuck[i] > RESPAWN_NEAR_AFTER:
            # it has stood long, and no free point is that far from the ego (esmini's ref_point,
            # 176 m: every car stood at its open ends for good)
            free = np.flatnonzero(ok & (de > RESPAWN_EGO_NEAR))
        if not len(free):
            return None  # nowhere to go now; try again next step
        k = int(free[self.rng.integers(len(free))])
        self.v_lane[i], self.v_s[i] = int(rm.spawn_lane[k]), float(rm.spawn_s[k])
        self.v_v[i] = self.v_acc[i] = self.v_wait[i] = self.v_stuck[i] = 0.0
        self.v_grant[i], self.v_entered[i] = -1, False
        self.v_lat[i], self.v_lcfrom[i], self.v_lctimer[i] = 0.0, -1, 0.0
        self.v_merge[i] = -1
        self.v_otk[i], self.v_otk_of[i], self.v_otk_lane[i] = K.OTK_OFF, -1, -1
        self._fill_path(i)
        x, y, h = rm.pose_at(int(self.v_lane[i]), float(self.v_s[i]))
        self.v_xy[i], self.v_yaw[i] = (x, y), h
        return k

    def _break_wait_cycles(self, min_stand: float) -> int:
        """Find the cycles of the waits-for graph (every member standing at least ``min_stand``
        s, each waiting for the next: its leader, or the vehicle keeping its junction reservation
        from being granted) and break each one deterministically:

        1. the member with the lowest id that waits at a junction entry and has another way
           through there takes it (the first one whose exit has room, else the first other one);
           background vehicles have no destination, so a turn changed costs nothing; with
           ``traffic.wait_cycle_break='rotate'`` a cycle of the same vehicles found again (the
           way taken did not free it) starts from the next member in id order, and so on;
        2. else the member with the lowest id holding a reservation it has not yet used gives
           it back.

        Counted in ``npc_wait_cycles`` and logged. Returns the number of cycles broken."""
        n = len(self.v_lane)
        if len(self._cycle) != n:
            self._cycle = np.full(n, -1, np.int64)
        nc = K.wait_cycles(self.v_blocker, self.v_stuck, min_stand, self._cycle)
        broken = 0
        for c in range(nc):
            members = sorted(np.flatnonzero(self._cycle == c).tolist(), key=lambda i: self.v_id[i])
            if self.cfg.traffic.wait_cycle_break == "rotate":
                # the same cycle again (the way taken did not free it): the next member tries
                key = tuple(int(self.v_id[i]) for i in members)
                tries = self._cycle_tries.get(key, 0)
                self._cycle_tries[key] = tries + 1
                members = members[tries % len(members):] + members[:tries % len(members)]
            how = None
            for i in members:
                if self._take_other_way(i):
                    how = f"vehicle {int(self.v_id[i])} takes another way through its junction"
                    break
            if how is None:
                for i in members:
                    if self.v_grant[i] >= 0 and not self.v_entered[i]:
                        self.v_grant[i] = -1
                        how = f"vehicle {int(self.v_id[i])} gives its junction reservation back"
                        break
            if how is None:
                log.info("t=%.1f s: waits-for cycle of vehicles %s found, nothing to change; the "
                         "respawn is the backstop", self.time, [int(self.v_id[i]) for i in members])
                continue
            broken += 1
            log.info("t=%.1f s: waits-for cycle of vehicles %s broken: %s", self.time,
                     [int(self.v_id[i]) for i in members], how)
        self.npc_wait_cycles += broken
        return broken

    def junction_entry(self, i: int) -> int | None:
        """Index in vehicle i's path of the first junction lane entered from outside a junction
        (the way through it next asks for), or None when its path enters none."""
        path, junction = self.v_path[i], self.map.junction
        return next((k for k in range(1, PATH_LEN) if path[k] >= 0 and junction[path[k]] >= 0
                     and junction[path[k - 1]] < 0), None)

    def _take_other_way(self, i: int) -> bool:
        """Vehicle i, standing before a junction it has no reservation for, switches to another
        way through (one leaving the same lane); False if it has none or is not at a junction."""
        path, junction, succ = self.v_path[i], self.map.junction, self.succ
        k = self.junction_entry(i)
        j = int(self.v_blocker[i])
        if k is None or self.v_grant[i] == path[k] or j < 0 or int(self.v_lane[j]) in path[:k]:
            return False  # not at a junction, or waiting for its leader rather than for the junction
        inc, cur = int(path[k - 1]), int(path[k])
        alts = [int(c) for c in self._succ_choice[inc] if c >= 0 and c != cur and junction[c] >= 0]
        if not alts:
            return False
        need = 2.0 * self.v_hl[i] + self.cfg.traffic.idm_s0 + 1.0

        def exit_free(c: int) -> bool:
            e = c
            for _ in range(PATH_LEN):  # through the way's own lanes to its exit
                nxt = succ[e][succ[e] >= 0]
                if not len(nxt) or junction[e] < 0:
                    break
                e = int(nxt[0])
            if junction[e] >= 0:
                return True
            on = (self.v_lane == e) & (self.v_s - self.v_hl < need)
            return not bool(on.any())

        alt = next((c for c in alts if exit_free(c)), alts[0])
        path[k] = alt
        self._fill_path(i, k)
        return True

    def _spawn_walkers(self):
        rng, cfg = self.rng, self.cfg
        W = cfg.walkers if len(self.sites) else 0
        self.spawned["walkers"] = W
        self.w_a = np.zeros((W, 2))
        self.w_b = np.zeros((W, 2))
        self.w_anode = np.zeros(W, np.int64)  # kerb-end nodes (Pavements) of a and b
        self.w_bnode = np.zeros(W, np.int64)
        self._pave = pavements(self.map, self.sites) if W and cfg.traffic.walker_roam else None
        longest = max((len(p) for legs in self._pave.legs for _, p, _ in legs), default=1) \
            if self._pave is not None else 1
        self.w_path = np.zeros((W, max(longest, 1), 2))  # the pavement walk in progress
        self.w_plen = np.zeros(W, np.int64)
        self.w_pk = np.zeros(W, np.int64)
        if W:
            atj = np.flatnonzero(self.site_at_junction)
            mid = np.flatnonzero(~self.site_at_junction)
            for w in range(W):
                use_mid = len(mid) and (rng.random() < cfg.traffic.walker_midblock or not len(atj))
                site = int(rng.choice(mid if use_mid else atj))
                a, b = self.sites[site]
                self.w_anode[w], self.w_bnode[w] = 2 * site, 2 * site + 1
                if rng.random() < 0.5:
                    a, b = b, a
                    self.w_anode[w], self.w_bnode[w] = 2 * site + 1, 2 * site
                t = (b - a) / max(np.hypot(*(b - a)), 1e-6)
                shift = np.array([t[1], -t[0]]) * rng.uniform(-1.5, 1.5)  # spread along the kerb
                self.w_a[w], self.w_b[w] = a + shift, b + shift
        self.w_xy = self.w_a.copy()
        d = self.w_b - self.w_a
        self.w_yaw = np.arctan2(d[:, 1], d[:, 0]) if W else np.zeros(0)
        self.w_state = np.zeros(W, np.int64)
        self.w_timer = rng.uniform(0.0, cfg.traffic.walker_wait[1], size=W)
        self.w_speed = rng.uniform(*cfg.traffic.walker_speed, size=W)
        self.w_id = np.arange(10001, 10001 + W, dtype=np.int64)
        self.w_vel = np.zeros((W, 2))  # displacement over the last step / dt (walker_velocity=moved)

    def _next_walk(self, w: int):
        """Walker w has crossed to kerb end ``w_bnode``: it walks the pavement to one of the next
        crossing sites reachable from there (drawn at random), or, where the pavement leads
        nowhere, waits to cross back."""
        node = int(self.w_bnode[w])
        legs = self._pave.legs[node]
        if legs:
            to, path, _ = legs[int(self.rng.integers(len(legs)))]
            n = len(path)
            self.w_path[w, :n] = path
            self.w_plen[w], self.w_pk[w] = n, 0
            xy = self._pave.xy
            self.w_a[w], self.w_b[w] = xy[to], xy[to ^ 1]
            self.w_anode[w], self.w_bnode[w] = to, to ^ 1
            self.w_state[w] = 2
        else:
            self.w_a[w], self.w_b[w] = self.w_b[w].copy(), self.w_a[w].copy()
            self.w_anode[w], self.w_bnode[w] = self.w_bnode[w], self.w_anode[w]
            lo, hi = self.cfg.traffic.walker_wait
            self.w_timer[w] = self.rng.uniform(lo, hi)
            self.w_state[w] = 0

    # ------------------------------------------------------------------ step
    def _ego_merge_request(self, lane: int, s: float, hl: float) -> int:
        """The lane beside the ego's that it asks to be let into because its own, or the lane
        its own leads on to (while there is only one), narrows within MERGE_REACH m
        (traffic.merge_yield, :func:`kernels.merge_request`); -1: none. The world does not know
        the ego's route: a lane drop ahead is read from the map, as for a background vehicle."""
        row = self._ego_path
        row[:] = -1
        row[0] = lane
        ahead = self._lane_length[lane] - s
        for k in range(1, PATH_LEN):
            nxt = self.succ[row[k - 1]]
            if ahead > MERGE_REACH or nxt[0] < 0 or (nxt.shape[0] > 1 and nxt[1] >= 0):
                break
            row[k] = nxt[0]
            ahead += self._lane_length[nxt[0]]
        rm = self.map
        return int(K.merge_request(self.taper_stop, *self._m, rm.junction, self._lc_left,
                                   self._lc_right, rm.left_same_dir, rm.right_same_dir, row,
                                   lane, s, hl, MERGE_REACH,
                                   self.cfg.traffic.lane_change_place == "project"))

    def _ego_turn(self, dt: float, ego_lane: int, ego_s: float, ehl: float) -> bool:
        """Whether the ego has its turn at a junction now (traffic.ego_turn): it has stood that
        long at the junction's stop line, its light (if any) not red or yellow, and the turn's
        EGO_TURN_HOLD s are not over. The clock restarts once the ego moves or leaves the stop
        line, so an ego that still stands after its turn does not hold the traffic again."""
        turn = self.cfg.traffic.ego_turn
        if turn is None:
            return False
        if (ego_lane >= 0 and self.ego["v"] < 0.5 and self._into_junction[ego_lane]
                and self._lane_length[ego_lane] - ego_s - ehl < EGO_TURN_REACH):
            li = self.lights.lane_light[ego_lane]
            if li < 0 or self.light_state[li] in (LightState.GREEN, LightState.OFF):
                self._ego_wait += dt
            else:
                self._ego_wait = 0.0  # its wait starts at green
        else:
            self._ego_wait = 0.0
        return turn <= self._ego_wait < turn + K.EGO_TURN_HOLD

    def step(self, action) -> WorldSnapshot:
        steer, tb = validate_action(action)
        cfg, tp, dt = self.cfg, self.cfg.traffic, self.cfg.dt
        self._ego_step(steer, tb, dt)
        self.time += dt
        self.frame += 1
        e = self.ego
        ehl, ehw = cfg.ego.length / 2, cfg.ego.width / 2
        ego_r = math.hypot(ehl, ehw) * 0.5 + ehl * 0.5  # between half length and circumradius
        p = nearest_point(*self._grid.args(), self.map.pts, self.map.yaw, e["x"], e["y"], e["yaw"],
                          math.pi / 2, 4.0)
        ego_lane, ego_s = (-1, 0.0) if p < 0 else (int(self.map.point_lane[p]), float(self.map.s[p]))
        self._ego_lane = ego_lane
        self._update_lights(dt, ego_lane, ego_s)
        ego_turn = self._ego_turn(dt, ego_lane, ego_s, ehl)
        # in a junction, where connectors overlap, the ego may be on any of several
        nj = 0
        if (ego_lane < 0 or self._lane_junction[ego_lane] >= 0
                or self._lane_length[ego_lane] - ego_s < 2.5):
            nj = self._junction_lanes_at_ego(self._ego_jlanes)
        n = len(self.v_lane)
        ego_xy = np.array((e["x"], e["y"]))
        walking = self.w_state == 1
        if n and tp.lane_changes and self._multilane and self.frame % LC_EVERY == 0:
            rm = self.map
            self.lane_change_total += K.lane_changes(
                dt * LC_EVERY, *self._m, rm.junction, self.succ, self._succ_choice,
                self._lc_left, self._lc_right,
                rm.left_same_dir, rm.right_same_dir, self.lane_vmax, self.taper_stop, self.v_lane,
                self.v_s, self.v_v, self.v_acc,
                self.v_path, self.v_grant, self.v_hl, self.v_hw, self.v_vfac, self.v_vcap,
                self.v_amax, self.v_b,
                self.v_lat, self.v_lcfrom, self.v_lctimer, ego_xy, ego_lane,
                ego_s, e["v"], self.rng.random(n), tp.idm_s0, tp.idm_T, tp.mobil_politeness,
                tp.mobil_threshold, tp.mobil_b_safe, self.v_xy, tp.lane_change_place == "project",
                tp.lane_change_follower == "entering", self.v_merge,
                MERGE_REACH if tp.merge_yield == "closing" else 0.0)
        decide = self.frame % LC_EVERY == 0
        if n and self._overtake and (decide or self._otk_active):
            st, ab, self._otk_active = K.overtakes(
                dt, decide, *self._m, self.map.junction, self.pred,
                self.map.left, self.map.right, self.map.left_same_dir, self.map.right_same_dir,
                self._pass_left, self._pass_right, self.lane_vmax, self.v_lane, self.v_s, self.v_v,
                self.v_hl, self.v_hw, self.v_vfac, self.v_vcap, self.v_amax, self.v_path,
                self.v_grant, self.v_lat, self.v_lcfrom, self.v_blocker, self.v_stuck, self.v_otk,
                self.v_otk_of, self.v_otk_off, self.v_otk_lane, self.v_otk_t,
                ego_xy, e["v"], self.w_xy, walking, tp.idm_s0,
                self.v_xy, self._solid_left, self._solid_right, self.v_cls,
                int(ActorClass.BICYCLE) if self._over_solid else -1)
            self.npc_overtakes += st
            self.npc_overtake_aborts += ab
        ego_merge = -1
        if (n and tp.merge_yield == "closing" and self._has_tapers and self._multilane
                and ego_lane >= 0 and self._lane_junction[ego_lane] < 0):
            ego_merge = self._ego_merge_request(ego_lane, ego_s, ehl)
        if n:
            m = K.traffic_step(
                dt, self.time, *self._m, self.map.junction, self.succ, self._succ_choice,
                self.conflict.data,
                self.conflict.index, self.way_start,
                tp.diverging_follow == "way", tp.junction_exit == "way",
                self.lights.lane_light, self.lane_vmax, self.taper_stop,
                self.v_lane, self.v_s, self.v_v, self.v_acc, self.v_path, self.v_grant,
                self.v_entered, self.v_wait, self.v_stuck,
                self.v_hl, self.v_hw, self.v_vfac, self.v_vcap, self.v_amax, self.v_b, self.v_lat,
                self.v_lcfrom,
                self.light_state,
                ego_xy, e["yaw"], ehl, ehw, ego_r, ego_lane, ego_s, e["v"],
                self._ego_jlanes, nj, ego_turn, tp.ego_behind == "brake",
                tp.lane_change_corridor == "body", tp.lane_change_place == "project",
                self.w_xy, walking, self.w_yaw,
                # a crossing walker standing for a vehicle (its timer counts the seconds) is not
                # going anywhere: seen where it is (anticipated on at its pace, it stood between
                # a bicycle waiting for where it would be and another at a red light, and the
                # queue behind waited a minute: the built-in avenue at drivevlm)
                np.where(self.w_timer > 0.0, 0.0, self.w_speed), tp.walker_anticipate,
                self.rng.random(n),
                tp.idm_s0, tp.idm_T, tp.brake_max, self._lookahead, tp.request_margin,
                self.v_xy, self.v_yaw, self.v_blocker,
                self.clear.data if self._release else _NO_CLEAR, self._release,
                tp.release_margin,
                self.v_otk, self.v_otk_of, self.v_otk_off, self.v_otk_lane,
                self._link_id, self._via, self._store, self._chain,
                self.v_merge, tp.merge_yield == "closing", ego_merge,
            )
            if m > self.npc_max_stuck_s:  # m: the longest standing time now
                self.npc_max_stuck_s = m
            if (tp.wait_cycle_after is not None and m >= tp.wait_cycle_after
                    and self.frame % CYCLE_EVERY == 0):
                self._break_wait_cycles(tp.wait_cycle_after)
            if tp.stuck_respawn is not None and m > tp.stuck_respawn:
                self._respawn_stuck()
            if self._has_dead_ends or self._has_closed_exits:
                self._exit_dead_ends()
        if len(self.w_xy):
            moved = tp.walker_velocity == "moved"
            before = self.w_xy.copy() if moved else None
            veh_xy, veh_v, veh_yaw, veh_ext = self._veh  # the vehicles, the ego last
            veh_xy[:n], veh_v[:n], veh_yaw[:n] = self.v_xy, self.v_v, self.v_yaw
            veh_xy[n, 0], veh_xy[n, 1], veh_v[n], veh_yaw[n] = e["x"], e["y"], e["v"], e["yaw"]
            arrived = K.walkers_step(
                dt, self.w_xy, self.w_yaw, self.w_state, self.w_timer, self.w_a, self.w_b,
                self.w_anode, self.w_bnode, self.w_path, self.w_plen, self.w_pk, self.w_speed,
                veh_xy, veh_v, veh_yaw, veh_ext, tp.walker_clear_time, tp.walker_clear_dist,
                tp.walker_wait[0], tp.walker_wait[1], self.rng.random(len(self.w_xy)),
                self._pave is not None)
            if arrived:
                for w in np.flatnonzero(self.w_state == 3):
                    self._next_walk(int(w))
            if moved:
                np.subtract(self.w_xy, before, out=self.w_vel)
                self.w_vel /= dt
        events, npc_new = self._collisions()
        return self._snapshot(events, npc_new)

    def warm_kernels(self) -> None:
        """Load every compiled kernel the step may call, so that none loads (tens of
        milliseconds each) in the middle of a timed run: some are first called only when the ego
        nears a junction or a vehicle has stood long. Changes no state."""
        self._junction_lanes_at_ego(np.full(len(self._ego_jlanes), -1, np.int64))
        # reads the waits-for edges and standing times, writes only its scratch array
        K.wait_cycles(self.v_blocker, self.v_stuck, math.inf, np.full(len(self.v_lane), -1, np.int64))
        if self._multilane:  # (merge_yield) reads the map, writes only its scratch path
            self._ego_merge_request(int(np.argmax(self.map.junction < 0)), 0.0, 2.4)

    def _junction_lanes_at_ego(self, out: np.ndarray) -> int:
        """The junction lanes the ego may be on (heading within 45 degrees, within 2 m) into
        ``out``; returns how many."""
        e, rm = self.ego, self.map
        return K.junction_lanes_near(*self._grid.args(), rm.pts, rm.yaw, rm.point_lane, rm.junction,
                                     e["x"], e["y"], e["yaw"], math.pi / 4, 2.0, out)

    def _ego_step(self, steer: float, tb: float, dt: float):
        p, e = self.cfg.ego, self.ego
        throttle, brake = max(tb, 0.0), max(-tb, 0.0)
        v = e["v"]
        a = throttle * p.accel_max - brake * p.brake_max
        if v > 0:
            a -= p.rolling + p.drag * v * v
        nv = min(max(v + a * dt, 0.0), p.max_speed)
        delta = steer * p.max_steer
        beta = math.atan(0.5 * math.tan(delta))
        vm = 0.5 * (v + nv)
        yaw_rate = vm / (p.wheelbase / 2) * math.sin(beta)
        e["x"] += vm * math.cos(e["yaw"] + beta) * dt
        e["y"] += vm * math.sin(e["yaw"] + beta) * dt
        e["yaw"] = (e["yaw"] + yaw_rate * dt + math.pi) % (2 * math.pi) - math.pi
        e.update(v=nv, yaw_rate=yaw_rate, accel=(nv - v) / dt, steer=steer, throttle=throttle,
                 brake=brake)

    def _update_lights(self, dt: float, ego_lane: int, ego_s: float):
        lt, tp = self.lights, self.cfg.traffic
        if len(lt.junction_groups) and tp.signal_control == "actuated":
            K.light_demand(self.v_lane, self.v_s, self.map.length, self._det_light,
                           self._det_off, ego_lane, ego_s, tp.detector_distance, self._demand)
            K.lights_actuated(dt, lt.junction_groups, lt.phase, lt.junction_phases, self._demand,
                              tp.min_green, self._max_green, tp.yellow, tp.all_red, self.sig_phase,
                              self.sig_stage, self.sig_timer, self.light_state)
        elif len(lt.junction_groups):
            K.light_states(self.time, self.light_offset, lt.junction_groups, lt.phase,
                           lt.junction_phases, tp.green, tp.yellow,
                           tp.all_red, self.light_state)

    # ------------------------------------------------------------------ collisions
    def _fixed_actor_arrays(self):
        """What stays the same from reset to reset: the actors' ids, classes and extents (shared,
        read-only, by every snapshot of the episode), their circumradii, and the buffers the
        walkers read the vehicles (the ego last) from."""
        nv, W = len(self.v_xy), len(self.w_xy)
        ext = np.empty((nv + W, 2))
        ext[:nv, 0], ext[:nv, 1] = self.v_hl, self.v_hw
        ext[nv:] = WALKER_EXTENT
        cls = np.concatenate([self.v_cls, np.full(W, int(ActorClass.WALKER), np.int8)])
        ids = np.concatenate([self.v_id, self.w_id])
        for a in (ids, cls, ext):
            a.flags.writeable = False
        self._fixed = ids, cls, ext, np.hypot(ext[:, 0], ext[:, 1])
        veh_ext = np.empty((nv + 1, 2))
        veh_ext[:nv] = ext[:nv]
        veh_ext[nv] = self.cfg.ego.length / 2, self.cfg.ego.width / 2
        self._veh = np.empty((nv + 1, 2)), np.empty(nv + 1), np.empty(nv + 1), veh_ext
        self._hits = np.empty(max(nv + W, 1), np.int64), np.empty(64, np.int64)  # contact buffers

    def _actor_arrays(self):
        """(ids, cls, pos, yaw, ext) of every actor, vehicles first; pos and yaw are new arrays
        (a snapshot keeps them), the rest is fixed for the episode."""
        ids, cls, ext, _ = self._fixed
        pos = np.concatenate((self.v_xy, self.w_xy))
        yaw = np.concatenate((self.v_yaw, self.w_yaw))
        return ids, cls, pos, yaw, ext

    def _collisions(self):
        cfg, e = self.cfg, self.ego
        ids, cls, pos, yaw, ext = self._actors = self._actor_arrays()
        events = []
        buf, pbuf = self._hits
        k = K.overlaps_with(e["x"], e["y"], e["yaw"], cfg.ego.length / 2, cfg.ego.width / 2, pos, yaw,
                            ext, buf)
        now = set()
        for j in buf[:k].tolist():
            if j < len(self.v_lane) and self._grade_separated(
                    self._ego_lane, e["yaw"], int(self.v_lane[j]), float(yaw[j])):
                continue
            aid = int(ids[j])
            now.add(aid)
            if aid not in self._ego_contacts:
                sp = float(self.v_v[j]) if j < len(self.v_v) else self._walker_speed(j - len(self.v_v))
                events.append(CollisionEvent(aid, ActorClass(int(cls[j])), e["v"], sp,
                                             float(pos[j, 0]), float(pos[j, 1])))
        self._ego_contacts = now
        if cfg.offroad_margin is not None and not self.ego_parked:
            # off the road: farther than the margin outside every lane near it (not only the lane
            # of the nearest centre point: beside a narrow lane, a wide one's area still counts)
            off = off_road(self.map, e["x"], e["y"], cfg.offroad_margin)
            if off and not self._static_contact:
                events.append(CollisionEvent(-1, ActorClass.STATIC, e["v"], 0.0, e["x"], e["y"]))
            self._static_contact = off
        npair = K.pairwise_overlaps(pos, yaw, ext, self._fixed[3], int(ActorClass.WALKER), cls, pbuf)
        nall, nv = len(pos), len(self.v_lane)
        pairs = set()
        for pr in pbuf[:min(npair, 64)].tolist():
            i, j = divmod(pr, nall)
            if not (j < nv and self._grade_separated(
                    int(self.v_lane[i]), float(yaw[i]), int(self.v_lane[j]), float(yaw[j]),
                    float(self.v_s[i]), float(self.v_s[j]))):
                pairs.add(pr)
        new = len(pairs - self._npc_contacts)
        self._npc_contacts = pairs
        self.npc_collision_total += new
        return events, new

    def _walker_speed(self, w: int) -> float:
        """Walker w's speed as the snapshot reports it (``traffic.walker_velocity``)."""
        if self.cfg.traffic.walker_velocity == "moved":
            return math.hypot(self.w_vel[w, 0], self.w_vel[w, 1])
        return float(self.w_speed[w] * (self.w_state[w] == 1))

    def _grade_separated(self, la: int, ya: float, lb: int, yb: float,
                         sa: float | None = None, sb: float | None = None) -> bool:
        """Two boxes overlapping in plan view, one on lane ``la`` heading ``ya``, the other on
        ``lb``: one passes over the other, so it is no collision, where their roads cross outside
        any junction (a bridge on a map without heights), or, given both arc lengths (two
        background vehicles, whose lanes are their own), where the two lanes there lie LEVEL m
        or more apart in height (a junction's ramp over a highway). The ego's lane is only the
        nearest in plan view, which under a bridge may be the lane above it, so for the ego
        heights are not read."""
        if la < 0 or lb < 0:
            return False
        m = self.map
        if sa is not None and abs(m.height_at(la, sa) - m.height_at(lb, sb)) >= LEVEL:
            return True
        if self._lane_junction[la] >= 0 or self._lane_junction[lb] >= 0:
            return False
        return abs(math.cos(ya - yb)) < K.GRADE_SEPARATED_COS

    # ------------------------------------------------------------------ snapshot
    def _snapshot(self, events, npc_new) -> WorldSnapshot:
        e, cfg = self.ego, self.cfg
        ids, cls, pos, yaw, ext = self._actors  # set by reset() and _collisions()
        vel = np.empty((len(ids), 2))
        K.actor_velocities(self.v_v, self.v_yaw, self.w_speed, self.w_state, self.w_yaw, vel)
        if cfg.traffic.walker_velocity == "moved":  # the walkers' rows, as the kernel numbers them
            nv = len(self.v_v)
            vel[nv:nv + len(self.w_vel)] = self.w_vel
        lt = self.lights
        ego = EgoState(e["x"], e["y"], e["yaw"], e["v"], e["yaw_rate"], e["accel"], e["steer"],
                       e["throttle"], e["brake"], (cfg.ego.length / 2, cfg.ego.width / 2))
        lights = TrafficLights(self._light_ids, lt.pos, lt.yaw, self.light_state.astype(np.uint8),
                               lt.stop_lines)
        return WorldSnapshot(self.frame, self.time, cfg.dt, ego,
                             Actors(ids, cls, pos, yaw, ext, vel), lights, events,
                             npc_new, self.backend)

    # ------------------------------------------------------------------ helpers
    def light_for_lane(self, lane: int) -> int:
        """Index of the light at the end of ``lane`` (-1 if none)."""
        return int(self.lights.lane_light[lane])

    def light_state_of(self, light: int) -> LightState:
        return LightState(int(self.light_state[light]))

    def close(self):
        pass


def way_choices(succ: np.ndarray, closed: np.ndarray) -> np.ndarray:
    """The successor table the traffic draws its paths from: ``succ`` less the lanes of
    ``closed`` (each closes up with no lane beside to move into: nobody gets past its taper) and
    the lanes whose every way on leads only into such lanes, where the lane before offers another
    way on. A lane with no successor (an open road end, where vehicles leave) is no such way."""
    dead = closed.astype(bool).copy()
    left = (succ >= 0).sum(axis=1)  # ways on not yet known to lead only into closed lanes
    pred = _predecessors(succ)
    todo = list(np.flatnonzero(dead))
    while todo:
        b = todo.pop()
        for a in pred[b][pred[b] >= 0]:
            left[a] -= 1
            if left[a] == 0 and not dead[a]:
                dead[a] = True
                todo.append(int(a))
    out = succ.copy()
    for a in np.flatnonzero((succ >= 0).any(axis=1)):
        row = succ[a][succ[a] >= 0]
        keep = row[~dead[row]]
        if 0 < len(keep) < len(row):
            out[a] = -1
            out[a, :len(keep)] = keep
    return out


def taper_stops(rm: RoadMap, narrow: np.ndarray) -> np.ndarray:
    """Per lane point (``rm.width``'s index): the arc length on its lane of the next point ahead
    (a higher index) where the lane, wide enough before, becomes narrower than
    ``MIN_SPAWN_WIDTH``; inf where there is none; 0 all along a lane never that wide. ``narrow``:
    per lane, whether it is narrower somewhere (the only lanes with a stop)."""
    out = np.full(len(rm.width), np.inf)
    for i in np.flatnonzero(narrow):
        o0, o1 = int(rm.offset[i]), int(rm.offset[i + 1])
        thin = rm.width[o0:o1] < MIN_SPAWN_WIDTH
        if thin.all():
            out[o0:o1] = 0.0
            continue
        nxt = np.inf
        for k in range(o1 - o0 - 1, -1, -1):
            out[o0 + k] = nxt
            if k > 0 and thin[k] and not thin[k - 1]:
                nxt = k * float(rm.ds[i])
    return out


def detector_lanes(rm: RoadMap, lane_light: np.ndarray, succ: np.ndarray, reach: float):
    """Per lane: the light whose detector covers it and the metres from its end on to that light's
    stop line (traffic.detector_reach). A light's own lane is covered (0 m); with ``reach`` > 0 so
    is a lane outside junctions whose only way on is a covered lane, while the stop line is less
    than ``reach`` m beyond its end. An approach lane shorter than a car (opendrive-1's 4 m stubs
    before its junction) holds no standing car's centre: the queue's first car stands on the lane
    before it, unseen, and its light stayed red for good while the other phase had demand."""
    det_light = lane_light.astype(np.int64).copy()
    det_off = np.zeros(rm.n_lanes)
    if reach <= 0.0:
        return det_light, det_off
    pred = _predecessors(succ)
    todo = [int(i) for i in np.flatnonzero(lane_light >= 0)]
    while todo:
        b = todo.pop()
        off = det_off[b] + float(rm.length[b])
        if off >= reach:
            continue
        for a in pred[b][pred[b] >= 0].tolist():
            ways = [int(x) for x in succ[a] if x >= 0]
            if det_light[a] < 0 and rm.junction[a] < 0 and ways == [b]:
                det_light[a], det_off[a] = det_light[b], off
                todo.append(a)
    return det_light, det_off
