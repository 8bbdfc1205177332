"""OpenCLIP contrastive encoder slot (the papers' ViT-bigG-14), fully offline.

``OpenClipEncoder`` implements the contrastive-encoder protocol that BEV-CLIP follows
(:mod:`drivemind.vlm.bev_clip` + :mod:`drivemind.vlm.text`):

    enc.name, enc.dim
    enc.embed(bev_uint8 (N, C, H, W)) -> (N, dim) float32 unit rows   # BEV masks, coloured first
    enc.embed_rgb(images_uint8 (N, H, W, 3)) -> (N, dim)              # camera frames
    enc.encode(list_of_prompts) -> (N, dim)                           # cached per prompt

BEV masks are coloured with the project's own BEV palette (:func:`drivemind.bev.renderer.
masks_to_rgb`, the colours of ``BevRenderer.rgb()``) and then go through open_clip's own
preprocessing (resize, centre crop, normalisation) of the chosen model and tag.

``model_name`` may also be the path of an open_clip model-config JSON file (a custom or tiny
architecture; its checkpoint as ``weights_path``, or random weights with ``pretrained=None``).

Weights are never downloaded. They are found, in order: ``weights_path`` (a file, or a folder
holding one of the checkpoint names), ``pretrained`` given as a file path, ``$DRIVEMIND_OPENCLIP_
WEIGHTS`` (file or folder), the Hugging Face cache (``cache_dir`` or ``$HF_HUB_CACHE``) for the
tag's hub repo, and for tags with a URL (OpenAI's) ``~/.cache/clip``. When none holds them one
``FileNotFoundError`` names the files needed, every place looked at and how to get them.

Needs the ``vision`` extra (torch 2.14.1 + torchvision 0.29.1 + open_clip_torch); the default
install has no torchvision and uses BEV-CLIP instead.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from ..bev.config import BEV_PRESETS, BevConfig
from ..bev.renderer import masks_to_rgb
from .text import CachedPrompts

log = logging.getLogger(__name__)

ENV_WEIGHTS = "DRIVEMIND_OPENCLIP_WEIGHTS"
WEIGHT_NAMES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")  # open_clip's hub names
DIR_NAMES = WEIGHT_NAMES + ("open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.pth",
                            "model.safetensors", "pytorch_model.bin")  # accepted inside a folder
HUB_CONFIG = "open_clip_config.json"
RANDOM = ("", "none", "random")  # pretrained values meaning "random initialisation"
INSTALL = ('pip install torch==2.14.1 torchvision==0.29.1 -e ".[vision]" (torch and torchvision '
           'pinned in the same command)')


def _open_clip():
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(k, "1")
    try:
        import open_clip
    except ImportError as e:
        raise ImportError(f"the OpenCLIP encoder needs open_clip_torch and torchvision ({e}); "
                          f"install the vision extra: {INSTALL}") from e
    return open_clip


def hf_cache_dir(cache_dir=None) -> Path:
    """The Hugging Face hub cache searched: ``cache_dir`` or huggingface_hub's default
    (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``)."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def _in_hf_cache(repo: str, filename: str, cache_dir) -> Path | None:
    """A cached file of a hub repo without touching the network: the ``main`` ref's snapshot,
    else any snapshot that holds it."""
    from huggingface_hub import try_to_load_from_cache

    root = hf_cache_dir(cache_dir)
    hit = try_to_load_from_cache(repo, filename, cache_dir=str(root))
    if isinstance(hit, str) and Path(hit).is_file():
        return Path(hit)
    snaps = root / ("models--" + repo.replace("/", "--")) / "snapshots"
    for p in sorted(snaps.glob(f"*/{filename}")) if snaps.is_dir() else ():
        if p.is_file():
            return p
    return None


def _in_folder(folder: Path, names=DIR_NAMES) -> Path | None:
    for n in names:
        if (folder / n).is_file():
            return folder / n
    return None


