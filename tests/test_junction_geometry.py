"""Junction rules that depend on the shape of the ways through (stop 49, from CARLA's Town07 of
the opendrive-test-files, a road network nobody tuned on): box-aware conflicts
(``traffic.junction_conflict``), following a vehicle ahead on a diverging way of several lane
sections (``traffic.diverging_follow``), and the room beyond a junction measured from the end of
the whole way (``traffic.junction_exit``). Each map is built here from LaneRecords."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drivemind.maps.roadmap import LaneRecord, build_roadmap
from drivemind.sim import SimConfig
from drivemind.sim import kernels as K
from drivemind.sim.config import TrafficParams
from drivemind.sim.tables import conflict_matrix
from drivemind.sim.world import PATH_LEN, LiteWorld

FAR = (1e5, 1e5, 0.0)  # the ego, out of the way


def _rec(key, pts, junction=-1, succ=()):
    n = len(pts)
    none = np.zeros(n, np.uint8)
    return LaneRecord(key=key, points=np.asarray(pts, float), width=np.full(n, 3.2),
                      mark_left=none, mark_right=none, junction=junction, successors=list(succ))


def _line(p0, p1, step=0.5):
    n = max(2, int(round(math.dist(p0, p1) / step)) + 1)
    t = np.linspace(0.0, 1.0, n)[:, None]
    return np.asarray(p0) * (1 - t) + np.asarray(p1) * t


# Two ways through one junction of CARLA's Town07 (opendrive-test-files, MIT licence, (c) 2019
# CVC at the UAB): road 216 lane 1 (section 3) and road 204 lane 1 (section 2), as our loader
# samples them, in metres. Their centre lines pass 2.66 m apart, yet two cars on them met.
TOWN07_A = [(-141.78, -36.49), (-142.74, -36.5), (-143.69, -36.5), (-144.64, -36.48),
            (-145.59, -36.36), (-146.51, -36.11), (-147.4, -35.76), (-148.23, -35.31),
            (-149.01, -34.76), (-149.72, -34.12), (-150.34, -33.4), (-150.87, -32.61),
            (-151.3, -31.76), (-151.62, -30.86), (-151.83, -29.93), (-151.92, -28.98),
            (-151.94, -28.03), (-151.95, -27.07)]
TOWN07_B = [(-158.69, -33.52), (-157.71, -33.51), (-156.73, -33.56), (-155.75, -33.71),
            (-154.81, -33.97), (-153.9, -34.35), (-153.04, -34.82), (-152.25, -35.41),
            (-151.52, -36.07), (-150.88, -36.81), (-150.31, -37.62), (-149.82, -38.47),
            (-149.42, -39.36), (-149.09, -40.29), (-148.86, -41.25), (-148.71, -42.22),
            (-148.65, -43.2)]


def town07_turns(shift: float = 0.0):
    """Town07's two ways through (above), each with a straight 60 m approach and a 200 m exit;
    way B moved ``shift`` m away from way A (south-west), to show that farther apart they do not
    conflict. Lanes a1 -> t1 -> e1 and a2 -> t2 -> e2."""
    keys = dict(a1=(1, 0, -1), t1=(10, 0, -1), e1=(3, 0, -1), a2=(2, 0, -1), t2=(11, 0, -1),
                e2=(4, 0, -1))
    recs = []
    for n, way in ((1, np.array(TOWN07_A)), (2, np.array(TOWN07_B) - shift / math.sqrt(2))):
        d0 = (way[1] - way[0]) / np.linalg.norm(way[1] - way[0])
        d1 = (way[-1] - way[-2]) / np.linalg.norm(way[-1] - way[-2])
        a, t, e = keys[f"a{n}"], keys[f"t{n}"], keys[f"e{n}"]
        recs += [_rec(a, _line(way[0] - 60.0 * d0, way[0]), succ=[t]),
                 _rec(t, way, junction=1, succ=[e]),
                 _rec(e, _line(way[-1], way[-1] + 200.0 * d1))]
    rm = build_roadmap(f"town07_turns_{shift}", recs)
    return rm, {k: rm.keys.index(v) for k, v in keys.items()}


def _centre_gap(rm, a, b):
    pa, pb = rm.lane_points(a), rm.lane_points(b)
    return float(np.sqrt(((pa[:, None] - pb[None]) ** 2).sum(-1)).min())


def test_ways_whose_car_boxes_touch_conflict_though_their_centre_lines_do_not():
    rm, ix = town07_turns()
    t1, t2 = ix["t1"], ix["t2"]
    assert 2.6 < _centre_gap(rm, t1, t2) < 2.75
    assert conflict_matrix(rm, 2.6)[t1, t2] == 0  # the rule before: centre lines only
    assert conflict_matrix(rm, 2.6, box=True)[t1, t2] == 1
    # 2 m farther apart, the boxes pass too: no conflict under either rule
    rm, ix = town07_turns(2.0)
    assert _centre_gap(rm, ix["t1"], ix["t2"]) > 4.0
    assert conflict_matrix(rm, 2.6, box=True)[ix["t1"], ix["t2"]] == 0


def _place(world, i, lane, s, v, first_lanes):
    world.v_lane[i], world.v_s[i], world.v_v[i] = lane, s, v
    path = list(first_lanes)
    while len(path) < PATH_LEN:
        nxt = world.succ[path[-1]]
        nxt = nxt[nxt >= 0]
        path.append(int(nxt[0]) if len(nxt) else -1)
    world.v_path[i] = path
    world.v_lat[i], world.v_lcfrom[i] = 0.0, -1
    world.v_grant[i], world.v_entered[i] = -1, False


def _two_cars(rm, **traffic):
    cfg = SimConfig(vehicles=2, traffic=TrafficParams(signals="none", stuck_respawn=None,
                                                      wait_cycle_after=None, **traffic))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=FAR)
    assert len(world.v_lane) == 2
    world.v_cls[:], world.v_hl[:], world.v_hw[:] = 1, 2.4, 1.0
    world.v_vcap[:], world.v_amax[:], world.v_b[:], world.v_vfac[:] = 30.0, 2.0, 3.0, 1.0
    return world


def test_two_cars_on_those_ways_meet_only_under_the_centre_line_rule():
    """Car 0 comes up to way A and car 1 to way B at the same speed, car 0 from 17 to 20 m out
    (in 0.5 m steps), car 1 from 20 m: under the rule before, both are let in at once, and at some
    of these offsets their boxes meet in the bend (the world turns a box in steps between lane
    points, as it places a vehicle); under the box rule one waits and none meets."""
    rm, ix = town07_turns()
    met = {}
    for rule in ("centre", "boxes"):
        met[rule] = 0
        for d0 in np.arange(17.0, 20.01, 0.5):
            world = _two_cars(rm, junction_conflict=rule)
            for i, (n, d) in enumerate(((1, d0), (2, 20.0))):
                lane = ix[f"a{n}"]
                _place(world, i, lane, rm.length[lane] - d, 5.0, [lane, ix[f"t{n}"]])
            K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
            for _ in range(150):  # 15 s
                world.step((0.0, 0.0))
            assert world.v_lane.tolist() == [ix["e1"], ix["e2"]]  # both got through
            met[rule] += world.npc_collision_total
    assert met["centre"] > 0
    assert met["boxes"] == 0


def diverging_ways():
    """From one lane (east-bound), way A: a 2 m lane section, then a straight 14 m one; way B: one
    lane bending gently right, 3 m off A's line after 16 m. Each goes on into an exit lane."""
    xs = np.linspace(0.0, 16.0, 33)
    bend = np.stack([xs, -3.0 * (xs / 16.0) ** 2], 1)
    keys = dict(a=(1, 0, -1), w0=(20, 0, -1), w1=(20, 1, -1), b=(21, 0, -1), ea=(2, 0, -1),
                eb=(3, 0, -1))
    recs = [
        _rec(keys["a"], _line((-60.0, 0.0), (0.0, 0.0)), succ=[keys["w0"], keys["b"]]),
        _rec(keys["w0"], _line((0.0, 0.0), (2.0, 0.0)), junction=1, succ=[keys["w1"]]),
        _rec(keys["w1"], _line((2.0, 0.0), (16.0, 0.0)), junction=1, succ=[keys["ea"]]),
        _rec(keys["b"], bend, junction=1, succ=[keys["eb"]]),
        _rec(keys["ea"], _line((16.0, 0.0), (76.0, 0.0))),
        _rec(keys["eb"], _line((16.0, -3.0), (76.0, -25.5))),
    ]
    rm = build_roadmap("diverging_ways", recs)
    return rm, {k: rm.keys.index(v) for k, v in keys.items()}


