"""Walkers that roam the pavements between crossing sites (sim/tables.py pavement_network,
sim/kernels.py walkers_step, LiteWorld._next_walk) on a real shipped CARLA town."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from drivemind.maps import load_town
from drivemind.sim import LiteWorld, SimConfig, density_config
from drivemind.sim.tables import PAVE_CLEAR, _clearance, _segment_clear, pavements, traffic_tables

OFF_MAP = (-1000.0, -1000.0, 0.0)


@pytest.fixture(scope="module")
def town02():
    return load_town("Town02")


def test_pavement_network_stays_off_the_lanes(town02):
    sites = traffic_tables(town02, density_config("drivevlm").traffic)["sites"]
    pv = pavements(town02, sites)
    assert len(pv.xy) == 2 * len(sites) and len(pv.points) > 100
    assert _clearance(town02, pv.points).min() >= PAVE_CLEAR
    n_legs = 0
    for n, legs in enumerate(pv.legs):
        for to, path, length in legs:
            n_legs += 1
            assert to != n and np.allclose(path[-1], pv.xy[to])
            full = np.vstack([pv.xy[n], path])
            assert _segment_clear(town02, full[:-1], full[1:]).all(), f"leg {n}->{to} crosses a lane"
            assert length == pytest.approx(np.hypot(*np.diff(full, axis=0).T).sum())
    # most kerb ends lead somewhere on foot (Town02: every one)
    assert n_legs > len(pv.xy) and sum(bool(legs) for legs in pv.legs) >= 0.9 * len(pv.xy)


def _walk(rm, seed, steps=2000, **over):
    cfg = density_config("empty", walkers=8)
    if over:
        cfg = dataclasses.replace(cfg, traffic=dataclasses.replace(cfg.traffic, **over))
    world = LiteWorld(rm, cfg)
    world.reset(seed, ego_pose=OFF_MAP)
    xy, state, crossed = [], [], [set() for _ in range(len(world.w_xy))]
    for _ in range(steps):
        world.step((0.0, -1.0))
        xy.append(world.w_xy.copy())
        state.append(world.w_state.copy())
        for w in np.flatnonzero(world.w_state == 1):
            crossed[w].add(int(world.w_anode[w]) // 2)  # the site it is crossing
    return np.array(xy), np.array(state), crossed


def test_walkers_roam_from_site_to_site_off_the_lanes(town02):
    xy, state, crossed = _walk(town02, seed=1)
    # every walker crosses at more than one site within 200 s, and walks the pavement in between
    assert all(len(c) >= 2 for c in crossed), [len(c) for c in crossed]
    assert (state == 2).mean() > 0.2
    # off the driving lanes except while crossing
    off = xy[state != 1]
    assert _clearance(town02, off).min() >= PAVE_CLEAR - 1e-6
    # deterministic for a seed, and another seed gives another walk
    xy2, state2, _ = _walk(town02, seed=1)
    assert np.array_equal(xy, xy2) and np.array_equal(state, state2)
    xy3, _, _ = _walk(town02, seed=2, steps=200)
    assert not np.array_equal(xy[:200], xy3)


def test_walkers_without_roaming_keep_to_one_site(town02):
    _, state, crossed = _walk(town02, seed=1, walker_roam=False)
    assert (state == 2).sum() == 0
    assert all(len(c) <= 1 for c in crossed) and any(len(c) == 1 for c in crossed)


def _velocity_walk(rm, mode, steps=600):
    cfg = density_config("empty", walkers=8)
    world = LiteWorld(rm, dataclasses.replace(cfg, traffic=dataclasses.replace(cfg.traffic, walker_velocity=mode)))
    world.reset(3, ego_pose=OFF_MAP)
    nv, out = len(world.v_xy), []
    for _ in range(steps):
        before = world.w_xy.copy()
        snap = world.step((0.0, -1.0))
        out.append((before, world.w_xy.copy(), world.w_state.copy(), snap.actors.velocity[nv:].copy()))
    return world, out


def test_walker_velocity_is_the_last_step_s_displacement_and_the_old_report_stays_available(town02):
    """traffic.walker_velocity: ``moved`` (default) reports a walker's displacement over the last
    step / dt, so a walker on the pavement moves at its pace and one waiting reports 0; ``crossing``
    (the study's pin) reports its walking speed while it is in a crossing and 0 otherwise, as
    before. The world's positions do not depend on it."""
    moved_world, moved = _velocity_walk(town02, "moved")
    old_world, old = _velocity_walk(town02, "crossing")
    assert moved_world.cfg.traffic.walker_velocity == "moved"  # the default
    speed = moved_world.w_speed
    seen = {0: 0, 1: 0, 2: 0}
    for (b, a, st, vel), (b2, a2, st2, vel2) in zip(moved, old):
        assert np.array_equal(a, a2) and np.array_equal(st, st2)  # same world
        assert np.array_equal(vel, (a - b) / 0.1)
        sp, sp_old = np.hypot(*vel.T), np.hypot(*vel2.T)
        assert np.allclose(sp_old, np.where(st2 == 1, speed, 0.0))
        for s in seen:
            seen[s] += int((st == s).sum())
        waiting = (st == 0) & np.all(a == b, axis=1)
        assert np.all(sp[waiting] == 0.0)
        walking = (st == 2) & (sp > 0)
        assert np.all(sp[walking] <= speed[walking] + 1e-9)
    assert min(seen.values()) > 50  # every state was met
    # on the pavement a walker moves at its pace, where the old report says 0
    pave = np.concatenate([np.hypot(*m[3][m[2] == 2].T) for m in moved])
    pave_old = np.concatenate([np.hypot(*m[3][m[2] == 2].T) for m in old])
    assert np.median(pave) >= 0.8 * speed.min() and np.all(pave_old == 0.0)


def test_a_walker_standing_for_a_car_reports_0_with_moved(town02):
    """A walker in the middle of its crossing with the ego's box 1 m ahead stands still: ``moved``
    reports 0, ``crossing`` (the old report) its walking speed."""
    for mode in ("moved", "crossing"):
        cfg = SimConfig(walkers=1, offroad_margin=None,
                        traffic=dataclasses.replace(SimConfig().traffic, walker_velocity=mode))
        world = LiteWorld(town02, cfg)
        snap = world.reset(0, ego_pose=0)
        e = snap.ego
        n = np.array([-np.sin(e.yaw), np.cos(e.yaw)])  # the ego's left
        ego = np.array([e.x, e.y])
        world.w_xy[0] = ego + 2.3 * n
        world.w_a[0], world.w_b[0] = ego + 4.3 * n, ego - 5.0 * n  # crossing through the ego
        world.w_state[0], world.w_timer[0] = 1, 0.0
        for _ in range(15):  # under WALKER_GIVE_UP: it neither goes on nor turns back yet
            snap = world.step((0.0, -1.0))
            assert world.w_state[0] == 1 and np.allclose(world.w_xy[0], ego + 2.3 * n)
        v = float(np.hypot(*snap.actors.velocity[len(world.v_xy)]))
        assert v == (0.0 if mode == "moved" else pytest.approx(world.w_speed[0]))
    with pytest.raises(ValueError, match="walker_velocity must be one of moved, crossing"):
        SimConfig(traffic=dataclasses.replace(SimConfig().traffic, walker_velocity="measured"))


def _walker_stepping_out(back: float) -> int:
    """Grid town: a walker sets off across a two-lane street at a mid-block site; a motorcycle at
    31 km/h comes along the lane a quarter of the way across, ``back`` m before the crossing.
    Returns the contacts between them in 10 s."""
    import math

    from drivemind.sim import kernels as K
    from drivemind.sim.config import TrafficParams

    rm = load_town("grid")
    cfg = SimConfig(vehicles=0, motorcycles=1, walkers=1, offroad_margin=None,
                    traffic=TrafficParams(signals="none", stuck_respawn=None, walker_midblock=1.0))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=(1e4, 1e4, 0.0))
    a, b = world.sites[int(np.flatnonzero(~world.site_at_junction)[0])]
    m = a + 0.25 * (b - a)
    p = int(np.argmin(np.hypot(rm.pts[:, 0] - m[0], rm.pts[:, 1] - m[1])))
    lane = int(rm.point_lane[p])
    world.v_lane[0], world.v_s[0], world.v_v[0], world.v_vfac[0] = lane, float(rm.s[p]) - back, 8.6, 1.3
    world.v_path[0] = -1
    world.v_path[0, 0] = lane
    world._fill_path(0)
    t = (b - a) / np.hypot(*(b - a))
    world.w_a[0], world.w_b[0], world.w_xy[0] = a, b, a + 0.3 * t
    world.w_yaw[0], world.w_state[0], world.w_timer[0], world.w_speed[0] = math.atan2(t[1], t[0]), 1, 0.0, 1.4
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    for _ in range(100):
        world.step((0.0, -1.0))
    return world.npc_collision_total