def _hub_repo(model_name: str, pretrained: str) -> tuple[str, tuple[str, ...], str]:
    """(hub repo, file names in preference order, url) of a known ``model_name``/tag."""
    from open_clip.pretrained import get_pretrained_cfg

    cfg = get_pretrained_cfg(model_name, pretrained)
    repo, fname = os.path.split(cfg.get("hf_hub", "").rstrip())
    if not fname or fname == WEIGHT_NAMES[1]:
        names = WEIGHT_NAMES
    elif fname.endswith((".bin", ".pth")):
        names = (fname[:-4] + ".safetensors", fname)
    else:
        names = (fname,)
    return repo, names, cfg.get("url", "")


def _missing(what: str, need: str, looked: list[str], get: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"OpenCLIP weights for {what} not found: need {need}. Looked at: {'; '.join(looked)}. "
        f"Nothing is downloaded at run time (HF_HUB_OFFLINE=1). To get them: {get}; then point at "
        f"them with OpenClipEncoder(weights_path=...) / the config key vlm.encoder.weights_path, "
        f"the environment variable ${ENV_WEIGHTS} (a file or folder), or a Hugging Face cache "
        f"holding them (cache_dir= / $HF_HUB_CACHE).")


def _hub_folder(p: Path) -> bool:
    return p.is_dir() and (p / HUB_CONFIG).is_file() and _in_folder(p) is not None


def resolve_openclip_weights(model_name: str = "ViT-bigG-14",
                             pretrained: str | None = "laion2b_s39b_b160k", weights_path=None,
                             cache_dir=None) -> Path | None:
    """The checkpoint file (for ``hf-hub:`` / ``local-dir:`` names: the folder holding
    ``open_clip_config.json`` and the weights) that ``OpenClipEncoder`` loads; ``None`` for a
    random initialisation (``pretrained`` None / "" / "none" / "random" and no ``weights_path``).
    Looks only at local files; raises one FileNotFoundError naming what is missing."""
    open_clip = _open_clip()
    if is_config_file(model_name):
        model_name = register_config_file(model_name)
    folder_model = model_name.startswith(("hf-hub:", "local-dir:"))
    hub_need = f"{HUB_CONFIG} plus {' or '.join(WEIGHT_NAMES)} in one folder"
    if model_name.startswith("local-dir:"):
        folder = Path(model_name[len("local-dir:"):]).expanduser()
        if not _hub_folder(folder):
            raise _missing(model_name, f"{HUB_CONFIG} plus one of {', '.join(DIR_NAMES)}",
                           [str(folder)], "save the model folder there")
        return folder
    if not folder_model and model_name not in open_clip.list_models():
        raise ValueError(f"unknown OpenCLIP model {model_name!r}; valid: "
                         f"{', '.join(open_clip.list_models())}, 'hf-hub:<org>/<repo>', "
                         f"'local-dir:<folder>' or the path of a model-config .json file")
    # 1. an explicit path is used as given, never silently replaced by something else
    if weights_path is not None:
        p = Path(weights_path).expanduser()
        if folder_model:
            if _hub_folder(p):
                return p
            need = hub_need
        else:
            hit = p if p.is_file() else (_in_folder(p) if p.is_dir() else None)
            if hit is not None:
                return hit
            need = f"a checkpoint file, or a folder holding one of {', '.join(DIR_NAMES)}"
        raise _missing(f"{model_name} ({pretrained})", need, [f"weights_path {p}"],
                       "check the path")
    tag = "" if pretrained is None else str(pretrained)
    if not folder_model:
        if tag.lower() in RANDOM:
            return None
        if Path(tag).expanduser().is_file():  # open_clip's "pretrained may be a file path"
            return Path(tag).expanduser()
        if not open_clip.pretrained.is_pretrained_cfg(model_name, tag):
            tags = open_clip.list_pretrained_tags_by_model(model_name)
            raise ValueError(f"unknown pretrained tag {tag!r} for OpenCLIP model {model_name!r}; "
                             f"valid: {', '.join(tags) or '(none published for this model)'}, "
                             f"a checkpoint file path, or null for a random initialisation")
        repo, names, url = _hub_repo(model_name, tag)
        what, need = f"{model_name} / {tag}", " or ".join(names)
    else:
        repo, names, url = model_name[len("hf-hub:"):], WEIGHT_NAMES, ""
        what, need = model_name, hub_need
    looked = []
    # 2. $DRIVEMIND_OPENCLIP_WEIGHTS: a file or a folder
    env = os.environ.get(ENV_WEIGHTS)
    if env:
        p = Path(env).expanduser()
        if folder_model:
            if _hub_folder(p):
                return p
        else:
            hit = p if p.is_file() else (
                (_in_folder(p, names) or _in_folder(p)) if p.is_dir() else None)
            if hit is not None:
                return hit
        looked.append(f"${ENV_WEIGHTS}={p}")
    else:
        looked.append(f"${ENV_WEIGHTS} (not set)")
    # 3. the Hugging Face cache (what open_clip itself fills on a connected machine)
    if folder_model:
        cfg = _in_hf_cache(repo, HUB_CONFIG, cache_dir)
        for n in names:
            w = _in_hf_cache(repo, n, cache_dir)
            if cfg is not None and w is not None and cfg.parent == w.parent:
                return cfg.parent
    else:
        for n in names:
            hit = _in_hf_cache(repo, n, cache_dir)
            if hit is not None:
                return hit
    looked.append(f"the Hugging Face cache {hf_cache_dir(cache_dir)} (repo {repo})")
    # 4. OpenAI's URL cache, for the tags published there
    if url:
        p = (Path(cache_dir) if cache_dir else Path("~/.cache/clip")).expanduser() / os.path.basename(url)
        if p.is_file():
            return p
        looked.append(str(p))
    files = f"{HUB_CONFIG} {names[0]}" if folder_model else names[0]
    get = (f"on a connected machine run `hf download {repo} {files}` (huggingface_hub's CLI; "
           f"`hf download {repo}` for the whole repo), or build the encoder there once with "
           f"HF_HUB_OFFLINE=0, and copy the file or the cache here")
    raise _missing(f"{what} (Hugging Face repo {repo})", need, looked, get)


