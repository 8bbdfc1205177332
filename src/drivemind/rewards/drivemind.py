"""DriveMind's full reward (Eq. 3 / A7): task + rho1 HVFR + rho2 AICR + lambda PCFM.

    r_AICR = alpha cos(v_t, u_I,t) - beta cos(v_t, u_P,t)           (alpha = beta = 1/2)
    r_PCFM = cos(M_phi(v_t, a_t), u_I,t)

**Time-indexed prompts.** (u_P,t, u_I,t) are the prompts current when transition t was labelled.
They start as the static anchor ("the car is about to crash" / "no collisions occur", id 0). Each
transition gets its embedding, then the :class:`~drivemind.rewards.novelty.NoveltyDetector` scores
it; on a trigger the prompt generator (privileged teacher by default; SmolVLM distilled online or
an HTTP teacher by config) is asked, **asynchronously** in a background thread, for new prompts,
which are embedded with the encoder's text tower, get a new id, enter the prompt cache (the K
newest; the oldest is evicted) and become current for later transitions. Each transition stores
its prompt id (a replay-buffer column), so re-scoring uses the prompts it was labelled under;
the texts are kept in a bounded bank (``bank_size`` newest sets; a transition whose set was
evicted scores NaN and is never sampled - with the defaults this needs > 4096 triggers inside one
buffer's lifetime).

A trigger while a generation is still running is dropped (counted, ``prompts/skipped_busy``).
Generator output that is not the paper's JSON keeps the cached prompts and is counted
(``prompts/malformed``); a generator that raises (an unreachable HTTP teacher) is counted
(``prompts/errors``), warned about once, and training goes on with the cached prompts.

**PCFM world model.** M_phi is an MLP (v_t, a_t) -> v_{t+1} (hidden 512, two layers), trained with
Adam on the squared error against the stored next embeddings, ``wm_updates`` steps per SAC
training round on ``wm_batch`` transitions (paper: U_WM updates per SAC batch, eta_WM
unspecified; ours 1e-3). The PCFM reward is computed with the model as it is at labelling time.

**Normalisation** (off by default, as in the paper's Eq. 3, which writes raw cosines): AICR is
alpha cos_I - beta cos_P and PCFM cos(M_phi(v, a), u_I). ``normalise=True`` maps both from
[-1, 1] to [0, 1] by (x + 1) / 2 as the static anchor (Eq. 1) is. That was our default until
stop 14, and it is a shaping bug in a per-step reward: with the shipped BEV-CLIP tower the
mapped AICR is 0.55 +- 0.05 on every frame, standing or driving (it moves 0.54 -> 0.60 from 0 to
30 km/h), so it is a constant bonus for staying alive of about 0.55 per step. Against it a crash
costs the discounted stream (about 55 at gamma 0.99) instead of the task's -10, and a policy
learns to stand wherever ``env.idle_time`` does not end the episode (docs/training.md). The raw
value's mean is about +0.1 (the paper's Table 3 reports AICR means of 0.118-0.130).

**Ablations** (Table 2): ``ablate="aicr" | "hvfr" | "pcfm"`` sets that weight to 0 (its term is
neither computed nor logged; with ``pcfm`` the world model is not trained; with ``aicr`` the
prompts still update because PCFM reads u_I).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import OrderedDict, deque

import numpy as np

from ..vlm.prompts import STATIC_PROMPTS, MalformedPrompt, PromptRequest, PromptSet, parse_prompt_json
from .base import Composite, LabelContext, Reward
from .kinematic import HVFR, Task
from .novelty import NoveltyDetector
from .semantic import shared_text_encoder

ABLATIONS = ("none", "aicr", "hvfr", "pcfm")
LOOKUPS = ("latest", "nearest")


class PromptBank:
    """Prompt sets by id (0 = the static anchor) and their text embeddings; the prompt cache (the
    ``cache_size`` newest generated ids, oldest evicted) and which one is current."""

    def __init__(self, static: PromptSet = STATIC_PROMPTS, cache_size: int = 8, bank_size: int = 4096,
                 lookup: str = "latest"):
        if lookup not in LOOKUPS:
            raise ValueError(f"prompt_lookup must be one of {list(LOOKUPS)}, got {lookup!r}")
        if cache_size < 1 or bank_size < cache_size:
            raise ValueError(f"need 1 <= prompt_cache_size <= bank_size, got {cache_size}, {bank_size}")
        self.static, self.cache_size, self.bank_size, self.lookup = static, int(cache_size), int(bank_size), lookup
        self.sets: OrderedDict[int, PromptSet] = OrderedDict({0: static})
        self.keys: dict[int, np.ndarray] = {}  # id -> trigger embedding (for lookup="nearest")
        self.cache: deque[int] = deque([0], maxlen=self.cache_size)
        self.next_id = 1
        self.text_encoder = None
        self._vec: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def current(self) -> int:
        return self.cache[-1]

    def add(self, ps: PromptSet, key: np.ndarray | None = None) -> int:
        i = self.next_id
        self.next_id += 1
        self.sets[i] = ps
        if key is not None:
            self.keys[i] = np.asarray(key, np.float32)
        self.cache.append(i)  # the oldest entry (the static anchor too, eventually) is evicted
        while len(self.sets) > self.bank_size + 1:  # keep the static anchor and the newest sets
            old = next(k for k in self.sets if k != 0)
            del self.sets[old]
            self.keys.pop(old, None)
            self._vec.pop(old, None)
        return i

    def assign(self, v: np.ndarray) -> int:
        """The prompt id for a transition with embedding ``v`` under the lookup policy."""
        if self.lookup == "latest" or len(self.cache) == 1:
            return self.current
        best, dist = self.current, np.inf
        for i in self.cache:
            k = self.keys.get(i)
            if k is not None:
                d = float(np.linalg.norm(k - v))
                if d < dist:
                    best, dist = i, d
        return best

    def vectors(self, ids: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """(u_I, u_P) rows for prompt ids; NaN rows for ids no longer in the bank."""
        ids = np.asarray(ids).astype(np.int64)
        u_i = np.full((len(ids), dim), np.nan)
        u_p = np.full((len(ids), dim), np.nan)
        for i in np.unique(ids):
            if int(i) not in self.sets:
                continue
            vi, vp = self._vectors(int(i))
            m = ids == i
            u_i[m], u_p[m] = vi, vp
        return u_i, u_p

    def _vectors(self, i: int):
        if i not in self._vec:
            enc = self.text_encoder if self.text_encoder is not None else shared_text_encoder()
            ps = self.sets[i]
            u = np.asarray(enc.encode([ps.ideal, ps.present]), np.float64)
            self._vec[i] = (u[0], u[1])
        return self._vec[i]

    def bind(self, text_encoder) -> None:
        self.text_encoder = text_encoder
        self._vec.clear()

    def state_dict(self) -> dict:
        return {"sets": {i: (p.present, p.ideal, list(p.cot), p.source) for i, p in self.sets.items()},
                "keys": dict(self.keys), "cache": list(self.cache), "next_id": self.next_id}

    def load_state_dict(self, s: dict) -> None:
        self.sets = OrderedDict((int(i), PromptSet(p[0], p[1], tuple(p[2]), p[3])) for i, p in s["sets"].items())
        self.keys = {int(i): np.asarray(k, np.float32) for i, k in s.get("keys", {}).items()}
        self.cache = deque([int(i) for i in s["cache"]], maxlen=self.cache_size)
        self.next_id = int(s["next_id"])
        self._vec.clear()


class PromptWorker:
    """Runs the prompt generator in one background thread (``asynchronous``) or inline; at most
    one generation in flight."""

    def __init__(self, generator, asynchronous: bool = True):
        self.generator, self.asynchronous = generator, bool(asynchronous)
        self._lock = threading.Lock()
        self._busy = False
        self._done: list[tuple[str | None, BaseException | None, float, np.ndarray | None]] = []
        self.latencies: deque[float] = deque(maxlen=1000)

    @property
    def busy(self) -> bool:
        return self._busy

    def _run(self, request: PromptRequest, key):
        t0 = time.perf_counter()
        text, err = None, None
        try:
            text = self.generator.generate(request)
        except Exception as e:  # noqa: BLE001 - reported and counted by the caller
            err = e
        dt = time.perf_counter() - t0
        with self._lock:
            self._done.append((text, err, dt, key))
            self._busy = False

    def submit(self, request: PromptRequest, key=None) -> bool:
        """Start a generation; False (nothing started) when one is still running."""
        with self._lock:
            if self._busy:
                return False
            self._busy = True
        if self.asynchronous:
            threading.Thread(target=self._run, args=(request, key), daemon=True,
                             name="drivemind-prompts").start()
        else:
            self._run(request, key)
        return True

    def poll(self):
        with self._lock:
            done, self._done = self._done, []
        for _, _, dt, _ in done:
            self.latencies.append(dt)
        return done

    def wait(self, timeout: float = 30.0) -> None:
        t0 = time.perf_counter()
        while self._busy and time.perf_counter() - t0 < timeout:
            time.sleep(0.005)


class DynamicAICR(Reward):
    """AICR against each transition's own prompts (batch column ``prompt_id``)."""

    name = "aicr"
    needs = ("embedding", "prompt_id")

    def __init__(self, bank: PromptBank, alpha: float = 0.5, beta: float = 0.5, normalise: bool = True):
        for k, w in (("alpha", alpha), ("beta", beta)):
            if not np.isfinite(w):
                raise ValueError(f"{k} must be finite, got {w}")
        self.bank, self.alpha, self.beta, self.normalise = bank, float(alpha), float(beta), bool(normalise)

    def terms(self, b):
        v = b["embedding"]
        u_i, u_p = self.bank.vectors(b["prompt_id"], v.shape[1])
        ideal = self.alpha * _row_cosine(v, u_i)
        present = -self.beta * _row_cosine(v, u_p)
        if self.normalise:
            ideal, present = (ideal + 0.5) / 2, (present + 0.5) / 2
        return {"ideal": ideal, "present": present}


