"""traffic.overtake: on a two-way road a car passes a bicycle in the oncoming lane when that lane
is free for the whole manoeuvre, and does not start while an oncoming vehicle is near, over a
solid line, or with the setting at never; never any contact."""

from __future__ import annotations

import numpy as np
import pytest

from drivemind.maps.roadmap import LaneRecord, MarkingType, build_roadmap
from drivemind.sim import SimConfig
from drivemind.sim import kernels as K
from drivemind.sim.config import TrafficParams
from drivemind.sim.snapshot import ActorClass
from drivemind.sim.world import LiteWorld

LENGTH = 500.0
FWD, BACK = (1, 0, -1), (1, 0, 1)  # right lane (+x), the oncoming lane left of it (-x)


def _two_way_road(mark=MarkingType.BROKEN):
    n = 60
    xs = np.linspace(0.0, LENGTH, n)
    marks = np.full(n, int(mark), np.uint8)
    fwd = LaneRecord(key=FWD, points=np.stack([xs, np.zeros(n)], 1), width=np.full(n, 3.5),
                     mark_left=marks, mark_right=np.zeros(n, np.uint8), junction=-1,
                     successors=[], left=BACK)
    back = LaneRecord(key=BACK, points=np.stack([xs[::-1], np.full(n, -3.5)], 1),
                      width=np.full(n, 3.5), mark_left=marks, mark_right=np.zeros(n, np.uint8),
                      junction=-1, successors=[], left=FWD)
    return build_roadmap("two_way", [fwd, back])


def _world(overtake="oncoming", mark=MarkingType.BROKEN, oncoming_at=None):
    """Car 0 at 8 m/s 20 m behind bicycle 1 (4 m/s) on the right lane; with ``oncoming_at``, car 2
    comes the other way on the oncoming lane, that far along the road (x) at 8 m/s."""
    rm = _two_way_road(mark)
    n = 3 if oncoming_at is not None else 2
    cfg = SimConfig(vehicles=n - 1, bicycles=1, offroad_margin=None,
                    traffic=TrafficParams(signals="none", stuck_respawn=None, overtake=overtake))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=(LENGTH, 60.0, 0.0))  # the ego far off the road, standing
    assert len(world.v_lane) == n
    fwd, back = rm.key_index[FWD], rm.key_index[BACK]
    cls = [ActorClass.CAR, ActorClass.BICYCLE, ActorClass.CAR][:n]
    start = [(fwd, 30.0, 8.0), (fwd, 55.0, 4.0),
             (back, LENGTH - (oncoming_at or 0.0), 8.0)][:n]
    for i, (c, (lane, s, v)) in enumerate(zip(cls, start)):
        world.v_cls[i] = int(c)
        car = c == ActorClass.CAR
        world.v_hl[i], world.v_hw[i] = (2.3, 0.95) if car else (0.9, 0.35)
        world.v_vcap[i], world.v_amax[i], world.v_b[i] = (30.0, 2.0, 3.0) if car else (4.0, 1.0, 2.0)
        world.v_vfac[i] = 1.0
        world.v_lane[i], world.v_s[i], world.v_v[i] = lane, s, v
        world.v_path[i] = -1
        world.v_path[i, 0] = lane
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    return world


def _drive(world, seconds):
    """Step the world; returns the car's largest offset to the left (m) and its x at each step."""
    out, xs = 0.0, []
    for _ in range(int(seconds / world.cfg.dt)):
        snap = world.step((0.0, -1.0))
        assert snap.npc_collisions == 0 and not snap.collisions
        out = max(out, -float(world.v_xy[0, 1]))
        xs.append(float(world.v_xy[0, 0]))
    return out, np.array(xs)


def test_a_car_passes_a_bicycle_in_the_free_oncoming_lane():
    world = _world()
    out, _ = _drive(world, 30.0)
    assert world.npc_overtakes == 1 and world.npc_overtake_aborts == 0
    assert out > 3.0  # it was out in the oncoming lane (centre 3.5 m to the left) ...
    assert world.v_s[0] > world.v_s[1] + 20.0  # ... went past the bicycle ...
    assert world.v_lat[0] == 0.0 and world.v_otk[0] == K.OTK_OFF  # ... and is back in its lane
    assert abs(world.v_xy[0, 1]) < 1e-6
    assert world.v_xy[0, 0] < LENGTH - K.OVERTAKE_END  # within the road, before its end


@pytest.mark.parametrize("case", ["never", "solid line"])
def test_no_overtake_with_the_setting_at_never_or_over_a_solid_line(case):
    world = (_world(overtake="never") if case == "never" else _world(mark=MarkingType.SOLID))
    out, _ = _drive(world, 30.0)
    assert world.npc_overtakes == 0 and out < 0.1
    assert world.v_s[0] < world.v_s[1]  # still behind the bicycle


def test_no_overtake_while_an_oncoming_car_is_near_then_one_once_it_has_gone():
    world = _world(oncoming_at=200.0)  # 145 m ahead of the bicycle, closing at 12 m/s
    passed_at = None
    for t in range(int(40.0 / world.cfg.dt)):
        snap = world.step((0.0, -1.0))
        assert snap.npc_collisions == 0 and not snap.collisions
        if passed_at is None and world.v_xy[2, 0] < world.v_xy[0, 0] - 5.0:
            passed_at = t  # the oncoming car is behind the car now
            assert world.npc_overtakes == 0  # it did not start while that car was near
            assert -world.v_xy[0, 1] < 0.1 and world.v_s[0] < world.v_s[1]
    assert passed_at is not None
    # with the oncoming lane free again it passes
    assert world.npc_overtakes == 1 and world.v_s[0] > world.v_s[1]


def test_an_overtake_is_given_up_when_a_car_appears_in_the_oncoming_lane():
    world = _world(oncoming_at=LENGTH)  # car 2 parked out of the way at the road's far end ...
    world.v_v[2] = 0.0
    world.v_s[2] = 0.0
    back = world.v_lane[2]
    for _ in range(30):  # 3 s: the car pulls out
        world.step((0.0, -1.0))
        if world.v_otk[0] == K.OTK_OUT:
            break
    assert world.v_otk[0] == K.OTK_OUT
    # ... until it appears 120 m ahead in the oncoming lane, coming at 8 m/s
    world.v_s[2] = LENGTH - (world.v_xy[0, 0] + 120.0)
    world.v_v[2] = 8.0
    assert world.v_lane[2] == back
    for _ in range(int(20.0 / world.cfg.dt)):  # until the oncoming car has gone by
        snap = world.step((0.0, -1.0))
        assert snap.npc_collisions == 0 and not snap.collisions
        if world.v_xy[2, 0] < world.v_xy[0, 0] - 5.0:
            break
    assert world.v_xy[2, 0] < world.v_xy[0, 0] - 5.0
    assert world.npc_overtake_aborts == 1
    assert world.v_s[0] < world.v_s[1]  # it dropped back in behind the bicycle
    assert abs(world.v_xy[0, 1]) < 0.5  # in its own lane when the oncoming car went by


def test_unknown_overtake_lists_the_valid_ones():
    with pytest.raises(ValueError, match="traffic.overtake must be one of oncoming, never"):
        SimConfig(traffic=TrafficParams(overtake="left"))