@pytest.mark.parametrize("follow", ["way", "lane"])
def test_a_vehicle_standing_on_a_diverging_way_is_followed_past_the_way_s_first_section(follow):
    """Car 0 went ahead into way B and stands 10 m in, its body still over way A's line; car 1
    takes way A, whose first section is 2 m long. It may go in behind car 0 (a car length in, as
    into one lane). With 'lane' (the rule before) it followed car 0 only on that first section,
    then drove on into it (Town07, dense: a way of 7 lane sections, the first 2 m long)."""
    rm, ix = diverging_ways()
    world = _two_cars(rm, diverging_follow=follow)
    _place(world, 0, ix["b"], 10.0, 0.0, [ix["b"]])
    world.v_vcap[0] = 0.0  # it stands (its way on is taken, say)
    world.v_grant[0], world.v_entered[0] = ix["b"], True
    _place(world, 1, ix["a"], rm.length[ix["a"]] - 25.0, 5.0, [ix["a"], ix["w0"], ix["w1"]])
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    for _ in range(200):  # 20 s
        world.step((0.0, 0.0))
    if follow == "lane":
        assert world.npc_collision_total > 0
    else:
        assert world.npc_collision_total == 0
        assert world.v_lane[1] in (ix["w0"], ix["w1"])  # in behind car 0, standing
        assert world.v_v[1] < 0.5


