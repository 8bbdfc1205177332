"""Shared fixtures: the real CARLA towns from ``<repo root>/../shared/maps`` (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_MAPS = Path(__file__).resolve().parents[1].parent / "shared" / "maps"


@pytest.fixture(scope="session")
def shared_maps() -> Path:
    """Folder holding Town01.xodr / Town02.xodr; skips the test when it is not there."""
    if not SHARED_MAPS.is_dir() or not any(SHARED_MAPS.glob("*.xodr")):
        pytest.skip(f"{SHARED_MAPS} not present (the real CARLA maps live in ../shared/maps)")
    return SHARED_MAPS


@pytest.fixture(scope="session")
def town02(shared_maps):
    """Town02 as a RoadMap (loaded once per session)."""
    path = shared_maps / "Town02.xodr"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    from drivemind.maps import load_town

    return load_town(str(path))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Pins torch (and numba) to one thread for a module: the networks in these tests are tiny, and
    two OpenMP threads stall badly when another process holds a core (10x slower seen on a loaded
    2-core box). Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import numba
    import torch as th

    n, nb = th.get_num_threads(), numba.get_num_threads()
    numba.set_num_threads(1)
    th.set_num_threads(1)
    yield
    numba.set_num_threads(nb)
    th.set_num_threads(n)
