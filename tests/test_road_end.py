"""Networks with open road ends and broken links, as the autopilot meets them. An ego whose route
ends at an open road end: the autopilot's next route never asks for a U-turn onto the opposite
lane (it raises RouteError instead), and the driver restarts where no actor stands
(``clear_start``), not onto one; both on a constructed two-way road with open ends (esmini's
straight_500m and simple_3way_intersection have such). And at a junction whose approach lane lost
its link, the autopilot gives way to vehicles on it, as the traffic drives there."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drivemind.maps.roadmap import LaneRecord, build_roadmap
from drivemind.maps.routing import RouteError, plan_route
from drivemind.sim import SimConfig
from drivemind.sim.autopilot import Autopilot, clear_start, spawns_ahead
from drivemind.sim.config import TrafficParams
from drivemind.sim.world import LiteWorld

LENGTH = 300.0
FWD, BACK = (1, 0, -1), (1, 0, 1)


def _two_way_road(length: float = LENGTH, n: int = 40, name: str = "dead_ends"):
    xs = np.linspace(0.0, length, n)
    none = np.zeros(n, np.uint8)
    fwd = LaneRecord(key=FWD, points=np.stack([xs, np.zeros(n)], 1), width=np.full(n, 3.5),
                     mark_left=none, mark_right=none, junction=-1, successors=[], left=BACK)
    back = LaneRecord(key=BACK, points=np.stack([xs[::-1], np.full(n, 3.5)], 1),
                      width=np.full(n, 3.5), mark_left=none, mark_right=none, junction=-1,
                      successors=[], left=FWD)
    return build_roadmap(name, [fwd, back])


def test_spawns_ahead_face_the_driving_direction_nearest_first():
    rm = _two_way_road()
    ahead = spawns_ahead(rm, 150.0, 0.0, 0.0)
    d = np.hypot(rm.spawn[ahead, 0] - 150.0, rm.spawn[ahead, 1])
    assert len(ahead) > 1 and np.all(np.diff(d) >= 0)  # the nearest first
    k = ahead[0]
    assert rm.spawn[k, 0] >= 150.0 and abs(rm.spawn[k, 2]) < 1e-6  # on the +x lane, ahead
    k = spawns_ahead(rm, 150.0, 3.5, math.pi)[0]
    assert rm.spawn[k, 0] <= 150.0 and abs(abs(rm.spawn[k, 2]) - math.pi) < 1e-6
    assert len(spawns_ahead(rm, LENGTH + 50.0, 0.0, 0.0)) == 0  # past the road's end: none ahead


def test_no_u_turn_at_an_open_road_end():
    """The route ends 3 m before the +x lane's end, past its last spawn point; the nearest spawn
    point overall is on the opposite lane beside the ego. The next route must not start there (a U-turn the autopilot
    cannot drive: it left the road on simple_3way_intersection); it raises RouteError."""
    rm = _two_way_road()
    fwd = rm.key_index[FWD]
    route = plan_route(rm, (fwd, 100.0), (fwd, LENGTH - 3.0))
    pilot = Autopilot(rm, route)
    x, y = (float(v) for v in route.pts[-1])
    nearest = int(np.argmin(np.hypot(rm.spawn[:, 0] - x, rm.spawn[:, 1] - y)))
    assert rm.spawn_lane[nearest] == rm.key_index[BACK]  # the trap: the nearest one faces back
    with pytest.raises(RouteError, match="open road end"):
        pilot.new_route_from(np.random.default_rng(0), x, y)


def test_clear_start_keeps_away_from_actors():
    rm = _two_way_road()
    cfg = SimConfig(vehicles=6, walkers=0, offroad_margin=None,
                    traffic=TrafficParams(signals="none", stuck_respawn=None))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=(LENGTH, 60.0, 0.0))
    assert len(world.v_xy) >= 3
    rng = np.random.default_rng(1)
    for _ in range(10):
        r = clear_start(world, rng, clear_m=15.0)
        assert r is not None
        x0, y0, _ = r.start
        assert np.hypot(*(world.v_xy - (x0, y0)).T).min() > 15.0
    # a start this far from every actor does not exist on a 300 m road: wait, do not place
    assert clear_start(world, rng, clear_m=LENGTH) is None


def _junction_with_an_unlinked_approach():
    """A junction (id 1) where our way (B -> C -> D, northwards) crosses lane J (eastwards). J's
    approach lane A carries no link to it: the file's link was dropped (esmini's
    multi_lane_3way_intersection: its approach lanes link to their own start). The traffic goes
    on from A into J all the same (sim.tables.traffic_successors: J starts where A ends)."""
    def lane(key, p0, p1, junction=-1, succ=()):
        n = int(np.hypot(p1[0] - p0[0], p1[1] - p0[1]) / 0.5) + 1
        pts = np.stack([np.linspace(p0[0], p1[0], n), np.linspace(p0[1], p1[1], n)], 1)
        none = np.zeros(n, np.uint8)
        return LaneRecord(key=key, points=pts, width=np.full(n, 3.5), mark_left=none,
                          mark_right=none, junction=junction, successors=list(succ))

    recs = [lane((1, 0, -1), (0.0, 0.0), (100.0, 0.0)),  # A: no successor
            lane((2, 0, -1), (100.0, 0.0), (130.0, 0.0), junction=1, succ=[(3, 0, -1)]),  # J
            lane((3, 0, -1), (130.0, 0.0), (230.0, 0.0)),
            lane((4, 0, -1), (115.0, -115.0), (115.0, -15.0), succ=[(5, 0, -1)]),  # B
            lane((5, 0, -1), (115.0, -15.0), (115.0, 15.0), junction=1, succ=[(6, 0, -1)]),  # C
            lane((6, 0, -1), (115.0, 15.0), (115.0, 115.0))]  # D
    return build_roadmap("unlinked_approach", recs)


def test_the_autopilot_gives_way_on_the_links_the_traffic_drives():
    rm = _junction_with_an_unlinked_approach()
    a, j = rm.key_index[(1, 0, -1)], rm.key_index[(2, 0, -1)]
    assert not len(rm.successors(a))  # the map's own links: A is a dead end
    route = plan_route(rm, (rm.key_index[(4, 0, -1)], 10.0), (rm.key_index[(6, 0, -1)], 80.0))
    pilot = Autopilot(rm, route)
    (cr,) = pilot.crossings
    assert j in cr.conflicts
    # a vehicle coming up on A is one we give way to (before: no feeder, only one already in J)
    assert a in cr.feeders and cr.feeders[a][0][2] == [j]


@pytest.mark.parametrize("towards, in_the_way", [(True, True), (False, False)])
def test_the_autopilot_keeps_clear_of_where_a_walker_is_going(towards, in_the_way):
    """A walker 3 m beside the route 15 m ahead, walking at 1.4 m/s towards it: not in the
    corridor yet, but in 1.5 s it is, so the autopilot brakes for it now (seen only where it was,
    one stepping in from the side entered the corridor too late to stop: Town05 drivevlm seed 1,
    an ego-walker contact). Walking away from the route, it is no obstacle."""
    from dataclasses import replace

    from drivemind.sim.snapshot import ActorClass, Actors

    rm = _two_way_road()
    fwd = rm.key_index[FWD]
    route = plan_route(rm, (fwd, 50.0), (fwd, 250.0))
    world = LiteWorld(rm, SimConfig(vehicles=0, walkers=0, offroad_margin=None))
    snap = world.reset(seed=0, ego_pose=route.start)
    pilot = Autopilot(rm, route)
    pilot.tracker.locate(snap.ego.x, snap.ego.y)
    x0, y0, _ = route.start
    vy = 1.4 if towards else -1.4  # the route runs along +x at y = 0; the walker is at y = -3
    walker = Actors(np.array([10001]), np.array([int(ActorClass.WALKER)], np.int8),
                    np.array([[x0 + 15.0, y0 - 3.0]]), np.array([math.pi / 2 if towards else -math.pi / 2]),
                    np.array([[0.3, 0.3]]), np.array([[0.0, vy]]))
    snap = replace(snap, actors=walker)
    gap = pilot._corridor_gap(snap, float(route.cum[pilot.idx]))
    assert (gap < 20.0) == in_the_way


def test_the_fallback_route_starts_where_the_last_one_ended():
    """The fallback at the end of a route (no random spawn point reachable 50 m or more on):
    the route to the nearest spawn point ahead goes there from where the last route ended, with a
    lane change the autopilot checks like any other. Before, the next route started at the
    nearest spawn point ahead itself (here one on the next lane), and the ego cut across the lanes
    between (esmini's e6mini-lht: two lanes at 7 m/s, into a motorcycle)."""
    from dataclasses import replace

    from straight_roads import side_by_side

    from drivemind.sim.autopilot import NEXT_ROUTE_MIN, route_ahead
    from drivemind.sim.tracking import lane_changes

    rm = side_by_side("three_lanes", LENGTH, [(0.0, 3.5), (-3.5, 3.5), (-7.0, 3.5)])
    own, nxt = rm.key_index[(1, 0, -1)], rm.key_index[(1, 0, -2)]
    keep = (rm.spawn_lane != own) | (rm.spawn_s < 200.0)  # none of our lane's last spawn points
    rm = replace(rm, spawn=rm.spawn[keep], spawn_lane=rm.spawn_lane[keep],
                 spawn_s=rm.spawn_s[keep])
    x, y, yaw = rm.pose_at(own, 230.0)
    k = spawns_ahead(rm, x, y, yaw)[0]
    assert rm.spawn_lane[k] != own  # the nearest spawn point ahead: on another lane
    r = route_ahead(rm, (own, 230.0), x, y, yaw)
    assert np.hypot(*(r.pts[0] - (x, y))) < 0.5 and r.lanes[0] == own  # from where we are
    assert r.lanes[-1] == nxt and lane_changes(r, rm) and r.length >= NEXT_ROUTE_MIN
    # the nearest it reaches far enough on: no spawn point ahead is closer and far enough
    ahead = [float(np.hypot(*(rm.spawn[b, :2] - (x, y)))) for b in range(len(rm.spawn))
             if rm.spawn[b, 0] > x and rm.spawn_lane[b] != own]
    assert min(d for d in ahead if d >= NEXT_ROUTE_MIN) >= np.hypot(*(r.pts[-1] - (x, y))) - 1.0
    # near the road's end no spawn point ahead is far enough on: none (the caller restarts)
    x2, y2, _ = rm.pose_at(own, 260.0)
    assert route_ahead(rm, (own, 260.0), x2, y2, yaw) is None


def test_after_a_restart_the_expert_waits_for_a_snapshot_that_shows_it_there():
    """restart_elsewhere moves the ego; the caller's last snapshot still shows it where it was.
    Acting on that one, the expert located itself at its new route's end (the nearest point to
    its old place within reach), was done at once, planned its next route from there, 60 m
    ahead, and drove through a queue to it (esmini's simple_4way_intersection). It now stands
    until a snapshot shows it at its new start, and then drives its route from the start."""
    rm = _two_way_road()
    cfg = SimConfig(vehicles=0, walkers=0)
    world = LiteWorld(rm, cfg)
    snap = world.reset(seed=0, ego_pose=(LENGTH - 2.0, 0.0, 0.0))  # at the +x lane's open end
    pilot = Autopilot(rm, plan_route(rm, (rm.key_index[FWD], 10.0), (rm.key_index[FWD], 80.0)))
    rng = np.random.default_rng(3)
    assert pilot.restart_elsewhere(world, rng)
    start = pilot.route.start
    assert math.hypot(start[0] - snap.ego.x, start[1] - snap.ego.y) > 5.0  # the snapshot is stale
    assert pilot.act(snap) == (0.0, -1.0)  # it stands
    assert not pilot.done and pilot.idx == 0
    snap = world.step((0.0, -1.0))  # a snapshot of it at its new start
    pilot.act(snap)
    assert pilot.idx <= 2 and not pilot.done


def test_an_ego_waiting_for_a_clear_start_leaves_the_network(monkeypatch):
    """The ego's route ended at the +x lane's open end and no start is clear of traffic (12 cars
    on a 300 m two-way road): restart_elsewhere finds none and takes the ego off the network
    (``LiteWorld.park_ego``), as a background vehicle at an open end leaves it, instead of
    standing there in the way of the cars behind it (on a small busy network a queue stood 500 s
    behind it, and no start came clear). Off the network it meets nothing and is no static
    collision; ``place_ego`` puts it back."""
    rm = _two_way_road()
    cfg = SimConfig(vehicles=12, walkers=0, traffic=TrafficParams(signals="none", stuck_respawn=None))
    world = LiteWorld(rm, cfg)
    snap = world.reset(seed=0, ego_pose=(LENGTH - 2.0, 0.0, 0.0))
    pilot = Autopilot(rm, plan_route(rm, (rm.key_index[FWD], 10.0), (rm.key_index[FWD], 80.0)))
    rng = np.random.default_rng(3)
    import drivemind.sim.autopilot as A

    monkeypatch.setattr(A, "clear_start", lambda world, rng: None)  # no start clear now
    assert not pilot.restart_elsewhere(world, rng)
    assert world.ego_parked
    ex, ey = world.ego["x"], world.ego["y"]
    assert ex > rm.bounds[2] + 100.0 and ey > rm.bounds[3] + 100.0
    hits = []
    for _ in range(50):
        snap = world.step((0.0, -1.0))
        hits += snap.collisions
    assert hits == [] and (snap.ego.x, snap.ego.y) == (ex, ey)
    world.place_ego((10.0, 0.0, 0.0))
    assert not world.ego_parked


def test_the_expert_follows_a_route_that_passes_its_own_way_out_in_order():
    """A route in along y = 0 (eastwards) to x = 12, round a turn of radius 3 and back out
    westwards along y = 1: at x = 8 on the way in, the way out 20 m on is nearer than the way
    in. Located with its heading (the expert's), it stays on the way in; by position
    alone it jumped to the way out, left out the ring and drove off the road (CommonRoad's
    roundabout: 3-5 off-road contacts in 600 s once its traffic flowed)."""
    from drivemind.maps.routing import Route
    from drivemind.sim.tracking import RouteTracker

    inn = np.stack([np.arange(0.0, 12.0, 1.0), np.zeros(12)], 1)
    a = np.linspace(-math.pi / 2, math.pi / 2, 10)
    turn = np.stack([12.0 + 3.0 * np.cos(a), 3.0 + 3.0 * np.sin(a)], 1)
    down = np.stack([np.linspace(11.0, 9.0, 6), np.linspace(5.0, 1.0, 6)], 1)
    out = np.stack([np.arange(8.0, -1.0, -1.0), np.ones(9)], 1)
    pts = np.concatenate([inn, turn, down, out])
    d = np.diff(pts, axis=0)
    cum = np.concatenate([[0.0], np.cumsum(np.hypot(*d.T))])
    tang = np.gradient(pts, axis=0)
    route = Route([(0, 0.0, float(cum[-1]))], pts, np.arctan2(tang[:, 1], tang[:, 0]), cum,
                  np.zeros(len(pts), np.int64))
    x, y = 8.0, 0.6  # on the way in, nearer the way out (0.4 m) than the way in (0.6 m)
    blind = RouteTracker(route)
    blind.idx = 7
    assert blind.locate(x, y) > 20  # on the way out
    seeing = RouteTracker(route)
    seeing.idx = 7
    assert seeing.locate(x, y, 0.0) == 8  # on the way in, where it is
    # facing the other way (an ego turned round): by position, as before
    assert RouteTracker(route).locate(x, y, math.pi) == blind.idx


def test_a_vehicle_bound_for_a_lane_that_closes_with_no_lane_beside_leaves_there():
    """Lane A (x 0-100) leads only into lane B (x 100-115), which narrows to 0.5 m at its open
    end with no lane of its direction beside (CommonRoad's roundabout has such an arm). A car
    on A stops before the taper and, standing there, leaves the network as at an open road
    end (``npc_exits``); it stood there until the last-resort respawn before (21-25 respawns in
    600 s on that roundabout)."""
    n = 201
    xs = np.linspace(0.0, 100.0, n)
    none = np.zeros(n, np.uint8)
    a = LaneRecord(key=(1, 0, -1), points=np.stack([xs, np.zeros(n)], 1), width=np.full(n, 3.5),
                   mark_left=none, mark_right=none, junction=-1, successors=[(2, 0, -1)])
    xb = np.linspace(100.0, 115.0, 31)
    b = LaneRecord(key=(2, 0, -1), points=np.stack([xb, np.zeros(31)], 1),
                   width=np.interp(xb, [100.0, 105.0, 115.0], [3.5, 3.5, 0.5]),
                   mark_left=np.zeros(31, np.uint8), mark_right=np.zeros(31, np.uint8),
                   junction=-1, successors=[])
    rm = build_roadmap("closing_end", [a, b])
    cfg = SimConfig(vehicles=1, walkers=0, offroad_margin=None,
                    traffic=TrafficParams(signals="none", stuck_respawn=None))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=(50.0, 60.0, 0.0))
    world.v_lane[0], world.v_s[0], world.v_v[0] = rm.key_index[(1, 0, -1)], 60.0, 8.0
    world._fill_path(0)
    for _ in range(300):
        world.step((0.0, -1.0))
        if world.npc_exits:
            break
    assert world.npc_exits == 1


