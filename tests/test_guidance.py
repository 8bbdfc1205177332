"""Found-RL's VLM action guidance in DriveSAC (issue 17, seed 004): VMR and AWAG on hand-made
numbers, the cosine schedule, masking, the buffer's suggestion slot, the privileged teacher's
facts, ``guidance=none`` leaving the update unchanged, config checks and an end-to-end run."""

from __future__ import annotations

import json
import math
import threading
import time
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.vec_env import DummyVecEnv

import drivemind  # noqa: F401
from drivemind.agents import DriveSAC, RelabelReplayBuffer
from drivemind.agents.buffer import LABELLED
from drivemind.agents.guidance import (GuidanceConfig, awag_loss, awag_weights, cosine_weight,
                                       vmr_loss)
from drivemind.rewards import make_reward
from drivemind.training.validate import config_problems
from drivemind.vlm.action_teacher import (ACTION_SYSTEM_PROMPT, MalformedAction, action_prompt,
                                          parse_action_json)

REPO = Path(__file__).resolve().parents[1]
BEV = {"preset": "cpu", "size": 48, "rgb_size": 32}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_env(**kw):
    return gym.make("DriveMind-v0", town="grid", density="empty", bev=BEV, **kw)


# ---------------------------------------------------------------------------- the formulas


def test_cosine_weight_follows_eq_14():
    assert cosine_weight(0, 1.0, 0.0, 100) == pytest.approx(1.0)
    assert cosine_weight(50, 1.0, 0.0, 100) == pytest.approx(0.5)
    assert cosine_weight(25, 1.0, 0.0, 100) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert cosine_weight(100, 1.0, 0.2, 100) == pytest.approx(0.2)
    assert cosine_weight(10_000, 1.0, 0.2, 100) == pytest.approx(0.2)  # held at the end value
    # power < 1 decays faster early: p = 0.25 ** 0.5 = 0.5 -> half way
    assert cosine_weight(25, 1.0, 0.0, 100, power=0.5) == pytest.approx(0.5)
    assert cosine_weight(7, 0.01, 0.01, 100) == pytest.approx(0.01)  # constant schedule


def test_vmr_margin_loss_on_hand_made_numbers():
    q_vlm = th.tensor([[1.0, 2.0], [0.0, 0.0], [5.0, 5.0]], requires_grad=True)
    q_data = th.tensor([[0.0, 1.0], [9.0, 9.0], [1.0, 2.0]], requires_grad=True)
    mask = th.tensor([[1.0], [0.0], [1.0]])
    loss = vmr_loss(q_vlm, q_data, mask, margin=2.0)
    # rows 0 and 2 only; head 1: ((1-2)^2 + (5-3)^2)/2 = 2.5; head 2: ((2-3)^2 + (5-4)^2)/2 = 1
    assert loss.item() == pytest.approx(3.5)
    loss.backward()
    assert q_data.grad is None or th.all(q_data.grad == 0)  # the replayed value is detached
    assert th.all(q_vlm.grad[1] == 0)  # the row without a suggestion contributes nothing
    assert q_vlm.grad[0, 0].item() == pytest.approx(2 * (1 - 2) / 2)
    # no suggestion in the batch: zero loss
    assert vmr_loss(q_vlm, q_data, th.zeros(3, 1), 2.0).item() == 0.0


def test_awag_weights_clip_and_gate():
    adv = th.tensor([-1.0, 0.0, 2.0, 100.0])
    w, gate = awag_weights(adv, beta=2.0, w_max=20.0)
    np.testing.assert_allclose(w.numpy(), [math.exp(-0.5), 1.0, math.e, 20.0], rtol=1e-6)
    assert gate.tolist() == [False, False, True, True]


def test_awag_loss_masks_and_gates():
    logp = th.tensor([-1.0, -2.0, -3.0, -4.0], requires_grad=True)
    w = th.tensor([1.0, 2.0, 3.0, 4.0])
    gate = th.tensor([True, True, False, True])
    mask = th.tensor([[1.0], [0.0], [1.0], [1.0]])
    loss = awag_loss(logp, w, gate, mask)
    # kept rows: 0 and 3 (1 has no suggestion, 2 fails the gate): -(1*-1 + 4*-4)/2 = 8.5
    assert loss.item() == pytest.approx(8.5)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-0.5, 0.0, 0.0, -2.0])
    assert awag_loss(logp, w, gate, th.zeros(4, 1)).item() == 0.0


