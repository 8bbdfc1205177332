"""The relabelling replay buffer, the shared-encoder SAC and the feature extractor.

Observations come from the real env (grid town, 48 px BEV); buffer checks compare what comes back
out of the buffer with what went in, bit for bit.
"""

from __future__ import annotations

import warnings
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.save_util import load_from_zip_file
from stable_baselines3.common.vec_env import DummyVecEnv

import drivemind  # noqa: F401
from drivemind.agents import (INVALID, LABELLED, PENDING, DriveExtractor, DriveSAC,
                              PaletteCodec, RelabelReplayBuffer)
from drivemind.agents.labelling import Labeller
from drivemind.envs import FACT_KEYS
from drivemind.rewards import Reward, make_reward

BEV = {"preset": "cpu", "size": 48, "rgb_size": 32}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_env(**kw):
    return gym.make("DriveMind-v0", town="grid", density="regular", bev=BEV, **kw)


@pytest.fixture(scope="module")
def rollout():
    """(obs, next_obs, action, done, info) per step of two envs stepping together, with SB3's
    conventions: on done, next_obs is the terminal observation and obs restarts from a reset."""
    envs = [make_env(max_episode_steps=37), make_env(max_episode_steps=53)]
    obs = [e.reset(seed=i)[0] for i, e in enumerate(envs)]
    steps = []
    rng = np.random.default_rng(0)
    for t in range(140):
        act = rng.uniform(-0.3, 1.0, (2, 2)).astype(np.float32)
        row = {"obs": obs, "next": [], "done": [], "info": [], "action": act}
        new = []
        for i, e in enumerate(envs):
            o, r, term, trunc, info = e.step(act[i])
            done = term or trunc
            info = dict(info, **({"TimeLimit.truncated": trunc and not term} if done else {}))
            row["next"].append(o)
            row["done"].append(done)
            row["info"].append(info)
            new.append(e.reset()[0] if done else o)
        steps.append(row)
        obs = new
    return envs[0].observation_space, steps


def stack(dicts):
    return {k: np.stack([d[k] for d in dicts]) for k in dicts[0]}


def fill(buf, steps):
    for s in steps:
        buf.add(stack(s["obs"]), stack(s["next"]), s["action"], np.zeros(2), np.array(s["done"]), s["info"])


def test_palette_codec_round_trip(rollout):
    space, steps = rollout
    codec = PaletteCodec(space["bev"].shape, 64)
    for s in steps[::7]:
        x = s["obs"][0]["bev"]
        codes, pal = codec.encode(x)
        assert codes.dtype == np.uint8 and codes.shape == (48 * 48,)
        assert np.array_equal(codec.decode(codes[None], pal[None]).numpy()[0], x)
        scaled = codec.decode(codes[None], pal[None], scaled=True).numpy()[0]
        assert np.allclose(scaled, x / 255.0)
    rich = np.random.default_rng(0).integers(0, 256, (15, 48, 48), dtype=np.uint8)
    assert codec.encode(rich) is None  # more joint values than the palette holds


def test_palette_decode_on_a_device_matches_the_compiled_decode(rollout):
    """The gather that expands codes where the network runs (a GPU's ``sample``) gives the compiled
    CPU decode's values bit for bit, uint8 and scaled to [0, 1]: run here on the CPU through the
    same torch ops, and on CUDA through ``decode(device=...)`` and a buffer's ``_get_samples`` where
    a GPU is present (every field of every stored transition, expanded on the GPU or the CPU)."""
    space, steps = rollout
    codec = PaletteCodec(space["bev"].shape, 64)
    enc = [codec.encode(s["obs"][e]["bev"]) for s in steps[::3] for e in range(2)]
    codes, pals = np.stack([c for c, _ in enc]), np.stack([p for _, p in enc])
    assert len(np.unique(pals.reshape(len(pals), -1), axis=0)) > 1  # frames with different palettes
    devices = ["cpu"] + (["cuda"] if th.cuda.is_available() else [])
    for scaled in (False, True):
        ref = codec.decode(codes, pals, scaled)
        got = codec.decode_torch(th.from_numpy(codes), th.from_numpy(pals), scaled)
        assert got.dtype == ref.dtype and got.shape == ref.shape == (len(codes), *codec.shape)
        assert th.equal(got, ref)
        for dev in devices[1:]:
            on_dev = codec.decode(codes, pals, scaled, device=dev)
            assert on_dev.device.type == dev and th.equal(on_dev.cpu(), ref)
    for dev in devices[1:]:
        bufs = [RelabelReplayBuffer(100, space, gym.spaces.Box(-1, 1, (2,)), device=d, n_envs=2,
                                    scale_images=True) for d in ("cpu", dev)]
        for b in bufs:
            fill(b, steps)
            b.labels[b.labels == PENDING] = LABELLED  # rewards do not matter here
        slots = bufs[0].slots(LABELLED)  # every stored transition, episode ends among them
        assert any(int(s) in bufs[0].terminal for s in slots)
        a = bufs[0]._get_samples(slots)
        for on_device in (True, False):  # through pinned memory, expanded there / on the CPU
            bufs[1].decode_on_device = on_device
            b = bufs[1]._get_samples(slots)
            for side in ("observations", "next_observations"):
                x, y = getattr(a, side), getattr(b, side)
                assert set(x) == set(y)
                for k in x:
                    assert y[k].device.type == dev and th.equal(x[k], y[k].cpu()), (side, k)
            for field in ("actions", "rewards", "dones"):
                x, y = getattr(a, field), getattr(b, field)
                assert y.device.type == dev and th.equal(x, y.cpu()), field


