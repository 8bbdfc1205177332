"""Traffic that keeps flowing: dead-end links, last-resort respawn, no gridlock or NPC collisions
on real CARLA towns, determinism with respawns."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest

from drivemind.maps import load_town
from drivemind.maps.opendrive import load_xodr_file
from drivemind.maps.roadmap import LaneRecord, build_roadmap
from drivemind.sim import SimConfig, density_config
from drivemind.sim.config import TrafficParams
from drivemind.sim.tables import traffic_successors
from drivemind.sim.world import LiteWorld


def _lane(key, x0, x1, y=0.0, succ=()):
    xs = np.linspace(x0, x1, 30)
    n = len(xs)
    return LaneRecord(key=key, points=np.stack([xs, np.full(n, y)], 1), width=np.full(n, 3.5),
                      mark_left=np.zeros(n, np.uint8), mark_right=np.zeros(n, np.uint8),
                      junction=-1, successors=list(succ))


def test_dead_end_lane_gets_its_geometric_continuation():
    # A ends at x=50 with no link; B starts 0.6 m further on; C starts beside B, a lane over
    rm = build_roadmap("t", [_lane((1, 0, -1), 0, 50), _lane((2, 0, -1), 50.6, 100),
                             _lane((3, 0, -1), 50.0, 100, y=3.5), _lane((4, 0, -1), 100.5, 150,
                                                                       succ=[(1, 0, -1)])])
    a, b, c = (rm.key_index[k] for k in ((1, 0, -1), (2, 0, -1), (3, 0, -1)))
    assert len(rm.successors(a)) == 0
    succ = traffic_successors(rm)
    assert succ[a][succ[a] >= 0].tolist() == [b]  # not the lane beside it
    d = rm.key_index[(4, 0, -1)]
    assert succ[d][succ[d] >= 0].tolist() == [a]  # a linked lane keeps its links


def test_stuck_vehicle_is_respawned_counted_and_logged(caplog):
    cfg = SimConfig(vehicles=1, traffic=TrafficParams(signals="none", stuck_respawn=5.0))
    world = LiteWorld(load_town("grid"), cfg)
    world.reset(seed=3, ego_pose=(1e4, 1e4, 0.0))
    # park the ego 8 m ahead of the vehicle on its lane: it stops behind and stands there
    lane, s = int(world.v_lane[0]), float(world.v_s[0])
    rm = world.map
    s_ego = min(s + 8.0, float(rm.length[lane]) - 0.5)
    x, y, h = rm.pose_at(lane, s_ego)
    world.ego.update(x=x, y=y, yaw=h, v=0.0)
    start = world.v_xy[0].copy()
    with caplog.at_level(logging.INFO, logger="drivemind.sim.world"):
        for _ in range(80):  # 8 s
            world.step((0.0, -1.0))
    assert world.npc_respawns == 1
    assert world.npc_max_stuck_s > 5.0
    assert np.hypot(*(world.v_xy[0] - start)) > 20.0  # moved elsewhere
    assert any("respawned" in r.getMessage() for r in caplog.records)


def test_no_respawn_when_disabled():
    cfg = SimConfig(vehicles=1, traffic=TrafficParams(signals="none", stuck_respawn=None))
    world = LiteWorld(load_town("grid"), cfg)
    world.reset(seed=3, ego_pose=(1e4, 1e4, 0.0))
    lane, s = int(world.v_lane[0]), float(world.v_s[0])
    x, y, h = world.map.pose_at(lane, min(s + 8.0, float(world.map.length[lane]) - 0.5))
    world.ego.update(x=x, y=y, yaw=h, v=0.0)
    for _ in range(80):
        world.step((0.0, -1.0))
    assert world.npc_respawns == 0 and world.npc_max_stuck_s > 5.0


def _red_light_lane(world):
    """The longest lane ending at a light that is red now (fixed signals with a long green keep it
    red for the test)."""
    ll = world.lights.lane_light
    lanes = [int(lane) for lane in np.flatnonzero(ll >= 0) if world.light_state[ll[lane]] == 2]
    return max(lanes, key=lambda lane: float(world.map.length[lane]))


def _place(world, i, lane, s):
    """Put vehicle i at rest at arc length s of lane, with a path on from there."""
    world.v_lane[i], world.v_s[i], world.v_v[i] = lane, s, 0.0
    world.v_grant[i], world.v_entered[i] = -1, False
    world._fill_path(i)
    x, y, h = world.map.pose_at(lane, s)
    world.v_xy[i], world.v_yaw[i] = (x, y), h


def _signals_red_for_long(**traffic):
    # fixed cycle with a 1000 s green: the lights that are red now stay red for the whole test
    return {"signal_control": "fixed", "green": 1000.0, "stuck_respawn": 10.0, **traffic}


def test_a_queue_at_a_red_light_is_not_stuck_however_long():
    """Six vehicles queued at a red light, most of them farther from the stop line than the
    traffic looks ahead (20 m here): they wait for the light through their leaders, so their
    standing clocks do not run and none is respawned (they were, after stuck_respawn)."""
    cfg = SimConfig.from_dict({"vehicles": 6, "traffic": _signals_red_for_long(lookahead=20.0)})
    world = LiteWorld(load_town("grid"), cfg)
    world.reset(seed=0, ego_pose=(1e5, 1e5, 0.0))
    lane = _red_light_lane(world)
    length = float(world.map.length[lane])
    for i in range(6):
        _place(world, i, lane, length - 3.0 - 7.5 * i)
    assert length - 3.0 - 7.5 * 5 < length - 20.0  # the last ones are beyond the look-ahead
    for _ in range(200):  # 20 s
        world.step((0.0, 0.0))
        assert world.light_state[world.lights.lane_light[lane]] == 2
    assert (world.v_lane == lane).all() and (world.v_v < 0.3).all()
    assert world.npc_respawns == 0 and world.npc_max_stuck_s == 0.0


@pytest.mark.parametrize("ego_before_stop_line", [3.5, 30.0])
def test_a_vehicle_behind_the_ego_waiting_at_a_red_light_is_not_stuck(ego_before_stop_line):
    """The ego standing at a red light's stop line holds the vehicle behind it (beyond the traffic's
    look-ahead, 10 m here, so it does not see the light itself) for the light: its clock does not
    run. The ego standing 30 m before the stop line (not queued there) holds it for nothing the
    traffic will clear, and the last-resort respawn moves it after stuck_respawn."""
    cfg = SimConfig.from_dict({"vehicles": 1, "traffic": _signals_red_for_long(lookahead=10.0)})
    world = LiteWorld(load_town("grid"), cfg)
    world.reset(seed=0, ego_pose=(1e5, 1e5, 0.0))
    lane = _red_light_lane(world)
    length = float(world.map.length[lane])
    s_ego = length - ego_before_stop_line
    x, y, h = world.map.pose_at(lane, s_ego)
    world.ego.update(x=x, y=y, yaw=h, v=0.0)
    _place(world, 0, lane, s_ego - 14.0)
    for _ in range(200):  # 20 s
        world.step((0.0, -1.0))
    if ego_before_stop_line < 10.0:
        assert world.npc_respawns == 0 and world.npc_max_stuck_s == 0.0
        assert world.v_lane[0] == lane and world.v_v[0] < 0.3
    else:
        assert world.npc_respawns == 1


def test_a_vehicle_crossing_under_the_egos_road_does_not_wait_for_it():
    """Two roads crossing at right angles outside any junction cross on two levels (a bridge), as
    the world's collision test has it: a vehicle on one drives on under the ego standing on the
    other, with no contact (it stopped 8 m short and waited for the ego to leave; with the
    autopilot taking it for an actor in its way too, Town05's ring road held both for a minute
    until the respawn moved the vehicle)."""
    def lane(key, p0, p1):
        n = 60
        pts = np.stack([np.linspace(p0[0], p1[0], n), np.linspace(p0[1], p1[1], n)], 1)
        return LaneRecord(key=key, points=pts, width=np.full(n, 3.5), mark_left=np.zeros(n, np.uint8),
                          mark_right=np.zeros(n, np.uint8), junction=-1, successors=[])

    rm = build_roadmap("crossing", [lane((1, 0, -1), (0, 0), (200, 0)),
                                    lane((2, 0, -1), (100, -100), (100, 100))])
    world = LiteWorld(rm, SimConfig(vehicles=1, traffic=TrafficParams(signals="none",
                                                                      stuck_respawn=None)))
    world.reset(seed=0, ego_pose=(100.0, 0.0, 0.0))  # standing where the roads cross
    _place(world, 0, rm.key_index[(2, 0, -1)], 70.0)
    events = []
    for _ in range(150):  # 15 s
        events += world.step((0.0, -1.0)).collisions
    assert world.v_s[0] > 150.0 and world.v_v[0] > 5.0  # passed under, at speed
    assert not events and world.npc_collision_total == 0


@pytest.mark.parametrize("upper", [0.0, 6.0])
def test_two_vehicles_on_lanes_apart_in_height_do_not_collide(upper):
    """A junction's ramp passing over another lane of the same junction (scenariogeneration's
    highway_bridge_example: a bridge 10 m up) is no collision where the lanes lie validate.LEVEL
    m or more apart in height, inside junctions too; at one level the same overlap is one."""
    def lane(key, p0, p1, z, junction=3):
        n = 60
        pts = np.stack([np.linspace(p0[0], p1[0], n), np.linspace(p0[1], p1[1], n)], 1)
        return LaneRecord(key=key, points=pts, width=np.full(n, 3.5), mark_left=np.zeros(n, np.uint8),
                          mark_right=np.zeros(n, np.uint8), junction=junction, successors=[],
                          z=np.full(n, z))

    rm = build_roadmap("ramp_over", [lane((1, 0, -1), (0, 0), (40, 0), 0.0),
                                     lane((2, 0, -1), (20, -20), (20, 20), upper),
                                     lane((3, 0, -1), (0, 200), (100, 200), 0.0, junction=-1)])
    world = LiteWorld(rm, SimConfig(vehicles=2, traffic=TrafficParams(signals="none",
                                                                      stuck_respawn=None)))
    world.reset(seed=0, ego_pose=(1e3, 1e3, 0.0))
    _place(world, 0, rm.key_index[(1, 0, -1)], 20.0)  # both where the lanes cross
    _place(world, 1, rm.key_index[(2, 0, -1)], 20.0)
    world.step((0.0, -1.0))
    assert world.npc_collision_total == (0 if upper else 1)


def test_waits_for_light_follows_the_chain_of_standing_vehicles():
    from drivemind.sim.kernels import BLOCKED_EGO, BLOCKED_LIGHT, BLOCKED_OTHER, NO_BLOCKER
    from drivemind.sim.kernels import _waits_for_light

    # 0 -> 1 -> 2 -> light; 3 -> 4 (moving) -> light; 5 -> ego; 6 -> walker; 7 <-> 8 (a cycle);
    # 9: nothing ahead
    blocker = np.array([1, 2, BLOCKED_LIGHT, 4, BLOCKED_LIGHT, BLOCKED_EGO, BLOCKED_OTHER, 8, 7,
                        NO_BLOCKER])
    v = np.zeros(len(blocker))
    v[4] = 2.0
    light_block = blocker == BLOCKED_LIGHT
    for ego_at_light in (False, True):
        got = [_waits_for_light(i, blocker, v, light_block, ego_at_light) for i in range(len(v))]
        assert got == [True, True, True, False, True, ego_at_light, False, False, False, False]


def _run(rm, cfg, seed, steps):
    world = LiteWorld(rm, cfg)
    world.reset(seed=seed, ego_pose=(1e5, 1e5, 0.0))  # the ego out of the way
    speed = 0.0
    for _ in range(steps):
        world.step((0.0, 0.0))
        speed += float(world.v_v.mean())
    return world, 3.6 * speed / steps


@pytest.mark.parametrize("town", ["Town03", "Town05"])
def test_dense_traffic_flows_without_collisions_on_carla_towns(shared_maps, town):
    # Town03 locked up entirely (dead-end links, exit lanes shorter than a car) and collided in
    # junctions whose connecting roads have several lane sections; Town05 counted vehicles
    # crossing over bridges as collisions
    path = shared_maps / f"{town}.xodr"
    if not path.exists():
        pytest.skip(f"{path} not present")
    world, kmh = _run(load_xodr_file(path), density_config("dense"), 0, 1500)
    assert world.npc_collision_total == 0
    assert kmh > 12.0
    assert (world.v_v < 0.1).mean() < 0.5
    assert world.npc_max_stuck_s < 90.0


@pytest.mark.parametrize("town, density", [("random-19", "dense"), ("random-11", "drivevlm")])
def test_traffic_flows_without_collisions_on_generated_towns_with_a_roundabout(town, density):
    """Towns generated from a seed (docs/maps.md, "Generated towns"), each with a roundabout of
    one-way ring roads: the traffic keeps moving through it, with no contact."""
    from drivemind.maps import load_town

    rm = load_town(town)
    ring = [i for i in range(rm.n_lanes) if rm.junction[i] < 0 and rm.left[i] < 0 and rm.right[i] < 0
            and not rm.keys[i][2] > 0]  # one-way one-lane roads: the ring's
    assert len(ring) >= 3
    world, kmh = _run(rm, density_config(density), 0, 1500)
    assert world.npc_collision_total == 0
    assert kmh > 10.0
    assert world.npc_max_stuck_s < 90.0 and world.npc_respawns == 0


def test_same_seed_same_traffic_with_respawns(shared_maps):
    path = shared_maps / "Town03.xodr"
    if not path.exists():
        pytest.skip(f"{path} not present")
    rm = load_xodr_file(path)
    cfg = density_config("dense", replace(SimConfig(), traffic=TrafficParams(stuck_respawn=3.0)))
    a, _ = _run(rm, cfg, 7, 400)
    b, _ = _run(rm, cfg, 7, 400)
    assert a.npc_respawns > 0  # the short limit makes respawns happen
    assert a.npc_respawns == b.npc_respawns
    assert np.array_equal(a.v_xy, b.v_xy) and np.array_equal(a.v_lane, b.v_lane)


def _two_lane_road():
    a = _lane((1, 0, -1), 0, 300)
    b = _lane((1, 0, -2), 0, 300, y=3.5)  # y grows to the right: -2 is the right lane
    a.right, b.left = (1, 0, -2), (1, 0, -1)
    return build_roadmap("two_lanes", [a, b])


@pytest.mark.parametrize("lane_changes", [True, False])
def test_vehicle_changes_lane_to_pass_a_standing_one(lane_changes):
    rm = _two_lane_road()
    cfg = SimConfig(vehicles=1, offroad_margin=None,
                    traffic=TrafficParams(signals="none", lane_changes=lane_changes,
                                          stuck_respawn=None))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=(1e4, 1e4, 0.0))
    left = rm.key_index[(1, 0, -1)]
    world.v_lane[0], world.v_s[0], world.v_v[0] = left, 40.0, 5.0
    world.v_path[0] = -1
    world.v_path[0, 0] = left
    world.ego.update(x=150.0, y=0.0, yaw=0.0, v=0.0)  # standing in the left lane
    events, passed = [], False
    for _ in range(400):  # 40 s
        snap = world.step((0.0, -1.0))
        events += snap.collisions
        assert snap.npc_collisions == 0
        # went past the standing ego in the right lane (and later leaves at the road's open end)
        passed |= bool(world.v_xy[0, 0] > 160.0 and abs(world.v_xy[0, 1] - 3.5) < 0.05
                       and world.v_lat[0] == 0.0 and world.npc_exits == 0)
    assert not events
    if lane_changes:
        assert world.lane_change_total >= 1 and passed
    else:
        assert world.lane_change_total == 0 and world.v_xy[0, 0] < 150.0


def test_wait_cycles_kernel_finds_each_cycle_once():
    from drivemind.sim.kernels import BLOCKED_LIGHT, NO_BLOCKER, wait_cycles

    # 0 -> 1 -> 2 -> 0 (a cycle), 3 -> 0 (waits for the cycle, not on it), 4 <-> 5 (a cycle),
    # 6 -> 7 -> light, 8 -> 9 -> 8 but 9 has not stood long enough
    blocker = np.array([1, 2, 0, 0, 5, 4, 7, BLOCKED_LIGHT, 9, 8, NO_BLOCKER])
    stuck = np.full(len(blocker), 10.0)
    stuck[9] = 1.0
    cycle = np.empty(len(blocker), np.int64)
    assert wait_cycles(blocker, stuck, 5.0, cycle) == 2
    assert cycle[0] == cycle[1] == cycle[2] >= 0
    assert cycle[4] == cycle[5] >= 0 and cycle[4] != cycle[0]
    assert (cycle[[3, 6, 7, 8, 9, 10]] == -1).all()


def _block_ring(world):
    """Four road lanes round a block of the map, each joined to the next by a turn the same way:
    (lanes, ways through between them)."""
    rm, succ, jn = world.map, world.succ, world.map.junction

    def turn(a, b):
        d = rm.yaw[rm.offset[b]] - rm.yaw[rm.offset[a + 1] - 1]
        return (d + np.pi) % (2 * np.pi) - np.pi

    def onward(lane):  # (lanes of a way through, the road lane after it)
        for c in succ[lane][succ[lane] >= 0]:
            way, e = [int(c)], int(c)
            while jn[e] >= 0 and (succ[e] >= 0).any():
                e = int(succ[e][succ[e] >= 0][0])
                if jn[e] >= 0:
                    way.append(e)
            if jn[e] < 0:
                yield way, e

    for first in np.flatnonzero(jn < 0):
        for sign in (1, -1):
            lanes, ways, lane = [int(first)], [], int(first)
            for _ in range(4):
                nxt = [(w, e) for w, e in onward(lane) if sign * turn(lane, e) > 0.8]
                if not nxt:
                    break
                ways.append(nxt[0][0])
                lane = nxt[0][1]
                lanes.append(lane)
            if len(lanes) == 5 and lanes[-1] == lanes[0]:
                return lanes[:4], ways
    raise AssertionError("no block ring found")


def _gridlocked_world(wait_cycle_after, **traffic):
    """A real gridlock on the grid town: queues fill the four lanes round a block, every vehicle
    turning onto the next of them, so each queue's head waits for room that the tail of the next
    queue takes, round the block (a cycle of waits; no light, no ego, nothing else in the way)."""
    from drivemind.sim.world import PATH_LEN

    cfg = SimConfig(vehicles=60, traffic=TrafficParams(signals="none", stuck_respawn=None,
                                                       wait_cycle_after=wait_cycle_after,
                                                       **traffic))
    world = LiteWorld(load_town("grid"), cfg)
    world.reset(seed=0, ego_pose=(1e5, 1e5, 0.0))
    ring, ways = _block_ring(world)
    slots = []
    for r, lane in enumerate(ring):  # heads at the stop line, 7 m apart back to the lane start
        s = float(world.map.length[lane]) - 3.0
        while s > 2.5:
            slots.append((r, lane, s))
            s -= 7.0
    n = len(slots)
    assert len(world.v_lane) >= n
    total = len(world.v_lane)
    for name, val in list(vars(world).items()):  # keep n vehicles (all cars of one size)
        if name.startswith("v_") and isinstance(val, np.ndarray) and len(val) == total:
            setattr(world, name, val[:n].copy())
    world._cycle = np.full(n, -1, np.int64)
    world.v_cls[:], world.v_hl[:], world.v_hw[:] = 0, 2.3, 0.95
    world.v_vcap[:], world.v_amax[:], world.v_b[:] = 30.0, 2.0, 3.0
    for i, (r, lane, s) in enumerate(slots):
        world.v_lane[i], world.v_s[i] = lane, s
        path, q = [lane], r
        while len(path) < PATH_LEN:
            path += ways[q]
            q = (q + 1) % 4
            path.append(ring[q])
        world.v_path[i] = path[:PATH_LEN]
    from drivemind.sim import kernels as K
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    return world


def test_gridlock_round_a_block_is_broken_by_the_wait_cycle_detector(caplog):
    stuck = _gridlocked_world(None)  # no detector (and no respawn)
    start = stuck.v_xy.copy()
    for _ in range(600):  # 60 s
        stuck.step((0.0, 0.0))
    assert len(start) >= 20
    assert np.hypot(*(stuck.v_xy - start).T).max() < 4.0  # closed up, got nowhere
    assert (stuck.v_v < 0.3).all() and stuck.npc_max_stuck_s > 55.0
    assert stuck.npc_wait_cycles == 0

    world = _gridlocked_world(5.0)
    start = world.v_xy.copy()
    with caplog.at_level(logging.INFO, logger="drivemind.sim.world"):
        for _ in range(200):  # 20 s
            world.step((0.0, 0.0))
    assert world.npc_wait_cycles >= 1
    assert any("waits-for cycle" in r.getMessage() and "another way" in r.getMessage()
               for r in caplog.records)
    for _ in range(800):  # 80 s more
        world.step((0.0, 0.0))
    moved = np.hypot(*(world.v_xy - start).T)
    assert (moved > 5.0).all()  # every vehicle of the ring got going again
    assert world.npc_max_stuck_s < 55.0
    assert world.npc_collision_total == 0


def test_no_lane_change_into_a_lane_a_vehicle_is_still_leaving():
    """A car has just changed from the right lane into the left one, still 2.4 m over to the
    right (its body mostly in the right lane), and brakes; the bicycle behind it on the left lane
    wants the right lane, which by lane index is empty. Moving over there it would meet the car
    half way (esmini's velodrome at drivevlm: two NPC contacts). It waits until the car is
    across."""
    from straight_roads import side_by_side

    from drivemind.sim import SimConfig
    from drivemind.sim import kernels as K
    from drivemind.sim.config import TrafficParams
    from drivemind.sim.snapshot import ActorClass
    from drivemind.sim.world import LiteWorld

    rm = side_by_side("two_lanes", 500.0, [(0.0, 3.5), (-3.5, 3.5)], step=500.0 / 59)
    L, R = rm.key_index[(1, 0, -1)], rm.key_index[(1, 0, -2)]
    world = LiteWorld(rm, SimConfig(vehicles=1, bicycles=1, offroad_margin=None,
                                    traffic=TrafficParams(signals="none", stuck_respawn=None)))
    world.reset(seed=0, ego_pose=(450.0, 60.0, 0.0))
    assert len(world.v_lane) == 2
    # car 0: on the left lane since a moment, 2.4 m to the right of its centre; bicycle 1 behind
    for i, (c, s, v, hl, hw) in enumerate([(ActorClass.CAR, 118.5, 1.0, 2.3, 0.95),
                                           (ActorClass.BICYCLE, 116.5, 3.0, 0.9, 0.35)]):
        world.v_cls[i] = int(c)
        world.v_hl[i], world.v_hw[i] = hl, hw
        world.v_lane[i], world.v_s[i], world.v_v[i] = L, s, v
        world.v_path[i] = -1
        world.v_path[i, 0] = L
        world.v_lctimer[i] = 10.0
    world.v_lat[0], world.v_lcfrom[0], world.v_lctimer[0] = -2.4, R, 0.0
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    changed_beside = False
    for _ in range(60):
        world.step((0.0, -1.0))
        if world.v_lane[1] == R and world.v_lat[0] != 0.0:
            changed_beside = True
    assert world.npc_collision_total == 0
    assert not changed_beside


@pytest.mark.parametrize("place", ["project", "scale"])
def test_a_vehicle_changing_lanes_in_an_s_bend_stays_where_it_is(place):
    """Two lanes through an S-bend (70 degrees right, then left, radius 25 m): equally long, but
    in the middle the right lane's arc length lags the left's by 4.3 m. A car stands in the left
    lane; the car 7 m behind it moves over to the right lane to pass it. With
    ``traffic.lane_change_place: project`` (the default) it is placed on the right lane where it
    is and passes with no contact. With ``scale`` (the rule before, the study's) its arc length
    was scaled by the lanes' lengths: it jumped metres forward as it moved over, and, still
    partly in the left lane, read the standing car as further ahead than it is and ran into it
    (esmini's tunnels, two contacts)."""
    import math

    from straight_roads import curved_side_by_side

    from drivemind.sim import kernels as K
    from drivemind.sim.snapshot import ActorClass

    turn = math.radians(70)
    rm = curved_side_by_side("s_bend", [(25.0, -turn), (25.0, turn)],
                             [(0.0, 3.5), (-3.5, 3.5)], straight=60.0)
    left, right = rm.key_index[(1, 0, -1)], rm.key_index[(1, 0, -2)]
    assert rm.length[left] == pytest.approx(rm.length[right])
    world = LiteWorld(rm, SimConfig(vehicles=2, offroad_margin=None, traffic=TrafficParams(
        signals="none", stuck_respawn=None, wait_cycle_after=None, lane_change_place=place)))
    world.reset(seed=0, ego_pose=(-200.0, -200.0, 0.0))
    for i, (s, vfac) in enumerate(((90.0, 0.0), (83.0, 1.0))):  # standing; behind it
        world.v_cls[i] = int(ActorClass.CAR)
        world.v_lane[i], world.v_s[i], world.v_v[i], world.v_vfac[i] = left, s, 0.0, vfac
        world._fill_path(i)
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    moved_over, jump, passed = False, 0.0, False
    for _ in range(250):  # 25 s
        before = world.v_xy[1].copy()
        world.step((0.0, -1.0))
        if not moved_over and world.v_lane[1] == right:
            moved_over = True
            jump = float(np.hypot(*(world.v_xy[1] - before)))
        if world.npc_collision_total:
            break
        # its place along the left lane: past the standing car
        passed |= K._along(*world._m, left, float(world.v_s[1]), *world.v_xy[1]) > 90.0 + 5.0
        if passed:
            break
    assert moved_over
    if place == "project":
        assert jump < 0.5, jump  # where it was, not metres along
        assert world.npc_collision_total == 0 and passed
    else:
        assert jump > 2.0 and world.npc_collision_total > 0


@pytest.mark.parametrize("rule", ["rotate", "first"])
def test_a_cycle_found_again_is_broken_by_the_next_member(rule, caplog):
    """The gridlock round a block, found twice in a row (nothing moved in between): with
    'rotate' the second break starts from the next member, so another vehicle takes another way;
    with 'first' (the rule before) the same one does again (on Town07's linked junctions the same
    vehicle changed its way 40 times while the cycle stood, until the respawn)."""
    world = _gridlocked_world(None, wait_cycle_break=rule)  # no detector while it forms
    for _ in range(300):  # 30 s: all standing
        world.step((0.0, 0.0))
    movers = []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="drivemind.sim.world"):
            assert world._break_wait_cycles(5.0) == 1
        msg = [r.getMessage() for r in caplog.records if "takes another way" in r.getMessage()]
        assert len(msg) == 1
        movers.append(msg[0].split("broken: vehicle ")[1].split()[0])
    assert (movers[0] != movers[1]) == (rule == "rotate")


def _between_lanes(corridor, ego_x, v, lat):
    """Two 300 m lanes side by side; the ego standing in the right one at ``ego_x``; a car at
    s = 100 of the right lane, ``lat`` m to its left (moving over from the left lane), driving on
    at ``v`` m/s (0: it wants to stand)."""
    from straight_roads import side_by_side

    from drivemind.sim import kernels as K
    from drivemind.sim.snapshot import ActorClass

    rm = side_by_side("two_lanes", 300.0, [(0.0, 3.5), (-3.5, 3.5)], step=300.0 / 59)
    L, R = rm.key_index[(1, 0, -1)], rm.key_index[(1, 0, -2)]
    world = LiteWorld(rm, SimConfig(vehicles=1, offroad_margin=None, traffic=TrafficParams(
        signals="none", stuck_respawn=None, lane_change_corridor=corridor)))
    world.reset(seed=0, ego_pose=(ego_x, -3.5, 0.0))
    world.v_cls[0] = int(ActorClass.CAR)
    world.v_hl[0], world.v_hw[0] = 2.3, 0.95
    world.v_vfac[0] = v / float(world.lane_vmax[R])
    world.v_lane[0], world.v_s[0], world.v_v[0] = R, 100.0, v
    world._fill_path(0)
    world.v_lat[0], world.v_lcfrom[0] = lat, L
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    return world


def _contacts(world, steps):
    return sum(len(world.step((0.0, -1.0)).collisions) for _ in range(steps))


@pytest.mark.parametrize("corridor", ["body", "lane"])
def test_a_standing_car_between_two_lanes_does_not_slide_over_onto_the_ego_beside_it(corridor):
    """A car changing from the left lane to the right one stopped with its body still mostly in
    the left lane (3.2 m left of the right lane's centre); the ego stands in the right lane
    beside it. With ``traffic.lane_change_corridor: body`` (the default) it stays where it is
    until the ego has gone; with ``lane`` (the rule before, the study's) it went on sliding over
    at 0.3 m/s, standing, into the ego's side (CommonRoad's MONAEast, stop 51: the ego was
    passing it)."""
    world = _between_lanes(corridor, 101.0, 0.0, 3.2)
    contacts = _contacts(world, 50)  # 5 s
    if corridor == "body":
        assert contacts == 0 and world.v_lat[0] > 1.5  # beside the ego still, clear of it
    else:
        assert contacts > 0 and world.v_lat[0] < 2.0  # slid 1.5 m, standing
    # the ego gone, it moves over
    world.place_ego((250.0, -3.5, 0.0))
    _contacts(world, 150)
    assert world.v_lat[0] == 0.0 and world.v_lcfrom[0] == -1


@pytest.mark.parametrize("corridor", ["body", "lane"])
def test_a_slow_car_between_two_lanes_does_not_slide_over_onto_the_ego_beside_it(corridor):
    """The same at walking pace: a car drifting over to the right lane at 1.6 m/s, its rear beside
    the nose of the ego standing there, 3 m behind it. With ``body`` it stays off the ego until it
    is past it, then moves over; before, only a car under 1 m/s held (CommonRoad's MONAEast, stop
    52: a motorcycle at 1.6 m/s slid into the standing expert's nose)."""
    world = _between_lanes(corridor, 97.0, 1.6, 2.3)
    contacts = _contacts(world, 100)  # 10 s
    if corridor == "body":
        assert contacts == 0
        assert world.v_lat[0] == 0.0 and world.v_xy[0, 0] > 97.0 + 4.7  # over, once past
    else:
        assert contacts > 0


@pytest.mark.parametrize("follower", ["entering", "lane"])
def test_no_lane_change_just_in_front_of_a_car_entering_that_lane(follower):
    """Two lanes each way over two lane sections (the lanes of the second start at x = 100). A
    car 6 m into the second section's right lane wants to pass a car standing ahead of it; a car
    at 8 m/s on the first section's left lane is 5 m before the left lane of the second section
    starts. By lane index the left lane is empty behind the place beside us. With
    ``traffic.lane_change_follower: entering`` (the default) the entering car counts as the new
    follower, and the car waits until it has passed; with ``lane`` (the rule before, the study's)
    it moved over just in front of it (esmini's highway_intersection_test0: one NPC contact, the
    car behind standing while the one in front slid over onto it)."""
    from drivemind.sim import kernels as K
    from drivemind.sim.snapshot import ActorClass

    p1, p2 = _lane((1, 0, -1), 0, 100, succ=[(2, 0, -1)]), _lane((1, 0, -2), 0, 100, y=3.5,
                                                                   succ=[(2, 0, -2)])
    a1, a2 = _lane((2, 0, -1), 100, 400), _lane((2, 0, -2), 100, 400, y=3.5)
    p1.right, p2.left, a1.right, a2.left = p2.key, p1.key, a2.key, a1.key
    rm = build_roadmap("two_sections", [p1, p2, a1, a2])
    ix = rm.key_index
    world = LiteWorld(rm, SimConfig(vehicles=3, offroad_margin=None, traffic=TrafficParams(
        signals="none", stuck_respawn=None, wait_cycle_after=None,
        lane_change_follower=follower)))
    world.reset(seed=0, ego_pose=(200.0, 80.0, 0.0))
    for i, (lane, s, v, vfac, path) in enumerate([
            ((2, 0, -2), 6.0, 2.0, 1.0, [(2, 0, -2)]),  # wants to pass
            ((1, 0, -1), 95.0, 8.0, 1.0, [(1, 0, -1), (2, 0, -1)]),  # entering the left lane
            ((2, 0, -2), 22.0, 0.0, 0.0, [(2, 0, -2)])]):  # standing
        world.v_cls[i] = int(ActorClass.CAR)
        world.v_hl[i], world.v_hw[i] = 2.3, 0.95
        world.v_lane[i], world.v_s[i], world.v_v[i], world.v_vfac[i] = ix[lane], s, v, vfac
        world.v_path[i] = -1
        world.v_path[i, :len(path)] = [ix[k] for k in path]
        world.v_lctimer[i] = 10.0
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    moved_before_it_passed = moved = False
    for _ in range(100):
        world.step((0.0, -1.0))
        if not moved and world.v_lane[0] == ix[(2, 0, -1)]:
            moved = True
            moved_before_it_passed = bool(world.v_xy[1, 0] < world.v_xy[0, 0])
    assert moved
    assert moved_before_it_passed == (follower == "lane")
    if follower == "entering":
        assert world.npc_collision_total == 0


def test_a_walker_beyond_a_path_of_short_lane_sections_is_seen():
    """A vehicle's path holds 6 lanes. Town06 chains lane sections of 1-3 m: six of them covered
    2 m, and a car at 32 km/h saw a walker crossing in front of it 5 m before it (one contact in
    1800 s at drivevlm). For the walker check the path is run on by each last lane's first way
    on until it reaches the check's 36 m (`kernels._path_reaching`); a path that reaches that far
    is used as it is."""
    from drivemind.sim import kernels as K

    chain = [_lane((k + 1, 0, -1), 2.0 * k, 2.0 * k + 2.0, succ=[(k + 2, 0, -1)]) for k in range(8)]
    rm = build_roadmap("short_sections", chain + [_lane((9, 0, -1), 16.0, 216.0)])
    ix = rm.key_index
    sim = LiteWorld(rm, SimConfig(vehicles=1, offroad_margin=None))
    m = sim._m  # offset, ds, length, pts, yaw
    succ = traffic_successors(rm)
    row = np.array([ix[(k + 1, 0, -1)] for k in range(6)], np.int64)  # 12 m of path
    walker = np.array([[30.0, 0.0]])
    radius = np.array([0.9])
    blind = K._corridor_gap(*m, row, 0.0, 2.3, 0.95, walker, radius, 36.0, 1.0)
    out = np.full(4 * len(row), -1, np.int64)
    run_on = K._path_reaching(row, succ, m[2], 0.0, 36.0, out)
    seen = K._corridor_gap(*m, run_on, 0.0, 2.3, 0.95, walker, radius, 36.0, 1.0)
    assert blind >= K.INF
    assert seen == pytest.approx(30.0 - 2.25 - 2.3 - 0.9, abs=1.1)  # first within 2.25 m of it
    assert [rm.keys[lane] for lane in run_on[run_on >= 0]][-1] == (9, 0, -1)
    # a path long enough already comes back as it is
    long_row = np.array([ix[(9, 0, -1)], -1, -1, -1, -1, -1], np.int64)
    assert K._path_reaching(long_row, succ, m[2], 0.0, 36.0, out) is long_row


def test_no_vehicle_is_respawned_where_another_could_not_stop_for_it():
    """A vehicle put back at a spawn point (after leaving at an open end, or stuck) is put
    beyond every vehicle's braking distance at brake_max plus RESPAWN_STOP_MARGIN: at 72 km/h a
    point 20 m ahead is not free (cars respawned 15-18 m ahead of cars at 55-60 km/h on esmini's
    highway_exit with speed_limits=map, 46 contacts in 600 s); standing, it is."""
    from drivemind.sim.world import RESPAWN_STOP_MARGIN

    n = 400
    pts = np.stack([np.linspace(0.0, 400.0, n), np.zeros(n)], 1)
    rec = LaneRecord(key=(1, 0, -1), points=pts, width=np.full(n, 3.5),
                     mark_left=np.zeros(n, np.uint8), mark_right=np.zeros(n, np.uint8),
                     junction=-1, successors=[])
    rm = build_roadmap("straight", [rec])
    for v, near_ok in ((20.0, False), (0.0, True)):
        world = LiteWorld(rm, SimConfig(vehicles=2, traffic=TrafficParams(signals="none")))
        world.reset(seed=0, ego_pose=(1e5, 1e5, 0.0))
        _place(world, 0, 0, 100.0)
        world.v_v[0] = v
        _place(world, 1, 0, 390.0)
        reach = v * v / (2.0 * world.cfg.traffic.brake_max) + RESPAWN_STOP_MARGIN
        ahead = []
        for _ in range(60):  # the point is drawn at random among the free ones
            k = world._respawn(1)
            assert k is not None
            d = float(np.hypot(*(rm.spawn[k, :2] - world.v_xy[0])))
            assert d >= max(12.0, reach), (v, d)
            ahead.append(float(rm.spawn_s[k]) - 100.0)
        # 12-30 m ahead of the vehicle: free only while it stands
        assert any(12.0 <= a < reach for a in ahead) == near_ok or reach < 12.0
        assert any(12.0 <= a < 31.0 for a in ahead) == near_ok