def test_guidance_config_errors_name_the_choices():
    assert GuidanceConfig.from_config("none") is None
    g = GuidanceConfig.from_config("both", {"awag": {"beta": 1.0}})
    assert g.use_vmr and g.use_awag and g.awag["beta"] == 1.0 and g.awag["w_max"] == 20.0
    with pytest.raises(ValueError, match="valid: none, vmr, awag, both"):
        GuidanceConfig.from_config("vrm")
    assert GuidanceConfig.from_config("vmr", {"source": "smolvlm"}).asynchronous
    assert GuidanceConfig.from_config("vmr", {"source": "http"}).asynchronous
    with pytest.raises(ValueError, match="never taken from configuration"):
        GuidanceConfig.from_config("vmr", {"source": "http", "teacher": {"api_key": "sk-x"}})
    with pytest.raises(ValueError, match=r"service\.max_pending must be an integer >= 1"):
        GuidanceConfig.from_config("vmr", {"source": "http", "service": {"max_pending": 0}})
    with pytest.raises(ValueError, match="valid: privileged, smolvlm, http"):
        GuidanceConfig.from_config("vmr", {"source": "gpt"})
    with pytest.raises(ValueError, match=r"vmr\.steps must be a number > 0"):
        GuidanceConfig.from_config("vmr", {"vmr": {"steps": 0}})
    with pytest.raises(ValueError, match="valid: margin"):
        GuidanceConfig.from_config("vmr", {"vmr": {"delta": 1}})


def test_validate_checks_the_guidance_keys():
    from hydra_config import config

    cfg = config("algo.guidance=both")
    assert cfg["algo"]["guidance"] == "both"
    assert not [p for p in config_problems(cfg) if "guidance" in p]
    cfg["algo"]["guidance"] = "awac"
    assert any("algo.guidance" in p and "vmr" in p for p in config_problems(cfg))
    cfg["algo"]["guidance"] = "vmr"
    cfg["algo"]["guidance_kwargs"]["source"] = "gpt"
    assert any("valid: privileged, smolvlm, http" in p for p in config_problems(cfg))
    cfg["algo"]["guidance_kwargs"].update(source="http", service={"max_batch": 0})
    assert any("service.max_batch must be an integer >= 1" in p for p in config_problems(cfg))


# ---------------------------------------------------------------------------- env and buffer


def test_env_puts_the_privileged_suggestion_in_the_facts():
    env = make_env(suggest_action=True)
    _, info = env.reset(seed=3)
    assert info["vlm_action_available"] == 0.0  # no step yet
    base = env.unwrapped
    for _ in range(5):
        expected = base.expert_action()  # the autopilot's action for this step's observation
        _, _, term, trunc, info = env.step(np.array([0.3, -0.2], np.float32))  # not the expert's
        assert info["vlm_action_available"] == 1.0
        np.testing.assert_allclose([info["vlm_action_steer"], info["vlm_action_accel"]], expected, atol=1e-6)
    env.close()
    plain = make_env()
    plain.reset(seed=3)
    info = plain.step(np.zeros(2, np.float32))[-1]
    assert info["vlm_action_available"] == 0.0 and info["vlm_action_steer"] == 0.0
    plain.close()


