"""The project's real Hydra config (``configs/config.yaml``) composed with command-line overrides
and resolved to a dict: what ``scripts/train.py`` hands to ``drivemind.training.train``. Tests that
are about a reward, an agent or a config (not the command line) train in process with it, so each
does not pay a fresh interpreter's imports (torch, SB3, transformers: 10-15 s here); the command
line itself is tested end to end in ``tests/test_training.py`` and ``tests/test_validate.py``."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def config(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)
