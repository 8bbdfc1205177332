"""SmolVLM + PEFT LoRA prompt generator (drivemind.vlm.smolvlm / generators) on tiny random
Idefics3 models built in code with a byte-level tokenizer: real transformers and peft classes,
offline, no checkpoint needed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402

from drivemind.envs import FACT_KEYS  # noqa: E402
from drivemind.vlm.generators import KINDS, DistilledGenerator, make_generator  # noqa: E402
from drivemind.vlm.prompts import (  # noqa: E402
    INFERENCE_PROMPT, SYSTEM_PROMPT, MalformedPrompt, PrivilegedTeacher, PromptRequest,
    parse_prompt_json)
from drivemind.vlm.smolvlm import (  # noqa: E402
    DEFAULT_MODEL_ID, ENV_PATH, EOU, IMAGE, SmolVLMGenerator, safe_decode, save_random_smolvlm)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _request(seed=0, **facts):
    base = {k: 0.0 for k in FACT_KEYS}
    base.update(speed_kmh=30.0, light_state=2, light_distance=20.0, lead_distance=8.0,
                lead_speed_kmh=10.0)
    base.update(facts)
    rng = np.random.default_rng(seed)
    bev = ((rng.random((15, 64, 64)) > 0.85) * 255).astype(np.uint8)
    return PromptRequest(facts=base, bev=bev, step=seed)


@pytest.fixture(scope="module")
def req():
    return _request()


@pytest.fixture(scope="module")
def target(req):
    return PrivilegedTeacher().generate(req)


def _tiny(**kw):
    kw.setdefault("max_new_tokens", 12)
    return SmolVLMGenerator.tiny(seed=0, **kw)


# ---------------------------------------------------------------------- generation
def test_generate_returns_raw_text_and_inputs_follow_the_chat_template(req):
    g = _tiny()
    assert g.name == "tiny_smolvlm" and g.stand_in
    text = g.prompt_text()
    assert SYSTEM_PROMPT in text and INFERENCE_PROMPT in text and text.endswith("Assistant:")
    assert text.count(IMAGE) == g.image_seq_len == 4  # (32 / 8)^2 / 2^2
    ids, px, pmask = g._inputs(req)
    assert int((ids == g.model.config.image_token_id).sum()) == g.image_seq_len
    assert tuple(px.shape) == (1, 1, 3, 32, 32) and float(px.abs().max()) <= 1.0
    other = g._inputs(_request(seed=5))[1]
    assert not torch.equal(px, other)  # the image is the request's BEV
    out = g.generate(req)
    assert isinstance(out, str)
    assert out == g.generate(req)  # greedy decoding
    # a random model's answer is not the JSON contract: reported, never raised by generate
    with pytest.raises(MalformedPrompt):
        parse_prompt_json(out)


def test_generate_needs_an_image():
    g = _tiny()
    with pytest.raises(ValueError, match="no image"):
        g.generate(PromptRequest(facts={}))


def test_safe_decode_skips_ids_outside_the_vocabulary():
    g = _tiny()
    n = len(g.tokenizer)
    hi = g.tokenizer("hi", add_special_tokens=False)["input_ids"]
    assert safe_decode(g.tokenizer, hi + [n + 5, -1, 10 ** 6]) == "hi"


# ---------------------------------------------------------------------- LoRA steps
def test_lora_step_changes_only_adapter_weights(req, target):
    g = _tiny()
    before = {n: p.detach().clone() for n, p in g.model.named_parameters()}
    trainable = g.trainable_parameters()
    assert trainable and all(".lora_" in n for n in trainable)
    # adapters only on the text decoder's q/k/v/o and gate/up/down projections
    assert not any("vision_model" in n or "connector" in n for n in trainable)
    mods = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable}
    assert mods == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    loss = g.learn(req, target)
    assert math.isfinite(loss) and g.steps == 1
    changed = {n for n, p in g.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= set(trainable)
    assert any("lora_B" in n for n in changed)


def test_repeated_steps_on_one_target_lower_its_loss(req, target):
    g = _tiny(lr=1e-2)
    p0, c0 = g.loss_terms(req, target)
    losses = [g.learn(req, target) for _ in range(8)]
    p1, c1 = g.loss_terms(req, target)
    assert losses[-1] < losses[0]
    assert p1 + c1 < p0 + c0 - 0.05


def test_loss_masks_and_cot_weight(req, target):
    g = _tiny(cot_weight=0.0)
    ids, is_cot = g._answer(target)
    ps = parse_prompt_json(target)
    # the answer is the teacher's JSON re-serialised (= PromptSet.to_json) + end of utterance
    assert g.tokenizer.decode(ids) == " " + ps.to_json() + EOU
    cot_text = g.tokenizer.decode([i for i, c in zip(ids, is_cot) if c])
    prompt_text = g.tokenizer.decode([i for i, c in zip(ids, is_cot) if not c])
    assert cot_text == ' {"cot_explanation": ' + json.dumps(list(ps.cot)) + ", "
    assert prompt_text.startswith('"present_prompt": ') and prompt_text.endswith("}" + EOU)
    p, c = g.loss_terms(req, target)

    # independent check: transformers' own loss with every non-prompt (resp. non-CoT) label masked
    prefix, px, pmask = g._inputs(req)
    full = torch.cat([prefix, torch.tensor([ids])], 1)
    for want, keep in ((p, 0), (c, 1)):
        labels = torch.full_like(full, -100)
        for j, (i, flag) in enumerate(zip(ids, is_cot)):
            if flag == keep:
                labels[0, prefix.shape[1] + j] = i
        with torch.no_grad():
            ref = g.model(input_ids=full, pixel_values=px, pixel_attention_mask=pmask,
                          labels=labels).loss
        assert float(ref) == pytest.approx(want, rel=1e-5)

    # the step's loss is CE(prompt) + lambda * CE(CoT), evaluated before the update
    assert g.learn(req, target) == pytest.approx(p, rel=1e-5)
    assert _tiny(cot_weight=2.0).learn(req, target) == pytest.approx(p + 2.0 * c, rel=1e-5)
    assert _tiny(cot_weight=1.0).learn(req, target) == pytest.approx(p + c, rel=1e-5)


def test_malformed_target_raises_and_takes_no_step(req):
    g = _tiny()
    with pytest.raises(MalformedPrompt):
        g.learn(req, '{"present_prompt": "x"')
    assert g.steps == 0


def test_nonfinite_loss_skips_the_step(req, target):
    g = _tiny()
    name, p = next((n, p) for n, p in g.trainable_parameters().items() if "lora_A" in n)
    with torch.no_grad():
        p.fill_(float("nan"))
    others = {n: q.detach().clone() for n, q in g.trainable_parameters().items() if n != name}
    assert math.isnan(g.learn(req, target))
    assert g.nonfinite_losses == 1 and g.steps == 0
    for n, q in g.trainable_parameters().items():
        if n != name:
            assert torch.equal(q, others[n])


# ---------------------------------------------------------------------- adapters
def test_adapter_save_load_reproduces_outputs(req, target, tmp_path):
    g = _tiny(lr=1e-2)
    for _ in range(3):
        g.learn(req, target)
    out, terms = g.generate(req), g.loss_terms(req, target)
    folder = g.save_adapter(tmp_path / "adapter")
    assert (folder / "adapter_model.safetensors").is_file() and (folder / "adapter_config.json").is_file()
    g2 = _tiny(adapter_path=folder)
    assert g2.generate(req) == out
    assert g2.loss_terms(req, target) == pytest.approx(terms, rel=1e-6)
    assert _tiny().loss_terms(req, target) != pytest.approx(terms, rel=1e-3)  # the adapter matters
    g2.learn(req, target)  # a loaded adapter keeps training
    assert g2.loss_terms(req, target) != pytest.approx(terms, rel=1e-6)


def test_missing_adapter_files_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors") as e:
        _tiny(adapter_path=tmp_path)
    assert str(tmp_path) in str(e.value)


# ---------------------------------------------------------------------- loading weights
@pytest.fixture
def empty_hf_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.delenv(ENV_PATH, raising=False)
    return cache


def test_missing_weights_one_clear_error(tmp_path, empty_hf_cache):
    missing = tmp_path / "no-such-folder"
    with pytest.raises(FileNotFoundError) as e:
        SmolVLMGenerator(path=missing)
    msg = str(e.value)
    for part in ("config.json", "model.safetensors", "tokenizer.json", str(missing), ENV_PATH,
                 str(empty_hf_cache), DEFAULT_MODEL_ID, "hf download", "tiny_smolvlm"):
        assert part in msg, part
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"partial \(lacks model.safetensors.*tokenizer.json"):
        SmolVLMGenerator(path=partial)
    with pytest.raises(FileNotFoundError, match="no snapshot of HuggingFaceTB/SmolVLM-500M-Instruct"):
        SmolVLMGenerator(path="HuggingFaceTB/SmolVLM-500M-Instruct")


def test_loads_a_checkpoint_folder_the_env_variable_and_the_hf_cache(req, tmp_path, empty_hf_cache,
                                                                    monkeypatch):
    folder = save_random_smolvlm(tmp_path / "ckpt", seed=0)
    ref = _tiny(max_new_tokens=8).generate(req)
    g = SmolVLMGenerator(path=folder, max_new_tokens=8)
    assert g.path == folder and not g.stand_in and g.generate(req) == ref
    monkeypatch.setenv(ENV_PATH, str(folder))
    assert SmolVLMGenerator(max_new_tokens=8).path == folder
    monkeypatch.delenv(ENV_PATH)
    # a Hugging Face cache snapshot of the default id, laid out as `hf download` leaves it
    repo = empty_hf_cache / ("models--" + DEFAULT_MODEL_ID.replace("/", "--"))
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    for f in folder.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    g = SmolVLMGenerator(max_new_tokens=8)
    assert g.path == snap and g.generate(req) == ref


def test_wrong_checkpoint_type_is_refused(tmp_path, empty_hf_cache):
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / f).write_text("{}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="'bert' model"):
        SmolVLMGenerator(path=tmp_path)


@pytest.mark.parametrize("bad", [{"lora_rank": 0}, {"lr": float("nan")}, {"cot_weight": -1.0},
                                 {"max_new_tokens": 0}, {"dtype": "int8"}])
def test_bad_options(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        _tiny(**bad)


# ---------------------------------------------------------------------- distillation + factory
class _Teacher:
    """A teacher double returning fixed text (or raising), for the wrapper's bookkeeping."""

    stand_in = True

    def __init__(self, text=None, error=None):
        self.name, self.text, self.error = "double", text, error

    def generate(self, request):
        if self.error:
            raise self.error
        return self.text


