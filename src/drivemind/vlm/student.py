"""A small SmolVLM student that can learn the teacher's JSON on a CPU (``student_smolvlm``).

The tiny random Idefics3 of :func:`drivemind.vlm.smolvlm.build_random_smolvlm` reads bytes with
a 32-wide, 2-layer decoder: the teacher's answer is ~450 byte tokens long, and LoRA steps on that
never produced a parseable answer (docs/benchmarks.md). The student here keeps the same
architecture class and code path (Idefics3 + PEFT LoRA on the text decoder, frozen vision tower
and embeddings, the paper's online distillation) but

- reads a **BPE tokenizer trained in code** (the ``tokenizers`` library, no download) on the
  teacher's own output vocabulary: the privileged teacher's JSON for every situation of the
  caption tables (:func:`teacher_corpus`) plus the system and inference prompts, over the full
  byte alphabet (any text still encodes; an HTTP teacher's wording just takes more tokens). Text
  is split only at JSON and sentence punctuation, so a whole clause of the teacher's wording
  ("the road ahead is clear") becomes one token: the teacher's answer is 11-82 tokens (mean 72)
  instead of ~450 bytes;
- is sized for the CPU (:class:`StudentConfig`: a 128-wide, 4-layer decoder, a 64 px vision input
  giving 16 image tokens), still **random base weights**: everything it knows comes from the
  LoRA steps on the teacher's answers;
- puts LoRA adapters also on ``lm_head`` and the image connector (a random frozen output head
  keeps the logits near uniform; a random frozen connector hides the image) and trains them with
  a learning rate for adapters on a random base (1e-3; the paper's 5e-5 is for adapters on a
  pretrained SmolVLM);
- reads the scene (:class:`StudentGenerator`, the defaults): its image tokens are the frozen
  BEV-CLIP tower's embedding of the BEV through a trained connector (its own random vision tower
  never learnt to read the scene), and its prompt carries the ego's measured speed as a number
  (one BEV frame does not show it); the lr decays over the first 1,500 steps.

The defaults are configs/generator/student_smolvlm.yaml's (``reward.params.generator=
student_smolvlm``); ``python scripts/bench.py distill`` measures how well it learns
(docs/vlm.md).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import asdict, dataclass, fields

from pathlib import Path

import numpy as np

from .prompts import INFERENCE_PROMPT, SYSTEM_PROMPT, PrivilegedTeacher, PromptRequest
from .smolvlm import EOU, IMAGE, SmolVLMGenerator, safe_decode

STUDENT_NAME = "student_smolvlm"


def teacher_corpus(teacher: PrivilegedTeacher | None = None) -> list[str]:
    """The privileged teacher's JSON answer for every situation of the caption tables (speed x
    lane x way ahead x light x collision, :data:`drivemind.vlm.captions.VOCABULARY`), in a fixed
    order: the output vocabulary the student's tokenizer is trained on. No scene is involved."""
    from .captions import VOCABULARY

    teacher = teacher or PrivilegedTeacher()
    keys = list(VOCABULARY)
    out = []
    for combo in itertools.product(*(sorted(VOCABULARY[k]) for k in keys)):
        out.append(teacher.prompts_for(dict(zip(keys, combo))).to_json())
    return out


def student_tokenizer(vocab_size: int = 1024, corpus=None):
    """A byte-level BPE tokenizer trained in code on ``corpus`` (default :func:`teacher_corpus`
    plus the system and inference prompts) with SmolVLM's special tokens, wrapped in
    ``PreTrainedTokenizerFast``. The full byte alphabet is always in the vocabulary, so any text
    encodes. Deterministic for a corpus and size."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from .smolvlm import BOS, EOU, FAKE, GLOBAL, IMAGE, PAD

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 300:
        raise ValueError(f"vocab_size must be an integer >= 300 (256 bytes + special tokens + "
                         f"merges), got {vocab_size!r}")
    if corpus is None:
        trained = Tokenizer.from_str(_default_tokenizer(int(vocab_size)))
    else:
        trained = _train(list(corpus), int(vocab_size))
    return PreTrainedTokenizerFast(tokenizer_object=trained, bos_token=BOS, eos_token=EOU,
                                   pad_token=PAD, additional_special_tokens=[IMAGE, FAKE, GLOBAL])


@functools.lru_cache(maxsize=4)
def _default_tokenizer(vocab_size: int) -> str:
    """The default corpus' trained tokenizer as JSON (trained once per process and size)."""
    return _train(teacher_corpus() + [SYSTEM_PROMPT, INFERENCE_PROMPT], vocab_size).to_str()


