"""BEV-CLIP's multi-family training (drivemind.vlm.supervision, drivemind.vlm.bev_clip_train):
the prompts it reads from the reward configs, the held-out guard, labelled frames from the lite
simulator, the caption families per frame, a deterministic tiny run, and the shipped tower's
held-out measures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drivemind.vlm.captions import describe, situation
from drivemind.vlm.supervision import (check_training_towns, collect_frames, config_prompts,
                                       flipped_situation, frame_targets, polarity_prompts)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def frames():
    # the random driver crashes within a few hundred steps in the dense grid
    return collect_frames(["grid"], ["dense"], ["random", "perturbed"], steps=160, every=3, seed=1)


def test_frames_collected_in_small_blocks_are_the_same_frames(frames, monkeypatch):
    """collect_frames keeps frames in blocks and joins them at the end: blocks of 9 frames (many
    boundaries, a partial last block) give the same frames and labels as the fixture's."""
    import drivemind.vlm.supervision as sup

    monkeypatch.setattr(sup, "BLOCK_FRAMES", 9)
    again = collect_frames(["grid"], ["dense"], ["random", "perturbed"], steps=160, every=3, seed=1)
    assert len(frames.frames) > 18 and len(frames.frames) % 9 != 0
    assert np.array_equal(again.frames, frames.frames) and np.array_equal(again.polarity, frames.polarity)
    capped = collect_frames(["grid"], ["dense"], ["random"], steps=160, every=3, seed=1, max_frames=10)
    assert np.array_equal(capped.frames, frames.frames[:10])


def test_config_prompts_cover_every_papers_pair():
    safe, danger = config_prompts()
    # DriveMind / AICR static, VLM-RL / DriveVLM-RL, VLM-SR, RoboCLIP / VLM-RM
    assert {"no collisions occur", "The road is clear with no car accidents",
            "A car is driving safely"} <= set(safe)
    assert {"the car is about to crash",
            "Two cars have collided with each other on the road"} <= set(danger)
    s2, d2 = polarity_prompts()
    assert set(safe) <= set(s2) and set(danger) <= set(d2) and len(s2) > len(safe)
    assert not set(s2) & set(d2)


def test_config_prompts_follow_the_configs(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "name: mine\nparams:\n  positive: an empty road\n  contrast: [a wreck, a fire]\n  alpha: 0.5\n")
    assert config_prompts(tmp_path) == (["an empty road"], ["a wreck", "a fire"])
    with pytest.raises(FileNotFoundError, match="configs/reward"):
        config_prompts(tmp_path / "nope")


def test_heldout_towns_and_seeds_are_refused():
    check_training_towns(["grid", "Town02"], 0)
    with pytest.raises(ValueError, match="Town03.*held-out"):
        check_training_towns(["grid", "Town03"], 0)
    with pytest.raises(ValueError, match="below 10000"):
        check_training_towns(["grid"], 10_000)
    with pytest.raises(ValueError, match="valid: expert, perturbed, random"):
        collect_frames(["grid"], ["dense"], ["reckless"], steps=10)


def test_flipped_caption_reverses_the_danger_clauses():
    sit = situation({"speed_kmh": 30.0, "lead_distance": 5.0, "lead_speed_kmh": 0.0})
    assert sit["ahead"] == "crash" and sit["collision"] == "none"
    flip = flipped_situation(sit)
    assert flip["ahead"] == "clear" and flip["collision"] == "vehicle"
    assert flip["speed"] == sit["speed"] and flip["lane"] == sit["lane"]
    assert describe(flip) != describe(sit)
    assert flipped_situation(flip)["ahead"] == "crash"


def test_collected_frames_are_labelled_from_ground_truth(frames):
    n = len(frames)
    assert n > 50 and frames.frames.shape == (n, 15, 96, 96) and frames.frames.dtype == np.uint8
    assert set(np.unique(frames.polarity)) <= {-1, 0, 1} and (frames.polarity > 0).any()
    crashed = np.array([i["collision"] > 0 for i in frames.infos])
    if crashed.any():  # a collision step is always kept and is a danger frame
        assert (frames.polarity[crashed] == -1).all()
    assert len(set(frames.segment)) > 1 and all(s.startswith("grid/dense/") for s in frames.source)
    again = collect_frames(["grid"], ["dense"], ["random", "perturbed"], steps=160, every=3, seed=1)
    assert np.array_equal(again.frames, frames.frames) and np.array_equal(again.polarity, frames.polarity)


def test_frame_targets_give_every_family(frames):
    t = frame_targets(frames.infos, frames.polarity, np.random.default_rng(0))
    n = len(frames)
    assert len(t["library"]) == 720
    for i in range(n):
        assert t["action"][i] == t["library"][t["action_context"][i] * 30 + t["action_index"][i]]
    assert all(0 <= c < 24 for c in t["action_context"]) and all(0 <= a < 30 for a in t["action_index"])
    canon = frame_targets(frames.infos, frames.polarity)
    assert canon["scene"] == canon["scene_canonical"] == t["scene_canonical"]
    assert t["scene"] != t["scene_canonical"]  # paraphrased somewhere
    assert all(a != b for a, b in zip(t["scene_flip"], t["scene_canonical"]))
    assert all(p and i for p, i in zip(t["present"], t["ideal"]))
    assert ((t["risk"] >= -1) & (t["risk"] < 10)).all()


