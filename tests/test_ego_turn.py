"""traffic.ego_turn: an ego standing at a junction's stop line gets its turn (docs/simulator.md,
"Junction right of way"). The ego is parked braking at a stop line of the built-in grid town
(no lights) while 40 vehicles drive; we count the reservations granted for ways crossing its
possible turns."""

from dataclasses import replace

import numpy as np
import pytest

from straight_roads import side_by_side

from drivemind.maps import load_town
from drivemind.sim import LiteWorld, SimConfig, density_config
from drivemind.sim import kernels as K
from drivemind.sim.kernels import EGO_TURN_HOLD


def _ego_at_a_stop_line(ego_turn, seed=0):
    cfg = density_config("dense")
    cfg = replace(cfg, traffic=replace(cfg.traffic, signals="none", stuck_respawn=None,
                                       ego_turn=ego_turn))
    rm = load_town("grid")
    world = LiteWorld(rm, cfg)
    lane = next(i for i in range(len(rm.length)) if world._into_junction[i])
    s = float(rm.length[lane]) - cfg.ego.length / 2 - 1.5
    world.reset(seed=seed, ego_pose=rm.pose_at(lane, s))
    turns = [int(c) for c in world.succ[lane] if c >= 0 and rm.junction[c] >= 0]
    crossing = [c for c in range(len(rm.length))
                if rm.junction[c] >= 0 and any(world.conflict[c, t] or c == t for t in turns)]
    return world, set(crossing)


def _grants(world, crossing, seconds):
    """(time, vehicle) of every reservation granted for a way in ``crossing``."""
    out, before = [], world.v_grant.copy()
    for _ in range(int(round(seconds / world.cfg.dt))):
        world.step((0.0, -1.0))
        new = (world.v_grant != before) & (world.v_grant >= 0)
        out += [(round(world.time, 1), int(i)) for i in np.flatnonzero(new)
                if int(world.v_grant[i]) in crossing]
        before = world.v_grant.copy()
    return out


def test_the_traffic_gives_a_standing_ego_its_turn_and_then_goes_on():
    world, crossing = _ego_at_a_stop_line(15.0)
    grants = _grants(world, crossing, 15.0 + EGO_TURN_HOLD + 30.0)
    assert world._ego_lane >= 0 and world.ego["v"] < 0.1
    assert any(t < 15.0 for t, _ in grants)  # a busy junction: ways crossing ours are granted
    # its turn: nothing crossing its way is granted for EGO_TURN_HOLD s ...
    assert not [g for g in grants if 15.05 < g[0] < 15.0 + EGO_TURN_HOLD - 0.05]
    # ... and then the traffic goes on although the ego still stands (it holds it once)
    assert any(t > 15.0 + EGO_TURN_HOLD for t, _ in grants)
    assert world.npc_collision_total == 0


def test_without_ego_turn_the_traffic_never_holds_for_the_ego():
    world, crossing = _ego_at_a_stop_line(None)
    grants = _grants(world, crossing, 15.0 + EGO_TURN_HOLD)
    assert [g for g in grants if 15.05 < g[0]]  # the rule before: the ways stay granted


@pytest.mark.parametrize("bad", [0, -3.0, float("nan"), True, "15"])
def test_bad_ego_turn_says_what_is_wrong(bad):
    with pytest.raises(ValueError, match="ego_turn must be a positive number of seconds or None"):
        SimConfig(traffic=replace(SimConfig().traffic, ego_turn=bad))


@pytest.mark.parametrize("ego_behind", ["ignore", "brake"])
def test_a_vehicle_drives_away_from_an_ego_reaching_in_from_behind_its_centre(ego_behind):
    """The ego stands angled towards the next lane, reaching into it, its centre 2 m behind a car
    there (a merge lane joining: esmini's soderleden, where the expert waited for the car and the
    car for the expert until the car was respawned 60 s later). ``ignore`` (the default): the car
    drives off; ``brake`` (the rule before): it stands for the ego."""
    rm = side_by_side("two_lanes", 300.0, [(0.0, 3.5), (-3.5, 3.5)])
    cfg = SimConfig(vehicles=1, walkers=0)
    cfg = replace(cfg, traffic=replace(cfg.traffic, ego_behind=ego_behind, stuck_respawn=None))
    world = LiteWorld(rm, cfg)
    world.reset(0, ego_pose=(20.0, 0.0, 0.0))
    lane = rm.key_index[(1, 0, -2)]
    world.v_lane[0], world.v_s[0], world.v_v[0] = lane, 100.0, 0.0
    world._fill_path(0)
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    world.place_ego((98.0, -1.0, -0.1))
    for _ in range(100):  # 10 s
        snap = world.step((0.0, -1.0))
        assert not snap.collisions and world.npc_collision_total == 0
    moved = world.v_s[0] - 100.0
    if ego_behind == "ignore":
        assert moved > 20.0
    else:
        assert moved < 1.0 and world.v_blocker[0] == K.BLOCKED_EGO


@pytest.mark.parametrize("corridor", ["body", "lane"])
def test_a_vehicle_changing_lanes_keeps_clear_of_an_ego_where_its_body_still_is(corridor):
    """A car has just changed from the left lane (y 0) to the right one (y -3.5): it is still 3 m
    left of its new lane's centre, drifting over. The ego stands 6 m ahead between the lanes
    (centre y -0.8). esmini's ``example`` at ``drivevlm``: a motorcycle ran into the standing
    expert so. ``body`` (the default): the car keeps clear of the ego over the width its body
    sweeps, stops behind it, and drives past once it is over in its lane; ``lane`` (the rule
    before): it looks along its new lane's centre line at its own half width only, misses the
    ego and runs into it."""
    rm = side_by_side("two_lanes", 300.0, [(0.0, 3.5), (-3.5, 3.5)])
    cfg = SimConfig(vehicles=1, walkers=0)
    cfg = replace(cfg, traffic=replace(cfg.traffic, lane_change_corridor=corridor,
                                       stuck_respawn=None, overtake="never"))
    world = LiteWorld(rm, cfg)
    world.reset(0, ego_pose=(20.0, 0.0, 0.0))
    world.v_lane[0], world.v_s[0], world.v_v[0] = rm.key_index[(1, 0, -2)], 100.0, 7.0
    world.v_lcfrom[0], world.v_lat[0] = rm.key_index[(1, 0, -1)], 3.0
    world._fill_path(0)
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    ego_x = 100.0 + 6.0 + cfg.ego.length / 2
    world.place_ego((ego_x, -0.8, 0.0))
    hits, stood = 0, False
    for _ in range(150):  # 15 s
        hits += len(world.step((0.0, -1.0)).collisions)
        stood |= bool(world.v_v[0] < 0.3 and world.v_blocker[0] == K.BLOCKED_EGO)
    assert world.npc_collision_total == 0
    if corridor == "body":
        assert hits == 0 and stood
        assert world.v_s[0] > ego_x + 10.0 and world.v_lat[0] == 0.0  # past, once in its lane
    else:
        assert hits > 0 and not stood


def test_bad_lane_change_corridor_lists_the_valid_ones():
    with pytest.raises(ValueError, match="lane_change_corridor must be one of body, lane; got 'wide'"):
        SimConfig(traffic=replace(SimConfig().traffic, lane_change_corridor="wide"))
