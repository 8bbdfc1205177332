"""Lane changes between lanes further apart than usual, or whose spacing changes along the road
(scenariogeneration's road_with_changing_lane_width: lanes 4 to 9 m wide): the route's change is
longer in proportion, and the expert's check finds the cars in the lane it moves onto where that
lane lies further in or out than at the change."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drivemind.maps.roadmap import LaneRecord, build_roadmap
from drivemind.maps.routing import LANE_CHANGE_GAP, LANE_CHANGE_REF, plan_route
from drivemind.sim.autopilot import Autopilot
from drivemind.sim.snapshot import Actors, ActorClass, EgoState, TrafficLights, WorldSnapshot


def _two_lanes(width_b, length=300.0):
    """Lane (1, 0, -1) along y = 0, 4 m wide, and beside it on the left (-y: + is right here)
    lane (1, 0, -2), ``width_b(x)`` wide, abutting it: its centre at -(2 + width_b / 2)."""
    xs = np.arange(0.0, length + 0.25, 0.5)
    wb = width_b(xs)
    a = LaneRecord(key=(1, 0, -1), points=np.stack([xs, np.zeros_like(xs)], 1),
                   width=np.full(len(xs), 4.0), mark_left=np.zeros(len(xs), np.uint8),
                   mark_right=np.zeros(len(xs), np.uint8), junction=-1, successors=[])
    b = LaneRecord(key=(1, 0, -2), points=np.stack([xs, -(2.0 + wb / 2.0)], 1), width=wb,
                   mark_left=np.zeros(len(xs), np.uint8), mark_right=np.zeros(len(xs), np.uint8),
                   junction=-1, successors=[])
    a.left, b.right = b.key, a.key
    return build_roadmap("two_lanes", [a, b])


def _change(route):
    """(arc length where the route leaves lane a, where it is on lane b)."""
    (la, s_in_a, s_out_a), (lb, s_in_b, _) = route.segments[:2]
    return s_out_a, s_in_b


@pytest.mark.parametrize("wb, expect", [(4.0, LANE_CHANGE_GAP), (12.0, LANE_CHANGE_GAP * 8.0 / LANE_CHANGE_REF)])
def test_a_change_across_lanes_far_apart_is_longer_in_proportion(wb, expect):
    """Lanes 4 m apart: the usual 8 m change. Lanes 8 m apart (the second 12 m wide): 16 m, the
    same angle; before, 8 m at 45 degrees."""
    rm = _two_lanes(lambda x: np.full_like(x, wb))
    route = plan_route(rm, (0, 20.0), (1, 280.0))
    s_out, s_in = _change(route)
    assert s_in - s_out == pytest.approx(expect, abs=0.05)
    diag = route.pts[(route.cum > 25.0) & (route.cum < 270.0)]
    heading = np.degrees(np.abs(np.arctan2(np.diff(diag[:, 1]), np.diff(diag[:, 0])))).max()
    assert heading < 30.0  # about 27 degrees (atan(4 / 8)) either way


def _snapshot(ego_xy, car_xy, car_v):
    act = Actors(np.arange(1), np.full(1, int(ActorClass.CAR), np.int8), np.array([car_xy]),
                 np.zeros(1), np.array([[2.3, 0.95]]), np.array([[car_v, 0.0]]))
    lights = TrafficLights(np.zeros(0, np.int64), np.zeros((0, 2)), np.zeros(0),
                           np.zeros(0, np.uint8), [])
    return WorldSnapshot(0, 0.0, 0.1, EgoState(ego_xy[0], ego_xy[1], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                                               0.0, (2.4, 1.05)), act, lights)


@pytest.mark.parametrize("widening", [True, False])
def test_the_expert_sees_a_car_coming_up_where_the_lane_beside_lies_nearer(widening):
    """The lane beside widens from 4 m (centres 4 m apart) before x = 100 to 12 m (8 m apart)
    from x = 125; the route changes onto it at x = 147. The ego stands 3 m short of the change;
    a car comes up at 9 m/s in that lane at x = 110, on its centre line 5.6 m from ours. The
    expert waits for it. Before, the check looked for cars 8 m over all along (the lanes'
    spacing at the change), missed it, and the car met the expert on the diagonal. On a road
    whose lanes keep 8 m apart, the same car 8 m over is seen either way."""
    def width_b(x):
        return np.clip(4.0 + 8.0 * (x - 100.0) / 25.0, 4.0, 12.0) if widening else np.full_like(x, 12.0)

    rm = _two_lanes(width_b)
    route = plan_route(rm, (0, 20.0), (1, 290.0))
    pilot = Autopilot(rm, route)
    (c0, c1, side), = pilot.changes
    assert side == pytest.approx(-8.0, abs=0.1)
    here = c0 - pilot.ego.length / 2 - 3.0
    x_car = 110.0
    y_car = -(2.0 + float(width_b(np.array([x_car]))[0]) / 2.0)
    snap = _snapshot((20.0 + here, 0.0), (x_car, y_car), 9.0)
    pilot.tracker.locate(20.0 + here, 0.0)
    assert pilot._lane_taken(snap, here, side, c0, c1, join=True)
    assert pilot._lane_change_gap(snap, here) < math.inf
    # the same car in our own lane is no car in the lane we move onto
    snap.actors.pos[0] = (x_car, 0.0)
    assert not pilot._lane_taken(snap, here, side, c0, c1, join=True)
