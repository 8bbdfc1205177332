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


def code_version() -> dict:
    """What code a run used, for its summary and the study report: the package version and, when
    the package is imported from a git checkout, the commit and whether tracked files differed from
    it (``dirty``). Fields are None where that cannot be known (an installed wheel, no git)."""
    import subprocess
    from importlib import metadata

    try:
        version = metadata.version("drivemind")
    except metadata.PackageNotFoundError:
        version = None
    src = Path(__file__).resolve().parent

    def git(*args):
        try:
            out = subprocess.run(["git", "-C", str(src), *args], capture_output=True, text=True,
                                 timeout=10, check=True)
            return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    dirty = None
    if commit:
        status = git("status", "--porcelain", "--untracked-files=no")
        dirty = bool(status) if status is not None else None
    return {"drivemind": version, "commit": commit, "dirty": dirty}
