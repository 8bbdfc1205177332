"""traffic.junction_release, traffic.overtake and traffic.max_green: their old values
('connector', 'never', None: the study's) still give the traffic from before the settings
existed (the same decisions everywhere: positions equal to float rounding, lights equal); the new
junction rule ('crossing') lets a vehicle waiting at a junction go
once the one crossing its way is past the crossing point, with no contact."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from drivemind.maps import load_town
from drivemind.sim import SimConfig, density_config
from drivemind.sim import kernels as K
from drivemind.sim.config import TrafficParams
from drivemind.sim.world import PATH_LEN, LiteWorld

# Recorded with the code of main at 7336726 (before the setting existed) by the recipe of
# _record() below: every 40th step of 1200, the ego parked at spawn point 0 braking. It was
# recorded on an Intel Xeon with AVX-512; on another instruction set (an AMD EPYC with AVX2 gave
# differences up to 9e-14 m) numpy's and numba's float rounding differs in the last bits, so
# positions are compared to ATOL: one decision taken otherwise (a stop, a yield, a lane) moves a
# vehicle by centimetres at least within the 40 steps to the next snapshot.
ATOL = 1e-6  # m
BEFORE = Path(__file__).parent / "data" / "traffic_before_junction_release.npz"
CASES = [("Town02", "dense", 1), ("grid", "drivevlm", 2), ("Town03", "dense", 3)]
STEPS, EVERY = 1200, 40
# the settings added since then, at the values that give the behaviour from before
# (sim.config.STUDY_TRAFFIC; test_the_old_values_are_the_study_s checks they are the same)
OLD = dict(junction_release="connector", overtake="never", max_green=None, walker_velocity="crossing",
           walker_anticipate=0.0, ego_turn=None,
           ego_behind="brake", lane_change_corridor="lane", junction_conflict="centre",
           diverging_follow="lane", junction_exit="lane", wait_cycle_break="first",
           lane_change_place="scale", detector_reach="lane",
           junction_chain="none", lane_change_follower="lane", merge_yield="none",
           overtake_solid="never", speed_limits="uniform")


def _record(town, density, seed, **traffic):
    cfg = density_config(density)
    w = LiteWorld(load_town(town), replace(cfg, traffic=replace(cfg.traffic, **traffic)))
    w.reset(seed=seed, ego_pose=0)
    veh, walk, light = [], [], []
    for t in range(STEPS):
        w.step((0.0, -1.0))
        if t % EVERY == EVERY - 1:
            veh.append(w.v_xy.copy())
            walk.append(w.w_xy.copy())
            light.append(w.light_state.copy())
    return np.array(veh), np.array(walk), np.array(light), w


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_old_values_reproduce_the_traffic_from_before_to_float_rounding():
    before = np.load(BEFORE)
    differs = False
    for town, density, seed in CASES:
        veh, walk, light, _ = _record(town, density, seed, **OLD)
        key = f"{town}_{density}"
        assert veh.shape == before[f"{key}_veh"].shape, f"{key}: another number of vehicles"
        assert np.allclose(veh, before[f"{key}_veh"], rtol=0, atol=ATOL), f"{key}: vehicles moved otherwise"
        assert walk.shape == before[f"{key}_walk"].shape, f"{key}: another number of walkers"
        assert np.allclose(walk, before[f"{key}_walk"], rtol=0, atol=ATOL), f"{key}: walkers moved otherwise"
        assert np.array_equal(light, before[f"{key}_light"]), f"{key}: lights changed otherwise"
        new, _, _, w = _record(town, density, seed)  # the defaults: 'crossing', 'oncoming'
        assert w.cfg.traffic.junction_release == "crossing" and w.cfg.traffic.overtake == "oncoming"
        assert w.cfg.traffic.max_green == 30.0
        differs |= new.shape != veh.shape or not np.allclose(new, veh, rtol=0, atol=ATOL)
    assert differs  # the setting changes the traffic (so the comparison above means something)


def test_the_old_values_are_the_study_s():
    from drivemind.sim.config import STUDY_TRAFFIC

    assert OLD == STUDY_TRAFFIC


def _crossing_pair(world):
    """Two straight ways through one junction of the grid town that cross each other half-way,
    each a single junction lane: (incoming lane a, way a, incoming lane c, way c)."""
    rm, succ, jn = world.map, world.succ, world.map.junction

    def straight(lane):
        y = np.unwrap(rm.yaw[rm.offset[lane]:rm.offset[lane + 1]])
        return abs(y[-1] - y[0]) < 0.1

    ways = [(int(i), int(c)) for i in np.flatnonzero(jn < 0) for c in succ[i][succ[i] >= 0]
            if jn[c] >= 0 and straight(c) and all(jn[e] < 0 for e in succ[c][succ[c] >= 0])]
    for ia, a in ways:
        for ic, c in ways:
            if (world.conflict[a, c] == 1 and jn[a] == jn[c]
                    and 2.0 < world.clear[a, c] < rm.length[a] - 4.0):
                return ia, a, ic, c
    raise AssertionError("no crossing pair found")


def _crossing_world(release):
    """Car 0 has just entered way a at 6 m/s; car 1 stands at the stop line of way c, which a
    crosses half-way. No lights, the ego far away."""
    cfg = SimConfig(vehicles=2, traffic=TrafficParams(signals="none", stuck_respawn=None,
                                                      junction_release=release))
    world = LiteWorld(load_town("grid"), cfg)
    world.reset(seed=0, ego_pose=(1e5, 1e5, 0.0))
    if release == "connector":  # the same pair for both rules
        world.clear = LiteWorld(load_town("grid"), replace(
            cfg, traffic=replace(cfg.traffic, junction_release="crossing"))).clear
    ia, a, ic, c = _crossing_pair(world)
    assert len(world.v_lane) == 2
    world.v_cls[:], world.v_hl[:], world.v_hw[:] = 0, 2.3, 0.95
    world.v_vcap[:], world.v_amax[:], world.v_b[:], world.v_vfac[:] = 30.0, 2.0, 3.0, 1.0
    for i, (lane, s, v, first) in enumerate(((a, 0.5, 6.0, a), (ic, world.map.length[ic] - 3.0, 0.0,
                                                                 ic))):
        world.v_lane[i], world.v_s[i], world.v_v[i] = lane, s, v
        path = [first] if first == a else [ic, c]
        while len(path) < PATH_LEN:
            nxt = world.succ[path[-1]]
            path.append(int(nxt[nxt >= 0][0]))
        world.v_path[i] = path
        world.v_lat[i], world.v_lcfrom[i] = 0.0, -1
    world.v_grant[:] = (a, -1)
    world.v_entered[:] = (True, False)
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    return world, ia, a, ic, c


@pytest.mark.parametrize("release", ["crossing", "connector"])
def test_a_vehicle_past_the_crossing_point_no_longer_holds_the_crossing_way(release):
    world, _, a, ic, c = _crossing_world(release)
    granted_at, first_on_a = None, None
    for step in range(300):  # 30 s
        world.step((0.0, 0.0))
        if granted_at is None and world.v_grant[1] == c:
            granted_at, first_on_a = world.time, world.v_lane[0] == a
            # car 0's rear is past every point of a near way c
            assert world.v_lane[0] != a or world.v_s[0] - world.v_hl[0] > world.clear[a, c]
    assert granted_at is not None
    assert world.v_lane[1] != ic  # car 1 went on
    assert world.npc_collision_total == 0
    # 'crossing' grants while car 0 is still on its way through (past the crossing point);
    # 'connector' only once car 0 has driven off it
    assert first_on_a == (release == "crossing")


def test_crossing_release_lets_the_waiting_vehicle_go_earlier():
    times = {}
    for release in ("crossing", "connector"):
        world, _, a, _, c = _crossing_world(release)
        for _ in range(300):
            world.step((0.0, 0.0))
            if world.v_grant[1] == c:
                times[release] = world.time
                break
    assert times["crossing"] < times["connector"] - 0.3


def test_unknown_junction_release_lists_the_valid_ones():
    with pytest.raises(ValueError, match="junction_release must be one of crossing, connector"):
        SimConfig(traffic=TrafficParams(junction_release="whole"))
    with pytest.raises(ValueError, match="release_margin"):
        SimConfig(traffic=TrafficParams(release_margin=-1.0))
