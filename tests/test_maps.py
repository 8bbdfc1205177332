"""Map loading through the real carla client's OpenDRIVE parser: CARLA towns (from ../shared/maps,
skipped when absent), built-in towns, town resolution and bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from drivemind.maps import MapError, MarkingType, load_town
from drivemind.maps.opendrive import load_xodr_file, load_xodr_text
from drivemind.maps.resolve import ENV_VAR, search_dirs
from drivemind.maps.spatial import nearest_lane_point
from drivemind.maps.towns import BUILTIN_TOWNS

MAPS = Path(__file__).resolve().parents[1].parent / "shared" / "maps"


def carla_town(name: str):
    path = MAPS / f"{name}.xodr"
    if not path.is_file():
        pytest.skip(f"{path} not present (the real CARLA maps live in ../shared/maps)")
    return load_town(str(path))


@pytest.fixture(params=["Town01", "Town02"])
def real_town(request):
    return carla_town(request.param)


def check_roadmap(rm):
    L = rm.n_lanes
    assert L > 0 and rm.offset[-1] == len(rm.pts)
    # <= 1 m point spacing, arc length consistent with the points
    assert rm.ds.max() <= 1.0 + 1e-9
    for lane in range(L):
        p = rm.lane_points(lane)
        seg = np.hypot(*np.diff(p, axis=0).T)
        assert abs(seg.sum() - rm.length[lane]) < 0.05 * rm.length[lane] + 0.05
    # every lane continues: a successor starting where it ends
    for lane in range(L):
        succ = rm.successors(lane)
        assert len(succ) > 0, f"lane {rm.keys[lane]} is a dead end"
        end = rm.lane_points(lane)[-1]
        for s in succ:
            assert np.hypot(*(rm.lane_points(s)[0] - end)) < 0.5
            assert lane in rm.predecessors(s)
    # widths plausible, junction membership present
    assert np.all((rm.width > 2.0) & (rm.width < 6.0))
    assert (rm.junction >= 0).any() and (rm.junction < 0).any()
    # drivable polygon of a lane contains its own centre line and has width ~ lane width
    lane = int(np.flatnonzero(rm.junction < 0)[0])
    poly = rm.lane_polygon(lane)
    n = len(rm.lane_points(lane))
    assert poly.shape == (2 * n, 2)
    assert np.allclose(np.hypot(*(poly[:n] - poly[::-1][:n]).T), rm.width[rm.offset[lane]:rm.offset[lane + 1]])
    # spawn points lie on non-junction lane centres, facing along the lane
    assert len(rm.spawn) > 10
    for (x, y, yaw), lane, s in zip(rm.spawn, rm.spawn_lane, rm.spawn_s):
        assert rm.junction[lane] < 0
        px, py, pyaw = rm.pose_at(lane, s)
        assert np.hypot(px - x, py - y) < 1e-6 and abs(np.cos(pyaw - yaw) - 1) < 1e-9


def test_real_carla_towns_load(real_town):
    rm = real_town
    check_roadmap(rm)
    s = rm.summary()
    assert s["junctions"] >= 8 and s["lane_km"] > 2.0
    # the CARLA towns have traffic-light signals; their centre lines are broken markings on the
    # left of every non-junction lane (their outer edges carry no marking in the .xodr)
    assert len(rm.light_landmarks) > 10
    nonj_pts = rm.junction[rm.point_lane] < 0
    assert (rm.mark_left[nonj_pts] == MarkingType.BROKEN).mean() > 0.9
    # two-way roads: non-junction lanes have an opposite-direction neighbour
    nonj = rm.junction < 0
    has_opposite = ((rm.left >= 0) & ~rm.left_same_dir) | ((rm.right >= 0) & ~rm.right_same_dir)
    assert has_opposite[nonj].mean() > 0.9


def test_real_town_lane_heading_matches_travel(real_town):
    """Lane points run in the direction of travel: the yaw at each point follows the polyline."""
    rm = real_town
    d = np.diff(rm.pts, axis=0)
    same_lane = rm.point_lane[1:] == rm.point_lane[:-1]
    step_yaw = np.arctan2(d[:, 1], d[:, 0])[same_lane]
    assert np.median(np.cos(step_yaw - rm.yaw[:-1][same_lane])) > 0.999


@pytest.mark.parametrize("name", sorted(BUILTIN_TOWNS))
def test_builtin_towns_load(name):
    rm = load_town(name)
    check_roadmap(rm)
    assert not name.lower().startswith("town")


def test_town02_nearest_lane_point():
    rm = carla_town("Town02")
    lane = int(rm.spawn_lane[0])
    x, y, yaw = rm.spawn[0]
    # 1 m to the right of the lane centre (CARLA frame: right normal is (-sin, cos))
    q = nearest_lane_point(rm, x - np.sin(yaw), y + np.cos(yaw), yaw)
    assert q[0] == lane and abs(q[2] - 1.0) < 0.05 and abs(q[1] - rm.spawn_s[0]) < 0.6


def test_resolution_by_env_var_and_carla_root(tmp_path, monkeypatch):
    if not (MAPS / "Town02.xodr").is_file():
        pytest.skip("needs ../shared/maps/Town02.xodr")
    monkeypatch.setenv(ENV_VAR, str(MAPS))
    monkeypatch.delenv("CARLA_ROOT", raising=False)
    assert load_town("Town02").name == "Town02"
    # a CARLA install's layout: $CARLA_ROOT/CarlaUE4/Content/Carla/Maps/OpenDrive/<Town>.xodr
    monkeypatch.delenv(ENV_VAR)
    od = tmp_path / "carla" / "CarlaUE4" / "Content" / "Carla" / "Maps" / "OpenDrive"
    od.mkdir(parents=True)
    (od / "Town02.xodr").write_text((MAPS / "Town02.xodr").read_text())
    monkeypatch.setenv("CARLA_ROOT", str(tmp_path / "carla"))
    assert od in search_dirs()
    assert load_town("Town02").n_lanes > 0
    # the configured search path comes first
    assert search_dirs([str(tmp_path)])[0] == tmp_path


def test_unknown_town_lists_builtins_and_searched_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    monkeypatch.delenv("CARLA_ROOT", raising=False)
    with pytest.raises(MapError) as ei:
        load_town("Town99")
    msg = str(ei.value)
    assert "Town99" in msg and str(tmp_path) in msg
    for name in BUILTIN_TOWNS:
        assert name in msg


@pytest.mark.parametrize("content, words", [
    ("this is not xml at all", "not valid XML"),
    ("<?xml version='1.0'?><html><body/></html>", "expected <OpenDRIVE>"),
    ("<?xml version='1.0'?><OpenDRIVE><header/></OpenDRIVE>", "no <road>"),
    ("", "empty"),
])
def test_bad_files_name_file_and_problem(tmp_path, content, words):
    path = tmp_path / "broken.xodr"
    path.write_text(content)
    with pytest.raises(MapError) as ei:
        load_town(str(path))
    assert str(path) in str(ei.value) and words in str(ei.value)


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(MapError, match="no such OpenDRIVE file"):
        load_town(str(tmp_path / "nope.xodr"))
    path = tmp_path / "blob.xodr"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(MapError) as ei:
        load_xodr_file(path)
    assert str(path) in str(ei.value)


SIDEWALK_ONLY = """<?xml version="1.0" standalone="yes"?>
<OpenDRIVE><header revMajor="1" revMinor="4" name="" version="1"/>
<road name="r" length="50" id="1" junction="-1">
 <link/>
 <planView><geometry s="0" x="0" y="0" hdg="0" length="50"><line/></geometry></planView>
 <lanes><laneSection s="0">
  <center><lane id="0" type="none" level="false"/></center>
  <right><lane id="-1" type="sidewalk" level="false"><width sOffset="0" a="2" b="0" c="0" d="0"/></lane></right>
 </laneSection></lanes>
</road></OpenDRIVE>"""


def test_map_without_driving_lanes_is_rejected():
    with pytest.raises(MapError, match="no drivable lanes"):
        load_xodr_text(SIDEWALK_ONLY, "sidewalks")
