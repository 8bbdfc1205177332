"""The BEV's town raster in tiles (bev/raster.py): a town too large to rasterise whole (CARLA's
Town12 and Town13 are about 10 km across: 3.4 GB at the colour view's resolution, three times
that while drawing) is drawn tile by tile as views reach it, keeping at most MAX_TILES. The views
must be those of the whole drawing, which the shipped and built-in towns keep."""

from __future__ import annotations

import numpy as np
import pytest

from drivemind.bev import BEV_PRESETS, BevRenderer
from drivemind.bev import raster as R
from drivemind.bev import renderer as RR
from drivemind.maps import load_town
from test_bev import ego_state, snapshot


@pytest.fixture(scope="module")
def town03():
    return load_town("Town03")


def _renderer(rm, whole, monkeypatch, preset="roach"):
    rm.__dict__.pop("_bev_rasters", None)  # a raster of its own (not one an earlier test drew)
    orig = R.town_raster
    monkeypatch.setattr(RR, "town_raster", lambda m, ppm, mw: orig(m, ppm, mw, whole=whole))
    bev = BevRenderer(rm, BEV_PRESETS[preset])
    monkeypatch.setattr(RR, "town_raster", orig)
    assert bev.raster.whole is whole
    return bev


def _views(bev, poses):
    out = []
    for x, y, yaw in poses:
        bev.reset()
        out.append(bev.step(snapshot(ego_state(x, y, yaw))))
        out.append(bev.rgb())
    return out


def _poses(rm, n, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.integers(0, len(rm.pts), n)
    return [(float(rm.pts[i, 0]), float(rm.pts[i, 1]), float(rm.yaw[i] + rng.normal(0, 0.3)))
            for i in p]


def _differ(a, b):
    return sum(int((x != y).sum()) for x, y in zip(a, b)) / sum(x.size for x in a)


def test_a_town_drawn_tile_by_tile_gives_the_views_of_the_whole_drawing(town03, monkeypatch):
    poses = _poses(town03, 40)
    whole = _views(_renderer(town03, True, monkeypatch), poses)
    tiled = _renderer(town03, False, monkeypatch)
    assert (tiled.raster.tile_of == R.NOT_DRAWN).all()  # nothing drawn before a view asks
    got = _views(tiled, poses)
    assert _differ(whole, got) < 1e-4  # 0 on every town compared here (docs/benchmarks.md)
    assert any(v.any() for v in got)
    few = _renderer(town03, False, monkeypatch)
    _views(few, poses[:4])
    drawn = (few.raster.tile_of != R.NOT_DRAWN).mean()
    assert 0.0 < drawn < 0.4, drawn  # only where the views went


def test_a_tiled_town_keeps_at_most_max_tiles_and_redraws_what_it_let_go(town03, monkeypatch):
    monkeypatch.setattr(R, "MAX_TILES", 12)
    poses = _poses(town03, 30, seed=1)
    tiled = _renderer(town03, False, monkeypatch, preset="cpu")
    whole = _renderer(town03, True, monkeypatch, preset="cpu")
    got = _views(tiled, poses + poses[:5])  # the first poses again, their tiles let go by then
    assert len(tiled.raster.tiles) <= 12
    assert (tiled.raster.tile_of >= 0).sum() <= 12
    assert _differ(_views(whole, poses + poses[:5]), got) < 1e-4


def test_the_raster_is_drawn_whole_up_to_its_size_limit(monkeypatch):
    rm = load_town("Town01")
    r = R.TownRaster(rm, 5.0, 0.3)
    nv, nu = r.shape
    assert r.whole and r.tiles.shape == (1, nv, nu) and (r.tile_of == 0).all()
    assert r.window().any()
    monkeypatch.setattr(R, "WHOLE_MAX_PX", nv * nu - 1)
    r = R.TownRaster(rm, 5.0, 0.3)
    assert not r.whole and (r.tile_of == R.NOT_DRAWN).all()
    x0, y0, x1, y1 = rm.bounds
    r.ensure(x0 - R.MARGIN, y0 - R.MARGIN, x1 + R.MARGIN, y1 + R.MARGIN)  # every tile
    assert (r.tile_of != R.NOT_DRAWN).all()
    assert (r.tile_of == R.EMPTY).any()  # those with nothing on them take no slot
    assert len(r.tiles) < r.tile_of.size
    assert np.array_equal(r.window(), R.TownRaster(rm, 5.0, 0.3, whole=True).window())
