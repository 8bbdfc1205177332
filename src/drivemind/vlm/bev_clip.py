"""BEV-CLIP: a compact contrastive image tower for the BEV masks, aligned to frozen MiniLM.

``BevClip`` maps uint8 BEV masks (C x H x W, e.g. the 15 x 96 x 96 ``cpu`` preset) to 384-d
unit vectors in all-MiniLM-L6-v2's sentence space, so any prompt embedded by
:class:`~drivemind.vlm.text.MiniLMTextEncoder` can be scored against stored image embeddings by
a dot product. Each BEV shape has its own checkpoint (:func:`weights_name`:
``bev_clip_cpu.pt``, ``bev_clip_roach.pt``, ``bev_clip_paper.pt``, else ``bev_clip_CxHxW.pt``);
``BevClip.load(bev_shape=...)`` picks it. Towers for inputs above ~128 px use a stride-4 stem
(:func:`default_stem_stride`), so they cost about what the 96 px one does.

``train_bev_clip`` fits it with a symmetric InfoNCE loss against the frozen embeddings of
ground-truth captions (:mod:`drivemind.vlm.captions`); identical captions in a batch are not
treated as negatives (soft targets spread over all equal captions).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..paths import weights_cache_dir as cache_dir
from .text import TEXT_DIM

FORMAT = "drivemind.bev_clip"
VERSION = 1
DEFAULT_NAME = "bev_clip_cpu.pt"  # the 15 x 96 x 96 ``cpu`` preset's checkpoint (shipped)
SPEED_NAME = "bev_clip_cpu_speed.pt"  # the opt-in tower that also reads the ego's speed (shipped)
LANE_NAME = "bev_clip_cpu_speed_lane.pt"  # opt-in: speed + the route-band lateral readout of the BEV
TRAIN_CMD = "python scripts/train_bev_clip.py"
SPEED_MAX_KMH = 120.0  # speeds are clipped here before the Fourier features
SPEED_FREQS = 6  # sin / cos of 2^k * pi * v / SPEED_MAX_KMH for k < SPEED_FREQS
LANE_MAX_M = 3.0  # lateral readouts are clipped here (the env ends an episode at 3 m)
LANE_FREQS = 4  # sin / cos of 2^k * pi * lat / LANE_MAX_M for k < LANE_FREQS
LANE_NF = 2 + 2 * LANE_FREQS + 2  # lane_features' width


def speed_features(speed_kmh) -> torch.Tensor:
    """The ego's measured speed (km/h, (N,)) -> (N, 2 + 2 * SPEED_FREQS) float features: v / vmax,
    log1p(v) / log1p(vmax) and sin / cos of 2^k pi v / vmax (v clipped to [0, SPEED_MAX_KMH]).
    Non-finite speeds raise a ValueError."""
    v = torch.as_tensor(np.asarray(speed_kmh, np.float32)).reshape(-1)
    if not torch.isfinite(v).all():
        raise ValueError(f"speed_kmh must be finite, got {v[~torch.isfinite(v)][:4].tolist()}")
    v = v.clamp(0.0, SPEED_MAX_KMH)
    x = v / SPEED_MAX_KMH
    ang = x[:, None] * (math.pi * 2.0 ** torch.arange(SPEED_FREQS, dtype=torch.float32))[None]
    return torch.cat([x[:, None], (torch.log1p(v) / math.log1p(SPEED_MAX_KMH))[:, None],
                      torch.sin(ang), torch.cos(ang)], 1)


def lane_features(readout: torch.Tensor) -> torch.Tensor:
    """The route-band readout (:class:`drivemind.bev.lane_offset.RouteOffsetReadout`: (N, 3)
    ``lateral_m, slope, valid``) -> (N, LANE_NF) float features: lat / max, |lat| / max, sin / cos
    of 2^k pi lat / max (lat clipped to +-LANE_MAX_M), the slope (clipped to +-1) and ``valid``."""
    lat = readout[:, 0].clamp(-LANE_MAX_M, LANE_MAX_M) / LANE_MAX_M
    ang = lat[:, None] * (math.pi * 2.0 ** torch.arange(LANE_FREQS, dtype=torch.float32))[None]
    return torch.cat([lat[:, None], lat.abs()[:, None], torch.sin(ang), torch.cos(ang),
                      readout[:, 1:2].clamp(-1.0, 1.0), readout[:, 2:3]], 1)


def _norm_shape(bev_shape) -> tuple[int, int, int]:
    try:
        shape = tuple(int(s) for s in bev_shape)
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"bev_shape must be (C, H, W) positive integers, got {bev_shape!r}")
    return shape


def _preset_for(shape: tuple[int, int, int]) -> str | None:
    """The BEV preset (cpu / roach / paper) whose default observation has this shape, if any."""
    from ..bev.config import BEV_PRESETS

    for name, cfg in BEV_PRESETS.items():
        if cfg.shape == shape:
            return name
    return None


def weights_name(bev_shape=None, speed: bool = False, lane: bool = False) -> str:
    """Checkpoint file name for a BEV shape (C, H, W): ``bev_clip_<preset>.pt`` when the shape is a
    preset's (``cpu`` 15x96x96, ``roach`` 15x192x192, ``paper`` 15x224x224), else
    ``bev_clip_<C>x<H>x<W>.pt``. ``None``: the default ``bev_clip_cpu.pt``. ``speed``: the name of
    the opt-in tower that also reads the ego's speed (``..._speed.pt``, e.g.
    ``bev_clip_cpu_speed.pt``); ``lane``: the opt-in tower that also reads the route-band lateral
    readout of its BEV (``..._lane.pt``, e.g. ``bev_clip_cpu_speed_lane.pt``); no default ever
    loads either."""
    if bev_shape is None:
        name = DEFAULT_NAME
    else:
        shape = _norm_shape(bev_shape)
        preset = _preset_for(shape)
        name = f"bev_clip_{preset}.pt" if preset else "bev_clip_{}x{}x{}.pt".format(*shape)
    return name[:-3] + ("_speed" if speed else "") + ("_lane" if lane else "") + ".pt"


def train_command(bev_shape=None) -> str:
    """The training command that writes the checkpoint ``weights_name(bev_shape)`` looks for."""
    if bev_shape is None:
        return f"{TRAIN_CMD} --bev cpu --threads 1"
    shape = _norm_shape(bev_shape)
    preset = _preset_for(shape)
    if preset:
        return f"{TRAIN_CMD} --bev {preset} --threads 1"
    c, h, w = shape
    from ..bev.config import BEV_PRESETS

    cmd = f"{TRAIN_CMD} --bev {h} --threads 1"
    if c != BEV_PRESETS["roach"].n_channels:
        cmd += " --channels ... --history ..."
    return cmd


def _train_note(bev_shape) -> str:
    """What the command of a shape that is no preset's leaves to the user."""
    if bev_shape is None:
        return ""
    c, h, w = _norm_shape(bev_shape)
    if _preset_for((c, h, w)):
        return ""
    if h != w:
        return f" (BEV-CLIP needs square BEVs; {h}x{w} is not)"
    from ..bev.config import BEV_PRESETS

    planes = (f"; choose --channels / --history so it has {c} planes"
              if c != BEV_PRESETS["roach"].n_channels else "")
    return f" (--bev {h} is Roach's 38.4 m view at {h} px{planes}; it must match your env's BEV)"