def test_distilled_generator_learns_each_request_and_answers_with_the_student(req, target):
    gen = make_generator("tiny_smolvlm", max_new_tokens=8)
    assert isinstance(gen, DistilledGenerator) and gen.stand_in
    assert gen.name == "tiny_smolvlm<-privileged_teacher"
    out = gen.generate(req)
    assert isinstance(out, str) and out != target
    s = gen.stats()
    assert s["distill_steps"] == 1 == gen.student.steps and math.isfinite(s["mean_loss"])
    gen.generate(_request(seed=1, speed_kmh=0.5))
    assert gen.stats()["distill_steps"] == 2


def test_distilled_generator_warmup_returns_the_teacher_labels(req, target):
    gen = DistilledGenerator(_tiny(), _Teacher(target), warmup=2)
    assert [gen.generate(req) == target for _ in range(3)] == [True, True, False]
    assert gen.steps == 3


def test_distilled_generator_counts_teacher_failures(req):
    gen = DistilledGenerator(_tiny(), _Teacher("no json here"))
    assert isinstance(gen.generate(req), str)
    gen.teacher = _Teacher(error=ConnectionError("down"))
    assert isinstance(gen.generate(req), str)
    s = gen.stats()
    assert s["teacher_malformed"] == 1 and s["teacher_errors"] == 1 and s["distill_steps"] == 0
    assert gen.student.steps == 0