def _train(corpus: list, vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from .smolvlm import BOS, EOU, FAKE, GLOBAL, IMAGE, PAD

    corpus = [c for c in corpus if isinstance(c, str) and c]
    if not corpus:
        raise ValueError("the tokenizer corpus is empty: pass teacher answers (JSON text)")
    specials = [BOS, EOU, IMAGE, FAKE, GLOBAL, PAD]
    tk = Tokenizer(models.BPE())
    # split at JSON and sentence punctuation only (not at spaces), so that merges may span a whole
    # clause of the teacher's wording; bytes mapped to printable symbols
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r'[\[\]{}",:;.]'), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab_size), special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(corpus, trainer=trainer)
    return tk


@dataclass(frozen=True)
class StudentConfig:
    """The student's sizes (configs/generator/student_smolvlm.yaml holds the same defaults)."""

    vocab_size: int = 1024  # BPE vocabulary trained on the teacher's outputs
    hidden_size: int = 128  # text decoder width
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    image_size: int = 64  # vision input (px); patch 8 and pixel shuffle 2 -> 16 image tokens
    patch_size: int = 8
    vision_hidden_size: int = 64
    vision_layers: int = 1

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> "StudentConfig":
        names = [f.name for f in fields(cls)]
        bad = sorted(set(kwargs) - set(names))
        if bad:
            raise ValueError(f"unknown student size option(s) {bad}; valid: {', '.join(names)}")
        for k, v in kwargs.items():
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"student option {k} must be a positive integer, got {v!r}")
        cfg = cls(**kwargs)
        if cfg.hidden_size % cfg.num_attention_heads or cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ValueError(f"hidden_size ({cfg.hidden_size}) must be divisible by "
                             f"num_attention_heads ({cfg.num_attention_heads}), and that by "
                             f"num_key_value_heads ({cfg.num_key_value_heads})")
        if cfg.image_size % (cfg.patch_size * 2):
            raise ValueError(f"image_size ({cfg.image_size}) must be a multiple of 2 x patch_size "
                             f"({2 * cfg.patch_size}) for the pixel shuffle")
        return cfg

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def build_student_smolvlm(config: StudentConfig | None = None, seed: int = 0):
    """A randomly initialised Idefics3 model of ``config``'s sizes with :func:`student_tokenizer`
    and a torchvision-free image processor: ``(model, tokenizer, image_processor)``."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil

    from .smolvlm import BOS, EOU, IMAGE, PAD

    c = config or StudentConfig()
    tok = student_tokenizer(c.vocab_size)
    ids = {t: tok.convert_tokens_to_ids(t) for t in (BOS, EOU, IMAGE, PAD)}
    vision = dict(hidden_size=c.vision_hidden_size, intermediate_size=2 * c.vision_hidden_size,
                  num_hidden_layers=c.vision_layers, num_attention_heads=2,
                  image_size=c.image_size, patch_size=c.patch_size)
    text = dict(vocab_size=len(tok), hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                num_key_value_heads=c.num_key_value_heads, max_position_embeddings=2048,
                model_type="llama", bos_token_id=ids[BOS], eos_token_id=ids[EOU],
                pad_token_id=ids[PAD], tie_word_embeddings=False)
    cfg = Idefics3Config(vision_config=vision, text_config=text, image_token_id=ids[IMAGE],
                         scale_factor=2, pad_token_id=ids[PAD])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = Idefics3ForConditionalGeneration(cfg)
    s = c.image_size
    proc = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": s},
                                     max_image_size={"longest_edge": s})
    return model.eval(), tok, proc


# the generator's defaults for the student (configs/generator/student_smolvlm.yaml): the frozen
# BEV-CLIP tower's embedding through a trained connector as its image tokens, the ego's speed in
# its prompt, the learning rate decayed over the first 1500 steps (docs/benchmarks.md: agreement
# 0.675 against the best constant answer's 0.475). The paper's path (the model's own random vision
# tower, no measurements, a constant lr) is image_features="idefics3", measurements=[],
# lr_decay_steps=0.
STUDENT_DEFAULTS = dict(lr=1e-3, lora_rank=16, lora_alpha=32, max_new_tokens=96,
                        image_features="bev_clip", image_tokens=4, measurements=["speed_kmh"],
                        lr_decay_steps=1500)

# what the student's image tokens are made of (StudentGenerator's ``image_features``)
IMAGE_FEATURES = ("idefics3", "bev_clip")
# the ego's own measurements (what the car's sensors give: speedometer, controls, IMU; nothing
# about other actors) that may be written into the student's prompt, as Roach gives its policy
# a measurement vector beside the BEV; name -> (word in the prompt, number format)
EGO_MEASUREMENTS = {
    "speed_kmh": ("speed", "{:.0f} km/h"),
    "steer": ("steer", "{:+.2f}"),
    "throttle": ("throttle", "{:.2f}"),
    "brake": ("brake", "{:.2f}"),
    "accel": ("acceleration", "{:+.1f} m/s2"),
    "yaw_rate": ("yaw rate", "{:+.2f} rad/s"),
}


def measurement_text(facts: dict, keys) -> str:
    """The ego's measurements ``keys`` (of :data:`EGO_MEASUREMENTS`) as one sentence of numbers,
    e.g. ``"Measurements: speed 31 km/h."``; empty without keys. A key missing from ``facts`` (or
    not a finite number) raises a ValueError naming it."""
    keys = tuple(keys)
    if not keys:
        return ""
    parts = []
    for k in keys:
        word, fmt = EGO_MEASUREMENTS[k]
        try:
            v = float(facts[k])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"the student reads the ego measurement {k!r} but the prompt request's "
                             f"facts lack it (or it is not a number): pass it in "
                             f"PromptRequest.facts, or drop it from measurements") from None
        if not math.isfinite(v):
            raise ValueError(f"the ego measurement {k!r} is {v}: pass a finite number")
        parts.append(f"{word} {fmt.format(v)}")
    return "Measurements: " + ", ".join(parts) + "."


def _check_measurements(measurements) -> tuple:
    if isinstance(measurements, str):
        measurements = (measurements,)
    try:
        keys = tuple(measurements or ())
    except TypeError:
        raise ValueError(f"measurements must be a list of ego measurement names, got "
                         f"{measurements!r}") from None
    bad = [k for k in keys if k not in EGO_MEASUREMENTS]
    if bad:
        raise ValueError(f"unknown ego measurement(s) {bad}; valid: {', '.join(EGO_MEASUREMENTS)} "
                         f"(the ego's own sensors only: nothing about other actors)")
    if len(set(keys)) != len(keys):
        raise ValueError(f"measurements lists a name twice: {list(keys)}")
    return keys


def _targets() -> str:
    """LoRA on the paper's decoder projections, plus the output head and the image connector: a
    random base has no trained output head (its logits stay near uniform, so the loss cannot fall
    although the argmax is right) and no trained image projection; a pretrained SmolVLM has both."""
    from .smolvlm import LORA_TARGETS

    return LORA_TARGETS + r"|lm_head|.*connector\.modality_projection\.proj"


CONNECTOR_FILE = "student_connector.pt"


def _connector_class():
    import torch
    from torch import nn

    class Connector(nn.Module):
        """BEV-CLIP embedding -> ``tokens`` decoder input vectors: the embedding standardised per
        dimension by running statistics of the embeddings seen in training (BEV-CLIP's unit
        vectors share a large common direction; their scene-dependent part is small), then a
        2-layer MLP. The statistics are buffers, saved with the weights."""

        def __init__(self, dim: int, hidden: int, tokens: int, momentum: float = 0.01):
            super().__init__()
            self.momentum = float(momentum)
            self.register_buffer("mean", torch.zeros(dim))
            self.register_buffer("var", torch.ones(dim))
            self.register_buffer("count", torch.zeros((), dtype=torch.long))
            self.mlp = nn.Sequential(nn.Linear(dim, 2 * hidden), nn.GELU(),
                                     nn.Linear(2 * hidden, tokens * hidden))

        @torch.no_grad()
        def observe(self, x: torch.Tensor) -> None:
            """Update the running mean and variance with a training embedding (an average over
            all seen until 1/momentum samples, then an exponential one)."""
            x = x.reshape(-1, x.shape[-1]).mean(0)
            self.count += 1
            m = max(self.momentum, 1.0 / float(self.count))
            d = x - self.mean
            self.mean += m * d
            self.var.copy_((1 - m) * (self.var + m * d * d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.count > 1:
                x = (x - self.mean) / (self.var.sqrt() + 1e-3)
            else:
                x = x - self.mean
            return self.mlp(x)

    return Connector


class StudentGenerator(SmolVLMGenerator):
    """:class:`~drivemind.vlm.smolvlm.SmolVLMGenerator` with two inputs a CPU-sized random student
    needs to read the scene (docs/vlm.md, student_smolvlm):

    - ``image_features``: ``"idefics3"`` (the model's own random, frozen vision tower and its
      connector, the paper's path) or ``"bev_clip"``: the frozen BEV-CLIP image tower's embedding
      of the BEV masks (:class:`~drivemind.vlm.bev_clip.BevClip`, the shipped checkpoint for the
      request's BEV shape, or ``bev_clip_weights``), mapped by a small **trained connector** (a
      2-layer MLP, trained with the LoRA adapters by the same AdamW) to ``image_tokens`` vectors
      that take the place of the ``<image>`` tokens in the decoder's input embeddings
      (``inputs_embeds``, the same merge Idefics3's ``inputs_merger`` does with its own
      connector's output);
    - ``measurements``: ego measurements (:data:`EGO_MEASUREMENTS`, e.g. ``("speed_kmh",)``)
      written as numbers after the inference prompt (:func:`measurement_text`), read from the
      request's facts: what the car's own sensors give (a single BEV frame does not show the
      ego's speed), never facts about other actors;
    - ``lr_decay_steps``: the lr falls (cosine) from ``lr`` to ``lr / 10`` over that many LoRA
      steps (counted from this object's first step), then stays; 0 keeps it constant.

    The connector's input is standardised by running statistics of the embeddings seen in
    ``learn`` (buffers saved with it). With ``image_features="idefics3"``, no measurements and
    ``lr_decay_steps=0`` it is exactly SmolVLMGenerator."""

    def __init__(self, *, image_features: str = "idefics3", image_tokens: int = 4,
                 measurements=(), bev_clip_weights=None, lr_decay_steps: int = 0,
                 seed: int = 0, **kwargs):
        import torch

        if image_features not in IMAGE_FEATURES:
            raise ValueError(f"unknown image_features {image_features!r}; valid: "
                             f"{', '.join(IMAGE_FEATURES)}")
        if isinstance(image_tokens, bool) or not isinstance(image_tokens, int) or image_tokens < 1:
            raise ValueError(f"image_tokens must be a positive integer, got {image_tokens!r}")
        if isinstance(lr_decay_steps, bool) or not isinstance(lr_decay_steps, int) or lr_decay_steps < 0:
            raise ValueError(f"lr_decay_steps must be an integer >= 0 (0: a constant lr), got "
                             f"{lr_decay_steps!r}")
        self.lr_decay_steps = int(lr_decay_steps)
        self.measurements = _check_measurements(measurements)
        self.image_features = image_features
        self.bev_clip_weights = bev_clip_weights
        self._bev_clip = None
        self.connector = None
        adapter_path = kwargs.get("adapter_path")
        super().__init__(**kwargs)
        if image_features == "bev_clip":
            from .text import TEXT_DIM

            h = int(self.model.get_input_embeddings().weight.shape[1])
            self.image_seq_len = int(image_tokens)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed) + 1)
                self.connector = _connector_class()(TEXT_DIM, h, int(image_tokens))
            self.connector.to(device=self.device, dtype=self.dtype)
            if adapter_path is not None:
                f = Path(adapter_path).expanduser() / CONNECTOR_FILE
                if not f.is_file():
                    raise FileNotFoundError(f"{f} not found: an image_features='bev_clip' student's "
                                            f"adapter folder holds its connector too (written by "
                                            f"save_adapter)")
                self.connector.load_state_dict(torch.load(f, map_location=self.device,
                                                          weights_only=True))
            self.optimizer.add_param_group({"params": list(self.connector.parameters())})

    def current_lr(self) -> float:
        """The learning rate of the next step: ``lr`` constant (``lr_decay_steps=0``, the paper's),
        else a cosine from ``lr`` to ``lr / 10`` over the first ``lr_decay_steps`` steps, then
        ``lr / 10``."""
        if not self.lr_decay_steps:
            return self.lr
        t = min(self.steps, self.lr_decay_steps) / self.lr_decay_steps
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    def learn(self, request: PromptRequest, target_text: str) -> float:
        lr = self.current_lr()
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        return super().learn(request, target_text)

    # ------------------------------------------------------------------ inputs
    def prompt_text(self, request: PromptRequest | None = None) -> str:
        text = super().prompt_text()
        if self.measurements and request is not None:
            head, sep, tail = text.rpartition(EOU + "\nAssistant:")
            text = f"{head} {measurement_text(request.facts, self.measurements)}{sep}{tail}"
        return text

    def bev_clip(self, bev_shape):
        """The frozen BEV-CLIP tower for ``bev_shape`` (loaded once)."""
        from .bev_clip import BevClip

        if self._bev_clip is None or self._bev_clip.bev_shape != tuple(bev_shape):
            tower = BevClip.load(self.bev_clip_weights, bev_shape=tuple(bev_shape))
            for p in tower.parameters():
                p.requires_grad_(False)
            self._bev_clip = tower.eval()
        return self._bev_clip

    def _model_inputs(self, request: PromptRequest, answer_ids=None) -> dict:
        """The decoder's inputs for ``request`` (and the teacher's answer tokens appended):
        ``input_ids`` + ``pixel_values`` for the Idefics3 tower, ``inputs_embeds`` (the token
        embeddings with the connector's vectors at the image tokens) for BEV-CLIP."""
        import torch

        if not isinstance(request, PromptRequest):
            raise TypeError(f"expected a PromptRequest, got {type(request).__name__}")
        text = self.prompt_text(request)
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        ids = ids.to(self.device)
        if answer_ids is not None:
            ids = torch.cat([ids, torch.tensor([answer_ids], dtype=torch.long, device=self.device)], 1)
        if self.image_features == "idefics3":
            _, px, pmask = self._inputs(request)
            return {"input_ids": ids, "pixel_values": px, "pixel_attention_mask": pmask}
        if request.bev is None:
            raise ValueError("image_features='bev_clip' reads the request's BEV masks, but "
                             "PromptRequest.bev is None: pass the BEV (uint8 C x H x W), or use "
                             "image_features='idefics3' for RGB frames")
        bev = np.asarray(request.bev)
        if bev.ndim != 3 or bev.dtype != np.uint8:
            raise ValueError(f"PromptRequest.bev must be uint8 masks (C, H, W), got {bev.dtype} "
                             f"{bev.shape}")
        tower = self.bev_clip(bev.shape)
        emb = torch.as_tensor(tower.embed(bev), device=self.device, dtype=self.dtype)
        if answer_ids is not None and self.model.training:  # a learn step: the statistics move
            self.connector.observe(emb)
        feats = self.connector(emb).reshape(-1, self.model.get_input_embeddings().weight.shape[1])
        embeds = self.model.get_input_embeddings()(ids)
        mask = (ids == self.ids[IMAGE]).unsqueeze(-1).expand_as(embeds)
        embeds = embeds.masked_scatter(mask, feats.to(embeds.dtype))
        return {"inputs_embeds": embeds}

    # ------------------------------------------------------------------ the slot
    def generate(self, request: PromptRequest) -> str:
        import torch

        with self._lock:
            self.model.eval()
            with torch.no_grad():
                inputs = self._model_inputs(request)
                first = next(iter(inputs.values()))
                n = first.shape[1]
                out = self.model.generate(
                    **inputs, attention_mask=torch.ones(first.shape[:2], dtype=torch.long,
                                                        device=self.device),
                    max_new_tokens=self.max_new_tokens, do_sample=False,
                    eos_token_id=self.ids[EOU], pad_token_id=self.pad_id)
            # with input ids the output repeats them; from embeddings it holds the new tokens only
            new = out[0, n:] if "input_ids" in inputs else out[0]
            return safe_decode(self.tokenizer, new.tolist()).strip()

    def _loss_terms(self, request, target_text):
        import torch
        import torch.nn.functional as F

        ans, is_cot = self._answer(target_text)
        inputs = self._model_inputs(request, answer_ids=ans)
        first = next(iter(inputs.values()))
        a = torch.tensor(ans, dtype=torch.long, device=self.device)
        out = self.model(**inputs, attention_mask=torch.ones(first.shape[:2], dtype=torch.long,
                                                             device=self.device),
                         logits_to_keep=len(ans) + 1)
        logits = out.logits[0, :-1].float()  # position i predicts answer token i
        ce = F.cross_entropy(logits, a, reduction="none")
        cot = torch.tensor(is_cot, dtype=torch.bool, device=self.device)
        zero = ce.new_zeros(())
        prompt_ce = ce[~cot].mean() if (~cot).any() else zero
        cot_ce = ce[cot].mean() if cot.any() else zero
        return prompt_ce, cot_ce

    def save_adapter(self, folder) -> Path:
        import torch

        folder = super().save_adapter(folder)
        if self.connector is not None:
            with self._lock:
                torch.save({k: v.detach().cpu() for k, v in self.connector.state_dict().items()},
                           folder / CONNECTOR_FILE)
        return folder

    def trainable_parameters(self) -> dict:
        out = super().trainable_parameters()
        if self.connector is not None:
            out.update({f"connector.{n}": p for n, p in self.connector.named_parameters()})
        return out

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] + f", image_features={self.image_features!r}, "
                f"measurements={list(self.measurements)})")


def make_student(seed: int = 0, **kwargs):
    """The ``student_smolvlm`` generator: :class:`StudentGenerator` on
    :func:`build_student_smolvlm` (random base weights). ``kwargs``: :class:`StudentConfig`'s
    sizes, SmolVLMGenerator's options (``lr``, ``lora_rank``, ``max_new_tokens``, ...) and
    StudentGenerator's (``image_features``, ``image_tokens``, ``measurements``,
    ``bev_clip_weights``); defaults ``STUDENT_DEFAULTS``."""
    import inspect

    names = {f.name for f in fields(StudentConfig)}
    sizes = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
    if "path" in kwargs or "_parts" in kwargs:
        raise ValueError("student_smolvlm builds its own random model; use the generator kind "
                         "'smolvlm' with path=DIR for a checkpoint")
    gen_opts = [n for cls in (StudentGenerator, SmolVLMGenerator)
                for n in inspect.signature(cls.__init__).parameters
                if n not in ("self", "path", "_parts", "kwargs", "seed")]
    bad = sorted(set(kwargs) - set(gen_opts))
    if bad:
        raise ValueError(f"unknown student_smolvlm option(s) {bad}; valid: "
                         f"{', '.join(sorted(names) + gen_opts)}, seed")
    if "measurements" in kwargs and kwargs["measurements"] is not None:
        kwargs["measurements"] = tuple(kwargs["measurements"]) if not isinstance(
            kwargs["measurements"], str) else kwargs["measurements"]
    opts = {**STUDENT_DEFAULTS, "lora_targets": _targets(), **kwargs}
    gen = StudentGenerator(_parts=build_student_smolvlm(StudentConfig.from_kwargs(sizes), seed),
                           seed=seed, **opts)
    gen.name = STUDENT_NAME
    gen.stand_in = True
    return gen
