"""DriveMind's dynamic prompts: the generator slot, its JSON contract and the privileged teacher.

When the novelty detector fires, a *prompt generator* looks at the frame and writes the paper's
JSON (DriveMind Fig. 3)::

    {"cot_explanation": ["Scene Overview: ...", "Risk Assessment: ...", "Guidance Summary: ..."],
     "present_prompt": "<the current risk>", "ideal_prompt": "<the goal state>"}

The prompts are then embedded with the contrastive encoder's text tower and become the AICR /
PCFM targets until the next trigger.

Generators implement :class:`PromptGenerator`: ``generate(request) -> str`` (raw text, parsed by
:func:`parse_prompt_json`; malformed output is the caller's counted fallback) and, for students,
``learn(request, target_text) -> loss``. Slots:

- :class:`PrivilegedTeacher` (default, a **stand-in** for the paper's GPT-4o-mini teacher): writes
  the JSON from the simulator's ground truth (the step's facts), in the vocabulary our BEV-CLIP
  was aligned to, so its prompts land in the image tower's space.
- SmolVLM + LoRA distilled online from a teacher, and an OpenAI-compatible HTTP teacher
  (``drivemind.vlm.smolvlm``, ``drivemind.vlm.http_teacher``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from .captions import AHEAD, COLLISION, LANE, LIGHT, SPEED, describe, situation

# DriveMind, Figure 3 (verbatim)
SYSTEM_PROMPT = ("You are a Vision Language Model specialized in analyzing images of driving "
                 "scenarios from bird's-eye view. Your task is to generate a valid JSON object with "
                 "exactly the following three keys: cot_explanation, present_prompt, and ideal_prompt.")
TEACHER_PROMPT = (
    "You are an expert self-driving decision assistant. Generate a valid JSON object with exactly "
    "three keys: cot_explanation, present_prompt, and ideal_prompt. Analyze the image and produce a "
    "chain-of-thought explanation describing how the ideal prompt is derived based on "
    "\u201cScene Overview\u201d, \u201cRisk Assessment\u201d, and \u201cGuidance Summary\u201d. Example: "
    '{"cot_explanation": ["Scene Overview: Two vehicles are stopped in the middle of the road after '
    'a collision, blocking both lanes and creating debris.", "Risk Assessment: Oncoming traffic may '
    'not see the wreck in time to brake, increasing the chance of secondary collisions, and debris '
    'could puncture tires or damage vehicles.", "Guidance Summary: Come to a complete stop at a safe '
    'distance, activate hazard lights, and prepare to reroute or wait for the scene to clear."], '
    '"present_prompt": "Two cars have collided ahead causing a blockage.", '
    '"ideal_prompt": "The road ahead is clear with no obstacles."}')
INFERENCE_PROMPT = (
    "Generate a valid JSON object with exactly the following three keys: cot_explanation (detailed "
    "chain of thought explanation), present_prompt (brief description of current risk), and "
    "ideal_prompt (brief future guidance). Analyze the uploaded bird\u2019s-eye view image showing "
    "our car and produce the outputs.")

JSON_KEYS = ("cot_explanation", "present_prompt", "ideal_prompt")
MAX_PROMPT_CHARS = 300
STATIC_PRESENT = "the car is about to crash"
STATIC_IDEAL = "no collisions occur"


class MalformedPrompt(ValueError):
    """A generator's output is not the JSON contract (the caller falls back and counts it)."""


@dataclass(frozen=True)
class PromptSet:
    present: str
    ideal: str
    cot: tuple[str, ...] = ()
    source: str = ""

    def to_json(self) -> str:
        return json.dumps({"cot_explanation": list(self.cot), "present_prompt": self.present,
                           "ideal_prompt": self.ideal})


STATIC_PROMPTS = PromptSet(STATIC_PRESENT, STATIC_IDEAL, source="static")


@dataclass
class PromptRequest:
    """What a generator sees: the step's ground-truth facts (privileged teachers only), the BEV
    masks (uint8 C x H x W) and, when the backend has one, a forward RGB frame."""

    facts: dict = field(default_factory=dict)
    bev: np.ndarray | None = None
    rgb: np.ndarray | None = None
    step: int = 0


@runtime_checkable
class PromptGenerator(Protocol):
    name: str
    stand_in: bool

    def generate(self, request: PromptRequest) -> str: ...


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def parse_prompt_json(text: str) -> PromptSet:
    """The generator contract: a JSON object with ``present_prompt`` and ``ideal_prompt``
    (non-empty strings up to ``MAX_PROMPT_CHARS``) and ``cot_explanation`` (a list of strings or
    one string). Code fences and text around the first ``{...}`` object are tolerated; anything
    else raises :class:`MalformedPrompt` saying what was wrong."""
    if not isinstance(text, str):
        raise MalformedPrompt(f"generator output must be text, got {type(text).__name__}")
    m = _FENCE.search(text)
    body = m.group(1) if m else text
    a, b = body.find("{"), body.rfind("}")
    if a < 0 or b <= a:
        raise MalformedPrompt(f"no JSON object in generator output {text[:80]!r}")
    try:
        obj = json.loads(body[a:b + 1])
    except json.JSONDecodeError as e:
        raise MalformedPrompt(f"invalid JSON in generator output ({e.msg} at char {e.pos}): "
                              f"{text[:80]!r}") from None
    if not isinstance(obj, dict):
        raise MalformedPrompt("generator JSON must be an object")
    out = {}
    for k in ("present_prompt", "ideal_prompt"):
        v = obj.get(k)
        if not isinstance(v, str) or not v.strip():
            raise MalformedPrompt(f"generator JSON lacks a non-empty string {k!r} (keys: {sorted(obj)})")
        if len(v) > MAX_PROMPT_CHARS:
            raise MalformedPrompt(f"{k} is {len(v)} characters long (at most {MAX_PROMPT_CHARS})")
        out[k] = " ".join(v.split())
    cot = obj.get("cot_explanation", [])
    if isinstance(cot, str):
        cot = [cot]
    if not isinstance(cot, list) or not all(isinstance(c, str) for c in cot):
        raise MalformedPrompt("cot_explanation must be a list of strings")
    return PromptSet(out["present_prompt"], out["ideal_prompt"], tuple(cot))


