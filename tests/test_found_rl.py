"""Found-RL's CLIP reward (conditional contrastive action alignment) and the route ``command``
fact it conditions on: discretisation tables, neighbour sets, the 720-prompt library, the margin
and its running normalisation against hand-computed values, and the real encoders on real frames."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from drivemind.rewards import Composite, FoundRLClip, make_reward
from drivemind.rewards.base import LabelContext
from drivemind.rewards.found_rl import (COMMAND_PHRASES, LATERAL, LONGITUDINAL, SPEED_PHRASES,
                                        RunningMeanStd, command_index, lateral_index,
                                        longitudinal_index, neighbour_matrix, speed_index)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class OneHotText:
    """Each prompt -> the one-hot vector of its position in a fixed library, so an image vector's
    entries are exactly its cosines with the prompts (after normalisation)."""

    def __init__(self, library):
        self.index = {p: i for i, p in enumerate(library)}
        self.calls = 0

    def encode(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), len(self.index)))
        out[np.arange(len(texts)), [self.index[t] for t in texts]] = 1.0
        return out


def reward(**kw):
    r = FoundRLClip(**kw)
    r.bind_encoder(OneHotText(r.prompt_texts()))
    return r


def test_discretisation_tables():
    # Table 10: brake first, then throttle bands, else idling
    thr = [0.0, 0.04, 0.06, 0.3, 0.31, 0.8, 0.81, 0.9, 0.0, 0.0, 0.0]
    brk = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.05, 0.3, 0.6]
    lon = [LONGITUDINAL[i] for i in longitudinal_index(thr, brk)]
    assert lon == ["idling", "idling", "accelerating gently", "accelerating gently", "accelerating",
                   "accelerating", "accelerating fast", "accelerating fast", "idling", "braking",
                   "braking hard"]
    # Table 11 (+ right)
    lat = [LATERAL[i] for i in lateral_index([-1, -0.31, -0.3, -0.05, -0.04, 0, 0.049, 0.05, 0.3, 0.31])]
    assert lat == ["turning left sharply", "turning left sharply", "turning left", "turning left",
                   "going straight", "going straight", "going straight", "turning right",
                   "turning right", "turning right sharply"]
    # Table 9 in m/s: 0.1, 2.0, 4.5
    kmh = np.array([0.0, 0.35, 0.37, 7.1, 7.3, 16.1, 16.3, 80.0])
    assert [SPEED_PHRASES[i] for i in speed_index(kmh)] == [
        SPEED_PHRASES[0], SPEED_PHRASES[0], SPEED_PHRASES[1], SPEED_PHRASES[1], SPEED_PHRASES[2],
        SPEED_PHRASES[2], SPEED_PHRASES[3], SPEED_PHRASES[3]]
    # commands: RoadOption codes 1..6; anything else is "follow the current lane"
    assert command_index([1, 2, 3, 4, 5, 6, 0, -1, 7, np.nan]).tolist() == [0, 1, 2, 3, 4, 5, 3, 3, 3, 3]


def test_neighbours():
    n = neighbour_matrix()
    assert n.shape == (30, 30) and (n == n.T).all() and n.diagonal().all()

    def a(lon, lat):
        return LONGITUDINAL.index(lon) * 5 + LATERAL.index(lat)

    assert n[a("braking", "turning left"), a("braking hard", "turning left sharply")]
    assert n[a("accelerating", "going straight"), a("accelerating fast", "going straight")]
    assert n[a("accelerating", "going straight"), a("accelerating gently", "going straight")]
    assert not n[a("accelerating fast", "going straight"), a("accelerating gently", "going straight")]
    assert not n[a("idling", "going straight"), a("braking", "going straight")]
    assert not n[a("idling", "going straight"), a("idling", "turning left")]
    assert not n[a("braking", "turning left"), a("braking", "turning right")]
    # idling and going straight have no neighbours but themselves
    assert n[a("idling", "going straight")].sum() == 1
    # accelerating (2 neighbours + itself) x turning right (1 + itself) = 6
    assert n[a("accelerating", "turning right")].sum() == 6


def test_prompt_library():
    r = FoundRLClip()
    p = r.prompt_texts()
    assert len(p) == 720 and len(set(p)) == 720
    assert p[0] == ("Command: turn left at the intersection. The car is currently stopped. "
                    "The car is braking hard and turning left sharply.")
    # (command, speed, longitudinal, lateral) order
    i = ((4 - 1) * 4 + 2) * 30 + LONGITUDINAL.index("accelerating") * 5 + LATERAL.index("turning right")
    assert p[i] == (f"Command: {COMMAND_PHRASES[4]}. {SPEED_PHRASES[2]}. The car is accelerating "
                    f"and turning right.")
    custom = FoundRLClip(template="{speed} / {command} / {lateral} / {longitudinal}")
    assert custom.prompt_texts()[0] == f"{SPEED_PHRASES[0]} / {COMMAND_PHRASES[1]} / turning left sharply / braking hard"
    # built once per template: every labelling round asks for the library
    assert custom.prompt_texts() is custom.prompt_texts()
    custom.template = "{command} | {speed} | {longitudinal} | {lateral}"
    assert custom.prompt_texts()[0] == f"{COMMAND_PHRASES[1]} | {SPEED_PHRASES[0]} | braking hard | turning left sharply"
    legacy = FoundRLClip()
    del legacy._texts  # a reward pickled before the cache existed
    assert legacy.prompt_texts() == p
    with pytest.raises(ValueError, match="format string"):
        FoundRLClip(template="{command} {steer}")
    with pytest.raises(ValueError, match="tau and eps must be > 0"):
        FoundRLClip(tau=0)


def _batch(cos30, ctx_cmd, ctx_kmh, steer, thr, brk):
    """One row per entry; ``cos30`` (N, 30, |.| <= 1 per row) = the cosines with the 30 prompts of
    the row's context: the rest of the unit vector goes to a prompt of another context."""
    cos30 = np.atleast_2d(cos30)
    n = len(cos30)
    ci = command_index(np.full(n, ctx_cmd)) * 4 + speed_index(np.full(n, ctx_kmh))
    emb = np.zeros((n, 720))
    for k in range(n):
        emb[k, ci[k] * 30:(ci[k] + 1) * 30] = cos30[k]
        emb[k, ((ci[k] + 1) % 24) * 30] = np.sqrt(max(0.0, 1.0 - float(cos30[k] @ cos30[k])))
    return {"embedding": emb, "command": np.full(n, float(ctx_cmd)), "speed_kmh": np.full(n, ctx_kmh),
            "steer": np.full(n, steer), "throttle": np.full(n, thr), "brake": np.full(n, brk)}


