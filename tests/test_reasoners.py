"""DriveVLM-RL's reasoner slot (drivemind.vlm.reasoners): the privileged rule stand-in, and
Qwen2.5-VL on a tiny random config built in code (real transformers classes, offline) with
vocabulary snapping by the real MiniLM text tower."""

from __future__ import annotations

import numpy as np
import pytest

from drivemind.vlm.detectors import Detection
from drivemind.vlm.reasoners import (ANIMAL, CLEAR, CYC_AHEAD, CYC_MERGING, MOTO_AHEAD, MOTO_SIDE,
                                     PED_CROSSING, PED_GROUP, PED_ROADSIDE, REASONER_KINDS,
                                     RISK_VOCABULARY, TOO_CLOSE, PrivilegedReasoner, clean_sentence,
                                     describe_detections, make_reasoner)


def _ego(cls, x, y, score=0.9, half=0.3):
    """A detection in the ego frame: box centred x m ahead, y m to the right."""
    return Detection(cls, score, (x - half, y - half, x + half, y + half), "ego", float(np.hypot(x, y)))


# ---------------------------------------------------------------------- vocabulary + rules
def test_vocabulary_has_the_papers_examples():
    assert len(RISK_VOCABULARY) == len(set(RISK_VOCABULARY)) == 10
    assert "a pedestrian is crossing the road ahead" in RISK_VOCABULARY
    assert "a cyclist is merging into the ego lane" in RISK_VOCABULARY


@pytest.mark.parametrize("dets, want", [
    ([_ego("person", 12.0, 0.5)], PED_CROSSING),
    ([_ego("person", 12.0, 4.5)], PED_ROADSIDE),
    ([_ego("person", 12.0, 5.0), _ego("person", 14.0, 5.5), _ego("person", 15.0, -6.0)], PED_GROUP),
    ([_ego("bicycle", 15.0, -0.5)], CYC_AHEAD),
    ([_ego("bicycle", 15.0, 3.0)], CYC_MERGING),
    ([_ego("motorcycle", 10.0, 0.0)], MOTO_AHEAD),
    ([_ego("motorcycle", 10.0, -8.0)], MOTO_SIDE),
    ([_ego("dog", 20.0, 1.0)], ANIMAL),
    ([_ego("person", 3.0, 1.0), _ego("bicycle", 15.0, 0.0)], TOO_CLOSE),
    ([_ego("car", 6.0, 0.0)], CLEAR),
    ([_ego("person", 10.0, 0.0, score=0.1)], CLEAR),
    ([], CLEAR),
    # the one in the lane decides over a nearer one at the side
    ([_ego("person", 8.0, 6.0), _ego("bicycle", 20.0, 0.2)], CYC_AHEAD),
])
def test_privileged_rules_ego_frame(dets, want):
    assert PrivilegedReasoner().describe(None, dets) == want


def test_privileged_rules_dicts_and_image_boxes():
    r = PrivilegedReasoner()
    frame = np.zeros((100, 200, 3), np.uint8)
    assert r.describe([frame], [{"name": "person", "score": 0.8}]) == PED_CROSSING  # no box: ahead
    centre = {"cls": "person", "score": 0.8, "box": (90, 30, 110, 60)}
    edge = {"cls": "person", "score": 0.8, "box": (5, 30, 25, 60)}
    close = {"cls": "bicycle", "score": 0.8, "box": (80, 20, 120, 98)}
    assert r.describe([frame], [centre]) == PED_CROSSING
    assert r.describe([frame], [edge]) == PED_ROADSIDE
    assert r.describe([frame], [close]) == TOO_CLOSE
    with pytest.raises(ValueError, match="class name"):
        r.describe([frame], [{"score": 0.9}])
    assert "person (score 0.80): box x 0.45-0.55" in describe_detections([centre], frame.shape)
    assert "12.0 m ahead, 0.5 m to the right" in describe_detections([_ego("person", 12.3, 0.5)])


def test_clean_sentence():
    assert clean_sentence('1. "A pedestrian is crossing the road ahead."\nmore') == PED_CROSSING
    assert clean_sentence("\n\n - A cyclist is merging into the ego lane") == CYC_MERGING
    assert clean_sentence("\x00\x01 ... 12") == "" and clean_sentence(None) == ""


