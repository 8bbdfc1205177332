"""traffic.overtake: on a two-way road a car passes a bicycle in the oncoming lane when that lane
is free for the whole manoeuvre, and does not start while an oncoming vehicle is near, over a
kerb, over a solid line unless the bicycle rides at 16 km/h or less (traffic.overtake_solid), or
with the setting at never; never any contact."""

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


def _world(overtake="oncoming", mark=MarkingType.BROKEN, oncoming_at=None, overtake_solid="slow",
           bicycle_speed=4.0):
    """Car 0 at 8 m/s 20 m behind bicycle 1 (``bicycle_speed`` m/s) on the right lane; with
    ``oncoming_at``, car 2 comes the other way on the oncoming lane, that far along the road (x)
    at 8 m/s."""
    rm = _two_way_road(mark)
    n = 3 if oncoming_at is not None else 2
    cfg = SimConfig(vehicles=n - 1, bicycles=1, offroad_margin=None,
                    traffic=TrafficParams(signals="none", stuck_respawn=None, overtake=overtake,
                                          overtake_solid=overtake_solid))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=(LENGTH, 60.0, 0.0))  # the ego far off the road, standing
    assert len(world.v_lane) == n
    fwd, back = rm.key_index[FWD], rm.key_index[BACK]
    cls = [ActorClass.CAR, ActorClass.BICYCLE, ActorClass.CAR][:n]
    start = [(fwd, 30.0, 8.0), (fwd, 55.0, bicycle_speed),
             (back, LENGTH - (oncoming_at or 0.0), 8.0)][:n]
    for i, (c, (lane, s, v)) in enumerate(zip(cls, start)):
        world.v_cls[i] = int(c)
        car = c == ActorClass.CAR
        world.v_hl[i], world.v_hw[i] = (2.3, 0.95) if car else (0.9, 0.35)
        world.v_vcap[i], world.v_amax[i], world.v_b[i] = ((30.0, 2.0, 3.0) if car else
                                                          (bicycle_speed, 1.0, 2.0))
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


@pytest.mark.parametrize("case", ["never", "solid line, overtake_solid=never",
                                  "solid line, a bicycle faster than 16 km/h", "a kerb"])
def test_no_overtake_with_the_setting_at_never_or_over_a_solid_line(case):
    world = {"never": lambda: _world(overtake="never"),
             "solid line, overtake_solid=never": lambda: _world(mark=MarkingType.SOLID,
                                                                overtake_solid="never"),
             "solid line, a bicycle faster than 16 km/h": lambda: _world(
                 mark=MarkingType.SOLID_SOLID, bicycle_speed=K.OVERTAKE_SOLID_SPEED + 0.5),
             "a kerb": lambda: _world(mark=MarkingType.CURB)}[case]()
    out, _ = _drive(world, 30.0)
    assert world.npc_overtakes == 0 and out < 0.1
    assert world.v_s[0] < world.v_s[1]  # still behind the bicycle


@pytest.mark.parametrize("mark", [MarkingType.SOLID, MarkingType.SOLID_SOLID])
def test_a_car_passes_a_slow_bicycle_over_a_solid_line(mark):
    """traffic.overtake_solid=slow (the default): a bicycle at 16 km/h or less may be passed over
    a solid line (the UK Highway Code's rule 129), with the same checks as over a broken one."""
    world = _world(mark=mark)
    out, _ = _drive(world, 30.0)
    assert world.npc_overtakes == 1 and world.npc_overtake_aborts == 0
    assert out > 3.0 and world.v_s[0] > world.v_s[1] + 20.0
    assert world.v_otk[0] == K.OTK_OFF and abs(world.v_xy[0, 1]) < 1e-6


@pytest.mark.parametrize("mark", [MarkingType.BROKEN, MarkingType.SOLID_SOLID])
def test_no_overtake_while_an_oncoming_car_is_near_then_one_once_it_has_gone(mark):
    world = _world(oncoming_at=200.0, mark=mark)  # 145 m ahead of the bicycle, closing at 12 m/s
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