def default_weights_path(bev_shape=None, speed: bool = False, lane: bool = False) -> Path:
    """Where the training script writes the checkpoint for ``bev_shape`` by default (``speed``:
    the speed tower's, ``--speed-input``; ``lane``: the lane readout's, ``--lane-input``)."""
    return cache_dir() / weights_name(bev_shape, speed=speed, lane=lane)


PACKAGE_WEIGHTS = Path(__file__).resolve().parent / "weights"  # the shipped checkpoints


def search_dirs() -> list[Path]:
    """Folders searched for a weights file given by name: $DRIVEMIND_VLM_WEIGHTS' folder,
    ``~/.cache/drivemind`` (where the training script writes), then the package's ``weights/``
    folder (the shipped checkpoints)."""
    dirs = []
    env = os.environ.get("DRIVEMIND_VLM_WEIGHTS")
    if env:
        dirs.append(Path(env).expanduser())
    dirs += [cache_dir(), PACKAGE_WEIGHTS]
    return dirs


def fill_bev(path: str | os.PathLike, bev_shape=None) -> str:
    """``path`` with a ``{bev}`` replaced by the BEV's part of :func:`weights_name` for
    ``bev_shape`` (``cpu``, ``roach``, ``paper`` or ``CxHxW``): ``bev_clip_{bev}_speed_lane.pt``
    -> ``bev_clip_roach_speed_lane.pt``."""
    return str(path).replace("{bev}", weights_name(bev_shape)[len("bev_clip_"):-len(".pt")])


