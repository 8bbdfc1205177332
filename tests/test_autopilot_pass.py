"""The autopilot passes a standing actor in its lane where the road allows (issue 13), on a real
shipped CARLA town (Town05's multi-lane roads) with a parked NPC."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from drivemind.maps import load_town, plan_route
from drivemind.sim import LiteWorld, density_config
from drivemind.sim import kernels as K
from drivemind.sim.autopilot import Autopilot
from drivemind.sim.snapshot import ActorClass
from drivemind.sim.tracking import RouteTracker


@pytest.fixture(scope="module")
def town05():
    return load_town("Town05")


def _lane(rm):
    """The longest junction-free lane with a same-direction lane on its left."""
    ok = np.flatnonzero((rm.left >= 0) & rm.left_same_dir & (rm.junction < 0))
    return int(ok[np.argmax(rm.length[ok])])


def _parked_world(rm, lane, s_car, s_ego, end, pass_standing=True):
    cfg = density_config("empty", vehicles=1)
    cfg = dataclasses.replace(cfg, traffic=dataclasses.replace(cfg.traffic, stuck_respawn=None,
                                                                 wait_cycle_after=None))
    world = LiteWorld(rm, cfg)
    route = plan_route(rm, (lane, s_ego), (lane, end))
    snap = world.reset(0, ego_pose=route.start)
    # the NPC parks in our lane: at s_car, speed factor 0 (it never moves off)
    world.v_lane[0], world.v_s[0], world.v_v[0], world.v_vfac[0] = lane, s_car, 0.0, 0.0
    world.v_cls[0] = int(ActorClass.CAR)
    world._fill_path(0)
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    pilot = Autopilot(rm, route, world.lights.lane_light, world.cfg.ego, pass_standing=pass_standing)
    return world, snap, pilot, route


def _drive(world, snap, pilot, route, seconds):
    tr = RouteTracker(route)
    lat, hits = [], []
    for _ in range(int(seconds / world.cfg.dt)):
        snap = world.step(pilot.act(snap))
        tr.update(snap.ego.x, snap.ego.y, snap.ego.yaw)
        lat.append(tr.lateral)
        hits += snap.collisions
        if pilot.done:
            break
    return snap, np.array(lat), hits


@pytest.mark.parametrize("s_ego", [10.0, 70.0])  # coming up to it, or starting close behind it
def test_autopilot_passes_a_parked_car_and_comes_back(town05, s_ego):
    lane = _lane(town05)
    world, snap, pilot, route = _parked_world(town05, lane, 80.0, s_ego, 220.0)
    snap, lat, hits = _drive(world, snap, pilot, route, 60.0)
    assert hits == [], [(h.other_class, h.ego_speed) for h in hits]
    assert pilot.passes == 1
    assert pilot.done, f"{pilot.progress:.0f} of {route.length:.0f} m"  # got past it to the goal
    assert np.abs(lat).max() > 2.0  # moved over into the next lane ...
    assert np.abs(lat).max() < 3.0  # ... inside the env's off-route limit
    assert abs(lat[-1]) < 0.5  # and back on its lane


def test_autopilot_waits_without_a_lane_to_pass_in(town05):
    """No pass where passing is off (or, the same checks, the road gives no room): it waits
    behind the parked car, without touching it."""
    lane = _lane(town05)
    world, snap, pilot, route = _parked_world(town05, lane, 80.0, 10.0, 220.0, pass_standing=False)
    snap, lat, hits = _drive(world, snap, pilot, route, 30.0)
    assert hits == [] and pilot.passes == 0 and not pilot.done
    assert snap.ego.speed < 0.1 and np.abs(lat).max() < 0.5
    gap = math.hypot(snap.ego.x - world.v_xy[0, 0], snap.ego.y - world.v_xy[0, 1])
    assert 4.8 < gap < 15.0  # standing behind it


def test_autopilot_does_not_pass_a_car_queued_at_a_junction(town05):
    """A standing car close before a junction is queued there: no pass."""
    rm = town05
    lane = _lane(rm)
    L = float(rm.length[lane])
    # route to the lane's end and on through the junction after it
    nxt = [int(n) for n in rm.successors(lane) if rm.junction[n] >= 0]
    if not nxt:
        pytest.skip("the lane does not end at a junction")
    after = [int(n) for n in rm.successors(nxt[0])]
    route = plan_route(rm, (lane, L - 120.0), (after[0], min(20.0, float(rm.length[after[0]]))))
    world, snap, pilot, _ = _parked_world(rm, lane, L - 8.0, L - 120.0, L - 1.0)
    pilot.set_route(route)
    snap, lat, hits = _drive(world, snap, pilot, route, 40.0)
    assert hits == [] and pilot.passes == 0


def test_autopilot_does_not_pass_into_a_taken_lane(town05):
    """Both lanes blocked (a second car parked beside the first in the lane we would pass in):
    no pass, it waits behind without touching anything."""
    rm = town05
    lane = _lane(rm)
    cfg = density_config("empty", vehicles=2)
    cfg = dataclasses.replace(cfg, traffic=dataclasses.replace(cfg.traffic, stuck_respawn=None,
                                                                 wait_cycle_after=None))
    world = LiteWorld(rm, cfg)
    route = plan_route(rm, (lane, 10.0), (lane, 220.0))
    snap = world.reset(0, ego_pose=route.start)
    left = int(rm.left[lane])
    x, y, _ = rm.pose_at(lane, 80.0)
    q = rm.lane_points(left)
    k = int(np.argmin(np.hypot(q[:, 0] - x, q[:, 1] - y)))
    for i, (L, s) in enumerate(((lane, 80.0), (left, float(rm.s[rm.offset[left] + k])))):
        world.v_lane[i], world.v_s[i], world.v_v[i], world.v_vfac[i] = L, s, 0.0, 0.0
        world._fill_path(i)
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    assert math.hypot(*(world.v_xy[0] - world.v_xy[1])) < 6.0  # side by side
    pilot = Autopilot(rm, route, world.lights.lane_light, world.cfg.ego)
    snap, lat, hits = _drive(world, snap, pilot, route, 30.0)
    assert hits == [] and pilot.passes == 0 and not pilot.done
    assert np.abs(lat).max() < 0.5


def test_autopilot_joins_a_queue_in_the_lane_its_route_changes_to():
    """The route changes to the next lane where a car stands (the tail of a queue) just past where
    the change ends: the autopilot goes in behind it and stops there, rather than waiting beside
    the lane until the car has gone (which, for a queue at a junction, can take minutes)."""
    from straight_roads import side_by_side

    rm = side_by_side("two_lanes", 300.0, [(0.0, 3.5), (-3.5, 3.5)])
    lane, right = rm.key_index[(1, 0, -1)], rm.key_index[(1, 0, -2)]
    world, snap, pilot, _ = _parked_world(rm, lane, 0.0, 20.0, 100.0, pass_standing=False)
    route = plan_route(rm, (lane, 20.0), (right, 280.0))
    pilot.set_route(route)
    (c0, c1, side), = pilot.changes
    assert side == pytest.approx(-3.5, abs=0.1) and 5.0 < c1 - c0 < 12.0
    # the car stands in the lane we change to (creeping at 0.1 m/s: a parked NPC's least speed),
    # its rear 1 m past where the change ends
    world.v_lane[0], world.v_s[0] = right, 20.0 + c1 + 1.0 + float(world.v_hl[0])
    world._fill_path(0)
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    snap, lat, hits = _drive(world, snap, pilot, route, 30.0)
    assert hits == [], [(h.other_class, h.ego_speed) for h in hits]
    # went into the lane (before: stood short of the change for as long as the car stood)
    assert pilot.progress > c0 and snap.ego.y < -2.0 and snap.ego.speed < 0.5
    gap = world.v_xy[0, 0] - world.v_hl[0] - (snap.ego.x + 2.4)
    assert 0.5 < gap < 6.0  # behind it, waiting there (its nose in the lane, as drivers join)


def test_autopilot_finds_where_each_lane_change_ends_on_a_map_with_sparse_lane_points():
    """Lane points 1 m apart (esmini's ``example``) and a route whose stretches start between
    them: each of the two lane changes ends 8 m on, one lane over. Before, a change ended only
    at a route point within 0.3 m of one of the lane's points; none was, so the first change ran
    on to the route's end, two lanes over, and the autopilot checked the wrong lane for it and
    changed into a car standing in the right one."""
    from straight_roads import side_by_side

    from drivemind.maps.routing import LANE_CHANGE_GAP

    rm = side_by_side("three_lanes", 300.0, [(0.0, 3.5), (-3.5, 3.5), (-7.0, 3.5)], step=1.0)
    a, c = rm.key_index[(1, 0, -1)], rm.key_index[(1, 0, -3)]
    pilot = Autopilot(rm, plan_route(rm, (a, 20.3), (c, 290.0)))
    assert len(pilot.changes) == 2
    for c0, c1, side in pilot.changes:
        assert c1 - c0 == pytest.approx(LANE_CHANGE_GAP, abs=1.5)
        assert side == pytest.approx(-3.5, abs=0.2)


@pytest.mark.parametrize("behind, taken", [(6.0, True), (15.0, True), (20.0, True), (40.0, False)])
def test_autopilot_sees_a_car_coming_up_in_the_next_lane_inside_a_bend(behind, taken):
    """The route changes lanes inside a 120 degree bend of radius 20 m; a car drives at 7 m/s in
    the lane it changes to, ``behind`` m back along that lane, while the ego creeps at 2 m/s 3 m
    short of the change. The expert waits for it (and not for one far back). Before, it placed
    cars in its own frame: 15 m back in the bend, the car was 50 degrees off its heading and read
    as in no lane beside it, and the change's side was taken from the diagonal's chord (4.8 m
    instead of 3.5): on Town06 the expert changed lanes into such a car."""
    from straight_roads import bent_side_by_side

    rm = bent_side_by_side("bend", 20.0, math.radians(120), [(0.0, 3.5), (-3.5, 3.5)],
                           straight=40.0)
    a, b = rm.key_index[(1, 0, -1)], rm.key_index[(1, 0, -2)]
    route = plan_route(rm, (a, 30.0), (b, float(rm.length[b]) - 10.0))
    pilot = Autopilot(rm, route)
    (c0, c1, side), = pilot.changes
    assert side == pytest.approx(-3.5, abs=0.1)
    i = int(np.searchsorted(route.cum, c0 - pilot.ego.length / 2 - 3.0))
    assert 40.0 < 30.0 + route.cum[i] < 40.0 + 20.0 * math.radians(120)  # in the bend
    cfg = density_config("empty", vehicles=1)
    cfg = dataclasses.replace(cfg, traffic=dataclasses.replace(
        cfg.traffic, stuck_respawn=None, wait_cycle_after=None, lane_changes=False))
    world = LiteWorld(rm, cfg)
    pose = (float(route.pts[i, 0]), float(route.pts[i, 1]), float(route.yaw[i]))
    world.reset(0, ego_pose=pose, ego_speed=2.0)
    q = rm.lane_points(b)
    k = int(np.argmin(np.hypot(q[:, 0] - pose[0], q[:, 1] - pose[1])))
    world.v_lane[0], world.v_s[0], world.v_v[0] = b, float(rm.s[rm.offset[b] + k]) - behind, 7.0
    world.v_cls[0] = int(ActorClass.CAR)
    world._fill_path(0)
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    snap = world.step((0.0, 0.0))
    pilot.tracker.locate(snap.ego.x, snap.ego.y)
    gap = pilot._lane_change_gap(snap, float(route.cum[pilot.idx]))
    assert (gap < math.inf) == taken, gap


def test_the_second_of_two_lane_changes_in_a_row_sees_a_car_in_its_lane(town05):
    """A route two lanes over within 35 m (Town05: lanes 134 -> 135 -> 136, as a route from a
    spawn point just before a junction has it). A car coming up in the far lane beside the first
    change's diagonal is two lanes over from the route there, not one: the second change's check
    placed the lane it moves onto one lane over from the route, missed the car, and the expert
    moved over into it (esmini's highway_intersection_test0, one ego contact)."""
    from drivemind.sim.snapshot import Actors, EgoState, TrafficLights, WorldSnapshot

    rm = town05
    a = next(x for x in range(rm.n_lanes) if rm.junction[x] < 0 and rm.length[x] > 60
             and rm.left[x] >= 0 and rm.left_same_dir[x] and rm.left[rm.left[x]] >= 0
             and rm.left_same_dir[rm.left[x]] and rm.junction[rm.left[x]] < 0)
    far = int(rm.left[rm.left[a]])
    route = plan_route(rm, (a, 5.0), (far, 40.0))
    pilot = Autopilot(rm, route)
    assert len(pilot.changes) == 2
    (c0, c1, side1), (d0, d1, side2) = pilot.changes
    x, y, yaw = rm.pose_at(a, 5.0)
    here = 0.0
    mid = c0 + 0.5  # the car beside the start of the first diagonal, on the far lane
    i = int(np.searchsorted(route.cum, mid))
    nx, ny = -math.sin(route.yaw[i]), math.cos(route.yaw[i])  # + right of the route
    shift = float(pilot._route_shift(mid))
    off = float(pilot._route_shift(d1)) - shift  # the far lane, from the route there
    cx, cy = route.pts[i, 0] + off * nx, route.pts[i, 1] + off * ny
    assert abs(off) > 1.8 * abs(side2)  # two lanes over from the route there
    act = Actors(np.arange(1), np.full(1, int(ActorClass.CAR), np.int8), np.array([[cx, cy]]),
                 np.array([route.yaw[i]]), np.array([[2.45, 1.0]]),
                 np.array([[6.0 * math.cos(route.yaw[i]), 6.0 * math.sin(route.yaw[i])]]))
    lights = TrafficLights(np.zeros(0, np.int64), np.zeros((0, 2)), np.zeros(0),
                           np.zeros(0, np.uint8), [])
    snap = WorldSnapshot(0, 0.0, 0.1, EgoState(x, y, yaw, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                                               (2.4, 1.05)), act, lights)
    pilot.tracker.locate(x, y)
    assert pilot._lane_taken(snap, here, side2, d0, d1, join=True)
    # the same car one lane nearer (in the first change's lane) is not in the second's way
    act.pos[0] = (cx - side2 * nx, cy - side2 * ny)
    assert not pilot._lane_taken(snap, here, side2, d0, d1, join=True)