def _row_cosine(v: np.ndarray, u: np.ndarray) -> np.ndarray:
    nv, nu = np.linalg.norm(v, axis=1), np.linalg.norm(u, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((nv > 0) & (nu > 0), np.einsum("ij,ij->i", v, u) / (nv * nu), np.nan)


class WorldModel:
    """M_phi: (v_t, a_t) -> v_{t+1}, an MLP trained with Adam on the squared error."""

    def __init__(self, dim: int, action_dim: int = 2, hidden: int = 512, lr: float = 1e-3, seed: int = 0):
        import torch as th
        from torch import nn

        self.th = th
        g = th.Generator().manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(dim + action_dim, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, dim))
        with th.no_grad():
            for p in self.net.parameters():
                p.copy_(th.empty_like(p).uniform_(-1, 1, generator=g) / np.sqrt(max(p.shape[-1], 1)))
        self.opt = th.optim.Adam(self.net.parameters(), lr=lr)
        self.dim, self.action_dim, self.updates, self.last_loss = dim, action_dim, 0, float("nan")

    def predict(self, v: np.ndarray, a: np.ndarray) -> np.ndarray:
        th = self.th
        with th.no_grad():
            x = th.from_numpy(np.concatenate([v, a], 1).astype(np.float32))
            return self.net(x).numpy().astype(np.float64)

    def update(self, v: np.ndarray, a: np.ndarray, v_next: np.ndarray) -> float:
        th = self.th
        x = th.from_numpy(np.concatenate([v, a], 1).astype(np.float32))
        y = th.from_numpy(np.asarray(v_next, np.float32))
        loss = ((self.net(x) - y) ** 2).sum(1).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.updates += 1
        self.last_loss = float(loss.item())
        return self.last_loss

    def state_dict(self) -> dict:
        return {"net": {k: v.clone() for k, v in self.net.state_dict().items()},
                "opt": self.opt.state_dict(), "updates": self.updates, "dim": self.dim,
                "action_dim": self.action_dim}

    def load_state_dict(self, s: dict) -> None:
        self.net.load_state_dict(s["net"])
        self.opt.load_state_dict(s["opt"])
        self.updates = int(s.get("updates", 0))


