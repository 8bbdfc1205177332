"""Reasoner slot of DriveVLM-RL's dynamic pathway: the risk description l_dyn.

When the detector gate fires, an LVLM reads the last K+1 frames (K = 3, oldest first) and the
detections and writes a one-sentence risk description ``l_dyn``, drawing on a reference
vocabulary of canonical descriptions (``RISK_VOCABULARY``, ten entries as in the paper, e.g.
"a pedestrian is crossing the road ahead", "a cyclist is merging into the ego lane"). Reasoners
have ``name``, ``stand_in`` and ``describe(frames, detections) -> str``:

- :class:`PrivilegedReasoner` (default; a **stand-in for Qwen3-VL-4B**): picks the canonical
  description from the detections alone (class, position relative to the ego lane, distance),
  by fixed rules; it ignores the frames. It lives in ``drivemind.privileged`` (with
  ``RISK_VOCABULARY``), below the env, which computes its ``risk_id`` fact with it.
- :class:`QwenVLReasoner`: Qwen2.5-VL (``Qwen/Qwen2.5-VL-3B-Instruct`` or any local
  Qwen2-VL/Qwen2.5-VL checkpoint; the paper used Qwen3-VL-4B, which this class does not load)
  generates a sentence from the frames and a text listing of the detections; the sentence is then
  **snapped** to the nearest vocabulary entry by a text encoder (MiniLM by default), so l_dyn
  stays in the vocabulary the reward's text tower embeds consistently. With ``min_similarity`` a
  sentence farther than that from every entry is kept as written (a novel description), and
  ``snap=False`` always keeps the raw sentence. An empty answer, or a non-finite embedding, falls
  back to the privileged rule on the same detections and is counted (``fallbacks``).

Detections are any objects with ``cls`` (or ``name``) and ``score`` attributes, such as
:class:`drivemind.vlm.detectors.Detection`, or dicts with those keys; ``box`` and ``frame``
(``"ego"``: metres, x forward, y right; ``"image"``: pixels) and ``distance`` are used when given.
"""

from __future__ import annotations

import logging
import re
import threading

import numpy as np

from ..privileged import (ANIMAL, ANIMALS, CLEAR, CYC_AHEAD, CYC_MERGING, MOTO_AHEAD,  # noqa: F401
                          MOTO_SIDE, PED_CROSSING, PED_GROUP, PED_ROADSIDE, RISK_VOCABULARY, TOO_CLOSE,
                          VULNERABLE, PrivilegedReasoner, detection_record)
from .smolvlm import _positive, _torch_dtype, byte_tokenizer, resolve_model_folder, safe_decode, to_rgb

log = logging.getLogger(__name__)

WINDOW = 4  # K + 1 frames, K = 3
DEFAULT_MODEL_ID = "Qwen/Qwen2.5-VL-3B-Instruct"
ENV_PATH = "DRIVEMIND_QWENVL_PATH"


# ----------------------------------------------------------------------------- detections
def describe_detections(detections, image_shape=None) -> str:
    """A text listing of the detections for the LVLM's prompt."""
    lines = []
    for r in (detection_record(d) for d in detections):
        s = f"- {r['cls']} (score {r['score']:.2f})"
        b = r["box"]
        if b is not None and r["frame"] == "ego":
            x, y = max(b[0], 0.0), 0.5 * (b[1] + b[3])
            side = "right" if y > 0 else "left"
            s += f": {x:.1f} m ahead, {abs(y):.1f} m to the {side}"
        elif b is not None and image_shape is not None:
            h, w = image_shape[:2]
            s += (f": box x {b[0] / w:.2f}-{b[2] / w:.2f}, y {b[1] / h:.2f}-{b[3] / h:.2f} of the "
                  f"latest frame")
        lines.append(s)
    return "\n".join(lines) if lines else "- none"


