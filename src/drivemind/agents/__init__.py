"""Agents: the papers' feature extractor, SAC with the relabelling replay buffer, PPO with batch
rewards (SB3 subclasses).

The names below are imported on first use (PEP 562), so a torch-free module of the package
(``guidance_config``, read by the config checks before a run starts) loads without torch and
Stable-Baselines3."""

# DriveSAC(autocast=...) / algo.autocast: the gradient step's precision (here, torch-free, for the
# config checks)
AUTOCAST = ("none", "bf16")

_NAMES = {
    "EMPTY": ".buffer", "INVALID": ".buffer", "LABELLED": ".buffer", "PENDING": ".buffer",
    "PaletteCodec": ".buffer", "RelabelReplayBuffer": ".buffer",
    "DriveExtractor": ".extractor", "FeatureExtractor": ".extractor",
    "Labeller": ".labelling",
    "DriveSAC": ".sac", "DriveSACPolicy": ".sac",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        import importlib

        return getattr(importlib.import_module(_NAMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
