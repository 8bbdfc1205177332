"""The fast learning path (issue 14): the frozen BEV encoder, its features in the observation, the
MLP-only extractor, a replay buffer that neither decodes nor (without semantic rewards) stores the
masks, the wall-time budget and ``bench.py learn``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th

import drivemind  # noqa: F401
from drivemind.agents import DriveSAC, FeatureExtractor, RelabelReplayBuffer
from drivemind.bev import BevConfig
from drivemind.bev.encoder import (LIGHT_CLASSES, RADAR_RANGE, TARGET_NAMES, BevEncoder, scene_targets,
                                   train_encoder)
from drivemind.rewards import make_reward
from drivemind.training import train

from hydra_config import config
from script_loader import load_script

REPO = Path(__file__).resolve().parents[1]
CPU_SHAPE = BevConfig.from_dict({"preset": "cpu"}).shape


@pytest.fixture(scope="module")
def encoder():
    return BevEncoder.load("bev_encoder", bev_shape=CPU_SHAPE)


def test_shipped_encoder_loads_for_the_cpu_preset_and_refuses_other_shapes(encoder):
    assert encoder.bev_shape == CPU_SHAPE and encoder.dim == 128
    with pytest.raises(FileNotFoundError, match=r"train_bev_encoder.py"):
        BevEncoder.load("bev_encoder", bev_shape=(15, 40, 40))
    with pytest.raises(ValueError, match="trained on"):
        BevEncoder.load(encoder.path, bev_shape=(15, 64, 64))
    with pytest.raises(ValueError, match="expects"):
        encoder.encode(np.zeros((15, 64, 64), np.uint8))


def test_env_adds_the_encoders_features_of_the_same_frame(encoder):
    env = gym.make("DriveMind-v0", town="grid", density="regular", bev="cpu", features="bev_encoder")
    assert env.observation_space["bev_features"].shape == (encoder.dim,)
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        obs, *_ = env.step(env.unwrapped.expert_action())
    f = obs["bev_features"]
    assert f.shape == (encoder.dim,) and f.dtype == np.float32 and np.all(np.abs(f) <= 1)
    np.testing.assert_allclose(f, encoder.encode(obs["bev"]), atol=1e-6)
    assert env.observation_space.contains(obs)
    env.close()


def test_scene_targets_follow_the_ground_truth():
    env = gym.make("DriveMind-v0", town="grid", density="dense")
    env.reset(seed=3)
    base = env.unwrapped
    seen_actor = False
    for _ in range(60):
        _, _, term, trunc, info = env.step(base.expert_action())
        reg, light = scene_targets(info, base.snapshot)
        assert reg.shape == (len(TARGET_NAMES),) and 0 <= light < len(LIGHT_CLASSES)
        t = dict(zip(TARGET_NAMES, reg))
        assert math.isclose(t["lead_distance"], min(info["lead_distance"], 50.0) / 50.0, rel_tol=1e-5)
        st = int(info["light_state"])
        assert LIGHT_CLASSES[light] == {0: "green", 1: "yellow", 2: "red"}.get(st, "none")
        # the radar: the nearest vehicle overall is the minimum over the vehicle sectors
        snap = base.snapshot
        a, e = snap.actors, snap.ego
        veh = (a.cls >= 1) & (a.cls <= 3)
        d = np.hypot(a.pos[veh, 0] - e.x, a.pos[veh, 1] - e.y)
        radar = np.array([t[f"radar_vehicle_{i}"] for i in range(8)]) * RADAR_RANGE
        if len(d) and d.min() < RADAR_RANGE:
            seen_actor = True
            assert math.isclose(radar.min(), d.min(), rel_tol=1e-4)
        else:
            assert np.all(radar == RADAR_RANGE)
        if term or trunc:
            break
    assert seen_actor
    env.close()


def _frames(n=96, seed=0):
    env = gym.make("DriveMind-v0", town="grid", density="regular", bev={"preset": "cpu", "size": 48,
                                                                        "pixels_per_meter": 1.25,
                                                                        "ego_from_bottom": 10})
    env.reset(seed=seed)
    base = env.unwrapped
    fr, regs, lights = [], [], []
    for _ in range(n):
        obs, _, term, trunc, info = env.step(base.expert_action())
        r, li = scene_targets(info, base.snapshot)
        fr.append(obs["bev"]), regs.append(r), lights.append(li)
        if term or trunc:
            env.reset()
    env.close()
    return np.stack(fr), np.stack(regs), np.asarray(lights)


def test_train_encoder_is_deterministic_and_learns(tmp_path):
    th.set_num_threads(1)
    frames, regs, lights = _frames()
    a, ma = train_encoder(frames, regs, lights, dim=16, epochs=3, batch_size=16, seed=1)
    b, _ = train_encoder(frames, regs, lights, dim=16, epochs=3, batch_size=16, seed=1)
    for (k, x), (_, y) in zip(a.net.state_dict().items(), b.net.state_dict().items()):
        assert th.equal(x, y), k
    untrained, m0 = train_encoder(frames, regs, lights, dim=16, epochs=0, batch_size=16, seed=1)
    err = np.mean(list(ma["train"]["mae"].values()))
    err0 = np.mean(list(m0["train"]["mae"].values()))
    assert err < err0, (err, err0)
    p = a.save(tmp_path / "enc.pt")
    back = BevEncoder.load(p, bev_shape=frames.shape[1:])
    np.testing.assert_array_equal(back.encode(frames[:4]), a.encode(frames[:4]))


def _fast_model(reward: str, steps_env=None):
    env = gym.make("DriveMind-v0", town="grid", density="regular", bev="cpu", features="bev_encoder",
                   max_episode_steps=60)
    return DriveSAC("DrivePolicy", env, reward_fn=make_reward(reward), buffer_size=500, batch_size=32,
                    learning_starts=40, policy_kwargs={"features_extractor_class": FeatureExtractor,
                                                       "net_arch": [32, 32]}, seed=0)


def test_fast_sac_stores_no_masks_for_a_kinematic_reward():
    m = _fast_model("drivemind_kinematic")
    buf = m.replay_buffer
    assert isinstance(buf, RelabelReplayBuffer) and not buf.store_images and not buf.codecs
    assert buf.bytes_per_transition() < 1500  # features + ego + waypoints + facts, no masks
    m.learn(120)
    data = buf.sample(8)
    assert set(data.observations) == {"ego", "waypoints", "bev_features"}
    obs = m.env.reset()
    a, _ = m.predict(obs, deterministic=True)
    assert a.shape == (1, 2)


def test_fast_sac_keeps_masks_for_a_semantic_reward_but_samples_none():
    m = _fast_model("aicr_static")
    buf = m.replay_buffer
    assert buf.store_images and not buf.sample_images and buf.embeddings is not None
    m.learn(80)
    assert m.embedded_frames > 0  # BEV-CLIP embedded the stored masks
    assert "bev" not in buf.sample(4).observations


def test_feature_extractor_needs_the_features():
    env = gym.make("DriveMind-v0", town="grid", density="empty", bev="cpu")
    with pytest.raises(ValueError, match="obs.features=bev_encoder"):
        FeatureExtractor(env.observation_space)


def test_experiment_fast_trains_within_a_wall_time_budget(tmp_path):
    cfg = config("experiment=fast", "town=grid", "logger=quiet", "progress_bar=false",
                 "total_timesteps=100000", "max_minutes=0.05", "algo.learning_starts=50",
                 "algo.batch_size=32", "checkpoint_every=0", "+env.max_episode_steps=50")
    assert cfg["obs"]["features"] == "bev_encoder" and cfg["algo"]["policy_kwargs"]["extractor"] == "features"
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "stopped after max_minutes=0.05"
    assert 0 < summary["steps"] < 100000 and summary["wall_s"] < 30
    rows = (tmp_path / "run" / "logs" / "episodes.csv").read_text().splitlines()
    assert "wall_s" in rows[0] and "task_return" in rows[0] and len(rows) > 1


def test_bench_train_times_the_cnn_path_where_a_preset_has_no_encoder_weights(monkeypatch, tmp_path):
    """`bench.py train --bev roach`: no fast-path encoder is shipped for that preset, so the
    benchmark times DriveSAC's CNN path against stock SB3 and says why the fast path is missing
    (it stopped with the missing-weights error before)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no user checkpoint in the way
    monkeypatch.delenv("DRIVEMIND_VLM_WEIGHTS", raising=False)
    bench = load_script("bench")
    res = bench.main(["train", "--town", "grid", "--density", "empty", "--bev", "roach", "--batch-size", "8",
                      "--buffer-size", "200", "--warmup", "20", "--steps", "5", "--rounds", "1",
                      "--threads", "1"])
    assert res["bev"] == [15, 192, 192] and res["device"] == ("cuda" if th.cuda.is_available() else "cpu")
    assert res["steps_per_s"] > 0 and res["sb3_steps_per_s"] > 0
    assert res["fast_steps_per_s"] is None and "bev_encoder_roach.pt" in res["fast_skipped"]
    assert set(res["rounds"]) == {"drivemind", "sb3"}