def find_weights(path: str | os.PathLike | None = None, bev_shape=None) -> Path:
    """Resolve a weights file: an existing path as given, else its file name in ``search_dirs()``;
    with no path, the checkpoint named for ``bev_shape`` (:func:`weights_name`). A ``{bev}`` in the
    path stands for the BEV's part of that name (``cpu``, ``roach``, ``paper`` or ``CxHxW``), so one
    config serves every preset (``vlm=bev_clip_speed_lane``: ``bev_clip_{bev}_speed_lane.pt``).
    Raises one FileNotFoundError naming the file, the folders searched and the command that
    trains it."""
    if path is not None and "{bev}" in str(path):
        path = fill_bev(path, bev_shape)
    name = weights_name(bev_shape) if path is None else str(path)
    p = Path(name).expanduser()
    if path is not None and p.is_file():
        return p
    tried = [] if path is None else [p.resolve()]
    for d in search_dirs():
        cand = d / p.name
        if cand.is_file():
            return cand
        tried.append(d)
    what = "" if bev_shape is None else " for BEV shape {}x{}x{}".format(*_norm_shape(bev_shape))
    have = sorted({f.name for d in search_dirs() if d.is_dir() for f in d.glob("bev_clip_*.pt")})
    out = cache_dir() / p.name
    raise FileNotFoundError(
        f"BEV-CLIP weights {p.name!r}{what} not found; looked at: "
        f"{', '.join(str(t) for t in tried)} (checkpoints there: {', '.join(have) or 'none'}). "
        f"Train them once with `{train_command(bev_shape)}"
        f"{' --speed-input' if p.name.endswith(('_speed.pt', '_speed_lane.pt')) else ''}"
        f"{' --lane-input' if p.name.endswith('_lane.pt') else ''}`{_train_note(bev_shape)} (writes "
        f"{out}; CPU minutes), "
        f"or pass the path of an existing checkpoint.")


def default_stem_stride(size: int) -> int:
    """Stride of the first convolution: 2 up to ~128 px, then 2 x round(size / 96) (4 for the
    192 and 224 px presets), so every tower sees a ~48-56 px map after its stem and costs about
    what the 96 px one does."""
    return 2 * max(1, round(int(size) / 96))


def _lane_readout(in_channels: int, size: int, channel_names, lane_bev):
    """The route-band readout of a lane tower's BEV: ``lane_bev`` (a BevConfig dict) or, without
    one, the preset of that shape (else Roach's 38.4 m view at ``size`` px). One ValueError when
    the BEV has no route plane or another shape."""
    from ..bev import BEV_PRESETS, BevConfig
    from ..bev.lane_offset import RouteOffsetReadout

    if lane_bev is not None:
        cfg = BevConfig.from_dict(dict(lane_bev))
    else:
        preset = _preset_for((int(in_channels), int(size), int(size)))
        cfg = BEV_PRESETS[preset] if preset else BevConfig().scaled(int(size))
    if cfg.shape != (int(in_channels), int(size), int(size)):
        raise ValueError(f"lane_input: the BEV config {cfg.shape} does not match the tower's "
                         f"({in_channels}, {size}, {size}); pass lane_bev= the BevConfig of its BEV")
    if channel_names and list(channel_names) != cfg.channel_names():
        raise ValueError(f"lane_input: the tower's planes {list(channel_names)} are not its BEV "
                         f"config's {cfg.channel_names()}; pass lane_bev= the BevConfig of its BEV")
    return RouteOffsetReadout(cfg), cfg