def _curved_two_way_road(straight=200.0, radius=20.0, angle=np.pi, step=0.5):
    """A two-way road running ``straight`` m along +x, then turning left through ``angle`` on an
    arc of ``radius`` m (its centre line): its right lane (FWD) is 11 m longer than its left one
    (BACK, the other way), all of it in the bend."""
    x, y, h = 0.0, 0.0, 0.0
    xs, ys, hs = [x], [y], [h]
    for length, turn in ((straight, 0.0), (radius * angle, 1.0 / radius)):
        m = max(1, int(round(length / step)))
        for _ in range(m):
            hm = h + 0.5 * turn * length / m
            x, y, h = x + length / m * np.cos(hm), y + length / m * np.sin(hm), h + turn * length / m
            xs.append(x), ys.append(y), hs.append(h)
    ref, hd = np.stack([xs, ys], 1), np.array(hs)
    left = np.stack([-np.sin(hd), np.cos(hd)], 1)
    n = len(ref)
    marks, none = np.full(n, int(MarkingType.BROKEN), np.uint8), np.zeros(n, np.uint8)
    fwd = LaneRecord(key=FWD, points=ref - 1.75 * left, width=np.full(n, 3.5), mark_left=marks,
                     mark_right=none, junction=-1, successors=[], left=BACK)
    back = LaneRecord(key=BACK, points=(ref + 1.75 * left)[::-1], width=np.full(n, 3.5),
                      mark_left=marks, mark_right=none, junction=-1, successors=[], left=FWD)
    return build_roadmap("curved_two_way", [fwd, back])


def _contacts_after_a_car_appears(place, ahead):
    """On the curved road, car 0 (8 m/s) pulls out to pass bicycle 1 (4 m/s) on the straight;
    then car 2 appears in the oncoming lane ``ahead`` m ahead of it (by arc length of car 0's
    lane), coming at 8 m/s. Returns the contacts between vehicles over the next 30 s."""
    rm = _curved_two_way_road()
    fwd, back = rm.key_index[FWD], rm.key_index[BACK]
    assert rm.length[fwd] - rm.length[back] > 10.0
    cfg = SimConfig(vehicles=2, bicycles=1, offroad_margin=None,
                    traffic=TrafficParams(signals="none", stuck_respawn=None,
                                          lane_change_place=place))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=(0.0, 200.0, 0.0))  # the ego off the road, standing
    cls = [ActorClass.CAR, ActorClass.BICYCLE, ActorClass.CAR]
    for i, (c, (lane, s, v)) in enumerate(zip(cls, [(fwd, 30.0, 8.0), (fwd, 55.0, 4.0),
                                                    (back, 0.0, 0.0)])):
        car = c == ActorClass.CAR
        world.v_cls[i], world.v_vfac[i] = int(c), 1.0
        world.v_hl[i], world.v_hw[i] = (2.3, 0.95) if car else (0.9, 0.35)
        world.v_vcap[i], world.v_amax[i], world.v_b[i] = (30.0, 2.0, 3.0) if car else (4.0, 1.0, 2.0)
        world.v_lane[i], world.v_s[i], world.v_v[i] = lane, s, v
        world.v_path[i] = -1
        world.v_path[i, 0] = lane
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    for _ in range(30):
        world.step((0.0, -1.0))
        if world.v_otk[0] == K.OTK_OUT:
            break
    assert world.v_otk[0] == K.OTK_OUT
    world.v_s[2] = rm.length[back] - (world.v_s[0] + ahead) * rm.length[back] / rm.length[fwd]
    world.v_v[2] = 8.0
    return sum(world.step((0.0, -1.0)).npc_collisions for _ in range(300))


def test_a_car_out_overtaking_and_one_coming_the_other_way_keep_apart_on_a_curved_road():
    """Where the two lanes of a road differ in length (a bend), each car placed the other along
    its own lane by arc length scaled by the lanes' lengths (``lane_change_place: scale``, the
    rule before), 2 m off on the straight before this bend, and took the other as standing: at
    one of these distances they met (Town07, stop 51). Placed at its nearest point there, and
    closing in at both speeds (``project``), they never do."""
    aheads = range(20, 80, 5)
    assert sum(_contacts_after_a_car_appears("scale", a) for a in aheads) > 0
    assert sum(_contacts_after_a_car_appears("project", a) for a in aheads) == 0