def test_bench_learn_prints_the_figures(tmp_path, capsys):
    bench = load_script("bench")
    res = bench.main(["learn", "--town", "grid", "--density", "empty", "--minutes", "0.03",
                      "--out", str(tmp_path), "--max-steps", "30", "algo.learning_starts=30",
                      "algo.batch_size=16", "checkpoint_every=0", "+env.max_episode_steps=40"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(res))
    for k in ("route_completion", "success_rate", "collision_rate", "env_steps", "wall_s", "env_steps_per_s"):
        assert k in res, k
    assert res["env_steps"] > 0 and 0 <= res["route_completion"] <= 1
    # how the 10 routes ended, counted from the evaluation's own records
    row = res["per_seed"][0]
    # the curves' PNG is named after the seed, as its run directory (two seeds run side by side
    # in two processes keep one PNG each; it was one name for every seed)
    assert Path(res["curve"]).exists() and Path(res["curve"]).name == Path(row["run_dir"]).name + ".png"
    routes = json.loads((Path(row["run_dir"]) / "eval" / "grid-empty" / "metrics.json").read_text())["routes"]
    assert sum(row["endings"].values()) == len(routes) == 10
    assert row["endings"]["arrived"] == sum(bool(r["arrived"]) for r in routes) >= round(10 * res["success_rate"])
    assert res["endings"] == row["endings"]
    assert len(row["collision_speeds_kmh"]) == sum(r["collisions"] for r in routes)
    # the run's directory shows the extra overrides: two variants of a reward never share one
    run_dir = Path(res["per_seed"][0]["run_dir"])
    assert run_dir.parent == tmp_path and "algo.batch_size-16" in run_dir.name
    assert run_dir.name.startswith("learn-fast-drivemind_kinematic-grid-empty-s0-")


def test_n_step_returns_stop_at_episode_ends_unlabelled_rows_and_the_write_position():
    from gymnasium import spaces

    from drivemind.agents.buffer import LABELLED, PENDING

    space = spaces.Dict({"x": spaces.Box(-1e6, 1e6, (1,), np.float32)})
    buf = RelabelReplayBuffer(8, space, spaces.Box(-1, 1, (2,), np.float32), fact_keys=("f",),
                              n_steps=3, gamma=0.5, device="cpu")
    dones = [0, 0, 0, 1, 0, 0]  # an episode of 4 transitions, then one of 2 (still running)
    for t, d in enumerate(dones):
        buf.add({"x": np.array([[t]], np.float32)}, {"x": np.array([[t + 1]], np.float32)},
                np.zeros((1, 2)), np.zeros(1), np.array([d]), [{"f": 0.0}])
    buf.rewards[:6, 0] = [1, 2, 4, 8, 16, 32]
    buf.labels[:6, 0] = LABELLED
    buf.labels[5, 0] = PENDING  # not yet labelled: never part of a return
    s = buf._get_samples(np.array([0, 1, 2, 3, 4]))
    np.testing.assert_allclose(s.rewards[:, 0].numpy(), [1 + 1 + 1, 2 + 2 + 2, 4 + 4, 8, 16])
    np.testing.assert_allclose(s.discounts[:, 0].numpy(), [0.125, 0.125, 0.25, 0.5, 0.5])
    # the next observation is the last summed transition's; dones from it
    np.testing.assert_allclose(s.next_observations["x"][:, 0].numpy(), [3, 4, 4, 4, 5])
    np.testing.assert_allclose(s.dones[:, 0].numpy(), [0, 1, 1, 1, 0])
    one = RelabelReplayBuffer(8, space, spaces.Box(-1, 1, (2,), np.float32), fact_keys=("f",))
    assert one.n_steps == 1
    with pytest.raises(ValueError, match="n_steps"):
        RelabelReplayBuffer(8, space, spaces.Box(-1, 1, (2,), np.float32), fact_keys=("f",), n_steps=0)


def test_fast_path_checkpoint_resumes_with_its_buffer(tmp_path):
    over = ["experiment=fast", "town=grid", "logger=quiet", "progress_bar=false", "total_timesteps=150",
            "algo.learning_starts=60", "algo.batch_size=16", "algo.buffer_size=1000", "algo.n_steps=3",
            "checkpoint_every=0", "+env.max_episode_steps=40"]
    run = tmp_path / "run"
    s1 = train(config(*over), run)
    assert s1["steps"] == 150
    # 250: off algo.train_freq's grid (3): the last rollout is cut, the run ends on its budget
    s2 = train(config(*over[:4], "total_timesteps=250", *over[5:]), run, resume=True)
    assert s2["steps"] == 250 and s2["resumed_from"] == 150
    from drivemind.training.callbacks import latest_checkpoint

    ck = latest_checkpoint(run)
    m = DriveSAC.load(ck["model"], reward_fn=make_reward("drivemind_kinematic"))
    m.load_replay_buffer(ck["buffer"])
    buf = m.replay_buffer
    assert not buf.store_images and buf.n_steps == 3 and buf.counts()["labelled"] >= 200


def test_critic_layer_norm_builds_normalised_q_heads_that_train_and_survive_a_reload(tmp_path):
    """algo.policy_kwargs.critic_layer_norm=true: LayerNorm after each hidden linear layer of both
    Q heads and of their targets, none in the actor; a save/load keeps it (the flag is a
    constructor parameter of the policy)."""
    cfg = config("experiment=fast", "town=grid", "logger=quiet", "progress_bar=false",
                 "total_timesteps=120", "algo.learning_starts=60", "algo.batch_size=16",
                 "algo.buffer_size=1000", "checkpoint_every=0", "+env.max_episode_steps=40",
                 "+algo.policy_kwargs.critic_layer_norm=true")
    run = tmp_path / "run"
    train(cfg, run)
    from drivemind.training.callbacks import latest_checkpoint

    m = DriveSAC.load(latest_checkpoint(run)["model"], reward_fn=make_reward("drivemind_kinematic"))
    pol = m.policy

    def norms(module):
        return [x for x in module.modules() if isinstance(x, th.nn.LayerNorm)]

    assert pol.critic_layer_norm
    for critic in (pol.critic, pol.critic_target):
        assert len(critic.q_networks) == 2
        for q in critic.q_networks:
            assert [x.normalized_shape for x in norms(q)] == [(128,), (128,)]  # experiment=fast's heads
    assert not norms(pol.actor.latent_pi)
    for q, qt in zip(pol.critic.q_networks, pol.critic_target.q_networks):  # trained, target lags
        w, wt = q[0].weight, qt[0].weight
        assert w.shape == wt.shape and not th.equal(w, wt)
    with pytest.raises(RuntimeError, match="Unexpected key"):  # the heads differ from plain ones
        DriveSAC.load(latest_checkpoint(run)["model"], reward_fn=make_reward("drivemind_kinematic"),
                      custom_objects={"policy_kwargs": {**m.policy_kwargs, "critic_layer_norm": False}})


def test_bench_update_times_the_fast_path_gradient_step_per_batch_size(capsys):
    """`bench.py update`: the real fast-path model, filled by a short real training run, timed per
    batch size and autocast mode; bad options give one error naming the valid ones."""
    bench = load_script("bench")
    res = bench.main(["update", "--town", "grid", "--density", "empty", "--batch-sizes", "16,32",
                      "--autocast", "bf16", "--warmup", "0", "--updates", "2", "--rounds", "2",
                      "--compare-decode", "--profile", "12", "algo.learning_starts=30", "checkpoint_every=0",
                      "device=cpu"])  # a GPU's paths are checked on one (docs/benchmarks.md, stop 58)
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(res))
    # on the CPU the images are always expanded there: --compare-decode adds nothing
    assert res["device"] == "cpu" and res["experiment"] == "fast"
    assert set(res["results"]) == {"fp32_b16", "bf16_b16", "fp32_b32", "bf16_b32"}
    assert {r["decode"] for r in res["results"].values()} == {"cpu"}
    assert {r["codes"] for r in res["results"].values()} == {"host"}  # kept on a GPU only
    for r in res["results"].values():
        assert r["ms_per_update"] > 0 and len(r["rounds_ms"]) == 2
        assert r["ms_per_256_samples"] == pytest.approx(r["ms_per_update"] * 256 / r["batch_size"], rel=0.01)
        assert 0 < r["sample_ms"] < r["ms_per_update"]  # drawing a batch is part of a step
    # --profile K: the K operators with the most self time, matrix products among them (K = 12, not
    # 3: at batch 16-32 on a loaded machine copies and Adam's ops can outrank the products)
    assert len(res["profile"]) == 12 and all(p["calls"] > 0 for p in res["profile"])
    assert [p["self_cpu_ms_per_update"] for p in res["profile"]] == sorted(
        (p["self_cpu_ms_per_update"] for p in res["profile"]), reverse=True)
    assert any(p["op"] in ("aten::addmm", "aten::mm") for p in res["profile"])
    assert res["net_arch"] == [128, 128] and res["torch_threads"] == 1  # experiment=fast's heads
    with pytest.raises(SystemExit, match="must be one of none, bf16"):
        bench.main(["update", "--autocast", "fp8"])
    with pytest.raises(SystemExit, match="integers >= 2"):
        bench.main(["update", "--batch-sizes", "1"])