class BevClip(nn.Module):
    """Small CNN on uint8 BEV masks -> 384-d unit embedding; learnable CLIP temperature.
    ``speed_input``: the ego's measured speed is an input beside the BEV; ``lane_input``: so is the
    fixed route-band readout of the BEV's own route plane (:mod:`drivemind.bev.lane_offset`: the
    ego's lateral offset from the route, a function of the pixels only), computed inside the
    tower, so callers give nothing more. Both are fused into the hidden layer."""

    def __init__(self, in_channels: int = 15, size: int = 96, dim: int = TEXT_DIM,
                 width: int = 32, hidden: int = 256, channel_names=None,
                 stem_stride: int | None = None, speed_input: bool = False,
                 lane_input: bool = False, lane_bev: dict | None = None):
        super().__init__()
        stride = default_stem_stride(size) if stem_stride is None else int(stem_stride)
        if stride < 1:
            raise ValueError(f"stem_stride must be >= 1, got {stem_stride}")
        self.config = dict(in_channels=int(in_channels), size=int(size), dim=int(dim),
                           width=int(width), hidden=int(hidden),
                           channel_names=list(channel_names) if channel_names else None,
                           stem_stride=stride, speed_input=bool(speed_input))
        self.lane_readout = None
        if lane_input:  # only lane towers carry the keys: older checkpoints' configs stay as they were
            self.lane_readout, lane_cfg = _lane_readout(in_channels, size, channel_names, lane_bev)
            self.config.update(lane_input=True, lane_bev=lane_cfg.to_dict())
        w = int(width)
        k = max(5, stride + 1)  # the stem kernel always overlaps its neighbours (5x5 at stride 2, 4)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, w, k, stride=stride, padding=k // 2), nn.ReLU(inplace=True),
            nn.Conv2d(w, 2 * w, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(2 * w, 4 * w, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(4 * w, 4 * w, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * w * 16, hidden), nn.ReLU(inplace=True),
                                  nn.Linear(hidden, dim))
        if speed_input:  # the ego's speed (a measurement, as Roach's) added to the hidden layer
            nf = 2 + 2 * SPEED_FREQS
            self.speed = nn.Sequential(nn.Linear(nf, 64), nn.ReLU(inplace=True), nn.Linear(64, hidden))
        if lane_input:  # the route-band lateral readout of the BEV, added to the hidden layer
            self.lane = nn.Sequential(nn.Linear(LANE_NF, 64), nn.ReLU(inplace=True), nn.Linear(64, hidden))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    @property
    def reads_speed(self) -> bool:
        """Whether this tower reads the ego's measured speed beside the BEV (``speed_input``):
        ``embed`` / ``forward`` then need ``speed_kmh``."""
        return bool(self.config.get("speed_input"))

    @property
    def reads_lane(self) -> bool:
        """Whether this tower also reads the route-band lateral readout of its BEV
        (``lane_input``; computed from the BEV inside the tower: callers pass nothing more)."""
        return self.lane_readout is not None

    @property
    def bev_shape(self) -> tuple[int, int, int]:
        c = self.config
        return (c["in_channels"], c["size"], c["size"])

    @property
    def dim(self) -> int:
        return self.config["dim"]

    def _need_speed(self, speed_kmh, n: int):
        """``speed_kmh`` checked against this tower: (N,) for a speed tower (one clear error when
        missing or of another length), None for an image-only one (a speed given is refused)."""
        if not self.reads_speed:
            if speed_kmh is not None:
                raise ValueError("this BEV-CLIP tower reads the BEV only (speed_input=False) and was "
                                 "given speed_kmh; load a speed tower (e.g. "
                                 f"{SPEED_NAME!r}) or leave speed_kmh out")
            return None
        if speed_kmh is None:
            path = getattr(self, "path", None)
            raise ValueError(f"this BEV-CLIP tower{f' ({path.name})' if path else ''} reads the "
                             f"ego's measured speed beside the BEV (speed_input=True): call "
                             f"embed(bev, speed_kmh=...) with one speed in km/h per frame (the "
                             f"step's 'speed_kmh' fact), or use the image-only {DEFAULT_NAME!r}")
        v = np.asarray(speed_kmh, np.float32).reshape(-1)
        if len(v) != n:
            raise ValueError(f"{n} BEV frame(s) but {len(v)} speed(s): give one speed_kmh per frame")
        return v

    def forward(self, x: torch.Tensor, speed_kmh=None) -> torch.Tensor:
        """BEV masks (uint8 or float in [0, 1]) -> unit embeddings; a speed tower needs
        ``speed_kmh`` (N,) in km/h."""
        lane = None
        if self.lane_readout is not None:  # read before scaling: a pixel is set when > 0
            if tuple(x.shape[1:]) != self.bev_shape:
                self._check_shape(x.shape[1:])
            lane = lane_features(self.lane_readout.features(x.detach().cpu()))
        if x.dtype == torch.uint8:
            x = x.float() / 255.0
        v = self._need_speed(speed_kmh, len(x))
        if v is None and lane is None:
            return F.normalize(self.head(self.features(x)), dim=-1)
        flat, lin1, act, lin2 = self.head
        h = lin1(flat(self.features(x)))
        if v is not None:
            h = h + self.speed(speed_features(v).to(x.device))
        if lane is not None:
            h = h + self.lane(lane.to(x.device))
        return F.normalize(lin2(act(h)), dim=-1)

    def _check_shape(self, shape) -> None:
        if tuple(shape) != self.bev_shape:
            raise ValueError(f"BEV shape {tuple(shape)} does not match this BEV-CLIP model's "
                             f"{self.bev_shape} (C, H, W); use the BEV preset it was trained on "
                             f"or train one for it with `{train_command(shape)}`")

    def embed(self, bev, batch_size: int = 256, speed_kmh=None) -> np.ndarray:
        """uint8 BEV masks (N, C, H, W) or (C, H, W) -> (N, dim) float32 unit rows. A speed tower
        (``reads_speed``) also needs ``speed_kmh``: the ego's measured speed in km/h, one per
        frame (a scalar for one frame); without it one ValueError says so."""
        arr = np.asarray(bev)
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4:
            raise ValueError(f"expected BEV masks of shape (N, C, H, W), got {arr.shape}")
        self._check_shape(arr.shape[1:])
        speed = self._need_speed(speed_kmh, len(arr))
        was = self.training
        self.eval()
        dev = next(self.parameters()).device
        out = []
        with torch.no_grad():
            for i in range(0, len(arr), batch_size):
                sp = None if speed is None else speed[i:i + batch_size]
                out.append(self(torch.as_tensor(arr[i:i + batch_size]).to(dev), sp).cpu().numpy())
        self.train(was)
        if not out:
            return np.zeros((0, self.dim), np.float32)
        return np.concatenate(out).astype(np.float32, copy=False)

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | os.PathLike, **meta) -> Path:
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        sd = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        torch.save({"format": FORMAT, "version": VERSION, "config": self.config,
                    "text_model": "sentence-transformers/all-MiniLM-L6-v2", "meta": meta,
                    "state_dict": sd}, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, *, bev_shape=None,
             map_location: str = "cpu") -> "BevClip":
        """Load a checkpoint. ``path=None`` picks the checkpoint for ``bev_shape``
        (:func:`weights_name`: ``bev_clip_cpu.pt`` / ``bev_clip_roach.pt`` / ``bev_clip_paper.pt``
        or ``bev_clip_CxHxW.pt``; no shape: ``bev_clip_cpu.pt``) from ``search_dirs()``. With
        ``bev_shape`` (C, H, W), a model trained for another shape is refused."""
        p = find_weights(path, bev_shape=bev_shape)
        try:
            ck = torch.load(p, map_location=map_location, weights_only=True)
        except Exception as e:  # corrupt / not a torch file
            raise ValueError(f"{p} is not a readable BEV-CLIP checkpoint ({e}); retrain with "
                             f"`{train_command(bev_shape)} --out {p}`") from e
        if not isinstance(ck, dict) or ck.get("format") != FORMAT:
            raise ValueError(f"{p} is not a BEV-CLIP checkpoint (format {FORMAT!r} missing)")
        if ck.get("version") != VERSION:
            raise ValueError(f"{p} has BEV-CLIP checkpoint version {ck.get('version')}, this code "
                             f"reads version {VERSION}; retrain with `{train_command(bev_shape)}`")
        cfg = dict(ck["config"])
        cfg.setdefault("stem_stride", 2)  # checkpoints written before the option had a stride-2 stem
        cfg.setdefault("speed_input", False)  # and no speed input
        cfg.setdefault("lane_input", False)  # nor lane readout
        model = cls(**cfg)
        model.load_state_dict(ck["state_dict"])
        model.meta = ck.get("meta", {})
        model.path = p
        if bev_shape is not None:
            model._check_shape(bev_shape)
        return model.eval()


