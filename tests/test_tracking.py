"""The route tracking shared by the env and the autopilot (sim/tracking.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drivemind.maps import load_town, plan_route
from drivemind.sim import density_config
from drivemind.sim.autopilot import Autopilot, autopilot_episode
from drivemind.sim.snapshot import ActorClass, Actors, LightState, TrafficLights
from drivemind.sim.tracking import RouteTracker, corridor_lead, next_stop, route_stops


def _straight(rm):
    lane = int(np.argmax(rm.length * (rm.junction < 0)))
    return lane, plan_route(rm, (lane, 0.0), (lane, float(rm.length[lane])))


def _line(rm, lane, s):
    x, y, yaw = rm.pose_at(lane, s)
    c, sn = math.cos(yaw), math.sin(yaw)
    return np.array([[x + 1.5 * sn, y - 1.5 * c], [x - 1.5 * sn, y + 1.5 * c]]), (x, y, yaw)


def test_route_stops_one_per_crossing():
    """A light whose stop lines the route crosses twice (a route that comes back to it) gives two
    stops; the two segments of one stop line (two lanes) give one."""
    rm = load_town("grid")
    lane, route = _straight(rm)
    a, (x, y, yaw) = _line(rm, lane, 20.0)
    b, _ = _line(rm, lane, 60.0)
    a2 = a + np.array([0.4, 0.0])  # a second segment of the same line
    lights = TrafficLights(np.array([0]), np.array([[x, y]]), np.array([yaw]),
                           np.array([int(LightState.RED)], np.uint8), [np.stack([a, a2, b])])
    stops = route_stops(route, lights)
    assert [li for _, li in stops] == [0, 0]
    assert stops[0][0] == pytest.approx(20.0, abs=1.0) and stops[1][0] == pytest.approx(60.0, abs=1.0)
    # the next stop not yet passed, with the env's and the autopilot's thresholds
    assert next_stop(stops, 10.0) == (pytest.approx(stops[0][0] - 10.0), 0)
    assert next_stop(stops, stops[0][0] + 0.3, behind=0.5)[0] == pytest.approx(-0.3)
    assert next_stop(stops, stops[0][0] + 1.0, behind=0.5)[0] == pytest.approx(stops[1][0] - stops[0][0] - 1.0)
    assert next_stop(stops, 100.0) == (math.inf, -1)


def test_corridor_measures():
    """'entry' (the autopilot's) is shorter than bumper to bumper ('centre', the env's) by about
    the corridor's half width; an unknown measure names the valid ones."""
    rm = load_town("avenue")
    lane, route = _straight(rm)
    x0, y0, yaw = rm.pose_at(lane, 10.0)
    ax, ay, ayaw = rm.pose_at(lane, 30.0)
    actors = Actors(np.arange(1), np.full(1, int(ActorClass.CAR), np.int8), np.array([[ax, ay]]),
                    np.array([ayaw]), np.array([[2.0, 1.0]]), np.zeros((1, 2)))
    tr = RouteTracker(route)
    tr.update(x0, y0, yaw)
    centre, who = corridor_lead(route, tr.idx, tr.s, x0, y0, actors, 2.4, 1.05)
    entry, who2 = corridor_lead(route, tr.idx, tr.s, x0, y0, actors, 2.4, 1.05, measure="entry")
    assert who == who2 == 0
    assert centre == pytest.approx(20.0 - 2.4 - 2.0, abs=0.6)
    assert centre - entry == pytest.approx(1.6 + 1.05 + 0.5, abs=1.0)  # reach + half width + margin
    # out of the search radius: not seen
    assert corridor_lead(route, tr.idx, tr.s, x0, y0, actors, 2.4, 1.05, search=15.0) == (math.inf, -1)
    with pytest.raises(ValueError, match="'centre', 'entry'"):
        corridor_lead(route, tr.idx, tr.s, x0, y0, actors, 2.4, 1.05, measure="middle")