def test_the_labeller_reads_the_buffer_stats_on_the_first_round_and_every_64th():
    """Labeller.logs runs before every training round; the buffer's stats cost O(buffer), so
    they are read on the first round and every BUFFER_STATS_EVERY-th one, and the rounds between
    log the last reading."""
    from gymnasium import spaces

    from drivemind.agents.labelling import BUFFER_STATS_EVERY, Labeller

    space = spaces.Dict({"x": spaces.Box(-1e6, 1e6, (1,), np.float32)})
    buf = RelabelReplayBuffer(8, space, spaces.Box(-1, 1, (2,), np.float32), fact_keys=("f",))
    reads = []
    real = buf.stats
    buf.stats = lambda: reads.append(1) or real()
    lab = Labeller(make_reward("drivemind_kinematic"))
    first = lab.logs(buf)
    assert first["buffer/megabytes"] > 0 and len(reads) == 1
    buf.add({"x": np.ones((1, 1), np.float32)}, {"x": np.ones((1, 1), np.float32)},
            np.zeros((1, 2)), np.zeros(1), np.array([0]), [{"f": 0.0}])
    for _ in range(BUFFER_STATS_EVERY - 1):
        assert lab.logs(buf) == first  # the reading of round 0
    assert len(reads) == 1
    later = lab.logs(buf)  # round 64 reads again and sees the new row
    assert len(reads) == 2 and later != first
    assert sum(v for k, v in later.items() if k in ("buffer/pending", "buffer/labelled",
                                                     "buffer/invalid")) == 1


