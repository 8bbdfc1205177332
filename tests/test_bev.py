"""The BEV renderer: geometry (known actors land on the expected pixels, rotation), channels,
values and dtypes, history, traffic lights, static layers against the map, presets and bad configs.

Snapshots are built by hand so every expected pixel follows from the view's definition: the ego
sits at column size/2 and row size - ego_from_bottom, faces up, its right-hand side to the right,
``pixels_per_meter`` pixels per metre.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from drivemind.bev import ALL_CHANNELS, BEV_PRESETS, BevConfig, BevRenderer
from drivemind.maps import load_town
from drivemind.maps.spatial import nearest_lane_point
from drivemind.sim.snapshot import (ActorClass, Actors, EgoState, LightState, TrafficLights,
                                    WorldSnapshot)


@pytest.fixture(scope="module")
def grid():
    return load_town("grid")


def ego_state(x, y, yaw, speed=0.0):
    return EgoState(x, y, yaw, speed, 0.0, 0.0, 0.0, 0.0, 0.0, (2.4, 1.05))


def snapshot(ego, actors=(), lights=None, frame=0):
    """actors: (cls, x, y, yaw, half_length, half_width)"""
    n = len(actors)
    a = Actors(np.arange(1, n + 1, dtype=np.int64),
               np.array([int(r[0]) for r in actors], np.int8),
               np.array([[r[1], r[2]] for r in actors], float).reshape(n, 2),
               np.array([r[3] for r in actors], float),
               np.array([[r[4], r[5]] for r in actors], float).reshape(n, 2), np.zeros((n, 2)))
    lights = lights or TrafficLights(np.zeros(0, np.int64), np.zeros((0, 2)), np.zeros(0),
                                     np.zeros(0, np.uint8), [])
    return WorldSnapshot(frame, frame * 0.1, 0.1, ego, a, lights)


def offset(ego, fwd, right):
    """World point ``fwd`` m ahead and ``right`` m to the right of the ego (CARLA's frame)."""
    c, s = math.cos(ego.yaw), math.sin(ego.yaw)
    return ego.x + fwd * c - right * s, ego.y + fwd * s + right * c


def blob(plane):
    rows, cols = np.nonzero(plane)
    assert len(rows), "nothing drawn"
    return rows.mean() + 0.5, cols.mean() + 0.5, rows.max() - rows.min() + 1, cols.max() - cols.min() + 1


def expected_px(cfg, fwd, right):
    return cfg.size - cfg.ego_from_bottom - fwd * cfg.pixels_per_meter, cfg.size / 2 + right * cfg.pixels_per_meter


# ---------------------------------------------------------------------------------------- geometry
@pytest.mark.parametrize("ego_yaw", [0.0, math.pi / 2, -2.3, math.pi])
@pytest.mark.parametrize("fwd,right", [(10.0, 0.0), (0.0, 6.0), (-4.0, -3.0), (25.0, 8.0)])
def test_vehicle_lands_on_expected_pixels(grid, ego_yaw, fwd, right):
    cfg = BevConfig()
    bev = BevRenderer(grid, cfg)
    ego = ego_state(10.0, 20.0, ego_yaw)
    x, y = offset(ego, fwd, right)
    masks = bev.step(snapshot(ego, [(ActorClass.CAR, x, y, ego_yaw, 2.0, 1.0)]))
    plane = masks[cfg.planes("vehicle")][-1]
    r, c, h, w = blob(plane)
    er, ec = expected_px(cfg, fwd, right)
    assert abs(r - er) < 0.6 and abs(c - ec) < 0.6
    # aligned with the ego: 4 m long (rows) x 2 m wide (columns)
    assert h == pytest.approx(4.0 * cfg.pixels_per_meter, abs=1)
    assert w == pytest.approx(2.0 * cfg.pixels_per_meter, abs=1)
    assert set(np.unique(plane)) == {0, 255}


def test_box_rotation(grid):
    cfg = BevConfig()
    bev = BevRenderer(grid, cfg)
    ego = ego_state(0.0, 0.0, 0.4)
    x, y = offset(ego, 12.0, 0.0)
    # crossing at right angles: the long side now runs across the image
    plane = bev.step(snapshot(ego, [(ActorClass.CAR, x, y, 0.4 + math.pi / 2, 2.0, 1.0)]))[3 + 3]
    _, _, h, w = blob(plane)
    assert (h, w) == (pytest.approx(10, abs=1), pytest.approx(20, abs=1))
    # at 45 degrees: a diamond-ish footprint, wider than the 2 m side and narrower than the diagonal
    plane = bev.step(snapshot(ego, [(ActorClass.CAR, x, y, 0.4 + math.pi / 4, 2.0, 1.0)]))[3 + 3]
    _, _, h, w = blob(plane)
    diag = math.hypot(4.0, 2.0) * 5
    assert 10 < h < diag + 1 and 10 < w < diag + 1
    assert np.count_nonzero(plane) == pytest.approx(4.0 * 2.0 * 25, rel=0.15)  # area is kept


def test_actor_outside_view_is_not_drawn(grid):
    cfg = BevConfig()
    bev = BevRenderer(grid, cfg)
    ego = ego_state(0.0, 0.0, 0.0)
    x, y = offset(ego, -20.0, 0.0)  # 20 m behind: beyond the 8 m the view shows behind the ego
    masks = bev.step(snapshot(ego, [(ActorClass.CAR, x, y, 0.0, 2.0, 1.0)]))
    assert not masks[cfg.planes("vehicle")].any()


def test_walkers_scaled_and_in_their_own_channel(grid):
    cfg = BevConfig()
    bev = BevRenderer(grid, cfg)
    ego = ego_state(0.0, 0.0, 1.0)
    x, y = offset(ego, 8.0, 2.0)
    masks = bev.step(snapshot(ego, [(ActorClass.WALKER, x, y, 0.3, 0.3, 0.3),
                                    (ActorClass.BICYCLE, *offset(ego, 8.0, -4.0), 1.0, 0.9, 0.35)]))
    walker = masks[cfg.planes("walker")][-1]
    r, c, h, w = blob(walker)
    er, ec = expected_px(cfg, 8.0, 2.0)
    assert abs(r - er) < 1 and abs(c - ec) < 1
    side = 2 * 0.3 * cfg.walker_scale * cfg.pixels_per_meter  # 6 px
    assert np.count_nonzero(walker) == pytest.approx(side * side, rel=0.35)
    vehicle = masks[cfg.planes("vehicle")][-1]
    assert np.count_nonzero(vehicle) > 0 and not np.any(vehicle & walker)  # bicycles are vehicles


def test_history_channels_show_past_positions(grid):
    cfg = BevConfig()
    bev = BevRenderer(grid, cfg)
    ego = ego_state(0.0, 0.0, 0.0)
    bev.reset()
    for t in range(20):  # a car moving 1 m per frame along the ego's heading, ego still
        masks = bev.step(snapshot(ego, [(ActorClass.CAR, 5.0 + t, 0.0, 0.0, 2.0, 1.0)], frame=t))
    planes = masks[cfg.planes("vehicle")]
    for k, h in enumerate(cfg.history):  # history offset h: the frame t = 19 + 1 + h
        r, _, _, _ = blob(planes[k])
        fwd = 5.0 + 20 + h
        assert r == pytest.approx(expected_px(cfg, fwd, 0)[0], abs=0.6)
    # right after a reset, missing history repeats the oldest frame (as Roach)
    bev.reset()
    masks = bev.step(snapshot(ego, [(ActorClass.CAR, 5.0, 0.0, 0.0, 2.0, 1.0)]))
    planes = masks[cfg.planes("vehicle")]
    assert all(np.array_equal(planes[0], planes[k]) for k in range(1, len(cfg.history)))


@pytest.mark.parametrize("state,value", [(LightState.GREEN, 80), (LightState.YELLOW, 170),
                                         (LightState.RED, 255), (LightState.OFF, 0)])
def test_traffic_light_values_on_stop_line(grid, state, value):
    cfg = BevConfig()
    bev = BevRenderer(grid, cfg)
    ego = ego_state(0.0, 0.0, 0.0)
    line = np.array([[[10.0, -1.5], [10.0, 1.5]]])  # 10 m ahead, across the lane
    lights = TrafficLights(np.array([0]), np.array([[10.0, 0.0]]), np.array([0.0]),
                           np.array([int(state)], np.uint8), [line])
    masks = bev.step(snapshot(ego, lights=lights))
    plane = masks[cfg.planes("light")][-1]
    if value == 0:
        assert not plane.any()
        return
    assert set(np.unique(plane)) == {0, value}
    r, c, h, w = blob(plane)
    assert r == pytest.approx(expected_px(cfg, 10.0, 0)[0], abs=0.6)
    assert w == pytest.approx(3.0 * 5 + cfg.stop_line_width * 5, abs=2)


def test_route_channel(grid):
    cfg = BevConfig()
    bev = BevRenderer(grid, cfg)
    ego = ego_state(3.0, 4.0, 0.7)
    route = np.array([offset(ego, d, 0.0) for d in np.arange(0.0, 30.0, 1.0)])
    plane = bev.step(snapshot(ego), route)[cfg.planes("route")][0]
    rows, cols = np.nonzero(plane)
    c0 = cfg.size / 2
    assert np.all(np.abs(cols + 0.5 - c0) <= cfg.route_width * 5 / 2 + 1)
    er_top = expected_px(cfg, 29.0, 0)[0]
    assert rows.min() == pytest.approx(er_top - cfg.route_width * 5 / 2, abs=1.5)


def test_static_layers_match_the_map(grid):
    cfg = BevConfig()
    bev = BevRenderer(grid, cfg)
    rng = np.random.default_rng(0)
    agree = total = 0
    for k in rng.choice(len(grid.spawn), 6, replace=False):
        x, y, yaw = grid.spawn[k]
        masks = bev.step(snapshot(ego_state(x, y, yaw)))
        road = masks[0]
        assert road[cfg.size - cfg.ego_from_bottom, cfg.size // 2] == 255  # the ego stands on road
        assert set(np.unique(masks[2])) <= {0, 120, 255}
        for r, c in rng.integers(0, cfg.size, size=(150, 2)):
            fwd = (cfg.size - cfg.ego_from_bottom - (r + 0.5)) / cfg.pixels_per_meter
            right = (c + 0.5 - cfg.size / 2) / cfg.pixels_per_meter
            px, py = offset(ego_state(x, y, yaw), fwd, right)
            hit = nearest_lane_point(grid, px, py, radius=8.0)
            on_road = False
            if hit is not None:
                lane, s, lat, d = hit
                a = grid.offset[lane]
                i = a + min(int(s / grid.ds[lane]), grid.offset[lane + 1] - a - 1)
                on_road = abs(lat) <= grid.width[i] / 2
            agree += (road[r, c] > 0) == on_road
            total += 1
    assert agree / total > 0.95


# ---------------------------------------------------------------------------------------- config
def test_presets_shapes_and_dtype(grid):
    assert BEV_PRESETS["roach"].shape == (15, 192, 192)
    assert BEV_PRESETS["paper"].shape == (15, 224, 224)
    assert BEV_PRESETS["cpu"].shape == (15, 96, 96)
    for name, cfg in BEV_PRESETS.items():
        assert cfg.extent_m == pytest.approx(38.4, abs=0.2), name
        bev = BevRenderer(grid, cfg)
        x, y, yaw = grid.spawn[0]
        m = bev.step(snapshot(ego_state(x, y, yaw), [(ActorClass.CAR, *offset(ego_state(x, y, yaw), 6, 0), yaw, 2, 1)]))
        assert m.shape == cfg.shape and m.dtype == np.uint8 and m.flags.c_contiguous
        rgb = bev.rgb()
        assert rgb.shape == (cfg.rgb_size, cfg.rgb_size, 3) and rgb.dtype == np.uint8


def test_channel_subset_and_names(grid):
    cfg = BevConfig(channels=("road", "vehicle", "ego"), history=(-5, -1))
    assert cfg.shape == (4, 192, 192)
    assert cfg.channel_names() == ["road", "vehicle_t-5", "vehicle_t0", "ego"]
    m = BevRenderer(grid, cfg).step(snapshot(ego_state(*grid.spawn[0])))
    assert m.shape == (4, 192, 192)
    r, c, h, w = blob(m[3])  # the ego box, 4.8 x 2.1 m
    assert (r, c) == (pytest.approx(192 - 40, abs=0.6), pytest.approx(96, abs=0.6))
    assert h == pytest.approx(24, abs=1) and w == pytest.approx(10.5, abs=1.5)


def test_rgb_is_the_same_view(grid):
    cfg = BevConfig()
    bev = BevRenderer(grid, cfg)
    ego = ego_state(*grid.spawn[3])
    bev.step(snapshot(ego, [(ActorClass.CAR, *offset(ego, 15.0, 0.0), ego.yaw, 2.0, 1.0)]))
    img = bev.rgb()
    assert img is bev.rgb()  # computed once per step
    rc = cfg.rgb_size / cfg.size
    ego_px = img[int((cfg.size - cfg.ego_from_bottom) * rc) - 2, cfg.rgb_size // 2]
    assert tuple(ego_px) == (255, 255, 255)
    car = img[int(expected_px(cfg, 15.0, 0)[0] * rc), cfg.rgb_size // 2]
    assert car[2] > 200 and car[0] < 100  # vehicles are blue


@pytest.mark.parametrize("bad,match", [
    (dict(size=0), "size"), (dict(channels=("road", "lidar")), "valid: road, route, lane"),
    (dict(channels=()), "empty"), (dict(history=(-1, 3)), "history"),
    (dict(pixels_per_meter=float("nan")), "pixels_per_meter"), (dict(ego_from_bottom=500), "ego_from_bottom"),
    (dict(channels=("road", "road")), "twice"),
])
def test_bad_config_fails_at_construction(bad, match):
    with pytest.raises(ValueError, match=match):
        BevConfig(**bad)


def test_from_dict_presets_and_unknown_keys():
    assert BevConfig.from_dict({"preset": "cpu"}).size == 96
    assert BevConfig.from_dict({"preset": "cpu", "channels": ["road"]}).shape == (1, 96, 96)
    with pytest.raises(ValueError, match="valid: roach, paper, cpu"):
        BevConfig.from_dict({"preset": "huge"})
    with pytest.raises(ValueError, match="unknown bev option"):
        BevConfig.from_dict({"pixels": 3})
    assert set(ALL_CHANNELS) >= set(BevConfig().channels)
