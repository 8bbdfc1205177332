"""Action suggestions from a VLM for Found-RL's action guidance (``algo.guidance``,
``drivemind.agents.guidance``): the prompt, the answer contract and the worker that asks.

The contract: the model answers one JSON object ``{"steer": s, "accel": a}`` with both numbers in
[-1, 1] (the env's action: steer x max steering angle; accel > 0 throttle, < 0 brake). Code
fences and text around the first ``{...}`` are tolerated; anything else is *malformed* and the
transition keeps mask 0 (never a target).

:class:`ActionTeacherWorker` is the factory the reward service runs in its worker process
(``drivemind.reward_service.RewardService``: micro-batches, back-pressure, results by id). Kinds:

- ``http``: :class:`HttpActionTeacher`, the HTTP teacher (any OpenAI-compatible chat endpoint
  with image input, e.g. GPT-4o-mini) asked with the action prompt instead of DriveMind's.
- ``smolvlm``: :class:`SmolVLMActionTeacher`, the SmolVLM slot (a local checkpoint, or with
  ``tiny: true`` the random tiny SmolVLM, a stand-in whose answers are noise) asked with the same
  action prompt. It is not fine-tuned for action answers here: expect mostly malformed answers
  (mask 0) from the tiny one and untested quality from a real checkpoint.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np

from .http_teacher import HttpTeacher
from .prompts import PromptRequest
from .smolvlm import SmolVLMGenerator

ACTION_SYSTEM_PROMPT = (
    "You are an expert driving instructor. You see a bird's-eye-view semantic map of the scene "
    "around the ego car (the ego is near the bottom, facing up; the planned route is drawn) and a "
    "few measurements. Answer with the control the ego should apply now, as one JSON object and "
    "nothing else.")

ACTION_PROMPT = (
    "Ego speed: {speed:.1f} km/h. Route command: {command}. Lead vehicle: {lead}. Traffic light "
    "ahead: {light}.\nAnswer {{\"steer\": s, \"accel\": a}} with s in [-1, 1] (negative = left, "
    "positive = right) and a in [-1, 1] (positive = throttle, negative = brake).")

_LIGHTS = {-1: "none", 0: "red", 1: "yellow", 2: "green", 3: "off"}
_OBJECT = re.compile(r"\{.*?\}", re.S)


class MalformedAction(ValueError):
    """The model's answer does not follow the action contract."""


def action_prompt(facts: dict) -> str:
    """The user prompt for one step, from its facts (speed, command, lead, light)."""
    from ..envs.tracker import COMMANDS

    lead = float(facts.get("lead_distance", 50.0))
    lead_txt = "none within 50 m" if lead >= 50.0 else f"{lead:.0f} m ahead"
    return ACTION_PROMPT.format(speed=float(facts.get("speed_kmh", 0.0)),
                                command=COMMANDS.get(int(facts.get("command", 4)), "follow").replace("_", " "),
                                lead=lead_txt, light=_LIGHTS.get(int(facts.get("light_state", -1)), "none"))


def parse_action_json(text: str) -> np.ndarray:
    """``{"steer": s, "accel": a}`` -> float32 [s, a]; raises :class:`MalformedAction` saying
    what was wrong."""
    if not isinstance(text, str):
        raise MalformedAction(f"expected text, got {type(text).__name__}")
    m = _OBJECT.search(text)
    if m is None:
        raise MalformedAction(f"no JSON object in the answer {text[:80]!r}")
    try:
        obj = json.loads(m.group(0))
    except ValueError as e:
        raise MalformedAction(f"the answer's JSON does not parse ({e}): {m.group(0)[:80]!r}") from None
    if not isinstance(obj, dict) or "steer" not in obj or "accel" not in obj:
        raise MalformedAction(f"the answer must have keys 'steer' and 'accel', got {m.group(0)[:80]!r}")
    out = []
    for k in ("steer", "accel"):
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or abs(v) > 1:
            raise MalformedAction(f"{k} must be a number in [-1, 1], got {v!r}")
        out.append(float(v))
    return np.array(out, np.float32)