def test_corridor_from_an_ego_behind_the_routes_start():
    """A route that starts ahead of the ego (chained from a goal it stopped 3 m short of): an actor
    standing just past the route's first point is ahead of the ego's front, and the gap is
    measured from where the ego is (it was taken as beside the ego, and the autopilot crept into a
    motorcycle standing there)."""
    rm = load_town("avenue")
    lane = int(np.argmax(rm.length * (rm.junction < 0)))
    route = plan_route(rm, (lane, 20.0), (lane, float(rm.length[lane])))
    x0, y0, yaw = rm.pose_at(lane, 17.0)  # 3 m behind the route's start
    ax, ay, ayaw = rm.pose_at(lane, 21.7)  # a motorcycle (half length 1.1) just past it
    act = Actors(np.arange(1), np.full(1, int(ActorClass.MOTORCYCLE), np.int8), np.array([[ax, ay]]),
                 np.array([ayaw]), np.array([[1.1, 0.4]]), np.zeros((1, 2)))
    tr = RouteTracker(route)
    tr.update(x0, y0, yaw)
    assert tr.idx == 0 and tr.s == 0.0  # the tracker clamps to the start
    gaps = {}
    for measure in ("centre", "entry"):
        gaps[measure], who = corridor_lead(route, tr.idx, tr.s, x0, y0, act, 2.4, 1.05,
                                           measure=measure)
        assert who == 0, measure
    assert gaps["centre"] == pytest.approx(4.7 - 2.4 - 1.1, abs=0.5)  # bumper to bumper
    assert gaps["entry"] < gaps["centre"]
    # from the route's start the same actor is 3 m nearer
    xs, ys, _ = rm.pose_at(lane, 20.0)
    tr2 = RouteTracker(route)
    tr2.update(xs, ys, yaw)
    assert corridor_lead(route, tr2.idx, tr2.s, xs, ys, act, 2.4, 1.05) == \
        (pytest.approx(gaps["centre"] - 3.0, abs=0.1), 0)


def test_an_actor_crossing_just_ahead_of_the_front_is_in_the_way():
    """A walker crossing 0.25 m ahead of the ego's front, 0.5 m off the route, enters the corridor
    at a route point beside the ego (1 m ahead of its centre). It counts for both measures (its
    place along the route is ahead of the front), the cautious 'entry' gap below 0: the autopilot,
    which took it as beside itself, drove off from standing into a walker crossing there."""
    rm = load_town("avenue")
    lane, route = _straight(rm)
    x0, y0, yaw = rm.pose_at(lane, 10.0)
    tr = RouteTracker(route)
    tr.update(x0, y0, yaw)

    def walker_at(s):
        x, y, h = rm.pose_at(lane, s)
        side = np.array([-math.sin(h), math.cos(h)])
        return Actors(np.arange(1), np.full(1, int(ActorClass.WALKER), np.int8),
                      np.array([[x, y]]) + 0.5 * side, np.array([h - math.pi / 2]),
                      np.array([[0.3, 0.3]]), np.zeros((1, 2)))

    ahead = walker_at(10.0 + 2.4 + 0.25)
    entry, who = corridor_lead(route, tr.idx, tr.s, x0, y0, ahead, 2.4, 1.05, measure="entry",
                               parallel_reach=True)
    assert who == 0 and entry < -1.0
    centre, who = corridor_lead(route, tr.idx, tr.s, x0, y0, ahead, 2.4, 1.05)
    assert who == 0 and centre == pytest.approx(0.25 - 0.3, abs=0.6)
    # beside the ego (level with its centre + 1 m): not in the way
    assert corridor_lead(route, tr.idx, tr.s, x0, y0, walker_at(11.0), 2.4, 1.05,
                         measure="entry") == (math.inf, -1)


