"""A* routing on the lane graph."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from drivemind.maps import RouteError, load_town, plan_route, random_route
from drivemind.maps.roadmap import LaneRecord, build_roadmap
from drivemind.maps.routing import LANE_CHANGE_GAP, LANE_CHANGES



def dijkstra_length(rm, start, goal):
    """Reference shortest distance along successor links only (no lane changes)."""
    (l0, s0), (lg, sg) = start, goal
    if l0 == lg and sg >= s0:
        return sg - s0
    dist = {}
    heap = [(rm.length[l0] - s0, int(n)) for n in rm.successors(l0)]  # cost to the START of n
    heapq.heapify(heap)
    while heap:
        d, lane = heapq.heappop(heap)
        if lane in dist:
            continue
        dist[lane] = d
        if lane == lg:
            return d + sg
        for n in rm.successors(lane):
            if int(n) not in dist:
                heapq.heappush(heap, (d + rm.length[lane], int(n)))
    return math.inf


def town(name):
    return load_town(name)  # CARLA towns: the copies shipped with the package


@pytest.mark.parametrize("name", ["Town02", "grid", "curves"])
def test_astar_is_shortest(name):
    rm = town(name)
    assert not (((rm.left >= 0) & rm.left_same_dir) | ((rm.right >= 0) & rm.right_same_dir)).any(), \
        "this check needs a town without same-direction neighbours"
    rng = np.random.default_rng(1)
    for _ in range(40):
        a, b = rng.integers(len(rm.spawn), size=2)
        start = (int(rm.spawn_lane[a]), float(rm.spawn_s[a]))
        goal = (int(rm.spawn_lane[b]), float(rm.spawn_s[b]))
        r = plan_route(rm, start, goal)
        ref = dijkstra_length(rm, start, goal)
        assert r.length == pytest.approx(ref, rel=0.02, abs=0.5)


def test_route_polyline_is_continuous_and_connected():
    rm = town("grid")
    r = random_route(rm, np.random.default_rng(3), min_length=300)
    steps = np.hypot(*np.diff(r.pts, axis=0).T)
    assert steps.max() < 1.01 and r.cum[-1] == pytest.approx(r.length)
    lanes = r.lane_sequence()
    for a, b in zip(lanes, lanes[1:]):
        assert b in rm.successors(a) or b in (rm.left[a], rm.right[a])
    # starts and ends at the spawn points it was planned between
    x, y, yaw = r.start
    assert any(np.hypot(rm.spawn[:, 0] - x, rm.spawn[:, 1] - y) < 1e-6)


def test_lane_changes_on_multilane_roads():
    rm = town("avenue")
    multi = np.flatnonzero((rm.right >= 0) & rm.right_same_dir & (rm.junction < 0))
    assert len(multi) > 0
    lane = int(multi[0])
    other = int(rm.right[lane])
    # from the middle of one lane to the end of its same-direction neighbour: a lane change
    r = plan_route(rm, (lane, rm.length[lane] * 0.2), (other, rm.length[other] * 0.95))
    assert r.lane_sequence() == [lane, other]
    assert r.length < rm.length[lane]  # no detour round the block
    steps = np.hypot(*np.diff(r.pts, axis=0).T)
    assert steps.max() < 5.0  # the change is a short diagonal, not a jump


def test_route_cap_rejects_and_resamples():
    rm = town("grid")
    rng = np.random.default_rng(0)
    for _ in range(10):
        r = random_route(rm, rng, max_length=400)
        assert r.length <= 400
    with pytest.raises(RouteError, match="no route"):
        random_route(rm, rng, max_length=1.0, min_length=0.5, max_tries=20)


def test_pairs_further_apart_than_the_cap_are_not_searched(monkeypatch):
    """A route is never shorter than the straight line between its ends: a pair of spawn points
    further apart than max_length is drawn again without an A* search (in a town 10 km across
    most pairs are); the search would have rejected them, so the same routes are drawn."""
    from drivemind.maps import routing

    rm = town("grid")
    searched = []
    plan = routing.plan_route

    def counting(rm_, start, goal, **kw):
        searched.append(rm_.pose_at(int(start[0]), float(start[1]))[:2]
                        + rm_.pose_at(int(goal[0]), float(goal[1]))[:2])
        return plan(rm_, start, goal, **kw)

    monkeypatch.setattr(routing, "plan_route", counting)
    rng = np.random.default_rng(3)
    for _ in range(5):
        assert random_route(rm, rng, max_length=150.0).length <= 150.0
    assert searched
    assert all(math.hypot(x0 - x1, y0 - y1) <= 150.0 + 1.0 for x0, y0, x1, y1 in searched)


def ring(cx, cy, r=30.0, lane_id=-1, road=1):
    t = np.linspace(0, 2 * np.pi, 200)
    pts = np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], 1)
    key = (road, 0, lane_id)
    return LaneRecord(key, pts, np.full(200, 3.5), np.zeros(200, np.uint8), np.zeros(200, np.uint8),
                      -1, [key])


def test_unreachable_goal_and_bad_lane_are_clear_errors():
    rm = build_roadmap("two-rings", [ring(0, 0, road=1), ring(200, 0, road=2)])
    with pytest.raises(RouteError, match="unreachable"):
        plan_route(rm, (0, 5.0), (1, 5.0))
    # same ring, goal behind the start: goes round the loop
    r = plan_route(rm, (0, 50.0), (0, 10.0))
    assert r.length == pytest.approx(rm.length[0] - 40.0, abs=0.5)
    with pytest.raises(RouteError, match="lane 7 does not exist"):
        plan_route(rm, (7, 0.0), (0, 1.0))
    with pytest.raises(RouteError, match="outside lane"):
        plan_route(rm, (0, 1e4), (0, 1.0))


def _three_lanes():
    from straight_roads import side_by_side

    rm = side_by_side("three_lanes", 200.0, [(0.0, 3.5), (-3.5, 3.5), (-7.0, 3.5)])
    return rm, [rm.key_index[(1, 0, -k)] for k in (1, 2, 3)]


def _change_starts(rm, route):
    from drivemind.sim.tracking import lane_changes

    return [float(route.cum[i]) for i, _ in lane_changes(route, rm)]


def test_two_lane_changes_in_a_row_share_the_stretch():
    """From the left lane to the right one of three, 190 m: ``spread`` (the default) starts the
    two changes at about a third and two thirds of the stretch, so the second is not squeezed
    against its end; ``middle`` (the placement before, which route files written before it keep)
    at about a half and three quarters. A single change lies in the middle either way."""
    rm, (a, b, c) = _three_lanes()
    spread = _change_starts(rm, plan_route(rm, (a, 10.0), (c, 200.0)))
    middle = _change_starts(rm, plan_route(rm, (a, 10.0), (c, 200.0), lane_changes="middle"))
    half = LANE_CHANGE_GAP / 2
    assert spread == pytest.approx([190 / 3 - half, 190 * 2 / 3 - half / 2], abs=3.0)
    assert middle == pytest.approx([190 / 2 - half, 190 * 3 / 4 - half / 2], abs=3.0)
    one = [_change_starts(rm, plan_route(rm, (a, 10.0), (b, 200.0), lane_changes=lc))
           for lc in LANE_CHANGES]
    assert one[0] == one[1] == pytest.approx([190 / 2 - half], abs=1.0)
    with pytest.raises(ValueError, match="lane_changes must be one of spread, middle; got 'late'"):
        plan_route(rm, (a, 10.0), (c, 200.0), lane_changes="late")


def test_a_route_file_keeps_the_lane_changes_it_was_written_with():
    """A route file written before ``lane_changes`` existed re-plans its routes with the old
    placement (the fixed evaluation routes keep their polylines); a new file says ``spread``."""
    from drivemind.envs.routes import make_fixed_routes, map_fingerprint, routes_from_spec

    rm, (a, _, c) = _three_lanes()
    spec = {"town": rm.name, "map_fingerprint": map_fingerprint(rm),
            "routes": [{"start": {"lane": list(rm.keys[a]), "s": 10.0},
                        "goal": {"lane": list(rm.keys[c]), "s": 200.0}}]}
    old, = routes_from_spec(rm, spec)
    new, = routes_from_spec(rm, {**spec, "lane_changes": "spread"})
    assert _change_starts(rm, old) == _change_starts(
        rm, plan_route(rm, (a, 10.0), (c, 200.0), lane_changes="middle"))
    assert _change_starts(rm, new) == _change_starts(rm, plan_route(rm, (a, 10.0), (c, 200.0)))
    assert _change_starts(rm, new) != _change_starts(rm, old)
    assert make_fixed_routes(rm, n=1)["lane_changes"] == "spread"
    with pytest.raises(ValueError, match="my file: lane_changes must be one of spread, middle"):
        routes_from_spec(rm, {**spec, "lane_changes": "late"}, "my file")


@pytest.mark.parametrize("goal_s", [60.0, 30.0])
def test_a_goal_two_lanes_over_within_the_stretch_is_reached_on_its_lane(goal_s):
    """The goal lies two lanes over, 50 or 20 m on. ``spread``: both changes share the stretch up
    to the goal and the route ends at the goal, on its lane. ``middle`` (route files written
    before): the first change ignores the goal (the middle of the rest of the lane) and the route
    ends on the start lane past the goal (the env's next route then started two lanes over, and
    the expert cut across to it: esmini's e6mini)."""
    rm, (a, _, c) = _three_lanes()
    gx, gy, _ = rm.pose_at(c, goal_s)
    new = plan_route(rm, (a, 10.0), (c, goal_s))
    assert np.hypot(*(new.pts[-1] - (gx, gy))) < 0.5 and new.lanes[-1] == c
    assert len(_change_starts(rm, new)) == 2
    assert new.length == pytest.approx(goal_s - 10.0, abs=2.5)
    old = plan_route(rm, (a, 10.0), (c, goal_s), lane_changes="middle")
    assert old.lanes[-1] == a and old.pts[-1][0] > goal_s  # the placement before, kept for old files


def test_a_goal_too_close_for_its_lane_changes_still_ends_on_its_lane():
    """Two lane changes (8 m each) to a goal 10 m on: the route cannot land before it, but ends on
    the goal's lane (``spread``), not on the start lane with no length (the two changes had no
    length of their own and were dropped from the polyline)."""
    rm, (a, _, c) = _three_lanes()
    r = plan_route(rm, (a, 10.0), (c, 20.0))
    assert r.lanes[-1] == c and r.pts[-1][1] == pytest.approx(-7.0, abs=0.1)
    assert r.length > 2 * LANE_CHANGE_GAP - 1.0


def _bay_road():
    """A 200 m one-way road: a 3.25 m driving lane (road 1, lane -1) and on its right a bay lane
    (lane -2) 5 m wide, closing to nothing from 60 to 75 m, closed to 95 m, open again from
    110 m (parking bays along a road, as esmini's parking_demo)."""
    xs = np.arange(0.0, 200.01, 0.5)
    w = np.interp(xs, [0, 60, 75, 95, 110, 200], [5, 5, 0, 0, 5, 5])
    none = np.zeros(len(xs), np.uint8)
    main = LaneRecord(key=(1, 0, -1), points=np.stack([xs, np.zeros_like(xs)], 1),
                      width=np.full(len(xs), 3.25), mark_left=none, mark_right=none, junction=-1,
                      successors=[], left=None, right=(1, 0, -2))
    bay = LaneRecord(key=(1, 0, -2), points=np.stack([xs, -(3.25 + w) / 2], 1), width=w,
                     mark_left=none, mark_right=none, junction=-1, successors=[],
                     left=(1, 0, -1), right=None)
    return build_roadmap("bays", [main, bay])


@pytest.mark.parametrize("start, goal", [((0, 10.0), (1, 150.0)), ((0, 10.0), (1, 190.0)),
                                         ((1, 20.0), (0, 180.0)), ((0, 10.0), (1, 40.0))])
def test_a_route_does_not_run_along_a_lane_where_it_closes_up(start, goal):
    """A change into the bay lane lands past its closed stretch when the goal lies beyond it, and
    a change out of it leaves before it closes. Before, a change at the stretch's middle put the
    route into the first bay and on along the bay lane's centre line through the closed stretch,
    0.2 m beside the driving lane's: the expert followed it into that lane's traffic."""
    rm = _bay_road()
    main, bay = rm.key_index[(1, 0, -1)], rm.key_index[(1, 0, -2)]
    lanes = {0: main, 1: bay}
    route = plan_route(rm, (lanes[start[0]], start[1]), (lanes[goal[0]], goal[1]))
    assert route.lanes[0] == lanes[start[0]] and route.lanes[-1] == lanes[goal[0]]
    for lane, s0, s1 in route.segments:
        if lane == bay:  # on the bay lane only where it is open (2.5 m or wider)
            k = (rm.s[rm.offset[bay]:rm.offset[bay + 1]] >= s0 - LANE_CHANGE_GAP) & \
                (rm.s[rm.offset[bay]:rm.offset[bay + 1]] <= s1)
            assert rm.width[rm.offset[bay]:rm.offset[bay + 1]][k].min() >= 2.5, (s0, s1)
    if goal == (1, 40.0):  # a goal in the first bay: changed into it before it
        assert route.segments[1][1] <= 40.0