def test_on_a_network_all_near_the_ego_a_car_at_an_open_end_still_leaves():
    """An 80 m two-way road with the ego beside its middle: no spawn point is 40 m from the ego.
    A car reaching the road's open end, having stood there 30 s (``RESPAWN_NEAR_AFTER``), is put
    back at a free spawn point over 15 m from the ego (``RESPAWN_EGO_NEAR``); before, it found
    none and stood at the end for good (esmini's ref_point, CommonRoad's straight_road_default:
    every car standing for 590 s of 600)."""
    rm = _two_way_road(80.0, 161, "short_road")
    world = LiteWorld(rm, SimConfig(vehicles=1, walkers=0, offroad_margin=None,
                                    traffic=TrafficParams(signals="none", stuck_respawn=None)))
    world.reset(seed=0, ego_pose=(40.0, 12.0, 0.0))
    assert (np.hypot(rm.spawn[:, 0] - 40.0, rm.spawn[:, 1] - 12.0) < 40.0).all()
    world.v_lane[0], world.v_s[0], world.v_v[0] = rm.key_index[FWD], 60.0, 8.0
    world._fill_path(0)
    for _ in range(600):
        world.step((0.0, -1.0))
        if world.npc_exits:
            break
    assert world.npc_exits == 1 and 30.0 < world.time < 45.0
    assert math.hypot(world.v_xy[0, 0] - 40.0, world.v_xy[0, 1] - 12.0) > 15.0


