"""MindDrive (seed 002): a language-action policy on one small causal LM with two LoRA adapters.

* **Decision expert** (LoRA adapter ``decision``): reads a scene prompt written from the env's
  per-step facts and scores every meta-action of the fixed set (``META_ACTIONS``: a speed
  meta-action and a path meta-action, e.g. ``"slow down , turn left"``) by the LM's
  log-likelihood of the candidate's tokens; a softmax over those scores is the policy's
  distribution over meta-actions (what PPO in language space works on). A value head on the
  prompt's last hidden state is the critic.
* **Action expert** (LoRA adapter ``action``): reads the scene and the chosen meta-action and
  outputs a short trajectory: the speed set-point one second ahead (``action_horizon``) along the
  route's waypoints (``obs["waypoints"]``); :func:`track` turns it into the env's controls
  (pure pursuit on the waypoints for steering, a feed-forward speed controller for
  throttle/brake). The route fixes the path geometry (its turns and lane changes are in the
  waypoints), so the path meta-action informs the action expert but does not move the path.

Meta-actions for supervised fine-tuning come from the autopilot's behaviour
(:func:`derive_meta_action`: speed class from the expert's speed change over the horizon, path
class from the route ``command`` fact). The LM is either a tiny random-weight Qwen2 built offline
with a word-level tokenizer over the prompts' fixed vocabulary (``model.path: tiny``) or a local
checkpoint (Qwen2-0.5B in the paper) through :func:`load_lm`; nothing is downloaded.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
from dataclasses import asdict, dataclass, field

import numpy as np
import torch as th
from torch import nn
from torch.nn import functional as F

SPEED_ACTIONS = ("speed up", "slow down", "slow down rapidly", "maintain slow", "maintain moderate",
                 "maintain fast", "stop")
PATH_ACTIONS = ("turn left", "turn right", "change lane left", "change lane right", "straight",
                "lane follow")
META_ACTIONS = tuple(f"{s} , {p}" for s in SPEED_ACTIONS for p in PATH_ACTIONS)
# the route command fact (envs/tracker.py COMMANDS) -> path meta-action
COMMAND_PATH = {1: "turn left", 2: "turn right", 3: "straight", 4: "lane follow",
                5: "change lane left", 6: "change lane right"}
LIGHTS = {-1: "none", 0: "green", 1: "yellow", 2: "red", 3: "none"}

# speed classes (m/s, m/s^2): what the derivation calls stopping, a rapid / a plain slow-down, a
# speed-up, and the slow / moderate / fast bands of a maintained speed (urban: limit 30 km/h)
STOP_SPEED = 0.5
RAPID_DECEL = -2.5
DECEL = -0.5
ACCEL = 0.5
SLOW_BELOW = 3.0
FAST_ABOVE = 6.5

MODEL_FILES = (("config.json",), ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"),
               ("tokenizer.json", "tokenizer_config.json"))
SCENES = ("facts",)
DEFAULT_ID = "Qwen/Qwen2-0.5B"
ENV_VAR = "DRIVEMIND_MINDDRIVE_MODEL"


# ----------------------------------------------------------------------------- meta-actions
def speed_class(v_now: float, v_next: float, horizon: float) -> str:
    """The speed meta-action for a change from ``v_now`` to ``v_next`` m/s over ``horizon`` s."""
    if horizon <= 0:
        raise ValueError(f"horizon must be positive, got {horizon}")
    if v_next < STOP_SPEED and v_now < STOP_SPEED + 1.0:
        return "stop"
    acc = (v_next - v_now) / horizon
    if acc <= RAPID_DECEL:
        return "slow down rapidly"
    if acc <= DECEL:
        return "slow down"
    if acc >= ACCEL:
        return "speed up"
    if v_next < SLOW_BELOW:
        return "maintain slow"
    return "maintain fast" if v_next > FAST_ABOVE else "maintain moderate"


def speed_band(speed_action: str, v_now: float, horizon: float) -> tuple[float, float]:
    """The set-points (m/s) that mean ``speed_action`` when driving at ``v_now``: those that
    :func:`speed_class` labels with it (the labels SFT learnt from), shrunk by 1 mm/s at the
    edges. A maintained class whose speed band is out of reach of a steady speed (``maintain
    slow`` at 8 m/s) gives its speed band: the meta-action then means driving in that band."""
    if horizon <= 0:
        raise ValueError(f"horizon must be positive, got {horizon}")
    e, inf = 1e-3, float("inf")
    v = max(float(v_now), 0.0)
    if speed_action == "stop":
        return 0.0, 0.0
    if speed_action == "slow down rapidly":
        return 0.0, max(v + RAPID_DECEL * horizon, 0.0)
    if speed_action == "slow down":
        return max(v + RAPID_DECEL * horizon + e, 0.0), max(v + DECEL * horizon, 0.0)
    if speed_action == "speed up":
        return max(v + ACCEL * horizon, STOP_SPEED), inf
    bands = {"maintain slow": (STOP_SPEED, SLOW_BELOW - e), "maintain moderate": (SLOW_BELOW, FAST_ABOVE),
             "maintain fast": (FAST_ABOVE + e, inf)}
    if speed_action not in bands:
        raise ValueError(f"unknown speed meta-action {speed_action!r}; valid: {', '.join(SPEED_ACTIONS)}")
    lo, hi = bands[speed_action]
    steady = max(lo, v + DECEL * horizon + e), min(hi, v + ACCEL * horizon - e)
    return steady if steady[0] <= steady[1] else (lo, hi)


def grounded_set_point(v_target: float, meta: str, v_now: float, horizon: float) -> float:
    """The action expert's set-point moved into the band its meta-action's speed part means
    (:func:`speed_band`), so a meta-action the decision expert picks always has its effect."""
    lo, hi = speed_band(meta.split(" , ")[0], v_now, horizon)
    return float(min(max(float(v_target), lo), hi))


def feasible_mask(v_now: float, horizon: float) -> np.ndarray:
    """Which of ``META_ACTIONS`` the SFT labelling can produce at speed ``v_now``: a speed class
    whose grounded set-point (:func:`speed_band`) :func:`speed_class` calls by that class (at
    rest: only ``stop`` and ``speed up``; ``slow down`` needs speed to lose)."""
    ok = {}
    for speed in SPEED_ACTIONS:
        lo, hi = speed_band(speed, v_now, horizon)
        v1 = lo if math.isinf(hi) else 0.5 * (lo + hi)
        ok[speed] = speed_class(v_now, v1, horizon) == speed
    return np.array([ok[m.split(" , ")[0]] for m in META_ACTIONS], bool)


def path_class(command: float) -> str:
    c = int(round(command))
    if c not in COMMAND_PATH:
        raise ValueError(f"unknown route command {command!r}; valid: {sorted(COMMAND_PATH)}")
    return COMMAND_PATH[c]


def derive_meta_action(v_now: float, v_next: float, command: float, horizon: float) -> str:
    """The expert's meta-action: speed class from its speed change over ``horizon`` seconds, path
    class from the route command."""
    return f"{speed_class(v_now, v_next, horizon)} , {path_class(command)}"


def scene_prompt(facts: dict, lead_range: float = 50.0) -> str:
    """The scene in words from the per-step facts (numbers rounded; the prompts' vocabulary is
    fixed, so a word-level tokenizer covers it)."""
    parts = [f"speed {int(round(facts['speed_kmh']))} km/h",
             f"command {path_class(facts['command'])}"]
    ls = LIGHTS.get(int(facts.get("light_state", -1)), "none")
    parts.append("light none" if ls == "none" else
                 f"light {ls} at {int(round(facts['light_distance']))} m")
    ld = float(facts.get("lead_distance", lead_range))
    parts.append("lead none" if ld >= lead_range - 1e-6 else
                 f"lead {int(round(ld))} m at {int(round(facts['lead_speed_kmh']))} km/h")
    parts.append(f"goal {int(min(round(facts['route_remaining']), 9999))} m")
    parts.append(f"offset {facts['lateral_offset']:.1f} m")
    return "scene : " + " . ".join(parts) + " . decision :"


def action_prompt(scene: str, meta: str) -> str:
    return f"{scene} {meta} . action :"


# ----------------------------------------------------------------------------- tokenizer + LM
def word_tokenizer():
    """A word-level tokenizer (``tokenizers`` WordLevel, digits split one by one) over the fixed
    vocabulary of the scene prompts and meta-actions, wrapped in ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                   pre_tokenizers.Digits(individual_digits=True)])
    texts = list(META_ACTIONS) + [
        "scene : speed km/h . command light none green yellow red at m lead goal offset - . "
        "decision : action :", *[str(d) for d in range(10)]]
    words = []
    for t in texts:
        for w, _ in pre.pre_tokenize_str(t):
            if w not in words:
                words.append(w)
    specials = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
    vocab = {w: i for i, w in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   bos_token="[BOS]", eos_token="[EOS]")