# ---------------------------------------------------------------------- training and evaluation
def _caption_ids(captions) -> tuple[list[str], np.ndarray]:
    uniq = list(dict.fromkeys(captions))
    index = {c: i for i, c in enumerate(uniq)}
    return uniq, np.array([index[c] for c in captions], np.int64)


def clip_loss(img: torch.Tensor, txt: torch.Tensor, ids: torch.Tensor,
              logit_scale: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE with soft targets: pairs whose captions are equal are all positives."""
    logits = logit_scale.exp().clamp(max=100.0) * img @ txt.t()
    same = (ids[:, None] == ids[None, :]).float()
    target = same / same.sum(1, keepdim=True)
    # KL(target || softmax): cross-entropy minus the target's entropy, so a perfect match is 0
    ent = (target * target.clamp_min(1e-12).log()).sum(1)  # -entropy
    li = (ent - (target * F.log_softmax(logits, 1)).sum(1)).mean()
    lt = (ent - (target * F.log_softmax(logits.t(), 1)).sum(1)).mean()
    return 0.5 * (li + lt)


def train_bev_clip(frames, captions, text_encoder, *, model: BevClip | None = None,
                   epochs: int = 10, batch_size: int = 128, lr: float = 1e-3,
                   weight_decay: float = 1e-4, seed: int = 0, progress: bool = False,
                   channel_names=None, log=None, speed_kmh=None) -> BevClip:
    """Fit a BevClip on uint8 frames (N, C, H, W) and their captions (N strings). The text
    tower stays frozen: each distinct caption is embedded once. ``speed_kmh`` (N,): the frames'
    ego speeds, for a speed tower (built with ``speed_input=True`` when ``model`` is None)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 (N, C, H, W), got {frames.dtype} {frames.shape}")
    if len(captions) != len(frames):
        raise ValueError(f"{len(frames)} frames but {len(captions)} captions")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    n, c, h, w = frames.shape
    if h != w:
        raise ValueError(f"BEV frames must be square, got {h}x{w}")
    if model is None:
        model = BevClip(in_channels=c, size=h, channel_names=channel_names,
                        speed_input=speed_kmh is not None)
    model._check_shape(frames.shape[1:])
    if speed_kmh is not None:
        speed_kmh = np.asarray(speed_kmh, np.float32).reshape(-1)
    model._need_speed(speed_kmh, n)  # a speed tower without speeds (or the reverse) fails here
    uniq, ids = _caption_ids(list(captions))
    text = torch.as_tensor(text_encoder.encode(uniq))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = max(1, math.ceil(n / batch_size))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * steps_per_epoch,
                                                pct_start=0.1)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=epochs * steps_per_epoch, desc="BEV-CLIP", unit="batch")
    model.train()
    for ep in range(epochs):
        order = rng.permutation(n)
        tot = 0.0
        for i in range(steps_per_epoch):
            b = order[i * batch_size:(i + 1) * batch_size]
            x = torch.as_tensor(frames[b])
            bid = torch.as_tensor(ids[b])
            sp = None if speed_kmh is None else speed_kmh[b]
            loss = clip_loss(model(x, sp), text[bid], bid, model.logit_scale)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            tot += loss.item()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(epoch=ep + 1, loss=f"{loss.item():.3f}")
        if log is not None:
            log(ep + 1, tot / steps_per_epoch)
    if bar is not None:
        bar.close()
    return model.eval()