def _junction_with_a_way_that_closes():
    """Lane A (x 0-100) leads into a junction (id 1) by two ways side by side: J1 straight on,
    narrowing from 3.5 m to 1 m onto road C of 1 m lanes (scenariogeneration's
    full_junction_with_LaneDef has such), and J2 beside it (the lane to its right, the same
    direction) onto road D, 3.5 m wide throughout."""
    def lane(key, p0, p1, width, junction=-1, succ=(), left=None, right=None):
        n = int(np.hypot(p1[0] - p0[0], p1[1] - p0[1]) / 0.5) + 1
        pts = np.stack([np.linspace(p0[0], p1[0], n), np.linspace(p0[1], p1[1], n)], 1)
        none = np.zeros(n, np.uint8)
        w = np.interp(pts[:, 0], *width) if isinstance(width, tuple) else np.full(n, width)
        return LaneRecord(key=key, points=pts, width=w, mark_left=none, mark_right=none,
                          junction=junction, successors=list(succ), left=left, right=right)

    recs = [lane((1, 0, -1), (0.0, 0.0), (100.0, 0.0), 3.5, succ=[(2, 0, -1), (3, 0, -1)]),
            lane((2, 0, -1), (100.0, 0.0), (130.0, 0.0), ([100.0, 110.0, 130.0], [3.5, 3.5, 1.0]),
                 junction=1, succ=[(4, 0, -1)], right=(3, 0, -1)),  # J1
            lane((3, 0, -1), (100.0, 0.0), (130.0, -3.5), 3.5, junction=1, succ=[(5, 0, -1)],
                 left=(2, 0, -1)),  # J2
            lane((4, 0, -1), (130.0, 0.0), (230.0, 0.0), 1.0),  # C
            lane((5, 0, -1), (130.0, -3.5), (230.0, -3.5), 3.5)]  # D
    return build_roadmap("closing_way", recs)


