"""A lane that closes (a lane drop, a 2+1 road's passing lane ending): the traffic on it moves
over before it, and the traffic beside lets it in; routes move over before it too."""

from __future__ import annotations

import numpy as np
import pytest

from drivemind.maps.roadmap import LaneRecord, build_roadmap
from drivemind.maps.routing import plan_route
from drivemind.sim import SimConfig
from drivemind.sim.config import TrafficParams
from drivemind.sim.tables import traffic_successors
from drivemind.sim.world import LiteWorld


def _lane(key, x0, x1, y=0.0, succ=(), width=None):
    xs = np.linspace(x0, x1, int(x1 - x0) + 1)
    w = np.full(len(xs), 3.5) if width is None else width(xs)
    return LaneRecord(key=key, points=np.stack([xs, np.full(len(xs), y)], 1), width=w,
                      mark_left=np.zeros(len(xs), np.uint8),
                      mark_right=np.zeros(len(xs), np.uint8), junction=-1, successors=list(succ))


def _closing(xs):  # 3.5 m wide to x = 150, then narrowing to nothing at x = 200
    return np.clip(3.5 * (200.0 - xs) / 50.0, 0.0, 3.5)


def _drop_map(after=None):
    """A through lane along y = 0, (1, 0, -1) to x = 200 and (2, 0, -1) on to x = 1000, and on
    its right a lane (1, 0, -2) that narrows from x = 150 and ends at x = 200; ``after``: the
    width of a lane (3, 0, -1) starting where the closing one ends, in line with it (a link the
    map leaves out, or a lane opening again)."""
    a = _lane((1, 0, -1), 0, 200, succ=[(2, 0, -1)])
    b = _lane((1, 0, -2), 0, 200, y=3.5, width=_closing)
    a.right, b.left = b.key, a.key
    lanes = [a, b, _lane((2, 0, -1), 200, 1000)]
    if after is not None:
        lanes.append(_lane((3, 0, -1), 200.3, 400, y=3.5, width=after))
    return build_roadmap("lane_drop", lanes)


@pytest.mark.parametrize("yield_", ["closing", "none"])
def test_a_car_standing_at_a_lane_drop_is_let_in(yield_):
    """A car stands on the closing lane at x = 160, before it narrows under 2.5 m; a stream of
    10 cars at 8 m/s, 14 m apart, comes along the through lane. With ``traffic.merge_yield:
    closing`` (the default) a car of the stream that can stop for it lets it in, and it moves
    over with most of the stream still behind it; with ``none`` (the rule before, the study's)
    it waited until the stream had gone by (esmini's two_plus_one: 9 respawns in 600 s at
    dense, 0 with ``closing``)."""
    from drivemind.sim.snapshot import ActorClass

    rm = _drop_map()
    a, b = rm.key_index[(1, 0, -1)], rm.key_index[(1, 0, -2)]
    a2 = rm.key_index[(2, 0, -1)]
    stream = 10
    world = LiteWorld(rm, SimConfig(vehicles=1 + stream, offroad_margin=None, traffic=TrafficParams(
        signals="none", stuck_respawn=None, wait_cycle_after=None, merge_yield=yield_)))
    world.reset(seed=0, ego_pose=(900.0, 80.0, 0.0))
    for i in range(1 + stream):
        lane, s, v = (b, 160.0, 0.0) if i == 0 else (a, 154.0 - 14.0 * i, 8.0)
        world.v_cls[i] = int(ActorClass.CAR)
        world.v_hl[i], world.v_hw[i] = 2.3, 0.95
        world.v_lane[i], world.v_s[i], world.v_v[i], world.v_vfac[i] = lane, s, v, 1.0
        world.v_vcap[i] = 8.0
        world.v_path[i] = -1
        world.v_path[i, :2] = (lane, a2) if lane == a else (lane, -1)
        world.v_lctimer[i] = 10.0
    from drivemind.sim import kernels as K

    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    behind_when_over = None
    contacts = 0
    for _ in range(400):  # 40 s
        contacts += len(world.step((0.0, -1.0)).collisions)
        if behind_when_over is None and world.v_lane[0] in (a, a2):
            behind_when_over = int((world.v_xy[1:, 0] < world.v_xy[0, 0]).sum())
    assert contacts == 0 and world.npc_collision_total == 0
    assert behind_when_over is not None, "the car never moved over"
    if yield_ == "closing":
        assert behind_when_over >= stream // 2
    else:
        assert behind_when_over == 0


