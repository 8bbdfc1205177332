"""Junctions drawn over the roads around them: a junction's connecting lane that runs over the
end of an approach road (scenariogeneration's junction_trippel_twoway) joins that end to the
junction, and two junctions whose lanes cross become one (CommonRoad's DEU_Muehlhausen,
USA_Lanker). Before, the traffic on the two never gave way to each other, and met."""

from __future__ import annotations

import numpy as np
import pytest

from drivemind.maps.roadmap import LaneRecord, build_roadmap
from drivemind.maps.validate import (JOINED_SECTION, join_overlapped_ends, junction_overlaps,
                                     merge_overlapping_junctions)
from drivemind.sim import SimConfig
from drivemind.sim.config import TrafficParams
from drivemind.sim.world import LiteWorld


def _rec(key, pts, junction=-1, succ=(), z=None):
    pts = np.asarray(pts, float)
    n = len(pts)
    return LaneRecord(key=key, points=pts, width=np.full(n, 3.5), mark_left=np.zeros(n, np.uint8),
                      mark_right=np.zeros(n, np.uint8), junction=junction, successors=list(succ),
                      z=None if z is None else np.full(n, float(z)))


def _line(a, b, step=0.5):
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = int(np.ceil(np.hypot(*(b - a)) / step)) + 1
    return a + np.linspace(0.0, 1.0, n)[:, None] * (b - a)


def _t_junction():
    """Road 0 (two-way, x 0..100) meets junction 7. Ahead, road 6 (two-way, x 120..220) through
    the junction's straight lanes (road 5); to the right, road 2 (one-way, from (130, -1.7) at
    -30 degrees) through a connecting lane (road 1) drawn straight from (100, 1.5) to
    (130, -1.7): over road 6's first 10 m, both of its lanes (as junction_trippel_twoway)."""
    far = (130.0 + 100.0 * np.cos(np.radians(-30.0)), -1.7 + 100.0 * np.sin(np.radians(-30.0)))
    return [
        _rec((0, 0, -1), _line((0, 1.5), (100, 1.5)), succ=[(5, 0, -1), (1, 0, -1)]),
        _rec((0, 0, 1), _line((100, -1.5), (0, -1.5))),
        _rec((5, 0, -1), _line((100, 1.5), (120, 1.5)), junction=7, succ=[(6, 0, -1)]),
        _rec((5, 0, 1), _line((120, -1.5), (100, -1.5)), junction=7, succ=[(0, 0, 1)]),
        _rec((1, 0, -1), _line((100, 1.5), (130, -1.7)), junction=7, succ=[(2, 0, -1)]),
        _rec((6, 0, -1), _line((120, 1.5), (220, 1.5))),
        _rec((6, 0, 1), _line((220, -1.5), (120, -1.5)), succ=[(5, 0, 1)]),
        _rec((2, 0, -1), _line((130, -1.7), far)),
    ]


def _pair(records, a, b):
    ra, rb = ({r.key: r for r in records}[k] for k in (a, b))
    ra.left, rb.left = rb.key, ra.key


