"""The prompt-generator slot's factory and the online distillation wrapper.

``make_generator(kind, **kwargs)`` builds what DriveMind's reward calls on a novelty trigger
(``generate(PromptRequest) -> str``, parsed by ``parse_prompt_json``):

===================== ===================================================================
kind                  what
===================== ===================================================================
privileged_teacher    :class:`~drivemind.vlm.prompts.PrivilegedTeacher` (default; a stand-in
                      for GPT-4o-mini: the JSON from simulator ground truth)
http                  :class:`~drivemind.vlm.http_teacher.HttpTeacher` (OpenAI-compatible
                      endpoint; key from an environment variable only)
smolvlm               SmolVLM-256M + LoRA distilled online from a teacher
                      (:class:`DistilledGenerator`; ``teacher`` picks the teacher's kind)
tiny_smolvlm          the same on a tiny random Idefics3 model (**untrained random
                      weights**, a stand-in for smoke runs; its outputs are noise)
student_smolvlm       the same on a CPU-sized random Idefics3 with a BPE tokenizer trained
                      on the teacher's outputs (:mod:`drivemind.vlm.student`): random base
                      weights that learn the teacher's JSON from the LoRA steps
                      (``scripts/bench.py distill``)
===================== ===================================================================
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from .prompts import MalformedPrompt, PrivilegedTeacher, PromptRequest

log = logging.getLogger(__name__)

KINDS = ("privileged_teacher", "smolvlm", "http", "tiny_smolvlm", "student_smolvlm")
TEACHER_KINDS = ("privileged_teacher", "http")


class DistilledGenerator:
    """A student distilled online from a teacher, one sample at a time (DriveMind App. B.4).

    On each ``generate(request)``: the teacher labels the request (its raw JSON), the student
    takes one ``learn`` step on that label, and the student's own generation (after the step) is
    returned. With ``warmup=N`` the teacher's label is returned instead until N distillation
    steps have been taken; the default ``warmup=0`` always returns the student's output, as in
    the paper (where SmolVLM's prompts are the ones used). A teacher that raises (an unreachable
    HTTP teacher) or returns malformed JSON is counted (``teacher_errors`` /
    ``teacher_malformed``) and no step is taken; the student still answers. ``save_dir`` with
    ``save_every=k`` writes the adapters every k steps (the paper saves after each step).

    Meant to be called from one background thread; the student serialises its own calls with a
    lock, and the counters here are plain integers updated by that one caller."""

    def __init__(self, student, teacher, *, warmup: int = 0, save_dir=None, save_every: int = 0):
        if not hasattr(student, "learn") or not hasattr(student, "generate"):
            raise TypeError(f"the student must have learn() and generate(), got {type(student).__name__}")
        if not hasattr(teacher, "generate"):
            raise TypeError(f"the teacher must have generate(), got {type(teacher).__name__}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
        if isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 0:
            raise ValueError(f"save_every must be an integer >= 0, got {save_every!r}")
        if save_every and save_dir is None:
            raise ValueError("save_every > 0 needs save_dir (the folder for the LoRA adapters)")
        self.student, self.teacher = student, teacher
        self.warmup, self.save_every = warmup, save_every
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.name = f"{student.name}<-{teacher.name}"
        self.stand_in = bool(getattr(student, "stand_in", False) or getattr(teacher, "stand_in", False))
        self.steps = 0
        self.loss_sum = 0.0
        self.last_loss = float("nan")
        self.teacher_errors = 0
        self.teacher_malformed = 0
        self.nonfinite_losses = 0
        self.learn_seconds = 0.0
        self.generate_seconds = 0.0

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.steps if self.steps else float("nan")

    def stats(self) -> dict:
        return {"distill_steps": self.steps, "mean_loss": self.mean_loss, "last_loss": self.last_loss,
                "teacher_errors": self.teacher_errors, "teacher_malformed": self.teacher_malformed,
                "nonfinite_losses": self.nonfinite_losses,
                "learn_s": self.learn_seconds, "generate_s": self.generate_seconds}

    def distill(self, request: PromptRequest) -> str | None:
        """The teacher labels ``request`` and the student learns from it; returns the label
        (None when the teacher failed or its answer was malformed)."""
        try:
            label = self.teacher.generate(request)
        except Exception as e:  # noqa: BLE001 - counted; the student still answers
            self.teacher_errors += 1
            if self.teacher_errors == 1 or self.teacher_errors % 100 == 0:
                log.warning("teacher %s failed (%s: %s); no distillation step (%d failures so far)",
                            self.teacher.name, type(e).__name__, e, self.teacher_errors)
            return None
        t0 = time.perf_counter()
        try:
            loss = self.student.learn(request, label)
        except MalformedPrompt as e:
            self.teacher_malformed += 1
            log.warning("teacher %s wrote malformed JSON (%s); no distillation step", self.teacher.name, e)
            return None
        finally:
            self.learn_seconds += time.perf_counter() - t0
        if not math.isfinite(loss):
            self.nonfinite_losses += 1
            return label
        self.steps += 1
        self.loss_sum += loss
        self.last_loss = loss
        if self.save_every and self.steps % self.save_every == 0:
            self.student.save_adapter(self.save_dir)
        return label

    def generate(self, request: PromptRequest) -> str:
        label = self.distill(request)
        if self.warmup and label is not None and self.steps <= self.warmup:
            return label
        t0 = time.perf_counter()
        try:
            return self.student.generate(request)
        finally:
            self.generate_seconds += time.perf_counter() - t0

    def __repr__(self) -> str:
        return (f"DistilledGenerator(student={self.student!r}, teacher={self.teacher.name!r}, "
                f"warmup={self.warmup}, steps={self.steps})")


def _teacher(kind: str, kwargs: dict):
    if kind not in TEACHER_KINDS:
        raise ValueError(f"unknown teacher kind {kind!r}; valid teacher kinds: {', '.join(TEACHER_KINDS)}")
    return make_generator(kind, **kwargs)


def make_generator(kind: str = "privileged_teacher", **kwargs):
    """The prompt generator ``kind`` (one of ``KINDS``). Keyword arguments:

    - ``privileged_teacher``: none.
    - ``http``: :class:`~drivemind.vlm.http_teacher.HttpTeacher`'s (``base_url``, ``model``,
      ``api_key_env``, ``timeout``, ``max_tokens``, ...); never an API key itself.
    - ``smolvlm`` / ``tiny_smolvlm``: :class:`~drivemind.vlm.smolvlm.SmolVLMGenerator`'s
      (``path``, ``lora_rank``, ``lr``, ``cot_weight``, ``max_new_tokens``, ``device``,
      ``adapter_path``, ...; ``seed`` for the tiny model) plus ``teacher`` (a teacher kind,
      default ``privileged_teacher``; ``None`` for the student alone, e.g. with a trained
      adapter), ``teacher_kwargs``, ``warmup``, ``save_dir``, ``save_every``
      (:class:`DistilledGenerator`'s).
    - ``student_smolvlm``: the same, with :func:`~drivemind.vlm.student.make_student`'s options
      (:class:`~drivemind.vlm.student.StudentConfig`'s sizes, ``seed``; defaults in
      configs/generator/student_smolvlm.yaml)."""
    if kind not in KINDS:
        raise ValueError(f"unknown prompt generator kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    if "api_key" in kwargs:
        raise ValueError("API keys are never taken from configuration; put the key in the "
                         "environment variable named by api_key_env (default OPENAI_API_KEY)")
    if kind == "privileged_teacher":
        if kwargs:
            raise TypeError(f"the privileged teacher takes no options, got {sorted(kwargs)}")
        return PrivilegedTeacher()
    if kind == "http":
        from .http_teacher import HttpTeacher

        return HttpTeacher(**kwargs)
    from .smolvlm import SmolVLMGenerator

    teacher = kwargs.pop("teacher", "privileged_teacher")
    teacher_kwargs = dict(kwargs.pop("teacher_kwargs", None) or {})
    distill_kw = {k: kwargs.pop(k) for k in ("warmup", "save_dir", "save_every") if k in kwargs}
    if teacher is None and distill_kw:
        raise ValueError(f"{sorted(distill_kw)} only apply with a teacher (teacher=None given)")
    teacher_obj = _teacher(teacher, teacher_kwargs) if teacher is not None else None
    if kind == "tiny_smolvlm":
        seed = kwargs.pop("seed", 0)
        student = SmolVLMGenerator.tiny(seed=seed, **kwargs)
        log.warning("prompt generator tiny_smolvlm: a random tiny SmolVLM with UNTRAINED random "
                    "weights (a stand-in for smoke runs; its answers are noise)")
    elif kind == "student_smolvlm":
        from .student import make_student

        student = make_student(**kwargs)
    else:
        student = SmolVLMGenerator(**kwargs)
    if teacher_obj is None:
        return student
    return DistilledGenerator(student, teacher_obj, **distill_kw)