def test_a_car_crossing_outside_junctions_is_on_another_level():
    """With the route's junction flags, a car crossing the route at right angles where the route is
    outside junctions passes over or under it (the world's grade-separation rule): not in the way.
    A walker crossing there is, and so is a car crossing where the route runs through a junction,
    or at 30 degrees (merging, not crossing)."""
    rm = load_town("avenue")
    lane, route = _straight(rm)
    x0, y0, yaw = rm.pose_at(lane, 10.0)
    ax, ay, ayaw = rm.pose_at(lane, 25.0)
    tr = RouteTracker(route)
    tr.update(x0, y0, yaw)
    outside = np.zeros(len(route.pts), bool)

    def lead(cls, heading, in_junction):
        act = Actors(np.arange(1), np.full(1, int(cls), np.int8), np.array([[ax, ay]]),
                     np.array([heading]), np.array([[2.3, 1.0]]), np.zeros((1, 2)))
        return corridor_lead(route, tr.idx, tr.s, x0, y0, act, 2.4, 1.05, measure="entry",
                             parallel_reach=True, in_junction=in_junction)[1]

    across = ayaw + math.pi / 2
    assert lead(ActorClass.CAR, across, None) == 0  # no junction flags: no rule
    assert lead(ActorClass.CAR, across, outside) == -1
    assert lead(ActorClass.CAR, ayaw + math.radians(30), outside) == 0
    assert lead(ActorClass.WALKER, across, outside) == 0
    junction = outside.copy()
    junction[np.abs(route.cum - 27.0) < 1.0] = True  # the route in a junction just past it
    assert lead(ActorClass.CAR, across, junction) == 0


def test_parallel_reach_counts_a_car_in_the_next_3m_lane_by_its_half_width():
    """A car standing 3.0 m to the side (the next lane where lanes are 3 m wide), heading along the
    route or against it, is in the corridor with the 0.6 m cut-in allowance (1.05 + 0.5 + 1.0 +
    0.6 > 3) and not with ``parallel_reach``; turned 30 degrees towards us it is in both."""
    rm = load_town("avenue")
    lane, route = _straight(rm)
    x0, y0, yaw = rm.pose_at(lane, 10.0)
    ax, ay, ayaw = rm.pose_at(lane, 30.0)
    side = np.array([-math.sin(ayaw), math.cos(ayaw)])  # 3 m to the left of the lane's centre
    tr = RouteTracker(route)
    tr.update(x0, y0, yaw)

    def lead(heading, **kw):
        act = Actors(np.arange(1), np.full(1, int(ActorClass.CAR), np.int8),
                     np.array([[ax, ay]]) + 3.0 * side, np.array([heading]), np.array([[2.3, 1.0]]),
                     np.zeros((1, 2)))
        return corridor_lead(route, tr.idx, tr.s, x0, y0, act, 2.4, 1.05, measure="entry", **kw)

    for heading in (ayaw, ayaw + math.pi):  # along the route, or oncoming
        assert lead(heading)[1] == 0
        assert lead(heading, parallel_reach=True) == (math.inf, -1)
    turned = ayaw - math.radians(30)  # nose towards our lane
    assert lead(turned)[1] == 0 and lead(turned, parallel_reach=True)[1] == 0


def test_boxes_count_a_car_whose_corner_reaches_a_lane_change_of_the_route():
    """A car standing in the lane the route leaves, just past the change's diagonal: its centre
    is nearest to the route on the lane beyond (beside it, heading along: half its width), but its
    rear corner lies within the ego's half width and the margin of the diagonal. The disc round its
    centre misses it; ``boxes`` (the autopilot's) counts it, and measures those the disc finds as
    before (esmini's multi_lane_3way_intersection: the ego changing lanes before a junction met the
    corner of the car queued there)."""
    rm = load_town("avenue")
    lane = next(a for a in range(rm.n_lanes) if rm.junction[a] < 0 and rm.left[a] >= 0
                and rm.left_same_dir[a] and rm.length[a] > 80.0)
    route = plan_route(rm, (lane, 5.0), (int(rm.left[lane]), 75.0))
    start = route.segments[0][2]  # where the route leaves the lane
    tr = RouteTracker(route)
    x0, y0, yaw = rm.pose_at(lane, 10.0)
    tr.update(x0, y0, yaw)

    def lead(off, **kw):
        ax, ay, ayaw = rm.pose_at(lane, start + off)
        act = Actors(np.arange(1), np.full(1, int(ActorClass.CAR), np.int8), np.array([[ax, ay]]),
                     np.array([ayaw]), np.array([[2.45, 1.0]]), np.zeros((1, 2)))
        return corridor_lead(route, tr.idx, tr.s, x0, y0, act, 2.4, 1.05, measure="entry",
                             parallel_reach=True, **kw)

    assert lead(10.0) == (math.inf, -1)
    gap, who = lead(10.0, boxes=True)
    assert who == 0 and gap < start + 10.0 - tr.s
    assert lead(30.0, boxes=True) == (math.inf, -1)  # well past the diagonal: beside the route
    for off in (0.0, 4.0, 8.0):  # on the diagonal: found by the disc, measured as before
        assert lead(off, boxes=True) == lead(off) and lead(off)[1] == 0


