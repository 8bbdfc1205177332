"""The BEV corridor readout (``obs.corridor=true``, issue 14): gap, speed and light of what lies on
the route ahead, read from the BEV's pixels and the observation's waypoints only."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import drivemind  # noqa: F401
from drivemind.bev import BevConfig
from drivemind.bev.corridor import CorridorReadout

CPU = BevConfig.from_dict({"preset": "cpu"})


def _blank():
    return np.zeros(CPU.shape, np.uint8)


def _fill(bev, plane, fwd_lo, fwd_hi, right_lo, right_hi, value=255):
    """Set the pixels of a box given in ego-frame metres (forward, right) in one plane."""
    ppm, size, row0 = CPU.pixels_per_meter, CPU.size, CPU.size - CPU.ego_from_bottom
    r0, r1 = int(np.floor(row0 - fwd_hi * ppm)), int(np.ceil(row0 - fwd_lo * ppm))
    c0, c1 = int(np.floor(size / 2 + right_lo * ppm)), int(np.ceil(size / 2 + right_hi * ppm))
    bev[plane, max(r0, 0):r1, max(c0, 0):c1] = value


def test_a_car_ahead_on_a_straight_path_gives_its_gap_and_speed():
    rd = CorridorReadout(CPU, ego_half_length=2.4)
    wp = np.stack([np.arange(1, 11) * 5.0, np.zeros(10)], 1)
    bev = _blank()
    rng = rd.range - rd.ego_half_length
    out = rd.read(bev, wp)
    assert out[rd.names.index("vehicle_present")] == 0 and out[rd.names.index("vehicle_gap")] == 1.0
    _fill(bev, rd.vehicle_now, 14.0, 18.5, -1.0, 1.0)  # rear bumper 14 m ahead of the reference
    _fill(bev, rd.vehicle_prev, 12.0, 16.5, -1.0, 1.0)  # 2 m further back 0.5 s earlier: 4 m/s
    out = rd.read(bev, wp)
    gap = out[rd.names.index("vehicle_gap")] * rng
    assert out[rd.names.index("vehicle_present")] == 1.0
    assert abs(gap - (14.0 - 2.4)) <= 0.6
    assert abs(out[rd.names.index("vehicle_speed")] * 10.0 - 4.0) <= 1.1
    assert out[rd.names.index("vehicle_lane_2")] > 0  # 13.7-19.0 m: the car's bin


def test_a_car_in_the_next_lane_is_not_in_the_path_but_in_the_wide_band():
    rd = CorridorReadout(CPU)
    wp = np.stack([np.arange(1, 11) * 5.0, np.zeros(10)], 1)
    bev = _blank()
    _fill(bev, rd.vehicle_now, 10.0, 14.5, 2.5, 4.0)  # beside the path, 2.5-4 m to the right
    out = rd.read(bev, wp)
    assert out[rd.names.index("vehicle_present")] == 0
    assert sum(out[rd.names.index(f"vehicle_wide_{i}")] for i in range(rd.bins)) > 0


def test_the_path_follows_the_waypoints_round_a_bend():
    rd = CorridorReadout(CPU)
    # a right turn: 6 m straight, then along the right
    wp = np.array([[5.0, 0.0], [8.0, 3.0], [8.5, 8.0], [8.5, 13.0], [8.5, 18.0]])
    bev = _blank()
    _fill(bev, rd.vehicle_now, 7.5, 9.5, 12.0, 14.0)  # on the path after the bend (12-14 m to the right)
    out = rd.read(bev, wp)
    assert out[rd.names.index("vehicle_present")] == 1.0
    # straight on, the same car is off the path
    out = rd.read(bev, np.stack([np.arange(1, 11) * 5.0, np.zeros(10)], 1))
    assert out[rd.names.index("vehicle_present")] == 0


def test_the_path_is_resampled_every_step_along_the_polyline_and_extended_to_the_view_edge():
    rd = CorridorReadout(CPU)
    # an L: 6 m ahead, then 4 m to the right; repeated points are dropped
    wp = np.array([[3.0, 0.0], [6.0, 0.0], [6.0, 0.0], [6.0, 2.0], [6.0, 4.0]])
    p, n = rd.path(wp)
    assert p.shape == n.shape == (len(rd.s), 2)
    on_leg1 = rd.s <= 6.0
    assert np.allclose(p[on_leg1], np.stack([rd.s[on_leg1], np.zeros(on_leg1.sum())], 1))
    on_leg2 = (rd.s > 6.0) & (rd.s <= 10.0)
    assert np.allclose(p[on_leg2], np.stack([np.full(on_leg2.sum(), 6.0), rd.s[on_leg2] - 6.0], 1))
    beyond = rd.s > 10.0  # past the last waypoint: on along the last leg, to the view's edge
    assert beyond.any() and np.allclose(p[beyond, 0], 6.0) and np.allclose(p[beyond, 1], rd.s[beyond] - 6.0)
    assert np.allclose(np.hypot(n[:, 0], n[:, 1]), 1.0)
    assert np.allclose(n[on_leg1 & (rd.s < 5.0)], [0.0, 1.0])  # right of "ahead" is +right
    assert np.allclose(n[beyond], [-1.0, 0.0])  # right of "to the right" is backwards
    # no route ahead (no waypoints, or all at the ego): straight on
    for wp in (np.zeros((0, 2)), np.zeros((10, 2))):
        p, n = rd.path(wp)
        assert np.allclose(p[:, 1], 0.0) and np.allclose(p[:, 0], rd.s) and np.allclose(n, [0.0, 1.0])


@pytest.mark.parametrize("value,which", [(255, "light_red"), (170, "light_yellow"), (80, "light_green")])
def test_the_stop_line_on_the_path_gives_the_light_state(value, which):
    rd = CorridorReadout(CPU)
    bev = _blank()
    _fill(bev, rd.light_now, 9.8, 10.4, -3.0, 3.0, value)
    out = rd.read(bev, np.stack([np.arange(1, 11) * 5.0, np.zeros(10)], 1))
    states = {k: out[rd.names.index(k)] for k in ("light_red", "light_yellow", "light_green")}
    assert states.pop(which) == 1.0 and not any(states.values())
    assert abs(out[rd.names.index("light_gap")] * (rd.range - rd.ego_half_length) - (9.8 - 2.4)) <= 0.6


def test_a_stop_line_under_the_bonnet_still_counts():
    """The env's light fact keeps a light until the ego's centre crosses its stop line; so does
    the readout (a red light the front has passed must not read as a free road)."""
    rd = CorridorReadout(CPU, ego_half_length=2.4)
    bev = _blank()
    _fill(bev, rd.light_now, 1.0, 1.4, -3.0, 3.0, 255)
    out = rd.read(bev, np.stack([np.arange(1, 11) * 5.0, np.zeros(10)], 1))
    assert out[rd.names.index("light_red")] == 1.0 and out[rd.names.index("light_gap")] < 0


def test_a_bev_without_the_actor_channels_is_refused_with_the_fix():
    cfg = BevConfig.from_dict({"preset": "cpu", "channels": ["road", "route", "lane"]})
    with pytest.raises(ValueError, match="obs.corridor=false"):
        CorridorReadout(cfg)


def test_in_the_env_the_readout_agrees_with_the_simulators_lead_and_light():
    """Driving the expert through dense Town02 traffic: where the simulator's ground truth has a
    lead actor within the view, the pixel readout finds it, to about a metre."""
    env = gym.make("DriveMind-v0", town="Town02", density="dense", bev="cpu", corridor=True)
    obs, _ = env.reset(seed=5)
    rd = env.unwrapped.corridor
    rng = rd.range - rd.ego_half_length
    assert env.observation_space["bev_corridor"].shape == (rd.dim,)
    rows = []
    for _ in range(1200):
        obs, _, term, trunc, info = env.step(env.unwrapped.expert_action())
        assert env.observation_space.contains(obs)
        c = obs["bev_corridor"]
        rows.append((info["lead_distance"], c[0] * rng, c[1], info["light_state"], info["light_distance"],
                     c[5] * rng, c[6]))
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    a = np.array(rows)
    near = a[:, 0] < 20
    assert near.sum() > 50, "the drive met too few lead cars to check anything"
    assert a[near, 2].mean() > 0.85
    both = near & (a[:, 2] > 0)
    assert np.median(np.abs(a[both, 0] - a[both, 1])) < 1.0
    red = (a[:, 3] == 2) & (a[:, 4] < 20)
    assert red.sum() > 20, "the drive met too few red lights to check them"
    assert a[red, 6].mean() > 0.9