_JSON_MODELS: dict[str, str] = {}  # resolved config file + content hash -> registered name


def is_config_file(model_name) -> bool:
    """True when ``model_name`` names an open_clip model-config JSON file (ends with .json)."""
    return str(model_name).lower().endswith(".json")


def register_config_file(path) -> str:
    """Register an open_clip model-config JSON file with open_clip and return the name it is
    registered under. The file holds the architecture either bare (``{"embed_dim": ...,
    "vision_cfg": {...}, "text_cfg": {...}}``, the form of open_clip's own ``model_configs/*.json``)
    or as a hub folder's ``open_clip_config.json`` (the same under ``"model_cfg"``). The name is the
    file's stem plus a hash of its content, so a file never shadows a built-in model of the same
    name and an edited file is registered afresh."""
    import hashlib
    import json
    import tempfile

    open_clip = _open_clip()
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"OpenCLIP model config {p} not found: model_name ending in .json "
                                f"must be an open_clip model-config file (embed_dim, vision_cfg, "
                                f"text_cfg), e.g. a copy of one of open_clip's model_configs/*.json")
    text = p.read_text()
    key = f"{p.resolve()}:{hashlib.sha1(text.encode()).hexdigest()[:10]}"
    if key in _JSON_MODELS:
        return _JSON_MODELS[key]
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"OpenCLIP model config {p} is not valid JSON: {e}") from e
    if isinstance(cfg, dict) and isinstance(cfg.get("model_cfg"), dict):
        cfg = cfg["model_cfg"]
    need = ("embed_dim", "vision_cfg", "text_cfg")
    missing = [k for k in need if not isinstance(cfg, dict) or k not in cfg]
    if missing:
        raise ValueError(f"OpenCLIP model config {p} lacks {', '.join(missing)}: it must hold "
                         f"{', '.join(need)} (bare, as open_clip's model_configs/*.json, or under "
                         f"\"model_cfg\" as a hub folder's {HUB_CONFIG})")
    name = f"{p.stem}-{key.rsplit(':', 1)[1]}"
    # open_clip registers configs from files only; its registry keeps the entry after the file
    # is gone (a later rescan skips missing paths), so the copy lives only for the call
    with tempfile.TemporaryDirectory(prefix="drivemind-openclip-cfg-") as folder:
        (Path(folder) / f"{name}.json").write_text(json.dumps(cfg))
        open_clip.add_model_config(Path(folder) / f"{name}.json")
    if name not in open_clip.list_models():
        raise ValueError(f"open_clip did not register the model config {p}")
    _JSON_MODELS[key] = name
    return name