@pytest.mark.parametrize("exit_rule", ["way", "lane"])
def test_the_room_beyond_a_junction_is_measured_from_the_end_of_the_whole_way(exit_rule):
    """Car 0 stands 3 m into way A's exit lane, so there is no room for another car beyond the
    junction. Car 1, coming up to way A (a 2 m section and a 14 m one), must wait before the
    junction; with 'lane' (the rule before) the room was measured from the end of the way's first
    section, inside the junction, and it went in and stood there."""
    rm, ix = diverging_ways()
    world = _two_cars(rm, junction_exit=exit_rule)
    _place(world, 0, ix["ea"], 3.0, 0.0, [ix["ea"]])
    world.v_vcap[0] = 0.0
    _place(world, 1, ix["a"], rm.length[ix["a"]] - 25.0, 5.0, [ix["a"], ix["w0"], ix["w1"]])
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    for _ in range(200):  # 20 s
        world.step((0.0, 0.0))
    assert world.npc_collision_total == 0
    inside = rm.junction[world.v_lane[1]] >= 0
    assert inside == (exit_rule == "lane")
    if exit_rule == "way":
        assert world.v_lane[1] == ix["a"] and world.v_grant[1] == -1


def test_unknown_junction_rules_list_the_valid_ones():
    for key, valid in (("junction_conflict", "boxes, centre"), ("diverging_follow", "way, lane"),
                       ("junction_exit", "way, lane")):
        with pytest.raises(ValueError, match=f"traffic.{key} must be one of {valid}"):
            SimConfig(traffic=TrafficParams(**{key: "other"}))


def hairpin(radius: float = 6.5):
    """One lane: 40 m east, a half turn left of ``radius`` (a hairpin), 40 m back west."""
    a = np.linspace(-math.pi / 2, math.pi / 2, max(2, int(math.pi * radius / 0.5) + 1))
    turn = np.stack([40.0 + radius * np.cos(a), radius + radius * np.sin(a)], 1)
    pts = np.concatenate([_line((0.0, 0.0), (40.0, 0.0))[:-1], turn[:-1],
                          _line((40.0, 2 * radius), (0.0, 2 * radius))])
    return build_roadmap("hairpin", [_rec((1, 0, -1), pts)])


