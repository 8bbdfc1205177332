"""SmolVLM + PEFT LoRA: DriveMind's dynamic prompt generator, distilled online from a teacher.

The paper (DriveMind, App. B.4) fine-tunes SmolVLM-256M-Instruct online: every teacher-labelled
BEV frame is turned into one chat sample (system prompt, the BEV image, the inference prompt of
Fig. 3; the teacher's JSON as the assistant's answer) and one AdamW step (lr 5e-5, batch 1) is
taken on LoRA adapters on the text decoder's attention and MLP projections, minimising

    L_CoT = CE(y_prompt) + lambda * CE(y_CoT)

(token cross-entropy on the answer's prompt part and on its chain-of-thought part; everything
else is masked). Generation decodes greedily up to 256 new tokens.

:class:`SmolVLMGenerator` does exactly that with real transformers/peft classes:

- ``generate(request) -> str``: the raw decoded answer (never raises on odd model output; the
  caller parses it with :func:`drivemind.vlm.prompts.parse_prompt_json`);
- ``learn(request, target_text) -> float``: one LoRA step on a teacher's answer;
- ``save_adapter(dir)`` / ``SmolVLMGenerator(adapter_path=dir)``.

Weights are read offline from a local folder, ``$DRIVEMIND_SMOLVLM_PATH`` or the Hugging Face
cache (:func:`resolve_model_folder`); nothing is downloaded. ``SmolVLMGenerator.tiny()`` builds a
random tiny Idefics3 model (the SmolVLM-256M architecture class) with a byte-level tokenizer
built in code: **untrained random weights**, for tests and smoke runs only.

Inputs are built by hand (the ``SmolVLMProcessor`` needs torchvision and num2words): the BEV
masks are coloured with :func:`drivemind.bev.renderer.masks_to_rgb`, resized to the vision
tower's square input and normalised by the torchvision-free ``Idefics3ImageProcessorPil``; the
image enters as one global tile (``do_image_splitting=False``: 64 image tokens for
SmolVLM-256M) between ``<fake_token_around_image><global-img>`` ... ``<fake_token_around_image>``,
as the processor writes it; the text follows the SmolVLM-Instruct chat template.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import warnings
from pathlib import Path

import numpy as np

from .prompts import INFERENCE_PROMPT, SYSTEM_PROMPT, PromptRequest, parse_prompt_json

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolVLM-256M-Instruct"
ENV_PATH = "DRIVEMIND_SMOLVLM_PATH"
# files a checkpoint folder must hold; any one of each tuple will do
MODEL_FILES = (("config.json",),
               ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"),
               ("tokenizer.json",), ("tokenizer_config.json",))
# LoRA on the text decoder's attention (q/k/v/o) and MLP (gate/up/down) projections only: the
# SigLIP vision tower also has q/k/v projections, which stay frozen (paper: "the base model and
# image encoder remain frozen").
LORA_TARGETS = r".*text_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
DTYPES = ("float32", "bfloat16", "float16")

# SmolVLM-Instruct's special tokens
BOS, EOU = "<|im_start|>", "<end_of_utterance>"
IMAGE, FAKE, GLOBAL = "<image>", "<fake_token_around_image>", "<global-img>"
PAD = "<|endoftext|>"


# ----------------------------------------------------------------------------- shared helpers
def _is_repo_id(s: str) -> bool:
    parts = s.split("/")
    return (len(parts) == 2 and all(parts) and not s.startswith((".", "~"))
            and not Path(s).expanduser().exists())


def _missing(folder: Path, need) -> list[str]:
    return [" or ".join(alts) for alts in need if not any((folder / a).is_file() for a in alts)]


def resolve_model_folder(path, *, default_id: str, env_var: str, what: str,
                         need=MODEL_FILES, hint: str = "") -> Path:
    """The local folder holding ``what``'s checkpoint. Looks at ``path`` (a folder, or a hub id
    such as ``"HuggingFaceTB/SmolVLM-256M-Instruct"``), then ``$env_var`` (a folder), then the
    Hugging Face cache's snapshot of the id (``default_id`` unless ``path`` is an id). Nothing is
    downloaded. When no place holds every file in ``need``, one FileNotFoundError names the
    files, every place looked at (with what it lacked) and how to get them."""
    looked: list[str] = []
    repo_id = default_id
    candidates: list[Path] = []
    if path is not None:
        s = str(path)
        if _is_repo_id(s):
            repo_id = s
            looked.append(f"{s} (not a folder here; read as a hub id)")
        else:
            p = Path(s).expanduser()
            if p.is_dir():
                candidates.append(p)
            else:
                looked.append(f"{p} (no such folder)")
    env = os.environ.get(env_var)
    if env:
        p = Path(env).expanduser()
        if p.is_dir():
            candidates.append(p)
        else:
            looked.append(f"${env_var}={p} (no such folder)")
    else:
        looked.append(f"${env_var} (not set)")
    from huggingface_hub import constants, try_to_load_from_cache

    cache = Path(constants.HF_HUB_CACHE)
    try:
        hit = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - a malformed id or cache: reported as not found
        hit = None
    if isinstance(hit, str):
        candidates.append(Path(hit).parent)
    else:
        looked.append(f"Hugging Face cache {cache} (no snapshot of {repo_id})")
    for folder in candidates:
        miss = _missing(folder, need)
        if not miss:
            return folder
        looked.append(f"{folder} (lacks {', '.join(miss)})")
    files = ", ".join(" or ".join(alts) for alts in need)
    raise FileNotFoundError(
        f"{what} weights not found: one folder must hold {files}. Looked at: "
        f"{'; '.join(looked)}. Nothing is downloaded at run time (HF_HUB_OFFLINE=1). On a "
        f"connected machine run `hf download {repo_id}` (fills the Hugging Face cache, "
        f"{cache}; copy it here) or `hf download {repo_id} --local-dir DIR`, then pass path=DIR "
        f"or set ${env_var}=DIR.{(' ' + hint) if hint else ''}")


def byte_tokenizer(special_tokens, *, eos: str, pad: str, bos: str | None = None):
    """A byte-level tokenizer built in code (256 byte symbols, no merges) with the given special
    tokens, wrapped in ``PreTrainedTokenizerFast``: what the tiny random test models read."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    named = {eos, pad} | ({bos} if bos else set())
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token=eos, pad_token=pad, bos_token=bos,
        additional_special_tokens=[t for t in special_tokens if t not in named])


