"""Where DriveMind keeps files it makes at run time (below every other package: no imports).

Two roots, as they have always been (one would move files users already have):

- :func:`cache_dir`: ``$DRIVEMIND_CACHE`` or ``~/.cache/drivemind``: generated evaluation routes
  (``routes/``) and the verdicts of the native map check (``map-check/``).
- :func:`weights_cache_dir`: ``$XDG_CACHE_HOME/drivemind`` or ``~/.cache/drivemind``: weights the
  training scripts write and the loaders search (BEV-CLIP towers, the frozen BEV encoder).

:func:`write_text_atomic` writes such files (and a run's checkpoint index) whole.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("DRIVEMIND_CACHE") or Path.home() / ".cache" / "drivemind")


def weights_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "drivemind"


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` whole: through a temporary file of this writer's own in the same
    folder (pid and a random suffix), renamed over ``path``. A kill mid-write leaves the old file;
    writers of the same file at once (parallel evaluations, test workers sharing the cache) each
    replace it whole, and none fails on another's rename or reads half a file."""
    import uuid

    p = Path(path)
    tmp = p.with_name(f"{p.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


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
    return {"drivemind": version, "commit": commit, "dirty": dirty, "machine": machine_info()}


# vector instruction sets that change float rounding in numpy's and numba's kernels
# (docs/simulator.md, "Determinism"): the same seed gives the same traffic to the last bit only
# on CPUs that share them
_ISA_FLAGS = ("avx512f", "avx512_bf16", "amx_tile", "avx2", "fma", "neon", "asimd")


def machine_info() -> dict:
    """The machine a run or an evaluation ran on: CPU model, logical cores, the vector instruction
    sets among ``_ISA_FLAGS`` it has, and the versions of the numeric libraries (read from their
    metadata, nothing imported). Fields are None where they cannot be read."""
    import platform
    from importlib import metadata

    cpu, flags = None, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and cpu is None:
                    cpu = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
                if cpu is not None and flags:
                    break
    except OSError:
        pass
    versions = {}
    for name in ("numpy", "numba", "torch"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu": cpu or platform.processor() or None, "cores": os.cpu_count(),
            "isa": [f for f in _ISA_FLAGS if f in flags], "python": platform.python_version(), **versions}


def machine_label(machine: dict | None) -> str:
    """A short name for a :func:`machine_info` record: ``AMD EPYC x2 (avx2)``; ``-`` if none."""
    if not machine:
        return "-"
    isa = machine.get("isa") or []
    simd = next((f for f in ("avx512f", "avx2", "asimd", "neon") if f in isa), None)
    cores = machine.get("cores")
    return (f"{machine.get('cpu') or '?'}" + (f" x{cores}" if cores else "")
            + (f" ({simd.replace('avx512f', 'avx512')})" if simd else ""))