def test_the_autopilot_keeps_to_its_lane_through_a_hairpin():
    """Pure pursuit from half-way between the box centre and the rear axle, on a point 2-12 m
    ahead: through a 6.5 m hairpin the ego's centre stays within 0.4 m of the lane's centre line
    (0.3 here). From the box centre on a point 4-12 m ahead, as before, it cut 1.2 m inside such
    bends (on Town07, into the oncoming lane); from the rear axle it swung 0.7 m wide."""
    from drivemind.maps.routing import plan_route
    from drivemind.sim.autopilot import Autopilot, _polyline_distance

    rm = hairpin()
    route = plan_route(rm, (0, 2.0), (0, float(rm.length[0]) - 5.0))
    world = LiteWorld(rm, SimConfig(vehicles=0, walkers=0))
    snap = world.reset(seed=0, ego_pose=route.start)
    pilot = Autopilot(rm, route)
    worst, speeds = 0.0, []
    for _ in range(600):
        snap = world.step(pilot.act(snap))
        e = snap.ego
        worst = max(worst, _polyline_distance(route.pts, e.x, e.y))
        speeds.append(e.speed)
        if pilot.done:
            break
    assert pilot.done
    assert max(speeds) > 3.0  # it drove the bend at speed, not creeping
    assert worst < 0.4, f"the ego left the centre line by {worst:.2f} m"


def linked_junctions(link_pieces=1):
    """Two junctions joined by a 2 m link (as Town07's 350 and 479): a west-east way through
    junction 1 (lane l1), the link, and on through junction 2 (lane l2), which a south-north way
    (lane w, the ego's) crosses at (0, 0). ``link_pieces``: the link in that many lanes, one after
    the other (short lane sections, as CommonRoad's exports have; ``k`` is the first)."""
    keys = dict(a1=(1, 0, -1), l1=(10, 0, -1), k=(2, 0, -1), l2=(11, 0, -1), x2=(3, 0, -1),
                ein=(4, 0, -1), w=(12, 0, -1), eout=(5, 0, -1))
    pieces = [keys["k"]] + [(20 + p, 0, -1) for p in range(1, link_pieces)]
    xs = np.linspace(-7.0, -5.0, link_pieces + 1)
    recs = [
        _rec(keys["a1"], _line((-77.0, 0.0), (-17.0, 0.0)), succ=[keys["l1"]]),
        _rec(keys["l1"], _line((-17.0, 0.0), (-7.0, 0.0)), junction=1, succ=[keys["k"]]),
        *[_rec(key, _line((xs[p], 0.0), (xs[p + 1], 0.0)),
               succ=[pieces[p + 1] if p + 1 < link_pieces else keys["l2"]])
          for p, key in enumerate(pieces)],
        _rec(keys["l2"], _line((-5.0, 0.0), (5.0, 0.0)), junction=2, succ=[keys["x2"]]),
        _rec(keys["x2"], _line((5.0, 0.0), (65.0, 0.0))),
        _rec(keys["ein"], _line((0.0, -65.0), (0.0, -5.0)), succ=[keys["w"]]),
        _rec(keys["w"], _line((0.0, -5.0), (0.0, 5.0)), junction=2, succ=[keys["eout"]]),
        _rec(keys["eout"], _line((0.0, 5.0), (0.0, 65.0))),
    ]
    rm = build_roadmap("linked_junctions", recs)
    return rm, {k: rm.keys.index(v) for k, v in keys.items()}


def _expert(world, rm, route, cfg):
    """The expert on ``route`` after one braking step of the world as placed: (pilot, snapshot,
    its place on the route)."""
    from drivemind.sim.autopilot import Autopilot

    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    snap = world.step((0.0, -1.0))
    pilot = Autopilot(rm, route, world.lights.lane_light, cfg.ego)
    pilot.act(snap)
    return pilot, snap, float(route.cum[pilot.idx])