def test_buffer_stores_suggestions_and_mask_and_writes_back_by_slot():
    env = make_env(suggest_action=True)
    buf = RelabelReplayBuffer(64, env.observation_space, env.action_space, device="cpu", guidance=True)
    obs, info = env.reset(seed=1)
    stored = []
    for t in range(20):
        nobs, _, term, trunc, info = env.step(np.array([0.0, 0.5], np.float32))
        if t % 3 == 0:  # as if no suggestion came for this step
            info = {**info, "vlm_action_available": 0.0}
        buf.add({k: v[None] for k, v in obs.items()}, {k: v[None] for k, v in nobs.items()},
                np.array([[0.0, 0.5]]), np.zeros(1), np.array([term or trunc]), [info])
        stored.append((info["vlm_action_available"], info["vlm_action_steer"], info["vlm_action_accel"]))
        obs = nobs
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    mask = buf.guide_mask[:20, 0]
    assert mask.tolist() == [int(s[0]) for s in stored]
    for i, (m, st, ac) in enumerate(stored):
        if m:
            np.testing.assert_allclose(buf.guide_actions[i, 0], [st, ac], atol=1e-6)
        else:
            assert np.all(buf.guide_actions[i, 0] == 0)
    assert buf.stats()["buffer/guided"] == int(mask.sum())
    # an asynchronous teacher's answers, written back by slot; a non-finite one is not valid
    buf.set_guidance(np.array([0, 3]), np.array([[0.5, -0.5], [np.nan, 0.0]]))
    assert buf.guide_mask[0, 0] == 1 and buf.guide_mask[3, 0] == 0
    np.testing.assert_allclose(buf.guide_actions[0, 0], [0.5, -0.5])
    # sampling returns each row's own suggestion and mask
    buf.label_pending(make_reward("chen"))
    np.random.seed(0)
    data, act, m = buf.sample_guided(32)
    np.random.seed(0)
    slots = buf._draw(32)
    np.testing.assert_array_equal(m.numpy().ravel(), buf.guide_mask.reshape(-1)[slots])
    np.testing.assert_allclose(act.numpy(), buf.guide_actions.reshape(-1, 2)[slots])
    np.testing.assert_allclose(data.actions.numpy(), buf.actions.reshape(-1, 2)[slots])
    # an answer for a slot overwritten since it was asked for is dropped (stamps)
    stamps = buf.guidance_stamps(np.array([5, 6]))
    buf.guide_stamp[6, 0] += 1  # as if slot 6 had been written again
    assert buf.set_guidance(np.array([5, 6]), np.array([[0.1, 0.2], [0.3, 0.4]]), stamps=stamps) == 1
    np.testing.assert_allclose(buf.guide_actions[5, 0], [0.1, 0.2])
    assert not np.allclose(buf.guide_actions[6, 0], [0.3, 0.4])
    plain = RelabelReplayBuffer(8, buf.observation_space, buf.action_space, device="cpu")
    with pytest.raises(ValueError, match="guidance=True"):
        plain.set_guidance(np.array([0]), np.zeros((1, 2)))


# ---------------------------------------------------------------------------- the agent


def _sac(guidance="none", suggest=None, **kw):
    suggest = guidance != "none" if suggest is None else suggest
    venv = DummyVecEnv([partial(make_env, suggest_action=suggest, max_episode_steps=40)])
    pk = dict(net_arch=[32], features_extractor_kwargs=dict(bev_dim=32, state_dim=8))
    return DriveSAC(env=venv, reward_fn=make_reward("chen"), buffer_size=500, batch_size=16, seed=0,
                    device="cpu", policy_kwargs=pk, learning_starts=60, guidance=guidance, **kw)


def _params(m):
    return [p.detach().clone() for p in m.policy.parameters()]


def test_guidance_none_is_the_plain_update_and_vmr_changes_only_through_suggestions():
    """With every mask 0 the guided update is the plain one, bit for bit; with suggestions it
    differs. guidance=none has no guidance slot at all."""
    plain = _sac("none")
    assert plain.guidance_cfg is None and plain.replay_buffer.guide_mask is None
    plain.learn(60)  # fills the buffer, no update yet
    guided = _sac("both", guidance_kwargs={"vmr": {"start": 5.0}, "awag": {"start": 1.0, "end": 1.0}})
    guided.learn(60)
    # same seed, same env: the same transitions and weights so far
    np.testing.assert_array_equal(plain.replay_buffer.actions, guided.replay_buffer.actions)
    for a, b in zip(_params(plain), _params(guided)):
        assert th.equal(a, b)
    assert guided.replay_buffer.guide_mask[:60].sum() > 50
    saved_mask = guided.replay_buffer.guide_mask.copy()
    guided.replay_buffer.guide_mask[:] = 0  # every suggestion unavailable
    for m in (plain, guided):
        np.random.seed(1)
        th.manual_seed(1)
        m.train(gradient_steps=3, batch_size=16)
    for a, b in zip(_params(plain), _params(guided)):
        assert th.equal(a, b)
    # with the suggestions the same update differs (both the critic and the actor heads)
    guided.replay_buffer.guide_mask[:] = saved_mask
    before = _params(guided)
    np.random.seed(2)
    th.manual_seed(2)
    plain.train(gradient_steps=1, batch_size=16)
    np.random.seed(2)
    th.manual_seed(2)
    guided.train(gradient_steps=1, batch_size=16)
    assert any(not th.equal(a, b) for a, b in zip(_params(plain), _params(guided)))
    assert any(not th.equal(a, b) for a, b in zip(before, _params(guided)))
    log = guided.logger.name_to_value
    assert log["guidance/vmr_weight"] == pytest.approx(5.0 * (1 + math.cos(math.pi * 60 / 150_000)) / 2)
    assert log["guidance/awag_weight"] == pytest.approx(1.0) and log["guidance/available"] > 0.5