def test_margin_by_hand():
    r = reward(tau=1.0)
    # the image is the prompt of "braking and turning left" (context: follow lane, moderate)
    cos = np.zeros(30)
    target = LONGITUDINAL.index("braking") * 5 + LATERAL.index("turning left")
    cos[target] = 1.0
    e = math.e
    b = _batch(cos, 4, 10.0, steer=-0.2, thr=0.0, brk=0.3)  # a_t = braking, turning left
    p = r.probabilities(b)[0]
    assert np.isclose(p[target], e / (e + 29)) and np.isclose(p.sum(), 1.0)
    assert np.isclose(r.raw(b)[0], (e - 1) / (e + 29))
    # a_t = braking hard and turning left sharply: the top action is its neighbour, so it is not a
    # competitor; every competitor has 1 / (e + 29) like a_t itself -> margin 0
    b2 = _batch(cos, 4, 10.0, steer=-0.5, thr=0.0, brk=0.9)
    assert np.isclose(r.raw(b2)[0], 0.0)
    # a_t = idling and going straight: the top action is a competitor -> max(0, negative) = 0
    b3 = _batch(cos, 4, 10.0, steer=0.0, thr=0.0, brk=0.0)
    assert r.raw(b3)[0] == 0.0
    # the context picks the prompt slice: the same cosines under another context are not seen
    b4 = _batch(cos, 1, 10.0, steer=-0.2, thr=0.0, brk=0.3)
    b4["command"][:] = 4.0  # facts say follow lane, the image matches "turn left" prompts
    assert np.isclose(r.raw(b4)[0], 0.0)


