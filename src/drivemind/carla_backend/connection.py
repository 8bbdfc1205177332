"""Connecting to a CARLA server, checking versions, and putting a town on it.

Everything here talks to the server through ``api``: the ``carla`` module (or, in the tests, a
stand-in for its server side). Errors name the server's address, the timeout and what to do.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import warnings
from functools import lru_cache
from pathlib import Path

from ..maps.resolve import XODR_SUFFIXES
from ..maps.roadmap import MapError, RoadMap

log = logging.getLogger(__name__)

SUPPORTED = ((0, 9, 13), (0, 9, 16))  # server versions this backend is written for


class CarlaConnectionError(ConnectionError):
    """No CARLA server answered (or it went away and did not come back)."""


class CarlaVersionWarning(RuntimeWarning):
    """The client and server versions differ, or the server is outside 0.9.13-0.9.16."""


def how_to_start(port: int) -> str:
    return (f"Start a server (docker: `docker compose -f docker/compose.yaml up carla`; a CARLA "
            f"package: `./CarlaUE4.sh -RenderOffScreen -carla-rpc-port={port}`), point "
            f"sim.carla.host / sim.carla.port at a running one, or train on the embedded "
            f"simulator with sim=lite (docs/carla.md)")


def connect(api, host: str, port: int, timeout: float):
    """A ``carla.Client`` that has answered a version request within ``timeout`` seconds."""
    try:
        client = api.Client(host, port, worker_threads=0)
        client.set_timeout(float(timeout))
        server = client.get_server_version()
    except RuntimeError as exc:
        raise CarlaConnectionError(
            f"no CARLA server answered at {host}:{port} within the {timeout:g} s timeout "
            f"(sim.carla.timeout) [{exc}]. {how_to_start(port)}") from None
    check_versions(client.get_client_version(), server)
    return client


def _version_tuple(v: str):
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", str(v))
    return tuple(int(x) for x in m.groups()) if m else None


def check_versions(client_version: str, server_version: str) -> None:
    """Warn (CarlaVersionWarning) when client and server differ or the server is unsupported."""
    c, s = _version_tuple(client_version), _version_tuple(server_version)
    if c != s:
        msg = (f"CARLA client {client_version} and server {server_version} differ; the RPC "
               f"protocol can change between releases. Install the matching client "
               f"(pip install carla=={server_version.split('-')[0]}) or run a "
               f"{client_version} server")
        log.warning(msg)
        warnings.warn(msg, CarlaVersionWarning, stacklevel=3)
    if s is not None and not SUPPORTED[0] <= s <= SUPPORTED[1]:
        msg = (f"CARLA server {server_version} is outside the versions this backend supports "
               f"(0.9.13-0.9.16)")
        log.warning(msg)
        warnings.warn(msg, CarlaVersionWarning, stacklevel=3)


# ---------------------------------------------------------------------------- towns on the server
def town_opendrive(town: str) -> str | None:
    """The OpenDRIVE text we generate the world from, or None for a town the server ships
    (loaded by name). Built-in towns and .xodr paths are generated; CARLA town names are not."""
    from ..maps.towns import is_builtin_town

    if is_builtin_town(town):
        from ..maps.towns import builtin_town_xodr
        return builtin_town_xodr(town)
    if town.endswith(XODR_SUFFIXES) or os.sep in town:
        from ..maps.opendrive import read_xodr
        p = Path(os.path.expanduser(town))
        if not p.is_file():
            raise MapError(f"{p}: no such OpenDRIVE file")
        return read_xodr(p)
    return None


def town_name(town: str) -> str:
    """The RoadMap name for a town argument (a path's file stem, as load_town names it)."""
    if town.endswith(XODR_SUFFIXES) or os.sep in town:
        from ..maps.opendrive import xodr_stem
        return xodr_stem(town)
    return town


def _short_map_name(name: str) -> str:
    return str(name).rstrip("/").split("/")[-1]


def put_town(api, client, town: str, cfg, map_path=None):
    """Make ``town`` the server's world and return it: a built-in town or .xodr file through
    ``generate_opendrive_world`` (skipped when the server already runs exactly that OpenDRIVE),
    a CARLA town through ``load_world`` (skipped when it is loaded, unless ``reload_world``)."""
    text = town_opendrive(town)
    world = client.get_world()
    client.set_timeout(float(cfg.load_timeout))
    try:
        if text is not None:
            if cfg.reload_world or _digest(world.get_map().to_opendrive()) != _digest(text):
                world = _generate(api, client, text, town, cfg)
        else:
            current = _short_map_name(world.get_map().name)
            if cfg.reload_world or current != town:
                available = sorted(_short_map_name(m) for m in client.get_available_maps())
                if town in available:
                    log.info("loading %s on the CARLA server at %s (was %s)", town, cfg.address,
                             current)
                    world = client.load_world(town)
                else:  # not shipped by the server: generate it from <town>.xodr on the map path
                    from ..maps.resolve import builtin_listing, find_town_file
                    path = find_town_file(town, map_path)
                    if path is None:
                        raise MapError(
                            f"the CARLA server at {cfg.address} has no town {town!r} and no "
                            f"{town}.xodr is on the map path; the server has: "
                            f"{', '.join(available)}. Built-in towns ({builtin_listing()}) "
                            f"and .xodr files are generated on the server instead")
                    from ..maps.opendrive import read_xodr
                    world = _generate(api, client, read_xodr(path), town, cfg)
    finally:
        client.set_timeout(float(cfg.timeout))
    return world


def _generate(api, client, text: str, town: str, cfg):
    o = cfg.opendrive
    params = api.OpendriveGenerationParameters(
        vertex_distance=o.vertex_distance, max_road_length=o.max_road_length,
        wall_height=o.wall_height, additional_width=o.additional_width,
        smooth_junctions=o.smooth_junctions, enable_mesh_visibility=o.enable_mesh_visibility,
        enable_pedestrian_navigation=o.enable_pedestrian_navigation)
    log.info("generating town %s on the CARLA server at %s from OpenDRIVE", town, cfg.address)
    return client.generate_opendrive_world(text, params)


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()


def roadmap_from_server(world, town: str, address: str) -> RoadMap:
    """The RoadMap of the server's map: its OpenDRIVE text through the same loader the embedded
    simulator uses for .xodr files (cached per text, so reconnects and several envs reuse it)."""
    text = world.get_map().to_opendrive()
    return _roadmap_cached(text, town_name(town), f"CARLA server {address} ({town})")


@lru_cache(maxsize=4)
def _roadmap_cached(text: str, name: str, source: str) -> RoadMap:
    from ..maps.opendrive import load_xodr_text

    return load_xodr_text(text, name, source=source)
