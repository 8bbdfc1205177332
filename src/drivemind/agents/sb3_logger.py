"""SB3's logger without SB3's temporary folder.

An SB3 model that learns with no logger set and no ``tensorboard_log`` configures one with
``configure(None, ...)``, which creates ``<system temp>/SB3-<date>`` (empty unless asked for files)
on every ``learn`` call: tests and benchmarks left dozens of them. DriveSAC and DrivePPO call
:func:`use_default_logger` before learning: the same outputs (stdout when ``verbose >= 1``,
nothing otherwise) and no folder. A logger set with ``set_logger`` (``scripts/train.py`` sets
one writing into the run directory) or a ``tensorboard_log`` folder is left alone.
"""

from __future__ import annotations

import sys

from stable_baselines3.common.logger import HumanOutputFormat, Logger


def quiet_logger(verbose: int = 0) -> Logger:
    """A logger that writes no files: stdout when ``verbose >= 1``, else nothing."""
    return Logger(folder=None, output_formats=[HumanOutputFormat(sys.stdout)] if verbose >= 1 else [])


def use_default_logger(model) -> None:
    """Give ``model`` :func:`quiet_logger` unless it has a logger set or a ``tensorboard_log``."""
    if not getattr(model, "_custom_logger", False) and getattr(model, "tensorboard_log", None) is None:
        model.set_logger(quiet_logger(int(getattr(model, "verbose", 0) or 0)))