def test_boxes_give_a_walker_no_more_reach_than_its_disc():
    """A walker standing 2 m beside the route, facing across it: its disc (reach capped at its
    half length, 0.3 m) is clear of the corridor, and so is its box: the turning-in allowance
    reaches no further than a box is long. With the allowance on its box it held the expert for
    good (CommonRoad's MONAEast: 8 respawns of the cars queued behind it)."""
    rm = load_town("avenue")
    lane, route = _straight(rm)
    x0, y0, yaw = rm.pose_at(lane, 10.0)
    tr = RouteTracker(route)
    tr.update(x0, y0, yaw)
    ax, ay, ayaw = rm.pose_at(lane, 25.0)
    side = np.array([-math.sin(ayaw), math.cos(ayaw)])

    def lead(cls, ext, lateral, **kw):
        act = Actors(np.arange(1), np.full(1, int(cls), np.int8),
                     np.array([[ax, ay]]) + lateral * side, np.array([ayaw + math.pi / 2]),
                     np.array([ext]), np.zeros((1, 2)))
        return corridor_lead(route, tr.idx, tr.s, x0, y0, act, 2.4, 1.05, measure="entry",
                             parallel_reach=True, **kw)

    assert lead(ActorClass.WALKER, (0.3, 0.3), 2.0, boxes=True) == (math.inf, -1)
    assert lead(ActorClass.WALKER, (0.3, 0.3), 1.5, boxes=True)[1] == 0
    # a car across the lane beside, its nose 1.5 m from our corridor's edge: its box counts
    assert lead(ActorClass.CAR, (2.45, 1.0), 4.4)[1] == -1
    assert lead(ActorClass.CAR, (2.45, 1.0), 4.4, boxes=True)[1] == 0


def test_autopilot_uses_the_shared_tracking():
    """The autopilot's stops are route_stops of the snapshot's lights, so it also stops at lights
    on a backend without a lane -> light table (lane_light None), and its position is the
    tracker's."""
    rm = load_town("Town02")
    world, rng, snap, pilot = autopilot_episode(rm, density_config("empty"), seed=3)
    blind = Autopilot(rm, pilot.route, None, world.cfg.ego)
    for _ in range(30):
        blind.act(snap)
        snap = world.step(pilot.act(snap))
    stops = route_stops(pilot.route, snap.lights)
    assert stops and pilot.stops == stops and blind.stops == stops
    assert blind.idx == pilot.idx == pilot.tracker.idx
    # a red light at the first stop: both brake for it at the same gap
    cum, li = stops[0]
    snap.lights.state[:] = int(LightState.GREEN)
    here = float(pilot.route.cum[pilot.idx])
    assert pilot._light_gap(snap, here) == math.inf
    snap.lights.state[li] = int(LightState.RED)
    if cum - here > 60.0:
        here = cum - 30.0
    assert blind._light_gap(snap, here) == pilot._light_gap(snap, here) == pytest.approx(
        cum - here - world.cfg.ego.length / 2)