def test_the_actor_step_leaves_the_critic_weights_out_of_its_graph_and_updates_as_before(tmp_path):
    """The actor's loss reads the critic through ``q_for_actor``: no gradient reaches the critic
    heads' weights from it (a hook counts one gradient per critic step, not two), and three
    gradient steps give exactly the parameters they gave when the actor's backward also computed
    the critic's weight gradients (``q_from_features``, the old path)."""
    from stable_baselines3.common.logger import Logger

    from drivemind.agents import sac as sac_module
    from drivemind.training.callbacks import latest_checkpoint

    cfg = config("experiment=fast", "town=grid", "logger=quiet", "progress_bar=false",
                 "total_timesteps=120", "algo.learning_starts=60", "algo.batch_size=16",
                 "algo.buffer_size=1000", "+env.max_episode_steps=40")
    run = tmp_path / "run"
    train(cfg, run)
    ckpt = latest_checkpoint(run)

    def three_steps(q_actor):
        m = DriveSAC.load(ckpt["model"], reward_fn=make_reward("drivemind_kinematic"))
        m.load_replay_buffer(ckpt["buffer"])
        m.set_logger(Logger(folder=None, output_formats=[]))
        m.set_random_seed(7)
        calls = []
        head = m.critic.q_networks[0][0].weight
        handle = head.register_hook(lambda g: calls.append(1))
        orig, sac_module.q_for_actor = sac_module.q_for_actor, q_actor
        try:
            m.train(gradient_steps=3, batch_size=16)
        finally:
            sac_module.q_for_actor = orig
            handle.remove()
        return len(calls), [p.detach().clone() for p in m.policy.parameters()]

    calls_new, params_new = three_steps(sac_module.q_for_actor)
    calls_old, params_old = three_steps(sac_module.q_from_features)
    assert (calls_new, calls_old) == (3, 6)  # one gradient per critic step; the old path: two
    assert len(params_new) == len(params_old)
    assert all(th.equal(a, b) for a, b in zip(params_new, params_old))