def test_codes_kept_on_the_device_give_the_same_samples_as_the_host_arrays(rollout):
    """``codes_on_device``: the image codes and palettes mirrored where the network runs (a GPU's
    default; forced here on the CPU, the same torch ops) give every sampled field bit for bit as
    the host arrays do, while rows keep being written and overwritten between samples (the ring
    wraps around twice), episode ends included; a pickled buffer (a checkpoint) holds no mirror and
    rebuilds it."""
    import pickle

    space, steps = rollout
    bufs = [RelabelReplayBuffer(60, space, gym.spaces.Box(-1, 1, (2,)), device="cpu", n_envs=2,
                                scale_images=scaled) for scaled in (False, True) for _ in range(2)]
    for b in bufs[1::2]:
        b.codes_on_device = True
    assert all(b.device_codes() is None for b in bufs[::2])  # "auto" on the CPU: not kept twice
    seen_terminal = False
    for start in range(0, len(steps), 20):
        for b in bufs:
            fill(b, steps[start:start + 20])
            b.labels[b.labels == PENDING] = LABELLED
        slots = bufs[0].slots(LABELLED)
        seen_terminal |= any(int(s) in bufs[0].terminal for s in slots)
        for ref, got in (bufs[0:2], bufs[2:4]):
            a, b = ref._get_samples(slots), got._get_samples(slots)
            for side in ("observations", "next_observations"):
                for k in getattr(a, side):
                    assert th.equal(getattr(a, side)[k], getattr(b, side)[k]), (start, side, k)
    assert seen_terminal and bufs[1]._mirror is not None and len(steps) > 2 * 30
    mirrored = bufs[1]
    codes, pals = mirrored.device_codes()["bev"]
    assert np.array_equal(codes.numpy(), mirrored.codes["bev"]) and np.array_equal(pals.numpy(), mirrored.palettes["bev"])
    # the copy's size is logged beside the host arrays' (codes and palettes only)
    assert mirrored.stats()["buffer/device_megabytes"] == pytest.approx(
        (mirrored.codes["bev"].nbytes + mirrored.palettes["bev"].nbytes) / 1e6)
    assert "buffer/device_megabytes" not in bufs[0].stats()
    loaded = pickle.loads(pickle.dumps(mirrored))
    assert loaded._mirror is None and "_mirror" not in loaded.__dict__
    slots = loaded.slots(LABELLED)
    assert th.equal(loaded._get_samples(slots).observations["bev"], bufs[0]._get_samples(slots).observations["bev"])


def _unique_encode(codec, x):
    """The codec's output as np.unique over the pixels gives it (the encoding before the compiled
    one): the palette in ascending byte order, codes its indices."""
    pix = np.ascontiguousarray(x.reshape(codec.C, codec.HW).T)
    uniq, inv = np.unique(pix.view(np.dtype((np.void, codec.C))).ravel(), return_inverse=True)
    pal = np.zeros((codec.P, codec.C), np.uint8)
    pal[:len(uniq)] = uniq.view(np.uint8).reshape(len(uniq), codec.C)
    return inv.astype(np.uint8).ravel(), pal, len(uniq)