@dataclass
class LMConfig:
    path: str = "tiny"  # "tiny" (random Qwen2 built offline) or a local folder / hub id in the cache
    hidden_size: int = 64  # tiny model only
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 128
    # weight std of the tiny random base: with transformers' 0.02 the frozen tied embeddings are
    # so short that no logit can dominate and LoRA cannot make a meta-action likely
    init_std: float = 0.3
    lora_rank: int = 16  # the paper: rank 16, alpha 16
    lora_alpha: int = 16
    lora_targets: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"])

    @classmethod
    def from_dict(cls, d: dict | None) -> "LMConfig":
        d = dict(d or {})
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"unknown algo.model option(s) {bad}; valid: {sorted(known)}")
        return cls(**d)


def load_lm(cfg: LMConfig, seed: int = 0):
    """(base causal LM, tokenizer, folder or None). ``tiny``: a random-weight Qwen2 and the word
    tokenizer, built offline; otherwise the checkpoint's folder (``cfg.path``, then
    ``$DRIVEMIND_MINDDRIVE_MODEL``, then the Hugging Face cache) with one clear error naming
    where it looked when it is missing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    if cfg.path == "tiny":
        tok = word_tokenizer()
        th.manual_seed(seed)
        conf = Qwen2Config(vocab_size=len(tok), hidden_size=cfg.hidden_size,
                           intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.layers,
                           num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                           max_position_embeddings=256, tie_word_embeddings=True,
                           initializer_range=cfg.init_std,
                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                           eos_token_id=tok.eos_token_id)
        return Qwen2ForCausalLM(conf), tok, None
    from ..vlm.smolvlm import resolve_model_folder

    folder = resolve_model_folder(cfg.path, default_id=DEFAULT_ID, env_var=ENV_VAR,
                                  what="MindDrive language model", need=MODEL_FILES,
                                  hint="Or use algo.model.path=tiny (a random tiny LM, for tests).")
    tok = AutoTokenizer.from_pretrained(folder)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=th.float32)
    return model, tok, folder


@functools.lru_cache(maxsize=None)
def _cache_kw() -> str:
    """The causal LMs' keyword (and output field) for a key/value cache: ``cache`` in recent
    transformers, ``past_key_values`` before (an unknown keyword would be swallowed by
    ``**kwargs``)."""
    import inspect

    from transformers import Qwen2ForCausalLM
    return "cache" if "cache" in inspect.signature(Qwen2ForCausalLM.forward).parameters \
        else "past_key_values"


class MindDriveLM(nn.Module):
    """The causal LM with the ``decision`` and ``action`` LoRA adapters (PEFT), the decision
    expert's value head and the action expert's trajectory head."""

    def __init__(self, cfg: LMConfig, seed: int = 0):
        super().__init__()
        from peft import LoraConfig, get_peft_model

        self.cfg = cfg
        base, self.tok, self.folder = load_lm(cfg, seed)
        for p in base.parameters():
            p.requires_grad_(False)

        def lora():
            return LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                              target_modules=list(cfg.lora_targets), lora_dropout=0.0)
        self.lm = get_peft_model(base, lora(), adapter_name="decision")
        self.lm.add_adapter("action", lora())
        h = base.config.hidden_size
        self.value_head = nn.Linear(h, 1)
        # zero at the start of PPO: before the critic has learnt anything, a rollout without a
        # reward event has zero advantages instead of the random head's noise
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        self.action_head = nn.Sequential(nn.Linear(h, 64), nn.Tanh(), nn.Linear(64, 1))
        self.eos = self.tok.eos_token_id
        self.cand_ids = [self._ids(" " + m) + [self.eos] for m in META_ACTIONS]
        self._cand = self._batch(self.cand_ids)  # (M x L right-padded ids, mask)
        self.bos = [self.tok.bos_token_id] if self.tok.bos_token_id is not None else []

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def adapter_params(self, name: str):
        return [p for n, p in self.lm.named_parameters() if f".{name}." in n and "lora_" in n]

    def _batch(self, seqs: list[list[int]]):
        n = max(len(s) for s in seqs)
        ids = th.full((len(seqs), n), self.tok.pad_token_id, dtype=th.long)
        mask = th.zeros((len(seqs), n), dtype=th.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = th.tensor(s)
            mask[i, :len(s)] = 1
        return ids, mask

    def _run(self, seqs: list[list[int]], adapter: str):
        self.lm.set_adapter(adapter)  # also makes that adapter's weights trainable
        ids, mask = self._batch(seqs)
        out = self.lm(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        return out.logits, out.hidden_states[-1], ids

    def decide(self, prompts: list[str], adapter: str = "decision", allowed=None):
        """(log-probabilities over ``META_ACTIONS`` (B x M), values (B)). Each candidate's score is
        the sum of the LM's log-likelihoods of its tokens after the prompt; the distribution is
        the softmax of the scores over the fixed set.

        The prompt is run once and its key/value cache is shared by the M candidates (each prompt
        row repeated M times), so a batch costs B prompt passes plus B x M passes over the few
        candidate tokens, not B x M passes over prompt + candidate (the same numbers:
        tests/test_minddrive.py checks them against the full sequences). ``allowed`` (B x M bool):
        the meta-actions allowed per prompt; the others get probability 0."""
        m = len(META_ACTIONS)
        b = len(prompts)
        pids = [self.bos + self._ids(p) for p in prompts]
        self.lm.set_adapter(adapter)  # also makes that adapter's weights trainable
        ids, mask = self._batch(pids)  # right-padded: real tokens keep positions 0..len-1
        out = self.lm(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=True)
        plen = mask.sum(1)
        rows = th.arange(b)
        last = out.hidden_states[-1][rows, plen - 1]
        # the first candidate token is scored by the prompt's last position
        first = F.log_softmax(out.logits[rows, plen - 1].float(), -1)  # B x V
        cand, cmask = self._cand
        scores = first[:, cand[:, 0]]  # B x M
        if cand.shape[1] > 1:
            cache = getattr(out, _cache_kw())
            cache.batch_repeat_interleave(m)  # row i * m + j: prompt i, candidate j
            inp = cand[:, :-1].repeat(b, 1)
            att = th.cat([mask.repeat_interleave(m, 0), cmask[:, :-1].repeat(b, 1)], 1)
            pos = plen.repeat_interleave(m)[:, None] + th.arange(inp.shape[1])[None]
            out2 = self.lm(input_ids=inp, attention_mask=att, position_ids=pos, use_cache=True,
                           **{_cache_kw(): cache})
            tgt = cand[:, 1:].repeat(b, 1)
            lp = F.log_softmax(out2.logits.float(), -1).gather(2, tgt[..., None]).squeeze(2)
            scores = scores + (lp * cmask[:, 1:].repeat(b, 1)).sum(1).view(b, m)
        if allowed is not None:  # a large finite negative: 0 * (logp_ref - logp) stays 0 in the KL
            scores = scores.masked_fill(~th.as_tensor(np.asarray(allowed), dtype=th.bool), -1e9)
        return F.log_softmax(scores, -1), self.value_head(last.float()).squeeze(-1)

    def sft_decision_loss(self, prompts: list[str], metas: list[str]):
        """Token-level next-token loss of the expert's meta-action after the prompt (SFT)."""
        seqs, spans = [], []
        for p, a in zip(prompts, metas):
            pi = self.bos + self._ids(p)
            seqs.append(pi + self._ids(" " + a) + [self.eos])
            spans.append(len(pi))
        logits, _, _ = self._run(seqs, "decision")
        losses = []
        for i, s in enumerate(seqs):
            lp = spans[i]
            losses.append(F.cross_entropy(logits[i, lp - 1:len(s) - 1].float(), th.tensor(s[lp:])))
        return th.stack(losses).mean()

    def trajectory(self, prompts: list[str], metas: list[str]):
        """The action expert's speed set-point (in units of 10 m/s) for each (scene, meta-action)."""
        seqs = [self.bos + self._ids(action_prompt(p, m)) for p, m in zip(prompts, metas)]
        _, hid, _ = self._run(seqs, "action")
        last = th.stack([hid[i, len(s) - 1] for i, s in enumerate(seqs)])
        return self.action_head(last.float()).squeeze(-1)

    # ------------------------------------------------------------------ state
    def trainable_state(self) -> dict:
        from peft import get_peft_model_state_dict
        st = {f"lora.{a}.{k}": v for a in ("decision", "action")
              for k, v in get_peft_model_state_dict(self.lm, adapter_name=a).items()}
        st.update({f"value_head.{k}": v for k, v in self.value_head.state_dict().items()})
        st.update({f"action_head.{k}": v for k, v in self.action_head.state_dict().items()})
        if self.folder is None:  # tiny random base: its weights are part of the policy
            st.update({f"base.{k}": v for k, v in self.lm.get_base_model().state_dict().items()
                       if "lora_" not in k})
        return {k: v.detach().clone() for k, v in st.items()}

    def load_trainable_state(self, st: dict):
        from peft import set_peft_model_state_dict
        if self.folder is None:
            base = {k[5:]: v for k, v in st.items() if k.startswith("base.")}
            if not base:
                raise ValueError("this checkpoint has no base weights for the tiny model")
            missing = self.lm.get_base_model().load_state_dict(base, strict=False).missing_keys
            bad = [k for k in missing if "lora_" not in k]
            if bad:
                raise ValueError(f"checkpoint lacks base weights {bad[:5]}")
        for a in ("decision", "action"):
            pre = f"lora.{a}."
            set_peft_model_state_dict(self.lm, {k[len(pre):]: v for k, v in st.items()
                                                if k.startswith(pre)}, adapter_name=a)
        self.value_head.load_state_dict({k[11:]: v for k, v in st.items() if k.startswith("value_head.")})
        self.action_head.load_state_dict({k[12:]: v for k, v in st.items() if k.startswith("action_head.")})