def to_rgb(image, bev_config=None) -> np.ndarray:
    """An (H, W, 3) uint8 image from BEV masks (uint8 C x H x W, coloured with
    :func:`~drivemind.bev.renderer.masks_to_rgb`) or an RGB frame (H x W x 3)."""
    arr = np.asarray(image)
    if arr.ndim == 3 and arr.shape[-1] == 3 and arr.dtype == np.uint8:
        return arr
    if arr.ndim == 3 and arr.dtype == np.uint8:
        from ..bev.config import BevConfig
        from ..bev.renderer import masks_to_rgb

        if isinstance(bev_config, dict) or hasattr(bev_config, "keys"):  # from a config file
            bev_config = BevConfig(**dict(bev_config))
        return masks_to_rgb(arr, bev_config)
    raise ValueError(f"expected uint8 BEV masks (C, H, W) or an RGB frame (H, W, 3), got "
                     f"{arr.dtype} {arr.shape}")


def request_image(request: PromptRequest, bev_config=None) -> np.ndarray:
    """The frame a generator looks at: the request's BEV (coloured), else its RGB frame."""
    if not isinstance(request, PromptRequest):
        raise TypeError(f"expected a PromptRequest, got {type(request).__name__}")
    if request.bev is not None:
        return to_rgb(request.bev, bev_config)
    if request.rgb is not None:
        return to_rgb(request.rgb)
    raise ValueError("the prompt request carries no image: set PromptRequest.bev (uint8 masks) "
                     "or PromptRequest.rgb (H x W x 3)")


def _torch_dtype(dtype: str):
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return getattr(torch, dtype)


