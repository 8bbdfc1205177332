"""Walkers that roam the pavements between crossing sites (sim/tables.py pavement_network,
sim/kernels.py walkers_step, LiteWorld._next_walk) on a real shipped CARLA town."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from drivemind.maps import load_town
from drivemind.sim import LiteWorld, density_config
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
