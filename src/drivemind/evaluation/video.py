"""Videos of rollouts for people: the env's colour BEV with the per-step facts written on it and,
optionally, the agent's mask planes beside it; written as GIF (Pillow) or MP4 (imageio-ffmpeg).

    frame = render_frame(env.render(), info, masks=obs["bev"], scale=2)
    write_video(frames, "outputs/rollout.gif", fps=10)

Long rollouts: :class:`VideoWriter` takes one frame at a time (MP4 frames go straight to ffmpeg;
GIF frames are kept as 8-bit palette images, 1 byte per pixel, until ``close``). GIF palettes are
Pillow's own choice (median cut, ~9 ms a 600x224 frame) or, with ``fast_palette``, its fast
octree (~1.5 ms, colours within about 15/255).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

LIGHTS = {-1: "-", 0: "green", 1: "yellow", 2: "red"}
VIDEO_SUFFIXES = (".gif", ".mp4")
TEXT_COLOR = (255, 255, 0)
MP4_HELP = 'MP4 needs imageio-ffmpeg: pip install -e ".[video]" (or write a .gif)'


def annotate_frame(rgb: np.ndarray, info: dict, scale: int = 1, extra: Sequence[str] = ()) -> np.ndarray:
    """``rgb`` (HxWx3 uint8) upscaled ``scale`` times (nearest) with the step's facts written on
    it: time, speed, route progress, light, lead gap, routes done; then one line per ``extra``."""
    img = Image.fromarray(np.asarray(rgb, np.uint8))
    if scale != 1:
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    d = ImageDraw.Draw(img)
    d.text((6, 6), f"t={info['time']:.1f}s  {info['speed_kmh']:.0f} km/h  "
                   f"route {info['route_progress']:.0f}/{info['route_length']:.0f} m", fill=TEXT_COLOR)
    light = LIGHTS.get(int(info["light_state"]), "?")
    d.text((6, 20), f"light {light}  lead {info['lead_distance']:.0f} m  "
                    f"routes done {int(info['routes_completed'])}", fill=TEXT_COLOR)
    for k, line in enumerate(extra):
        d.text((6, 34 + 14 * k), line, fill=TEXT_COLOR)
    return np.asarray(img)


def mask_panel(masks: np.ndarray, height: int) -> Image.Image:
    """The mask planes (CxHxW uint8) tiled in rows of 5, scaled to ``height``."""
    c, h, w = masks.shape
    cols = 5
    rows = -(-c // cols)
    tiles = np.zeros((rows * h, cols * w), np.uint8)
    for i in range(c):
        r, k = divmod(i, cols)
        tiles[r * h:(r + 1) * h, k * w:(k + 1) * w] = masks[i]
        tiles[r * h:(r + 1) * h, k * w] = 60  # tile borders
        tiles[r * h, k * w:(k + 1) * w] = 60
    img = Image.fromarray(tiles).convert("RGB")
    return img.resize((int(img.width * height / img.height), height), Image.NEAREST)


def with_masks(frame: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """``frame`` (HxWx3) with the :func:`mask_panel` of ``masks`` to its right."""
    panel = np.asarray(mask_panel(np.asarray(masks), frame.shape[0]))
    return np.concatenate([np.asarray(frame, np.uint8), panel], axis=1)


def render_frame(rgb: np.ndarray, info: dict, masks: np.ndarray | None = None, scale: int = 1,
                 extra: Sequence[str] = ()) -> np.ndarray:
    """:func:`annotate_frame`, then the mask panel beside it when ``masks`` is given."""
    frame = annotate_frame(rgb, info, scale, extra)
    return frame if masks is None else with_masks(frame, masks)


def check_video_path(path) -> Path:
    """``path`` as a Path if it can be written: a .gif, or a .mp4 with imageio-ffmpeg installed.
    Raises ValueError (bad suffix) or ImportError (MP4 without imageio-ffmpeg)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
        raise ValueError(f"a video must end in .gif or .mp4, got {path.name!r}")
    if suffix == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError as e:
            raise ImportError(MP4_HELP) from e
    return path


class VideoWriter:
    """Writes frames (HxWx3 uint8, all the same size) one at a time to a .gif or .mp4.

        with VideoWriter("out.gif", fps=10) as w:
            w.append(frame)
    """

    def __init__(self, path, fps: float = 10.0, fast_palette: bool = False):
        self.path = check_video_path(path)
        self.fast_palette = fast_palette
        if not fps > 0:
            raise ValueError(f"fps must be positive, got {fps!r}")
        self.fps = fps
        self.frames = 0
        self._gif: list[Image.Image] = []
        self._mp4 = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.suffix.lower() == ".mp4":
            import imageio.v2 as imageio

            self._mp4 = imageio.get_writer(self.path, fps=fps)

    def append(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame, np.uint8)
        if self._mp4 is not None:
            self._mp4.append_data(frame)
        elif self.fast_palette:
            self._gif.append(Image.fromarray(frame).quantize(256, method=Image.Quantize.FASTOCTREE))
        else:  # the conversion Pillow's GIF writer would make, done now to keep 1 byte/pixel
            self._gif.append(Image.fromarray(frame).convert("P", palette=Image.Palette.ADAPTIVE))
        self.frames += 1

    def close(self) -> Path:
        if self._mp4 is not None:
            self._mp4.close()
            self._mp4 = None
        elif self._gif:
            first, *rest = self._gif
            first.save(self.path, save_all=True, append_images=rest, duration=1000.0 / self.fps,
                       loop=0)
            self._gif = []
        return self.path

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_video(frames: Iterable[np.ndarray], path, fps: float = 10.0,
                fast_palette: bool = False) -> Path:
    """Write ``frames`` (HxWx3 uint8) to ``path`` (.gif, or .mp4 with imageio-ffmpeg) at ``fps``;
    returns the path. An empty ``frames`` is an error (nothing to show)."""
    with VideoWriter(path, fps, fast_palette) as w:
        for f in frames:
            w.append(f)
        if w.frames == 0:
            raise ValueError(f"no frames to write to {w.path}")
    return w.path
