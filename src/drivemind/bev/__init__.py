"""Bird's-eye-view rendering: Roach-compatible uint8 masks and a colour view of the same window."""

from .config import ALL_CHANNELS, BEV_PRESETS, ROACH_CHANNELS, BevConfig
from .renderer import BevRenderer

__all__ = ["ALL_CHANNELS", "BEV_PRESETS", "ROACH_CHANNELS", "BevConfig", "BevRenderer"]