# ----------------------------------------------------------------------------- controller
def track(waypoints: np.ndarray, speed: float, v_target: float, wp_scale: float, wheelbase: float,
          max_steer: float, accel_max: float, brake_max: float, rolling: float = 0.15,
          drag: float = 0.0012, horizon: float = 1.0) -> np.ndarray:
    """The env's controls that track the trajectory: the route's waypoints (ego frame
    (forward, right), scaled by ``1 / wp_scale``) at the speed set-point ``v_target`` m/s.
    Steering: pure pursuit on the point ``3 + 0.6 v`` m (4..12) along the waypoints; speed:
    the acceleration that reaches the set-point in ``horizon`` s, as throttle/brake."""
    wp = np.asarray(waypoints, np.float64).reshape(-1, 2) * wp_scale
    pts = np.vstack([[0.0, 0.0], wp])
    seg = np.hypot(*np.diff(pts, axis=0).T)
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    ld = float(np.clip(3.0 + 0.6 * speed, 4.0, 12.0))
    if cum[-1] < 1e-3:
        lx, ly = 1.0, 0.0
    else:
        d = min(ld, cum[-1])
        lx, ly = np.interp(d, cum, pts[:, 0]), np.interp(d, cum, pts[:, 1])
    alpha = math.atan2(ly, max(lx, 1e-3))
    delta = math.atan2(2.0 * wheelbase * math.sin(alpha), max(math.hypot(lx, ly), 1e-3))
    steer = float(np.clip(delta / max_steer, -1.0, 1.0))
    v_target = max(float(v_target), 0.0)
    acc = (v_target - speed) / horizon
    if v_target < STOP_SPEED:
        tb = -1.0 if speed < 1.0 else max(acc / brake_max, -1.0)
    elif acc >= 0:
        tb = (acc + rolling + drag * speed * speed) / accel_max
    else:
        tb = acc / brake_max
    return np.array([steer, float(np.clip(tb, -1.0, 1.0))], np.float32)


