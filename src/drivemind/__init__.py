"""DriveMind: driving-policy RL on VLM and kinematic rewards, with an embedded simulator."""

__version__ = "0.1.0"