def test_traffic_keeps_clear_of_where_a_crossing_walker_is_going():
    """Seen only where it was, a walker stepping into the lane from the side entered the
    motorcycle's corridor too late for it to stop (Town05 drivevlm seed 1: one contact in 1800 s;
    here at 10 m). Vehicles now keep clear of where it will be 1.5 s on: no contact at any
    distance."""
    assert [back for back in range(4, 40) if _walker_stepping_out(float(back))] == []


def test_bad_walker_anticipate_says_what_is_wrong():
    for bad in (-1.0, float("nan"), "soon", True):
        with pytest.raises(ValueError, match="walker_anticipate must be a non-negative number"):
            SimConfig(traffic=dataclasses.replace(SimConfig().traffic, walker_anticipate=bad))
    assert SimConfig(traffic=dataclasses.replace(SimConfig().traffic, walker_anticipate=0)).traffic.walker_anticipate == 0


def test_a_walker_standing_in_the_road_is_seen_where_it_is_not_where_it_was_going():
    """Grid town, a mid-block crossing: a walker stands half-way across (it has stood 1 s for a
    bicycle beside it in the lane it was stepping into, which stands too); a second bicycle that
    wants to stand is in the lane behind it. The walker is going nowhere, so the first bicycle
    keeps clear of where it is, not of where it would be 1.5 s on at its pace: it rides on (before,
    it waited for that place, the walker for it; on the built-in avenue at `drivevlm` the queue
    behind stood a minute, twice, until respawned). No contact."""
    import math

    from drivemind.sim import kernels as K
    from drivemind.sim.config import TrafficParams

    rm = load_town("grid")
    cfg = SimConfig(vehicles=0, bicycles=2, walkers=1, offroad_margin=None,
                    traffic=TrafficParams(signals="none", stuck_respawn=None, walker_midblock=1.0))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=(1e4, 1e4, 0.0))
    assert len(world.v_lane) == 2
    a, b = world.sites[int(np.flatnonzero(~world.site_at_junction)[0])]
    t = (b - a) / np.hypot(*(b - a))

    def lane_at(frac):
        m = a + frac * (b - a)
        p = int(np.argmin(np.hypot(rm.pts[:, 0] - m[0], rm.pts[:, 1] - m[1])))
        return int(rm.point_lane[p]), float(rm.s[p])

    for i, (frac, ahead, vfac) in enumerate(((0.75, 0.4, 1.0), (0.25, -0.4, 0.0))):
        lane, s = lane_at(frac)
        world.v_lane[i], world.v_s[i], world.v_v[i], world.v_vfac[i] = lane, s + ahead, 0.0, vfac
        world.v_path[i] = -1
        world.v_path[i, 0] = lane
        world._fill_path(i)
    world.w_a[0], world.w_b[0], world.w_xy[0] = a, b, a + 0.5 * (b - a)
    world.w_yaw[0], world.w_state[0], world.w_speed[0] = math.atan2(t[1], t[0]), 1, 1.4
    world.w_timer[0] = 1.0  # it has stood 1 s
    K.poses(*world._m, world.v_lane, world.v_s, world.v_xy, world.v_yaw)
    s0 = float(world.v_s[0])
    blockers = []
    for _ in range(20):  # 2 s
        world.step((0.0, -1.0))
        blockers.append(int(world.v_blocker[0]))
        if world.w_timer[0] == 0.0:
            break  # the bicycle is by: the walker goes on
    assert K.BLOCKED_OTHER not in blockers and world.v_s[0] - s0 > 0.5
    assert world.w_state[0] == 1 and world.npc_collision_total == 0