# ---------------------------------------------------------------------------- privileged teacher
_RISK = {  # situation field -> (risk sentence, guidance sentence)
    ("collision", "vehicle"): ("the car has collided with another vehicle", "stop and keep clear of other vehicles"),
    ("collision", "walker"): ("the car has hit a pedestrian", "stop at once"),
    ("collision", "cyclist"): ("the car has hit a cyclist", "stop at once"),
    ("collision", "static"): ("the car has left the road", "steer back to the lane centre and slow down"),
    ("ahead", "crash"): ("a collision with the vehicle ahead is imminent", "brake now to open the gap"),
    ("ahead", "close"): ("the vehicle ahead is too close", "slow down and keep a safe distance"),
    ("light", "red"): ("the light ahead is red", "slow down and stop before the line"),
    ("light", "yellow"): ("the light ahead is turning", "slow down and prepare to stop"),
    ("lane", "off_left"): ("the car is leaving its lane to the left", "steer right back into the lane"),
    ("lane", "off_right"): ("the car is leaving its lane to the right", "steer left back into the lane"),
    ("lane", "left"): ("the car drifts left in its lane", "steer gently back to the lane centre"),
    ("lane", "right"): ("the car drifts right in its lane", "steer gently back to the lane centre"),
    ("speed", "fast"): ("the car is driving too fast", "ease off to a moderate speed"),
    ("speed", "stopped"): ("the car is standing still on a free road", "pull away and drive on"),
}
_ORDER = [("collision", ("vehicle", "walker", "cyclist", "static")), ("ahead", ("crash", "close")),
          ("light", ("red", "yellow")), ("lane", ("off_left", "off_right")), ("speed", ("fast",)),
          ("lane", ("left", "right")), ("speed", ("stopped",))]


def ideal_situation(sit: dict[str, str]) -> dict[str, str]:
    """The situation the car should be in next, by rule: no contact, centred, a safe gap, stopped
    for a red light, slow for yellow or a close lead, moderate speed otherwise."""
    ideal = {"collision": "none", "lane": "centre", "light": sit["light"],
             "ahead": {"crash": "ahead", "close": "ahead"}.get(sit["ahead"], sit["ahead"])}
    if sit["light"] == "red":
        ideal["speed"] = "stopped"
    elif sit["light"] == "yellow" or sit["ahead"] in ("crash", "close"):
        ideal["speed"] = "slow"
    else:
        ideal["speed"] = "moderate"
    return ideal


class PrivilegedTeacher:
    """Stand-in for the GPT-4o-mini teacher: the paper's JSON written from ground truth.

    present_prompt: the clauses of the current situation that are risks (the static "the car is
    about to crash" when nothing is); ideal_prompt: the caption of :func:`ideal_situation`, in the
    canonical caption wording the BEV-CLIP image tower was aligned to."""

    name = "privileged_teacher"
    stand_in = True

    def risks(self, sit: dict[str, str]) -> list[tuple[str, str]]:
        out = []
        for key, values in _ORDER:
            if sit[key] in values and not (key == "speed" and sit[key] == "stopped"
                                           and (sit["light"] == "red" or sit["ahead"] != "clear")):
                out.append((key, sit[key]))
        return out

    def prompts(self, facts: dict) -> PromptSet:
        return self.prompts_for(situation(facts))

    def prompts_for(self, sit: dict[str, str]) -> PromptSet:
        """The prompts of a discrete situation (one key of each caption table,
        :func:`~drivemind.vlm.captions.situation`)."""
        risks = self.risks(sit)
        table = {"collision": COLLISION, "ahead": AHEAD, "light": LIGHT, "lane": LANE, "speed": SPEED}
        present_parts = []
        for key, val in risks[:2]:
            clause = table[key][val][0]
            present_parts.append(f"the car is {clause}" if key == "lane" else clause)
        present = "; ".join(present_parts) if present_parts else STATIC_PRESENT
        ideal = describe(ideal_situation(sit))
        overview = "Scene Overview: " + describe(sit) + "."
        if risks:
            risk = "Risk Assessment: " + "; ".join(_RISK[r][0] for r in risks) + "."
            guide = "Guidance Summary: " + "; ".join(_RISK[r][1] for r in risks) + "."
        else:
            risk = "Risk Assessment: no immediate risk."
            guide = "Guidance Summary: keep the lane centre at a moderate speed."
        return PromptSet(present, ideal, (overview, risk, guide), source=self.name)

    def generate(self, request: PromptRequest) -> str:
        return self.prompts(request.facts).to_json()