class HttpActionTeacher(HttpTeacher):
    """The HTTP teacher asked for an action (:data:`ACTION_SYSTEM_PROMPT`, :func:`action_prompt`)
    instead of DriveMind's prompts; same client, key handling and errors."""

    def payload(self, request: PromptRequest) -> dict:
        body = super().payload(request)
        msgs = body["messages"]
        msgs[0]["content"] = ACTION_SYSTEM_PROMPT
        msgs[1]["content"][0]["text"] = action_prompt(request.facts)
        return body


class SmolVLMActionTeacher(SmolVLMGenerator):
    """The SmolVLM slot asked for an action: the same model, LoRA and decoding, with
    :data:`ACTION_SYSTEM_PROMPT` and :func:`action_prompt` in its chat template."""

    _user = ""

    def generate(self, request: PromptRequest) -> str:
        self._user = action_prompt(request.facts)
        return super().generate(request)

    def prompt_text(self) -> str:
        from .smolvlm import BOS, EOU, FAKE, GLOBAL, IMAGE

        img = (FAKE + (GLOBAL if self.ids[GLOBAL] is not None else "")
               + IMAGE * self.image_seq_len + FAKE)
        bos = BOS if self.ids[BOS] is not None else ""
        return f"{bos}System: {ACTION_SYSTEM_PROMPT}{EOU}\nUser:{img}{self._user}{EOU}\nAssistant:"


TEACHER_KINDS = ("http", "smolvlm")


class ActionTeacherWorker:
    """Picklable factory for the reward service: builds the teacher in the worker and returns
    the batch function ``[{"bev": uint8 C x H x W, "facts": dict}, ...] -> (N, 3) float32``
    rows ``[steer, accel, valid]`` (valid 0 for a malformed answer or a failed call; those are
    counted in the row and never used as targets)."""

    def __init__(self, kind: str = "http", kwargs: dict | None = None, bev_config=None):
        if kind not in TEACHER_KINDS:
            raise ValueError(f"unknown action teacher kind {kind!r}; valid: {', '.join(TEACHER_KINDS)}")
        self.kind, self.kwargs, self.bev_config = kind, dict(kwargs or {}), bev_config

    def check(self) -> None:
        """Fail in the learner, before the worker starts, on options the teacher would refuse
        (cheap: builds nothing heavy)."""
        if self.kind == "http":
            self.build()
            return
        import inspect

        kw = dict(self.kwargs)
        kw.pop("tiny", None), kw.pop("seed", None)
        valid = set(inspect.signature(SmolVLMGenerator.__init__).parameters) - {"self", "_parts", "bev_config"}
        bad = set(kw) - valid
        if bad:
            raise ValueError(f"unknown algo.guidance_kwargs.teacher key(s) {sorted(bad)} for "
                             f"source=smolvlm; valid: tiny, seed, {', '.join(sorted(valid))}")

    def build(self):
        if self.kind == "http":
            return HttpActionTeacher(bev_config=self.bev_config, **self.kwargs)
        kw = dict(self.kwargs)
        if kw.pop("tiny", False):
            return SmolVLMActionTeacher.tiny(seed=int(kw.pop("seed", 0)), bev_config=self.bev_config, **kw)
        kw.pop("seed", None)
        return SmolVLMActionTeacher(bev_config=self.bev_config, **kw)

    def __call__(self):
        from .http_teacher import TeacherError

        teacher = self.build()

        def suggest(payloads):
            out = np.zeros((len(payloads), 3), np.float32)
            for i, p in enumerate(payloads):
                try:
                    text = teacher.generate(PromptRequest(facts=dict(p.get("facts") or {}), bev=p["bev"]))
                    out[i, :2] = parse_action_json(text)
                    out[i, 2] = 1.0
                except (MalformedAction, TeacherError):
                    pass  # unscored: mask 0 (a SmolVLM that cannot load fails the factory instead)
            return out

        return suggest

    def __repr__(self) -> str:
        return f"ActionTeacherWorker(kind={self.kind!r}, model={self.kwargs.get('model', 'default')!r})"