class PCFM(Reward):
    """Predictive contrastive foresight: cos(M_phi(v_t, a_t), u_I,t)."""

    name = "pcfm"
    needs = ("obs_embedding", "action", "prompt_id")

    def __init__(self, bank: PromptBank, hidden: int = 512, lr: float = 1e-3, updates: int = 1,
                 batch: int = 256, normalise: bool = True, seed: int = 0):
        if updates < 0 or batch < 1:
            raise ValueError(f"wm_updates must be >= 0 and wm_batch >= 1, got {updates}, {batch}")
        self.bank, self.hidden, self.lr, self.updates, self.batch = bank, hidden, lr, int(updates), int(batch)
        self.normalise, self.seed = bool(normalise), seed
        self.model: WorldModel | None = None
        self._pending_state = None

    def _model(self, dim: int, action_dim: int) -> WorldModel:
        if self.model is None:
            self.model = WorldModel(dim, action_dim, self.hidden, self.lr, self.seed)
            if self._pending_state is not None:
                self.model.load_state_dict(self._pending_state)
                self._pending_state = None
        return self.model

    def terms(self, b):
        v, a = b["obs_embedding"], b["action"]
        if a.ndim == 1:
            a = a[:, None]
        m = self._model(v.shape[1], a.shape[1])
        ok = np.any(v != 0, axis=1) & np.all(np.isfinite(v), axis=1)
        pred = np.zeros_like(v)
        if ok.any():
            pred[ok] = m.predict(v[ok], a[ok])
        u_i, _ = self.bank.vectors(b["prompt_id"], v.shape[1])
        c = np.where(ok, _row_cosine(pred, u_i), np.nan)
        return {"foresight": (c + 1) / 2 if self.normalise else c}

    def learn(self, sampler):
        if not self.updates or sampler is None:
            return {}
        losses = []
        for _ in range(self.updates):
            batch = sampler(self.batch)
            if batch is None:
                break
            v, a, nxt = batch["obs_embedding"], batch["action"], batch["embedding"]
            losses.append(self._model(v.shape[1], a.shape[1]).update(v, a, nxt))
        return {"world_model/loss": float(np.mean(losses))} if losses else {}

    def state_dict(self):
        if self.model is not None:
            return {"world_model": self.model.state_dict()}
        return {"world_model": self._pending_state} if self._pending_state is not None else {}

    def load_state_dict(self, s):
        st = s.get("world_model")
        if st is None:
            return
        if self.model is None:
            self._pending_state = st
        else:
            self.model.load_state_dict(st)