@pytest.mark.parametrize("yield_", ["closing", "none"])
def test_the_expert_standing_at_a_lane_drop_is_let_in(yield_):
    """As above with the expert on the closing lane (x = 140, standing; its route changes onto
    the through lane at x = 154-162, before the lane narrows under 2.5 m), the stream coming
    along beside it: with ``merge_yield: closing`` a car of the stream lets it in as it
    lets a background car in, and it is across with most of the stream still behind it; with
    ``none`` it waited until the stream had gone by."""
    from drivemind.sim import kernels as K
    from drivemind.sim.autopilot import Autopilot
    from drivemind.sim.snapshot import ActorClass

    rm = _drop_map()
    a, b, a2 = (rm.key_index[k] for k in ((1, 0, -1), (1, 0, -2), (2, 0, -1)))
    stream = 10
    world = LiteWorld(rm, SimConfig(vehicles=stream, offroad_margin=None, traffic=TrafficParams(
        signals="none", stuck_respawn=None, wait_cycle_after=None, merge_yield=yield_)))
    route = plan_route(rm, (b, 140.0), (a2, 600.0))
    snap = world.reset(seed=0, ego_pose=route.start)
    for i in range(stream):
        world.v_cls[i] = int(ActorClass.CAR)
        world.v_hl[i], world.v_hw[i] = 2.3, 0.95
        world.v_lane[i], world.v_s[i], world.v_v[i], world.v_vfac[i] = a, 140.0 - 14.0 * i, 8.0, 1.0
        world.v_vcap[i] = 8.0
        world.v_path[i] = -1
        world.v_path[i, :2] = (a, a2)
        world.v_lctimer[i] = 10.0
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    pilot = Autopilot(rm, route, world.lights.lane_light, world.cfg.ego)
    behind_when_over = None
    hits = 0
    for _ in range(400):  # 40 s
        snap = world.step(pilot.act(snap))
        hits += len(snap.collisions)
        if behind_when_over is None and snap.ego.y < 1.0:
            behind_when_over = int((world.v_xy[:, 0] < snap.ego.x).sum())
    assert hits == 0 and world.npc_collision_total == 0
    assert behind_when_over is not None, "the expert never moved over"
    if yield_ == "closing":
        assert behind_when_over >= stream // 2
    else:
        assert behind_when_over <= 1


def test_a_lane_that_closes_at_its_end_is_not_continued_by_the_lane_starting_there():
    """A dead end gets the lane starting within 2.5 m of its end, heading the same way, as its
    continuation (an unlinked export). A lane that narrows to nothing is a lane drop: the lane
    starting at its end (one opening again, or the next lane beside) is no way on, and a route
    continued through it along the taper to its very end (esmini's multi_lanesections: the expert
    stood there across both lanes)."""
    rm = _drop_map(after=lambda xs: np.full(len(xs), 3.5))
    b, c = rm.key_index[(1, 0, -2)], rm.key_index[(3, 0, -1)]
    assert list(traffic_successors(rm)[b][traffic_successors(rm)[b] >= 0]) == []
    # the same lane ending at full width is continued, as before
    wide = build_roadmap("no_drop", [_lane((1, 0, -2), 0, 200, y=3.5),
                                     _lane((2, 0, -1), 200.3, 400, y=3.5)])
    wb, wc = wide.key_index[(1, 0, -2)], wide.key_index[(2, 0, -1)]
    assert list(traffic_successors(wide)[wb][traffic_successors(wide)[wb] >= 0]) == [wc]
    assert c != b


def test_a_route_starting_on_a_lane_drop_moves_over_at_once():
    """A route from the closing lane at x = 160, too close to where it narrows under 2.5 m
    (x = 164) for a change before it, changes lanes where it starts; it ran along the taper to
    the lane's end before (the expert then stood in the taper, beside the traffic moving over:
    esmini's two_plus_one)."""
    rm = _drop_map()
    b = rm.key_index[(1, 0, -2)]
    route = plan_route(rm, (b, 160.0), (rm.key_index[(2, 0, -1)], 200.0))
    assert route.pts[0, 1] == pytest.approx(3.5)
    assert route.pts[route.pts[:, 1] > 3.0, 0].max() < 162.0  # off the closing lane at once
    assert np.abs(route.pts[route.pts[:, 0] > 169.0, 1]).max() < 0.1  # across within 9 m


