"""Agents: the papers' feature extractor, SAC with the relabelling replay buffer, PPO with batch
rewards (SB3 subclasses)."""

from .buffer import EMPTY, INVALID, LABELLED, PENDING, PaletteCodec, RelabelReplayBuffer
from .extractor import DriveExtractor, FeatureExtractor
from .labelling import Labeller
from .sac import DriveSAC, DriveSACPolicy

__all__ = ["DriveExtractor", "FeatureExtractor", "DriveSAC", "DriveSACPolicy", "EMPTY", "INVALID", "LABELLED", "Labeller", "PENDING",
           "PaletteCodec", "RelabelReplayBuffer"]
