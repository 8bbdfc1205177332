"""The student_smolvlm prompt generator (drivemind.vlm.student) learns the teacher's JSON from
LoRA steps (real transformers/PEFT classes, random base weights, a tokenizer trained in code),
offline; and the pieces of the distillation benchmark (drivemind.evaluation.distill)."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("tokenizers")

from drivemind.facts import FACT_KEYS  # noqa: E402
from drivemind.evaluation.distill import DistillConfig, cap_share, evaluate, plot_curve  # noqa: E402
from drivemind.vlm.generators import KINDS, DistilledGenerator, make_generator  # noqa: E402
from drivemind.vlm.prompts import (  # noqa: E402
    INFERENCE_PROMPT, MalformedPrompt, PrivilegedTeacher, PromptRequest, parse_prompt_json)
from drivemind.vlm.student import (  # noqa: E402
    STUDENT_DEFAULTS, StudentConfig, make_student, student_tokenizer, teacher_corpus)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 160  # LoRA steps in the learning test (about 7 s of one core)


def _request(seed=0, **facts):
    base = {k: 0.0 for k in FACT_KEYS}
    base.update(speed_kmh=30.0, light_state=-1, light_distance=100.0, lead_distance=100.0)
    base.update(facts)
    rng = np.random.default_rng(seed)
    bev = ((rng.random((15, 64, 64)) > 0.85) * 255).astype(np.uint8)
    return PromptRequest(facts=base, bev=bev, step=seed)


# ---------------------------------------------------------------------- tokenizer and sizes
def test_tokenizer_is_trained_on_the_teachers_outputs_and_round_trips_any_text():
    corpus = teacher_corpus()
    assert len(corpus) == 4 * 5 * 4 * 4 * 5  # every situation of the caption tables
    assert all(parse_prompt_json(c) for c in corpus[:50])
    tok = student_tokenizer(768)
    assert len(tok) <= 768
    answer = corpus[123]
    n_bpe = len(tok(answer, add_special_tokens=False)["input_ids"])
    assert n_bpe < len(answer.encode()) / 3  # the teacher's wording compresses well
    for text in (answer, INFERENCE_PROMPT, "unseen wörds ✓ {\"x\": 1}"):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text  # byte alphabet: nothing is lost
    # deterministic: the same corpus and size give the same vocabulary
    assert student_tokenizer(768).get_vocab() == tok.get_vocab()
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 300"):
        student_tokenizer(100)


def test_student_options_are_checked():
    with pytest.raises(ValueError, match="unknown student size option.*valid: vocab_size"):
        StudentConfig.from_kwargs({"width": 3})
    with pytest.raises(ValueError, match="hidden_size must be a positive integer"):
        StudentConfig.from_kwargs({"hidden_size": 0})
    with pytest.raises(ValueError, match="divisible by num_attention_heads"):
        StudentConfig.from_kwargs({"hidden_size": 30, "num_attention_heads": 4})
    with pytest.raises(ValueError, match="multiple of 2 x patch_size"):
        StudentConfig.from_kwargs({"image_size": 40})
    with pytest.raises(ValueError, match="use the generator kind 'smolvlm'"):
        make_student(path="/somewhere")
    with pytest.raises(ValueError, match="unknown student_smolvlm option.*valid: .*lora_rank"):
        make_student(lora_rnk=4)
    assert "student_smolvlm" in KINDS


def test_config_file_matches_the_code_defaults():
    import yaml
    from pathlib import Path
    from dataclasses import asdict

    conf = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "generator"
                           / "student_smolvlm.yaml").read_text())
    assert conf["kind"] == "student_smolvlm"
    assert conf["kwargs"] == {**asdict(StudentConfig()), **STUDENT_DEFAULTS}


# ---------------------------------------------------------------------- it learns, offline
def test_lora_steps_teach_the_student_the_json_offline(monkeypatch):
    """A few LoRA steps on teacher answers lower the loss on a held-out scene and turn the
    student's noise into parseable JSON; no network is touched on the way."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    dialled = []

    def no_network(self, address, *a, **k):
        dialled.append(address)
        raise OSError(f"network access attempted: {address}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)

    teacher = PrivilegedTeacher()
    gen = make_generator("student_smolvlm", teacher="privileged_teacher", seed=0)  # lr 1e-3
    assert isinstance(gen, DistilledGenerator) and gen.student.name == "student_smolvlm"
    student = gen.student
    train = [_request(i, speed_kmh=s) for i, s in enumerate((30.0, 30.0, 0.0, 30.0))]
    held = _request(99, speed_kmh=30.0)  # an unseen image with the quiet scene's answer
    label = teacher.generate(held)
    p0, c0 = student.loss_terms(held, label)

    def parse_rate():
        ok = 0
        for r in train[:2]:
            try:
                parse_prompt_json(student.generate(r))
                ok += 1
            except MalformedPrompt:
                pass
        return ok / 2

    assert parse_rate() == 0  # random weights: noise at step 0
    for _ in range(STEPS // len(train)):
        for r in train:
            gen.distill(r)
    assert gen.steps == STEPS and gen.teacher_malformed == 0
    p1, c1 = student.loss_terms(held, label)
    assert p1 + c1 < 0.5 * (p0 + c0), (p0, c0, p1, c1)
    assert parse_rate() >= 0.5  # 2 of 2 after 120 steps when measured (loss 0.25 + 0.31)
    assert not dialled


# ---------------------------------------------------------------------- benchmark pieces
def test_cap_share_limits_the_frequent_answer():
    teacher = PrivilegedTeacher()
    scenes = [_request(i, speed_kmh=30.0) for i in range(40)]  # one quiet answer, 40 times
    scenes += [_request(100 + i, speed_kmh=0.0) for i in range(5)]
    scenes += [_request(200 + i, speed_kmh=60.0) for i in range(5)]
    scenes += [_request(300 + i, speed_kmh=30.0, lateral_offset=1.0) for i in range(5)]
    out = cap_share(scenes, teacher, 0.4, np.random.default_rng(0))
    counts = {}
    for s in out:
        p = teacher.prompts(s.facts)
        counts[(p.present, p.ideal)] = counts.get((p.present, p.ideal), 0) + 1
    assert len(counts) == 4
    assert max(counts.values()) <= 0.4 * len(out)
    assert max(counts.values()) >= 5  # the cap does not starve the stream
    with pytest.raises(ValueError, match="max_share must be in"):
        DistillConfig(max_share=0)
    with pytest.raises(ValueError, match="unknown driver"):
        DistillConfig(drivers=("nobody",))
    with pytest.raises(ValueError, match="must differ"):
        DistillConfig(train_seed=3, heldout_seed=3)


class _Fixed:
    name, stand_in = "fixed", True

    def __init__(self, answers):
        self.answers = list(answers)

    def generate(self, request):
        return self.answers.pop(0)


def test_evaluate_counts_parses_and_agreement(tmp_path):
    teacher = PrivilegedTeacher()
    scenes = [_request(0, speed_kmh=30.0), _request(1, speed_kmh=0.0), _request(2, speed_kmh=60.0)]
    right = [teacher.generate(s) for s in scenes]
    wrong_ideal = json.loads(right[2])
    wrong_ideal["ideal_prompt"] = "something else"
    student = _Fixed([right[0], "not json at all", json.dumps(wrong_ideal)])
    maj = (teacher.prompts(scenes[0].facts).present, teacher.prompts(scenes[0].facts).ideal)
    m = evaluate(student, teacher, scenes, majority=maj)
    assert m["parse_rate"] == pytest.approx(2 / 3)
    assert m["agreement"] == pytest.approx(1 / 3)
    assert m["agreement_present"] == pytest.approx(2 / 3)
    assert m["agreement_ideal"] == pytest.approx(1 / 3)
    assert m["majority_agreement"] == pytest.approx(1 / 3)
    assert m["malformed_example"] == "not json at all"
    curve = [dict(m, step=0), dict(m, step=10, parse_rate=1.0)]
    png = plot_curve(curve, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000 and png.endswith("c.png")