def test_make_generator_kinds():
    assert isinstance(make_generator("privileged_teacher"), PrivilegedTeacher)
    with pytest.raises(ValueError) as e:
        make_generator("gpt5")
    assert all(k in str(e.value) for k in KINDS)
    with pytest.raises(ValueError, match="valid teacher kinds: privileged_teacher, http"):
        make_generator("tiny_smolvlm", teacher="smolvlm")
    with pytest.raises(ValueError, match="never taken from configuration"):
        make_generator("http", base_url="http://localhost:1/v1", api_key="sk-x")
    student = make_generator("tiny_smolvlm", teacher=None)
    assert isinstance(student, SmolVLMGenerator) and student.name == "tiny_smolvlm"


def test_distilled_generator_saves_adapters(req, target, tmp_path):
    gen = make_generator("tiny_smolvlm", max_new_tokens=4, save_dir=str(tmp_path / "a"),
                         save_every=1)
    gen.generate(req)
    assert (Path(tmp_path) / "a" / "adapter_model.safetensors").is_file()


def test_to_rgb_colours_masks_and_passes_frames():
    from drivemind.bev.config import BevConfig
    from drivemind.bev.renderer import masks_to_rgb
    from drivemind.vlm.smolvlm import to_rgb

    bev = _request().bev
    np.testing.assert_array_equal(to_rgb(bev), masks_to_rgb(bev))
    cfg = {"size": 64, "history": [-6, -1]}  # a config-file dict is turned into a BevConfig
    small = bev[:BevConfig(size=64, history=(-6, -1)).n_channels]
    np.testing.assert_array_equal(to_rgb(small, cfg), masks_to_rgb(small, BevConfig(**cfg)))
    frame = np.zeros((20, 30, 3), np.uint8)
    assert to_rgb(frame) is frame
    with pytest.raises(ValueError, match="uint8"):
        to_rgb(np.zeros((20, 30, 3), np.float32))