# ----------------------------------------------------------------------------- Qwen2.5-VL
QWEN_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>", "<|endoftext|>")
SYSTEM = ("You are a driving safety assistant. You look at the forward view of a car and name the "
          "main risk to it in one short sentence.")


def build_random_qwen_vl(seed: int = 0):
    """A tiny randomly initialised Qwen2.5-VL (2 decoder layers of width 32, one vision block)
    with the byte-level tokenizer and a torchvision-free image processor: ``(model, tokenizer,
    image_processor)``. **Untrained random weights**, for tests and smoke runs."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil

    tok = byte_tokenizer(QWEN_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>")
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=4096, bos_token_id=None,
                         eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=32, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, window_size=56, fullatt_block_indexes=[0]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    proc = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14,
                                    merge_size=2, temporal_patch_size=2)
    return model.eval(), tok, proc


_CLEAN = re.compile(r"^[\s\-\*\d\.\)\"'`:]+|[\s\"'`]+$")


def clean_sentence(text: str, max_chars: int = 200) -> str:
    """The first non-empty line of an answer, without list markers, quotes or a final full stop;
    lower-cased, at most ``max_chars``; empty when nothing printable is left."""
    if not isinstance(text, str):
        return ""
    for line in text.splitlines():
        s = _CLEAN.sub("", line).strip().rstrip(".").strip()
        s = "".join(ch for ch in s if ch.isprintable())
        if any(ch.isalpha() for ch in s):
            return s[:max_chars].lower()
    return ""


class QwenVLReasoner:
    """Qwen2.5-VL as DriveVLM-RL's LVLM: the last ``window`` (K+1) frames and the detections in,
    one risk sentence out, snapped to ``vocabulary`` (see the module's notes).

    ``path``: a checkpoint folder or hub id (default ``Qwen/Qwen2.5-VL-3B-Instruct``; looked for
    as :func:`~drivemind.vlm.smolvlm.resolve_model_folder` says, with ``$DRIVEMIND_QWENVL_PATH``);
    ``max_pixels``: each frame's pixel budget for the image processor (448*448: 256 visual tokens
    a frame); ``text_encoder``: an object with ``encode(list[str]) -> (N, d)`` unit rows for
    snapping (default :class:`~drivemind.vlm.text.MiniLMTextEncoder`, loaded on first use)."""

    name = "qwen_vl"
    stand_in = False

    def __init__(self, path=None, *, window: int = WINDOW, max_new_tokens: int = 32,
                 device: str = "cpu", dtype: str = "float32", snap: bool = True,
                 min_similarity: float | None = None, vocabulary=RISK_VOCABULARY,
                 text_encoder=None, max_pixels: int = 448 * 448, _parts=None):
        import torch

        _positive("window", window, integer=True)
        _positive("max_new_tokens", max_new_tokens, integer=True)
        _positive("max_pixels", max_pixels, integer=True)
        vocab = tuple(vocabulary)
        if not vocab or not all(isinstance(v, str) and v.strip() for v in vocab):
            raise ValueError("vocabulary must be a non-empty list of non-empty strings")
        if min_similarity is not None and not (isinstance(min_similarity, (int, float))
                                               and -1.0 <= min_similarity <= 1.0):
            raise ValueError(f"min_similarity must be in [-1, 1] or None, got {min_similarity!r}")
        self.window, self.max_new_tokens = window, max_new_tokens
        self.snap, self.min_similarity, self.vocabulary = bool(snap), min_similarity, vocab
        self.device, self.dtype = torch.device(device), _torch_dtype(dtype)
        self._encoder, self._vocab_emb = text_encoder, None
        self.fallback = PrivilegedReasoner()
        if _parts is not None:
            self.model, self.tokenizer, self.image_processor = _parts
            self.path = None
        else:
            self.path = resolve_model_folder(
                path, default_id=DEFAULT_MODEL_ID, env_var=ENV_PATH, what="Qwen2.5-VL",
                hint="For a smoke run without weights use the reasoner kind 'tiny_qwen_vl' "
                     "(untrained random weights) or 'privileged'.")
            self.model, self.tokenizer, self.image_processor = self._load(self.path, max_pixels,
                                                                          self.dtype)
        self.model.to(device=self.device, dtype=self.dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        ids = {t: self.tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}
        cfg = self.model.config
        if ids["<|image_pad|>"] != cfg.image_token_id:
            raise ValueError(f"tokenizer's <|image_pad|> id {ids['<|image_pad|>']} differs from the "
                             f"model's image_token_id {cfg.image_token_id}")
        self.eos_id = ids["<|im_end|>"]
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id
        self.merge = int(cfg.vision_config.spatial_merge_size)
        self.calls = self.fallbacks = self.last_frames = 0
        self.last: dict = {}
        self._lock = threading.Lock()

    @classmethod
    def tiny(cls, seed: int = 0, **kwargs) -> "QwenVLReasoner":
        """The reasoner on :func:`build_random_qwen_vl` (untrained random weights; named
        ``tiny_qwen_vl``, a stand-in)."""
        r = cls(_parts=build_random_qwen_vl(seed), **kwargs)
        r.name, r.stand_in = "tiny_qwen_vl", True
        return r

    @staticmethod
    def _load(folder, max_pixels, dtype):
        import json

        from transformers import AutoModelForImageTextToText, AutoTokenizer, Qwen2VLImageProcessorPil

        with open(folder / "config.json") as f:
            model_type = json.load(f).get("model_type")
        if model_type not in ("qwen2_vl", "qwen2_5_vl"):
            raise ValueError(f"{folder / 'config.json'} is a {model_type!r} model; QwenVLReasoner "
                             f"needs a Qwen2-VL or Qwen2.5-VL checkpoint")
        model = AutoModelForImageTextToText.from_pretrained(str(folder), local_files_only=True,
                                                            dtype=dtype)
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        pre = {}
        if (folder / "preprocessor_config.json").is_file():
            with open(folder / "preprocessor_config.json") as f:
                pre = json.load(f)
        kw = {k: pre[k] for k in ("image_mean", "image_std", "patch_size", "merge_size",
                                  "temporal_patch_size") if k in pre}
        proc = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=int(max_pixels), **kw)
        return model, tok, proc

    # ------------------------------------------------------------------ text encoder
    def _embed(self, texts):
        if self._encoder is None:
            from .text import MiniLMTextEncoder

            self._encoder = MiniLMTextEncoder()
        return np.asarray(self._encoder.encode(list(texts)), np.float64)

    def snap_to_vocabulary(self, sentence: str) -> tuple[str, float]:
        """(nearest vocabulary entry, its cosine similarity) for ``sentence``; raises ValueError
        on a non-finite embedding."""
        if self._vocab_emb is None:
            self._vocab_emb = self._embed(self.vocabulary)
        q = self._embed([sentence])[0]
        v = self._vocab_emb
        if not (np.isfinite(q).all() and np.isfinite(v).all()):
            raise ValueError("the text encoder returned a non-finite embedding")
        sims = v @ q / (np.linalg.norm(v, axis=1) * np.linalg.norm(q) + 1e-12)
        j = int(np.argmax(sims))
        return self.vocabulary[j], float(sims[j])

    # ------------------------------------------------------------------ inputs
    def prompt(self, n_tokens, detections, image_shape) -> str:
        n = len(n_tokens)
        frames = "".join(f"Frame {i + 1}: <|vision_start|>" + "<|image_pad|>" * k + "<|vision_end|>\n"
                         for i, k in enumerate(n_tokens))
        vocab = "\n".join(f"- {v}" for v in self.vocabulary)
        user = (f"{frames}These are the last {n} forward frames of our car, oldest first. Objects "
                f"detected in the latest frame:\n{describe_detections(detections, image_shape)}\n"
                f"Describe the main risk to our car in one short sentence. Prefer one of these "
                f"descriptions when it fits:\n{vocab}\nAnswer with the sentence only.")
        return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                f"<|im_start|>assistant\n")

    def generate_raw(self, frames, detections) -> str:
        """The model's raw answer for the last ``window`` frames and the detections."""
        import torch
        from PIL import Image

        if frames is None or len(frames) == 0:
            raise ValueError("the reasoner needs at least one frame (the last K+1 frames, oldest first)")
        imgs = [to_rgb(f) for f in list(frames)[-self.window:]]
        self.last_frames = len(imgs)
        px = self.image_processor(images=[Image.fromarray(np.ascontiguousarray(i)) for i in imgs],
                                  return_tensors="pt")
        grid = px["image_grid_thw"]
        n_tokens = (grid.prod(-1) // self.merge ** 2).tolist()
        text = self.prompt(n_tokens, list(detections), imgs[-1].shape)
        enc = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")
        ids = enc["input_ids"].to(self.device)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids),
                pixel_values=px["pixel_values"].to(self.device, self.dtype),
                image_grid_thw=grid.to(self.device), max_new_tokens=self.max_new_tokens,
                do_sample=False, eos_token_id=self.eos_id, pad_token_id=self.pad_id)
        return safe_decode(self.tokenizer, out[0, ids.shape[1]:].tolist())

    def describe(self, frames, detections) -> str:
        """l_dyn: the model's sentence, snapped to the vocabulary (module notes); an empty
        answer or a non-finite embedding falls back to the privileged rule (counted)."""
        detections = list(detections)
        with self._lock:
            self.calls += 1
            raw = self.generate_raw(frames, detections)
            sentence = clean_sentence(raw)
            info = {"raw": raw, "sentence": sentence, "similarity": None, "fallback": False}
            out = sentence
            try:
                if not sentence:
                    raise ValueError("empty answer")
                if self.snap:
                    entry, sim = self.snap_to_vocabulary(sentence)
                    info["similarity"] = sim
                    if self.min_similarity is None or sim >= self.min_similarity:
                        out = entry
            except ValueError as e:
                self.fallbacks += 1
                last = np.asarray(frames[-1])
                out = self.fallback.choose(detections, last.shape if last.ndim == 3 else None)
                info["fallback"] = True
                if self.fallbacks == 1 or self.fallbacks % 100 == 0:
                    log.warning("reasoner %s: %s; used the privileged rule instead (%d fallbacks)",
                                self.name, e, self.fallbacks)
            info["description"] = out
            self.last = info
            return out

    def __repr__(self) -> str:
        src = str(self.path) if self.path is not None else "random weights (untrained)"
        return f"QwenVLReasoner(name={self.name!r}, weights={src}, window={self.window}, snap={self.snap})"


REASONER_KINDS = ("privileged", "qwen_vl", "tiny_qwen_vl")


def make_reasoner(kind: str = "privileged", **kwargs):
    """The reasoner ``kind``: ``privileged`` (stand-in, rules on the detections), ``qwen_vl``
    (:class:`QwenVLReasoner`'s keyword arguments) or ``tiny_qwen_vl`` (random tiny weights, for
    smoke runs; ``seed`` plus the same keyword arguments)."""
    if kind == "privileged":
        return PrivilegedReasoner(**kwargs)
    if kind == "qwen_vl":
        return QwenVLReasoner(**kwargs)
    if kind == "tiny_qwen_vl":
        seed = kwargs.pop("seed", 0)
        log.warning("reasoner tiny_qwen_vl: a random tiny Qwen2.5-VL with UNTRAINED random weights "
                    "(a stand-in for smoke runs)")
        return QwenVLReasoner.tiny(seed=seed, **kwargs)
    raise ValueError(f"unknown reasoner kind {kind!r}; valid kinds: {', '.join(REASONER_KINDS)}")