def test_palette_codes_are_those_of_sorted_unique_pixels(rollout):
    """The compiled encoder writes exactly what np.unique over the pixels gives (so buffers and
    checkpoints hold the same bytes as before it), on real frames and on frames near the palette's
    size: P distinct values fit, P + 1 do not."""
    space, steps = rollout
    codec = PaletteCodec(space["bev"].shape, 64)
    for s in steps[::5]:
        x = s["obs"][0]["bev"]
        codes, pal = codec.encode(x)
        ref_codes, ref_pal, _ = _unique_encode(codec, x)
        assert np.array_equal(codes, ref_codes) and np.array_equal(pal, ref_pal)
    rng = np.random.default_rng(1)
    small = PaletteCodec((3, 8, 8), 8)
    for k in (1, 2, 7, 8, 9):
        values = rng.integers(0, 256, (k, 3), dtype=np.uint8)
        while len(np.unique(values, axis=0)) < k:
            values = rng.integers(0, 256, (k, 3), dtype=np.uint8)
        pick = np.r_[np.arange(k), rng.integers(0, k, 64 - k)]
        x = np.ascontiguousarray(values[rng.permutation(pick)].T.reshape(3, 8, 8))
        got = small.encode(x)
        if k > 8:
            assert got is None
            continue
        ref_codes, ref_pal, n = _unique_encode(small, x)
        assert n == k and np.array_equal(got[0], ref_codes) and np.array_equal(got[1], ref_pal)
        assert np.array_equal(small.decode(got[0][None], got[1][None]).numpy()[0], x)


def test_buffer_gives_back_every_obs_and_next_obs(rollout):
    space, steps = rollout
    buf = RelabelReplayBuffer(100, space, gym.spaces.Box(-1, 1, (2,)), n_envs=2)  # 50 rows: wraps
    fill(buf, steps)
    assert buf.full
    n_rows = buf.buffer_size
    stored = buf.slots()
    # the row just written next is invalid only for envs whose next obs overwrote it
    assert len(stored) >= 2 * n_rows - 2
    first_t = len(steps) - n_rows
    for slot in stored:
        row, env = divmod(int(slot), 2)
        t = first_t + ((row - buf.pos) % n_rows)
        s = steps[t]
        got, nxt = buf.observation(slot), buf.observation(slot, next=True)
        for k in ("bev", "ego", "waypoints"):
            assert np.array_equal(got[k], s["obs"][env][k]), (k, t, env)
            assert np.array_equal(nxt[k], s["next"][env][k]), (k, t, env, "next")
        facts = buf.facts[row, env]
        assert np.allclose(facts, [s["info"][env][k] for k in FACT_KEYS])
        assert buf.dones[row, env] == s["done"][env]
        assert buf.timeouts[row, env] == float(s["info"][env].get("TimeLimit.truncated", False))
    assert any(buf.dones.ravel()) and buf.terminal  # terminal observations were exercised


def test_memory_layout(rollout):
    space, _ = rollout
    buf = RelabelReplayBuffer(1000, space, gym.spaces.Box(-1, 1, (2,)), n_envs=1, palette_size=64)
    hw, c = 48 * 48, 15
    assert buf.codes["bev"].dtype == np.uint8 and buf.codes["bev"].shape == (1000, 1, hw)
    assert buf.palettes["bev"].shape == (1000, 1, 64, c)
    assert not hasattr(buf, "next_observations")  # next observations are read by index
    per = hw + 64 * c + 4 * (3 + 20) + 2 * 4 + 3 * 4 + 4 * len(FACT_KEYS) + 1  # obs, action, r/done/timeout, facts, label
    assert buf.bytes_per_transition() == pytest.approx(per)
    # the budget: 100k transitions of 15 x 96 x 96 in <= 2 GB
    big = gym.spaces.Dict({"bev": gym.spaces.Box(0, 255, (15, 96, 96), np.uint8),
                           "ego": space["ego"], "waypoints": space["waypoints"]})
    b2 = RelabelReplayBuffer(100, big, gym.spaces.Box(-1, 1, (2,)))
    assert b2.bytes_per_transition() * 100_000 <= 2e9