def test_margin_matches_a_loop_over_prompts():
    rng = np.random.default_rng(0)
    lib = FoundRLClip().prompt_texts()
    table = {p: rng.normal(size=16) for p in lib}

    class Text:
        def encode(self, texts):
            return np.stack([table[t] for t in texts])

    r = FoundRLClip(tau=7.0, text_encoder=Text())
    n = 40
    b = {"embedding": rng.normal(size=(n, 16)), "command": rng.integers(1, 7, n).astype(float),
         "speed_kmh": rng.uniform(0, 30, n), "steer": rng.uniform(-1, 1, n),
         "throttle": rng.uniform(0, 1, n) * (rng.random(n) < 0.6), "brake": np.zeros(n)}
    b["brake"] = np.where(b["throttle"] == 0, rng.uniform(0, 1, n), 0.0)
    nb = neighbour_matrix()
    want = []
    for k in range(n):
        c = int(b["command"][k])
        s = int(speed_index(b["speed_kmh"][k]))
        prompts = [r.template.format(command=COMMAND_PHRASES[c], speed=SPEED_PHRASES[s],
                                     longitudinal=lo, lateral=la) for lo in LONGITUDINAL for la in LATERAL]
        u = np.stack([table[p] / np.linalg.norm(table[p]) for p in prompts])
        x = b["embedding"][k] / np.linalg.norm(b["embedding"][k])
        z = np.exp(7.0 * (u @ x))
        p = z / z.sum()
        a = int(longitudinal_index(b["throttle"][k], b["brake"][k]) * 5 + lateral_index(b["steer"][k]))
        comp = max(p[j] for j in range(30) if not nb[a, j])
        want.append(max(0.0, p[a] - comp))
    assert np.allclose(r.raw(b), want)
    assert (np.array(want) > 0).any() and (np.array(want) == 0).any()


def test_running_normalisation_and_state():
    rms = RunningMeanStd()
    rng = np.random.default_rng(1)
    chunks = [rng.normal(2, 3, k) for k in (1, 5, 50, 7)]
    for c in chunks:
        rms.update(np.r_[c, np.nan])
    allv = np.concatenate(chunks)
    assert rms.count == 63 and np.isclose(rms.mean, allv.mean()) and np.isclose(rms.var, allv.var())

    r = reward(tau=1.0)
    target = LONGITUDINAL.index("braking") * 5 + LATERAL.index("turning left")
    rows = []
    for strength in (1.0, 0.5, 0.0, 0.9):
        cos = np.zeros(30)
        cos[target] = strength
        rows.append(cos)
    b = _batch(np.stack(rows), 4, 10.0, steer=-0.2, thr=0.0, brk=0.3)
    raw = r.raw(b)
    e = np.exp([1.0, 0.5, 0.0, 0.9])
    assert np.allclose(raw, (e - 1) / (e + 29))
    # prepare (the buffer's labelling hook) updates the statistics once; scoring uses them
    r.prepare(LabelContext(np.arange(4), b))
    assert r.rms.count == 4 and np.isclose(r.rms.mean, raw.mean())
    want = np.clip((raw - raw.mean()) / np.sqrt(raw.var() + 1e-8), -1, 1)
    assert np.allclose(r(b), want) and r.rms.count == 4  # re-scoring does not count again
    assert np.abs(want).max() == 1.0 and (np.abs(want) < 1).any()  # z = 1.11, -0.43, -1.42, 0.75
    # a reward that never sees prepare (a plain call, PPO) updates on each call
    plain = reward(tau=1.0)
    plain(b)
    plain(b)
    assert plain.rms.count == 8
    # state round trip (checkpoint)
    fresh = reward(tau=1.0)
    fresh.load_state_dict(pickle.loads(pickle.dumps(r.state_dict())))
    assert np.allclose(fresh(b), want) and fresh.rms.count == 4
    assert set(r.stats()) == {"found_rl/raw_mean", "found_rl/raw_std", "found_rl/count"}
    # never-embedded frames: NaN, not counted
    zero = dict(b, embedding=np.zeros((4, 720)))
    assert np.isnan(r(zero)).all()
    r.prepare(LabelContext(np.arange(4), zero))
    assert r.rms.count == 4


