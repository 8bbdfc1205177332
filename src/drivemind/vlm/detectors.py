"""Detector slot of DriveVLM-RL's dynamic pathway: which critical objects are in front of the ego.

DriveVLM-RL gates its dynamic (LVLM) pathway on a detector: when any of the critical COCO classes
(``CRITICAL_CLASSES``: person, bicycle, motorcycle and eight animals) is detected in the forward
view, the LVLM is asked; otherwise the dynamic reward is 0. Two detectors fill the slot:

- ``PrivilegedDetector`` (default; a **stand-in for YOLOv8**): ground-truth actors of a
  ``WorldSnapshot`` inside a forward field of view of the ego, mapped to COCO names
  (walker -> person, bicycle -> bicycle, motorcycle -> motorcycle, car -> car). It reads the
  snapshot, so it works the same whichever view (camera or BEV) the pathway uses. It lives in
  ``drivemind.privileged`` (with ``Detection`` and ``gate``), below the env, which computes its
  ``critical_count`` fact with it; this module re-exports it.
- ``YoloDetector``: an ultralytics YOLO model on RGB frames (``yolov8n.pt`` or any local
  checkpoint; a ``.yaml`` builds the architecture with random weights, for tests). Needs the
  ``vision`` extra. Nothing is downloaded: a missing ``.pt`` raises one FileNotFoundError naming
  the file and every place looked at.

Both have ``name``, ``needs`` ("snapshot" or "image"), ``detect(x) -> list[Detection]`` and
``detect_batch(xs)``; ``gate(detections)`` is True when any detection is a critical class.
``dynamic_view(env)`` returns the frame the pathway reads: the backend's forward camera when it
has one (a ``front_rgb()`` method returning an image), else the BEV colour view (the paper's
"w/o First-View" variant; the lite backend has no camera).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from ..privileged import ACTOR_COCO, CRITICAL_CLASSES, Detection, PrivilegedDetector, gate  # noqa: F401

log = logging.getLogger(__name__)

ENV_WEIGHTS = "DRIVEMIND_YOLO_WEIGHTS"
WEIGHTS_URL = "https://github.com/ultralytics/assets/releases"
INSTALL = ('pip install torch==2.14.1 torchvision==0.29.1 -e ".[vision]" (torch and torchvision '
           'pinned in the same command)')


# ---------------------------------------------------------------------- YOLO (ultralytics)
def _ultralytics():
    """Import ultralytics offline, with its settings file in a temporary folder."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_AUTOINSTALL", "0")
    os.environ.setdefault("YOLO_VERBOSE", "False")
    if "YOLO_CONFIG_DIR" not in os.environ:
        d = Path(tempfile.gettempdir()) / f"drivemind-ultralytics-{os.getuid()}"
        d.mkdir(parents=True, exist_ok=True)
        os.environ["YOLO_CONFIG_DIR"] = str(d)
    try:
        import ultralytics
    except ImportError as e:
        raise ImportError(f"the YOLO detector needs ultralytics and torchvision ({e}); install the "
                          f"vision extra: {INSTALL}") from e
    return ultralytics


def yolo_search_dirs() -> list[Path]:
    """Folders searched for a YOLO checkpoint given by file name: ``$DRIVEMIND_YOLO_WEIGHTS``
    (a folder, or the file itself), ``~/.cache/drivemind/yolo``, then the working directory."""
    dirs = []
    env = os.environ.get(ENV_WEIGHTS)
    if env:
        dirs.append(Path(env).expanduser())
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    dirs += [Path(base) / "drivemind" / "yolo", Path.cwd()]
    return dirs


def find_yolo_weights(model: str = "yolov8n.pt", weights_path=None) -> Path:
    """The local ``.pt`` for ``model``: ``weights_path`` as given, else ``model`` as a path, else
    its file name in ``yolo_search_dirs()``. One FileNotFoundError names the file, every place
    looked at and where to get it."""
    if weights_path is not None:
        p = Path(weights_path).expanduser()
        if p.is_file():
            return p
        looked = [str(p)]
        name = p.name
    else:
        p = Path(model).expanduser()
        if p.is_file():
            return p
        name, looked = p.name, ([str(p.resolve())] if p.parent != Path(".") else [])
        if not os.environ.get(ENV_WEIGHTS):
            looked.append(f"${ENV_WEIGHTS} (not set)")
        for d in yolo_search_dirs():
            cand = d if d.is_file() and d.name == name else d / name
            if cand.is_file():
                return cand
            looked.append(str(d))
    raise FileNotFoundError(
        f"YOLO weights {name!r} not found; looked at: {', '.join(dict.fromkeys(looked))}. Nothing "
        f"is downloaded at run time (YOLO_OFFLINE=1). Get the file on a connected machine (the "
        f"ultralytics assets releases, {WEIGHTS_URL}, or `python -c \"from ultralytics import YOLO; "
        f"YOLO('{name}')\"` which saves it in the working directory), then put it in "
        f"~/.cache/drivemind/yolo/, point ${ENV_WEIGHTS} at it (file or folder), or pass "
        f"YoloDetector(weights_path=...) / the config key detector.weights_path.")


def coco_names() -> list[str]:
    """The 80 COCO class names, from ultralytics' own dataset file."""
    _ultralytics()
    from ultralytics.utils import ROOT, YAML

    names = YAML.load(ROOT / "cfg" / "datasets" / "coco.yaml")["names"]
    return [names[i] for i in range(len(names))]