def test_sample_only_labelled_and_relabel_keeps_observations(rollout):
    space, steps = rollout
    buf = RelabelReplayBuffer(400, space, gym.spaces.Box(-1, 1, (2,)), n_envs=2)
    fill(buf, steps)
    with pytest.raises(RuntimeError, match="no labelled"):
        buf.sample(8)
    pending = buf.slots(PENDING)
    half = pending[: len(pending) // 2]
    buf.label(make_reward("task"), half)
    assert set(buf.slots(LABELLED)) == set(half)
    allowed = set(np.round(buf.rewards.reshape(-1)[half], 5))
    unlabelled_times = set(buf.facts.reshape(-1, len(FACT_KEYS))[buf.slots(PENDING), FACT_KEYS.index("time")])

    class Time(Reward):  # reward = the step's sim time: tells which transitions were sampled
        name, needs = "time", ("time",)

        def terms(self, b):
            return {"t": b["time"]}

    buf.label(Time(), half)
    times = set()
    for _ in range(20):
        times |= set(buf.sample(64).rewards.cpu().numpy().ravel().round(5))
    labelled_times = set(buf.facts.reshape(-1, len(FACT_KEYS))[half, FACT_KEYS.index("time")].round(5))
    assert times <= labelled_times
    assert not times & (set(np.round(list(unlabelled_times), 5)) - labelled_times)
    assert allowed  # the task rewards were real numbers

    # re-weighting re-scores stored facts; observations stay bit-identical
    codes, pals = buf.codes["bev"].copy(), buf.palettes["bev"].copy()
    buf.label_pending(make_reward("chen"))
    r1 = buf.rewards.copy()
    buf.relabel(make_reward("chen", w_speed=3.0))
    assert not np.allclose(r1, buf.rewards)
    facts = buf.fact_batch(buf.slots())
    assert np.allclose(buf.rewards.reshape(-1)[buf.slots()],
                       make_reward("chen", w_speed=3.0)(facts), atol=1e-5)
    assert np.array_equal(codes, buf.codes["bev"]) and np.array_equal(pals, buf.palettes["bev"])


def test_nonfinite_rewards_never_sampled(rollout):
    space, steps = rollout
    buf = RelabelReplayBuffer(400, space, gym.spaces.Box(-1, 1, (2,)), n_envs=2)
    fill(buf, steps[:40])

    class Broken(Reward):
        name, needs = "broken", ("speed_kmh",)

        def terms(self, b):
            return {"bad": np.where(np.arange(len(b["speed_kmh"])) % 2 == 0, np.nan, 1.0)}

    with pytest.warns(UserWarning, match="non-finite"):
        buf.label_pending(Broken())
    assert buf.nonfinite_rewards == 40 and buf.counts()["invalid"] == 40
    assert np.all(buf.labels.reshape(-1)[buf.slots(INVALID)] == INVALID)
    for _ in range(10):
        assert np.all(buf.sample(32).rewards.cpu().numpy() == 1.0)


def test_truncate_last_trajectory_keeps_next_obs(rollout):
    space, steps = rollout
    buf = RelabelReplayBuffer(400, space, gym.spaces.Box(-1, 1, (2,)), n_envs=2)
    fill(buf, steps[:10])
    last = (buf.pos - 1) * 2
    want = buf.observation(last, next=True)
    buf.truncate_last_trajectory()
    assert buf.dones[buf.pos - 1, 0] == 1 and buf.timeouts[buf.pos - 1, 0] == 1
    fill(buf, steps[50:52])  # a new episode starts in the row that held the next obs
    got = buf.observation(last, next=True)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_extractor_shapes_and_errors():
    space = make_env().observation_space
    ext = DriveExtractor(space, bev_dim=32, state_dim=8)
    assert ext.features_dim == 32 + 2 * 8
    obs = {k: th.as_tensor(v[None]).float() for k, v in space.sample().items()}
    assert ext(obs).shape == (1, 48)
    small = gym.spaces.Dict({"bev": gym.spaces.Box(0, 255, (15, 32, 32), np.uint8)})
    with pytest.raises(ValueError, match="36 x 36"):
        DriveExtractor(small)
    with pytest.raises(ValueError, match="'bev'"):
        DriveExtractor(gym.spaces.Dict({"x": gym.spaces.Box(0, 1, (3,))}))


def _sac(venv, reward, **kw):
    pk = dict(net_arch=[32], features_extractor_kwargs=dict(bev_dim=32, state_dim=8))
    kw = {"learning_starts": 40, **kw}
    return DriveSAC(env=venv, reward_fn=reward, buffer_size=1000, batch_size=16, seed=0,
                    device="cpu", policy_kwargs=pk, **kw)


def test_sac_labels_once_label_every_transitions_wait():
    """algo.label_every=k: the stored transitions are labelled once k of them wait (the newest stay
    pending and are never sampled meanwhile); the labels are the reward's, as with k=1."""
    venv = DummyVecEnv([partial(make_env)])
    reward = make_reward("chen")
    m = _sac(venv, reward, learning_starts=20, label_every=5)
    rounds = []
    label = m.label_pending
    m.label_pending = lambda: rounds.append(m.num_timesteps) or label()
    m.learn(47)
    assert rounds == [21, 26, 31, 36, 41, 46]  # the first training round, then every 5 transitions
    buf = m.replay_buffer
    assert buf.counts() == {**buf.counts(), "labelled": 46, "pending": 1}
    slots = buf.slots(LABELLED)
    assert np.allclose(buf.rewards.reshape(-1)[slots], reward(buf.fact_batch(slots)), atol=1e-5)
    with pytest.raises(ValueError, match="label_every"):
        _sac(venv, reward, label_every=0)


def test_sac_trains_on_relabelled_rewards_saves_and_resumes(tmp_path):
    venv = DummyVecEnv([partial(make_env)] * 2)
    reward = make_reward("chen")
    m = _sac(venv, reward)
    enc = m.policy.actor.features_extractor
    assert m.policy.critic.features_extractor is enc  # one shared encoder
    w0 = enc.cnn[0].weight.detach().clone()
    m.learn(200)
    assert not th.equal(w0, enc.cnn[0].weight)  # the critic loss trains the encoder
    buf = m.replay_buffer
    assert buf.counts()["pending"] == 0 and buf.counts()["labelled"] > 150
    slots = buf.slots(LABELLED)
    assert np.allclose(buf.rewards.reshape(-1)[slots], reward(buf.fact_batch(slots)), atol=1e-5)
    # switching the reward re-scores everything stored
    m.set_reward(make_reward("tirl"))
    assert np.all(buf.rewards.reshape(-1)[buf.slots()] <= 0)

    m.save(tmp_path / "m.zip")
    m.save_replay_buffer(tmp_path / "b.pkl")
    m2 = DriveSAC.load(tmp_path / "m.zip", env=venv, reward_fn=make_reward("tirl"), device="cpu")
    m2.load_replay_buffer(tmp_path / "b.pkl")
    assert m2.replay_buffer.counts() == {**buf.counts()}
    obs = venv.reset()
    a1, _ = m.predict(obs, deterministic=True)
    a2, _ = m2.predict(obs, deterministic=True)
    assert np.allclose(a1, a2)
    n = m2.num_timesteps
    m2.learn(40, reset_num_timesteps=False)
    assert m2.num_timesteps == n + 40
    with pytest.warns(UserWarning, match="trained with reward 'tirl'"):
        DriveSAC.load(tmp_path / "m.zip", env=venv, reward_fn=make_reward("chen"), device="cpu")
    m3 = DriveSAC.load(tmp_path / "m.zip", env=venv, device="cpu")
    with pytest.raises(ValueError, match="no reward function.*'tirl'"):
        m3.label_pending()
    # the labeller is not pickled: its fields go in under the names checkpoints have always had,
    # and come back into the labeller (not left as stale attributes of the model)
    data, _, _ = load_from_zip_file(tmp_path / "m.zip", device="cpu")
    assert "labeller" not in data and "reward_fn" not in data
    assert data["reward_name"] == "tirl" and data["embedded_frames"] == 0 and "reward_service" in data
    assert not set(Labeller.SAVED) & set(m2.__dict__)
    assert m3.labeller.reward_name == m3.reward_name == "tirl" and m3.labeller.reward_fn is None


def test_prescaled_batches_match_sb3_preprocessing():
    """The buffer decodes images straight to float in [0, 1]; the critic's Q values on such a
    batch equal SB3's own path (uint8 -> preprocess_obs -> extractor)."""
    venv = DummyVecEnv([partial(make_env)])
    m = _sac(venv, make_reward("chen"), learning_starts=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.learn(31)
    data = m.replay_buffer.sample(8)
    p = m.policy
    f = p.encode(data.observations, scaled=True)
    q_ours = th.cat([q(th.cat([f, data.actions], 1)) for q in p.critic.q_networks], 1)
    # SB3's own critic forward from uint8 observations gives the same Q values
    raw = {k: (v * 255).round().to(th.uint8) if k == "bev" else v for k, v in data.observations.items()}
    q_sb3 = th.cat(p.critic(raw, data.actions), 1)
    assert th.allclose(q_ours, q_sb3, atol=1e-5)
