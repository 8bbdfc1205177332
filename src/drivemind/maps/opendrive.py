"""OpenDRIVE -> RoadMap through the ``carla`` client's offline parser.

This is the only module of the map stack that imports ``carla``. ``carla.Map(name, xodr_text)``
parses OpenDRIVE without a server; a live server's ``world.get_map()`` returns the same type, so
:func:`roadmap_from_carla_map` serves both the embedded simulator and the CARLA backend.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import numpy as np

from .roadmap import LaneRecord, MapError, MarkingType, RoadMap, TrafficLightLandmark, build_roadmap

TRAFFIC_LIGHT_TYPE = "1000001"


def _import_carla():
    try:
        import carla  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - depends on the platform
        raise MapError(
            "loading OpenDRIVE needs the `carla` Python client (pip install carla==0.9.16; wheels "
            "exist for Linux x86_64, CPython 3.10-3.12). Import failed: " + str(exc)
        ) from exc
    return carla


def _check_opendrive_text(text: str, source: str) -> None:
    if not text or not text.strip():
        raise MapError(f"{source}: the file is empty, expected OpenDRIVE XML")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise MapError(f"{source}: not valid XML ({exc}); expected an OpenDRIVE .xodr file") from exc
    if root.tag != "OpenDRIVE":
        raise MapError(f"{source}: root element is <{root.tag}>, expected <OpenDRIVE>")
    if root.find("road") is None:
        raise MapError(f"{source}: OpenDRIVE file has no <road> elements")


def load_xodr_text(text: str, name: str, *, source: str = "", **build_kw) -> RoadMap:
    """Parse OpenDRIVE text into a RoadMap. Errors name the source and what failed."""
    source = source or f"<OpenDRIVE text for {name}>"
    _check_opendrive_text(text, source)
    carla = _import_carla()
    try:
        cmap = carla.Map(name, text)
    except Exception as exc:  # the C++ parser raises RuntimeError on broken files
        raise MapError(f"{source}: the CARLA OpenDRIVE parser rejected the file: {exc}") from exc
    return roadmap_from_carla_map(cmap, name=name, source=source, **build_kw)


def load_xodr_file(path: str | os.PathLike, name: str | None = None, **build_kw) -> RoadMap:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise MapError(f"{path}: no such OpenDRIVE file")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError as exc:
        raise MapError(f"{path}: not a text file ({exc}); expected OpenDRIVE XML") from exc
    name = name or os.path.splitext(os.path.basename(path))[0]
    return load_xodr_text(text, name, source=path, **build_kw)


_MARKING_BY_NAME = {
    "NONE": MarkingType.NONE, "Other": MarkingType.OTHER, "Broken": MarkingType.BROKEN,
    "Solid": MarkingType.SOLID, "SolidSolid": MarkingType.SOLID_SOLID,
    "SolidBroken": MarkingType.SOLID_BROKEN, "BrokenSolid": MarkingType.BROKEN_SOLID,
    "BrokenBroken": MarkingType.BROKEN_BROKEN, "BottsDots": MarkingType.BOTTS_DOTS,
    "Grass": MarkingType.GRASS, "Curb": MarkingType.CURB,
}


def _marking(m) -> int:
    """carla.LaneMarkingType -> our MarkingType code (mapped by name: CARLA's integers differ)."""
    if m is None:
        return int(MarkingType.NONE)
    return int(_MARKING_BY_NAME.get(str(m.type), MarkingType.OTHER))


def roadmap_from_carla_map(cmap, *, name: str | None = None, source: str = "",
                           max_ds: float = 1.0, sample: float = 0.5, **build_kw) -> RoadMap:
    """Build a RoadMap from a ``carla.Map`` (offline-parsed or a live server's)."""
    carla = _import_carla()
    name = name or cmap.name
    try:
        topo = cmap.get_topology()
    except Exception as exc:
        raise MapError(f"{source or name}: could not read the lane topology: {exc}") from exc
    if not topo:
        raise MapError(f"map {name!r} ({source or 'in memory'}) has no drivable lanes "
                       "(the OpenDRIVE file defines no connected lanes of type 'driving')")

    def key(w):
        return (w.road_id, w.section_id, w.lane_id)

    starts: dict[tuple, object] = {}
    succ: dict[tuple, list] = {}
    for a, b in topo:
        starts.setdefault(key(a), a)
        succ.setdefault(key(a), []).append(key(b))
        starts.setdefault(key(b), b)
        succ.setdefault(key(b), [])
    driving = carla.LaneType.Driving
    records = []
    for k in sorted(starts):
        w0 = starts[k]
        wps = [w0] + [w for w in w0.next_until_lane_end(sample) if key(w) == k]
        pts = np.array([[w.transform.location.x, w.transform.location.y] for w in wps])
        if len(pts) >= 2:
            keep = np.concatenate([[True], np.linalg.norm(np.diff(pts, axis=0), axis=1) > 1e-6])
            wps = [w for w, kp in zip(wps, keep) if kp]
            pts = pts[keep]
        if len(wps) < 2:
            continue
        lft, rgt = w0.get_left_lane(), w0.get_right_lane()
        records.append(LaneRecord(
            key=k,
            points=pts,
            width=np.array([w.lane_width for w in wps]),
            mark_left=np.array([_marking(w.left_lane_marking) for w in wps], np.uint8),
            mark_right=np.array([_marking(w.right_lane_marking) for w in wps], np.uint8),
            junction=int(w0.junction_id) if w0.is_junction else -1,
            successors=list(dict.fromkeys(succ.get(k, []))),
            left=key(lft) if lft is not None and lft.lane_type == driving else None,
            right=key(rgt) if rgt is not None and rgt.lane_type == driving else None,
        ))
    try:
        lms = cmap.get_all_landmarks_of_type(TRAFFIC_LIGHT_TYPE)
    except Exception:  # pragma: no cover - older clients
        lms = []
    landmarks = [TrafficLightLandmark(lm.transform.location.x, lm.transform.location.y, lm.road_id)
                 for lm in lms]
    return build_roadmap(name, records, landmarks=landmarks, max_ds=max_ds, source=source,
                         **build_kw)