def test_the_traffic_keeps_off_a_way_through_a_junction_that_closes_up():
    """No vehicle gets past J1's taper (no lane changes inside a junction, so the lane beside
    does not help), so the paths drawn at A take J2 (``world.way_choices``); before, half the
    cars took J1 and stood in the junction at its taper until respawned (45 respawns in 600 s
    on full_junction_with_LaneDef, the expert standing 400 s behind them)."""
    rm = _junction_with_a_way_that_closes()
    a, j1, j2 = (rm.key_index[k] for k in ((1, 0, -1), (2, 0, -1), (3, 0, -1)))
    world = LiteWorld(rm, SimConfig(vehicles=1, walkers=0, offroad_margin=None,
                                    traffic=TrafficParams(signals="none", stuck_respawn=None)))
    world.reset(seed=0, ego_pose=(50.0, 60.0, 0.0))
    assert world._closed_exit[j1] and not world._closed_exit[j2]
    assert sorted(world._succ_choice[a][world._succ_choice[a] >= 0]) == [j2]
    taken = set()
    for k in range(40):  # paths drawn at A, and on from it while driving
        world.v_lane[0], world.v_s[0], world.v_v[0] = a, 80.0, 8.0
        world._fill_path(0)
        taken.add(int(world.v_path[0, 1]))
        for _ in range(40):
            world.step((0.0, -1.0))
            if world.v_lane[0] != a:
                taken.add(int(world.v_lane[0]))
                break
    assert taken == {j2}


