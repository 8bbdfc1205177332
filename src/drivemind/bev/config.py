"""BEV configuration: size, resolution, ego placement, channel set and history.

The default is Roach's (Zhang et al., 2021) birdview: 192 px square at 5 px/m with the ego 40 px
from the bottom, facing up, and 15 uint8 channels:

    road, route, lane markings, vehicles x4 history steps, walkers x4, traffic lights x4

Values follow Roach: masks are 0/255; lane markings are 255 solid and 120 broken; traffic lights
are drawn on their stop lines as 80 green, 170 yellow, 255 red. History steps are frame offsets at
the env's 10 Hz (``-16, -11, -6, -1``: 1.5 s, 1.0 s and 0.5 s ago, and now).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import cached_property

from ..sim.config import check_options

# channel name -> number of planes it takes (history channels take one per history step)
STATIC_CHANNELS = ("road", "route", "lane")
HISTORY_CHANNELS = ("vehicle", "walker", "light")
EXTRA_CHANNELS = ("ego",)  # not in Roach's 15; drawn on request
ALL_CHANNELS = STATIC_CHANNELS + HISTORY_CHANNELS + EXTRA_CHANNELS
ROACH_CHANNELS = STATIC_CHANNELS + HISTORY_CHANNELS


@dataclass(frozen=True)
class BevConfig:
    size: int = 192  # pixels, square
    pixels_per_meter: float = 5.0
    ego_from_bottom: int = 40  # pixels from the bottom edge to the ego's reference point
    channels: tuple[str, ...] = ROACH_CHANNELS
    history: tuple[int, ...] = (-16, -11, -6, -1)  # frame offsets, oldest first, -1 = now
    walker_scale: float = 2.0  # walkers are drawn enlarged (Roach scales walker boxes by 2)
    route_width: float = 3.2  # m (Roach: 16 px at 5 px/m)
    route_ahead: float = 80.0  # m of route ahead of the ego that is drawn
    stop_line_width: float = 1.2  # m (Roach: 6 px at 5 px/m)
    marking_width: float = 0.3  # m
    rgb_size: int = 224  # colour rendering of the same view (for VLM encoders and people)

    def __post_init__(self):
        for name in ("size", "ego_from_bottom", "rgb_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or (v <= 0 and name != "ego_from_bottom"):
                raise ValueError(f"bev.{name} must be a positive integer, got {v!r}")
        if not 0 <= self.ego_from_bottom < self.size:
            raise ValueError(f"bev.ego_from_bottom must be in [0, size={self.size}), got "
                             f"{self.ego_from_bottom}")
        for name in ("pixels_per_meter", "walker_scale", "route_width", "route_ahead",
                     "stop_line_width", "marking_width"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"bev.{name} must be a positive number, got {v!r}")
        chans = tuple(self.channels)
        if not chans:
            raise ValueError(f"bev.channels is empty; choose from {', '.join(ALL_CHANNELS)}")
        bad = [c for c in chans if c not in ALL_CHANNELS]
        if bad:
            raise ValueError(f"unknown bev channel(s) {bad}; valid: {', '.join(ALL_CHANNELS)}")
        if len(set(chans)) != len(chans):
            raise ValueError(f"bev.channels lists a channel twice: {list(chans)}")
        object.__setattr__(self, "channels", chans)
        hist = tuple(int(h) for h in self.history)
        if not hist or any(h >= 0 for h in hist) or list(hist) != sorted(set(hist)):
            raise ValueError(f"bev.history must be increasing negative frame offsets ending at or "
                             f"before -1 (e.g. [-16, -11, -6, -1]), got {list(self.history)}")
        object.__setattr__(self, "history", hist)

    # ------------------------------------------------------------------ derived
    @property
    def n_channels(self) -> int:
        return sum(len(self.history) if c in HISTORY_CHANNELS else 1 for c in self.channels)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.n_channels, self.size, self.size)

    @property
    def extent_m(self) -> float:
        """Side of the square view in metres."""
        return self.size / self.pixels_per_meter

    def channel_names(self) -> list[str]:
        """One name per output plane, e.g. ``vehicle_t-16``."""
        out = []
        for c in self.channels:
            if c in HISTORY_CHANNELS:
                out += [f"{c}_t{h:+d}" if h != -1 else f"{c}_t0" for h in self.history]
            else:
                out.append(c)
        return out

    @cached_property
    def plane_start(self) -> dict[str, int]:
        """First output plane of each configured channel (history channels take one per step)."""
        out, i = {}, 0
        for c in self.channels:
            out[c] = i
            i += len(self.history) if c in HISTORY_CHANNELS else 1
        return out

    def planes(self, channel: str) -> slice | None:
        """Slice of the output planes that ``channel`` occupies (None if not configured)."""
        if channel not in self.plane_start:
            return None
        i = self.plane_start[channel]
        return slice(i, i + (len(self.history) if channel in HISTORY_CHANNELS else 1))

    def scaled(self, size: int) -> "BevConfig":
        """The same metric view at another pixel size (used for the RGB rendering)."""
        f = size / self.size
        return replace(self, size=int(size), pixels_per_meter=self.pixels_per_meter * f,
                       ego_from_bottom=int(round(self.ego_from_bottom * f)))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["channels"], d["history"] = list(self.channels), list(self.history)
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "BevConfig":
        d = dict(d or {})
        preset = d.pop("preset", None)
        base = BEV_PRESETS[_check_preset(preset)] if preset else cls()
        check_options(cls, d, "bev", extra=("preset",))
        for k in ("channels", "history"):
            if k in d and d[k] is not None:
                if isinstance(d[k], str):
                    raise ValueError(f"bev.{k} must be a list, got the string {d[k]!r}")
                d[k] = tuple(d[k])
        return replace(base, **d)


def _check_preset(name):
    if name not in BEV_PRESETS:
        raise ValueError(f"unknown bev preset {name!r}; valid: {', '.join(BEV_PRESETS)}")
    return name


# The same 38.4 m window at three sizes: Roach/VLM-RL's 192 px, the papers' 224 px
# (DriveMind, DriveVLM-RL) and 96 px for CPU training (Found-RL's size).
BEV_PRESETS: dict[str, BevConfig] = {
    "roach": BevConfig(),
    "paper": BevConfig().scaled(224),
    "cpu": BevConfig().scaled(96),
}