# ----------------------------------------------------------------------------- PPO pieces
def ppo_clip_loss(logp_new: th.Tensor, logp_old: th.Tensor, adv: th.Tensor, clip: float = 0.2):
    """PPO's clipped surrogate (to minimise): -mean(min(r A, clip(r, 1-e, 1+e) A))."""
    ratio = th.exp(logp_new - logp_old)
    return -th.min(ratio * adv, th.clamp(ratio, 1 - clip, 1 + clip) * adv).mean()


def kl_ref_policy(logp_ref: th.Tensor, logp: th.Tensor) -> th.Tensor:
    """KL(reference || policy) over the meta-action set, averaged over the batch (rows of
    log-probabilities)."""
    p_ref = logp_ref.exp()
    return (p_ref * (logp_ref - logp)).sum(-1).mean()


def gae(rewards, values, dones, last_value: float, gamma: float = 0.99, lam: float = 1.0):
    """(advantages, returns) by generalised advantage estimation; ``dones[t]`` ends the episode
    after step t (no bootstrap past it)."""
    n = len(rewards)
    adv = np.zeros(n, np.float64)
    nxt_adv, nxt_v = 0.0, float(last_value)
    for t in reversed(range(n)):
        nonterm = 0.0 if dones[t] else 1.0
        delta = rewards[t] + gamma * nxt_v * nonterm - values[t]
        nxt_adv = delta + gamma * lam * nonterm * nxt_adv
        adv[t] = nxt_adv
        nxt_v = values[t]
    return adv, adv + np.asarray(values, np.float64)