def test_guidance_with_a_stock_buffer_or_sde_fails_clearly():
    with pytest.raises(ValueError, match="use_sde=false"):
        _sac("awag", use_sde=True)
    from stable_baselines3.common.buffers import DictReplayBuffer
    with pytest.raises(ValueError, match="RelabelReplayBuffer"):
        _sac("vmr", replay_buffer_class=DictReplayBuffer)


def test_train_script_found_rl_clip_with_guidance_end_to_end(tmp_path):
    """scripts/train.py's path (training.train on the Hydra config): found_rl_clip with both
    guidance terms for 100 steps on the grid town (the fast path); the logs carry the guidance
    losses."""
    import csv

    from hydra_config import config

    from drivemind.training import train

    # the fast path (cpu BEV, frozen encoder features): BEV-CLIP ships for this BEV shape
    over = ["logger=quiet", "progress_bar=false", "town=grid", "density=empty", "obs=cpu",
            "obs.features=bev_encoder", "algo.policy_kwargs.net_arch=[32]", "+env.max_episode_steps=40", "log_interval=1",
            "algo.learning_starts=50", "algo.batch_size=16", "algo.buffer_size=500",
            "reward=found_rl_clip", "algo.guidance=both", "total_timesteps=100"]
    cfg = config(*over)
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "finished" and summary["steps"] == 100
    rows = list(csv.DictReader(open(tmp_path / "run" / "logs" / "progress.csv", newline="")))
    vals = [r for r in rows if r.get("guidance/vmr_loss")]
    assert vals, "no guidance losses logged"
    assert all(math.isfinite(float(r["guidance/vmr_loss"])) and math.isfinite(float(r["guidance/awag_loss"]))
               for r in vals)
    assert float(vals[-1]["guidance/available"]) > 0.9  # the privileged teacher scores every step


# ---------------------------------------------------------------------------- the HTTP teacher, asynchronously