def test_a_route_moves_over_before_a_lane_drop_the_map_links_on():
    """The closing lane linked on to the lane it merges into (esmini's two_plus_one links its
    passing lane's taper on to the lane beyond): a route changes lanes before the lane narrows
    instead of following the link along the taper, where the expert stood across the lane
    coming the other way (two_plus_one dense: 9 respawns; 0 with this)."""
    a = _lane((1, 0, -1), 0, 200, succ=[(2, 0, -1)])
    b = _lane((1, 0, -2), 0, 200, y=3.5, width=_closing, succ=[(2, 0, -1)])
    a.right, b.left = b.key, a.key
    linked = build_roadmap("lane_drop_linked", [a, b, _lane((2, 0, -1), 200, 1000)])
    ix = linked.key_index
    lb = ix[(1, 0, -2)]
    assert list(linked.successors(lb)) == [ix[(2, 0, -1)]]
    route = plan_route(linked, (lb, 20.0), (ix[(2, 0, -1)], 200.0))
    assert route.pts[route.pts[:, 1] > 3.0, 0].max() < 160.0  # off before it narrows (x = 164)
    assert np.abs(route.pts[route.pts[:, 0] > 170.0, 1]).max() < 0.1


@pytest.mark.parametrize("yield_", ["closing", "none"])
def test_a_lane_closing_just_past_a_section_end_is_left_in_time(yield_):
    """The lane narrows 5 m into the next lane section (scenariogeneration's
    lane_number_change_merge: a 30 m section whose outer lane closes). A car at 8 m/s on the
    closing lane, 60 m before the section's end, beside a stream on the through lane. With
    ``merge_yield: closing`` it sees the taper on its path's next lane, asks to be let over and
    may move over near the section's end (MOBIL keeps off a lane's last 12 m otherwise), reading
    the cars at the start of the next section too: it is across before the taper, with no
    contact. With ``none`` it saw the taper only once on that lane, 5 m from it, where no change
    is allowed, and stood there (10 respawns in 600 s at dense)."""
    from drivemind.sim import kernels as K
    from drivemind.sim.snapshot import ActorClass

    def closing(xs):  # 3.0 m at x = 250, under 2.5 m from x = 255, nothing at x = 280
        return np.clip(3.0 * (280.0 - xs) / 30.0, 0.0, 3.0)

    a1, a2 = _lane((1, 0, -1), 0, 250, succ=[(1, 1, -1)]), _lane((1, 1, -1), 250, 280, succ=[(1, 2, -1)])
    b1, b2 = _lane((1, 0, -2), 0, 250, y=3.5, succ=[(1, 1, -2)]), _lane((1, 1, -2), 250, 280, y=3.5,
                                                                       width=closing)
    a1.right, b1.left, a2.right, b2.left = b1.key, a1.key, b2.key, a2.key
    rm = build_roadmap("late_taper", [a1, a2, b1, b2, _lane((1, 2, -1), 280, 1000)])
    ix = rm.key_index
    stream = 8
    world = LiteWorld(rm, SimConfig(vehicles=1 + stream, offroad_margin=None, traffic=TrafficParams(
        signals="none", stuck_respawn=None, wait_cycle_after=None, merge_yield=yield_)))
    world.reset(seed=0, ego_pose=(900.0, 80.0, 0.0))
    for i in range(1 + stream):
        if i == 0:
            lane, s, path = ix[(1, 0, -2)], 190.0, [ix[(1, 0, -2)], ix[(1, 1, -2)]]
        else:
            lane, s = ix[(1, 0, -1)], 200.0 - 14.0 * i
            path = [ix[(1, 0, -1)], ix[(1, 1, -1)], ix[(1, 2, -1)]]
        world.v_cls[i] = int(ActorClass.CAR)
        world.v_hl[i], world.v_hw[i] = 2.3, 0.95
        world.v_lane[i], world.v_s[i], world.v_v[i], world.v_vfac[i] = lane, s, 8.0, 1.0
        world.v_vcap[i] = 8.0
        world.v_path[i] = -1
        world.v_path[i, :len(path)] = path
        world.v_lctimer[i] = 10.0
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    contacts = 0
    for _ in range(300):  # 30 s
        contacts += len(world.step((0.0, -1.0)).collisions)
    over = world.map.keys[world.v_lane[0]][2] == -1
    assert contacts == 0 and world.npc_collision_total == 0
    assert over == (yield_ == "closing")
    if yield_ == "none":  # it stands where the lane narrows
        assert world.v_v[0] < 0.1 and world.v_xy[0, 0] < 256.0