def event_reward(info: dict) -> float:
    """MindDrive's online reward for one env step: +1 on arrival, -1 on a penalty event
    (collision, red light run, route deviation: the env's off-route termination), else 0."""
    r = 0.0
    if info.get("arrived"):
        r += 1.0
    if info.get("collision", 0.0) or info.get("red_light_run", 0.0) \
            or info.get("termination") == "off_route":
        r -= 1.0
    return r


# ----------------------------------------------------------------------------- the agent
@dataclass
class MindDriveConfig:
    model: dict = field(default_factory=dict)  # LMConfig
    scene: str = "facts"  # the scene prompt's source: the env's per-step facts
    decision_every: int = 5  # env steps a meta-action (and its set-point) is held
    action_horizon: float = 1.0  # s: the set-point is the expert's speed this far ahead
    sft_steps: int = 3000  # expert env steps collected for SFT
    sft_epochs: int = 3
    sft_batch: int = 32
    sft_lr: float = 3.0e-3
    learning_rate: float = 3.0e-4  # PPO
    n_decisions: int = 64  # decisions per PPO rollout
    batch_size: int = 32  # the paper: 32
    n_epochs: int = 10  # the paper: 10
    gamma: float = 0.99
    gae_lambda: float = 1.0
    clip_range: float = 0.2
    vf_coef: float = 0.5
    kl_coef: float = 0.5  # KL(reference || policy), reference = the SFT decision expert
    # standardise each rollout's advantages (SB3's habit). Off by default: the event reward is
    # already in [-1, 1], and standardising blows a rollout without any event (most of them) up
    # to unit-size advantages made of the critic's noise, which then outweigh the KL anchor
    normalize_advantage: bool = False
    # move the action expert's set-point into the speed band its meta-action means (speed_band):
    # the LoRA action expert alone learns the speed mostly from the scene and often ignores the
    # meta-action (``maintain slow`` at 7 m/s, ``stop`` at 6 m/s), so the decisions PPO changes
    # would barely change the driving. false: the action expert's raw output
    ground_set_point: bool = True
    # decide only among the meta-actions the SFT labelling can produce at the current speed
    # (feasible_mask; e.g. at rest only stop / speed up): without it the tiny decision expert's
    # most likely meta-action at 0 km/h was often ``slow down``, which grounded means standing
    # (route completion 0.2 -> 0.7 for the same SFT checkpoint, docs/benchmarks.md)
    mask_infeasible: bool = True
    max_grad_norm: float = 1.0

    @classmethod
    def from_dict(cls, d: dict) -> "MindDriveConfig":
        d = {k: v for k, v in dict(d).items() if k != "name"}
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"unknown algo option(s) {bad} for algo=minddrive; valid: {sorted(known)}")
        c = cls(**d)
        if c.scene not in SCENES:
            raise ValueError(f"unknown algo.scene {c.scene!r}; valid: {', '.join(SCENES)}")
        for k in ("decision_every", "sft_epochs", "sft_batch", "n_decisions", "batch_size", "n_epochs"):
            if int(getattr(c, k)) < 1:
                raise ValueError(f"algo.{k} must be >= 1, got {getattr(c, k)}")
        if int(c.sft_steps) < 0:
            raise ValueError(f"algo.sft_steps must be >= 0, got {c.sft_steps}")
        LMConfig.from_dict(c.model)
        return c