def test_the_autopilot_gives_way_to_a_vehicle_still_in_the_junction_before_a_short_link():
    """The ego stands at junction 2's stop line; a car 3 m into junction 1 comes on at 6 m/s
    through the 2 m link into junction 2, across the ego's way. The expert must wait for it
    (before, it looked for vehicles coming up only on lanes outside junctions, missed this one,
    went, and the two stood face to face in junction 2: Town07)."""
    from drivemind.maps.routing import plan_route

    rm, ix = linked_junctions()
    cfg = SimConfig(vehicles=1, walkers=0, traffic=TrafficParams(signals="none"))
    world = LiteWorld(rm, cfg)
    route = plan_route(rm, (ix["ein"], 20.0), (ix["eout"], 40.0))
    half = cfg.ego.length / 2
    world.reset(seed=0, ego_pose=(0.0, -5.0 - half - 0.5, math.pi / 2))
    assert len(world.v_lane) == 1
    _place(world, 0, ix["l1"], 3.0, 6.0, [ix["l1"], ix["k"], ix["l2"], ix["x2"]])
    world.v_grant[0], world.v_entered[0] = ix["l1"], True
    pilot, snap, here = _expert(world, rm, route, cfg)
    assert pilot._junction_gap(snap, here) < 2.0  # it waits at the stop line
    # the same car far down junction 2's exit is no reason to wait
    _place(world, 0, ix["x2"], 30.0, 6.0, [ix["x2"]])
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    snap = world.step((0.0, -1.0))
    assert pilot._junction_gap(snap, here) == math.inf


def test_the_autopilot_crosses_two_junctions_joined_by_a_short_link_as_one():
    """The ego comes up to junction 1, whose way leads through a 2 m link into junction 2, where
    a car stands across that way. It waits before junction 1 (before, it went in and stood at
    junction 2's stop line inside junction 1, where a car that waited for it could not leave
    junction 2: Town07). With the car gone, it goes."""
    from drivemind.maps.routing import plan_route

    rm, ix = linked_junctions()
    cfg = SimConfig(vehicles=1, walkers=0, traffic=TrafficParams(signals="none"))
    world = LiteWorld(rm, cfg)
    route = plan_route(rm, (ix["a1"], 20.0), (ix["x2"], 40.0))
    half = cfg.ego.length / 2
    world.reset(seed=0, ego_pose=(-17.0 - half - 0.5, 0.0, 0.0))
    _place(world, 0, ix["w"], 5.0, 0.0, [ix["w"], ix["eout"]])
    world.v_vcap[0] = 0.0
    world.v_grant[0], world.v_entered[0] = ix["w"], True
    pilot, snap, here = _expert(world, rm, route, cfg)
    assert pilot._junction_gap(snap, here) < 2.0  # it waits before junction 1
    _place(world, 0, ix["eout"], 40.0, 0.0, [ix["eout"]])
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    snap = world.step((0.0, -1.0))
    assert pilot._junction_gap(snap, here) == math.inf
    # one still coming up to junction 2 is left until the ego is there (timed from before
    # junction 1, every one would come first: it waited 67 s on Town07 at drivevlm)
    _place(world, 0, ix["ein"], rm.length[ix["ein"]] - 20.0, 6.0, [ix["ein"], ix["w"]])
    world.v_vcap[0] = 30.0
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    snap = world.step((0.0, -1.0))
    assert snap.actors.velocity[0, 1] > 5.0  # it is coming
    assert pilot._junction_gap(snap, here) == math.inf


