"""Where DriveMind keeps files it makes at run time (below every other package: no imports).

Two roots, as they have always been (one would move files users already have):

- :func:`cache_dir`: ``$DRIVEMIND_CACHE`` or ``~/.cache/drivemind``: generated evaluation routes
  (``routes/``) and the verdicts of the native map check (``map-check/``).
- :func:`weights_cache_dir`: ``$XDG_CACHE_HOME/drivemind`` or ``~/.cache/drivemind``: weights the
  training scripts write and the loaders search (BEV-CLIP towers, the frozen BEV encoder).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("DRIVEMIND_CACHE") or Path.home() / ".cache" / "drivemind")


def weights_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "drivemind"