class MindDriveAgent:
    """The policy with the surface training and evaluation use: ``predict(obs)`` (after
    ``observe(info)`` gave it the step's facts), ``save(path)`` / ``load(path)``,
    ``num_timesteps``; :mod:`drivemind.agents.minddrive_train` runs its SFT and PPO stages."""

    def __init__(self, cfg: MindDriveConfig, env_meta: dict, seed: int = 0):
        self.cfg, self.env_meta, self.seed = cfg, dict(env_meta), int(seed)
        self.lm = MindDriveLM(LMConfig.from_dict(cfg.model), seed)
        self.num_timesteps = 0
        self.stage = "init"
        self._facts = None
        self._held, self._count = None, 0
        self.last_decision = None

    # the frozen-policy surface (drivemind.training.evaluate)
    @property
    def policy(self):
        return self.lm

    def reset(self):
        self._held, self._count = None, 0

    def observe(self, info: dict, reset: bool = False):
        """The step's facts (``info``), from which the next ``predict`` writes its scene."""
        self._facts = info
        if reset:
            self.reset()

    @th.no_grad()
    def decide(self, facts: dict, deterministic: bool = True, rng: np.random.Generator | None = None):
        """(meta-action index, its probability, scene prompt, set-point m/s)."""
        prompt = scene_prompt(facts, self.env_meta.get("lead_range", 50.0))
        logp, _ = self.lm.decide([prompt], allowed=self.mask(facts)[None] if self.cfg.mask_infeasible else None)
        p = logp[0].exp().double().numpy()
        k = int(np.argmax(p)) if deterministic else int((rng or np.random.default_rng()).choice(len(p), p=p / p.sum()))
        return k, float(p[k]), prompt, self.set_point(prompt, k, facts)

    def mask(self, facts: dict) -> np.ndarray:
        """The meta-actions allowed in this step (:func:`feasible_mask`)."""
        return feasible_mask(facts["speed_kmh"] / 3.6, self.cfg.action_horizon)

    @th.no_grad()
    def set_point(self, prompt: str, k: int, facts: dict) -> float:
        """The action expert's speed set-point (m/s) for meta-action ``k`` in this scene; with
        ``ground_set_point`` moved into the band the meta-action means (:func:`grounded_set_point`)."""
        v = float(self.lm.trajectory([prompt], [META_ACTIONS[k]])[0]) * 10.0
        if self.cfg.ground_set_point:
            v = grounded_set_point(v, META_ACTIONS[k], facts["speed_kmh"] / 3.6, self.cfg.action_horizon)
        return v

    def control(self, obs: dict, facts: dict, v_target: float) -> np.ndarray:
        m = self.env_meta
        return track(obs["waypoints"], facts["speed_kmh"] / 3.6, v_target, m["wp_scale"],
                     m["wheelbase"], m["max_steer"], m["accel_max"], m["brake_max"],
                     m.get("rolling", 0.15), m.get("drag", 0.0012), self.cfg.action_horizon)

    def predict(self, obs, state=None, episode_start=None, deterministic: bool = True):
        if self._facts is None:
            raise RuntimeError("MindDrive reads the step's facts: call observe(info) after "
                               "env.reset()/env.step() before predict(obs)")
        if self._held is None or self._count >= self.cfg.decision_every:
            k, p, prompt, v = self.decide(self._facts, deterministic)
            self._held, self._count = v, 0
            self.last_decision = {"prompt": prompt, "meta_action": META_ACTIONS[k], "probability": p,
                                  "set_point_ms": v}
        self._count += 1
        return self.control(obs, self._facts, self._held), state

    # ------------------------------------------------------------------ save / load
    def save(self, path):
        """One file (torch zip): config, env geometry, adapters, heads (and the tiny base)."""
        meta = {"cfg": asdict(self.cfg), "env_meta": self.env_meta, "seed": self.seed,
                "num_timesteps": int(self.num_timesteps), "stage": self.stage,
                "folder": str(self.lm.folder) if self.lm.folder else None}
        buf = io.BytesIO()
        th.save({"meta": json.dumps(meta), "state": self.lm.trainable_state()}, buf)
        with open(path, "wb") as f:
            f.write(buf.getvalue())

    @classmethod
    def load(cls, path, device: str = "cpu", **_):
        blob = th.load(path, map_location="cpu", weights_only=True)
        meta = json.loads(blob["meta"])
        agent = cls(MindDriveConfig.from_dict(meta["cfg"]), meta["env_meta"], meta["seed"])
        agent.lm.load_trainable_state(blob["state"])
        agent.num_timesteps, agent.stage = int(meta["num_timesteps"]), meta["stage"]
        agent.lm.eval()
        return agent


def env_meta(env) -> dict:
    """What the agent needs of the env: waypoint scale and the ego's geometry and limits."""
    base = env.unwrapped
    c, ego = base.cfg, base.sim_cfg.ego
    return {"wp_scale": float(c.waypoints * c.waypoint_spacing), "lead_range": float(c.lead_range),
            "dt": float(base.sim_cfg.dt), "wheelbase": ego.wheelbase, "max_steer": ego.max_steer,
            "accel_max": ego.accel_max, "brake_max": ego.brake_max, "rolling": ego.rolling,
            "drag": ego.drag}