class YoloDetector:
    """An ultralytics YOLO model on uint8 RGB frames. ``model``: a checkpoint name or path
    (``yolov8n.pt``, found by :func:`find_yolo_weights`) or a model ``.yaml`` (architecture only:
    random weights, logged as such; with ``weights_path`` the checkpoint is loaded into it).
    Frames are RGB (N, H, W, 3); they are handed to ultralytics as BGR, its convention for arrays."""

    needs = "image"

    def __init__(self, model: str = "yolov8n.pt", weights_path=None, imgsz: int = 640,
                 conf: float = 0.25, *, device: str = "cpu", iou: float = 0.7, max_det: int = 100):
        _ultralytics()
        from ultralytics import YOLO

        model = str(model)
        suffix = Path(model).suffix.lower()
        if suffix not in (".pt", ".yaml", ".yml"):
            raise ValueError(f"YOLO model {model!r}: give a checkpoint (.pt, e.g. yolov8n.pt) or "
                             f"a model definition (.yaml, e.g. yolov8n.yaml)")
        if not (isinstance(imgsz, int) and imgsz > 0 and imgsz % 32 == 0):
            raise ValueError(f"imgsz must be a positive multiple of 32 (YOLO's stride), got {imgsz!r}")
        if not 0.0 <= float(conf) <= 1.0:
            raise ValueError(f"conf must be in [0, 1], got {conf!r}")
        self.imgsz, self.conf, self.iou, self.max_det = int(imgsz), float(conf), float(iou), int(max_det)
        self.device = device
        self.random_init = False
        if suffix == ".pt":
            self.weights = find_yolo_weights(model, weights_path)
            self.model = YOLO(str(self.weights), task="detect")
        else:
            self.model = YOLO(model, task="detect")
            if weights_path is not None:
                self.weights = find_yolo_weights(model, weights_path)
                self.model.load(str(self.weights))
            else:
                self.weights = None
                self.random_init = True
                log.warning("YOLO %s built from its yaml with RANDOM weights: detections are "
                            "meaningless (tests only)", model)
        names = dict(self.model.names)
        if len(names) == 80 and all(str(v) == str(k) for k, v in names.items()):
            names = dict(enumerate(coco_names()))  # a yaml build has numeric names; nc 80 is COCO
        self.names = {int(k): str(v) for k, v in names.items()}
        label = Path(model).name if self.weights is None else self.weights.name
        self.name = f"yolo:{label}" + (":random-init" if self.random_init else "")

    def detect_batch(self, images) -> list[list[Detection]]:
        arr = np.asarray(images)
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4 or arr.shape[-1] != 3 or arr.dtype != np.uint8:
            raise ValueError(f"expected uint8 RGB frames (N, H, W, 3), got {arr.dtype} {arr.shape}")
        if not len(arr):
            return []
        bgr = [np.ascontiguousarray(im[..., ::-1]) for im in arr]
        results = self.model.predict(bgr, imgsz=self.imgsz, conf=self.conf, iou=self.iou,
                                     max_det=self.max_det, device=self.device, verbose=False)
        out = []
        for r in results:
            b = r.boxes
            xyxy = b.xyxy.cpu().numpy().astype(float)
            score = b.conf.cpu().numpy().astype(float)
            cls = b.cls.cpu().numpy().astype(int)
            out.append([Detection(self.names.get(int(k), str(int(k))), float(s), tuple(map(float, bx)))
                        for bx, s, k in zip(xyxy, score, cls)])
        return out

    def detect(self, image) -> list[Detection]:
        arr = np.asarray(image)
        if arr.ndim != 3:
            raise ValueError(f"detect() takes one RGB frame (H, W, 3), got shape {arr.shape}; "
                             f"use detect_batch for (N, H, W, 3)")
        return self.detect_batch(arr[None])[0]

    __call__ = detect

    def __repr__(self) -> str:
        return f"YoloDetector({self.name!r}, imgsz={self.imgsz}, conf={self.conf})"


# ---------------------------------------------------------------------- config and views
DETECTORS = {"privileged": PrivilegedDetector, "yolo": YoloDetector}


def build_detector(cfg: dict | None = None):
    """``{"kind": "privileged" | "yolo", ...the class's arguments}`` -> a detector (default:
    the privileged stand-in)."""
    cfg = dict(cfg or {})
    kind = cfg.pop("kind", "privileged")
    if kind not in DETECTORS:
        raise ValueError(f"unknown detector kind {kind!r}; valid: {', '.join(DETECTORS)}")
    try:
        return DETECTORS[kind](**cfg)
    except TypeError as e:
        raise ValueError(f"bad option for the {kind} detector ({e}); see "
                         f"{DETECTORS[kind].__name__}'s arguments") from e


def dynamic_view(env) -> tuple[np.ndarray, str]:
    """The RGB frame the dynamic pathway reads and which view it is: ``"front"`` when the env's
    backend has a forward camera (``backend.front_rgb()`` returns an image), else ``"bev"``,
    the BEV colour view (the paper's "w/o First-View" variant; the lite backend)."""
    base = getattr(env, "unwrapped", env)
    backend = getattr(base, "world", None)
    front = getattr(backend, "front_rgb", None)
    if callable(front):
        img = front()
        if img is not None:
            return np.asarray(img), "front"
    return base.bev.rgb(), "bev"