def _bev_config(bev) -> BevConfig | None:
    if bev is None or isinstance(bev, BevConfig):
        return bev
    if isinstance(bev, str):
        if bev not in BEV_PRESETS:
            raise ValueError(f"unknown bev preset {bev!r}; valid: {', '.join(BEV_PRESETS)}")
        return BEV_PRESETS[bev]
    return BevConfig.from_dict(dict(bev))


class OpenClipEncoder(CachedPrompts):
    """An open_clip model as a frozen contrastive encoder (module docstring).

    ``model_name``: any open_clip config name (``open_clip.list_models()``, or one registered with
    ``open_clip.add_model_config``), ``hf-hub:<org>/<repo>``, ``local-dir:<folder>``, or the path
    of an open_clip model-config ``.json`` file (:func:`register_config_file`: an architecture
    open_clip does not ship, with its checkpoint as ``weights_path`` / ``pretrained``).
    ``pretrained``: a tag of that model (``open_clip.list_pretrained_tags_by_model``), a
    checkpoint file, or None for random weights (named ``random-init`` in ``name``).
    ``weights_path``: the checkpoint file (or a folder holding it), overriding every search.
    ``cache_dir``: the Hugging Face hub cache to search. ``image_size``: override the model's input
    size (position embeddings are resized). ``bev``: the BevConfig (or preset name) of the masks
    given to ``embed`` when they are not Roach's 15-channel layout."""

    def __init__(self, model_name: str = "ViT-bigG-14", pretrained: str | None = "laion2b_s39b_b160k",
                 weights_path=None, cache_dir=None, device: str = "cpu", image_size: int | None = None,
                 *, precision: str = "fp32", bev=None, batch_size: int = 32):
        open_clip = _open_clip()
        import torch

        self.model_name, self.pretrained = str(model_name), pretrained
        self.batch_size = int(batch_size)
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.bev_config = _bev_config(bev)
        arch_name = (register_config_file(self.model_name) if is_config_file(self.model_name)
                     else self.model_name)
        src = resolve_openclip_weights(arch_name, pretrained, weights_path, cache_dir)
        self.weights = src
        kw = {}
        if image_size is not None:
            kw["force_image_size"] = int(image_size)
        hub = self.model_name.startswith(("hf-hub:", "local-dir:"))
        tcfg = {}
        if hub:
            arch, ckpt = f"local-dir:{src}", None
        else:
            arch, ckpt = arch_name, (str(src) if src is not None else None)
            tag = str(pretrained) if pretrained is not None else ""
            from open_clip.pretrained import get_pretrained_cfg
            tcfg = get_pretrained_cfg(arch_name, tag) if tag.lower() not in RANDOM else {}
            # the tag's own preprocessing and activation, which open_clip applies only when it
            # resolves the tag itself (we hand it the file we found)
            for key, arg in (("mean", "image_mean"), ("std", "image_std"),
                             ("interpolation", "image_interpolation"),
                             ("resize_mode", "image_resize_mode")):
                if key in tcfg:
                    kw[arg] = tcfg[key]
            if tcfg.get("quick_gelu"):
                kw["force_quick_gelu"] = True
        try:
            self.model, _, self.preprocess = open_clip.create_model_and_transforms(
                arch, pretrained=ckpt, device=device, precision=precision,
                pretrained_text=False, pretrained_image=False, **kw)
        except RuntimeError as e:
            if "size mismatch" in str(e) or "Missing key" in str(e) or "Unexpected key" in str(e):
                raise ValueError(f"{src} does not hold weights of OpenCLIP model {self.model_name!r} "
                                 f"(image_size={image_size}): {str(e)[:400]}") from e
            raise
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = open_clip.get_tokenizer(arch)
        self.device = torch.device(device)
        self.dim = int(self._probe_dim())
        if src is None:
            label = "random-init"
            log.warning("OpenCLIP %s runs with RANDOM weights (pretrained=%r): embeddings carry no "
                        "meaning", self.model_name, pretrained)
        elif hub:
            label = ""
        elif pretrained is not None and Path(str(pretrained)).expanduser().is_file():
            label = Path(str(pretrained)).name
        elif tcfg:  # a published tag of this model (its file found, or given as weights_path)
            label = str(pretrained)
        else:  # weights_path with no tag of this model (e.g. a model-config .json's checkpoint)
            label = Path(src).name
        shown = Path(self.model_name).name if is_config_file(self.model_name) else self.model_name
        self.name = shown if hub else f"{shown}:{label}"
        self.name = f"openclip:{self.name}"
        self.image_size = self.preprocess_size()
        self._cache: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ helpers
    @classmethod
    def from_config(cls, cfg: dict) -> "OpenClipEncoder":
        """Build from a config mapping (``configs/vlm/openclip.yaml``'s ``encoder``)."""
        cfg = dict(cfg or {})
        cfg.pop("kind", None)
        valid = ("model_name", "pretrained", "weights_path", "cache_dir", "device", "image_size",
                 "precision", "bev", "batch_size")
        bad = sorted(set(cfg) - set(valid))
        if bad:
            raise ValueError(f"unknown OpenCLIP encoder option(s) {bad}; valid: {', '.join(valid)}")
        return cls(**cfg)

    def preprocess_size(self) -> int:
        size = getattr(self.model.visual, "image_size", 224)
        return int(size[0] if isinstance(size, (tuple, list)) else size)

    def _probe_dim(self) -> int:
        d = getattr(self.model.visual, "output_dim", None)
        if d is None:
            d = self._forward(["a"]).shape[1]
        return d

    # ------------------------------------------------------------------ protocol
    def embed_rgb(self, images, batch_size: int | None = None) -> np.ndarray:
        """uint8 RGB images (N, H, W, 3) or (H, W, 3) -> (N, dim) float32 unit rows."""
        import torch
        from PIL import Image

        arr = np.asarray(images)
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4 or arr.shape[-1] != 3 or arr.dtype != np.uint8:
            raise ValueError(f"expected uint8 RGB images (N, H, W, 3), got {arr.dtype} {arr.shape}")
        bs = int(batch_size or self.batch_size)
        out = []
        with torch.no_grad():
            for i in range(0, len(arr), bs):
                x = torch.stack([self.preprocess(Image.fromarray(im)) for im in arr[i:i + bs]])
                x = x.to(self.device, dtype=next(self.model.parameters()).dtype)
                f = self.model.encode_image(x).float()
                out.append(torch.nn.functional.normalize(f, dim=-1).cpu().numpy())
        if not out:
            return np.zeros((0, self.dim), np.float32)
        return np.concatenate(out).astype(np.float32, copy=False)

    def bev_to_rgb(self, bev) -> np.ndarray:
        """uint8 masks (N, C, H, W) -> (N, H, W, 3) in the BEV renderer's colours."""
        arr = np.asarray(bev)
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4:
            raise ValueError(f"expected BEV masks of shape (N, C, H, W), got {arr.shape}")
        cfg = self.bev_config
        if cfg is None:
            cfg = BevConfig()
            if arr.shape[1] != cfg.n_channels:
                raise ValueError(f"BEV masks with {arr.shape[1]} channels: pass bev=<the BevConfig "
                                 f"they were rendered with> to OpenClipEncoder (the default is "
                                 f"Roach's {cfg.n_channels} channels {list(cfg.channels)})")
        return masks_to_rgb(arr, cfg)

    def embed(self, bev, batch_size: int | None = None) -> np.ndarray:
        """uint8 BEV masks (N, C, H, W) or (C, H, W) -> (N, dim) float32 unit rows (coloured with
        the BEV palette, then open_clip's preprocessing)."""
        return self.embed_rgb(self.bev_to_rgb(bev), batch_size)

    def _forward(self, texts: list[str]) -> np.ndarray:
        import torch

        out = []
        with torch.no_grad():
            for i in range(0, len(texts), 64):
                tok = self.tokenizer(texts[i:i + 64]).to(self.device)
                f = self.model.encode_text(tok).float()
                out.append(torch.nn.functional.normalize(f, dim=-1).cpu().numpy())
        return np.concatenate(out).astype(np.float32, copy=False)

    def __repr__(self) -> str:
        return (f"OpenClipEncoder({self.name!r}, dim={self.dim}, image_size={self.image_size}, "
                f"weights={str(self.weights) if self.weights else None!r})")