def retrieval_accuracy(model: BevClip, frames, captions, text_encoder,
                       image_embeddings: np.ndarray | None = None, speed_kmh=None) -> dict:
    """Image-to-text top-1 over the distinct captions of this (held-out) set. ``chance`` is
    1 / distinct captions; ``majority`` is the accuracy of always answering the most common one.
    ``speed_kmh``: the frames' ego speeds, for a speed tower."""
    uniq, ids = _caption_ids(list(captions))
    img = (model.embed(frames, speed_kmh=speed_kmh) if image_embeddings is None
           else np.asarray(image_embeddings))
    txt = text_encoder.encode(uniq)
    pred = (img @ txt.T).argmax(1) if len(uniq) else np.zeros(0, np.int64)
    counts = np.bincount(ids, minlength=len(uniq))
    clauses = [set(c.split("; ")) for c in uniq]

    def clause_acc(p):  # mean share of the true caption's clauses found in the answer
        return float(np.mean([len(clauses[a] & clauses[b]) / len(clauses[b])
                              for a, b in zip(p, ids)])) if len(ids) else 0.0

    facet, facet_majority = _facet_accuracy(uniq, ids, pred)
    return {"accuracy": float((pred == ids).mean()) if len(ids) else 0.0,
            "chance": 1.0 / max(len(uniq), 1),
            "majority": float(counts.max() / len(ids)) if len(ids) else 0.0,
            "clause_accuracy": clause_acc(pred),
            "clause_majority": clause_acc(np.full(len(ids), counts.argmax() if len(ids) else 0)),
            "facet_accuracy": facet, "facet_majority": facet_majority,
            "n_frames": int(len(ids)), "n_captions": int(len(uniq))}