class _ActionApi(BaseHTTPRequestHandler):
    """Test double of a remote VLM's chat-completions API: every third answer is malformed, the
    others suggest (0.25, -0.5). The client, the reward service and the write-back are real."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(n))
        srv = self.server
        with srv.lock:
            srv.seen.append(body)
            k = len(srv.seen)
        content = "sorry, no idea" if k % 3 == 0 else 'Sure: {"steer": 0.25, "accel": -0.5}'
        data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def action_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _ActionApi)
    srv.seen, srv.lock = [], threading.Lock()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_action_contract():
    np.testing.assert_allclose(parse_action_json('```json\n{"steer": -0.1, "accel": 1}\n```'), [-0.1, 1.0])
    for bad, why in [("no json", "no JSON object"), ('{"steer": 0.1}', "'steer' and 'accel'"),
                     ('{"steer": 2, "accel": 0}', r"steer must be a number in \[-1, 1\]"),
                     ('{"steer": true, "accel": 0}', "steer must be")]:
        with pytest.raises(MalformedAction, match=why):
            parse_action_json(bad)
    text = action_prompt({"speed_kmh": 23.4, "command": 1, "lead_distance": 12.0, "light_state": 0})
    assert "23.4 km/h" in text and "left" in text and "12 m ahead" in text and "red" in text


def _unscored_buffer(n: int) -> RelabelReplayBuffer:
    env = make_env()
    buf = RelabelReplayBuffer(64, env.observation_space, env.action_space, device="cpu", guidance=True)
    obs, _ = env.reset(seed=2)
    for _ in range(n):
        nobs, _, term, trunc, info = env.step(np.array([0.0, 0.4], np.float32))
        buf.add({k: v[None] for k, v in obs.items()}, {k: v[None] for k, v in nobs.items()},
                np.array([[0.0, 0.4]]), np.zeros(1), np.array([term or trunc]), [info])
        obs = nobs
    env.close()
    return buf


def test_http_teacher_answers_are_written_back_by_slot_through_the_reward_service(action_server):
    from drivemind.agents.guidance import GuidanceRequester

    buf = _unscored_buffer(12)
    assert buf.guide_mask.sum() == 0  # nothing scored yet
    url = f"http://127.0.0.1:{action_server.server_address[1]}/v1"
    req = GuidanceRequester("http", {"base_url": url, "model": "test-vlm"}, {"max_batch": 4, "max_pending": 5})
    try:
        deadline = time.time() + 60
        while req.answered < 12 and time.time() < deadline:
            req.pump(buf, timeout=0.5)
        st = req.stats()
        req.pump(buf)
        assert req.requested == 12  # nothing new to ask
    finally:
        req.close()
    assert st["guidance/answered"] == 12 and st["guidance/requested"] == 12
    assert st["guidance/valid_answers"] == 8  # every third answer was malformed
    mask = buf.guide_mask[:12, 0]
    assert mask.sum() == 8  # malformed answers stay unscored (mask 0), never targets
    np.testing.assert_allclose(buf.guide_actions[:12, 0][mask == 1], [[0.25, -0.5]] * 8)
    assert np.all(buf.guide_actions[:12, 0][mask == 0] == 0)
    sent = action_server.seen[0]
    assert sent["model"] == "test-vlm" and sent["messages"][0]["content"] == ACTION_SYSTEM_PROMPT
    user = sent["messages"][1]["content"]
    assert "km/h" in user[0]["text"] and user[1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_sac_with_the_http_teacher_trains_on_its_answers(action_server):
    url = f"http://127.0.0.1:{action_server.server_address[1]}/v1"
    m = _sac("both", suggest=False, guidance_kwargs={"source": "http", "teacher": {"base_url": url, "model": "m"},
                                                     "service": {"max_batch": 8}})
    assert m.replay_buffer.store_images
    try:
        m.learn(100)  # answers arrive while it trains, or later: never waited for
        req, buf = m.guidance_requester(), m.replay_buffer
        assert req.requested > 0
        deadline = time.time() + 60
        while req.valid == 0 and time.time() < deadline:
            req.pump(buf, timeout=0.5)
        assert 0 < buf.guide_mask.sum() <= req.valid
        m.train(gradient_steps=2, batch_size=32)
        log = m.logger.name_to_value
        assert log["guidance/available"] > 0 and math.isfinite(log["guidance/vmr_loss"])
    finally:
        m.close_service()


def test_tiny_smolvlm_teacher_runs_in_the_worker_and_its_noise_stays_unscored():
    """The tiny VLM path: the random tiny SmolVLM asked with the action prompt in the service's
    worker. 12 new tokens of its byte tokenizer cannot spell a valid answer (at least 21
    characters), so every row is answered and none is scored."""
    from drivemind.agents.guidance import GuidanceRequester
    from drivemind.vlm.action_teacher import ActionTeacherWorker

    with pytest.raises(ValueError, match="unknown algo.guidance_kwargs.teacher key"):
        GuidanceRequester("smolvlm", {"tiny": True, "temperature": 0.5})
    teacher = ActionTeacherWorker("smolvlm", {"tiny": True, "max_new_tokens": 4}).build()
    buf = _unscored_buffer(3)
    obs = buf.observation(0)
    from drivemind.vlm.prompts import PromptRequest
    answer = teacher.generate(PromptRequest(facts={"speed_kmh": 12.0}, bev=obs["bev"]))
    assert isinstance(answer, str) and "12.0 km/h" in teacher.prompt_text()
    assert ACTION_SYSTEM_PROMPT in teacher.prompt_text()
    req = GuidanceRequester("smolvlm", {"tiny": True, "max_new_tokens": 12}, {"max_batch": 3})
    try:
        deadline = time.time() + 120
        while req.answered < 3 and time.time() < deadline:
            req.pump(buf, timeout=0.5)
    finally:
        req.close()
    assert req.answered == 3 and req.valid == 0
    assert buf.guide_mask.sum() == 0
