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
    # the paper's path (the model's own vision tower on a 64 px BEV, no measurements, constant lr)
    gen = make_generator("student_smolvlm", teacher="privileged_teacher", seed=0,
                         image_features="idefics3", measurements=[], lr_decay_steps=0)
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


# ---------------------------------------------------------------------- the student's inputs
def test_student_input_options_are_checked_and_the_old_path_is_kept(tmp_path):
    from drivemind.vlm.smolvlm import SmolVLMGenerator
    from drivemind.vlm.student import _targets, build_student_smolvlm, measurement_text

    with pytest.raises(ValueError, match="unknown image_features 'siglip'; valid: idefics3, bev_clip"):
        make_student(image_features="siglip")
    with pytest.raises(ValueError, match="unknown ego measurement.*lead_distance.*valid: speed_kmh"):
        make_student(measurements=["speed_kmh", "lead_distance"])
    with pytest.raises(ValueError, match="lr_decay_steps must be an integer >= 0"):
        make_student(lr_decay_steps=-1)
    with pytest.raises(ValueError, match="image_tokens must be a positive integer"):
        make_student(image_features="bev_clip", image_tokens=0)
    assert measurement_text({"speed_kmh": 31.4, "steer": -0.1}, ["speed_kmh", "steer"]) == \
        "Measurements: speed 31 km/h, steer -0.10."
    with pytest.raises(ValueError, match="facts lack it"):
        measurement_text({}, ["speed_kmh"])
    req = _request(0)
    target = PrivilegedTeacher().generate(req)
    # image_features='idefics3' without measurements is the paper's path: the same loss as
    # SmolVLMGenerator on the same random model
    old = SmolVLMGenerator(_parts=build_student_smolvlm(seed=0), lr=1e-3, lora_rank=16,
                           lora_alpha=32, lora_targets=_targets())
    new = make_student(seed=0, image_features="idefics3", measurements=[])
    assert new.prompt_text(req) == old.prompt_text()
    assert new.loss_terms(req, target) == pytest.approx(old.loss_terms(req, target), rel=1e-5)
    # the BEV-CLIP student's connector (weights and running statistics) is saved with the adapters
    bev = make_student(seed=0, image_features="bev_clip", measurements=["speed_kmh"],
                       lr_decay_steps=10)
    r96 = PromptRequest(facts=req.facts, bev=np.zeros((15, 96, 96), np.uint8))
    with pytest.raises(ValueError, match="PromptRequest.bev is None"):
        bev.generate(PromptRequest(facts=req.facts))
    assert "Measurements: speed 30 km/h." in bev.prompt_text(r96)
    lrs = []
    for _ in range(3):
        lrs.append(bev.current_lr())
        bev.learn(r96, target)
    assert lrs[0] == pytest.approx(1e-3) and lrs[0] > lrs[1] > lrs[2] > 1e-4
    bev.save_adapter(tmp_path / "a")
    back = make_student(seed=0, image_features="bev_clip", measurements=["speed_kmh"],
                        adapter_path=str(tmp_path / "a"))
    assert int(back.connector.count) == 3
    assert back.loss_terms(r96, target) == pytest.approx(bev.loss_terms(r96, target), rel=1e-5)


# ---------------------------------------------------------------------- the student reads the scene
def _bev(shift: int, lead: bool) -> np.ndarray:
    """A 15 x 96 x 96 BEV (the cpu preset's planes: road, route, lane, 4 x vehicle, 4 x walker,
    4 x light) of a straight road, the road drawn ``shift`` px to the side; with ``lead`` a car
    in the ego's lane about 5 m ahead in every vehicle history plane."""
    bev = np.zeros((15, 96, 96), np.uint8)
    c = 48 + shift
    bev[0, :, c - 12:c + 12] = 255  # road
    bev[1, :77, c - 4:c + 4] = 255  # route ahead of the ego (20 px from the bottom)
    bev[2, ::4, c - 1:c + 1] = 255  # dashed lane marking
    if lead:
        bev[3:7, 58:68, c - 3:c + 3] = 255
    return bev


def _two_class_task(n_train, n_test, *, image, speed, seed=0):
    """A tiny constructed task with two teacher answers. ``image``: the classes differ in the BEV
    (a car close ahead in class 1, and the facts say so; the road drawn at a random offset per
    pair of scenes) at 25-38 km/h; ``speed``: the same BEV for both classes of a pair, which differ
    only in the ego's speed (standing still vs 25-38 km/h on a free road). Returns (train, test)
    lists of (request, class)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_train + n_test):
        c = i % 2
        if c == 0:  # one road per pair of scenes: without the image the two are equal
            shift = int(rng.integers(-6, 7))
        bev = _bev(shift, lead=image and c == 1)
        facts = {k: 0.0 for k in FACT_KEYS}
        facts.update(light_state=-1, light_distance=100.0, lead_distance=100.0,
                     speed_kmh=float(rng.uniform(25, 38)))
        if image and c:
            facts.update(lead_distance=6.0, lead_speed_kmh=facts["speed_kmh"])
        if speed and c:
            facts.update(speed_kmh=float(rng.uniform(0.0, 1.5)))
        out.append((PromptRequest(facts=facts, bev=bev, step=i), c))
    return out[:n_train], out[n_train:]


def _likelihood_accuracy(student, teacher, test, answers):
    """Share of test scenes where the teacher's answer for the scene's own class costs the student
    less (teacher-forced CE) than the other class's answer."""
    right = 0
    for req, c in test:
        own = sum(student.loss_terms(req, answers[c]))
        other = sum(student.loss_terms(req, answers[1 - c]))
        right += own < other
    return right / len(test)


@pytest.mark.parametrize("task,passes", [("image", 4), ("speed", 4)])
def test_student_reads_the_scene_where_an_input_blind_student_cannot(task, passes):
    """Distilled on the same stream, the student with BEV-CLIP image features (task "image") or
    the ego's speed in its prompt (task "speed") tells the two classes apart on unseen scenes,
    by likelihood and in its greedy answers; the same student blind to that input cannot (its
    inputs are equal for both classes of a pair: half right at best)."""
    teacher = PrivilegedTeacher()
    train, test = _two_class_task(48, 8, image=task == "image", speed=task == "speed")
    answers = [teacher.generate(train[0][0]), teacher.generate(train[1][0])]
    assert answers[0] != answers[1]
    seeing = ({"image_features": "bev_clip", "measurements": []} if task == "image"
              else {"image_features": "bev_clip", "measurements": ["speed_kmh"]})
    blind = {"image_features": "bev_clip", "measurements": []}

    def view(name, req):  # the image-blind control sees one empty frame for every scene
        if name == "blind" and task == "image":
            return PromptRequest(facts=req.facts, bev=np.zeros_like(req.bev), step=req.step)
        return req

    results = {}
    for name, opts in (("seeing", seeing), ("blind", blind)):
        student = make_student(seed=0, **opts)
        for _ in range(passes):
            for req, c in train:
                student.learn(view(name, req), answers[c])
        probe = [(view(name, r), c) for r, c in test]
        results[name] = _likelihood_accuracy(student, teacher, probe, answers)
        if name == "seeing":  # greedy answers of one unseen scene of each class
            right = 0
            for r, c in test[:2]:
                try:
                    got = parse_prompt_json(student.generate(r))
                except MalformedPrompt:
                    continue
                right += (got.present, got.ideal) == (teacher.prompts(r.facts).present,
                                                      teacher.prompts(r.facts).ideal)
            results["greedy"] = right / 2
    assert results["seeing"] >= 0.875, results
    assert results["greedy"] == 1.0, results
    assert results["blind"] <= 0.5, results