def _facet_accuracy(uniq: list[str], ids: np.ndarray, pred: np.ndarray) -> tuple[dict, dict]:
    """Per facet of the captions (speed, lane, ahead, light, collision: ``captions.VOCABULARY``),
    the share of frames whose retrieved caption says the same as the true one, and the share the
    facet's most common value would get. A caption's top-1 needs every facet right at once, so
    these say which facet holds it down (``top1_without_<facet>``: the top-1 if that facet were
    not asked). Captions that are not made of the vocabulary's clauses
    (other caption families) give empty dicts."""
    from .captions import VOCABULARY

    clause = {text: (f, key) for f, table in VOCABULARY.items() for key, opts in table.items()
              for text in opts if text}
    speeds = [(t, key) for t, (f, key) in clause.items() if f == "speed"]
    facets = []
    for c in uniq:
        d = {f: "none" for f, table in VOCABULARY.items() if "" in table.get("none", [])}  # clause left out
        for part in c.split("; "):
            if part in clause:
                d[clause[part][0]] = clause[part][1]
                continue
            # "<speed clause> <lane clause>" are written as one part
            split = [(key, clause.get(part[len(t) + 1:])) for t, key in speeds if part.startswith(t + " ")]
            if not split or split[0][1] is None:
                return {}, {}
            d["speed"], (lane_facet, lane_key) = split[0][0], split[0][1]
            d[lane_facet] = lane_key
        facets.append(d)
    if not len(ids) or any(set(d) != set(VOCABULARY) for d in facets):
        return {}, {}
    acc, maj, right = {}, {}, {}
    for f in VOCABULARY:
        true = np.array([facets[i][f] for i in ids])
        got = np.array([facets[i][f] for i in pred])
        right[f] = true == got
        acc[f] = float(right[f].mean())
        _, n = np.unique(true, return_counts=True)
        maj[f] = float(n.max() / len(true))
    for f in VOCABULARY:  # top-1 if this facet did not count: which facet caps the joint answer
        acc[f"top1_without_{f}"] = float(np.all([right[g] for g in VOCABULARY if g != f], axis=0).mean())
    return acc, maj