def test_the_autopilot_in_a_junction_before_a_short_link_waits_there_only_for_moving_vehicles():
    """The ego is in junction 1, 2 m short of the link into junction 2; a car stands in junction
    2 on the way crossing ours, its rear still by the crossing. The expert does not wait for it at
    junction 2's entry (there it stood in junction 1, in the way of the vehicles that the one it
    waited for was waiting for: CommonRoad's roundabout, a minute at a time): its corridor brings
    it up to the car's box instead. A car coming on along that way is still given way to."""
    from drivemind.maps.routing import plan_route

    rm, ix = linked_junctions()
    cfg = SimConfig(vehicles=1, walkers=0, traffic=TrafficParams(signals="none"))
    world = LiteWorld(rm, cfg)
    route = plan_route(rm, (ix["a1"], 20.0), (ix["x2"], 40.0))
    half = cfg.ego.length / 2
    for s, v in ((8.0, 0.0), (1.0, 6.0)):
        world.reset(seed=0, ego_pose=(-5.0 - half - 2.0, 0.0, 0.0))
        _place(world, 0, ix["w"], s, v, [ix["w"], ix["eout"]])
        world.v_vcap[0] = 30.0 if v else 0.0
        world.v_grant[0], world.v_entered[0] = ix["w"], True
        pilot, snap, here = _expert(world, rm, route, cfg)
        assert world._ego_lane == ix["l1"]
        if v:
            assert pilot._junction_gap(snap, here) < 2.5  # it waits at junction 2's entry
        else:
            assert s - world.v_hl[0] < pilot.crossings[1].conflicts[ix["w"]][1]  # by the crossing
            assert pilot._junction_gap(snap, here) == math.inf
            assert pilot._corridor_gap(snap, here) < 5.0  # and stops at the car


@pytest.mark.parametrize("exit_rule, link_pieces", [("way", 1), ("lane", 1), ("way", 4)])
def test_a_vehicle_waits_before_a_junction_whose_short_link_leads_across_the_ego(exit_rule,
                                                                                link_pieces):
    """The ego stands in junction 2 across the way a car would take on from junction 1 through
    the 2 m link. The car waits before junction 1; with 'lane' (the rule before) it went in and
    stood in junction 1, in the way of an ego waiting there for it (Town07). With the link in
    four lanes the car's path of PATH_LEN lanes ends on the link, before junction 2: it is run on
    along the only way on (before, a path that ran out was taken as room enough, and the car
    went in: CommonRoad's roundabout, whose ring links are 1.2 m lanes)."""
    rm, ix = linked_junctions(link_pieces)
    cfg = SimConfig(vehicles=1, walkers=0, traffic=TrafficParams(
        signals="none", stuck_respawn=None, wait_cycle_after=None, junction_exit=exit_rule))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=(0.0, -1.0, math.pi / 2))
    _place(world, 0, ix["a1"], rm.length[ix["a1"]] - 30.0, 6.0, [ix["a1"], ix["l1"], ix["k"]])
    assert (ix["l2"] in world.v_path[0].tolist()) == (link_pieces == 1)
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    for _ in range(150):  # 15 s, the ego standing
        world.step((0.0, -1.0))
    assert world.npc_collision_total == 0
    if exit_rule == "way":
        assert world.v_lane[0] == ix["a1"] and world.v_grant[0] == -1
    else:
        assert world.v_lane[0] in (ix["l1"], ix["k"])


def test_a_path_is_run_on_along_the_only_way_on_and_says_where_it_forks():
    """kernels._path_on: the drawn path, then each last lane's only way on (the table paths are
    drawn from) as far as the buffer holds; it stops at a lane with several ways on (and says so)
    or none. A path that ends before PATH_LEN lanes is a dead end and is not run on."""
    # lanes 0 -> 1 -> ... -> 7 -> 8 (the only way on each), 8 -> 9 or 10 (junction lanes)
    choose = np.full((11, 2), -1, np.int64)
    for a in range(8):
        choose[a, 0] = a + 1
    choose[8] = (9, 10)
    junction = np.array([-1] * 9 + [3, 3], np.int64)
    path = np.array([[0, 1, 2, 3, 4, 5]], np.int64)
    out = np.full((1, 24), -1, np.int64)
    na, fork = K._path_on(path, 0, choose, out)
    assert (na, fork) == (9, True) and out[0, :na].tolist() == list(range(9))
    assert K._all_into_junction(choose, 8, junction)
    assert not K._all_into_junction(choose, 7, junction)
    # run on up to the buffer's length only
    short = np.full((1, 7), -1, np.int64)
    assert K._path_on(path, 0, choose, short) == (7, False)
    # a path that ends before its last slot: a dead end, as drawn
    ended = np.array([[0, 1, 2, -1, -1, -1]], np.int64)
    assert K._path_on(ended, 0, choose, out) == (3, False) and out[0, 3] == -1