class DriveMind(Composite):
    """See the module docstring. Parameters are the Hydra ``reward.params`` of ``reward=drivemind``
    (``lam`` is the paper's lambda)."""

    columns = {"prompt_id": np.int32}

    def __init__(self, rho1: float = 1.0, rho2: float = 1.0, lam: float = 0.05, ablate: str = "none",
                 present: str = STATIC_PROMPTS.present, ideal: str = STATIC_PROMPTS.ideal,
                 alpha: float = 0.5, beta: float = 0.5, normalise: bool = False,
                 generator: str = "privileged_teacher", generator_kwargs: dict | None = None,
                 asynchronous: bool = True, novelty_capacity: int = 256, novelty_warmup: int = 1000,
                 novelty_quantile: float = 0.99, novelty_threshold: float | None = None,
                 novelty_cooldown: int = 0, prompt_cache_size: int = 8, prompt_lookup: str = "latest",
                 bank_size: int = 4096, wm_hidden: int = 512, wm_lr: float = 1e-3, wm_updates: int = 1,
                 wm_batch: int = 256, seed: int = 0):
        ablate = "none" if ablate in (None, "") else str(ablate)
        if ablate not in ABLATIONS:
            raise ValueError(f"reward.ablate must be one of {list(ABLATIONS)}, got {ablate!r}")
        w = {"hvfr": float(rho1), "aicr": float(rho2), "pcfm": float(lam)}
        if ablate != "none":
            w[ablate] = 0.0
        self.ablate = ablate
        self.bank = PromptBank(PromptSet(present, ideal, source="static"), prompt_cache_size, bank_size,
                               prompt_lookup)
        self.novelty = NoveltyDetector(novelty_capacity, novelty_warmup, novelty_quantile,
                                       novelty_threshold, novelty_cooldown)
        self.generator_name = generator
        self.generator_kwargs = dict(generator_kwargs or {})
        self.asynchronous = asynchronous
        self._worker: PromptWorker | None = None
        self.counts = {"requested": 0, "generated": 0, "malformed": 0, "errors": 0, "skipped_busy": 0}
        self._warned_error = False
        self.last_prompts = STATIC_PROMPTS
        self.aicr = DynamicAICR(self.bank, alpha, beta, normalise)
        self.pcfm = PCFM(self.bank, wm_hidden, wm_lr, wm_updates, wm_batch, normalise, seed)
        Composite.__init__(self, {"task": (1.0, Task()), "hvfr": (w["hvfr"], HVFR()),
                                  "aicr": (w["aicr"], self.aicr), "pcfm": (w["pcfm"], self.pcfm)},
                           name="drivemind")
        # what the replay buffer must provide: only for the parts that are not ablated
        self.needs = tuple(dict.fromkeys(k for wt, r in self.parts.values() if wt != 0.0 for k in r.needs))
        self.columns = {"prompt_id": np.int32} if self.uses_prompts else {}

    # ------------------------------------------------------------------ prompts
    @property
    def uses_prompts(self) -> bool:
        return self.parts["aicr"][0] != 0.0 or self.parts["pcfm"][0] != 0.0

    def worker(self) -> PromptWorker:
        if self._worker is None:
            if self.generator_name == "privileged_teacher" and not self.generator_kwargs:
                from ..vlm.prompts import PrivilegedTeacher
                gen = PrivilegedTeacher()
            else:
                from ..vlm.generators import make_generator
                gen = make_generator(self.generator_name, **self.generator_kwargs)
            if getattr(gen, "stand_in", False):
                warnings.warn(f"DriveMind prompts come from {getattr(gen, 'name', gen)!r}, a stand-in "
                              f"for the paper's GPT-4o-mini/SmolVLM generator (docs/rewards.md)",
                              UserWarning, stacklevel=3)
            self._worker = PromptWorker(gen, self.asynchronous)
        return self._worker

    def _collect(self) -> None:
        if self._worker is None:
            return
        for text, err, _, key in self._worker.poll():
            if err is not None:
                self.counts["errors"] += 1
                if not self._warned_error:
                    warnings.warn(f"the prompt generator failed ({type(err).__name__}: {err}); training "
                                  f"goes on with the cached prompts (counted in prompts/errors)",
                                  UserWarning, stacklevel=3)
                    self._warned_error = True
                continue
            try:
                ps = parse_prompt_json(text)
            except MalformedPrompt:
                self.counts["malformed"] += 1
                continue
            ps = PromptSet(ps.present, ps.ideal, ps.cot, self.generator_name)
            self.bank.add(ps, key)
            self.last_prompts = ps
            self.counts["generated"] += 1

    def prepare(self, ctx: LabelContext) -> dict[str, np.ndarray]:
        n = len(ctx.slots)
        ids = np.zeros(n, np.int32)
        if not self.uses_prompts:
            return {}
        emb = ctx.batch.get("embedding")
        if emb is None:
            raise KeyError("reward 'drivemind' needs image embeddings ('embedding') in the batch")
        facts_keys = [k for k, v in ctx.batch.items() if np.ndim(v) == 1]
        for i in range(n):
            self._collect()
            v = emb[i]
            _, trig = self.novelty.step(v)
            if trig:
                self.counts["requested"] += 1
                frame = ctx.frame(i) if callable(ctx.frame) else {}
                req = PromptRequest(facts={k: float(ctx.batch[k][i]) for k in facts_keys},
                                    bev=frame.get("bev"), rgb=frame.get("rgb"), step=ctx.step)
                if not self.worker().submit(req, key=np.asarray(v, np.float32)):
                    self.counts["skipped_busy"] += 1
                else:
                    self._collect()  # inline generation: the new prompts apply from this step
            ids[i] = self.bank.assign(v)
        return {"prompt_id": ids}

    # ------------------------------------------------------------------ hooks
    def bind_encoder(self, encoder) -> None:
        self.bank.bind(encoder)

    def wait(self, timeout: float = 30.0) -> None:
        """Block until a running generation finished and its prompts are in the cache (tests)."""
        if self._worker is not None:
            self._worker.wait(timeout)
            self._collect()

    def stats(self) -> dict[str, float]:
        out = {f"prompts/{k}": v for k, v in self.counts.items()}
        out["prompts/current_id"] = self.bank.current
        if self._worker is not None and self._worker.latencies:
            out["prompts/generator_ms"] = 1e3 * float(np.mean(self._worker.latencies))
        out.update(self.novelty.stats())
        if self.pcfm.model is not None:
            out["world_model/updates"] = self.pcfm.model.updates
        return out

    def state_dict(self) -> dict:
        return {"bank": self.bank.state_dict(), "novelty": self.novelty.state_dict(),
                "counts": dict(self.counts), "pcfm": self.pcfm.state_dict()}

    def load_state_dict(self, s: dict) -> None:
        if not s:
            return
        self.bank.load_state_dict(s["bank"])
        self.novelty.load_state_dict(s["novelty"])
        self.counts.update(s.get("counts", {}))
        self.pcfm.load_state_dict(s.get("pcfm", {}))

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_worker"] = None  # threads and models are re-created on use
        return state


def drivemind(**kwargs) -> DriveMind:
    return DriveMind(**kwargs)