def test_found_rl_clip_composite():
    full = make_reward("found_rl_clip", lam=0.5, tau=1.0)
    assert isinstance(full, Composite) and full.name == "found_rl_clip"
    clip = full.parts["clip"][1]
    full.bind_encoder(OneHotText(clip.prompt_texts()))
    cos = np.zeros((3, 30))
    cos[:, 7] = [1.0, 0.0, 0.6]
    b = _batch(cos, 4, 10.0, steer=0.0, thr=0.0, brk=0.3)  # a_t = braking, going straight (5 + 2 = 7)
    b.update(progress=np.array([0.5, 0.2, 0.0]), failure=np.array([0.0, 0.0, 1.0]))
    terms = full.explain(b)
    assert set(terms) == {"task.progress", "task.failure", "clip.bonus"}
    assert np.allclose(full(b), b["progress"] - 10 * b["failure"] + terms["clip.bonus"])
    assert np.all(np.abs(terms["clip.bonus"]) <= 0.5)
    with pytest.raises(TypeError, match="unknown parameter"):
        make_reward("found_rl_clip", lambda_=0.1)
    with pytest.raises(KeyError, match="command"):
        clip.explain({k: v for k, v in b.items() if k != "command"})


# ---------------------------------------------------------------------------------- the fact
def test_route_commands_synthetic():
    from types import SimpleNamespace

    from drivemind.envs.tracker import route_commands
    from drivemind.maps.routing import Route

    # lanes: 0 -> (change left to) 1 -> junction lane 2 (turns right by 90 degrees) -> 3
    n = 100
    lanes = np.r_[np.zeros(30), np.ones(30), np.full(20, 2), np.full(20, 3)].astype(np.int64)
    yaw = np.r_[np.zeros(60), np.linspace(0, np.pi / 2, 20), np.full(20, np.pi / 2)]
    pts = np.stack([np.arange(n, dtype=float), np.zeros(n)], 1)
    route = Route([], pts, yaw, np.arange(n, dtype=float), lanes)
    rm = SimpleNamespace(junction=np.array([-1, -1, 7, -1]), left=np.array([1, -1, -1, -1]),
                         right=np.array([-1, -1, -1, -1]))
    cmd = route_commands(route, rm, horizon=10.0)
    assert (cmd[:20] == 4).all()  # follow the lane until 10 m before the change
    assert (cmd[20:31] == 5).all()  # change left (event at point 30)
    assert (cmd[31:50] == 4).all()
    assert (cmd[50:80] == 2).all()  # right turn: from 10 m before the junction until it is left
    assert (cmd[80:] == 4).all()
    rm.left[0], rm.right[0] = -1, 1
    assert (route_commands(route, rm, horizon=10.0)[20:31] == 6).all()
    route.yaw[60:] = -route.yaw[60:]  # the junction now turns left
    assert (route_commands(route, rm, horizon=10.0)[50:80] == 1).all()
    route.yaw[60:] = 0.2  # ~11 degrees: straight on
    assert (route_commands(route, rm, horizon=10.0)[50:80] == 3).all()


def test_command_fact_follows_the_expert_steering():
    """Real env, built-in grid town: the expert steers left under 'left' and right under 'right'."""
    import gymnasium as gym

    import drivemind  # noqa: F401
    from drivemind.envs import FACT_KEYS
    assert "command" in FACT_KEYS
    env = gym.make("DriveMind-v0", town="grid", density="empty", bev="cpu")
    obs, info = env.reset(seed=1)
    steer = {c: [] for c in range(1, 7)}
    for _ in range(1200):
        obs, _, term, trunc, info = env.step(env.unwrapped.expert_action())
        steer[int(info["command"])].append(info["steer"])
        if term or trunc:
            obs, info = env.reset()
    assert len(steer[1]) > 50 and len(steer[2]) > 50 and len(steer[4]) > 50
    assert np.mean(steer[1]) < -0.02 and np.mean(steer[2]) > 0.02