def test_make_reasoner_kinds():
    assert isinstance(make_reasoner("privileged"), PrivilegedReasoner)
    with pytest.raises(ValueError) as e:
        make_reasoner("gpt")
    assert all(k in str(e.value) for k in REASONER_KINDS)


# ---------------------------------------------------------------------- Qwen2.5-VL (tiny)
@pytest.fixture(scope="module")
def frames():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 255, (60, 80, 3), dtype=np.uint8) for _ in range(6)]


@pytest.fixture(scope="module")
def tiny(text, one_torch_thread):
    pytest.importorskip("transformers")
    from drivemind.vlm.reasoners import QwenVLReasoner

    return QwenVLReasoner.tiny(seed=0, text_encoder=text, max_new_tokens=12)


def test_qwen_generates_and_snaps_to_the_vocabulary(tiny, frames, text):
    dets = [_ego("person", 10.0, 0.0)]
    out = tiny.describe(frames, dets)
    assert tiny.name == "tiny_qwen_vl" and tiny.stand_in
    assert tiny.last_frames == 4  # K + 1 of the 6 given
    assert out in RISK_VOCABULARY
    info = tiny.last
    assert isinstance(info["raw"], str) and info["description"] == out
    assert info["sentence"] and not info["fallback"]  # seed 0 answers some (random) text
    e = text.encode([info["sentence"], *RISK_VOCABULARY])  # the nearest entry by the text tower
    assert RISK_VOCABULARY[int(np.argmax(e[1:] @ e[0]))] == out
    assert info["similarity"] == pytest.approx(float(np.max(e[1:] @ e[0])), abs=1e-5)
    assert tiny.describe(frames[-2:], dets) in RISK_VOCABULARY and tiny.last_frames == 2


def test_qwen_snap_threshold_and_raw(text, frames):
    from drivemind.vlm.reasoners import QwenVLReasoner

    raw = QwenVLReasoner.tiny(seed=0, text_encoder=text, max_new_tokens=12, snap=False)
    out = raw.describe(frames, [])
    assert out == clean_sentence(raw.last["raw"])
    strict = QwenVLReasoner.tiny(seed=0, text_encoder=text, max_new_tokens=12, min_similarity=0.99)
    assert strict.describe(frames, []) == out  # random text is far from every entry: kept as is
    assert strict.snap_to_vocabulary("a dog is running across the street")[0] == ANIMAL


class _NanEncoder:
    """A text encoder double returning NaN embeddings (the bad input being tested)."""

    def encode(self, texts):
        return np.full((len(texts), 8), np.nan, np.float32)


def test_qwen_nan_embedding_falls_back_and_is_counted(frames):
    from drivemind.vlm.reasoners import QwenVLReasoner

    r = QwenVLReasoner.tiny(seed=0, text_encoder=_NanEncoder(), max_new_tokens=12)
    dets = [_ego("bicycle", 15.0, 3.0)]
    if not clean_sentence(r.generate_raw(frames, dets)):
        pytest.skip("this random model's answer is empty; the empty-answer path is taken instead")
    assert r.describe(frames, dets) == CYC_MERGING  # the privileged rule on the same detections
    assert r.fallbacks == 1 and r.last["fallback"]
    with pytest.raises(ValueError, match="at least one frame"):
        r.describe([], dets)


def test_qwen_missing_weights_and_folder_loading(tmp_path, monkeypatch, text, frames):
    from huggingface_hub import constants

    from drivemind.vlm.reasoners import DEFAULT_MODEL_ID, ENV_PATH, QwenVLReasoner, build_random_qwen_vl

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv(ENV_PATH, raising=False)
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError) as e:
        QwenVLReasoner(path=missing)
    msg = str(e.value)
    for part in ("config.json", "model.safetensors", "tokenizer.json", str(missing), ENV_PATH,
                 DEFAULT_MODEL_ID, "hf download", "tiny_qwen_vl"):
        assert part in msg, part
    model, tok, _ = build_random_qwen_vl(seed=0)
    folder = tmp_path / "qwen"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    r = QwenVLReasoner(path=folder, text_encoder=text, max_new_tokens=8, max_pixels=112 * 112)
    ref = QwenVLReasoner.tiny(seed=0, text_encoder=text, max_new_tokens=8)
    assert r.path == folder and not r.stand_in
    assert r.generate_raw(frames, []) == ref.generate_raw(frames, [])
