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
  pretrained SmolVLM).

The defaults are configs/generator/student_smolvlm.yaml's (``reward.params.generator=
student_smolvlm``); ``python scripts/bench.py distill`` measures how well it learns
(docs/vlm.md).
"""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import asdict, dataclass, fields

from .prompts import INFERENCE_PROMPT, SYSTEM_PROMPT, PrivilegedTeacher

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


# the generator's defaults for the student (configs/generator/student_smolvlm.yaml)
STUDENT_DEFAULTS = dict(lr=1e-3, lora_rank=16, lora_alpha=32, max_new_tokens=96)


def _targets() -> str:
    """LoRA on the paper's decoder projections, plus the output head and the image connector: a
    random base has no trained output head (its logits stay near uniform, so the loss cannot fall
    although the argmax is right) and no trained image projection; a pretrained SmolVLM has both."""
    from .smolvlm import LORA_TARGETS

    return LORA_TARGETS + r"|lm_head|.*connector\.modality_projection\.proj"


def make_student(seed: int = 0, **kwargs):
    """The ``student_smolvlm`` generator: :class:`~drivemind.vlm.smolvlm.SmolVLMGenerator` on
    :func:`build_student_smolvlm` (random base weights). ``kwargs``: :class:`StudentConfig`'s
    sizes and SmolVLMGenerator's options (``lr``, ``lora_rank``, ``max_new_tokens``, ...;
    defaults ``STUDENT_DEFAULTS``)."""
    from .smolvlm import SmolVLMGenerator

    names = {f.name for f in fields(StudentConfig)}
    sizes = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
    if "path" in kwargs or "_parts" in kwargs:
        raise ValueError("student_smolvlm builds its own random model; use the generator kind "
                         "'smolvlm' with path=DIR for a checkpoint")
    import inspect

    gen_opts = [n for n in inspect.signature(SmolVLMGenerator.__init__).parameters
                if n not in ("self", "path", "_parts")]
    bad = sorted(set(kwargs) - set(gen_opts))
    if bad:
        raise ValueError(f"unknown student_smolvlm option(s) {bad}; valid: "
                         f"{', '.join(sorted(names) + gen_opts)}, seed")
    opts = {**STUDENT_DEFAULTS, "lora_targets": _targets(), **kwargs}
    gen = SmolVLMGenerator(_parts=build_student_smolvlm(StudentConfig.from_kwargs(sizes), seed), **opts)
    gen.name = STUDENT_NAME
    gen.stand_in = True
    return gen