def test_tiny_multi_family_run_is_deterministic_and_finite(frames, text):
    from drivemind.vlm.bev_clip_train import evaluate, train_multi

    t = frame_targets(frames.infos, frames.polarity, np.random.default_rng(0))
    safe, danger = polarity_prompts()
    logs = []
    kw = dict(safe=safe, danger=danger, epochs=1, batch_size=32, seed=3)
    m1 = train_multi(frames.frames, t, text, log=lambda ep, parts: logs.append(parts), **kw)
    m2 = train_multi(frames.frames, t, text, **kw)
    for k, v in m1.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k
    assert set(logs[0]) == {"scene", "action", "risk", "polarity", "teacher"}
    assert all(np.isfinite(v) for v in logs[0].values()) and logs[0]["scene"] > 0
    res = evaluate(m1, frames.frames, t, t["scene_canonical"], text)
    assert 0.0 < res["action_p_mean"] < 1.0 and res["action_chance"] == pytest.approx(1 / 30)
    assert 0.0 <= res["retrieval"]["accuracy"] <= 1.0
    with pytest.raises(ValueError, match="targets"):
        train_multi(frames.frames[:5], t, text, **kw)


def test_training_on_rows_in_place_equals_training_on_their_copy(frames, text):
    """``train_multi(rows=...)`` (what ``train_bev_clip.py`` does with its training segments)
    reads the rows batch by batch and gives the tower ``train_multi(frames[rows])`` gives."""
    from drivemind.vlm.bev_clip_train import train_multi

    rows = np.flatnonzero(np.arange(len(frames.frames)) % 3 != 1)
    t = frame_targets([frames.infos[i] for i in rows], frames.polarity[rows], np.random.default_rng(0))
    safe, danger = polarity_prompts()
    kw = dict(safe=safe, danger=danger, epochs=1, batch_size=32, seed=3)
    copied = train_multi(frames.frames[rows], t, text, **kw)
    in_place = train_multi(frames.frames, t, text, rows=rows, **kw)
    for k, v in copied.state_dict().items():
        assert torch.equal(v, in_place.state_dict()[k]), k
    with pytest.raises(ValueError, match="rows must ascend"):
        train_multi(frames.frames, t, text, rows=rows[::-1], **kw)
    with pytest.raises(ValueError, match="targets"):
        train_multi(frames.frames, t, text, rows=rows[:5], **kw)


def test_tiny_speed_tower_run_is_deterministic(frames, text):
    """``train_multi(speed_kmh=...)`` (``train_bev_clip.py --speed-input``): a speed tower, the
    same tensors on a second run, the speeds it was trained with needed to evaluate it."""
    from drivemind.vlm.bev_clip_train import evaluate, train_multi

    t = frame_targets(frames.infos, frames.polarity, np.random.default_rng(0))
    safe, danger = polarity_prompts()
    v = np.array([i["speed_kmh"] for i in frames.infos])
    kw = dict(safe=safe, danger=danger, epochs=1, batch_size=32, seed=3, speed_kmh=v)
    m1, m2 = train_multi(frames.frames, t, text, **kw), train_multi(frames.frames, t, text, **kw)
    assert m1.reads_speed and "speed.0.weight" in m1.state_dict()
    for k, val in m1.state_dict().items():
        assert torch.equal(val, m2.state_dict()[k]), k
    res = evaluate(m1, frames.frames, t, t["scene_canonical"], text, speed_kmh=v)
    assert 0.0 <= res["retrieval"]["accuracy"] <= 1.0
    with pytest.raises(ValueError, match="speed"):
        evaluate(m1, frames.frames, t, t["scene_canonical"], text)
    with pytest.raises(ValueError, match="speeds"):
        train_multi(frames.frames, t, text, **{**kw, "speed_kmh": v[:5]})


def test_tiny_lane_tower_run_is_deterministic(frames, text):
    """``train_multi(lane_input=True)`` (``train_bev_clip.py --lane-input``): the tower reads the
    route-band readout of each frame's own BEV (nothing else passed), the same tensors twice."""
    from drivemind.vlm.bev_clip_train import evaluate, train_multi

    t = frame_targets(frames.infos, frames.polarity, np.random.default_rng(0))
    safe, danger = polarity_prompts()
    v = np.array([i["speed_kmh"] for i in frames.infos])
    kw = dict(safe=safe, danger=danger, epochs=1, batch_size=32, seed=3, speed_kmh=v, lane_input=True)
    m1, m2 = train_multi(frames.frames, t, text, **kw), train_multi(frames.frames, t, text, **kw)
    assert m1.reads_lane and m1.reads_speed and "lane.0.weight" in m1.state_dict()
    for k, val in m1.state_dict().items():
        assert torch.equal(val, m2.state_dict()[k]), k
    res = evaluate(m1, frames.frames, t, t["scene_canonical"], text, speed_kmh=v)
    assert 0.0 <= res["retrieval"]["accuracy"] <= 1.0


@pytest.mark.parametrize("size", [96, 192, 224])  # the cpu, roach and paper presets
def test_shipped_tower_was_measured_on_heldout_segments(monkeypatch, tmp_path, size):
    """Every shipped image-only checkpoint is the full recipe's and records how its training run
    scored held-out segments: danger frames rank above safe ones for the static prompts and
    Found-RL's actions beat chance."""
    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from drivemind.vlm import BevClip

    m = BevClip.load(bev_shape=(15, size, size))
    held = m.meta["heldout_measures"]
    # well above chance (0.5): the full-recipe tower scores 0.78 on its own held-out segments
    # (72 danger frames) and 0.92 on unseen towns (bench.py reward-quality, aicr_static)
    assert held["auroc[the car is about to crash | no collisions occur]"] > 0.7, held
    assert held["action_p_mean"] > 2 * held["action_chance"], held
    assert held["retrieval"]["accuracy"] > 5 * held["retrieval"]["chance"], held
    assert not {"Town01", "Town03", "Town05"} & set(m.meta["towns"])