def _positive(name, v, integer=False):
    ok = (isinstance(v, int) and not isinstance(v, bool)) if integer else (
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
    if not ok or v <= 0:
        raise ValueError(f"{name} must be a positive {'integer' if integer else 'number'}, got {v!r}")


def safe_decode(tokenizer, ids) -> str:
    """Decoded text of generated ids, special tokens dropped; ids outside the tokenizer's vocabulary
    (a model's padded embedding rows) are skipped. Never raises on odd output."""
    n = len(tokenizer)
    ids = [int(i) for i in ids if 0 <= int(i) < n]
    try:
        return tokenizer.decode(ids, skip_special_tokens=True)
    except Exception as e:  # noqa: BLE001 - odd model output must not stop training
        log.warning("could not decode generated tokens (%s); returning an empty answer", e)
        return ""


# ----------------------------------------------------------------------------- random models
SIZES = ("tiny", "256m")


def build_random_smolvlm(size: str = "tiny", seed: int = 0):
    """A randomly initialised Idefics3 model (SmolVLM-256M's architecture class) with the
    byte-level tokenizer and a torchvision-free image processor: ``(model, tokenizer,
    image_processor)``. **Untrained random weights.** ``"tiny"``: 32-wide, 2 decoder layers, a
    32 px vision input (4 image tokens), ~60 k parameters; ``"256m"``: SmolVLM-256M's sizes
    (30 decoder layers of width 576, a 512 px SigLIP tower, 64 image tokens, 49 280-row
    vocabulary), for timing without the checkpoint."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil

    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    tok = byte_tokenizer([BOS, EOU, IMAGE, FAKE, GLOBAL, PAD], bos=BOS, eos=EOU, pad=PAD)
    ids = {t: tok.convert_tokens_to_ids(t) for t in (BOS, EOU, IMAGE, PAD)}
    if size == "tiny":
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, image_size=32, patch_size=8)
        text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
        scale = 2
    else:
        vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                      num_attention_heads=12, image_size=512, patch_size=16)
        text = dict(vocab_size=49280, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                    rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
        scale = 4
    text.update(model_type="llama", bos_token_id=ids[BOS], eos_token_id=ids[EOU],
                pad_token_id=ids[PAD], tie_word_embeddings=False)
    cfg = Idefics3Config(vision_config=vision, text_config=text, image_token_id=ids[IMAGE],
                         scale_factor=scale, pad_token_id=ids[PAD])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = Idefics3ForConditionalGeneration(cfg)
    s = vision["image_size"]
    proc = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": s},
                                     max_image_size={"longest_edge": s})
    return model.eval(), tok, proc


def save_random_smolvlm(folder, size: str = "tiny", seed: int = 0) -> Path:
    """Writes :func:`build_random_smolvlm`'s model and tokenizer as a checkpoint folder
    (config.json, model.safetensors, tokenizer files): a stand-in for a downloaded SmolVLM."""
    model, tok, _ = build_random_smolvlm(size, seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------- the generator
class SmolVLMGenerator:
    """SmolVLM with PEFT LoRA adapters: ``generate`` writes the paper's JSON (raw text) for a
    BEV frame, ``learn`` takes one distillation step on a teacher's answer.

    ``path``: a checkpoint folder or hub id (default SmolVLM-256M-Instruct; see
    :func:`resolve_model_folder` for where it is looked for). ``lora_rank``/``lora_alpha``/
    ``lora_dropout``: the adapters (on the decoder's q/k/v/o and gate/up/down projections);
    ``lr``/``weight_decay``: AdamW (the paper's lr 5e-5; torch's default decay 0.01);
    ``cot_weight``: lambda in L = CE(prompt) + lambda CE(CoT); ``max_new_tokens``: decoding limit;
    ``adapter_path``: a folder written by :meth:`save_adapter` to start from (its own rank and
    targets win over ``lora_*``); ``lora_targets``: the regex of the modules given adapters
    (default ``LORA_TARGETS``, the paper's decoder projections); ``bev_config``: the BevConfig of the request's masks (default
    Roach's 15 channels). Not thread-safe across threads beyond the internal lock: calls are
    serialised."""

    name = "smolvlm"
    stand_in = False

    def __init__(self, path=None, *, lora_rank: int = 8, lora_alpha: float = 16,
                 lora_dropout: float = 0.0, lr: float = 5e-5, weight_decay: float = 0.01,
                 cot_weight: float = 1.0, max_new_tokens: int = 256, device: str = "cpu",
                 dtype: str = "float32", adapter_path=None, bev_config=None,
                 lora_targets: str | None = None, _parts=None):
        import torch

        _positive("lora_rank", lora_rank, integer=True)
        _positive("lora_alpha", lora_alpha)
        _positive("lr", lr)
        _positive("max_new_tokens", max_new_tokens, integer=True)
        for n, v in (("cot_weight", cot_weight), ("weight_decay", weight_decay),
                     ("lora_dropout", lora_dropout)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{n} must be a number >= 0, got {v!r}")
        self.device = torch.device(device)
        self.dtype = _torch_dtype(dtype)
        self.cot_weight, self.max_new_tokens = float(cot_weight), int(max_new_tokens)
        self.bev_config = bev_config
        if _parts is not None:
            base, self.tokenizer, self.image_processor = _parts
            self.path = None
        else:
            self.path = resolve_model_folder(
                path, default_id=DEFAULT_MODEL_ID, env_var=ENV_PATH, what="SmolVLM",
                hint="For a smoke run without weights use the generator kind 'tiny_smolvlm' "
                     "(untrained random weights).")
            base, self.tokenizer, self.image_processor = self._load(self.path)
        base.to(device=self.device, dtype=self.dtype)
        self._check_tokens(base)
        self.lora_targets = LORA_TARGETS if lora_targets is None else str(lora_targets)
        self.model = self._wrap(base, adapter_path, lora_rank, lora_alpha, lora_dropout,
                                self.lora_targets)
        self.model.eval()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=float(lr), weight_decay=float(weight_decay))
        self.lr = float(lr)
        self.steps = 0
        self.nonfinite_losses = 0
        self.last_loss = float("nan")
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ construction
    @classmethod
    def tiny(cls, seed: int = 0, size: str = "tiny", **kwargs) -> "SmolVLMGenerator":
        """The generator on :func:`build_random_smolvlm` (untrained random weights, named
        ``tiny_smolvlm``; a stand-in used by tests and smoke runs)."""
        gen = cls(_parts=build_random_smolvlm(size, seed), **kwargs)
        gen.name = "tiny_smolvlm" if size == "tiny" else f"random_smolvlm_{size}"
        gen.stand_in = True
        return gen

    def _load(self, folder: Path):
        from transformers import AutoModelForImageTextToText, AutoTokenizer, Idefics3ImageProcessorPil

        with open(folder / "config.json") as f:
            model_type = json.load(f).get("model_type")
        if model_type not in ("idefics3", "smolvlm"):
            raise ValueError(f"{folder / 'config.json'} is a {model_type!r} model; SmolVLMGenerator "
                             f"needs a SmolVLM (model_type 'idefics3' or 'smolvlm') checkpoint")
        model = AutoModelForImageTextToText.from_pretrained(str(folder), local_files_only=True,
                                                            dtype=self.dtype)
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        if not getattr(tok, "is_fast", False):
            raise ValueError(f"the tokenizer in {folder} is not a fast tokenizer (tokenizer.json "
                             f"is needed for the loss masks' character offsets)")
        s = int(model.config.vision_config.image_size)
        pre = {}
        if (folder / "preprocessor_config.json").is_file():
            with open(folder / "preprocessor_config.json") as f:
                pre = json.load(f)
        kw = {k: pre[k] for k in ("image_mean", "image_std", "rescale_factor", "resample")
              if k in pre}
        proc = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": s},
                                         max_image_size={"longest_edge": s}, **kw)
        return model.eval(), tok, proc

    def _check_tokens(self, model) -> None:
        tok = self.tokenizer
        unk = tok.unk_token_id

        def tid(t):
            i = tok.convert_tokens_to_ids(t)
            return None if i is None or (unk is not None and i == unk and t != tok.unk_token) else i

        self.ids = {t: tid(t) for t in (BOS, EOU, IMAGE, FAKE, GLOBAL)}
        miss = [t for t in (EOU, IMAGE, FAKE) if self.ids[t] is None]
        if miss:
            raise ValueError(f"the tokenizer lacks SmolVLM's special tokens {miss}")
        if self.ids[IMAGE] != model.config.image_token_id:
            raise ValueError(f"tokenizer's {IMAGE} id {self.ids[IMAGE]} differs from the model's "
                             f"image_token_id {model.config.image_token_id}")
        vc = model.config.vision_config
        self.image_size = int(vc.image_size)
        self.image_seq_len = (self.image_size // int(vc.patch_size)) ** 2 // model.config.scale_factor ** 2
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.ids[EOU]

    @staticmethod
    def _wrap(base, adapter_path, r, alpha, dropout, targets=LORA_TARGETS):
        from peft import LoraConfig, PeftModel, get_peft_model

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # peft probing a deprecated HF property
            if adapter_path is not None:
                folder = Path(adapter_path).expanduser()
                miss = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
                if miss:
                    raise FileNotFoundError(
                        f"LoRA adapter files {', '.join(miss)} not found in {folder}; pass a folder "
                        f"written by SmolVLMGenerator.save_adapter (or adapter_path=None to start "
                        f"fresh adapters)")
                return PeftModel.from_pretrained(base, str(folder), is_trainable=True)
            cfg = LoraConfig(r=int(r), lora_alpha=float(alpha), lora_dropout=float(dropout),
                             target_modules=targets, bias="none")
            return get_peft_model(base, cfg)

    # ------------------------------------------------------------------ inputs
    def prompt_text(self) -> str:
        """The chat prefix (SmolVLM-Instruct template) with the image placeholder expanded."""
        img = (FAKE + (GLOBAL if self.ids[GLOBAL] is not None else "")
               + IMAGE * self.image_seq_len + FAKE)
        bos = BOS if self.ids[BOS] is not None else ""
        return (f"{bos}System: {SYSTEM_PROMPT}{EOU}\nUser:{img}{INFERENCE_PROMPT}{EOU}\n"
                f"Assistant:")

    def _inputs(self, request: PromptRequest):
        from PIL import Image

        rgb = request_image(request, self.bev_config)
        s = self.image_size
        img = Image.fromarray(np.ascontiguousarray(rgb)).resize((s, s), Image.BICUBIC)
        px = self.image_processor(images=[[img]], return_tensors="pt", do_image_splitting=False)
        enc = self.tokenizer(self.prompt_text(), add_special_tokens=False, return_tensors="pt")
        return (enc["input_ids"].to(self.device),
                px["pixel_values"].to(self.device, self.dtype),
                px["pixel_attention_mask"].to(self.device))

    def _answer(self, target_text: str):
        """Token ids of the teacher's answer (its JSON, re-serialised canonically, then the
        end-of-utterance token) and a 0/1 mask of the CoT tokens (the rest are prompt tokens)."""
        ps = parse_prompt_json(target_text)
        cot_part = ' {"cot_explanation": ' + json.dumps(list(ps.cot)) + ", "
        prompt_part = ('"present_prompt": ' + json.dumps(ps.present) + ', "ideal_prompt": '
                       + json.dumps(ps.ideal) + "}" + EOU)
        enc = self.tokenizer(cot_part + prompt_part, add_special_tokens=False,
                             return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        is_cot = [1 if a < len(cot_part) else 0 for a, _ in enc["offset_mapping"]]
        return ids, is_cot

    # ------------------------------------------------------------------ the slot
    def generate(self, request: PromptRequest) -> str:
        """The model's answer to the inference prompt for the request's BEV, decoded as text (the
        JSON contract is checked by the caller; odd output is returned as it is)."""
        import torch

        with self._lock:
            ids, px, pmask = self._inputs(request)
            self.model.eval()
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=px,
                    pixel_attention_mask=pmask, max_new_tokens=self.max_new_tokens,
                    do_sample=False, eos_token_id=self.ids[EOU], pad_token_id=self.pad_id)
            return safe_decode(self.tokenizer, out[0, ids.shape[1]:].tolist()).strip()

    def _loss_terms(self, request, target_text):
        import torch
        import torch.nn.functional as F

        ids, px, pmask = self._inputs(request)
        ans, is_cot = self._answer(target_text)
        a = torch.tensor([ans], dtype=torch.long, device=self.device)
        full = torch.cat([ids, a], 1)
        out = self.model(input_ids=full, attention_mask=torch.ones_like(full), pixel_values=px,
                         pixel_attention_mask=pmask, logits_to_keep=a.shape[1] + 1)
        logits = out.logits[0, :-1].float()  # position i predicts answer token i
        ce = F.cross_entropy(logits, a[0], reduction="none")
        cot = torch.tensor(is_cot, dtype=torch.bool, device=self.device)
        zero = ce.new_zeros(())
        prompt_ce = ce[~cot].mean() if (~cot).any() else zero
        cot_ce = ce[cot].mean() if cot.any() else zero
        return prompt_ce, cot_ce

    def loss_terms(self, request: PromptRequest, target_text: str) -> tuple[float, float]:
        """(CE on the answer's prompt tokens, CE on its CoT tokens) without a step."""
        import torch

        with self._lock, torch.no_grad():
            self.model.eval()
            p, c = self._loss_terms(request, target_text)
            return float(p), float(c)

    def learn(self, request: PromptRequest, target_text: str) -> float:
        """One AdamW step on the LoRA adapters towards ``target_text`` (a teacher's JSON; raises
        :class:`~drivemind.vlm.prompts.MalformedPrompt` when it is not the contract). Returns
        L = CE(prompt) + cot_weight * CE(CoT); a non-finite loss skips the step (counted in
        ``nonfinite_losses``) and returns nan."""
        with self._lock:
            self.model.train()
            try:
                p, c = self._loss_terms(request, target_text)
                loss = p + self.cot_weight * c
                value = float(loss.detach())
                if not math.isfinite(value):
                    self.nonfinite_losses += 1
                    self.optimizer.zero_grad(set_to_none=True)
                    log.warning("non-finite distillation loss (%s); step skipped (%d so far)",
                                value, self.nonfinite_losses)
                    return float("nan")
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            finally:
                self.model.eval()
            self.steps += 1
            self.last_loss = value
            return value

    def save_adapter(self, folder) -> Path:
        """Writes the LoRA adapters (adapter_config.json, adapter_model.safetensors)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self.model.save_pretrained(str(folder))
        return folder

    def trainable_parameters(self) -> dict:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def __repr__(self) -> str:
        src = str(self.path) if self.path is not None else "random weights (untrained)"
        return (f"{type(self).__name__}(name={self.name!r}, weights={src}, steps={self.steps}, "
                f"stand_in={self.stand_in})")


# ----------------------------------------------------------------------------- timing
def bench(size: str = "tiny", new_tokens: int = 16, steps: int = 3, seed: int = 0) -> dict:
    """Wall-clock seconds of ``generate`` (``new_tokens`` forced: EOS ignored) and of one
    ``learn`` step (the privileged teacher's JSON for a synthetic BEV) on a random model of
    :func:`build_random_smolvlm`'s ``size``; medians over ``steps`` repeats after one warm-up.
    ``python -m drivemind.vlm.smolvlm --size 256m`` prints it as one JSON line."""
    import resource
    import time

    import torch

    from ..facts import FACT_KEYS
    from .prompts import PrivilegedTeacher

    gen = SmolVLMGenerator.tiny(seed=seed, size=size, max_new_tokens=new_tokens)
    facts = {k: 0.0 for k in FACT_KEYS}
    facts.update(speed_kmh=30.0, lead_distance=8.0, lead_speed_kmh=10.0, light_state=2,
                 light_distance=20.0)
    rng = np.random.default_rng(seed)
    req = PromptRequest(facts=facts, bev=((rng.random((15, 192, 192)) > 0.85) * 255).astype(np.uint8))
    target = PrivilegedTeacher().generate(req)
    ids, px, pmask = gen._inputs(req)

    def _gen():
        with torch.no_grad():
            gen.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=px,
                               pixel_attention_mask=pmask, max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, do_sample=False, pad_token_id=gen.pad_id)

    def _med(fn):
        fn()
        ts = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    g = _med(_gen)
    step = _med(lambda: gen.learn(req, target))
    n_params = sum(p.numel() for p in gen.model.parameters())
    return {"size": size, "params": n_params, "trainable": sum(p.numel() for p in gen.trainable_parameters().values()),
            "prefix_tokens": int(ids.shape[1]), "answer_tokens": len(gen._answer(target)[0]),
            "generate_s": round(g, 4), "new_tokens": new_tokens, "learn_step_s": round(step, 4),
            "threads": torch.get_num_threads(),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="time a random SmolVLM's generate and LoRA step")
    ap.add_argument("--size", choices=SIZES, default="tiny")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    print(json.dumps(bench(a.size, a.new_tokens, a.steps)))