def test_a_road_end_under_a_junction_lane_joins_the_junction():
    """The connecting lane runs over road 6's lane 1 (the other lane it comes near only within
    5 m of that lane's start); both lanes of road 6 are cut beyond the stretch; the pieces
    at the junction are lanes of junction 7, linked in line with the rest of the road and side
    by side with each other; nothing is left overlapping."""
    recs = _t_junction()
    _pair(recs, (6, 0, -1), (6, 0, 1))
    assert junction_overlaps(recs) == ["road 1 lane -1 over road 6 lane 1"]
    joined = join_overlapped_ends(recs)
    assert len(joined) == 2 and all(j.startswith("road 6 lane") for j in joined)
    by = {r.key: r for r in recs}
    fwd, back = by[(6, JOINED_SECTION, -1)], by[(6, JOINED_SECTION, 1)]
    assert fwd.junction == back.junction == 7
    # the cut: 3 m (JOIN_MARGIN) beyond where the connecting lane comes within 2.5 m
    assert fwd.points[0, 0] == pytest.approx(120.0) and 130.0 < fwd.points[-1, 0] < 138.0
    assert back.points[-1, 0] == pytest.approx(120.0)
    assert back.points[0, 0] == pytest.approx(fwd.points[-1, 0], abs=0.6)
    # in line: straight lane -> piece -> the road's rest; the rest -> piece -> straight lane
    assert by[(5, 0, -1)].successors == [fwd.key] and fwd.successors == [(6, 0, -1)]
    assert by[(6, 0, 1)].successors == [back.key] and back.successors == [(5, 0, 1)]
    assert by[(6, 0, -1)].points[0, 0] == pytest.approx(fwd.points[-1, 0])
    assert fwd.left == back.key and back.left == fwd.key
    assert by[(6, 0, -1)].left == (6, 0, 1)  # the rest keeps its own neighbour
    assert junction_overlaps(recs) == []
    rm = build_roadmap("t", recs)  # a network the RoadMap takes
    assert rm.junction[rm.key_index[fwd.key]] == 7 and rm.junction[rm.key_index[(6, 0, -1)]] == -1


def test_a_stretch_away_from_the_road_end_stays_as_it_is_and_named():
    """A connecting lane over the middle of another road (not within 30 m of that road's end at
    the junction) is not joined: the overlap is still named (a map defect left to the file)."""
    recs = _t_junction()
    by = {r.key: r for r in recs}
    by[(1, 0, -1)].points = _line((100, 1.5), (170, -1.0))  # over road 6 up to x = 170
    by[(2, 0, -1)].points = _line((170, -1.0), (260, -60.0))
    assert join_overlapped_ends(recs) == []
    assert junction_overlaps(recs)


def test_junctions_whose_lanes_cross_are_merged():
    """Lanes of junctions 3 and 9 cross at the same level: one junction (3). Lanes crossing 6 m
    apart in height (a bridge), and a lane of one leading into a lane of the other, are not
    merged."""
    def cross(z9=0.0, linked=False):
        a = _rec((10, 0, -1), _line((0, 0), (40, 0)), junction=3, z=0.0,
                 succ=[(20, 0, -1)] if linked else [])
        b = _rec((20, 0, -1), _line((20, -20), (20, 20)) if not linked else _line((40, 0), (40, 30)),
                 junction=9, z=z9)
        return [a, b]
    recs = cross()
    assert merge_overlapping_junctions(recs) == [((3, 9), 3)]
    assert [r.junction for r in recs] == [3, 3]
    bridge = cross(z9=6.0)
    assert merge_overlapping_junctions(bridge) == [] and [r.junction for r in bridge] == [3, 9]
    chained = cross(linked=True)
    assert merge_overlapping_junctions(chained) == [] and [r.junction for r in chained] == [3, 9]


@pytest.mark.parametrize("join", [True, False])
def test_traffic_gives_way_where_a_junction_lane_runs_over_a_road_end(join):
    """Traffic on the T junction, 20 vehicles, 240 s: with the road's end joined to the junction
    (as the loader does) no vehicles meet; with the records as the file draws them, the cars
    queued at road 6's end stand in the way of the cars taking the connecting lane, and they
    meet (junction_trippel_twoway: 35-47 NPC contacts in 600 s)."""
    recs = _t_junction()
    _pair(recs, (6, 0, -1), (6, 0, 1))
    _pair(recs, (0, 0, -1), (0, 0, 1))
    if join:
        assert join_overlapped_ends(recs)
    rm = build_roadmap("t_junction", recs)
    world = LiteWorld(rm, SimConfig(vehicles=20, offroad_margin=None, traffic=TrafficParams(
        signals="none")))
    world.reset(seed=0, ego_pose=(10.0, -1.5, np.pi))
    contacts = 0
    for _ in range(2400):
        world.step((0.0, -1.0))
    contacts = world.npc_collision_total
    if join:
        assert contacts == 0
    else:
        assert contacts > 0