def test_actor_ema_averages_the_actor_acts_in_evaluation_only_and_survives_a_reload(tmp_path):
    """algo.policy_kwargs.actor_ema=tau: after every gradient step the average moves toward the
    actor by tau (the shared encoder's copy too); the deterministic action is the average's, the
    sampled one (collection) the actor's; a checkpoint keeps the average and tau, and
    actor="online" evaluates the actor itself."""
    tau = 0.25
    env = gym.make("DriveMind-v0", town="grid", density="regular", bev="cpu", features="bev_encoder",
                   max_episode_steps=60)
    m = DriveSAC("DrivePolicy", env, reward_fn=make_reward("drivemind_kinematic"), buffer_size=500,
                 batch_size=32, learning_starts=40, seed=0,
                 policy_kwargs={"features_extractor_class": FeatureExtractor, "net_arch": [32, 32],
                                "actor_ema": tau})
    pol = m.policy
    names = [n for n, _ in pol.actor.named_parameters()]
    assert names == [n for n, _ in pol.actor_ema.named_parameters()]
    assert pol.actor_ema.features_extractor is not pol.actor.features_extractor  # its own copy
    assert all(not p.requires_grad for p in pol.actor_ema.parameters())
    m.learn(100)  # 60 gradient steps
    ema0 = {n: p.detach().clone() for n, p in pol.actor_ema.named_parameters()}
    m.train(gradient_steps=1, batch_size=32)
    online = dict(pol.actor.named_parameters())
    moved = 0
    for n, p in pol.actor_ema.named_parameters():
        th.testing.assert_close(p, ema0[n] + tau * (online[n].detach() - ema0[n]))
        moved += not th.equal(p, ema0[n])
    assert moved >= len(names) - 2  # every trained weight moved (log_std's bias may rest)

    obs, _ = env.reset(seed=3)
    o = pol.obs_to_tensor(obs)[0]
    with th.no_grad():
        det = pol._predict(o, deterministic=True)
        assert th.equal(det, pol.actor_ema(o, deterministic=True))
        assert not th.equal(det, pol.actor(o, deterministic=True))  # the two differ after training
        th.manual_seed(0)
        sampled = pol._predict(o, deterministic=False)
        th.manual_seed(0)
        assert th.equal(sampled, pol.actor(o, deterministic=False))

    m.save(tmp_path / "m.zip")
    back = DriveSAC.load(tmp_path / "m.zip", reward_fn=make_reward("drivemind_kinematic"))
    assert back.policy.actor_ema_tau == tau and back.policy.use_actor_ema
    for (n, p), (_, q) in zip(pol.actor_ema.named_parameters(), back.policy.actor_ema.named_parameters()):
        assert th.equal(p, q), n
    with th.no_grad():
        assert th.equal(back.policy._predict(o, deterministic=True), det)
        back.policy.use_actor_ema = False
        assert th.equal(back.policy._predict(o, deterministic=True), pol.actor(o, deterministic=True))
    env.close()


def test_actor_ema_settings_are_checked():
    from drivemind.training.validate import validate_config

    for bad in ("0", "1.5", "-0.1"):
        with pytest.raises(ValueError, match=r"algo.policy_kwargs.actor_ema.*\(0, 1\]"):
            validate_config(config("experiment=fast", f"algo.policy_kwargs.actor_ema={bad}"))
    with pytest.raises(ValueError, match="actor_ema.*SAC setting"):
        validate_config(config("algo=ppo", "+algo.policy_kwargs.actor_ema=0.01"))
    with pytest.raises(ValueError, match=r"actor_ema must be in \(0, 1\]"):
        _ = DriveSAC("DrivePolicy", gym.make("DriveMind-v0", town="grid", bev="cpu", features="bev_encoder"),
                     reward_fn=make_reward("task"), buffer_size=100,
                     policy_kwargs={"features_extractor_class": FeatureExtractor, "actor_ema": 0.0})