def test_a_vehicle_with_no_other_way_than_one_that_closes_leaves_at_its_taper():
    """Where the way that closes up is the only one (A leading into J1 alone), the vehicle
    takes it, stops before the taper inside the junction and leaves the network there, as at
    an open road end, instead of standing in the junction until the last-resort respawn."""
    rm = _junction_with_a_way_that_closes()
    a, j1 = rm.key_index[(1, 0, -1)], rm.key_index[(2, 0, -1)]
    world = LiteWorld(rm, SimConfig(vehicles=1, walkers=0, offroad_margin=None,
                                    traffic=TrafficParams(signals="none", stuck_respawn=None)))
    world.reset(seed=0, ego_pose=(50.0, 60.0, 0.0))
    world.v_lane[0], world.v_s[0], world.v_v[0] = a, 80.0, 8.0
    world.v_path[0] = -1
    world.v_path[0, :3] = (a, j1, rm.key_index[(4, 0, -1)])
    seen_j1 = False
    for _ in range(300):
        world.step((0.0, -1.0))
        seen_j1 |= bool(world.v_lane[0] == j1)
        if world.npc_exits:
            break
    assert seen_j1 and world.npc_exits == 1


def test_way_choices_keeps_off_ways_that_only_lead_into_a_closing_lane():
    """On the successor table alone: lane 0 leads on by 1 and 2; 1 leads only into 3, which
    closes up, so 1 is dropped from 0's choices too; 2 leads into 4, an open road end (vehicles
    leave there: no such way). Lane 5 has only the way into 3 and keeps it."""
    from drivemind.sim.world import way_choices
    succ = np.array([[1, 2], [3, -1], [4, -1], [-1, -1], [-1, -1], [3, -1]])
    closed = np.array([False, False, False, True, False, False])
    out = way_choices(succ, closed)
    assert out[0].tolist() == [2, -1]
    assert out[5].tolist() == [3, -1] and out[1].tolist() == [3, -1]
    assert np.array_equal(out[2:5], succ[2:5])
    # with nothing closed the table is the map's
    assert np.array_equal(way_choices(succ, np.zeros(6, bool)), succ)
