"""Town names -> RoadMaps.

A town is one of: a path to an ``.xodr`` file (also ``.xodr.xz`` / ``.xodr.gz``); a built-in town
generated in code (:data:`drivemind.maps.towns.BUILTIN_TOWNS`); or a name such as ``Town02`` looked
up as ``<name>.xodr`` in, in order, the configured search path, ``$DRIVEMIND_MAP_PATH``
(``os.pathsep``-separated), ``$CARLA_ROOT``'s OpenDRIVE folders and last the CARLA towns shipped
with DriveMind (:data:`VENDORED_DIR`: Town01, Town02, Town03, Town05, CC-BY 4.0, see
``data/LICENSE-CARLA-MAPS.txt``). A file of the user's therefore always wins over the shipped copy.
A built-in town's name (``grid``, ``curves``, ``avenue``, and ``random-<seed>``: a town generated
from a seed) is always the built-in town: a file of that name on the search path is not read (a
UserWarning names it); load it by its path.
"""

from __future__ import annotations

import os
import warnings
from functools import lru_cache
from pathlib import Path

from .roadmap import MapError, RoadMap

ENV_VAR = "DRIVEMIND_MAP_PATH"
XODR_SUFFIXES = (".xodr", ".xodr.xz", ".xodr.gz")  # what names an OpenDRIVE file (a path)
CARLA_SUBDIRS = (
    "CarlaUE4/Content/Carla/Maps/OpenDrive",
    "Unreal/CarlaUE4/Content/Carla/Maps/OpenDrive",
    "Import",
)
# CARLA towns shipped inside the package, xz-compressed (<Town>.xodr.xz)
VENDORED_DIR = Path(__file__).resolve().parent / "data"
VENDORED_SUFFIX = ".xodr.xz"


def search_dirs(extra: list[str] | tuple[str, ...] | str | None = None) -> list[Path]:
    """Directories searched for ``<name>.xodr``, in order."""
    dirs: list[Path] = []
    if isinstance(extra, str):
        extra = [p for p in extra.split(os.pathsep) if p]
    for p in extra or ():
        dirs.append(Path(os.path.expanduser(str(p))))
    for p in os.environ.get(ENV_VAR, "").split(os.pathsep):
        if p:
            dirs.append(Path(os.path.expanduser(p)))
    root = os.environ.get("CARLA_ROOT")
    if root:
        dirs.extend(Path(root) / sub for sub in CARLA_SUBDIRS)
    out, seen = [], set()
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def vendored_names() -> list[str]:
    """The CARLA towns shipped with DriveMind (found after the search path)."""
    return sorted(p.name[:-len(VENDORED_SUFFIX)] for p in VENDORED_DIR.glob(f"*{VENDORED_SUFFIX}"))


def find_town_file(name: str, extra=None) -> Path | None:
    """``<name>.xodr`` on the search path, else the shipped ``<name>.xodr.xz``, else None.
    Read the result with :func:`drivemind.maps.opendrive.read_xodr` (it may be compressed)."""
    for d in search_dirs(extra):
        for cand in (d / f"{name}.xodr", d / name):
            if cand.is_file():
                return cand
    cand = VENDORED_DIR / f"{name}{VENDORED_SUFFIX}"
    if os.sep not in name and "/" not in name and cand.is_file():
        return cand
    return None


def builtin_names() -> list[str]:
    """The built-in layouts' names (``random-<seed>`` towns aside: ``towns.is_builtin_town``)."""
    from .towns import BUILTIN_TOWNS

    return sorted(BUILTIN_TOWNS)


def builtin_listing() -> str:
    """The built-in towns as error messages list them."""
    from .towns import RANDOM_PREFIX

    return f"{', '.join(builtin_names())}, {RANDOM_PREFIX}<seed> (generated from a seed, e.g. {RANDOM_PREFIX}7)"


def is_town_file(town: str | os.PathLike) -> bool:
    """Whether ``town`` names an OpenDRIVE file (a path) rather than a town to look up."""
    town = os.fspath(town)
    return town.endswith(XODR_SUFFIXES) or os.sep in town or os.path.isfile(town)


def load_town(town: str | os.PathLike, search_path=None, **build_kw) -> RoadMap:
    """Resolve a town name or .xodr path and load it (cached per file and modification time)."""
    if not town or not str(town).strip():
        raise MapError("no town given: name a built-in town "
                       f"({builtin_listing()}), a CARLA town such as Town02, or a .xodr path")
    town = os.fspath(town)
    kw = tuple(sorted(build_kw.items()))
    if is_town_file(town):
        path = Path(os.path.expanduser(town))
        if not path.is_file():
            raise MapError(f"{path}: no such OpenDRIVE file")
        return _load_file_cached(str(path.resolve()), path.stat().st_mtime_ns, kw)
    from .towns import is_builtin_town

    if is_builtin_town(town):
        shadowed = find_town_file(town, search_path)
        if shadowed is not None and shadowed.parent != VENDORED_DIR:
            # a built-in name is the built-in town: the file of that name on the search path is
            # not read (a set of esmini's files ran its curves.xodr as the built-in curves)
            warnings.warn(f"town {town!r} is DriveMind's built-in town; {shadowed} on the map "
                          f"search path has the same name and is not used: pass its path "
                          f"(town={shadowed}) to load that file", UserWarning, stacklevel=2)
        return _load_builtin_cached(town, kw)
    path = find_town_file(town, search_path)
    if path is None:
        searched = [str(d) for d in search_dirs(search_path)] or ["(none configured)"]
        raise MapError(
            f"unknown town {town!r}. Built-in towns: {builtin_listing()}; CARLA towns "
            f"shipped with DriveMind: {', '.join(vendored_names())}. "
            f"No {town}.xodr found in: {'; '.join(searched)}. Add its folder with map_path=... "
            f"(command line), search_path= (Python) or ${ENV_VAR}, or set $CARLA_ROOT; or pass a "
            f"path to an .xodr file."
        )
    return _load_file_cached(str(path.resolve()), path.stat().st_mtime_ns, kw)


@lru_cache(maxsize=16)
def _load_file_cached(path: str, mtime_ns: int, kw: tuple) -> RoadMap:
    from .opendrive import load_xodr_file

    return load_xodr_file(path, **dict(kw))


@lru_cache(maxsize=16)
def _load_builtin_cached(name: str, kw: tuple) -> RoadMap:
    from .opendrive import load_xodr_text
    from .towns import builtin_town_xodr

    # generated in code and tested: no child-process parse needed
    return load_xodr_text(builtin_town_xodr(name), name, source=f"built-in town {name!r}",
                          native_check=False, **dict(kw))
