"""Road networks with open ends (roads that stop, one-way stubs), as OSM and test-track exports
have them: loaded whole, with no link that jumps, traffic that leaves at the ends, routes only
where they can go, and a training episode that ends when the network offers no route on."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from drivemind.maps import load_town
from drivemind.maps.opendrive import load_xodr_text
from drivemind.maps.routing import RouteError, _reachable_spawns, random_route
from drivemind.maps.validate import MapWarning
from drivemind.sim import SimConfig
from drivemind.sim.world import LiteWorld

# one 300 m road, a lane each way, linked to nothing: the native parser leaves lane -1 out of its
# topology (no way on) and links lane 1 to itself, 300 m back
OPEN_ROAD = """<?xml version="1.0" standalone="yes"?>
<OpenDRIVE><header revMajor="1" revMinor="4" name="" version="1"/>
<road name="r" length="300" id="1" junction="-1">
 <link/>
 <planView><geometry s="0" x="0" y="0" hdg="0" length="300"><line/></geometry></planView>
 <lanes><laneSection s="0">
  <left><lane id="1" type="driving" level="false"><link/><width sOffset="0" a="3.5" b="0" c="0" d="0"/></lane></left>
  <center><lane id="0" type="none" level="false"/></center>
  <right><lane id="-1" type="driving" level="false"><link/><width sOffset="0" a="3.5" b="0" c="0" d="0"/></lane></right>
 </laneSection></lanes>
</road></OpenDRIVE>"""


@pytest.fixture(scope="module")
def open_road():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rm = load_xodr_text(OPEN_ROAD, "open_road", source="open_road.xodr", native_check=False)
    return rm, [str(w.message) for w in caught if issubclass(w.category, MapWarning)]


def test_an_open_road_loads_both_directions_and_no_link_that_jumps(open_road):
    rm, msgs = open_road
    assert sorted(rm.keys) == [(1, 0, -1), (1, 0, 1)]
    assert all(rm.length[i] == pytest.approx(300.0, abs=1.0) for i in range(rm.n_lanes))
    assert all(len(rm.successors(i)) == 0 for i in range(rm.n_lanes))  # two dead ends
    # the parser's link of lane 1 to itself is dropped, and not warned of: the file links road 1
    # to nothing (before, every open road gave a "successor links dropped" MapWarning)
    assert not [m for m in msgs if "dropped" in m]


def test_a_road_the_file_links_to_itself_without_closing_is_warned_of():
    """A straight road whose file names it as its own successor: the link jumps 300 m back and is
    dropped, and since the file asked for it, the warning names it."""
    text = OPEN_ROAD.replace('<road name="r" length="300" id="1" junction="-1">\n <link/>',
                             '<road name="r" length="300" id="1" junction="-1">\n <link><successor '
                             'elementType="road" elementId="1" contactPoint="start"/></link>')
    assert text != OPEN_ROAD
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rm = load_xodr_text(text, "self_linked", source="self_linked.xodr", native_check=False)
    assert all(i not in list(rm.successors(i)) for i in range(rm.n_lanes))
    [msg] = [str(w.message) for w in caught if "dropped" in str(w.message)]
    assert msg.startswith("self_linked (self_linked.xodr): ") and "road 1 lane 1 -> road 1 lane 1" in msg


@pytest.mark.parametrize("length", [1.7, 0.3])
def test_a_short_open_road_keeps_no_link_of_a_lane_to_itself(length):
    """The parser links an open road's lane to itself, the road's length back; on a stub shorter
    than the 2.5 m a link may jump (MONAEast's 1.7 m road 0) that link was kept, and a vehicle
    reaching the lane went round it for good at speed, blocking the junction behind it for a
    minute at a time (6 respawns in 600 s at dense)."""
    body = OPEN_ROAD[OPEN_ROAD.index("<road "):OPEN_ROAD.index("</OpenDRIVE>")]
    stub = body.replace('length="300"', f'length="{length}"')
    far = body.replace('length="300" id="1"', 'length="300" id="2"')  # a road to spawn on
    far = far.replace('y="0"', 'y="50"')
    text = OPEN_ROAD[:OPEN_ROAD.index("<road ")] + stub + far + "</OpenDRIVE>"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rm = load_xodr_text(text, "stub", source="stub.xodr", native_check=False)
    assert all(i not in list(rm.successors(i)) for i in range(rm.n_lanes))
    msgs = [str(w.message) for w in caught if issubclass(w.category, MapWarning)]
    assert not any("dropped" in m for m in msgs), msgs  # the parser's link, not the file's


def test_a_ring_road_keeps_its_link_to_itself():
    """A lane that closes on itself (a 60 m ring road linked to itself) goes on round: that link
    is kept."""
    r = 60.0 / (2.0 * math.pi)
    ring = OPEN_ROAD.replace('length="300" id="1" junction="-1">\n <link/>',
                             'length="60" id="1" junction="-1">\n <link><predecessor '
                             'elementType="road" elementId="1" contactPoint="end"/><successor '
                             'elementType="road" elementId="1" contactPoint="start"/></link>')
    ring = ring.replace('<geometry s="0" x="0" y="0" hdg="0" length="300"><line/></geometry>',
                        f'<geometry s="0" x="0" y="0" hdg="0" length="60"><arc curvature="{1 / r}"/>'
                        '</geometry>')
    ring = ring.replace('<lane id="-1" type="driving" level="false"><link/>',
                        '<lane id="-1" type="driving" level="false"><link><predecessor id="-1"/>'
                        '<successor id="-1"/></link>')
    ring = ring.replace('<lane id="1" type="driving" level="false"><link/>',
                        '<lane id="1" type="driving" level="false"><link><predecessor id="1"/>'
                        '<successor id="1"/></link>')
    assert 'arc curvature' in ring and 'contactPoint="start"' in ring
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rm = load_xodr_text(ring, "ring", source="ring.xodr", native_check=False)
    lane = rm.key_index[(1, 0, -1)]
    assert lane in list(rm.successors(lane))


def test_traffic_leaves_at_an_open_road_end_and_never_jumps(open_road):
    rm, _ = open_road
    world = LiteWorld(rm, SimConfig(vehicles=6))
    world.reset(seed=3, ego_pose=(150.0, 40.0, 0.0))  # the ego parked off the road
    prev = world.v_xy.copy()
    moved_back = 0
    for _ in range(900):
        before = world.npc_exits + world.npc_respawns
        world.step(np.zeros(2))
        step = np.hypot(*(world.v_xy - prev).T)
        prev = world.v_xy.copy()
        jumps = int((step > 5.0).sum())
        # a vehicle moves at most its speed times dt, unless it left the network this step
        assert jumps <= world.npc_exits + world.npc_respawns - before
        moved_back += jumps
    assert world.npc_exits >= 6 and moved_back == world.npc_exits + world.npc_respawns
    assert world.npc_collision_total == 0
    assert world.npc_respawns == 0  # nobody stood at the end waiting for the last resort


def test_routes_go_only_where_the_network_leads(open_road):
    rm, _ = open_road
    for a in range(len(rm.spawn)):
        reach = _reachable_spawns(rm, a)
        same = (rm.spawn_lane == rm.spawn_lane[a]) & (rm.spawn_s >= rm.spawn_s[a])
        same[a] = False
        assert sorted(reach) == sorted(np.flatnonzero(same))
    rng = np.random.default_rng(0)
    for _ in range(20):
        r = random_route(rm, rng, min_length=50.0)
        assert len({seg[0] for seg in r.segments}) == 1 and r.length >= 50.0
    last = int(np.argmax(np.where(rm.spawn_lane == rm.spawn_lane[0], rm.spawn_s, -1)))
    with pytest.raises(RouteError, match=f"no spawn point is reachable from spawn point {last}"):
        random_route(rm, rng, start=last, max_tries=5)


def _reach_by_search(rm, lane):
    """The lanes a route reaches after driving off ``lane``, searched lane by lane (the
    definition: plan_route's edges, successors and same-direction neighbours outside junctions)."""
    from drivemind.maps.routing import _change_targets

    seen, todo = set(), [lane]
    while todo:
        cur = todo.pop()
        for n in [int(n) for n in rm.successors(cur)] + _change_targets(rm, cur):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


@pytest.mark.parametrize("town", ["Town03", "open_road"])
def test_what_a_lane_reaches_is_read_from_the_networks_components(town, open_road):
    """reachable_lanes and the spawn points a route can go to come from the strongly connected
    components of the lane graph, cached per set of components a lane leads into: one entry for
    a town whose lanes all reach each other (a set of every lane per start lane, before: 1.7 MB
    each and 0.3 s to search on a 24,000-lane town)."""
    from drivemind.maps.routing import reachable_lanes

    rm = open_road[0] if town == "open_road" else load_town(town)
    for lane in range(rm.n_lanes):
        assert reachable_lanes(rm, lane) == _reach_by_search(rm, lane), lane
    for a in range(len(rm.spawn)):
        reach = _reach_by_search(rm, int(rm.spawn_lane[a]))
        ok = np.isin(rm.spawn_lane, sorted(reach)) | (
            (rm.spawn_lane == rm.spawn_lane[a]) & (rm.spawn_s >= rm.spawn_s[a]))
        ok[a] = False
        assert np.array_equal(_reachable_spawns(rm, a), np.flatnonzero(ok))
    if town == "Town03":
        assert len(rm.__dict__["_reach_masks"]) <= 3  # a handful of entries, not one per lane


@pytest.mark.parametrize("town", ["Town02", "grid"])
def test_on_a_network_without_open_ends_every_spawn_point_reaches_every_other(town):
    """So random_route draws exactly as before the reach check (the study's routes unchanged)."""
    rm = load_town(town)
    n = len(rm.spawn)
    assert all(len(_reachable_spawns(rm, a)) == n - 1 for a in range(n))


def test_a_training_episode_ends_where_the_network_offers_no_route_on(tmp_path, monkeypatch):
    from drivemind.envs import TRUNCATIONS, DriveEnv

    (tmp_path / "open_road.xodr").write_text(OPEN_ROAD)
    monkeypatch.setenv("DRIVEMIND_MAP_PATH", str(tmp_path))
    env = DriveEnv("open_road", "empty", min_route_length=150.0, max_route_length=400.0,
                   max_episode_steps=2000)
    env.reset(seed=0)
    ends = []
    for _ in range(2000):
        _, _, term, trunc, info = env.step(env.unwrapped.expert_action())
        if term or trunc:
            ends.append((info["termination"], info["truncation"], info["arrived"]))
            break
    env.close()
    # a route of >= 150 m on a 300 m one-way lane ends in its last 150 m: nothing left ahead
    assert ends == [("", "no_route", True)] and "no_route" in TRUNCATIONS


# ---------------------------------------------------------------------------- lanes that taper

def _lane(key, x0, x1, y=0.0, succ=(), width=None):
    from drivemind.maps.roadmap import LaneRecord

    xs = np.linspace(x0, x1, int(x1 - x0) + 1)
    n = len(xs)
    w = np.full(n, 3.5) if width is None else width(xs)
    return LaneRecord(key=key, points=np.stack([xs, np.full(n, y)], 1), width=w,
                      mark_left=np.zeros(n, np.uint8), mark_right=np.zeros(n, np.uint8),
                      junction=-1, successors=list(succ))


def merge_road():
    """A 200 m two-lane road whose right lane tapers to nothing over its last 40 m (a lane drop,
    as OpenDRIVE exports draw one: the lane's width goes to 0, both lanes lead into the road on),
    then 200 m of one lane; the left lane is the ordinary one."""
    from drivemind.maps.roadmap import build_roadmap

    left = _lane((1, 0, -1), 0, 200, succ=[(2, 0, -1)])
    right = _lane((1, 0, -2), 0, 200, y=3.5, succ=[(2, 0, -1)],
                  width=lambda x: np.clip((200 - x) / 40, 0, 1) * 3.5)
    left.right, right.left = (1, 0, -2), (1, 0, -1)
    on = _lane((2, 0, -1), 200, 400)
    return build_roadmap("merge", [left, right, on])


def test_no_spawn_point_where_a_lane_is_too_narrow_for_a_car():
    rm = merge_road()
    right = rm.key_index[(1, 0, -2)]
    s = rm.spawn_s[rm.spawn_lane == right]
    # 2.5 m wide at x = 171.4; a spawn point needs that within 6 m either side (without the rule
    # the lane's spawn points went on to 186 m, where it is 1.2 m wide)
    assert len(s) and s.max() <= 171.4 - 6.0


def test_traffic_merges_before_a_lane_drop_without_a_collision():
    rm = merge_road()
    right, left = rm.key_index[(1, 0, -2)], rm.key_index[(1, 0, -1)]
    world = LiteWorld(rm, SimConfig(vehicles=10, offroad_margin=None))
    stop = world.taper_stop[rm.offset[right]]  # where the right lane, seen from its start, narrows
    assert stop == pytest.approx(171.0, abs=1.0) and np.isinf(world.taper_stop[rm.offset[left]])
    world.reset(seed=1, ego_pose=(100.0, 60.0, 0.0))
    deepest = 0.0
    for _ in range(1200):
        world.step(np.zeros(2))
        on_right = world.v_lane == right
        if on_right.any():
            deepest = max(deepest, float((world.v_s[on_right] + world.v_hl[on_right]).max()))
    assert world.npc_collision_total == 0
    assert world.lane_change_total >= 1 and world.npc_exits >= 5  # they merged and drove on
    assert deepest <= stop + 0.05  # nobody drove into the taper


def bays_road():
    """A 300 m two-lane road whose right lane closes up to nothing between 120 and 160 m and opens
    again (bays along a road, as esmini's parking_demo draws them: one driving lane whose width
    goes to 0 and back), then 200 m more of the two lanes, which end there (open road ends)."""
    from drivemind.maps.roadmap import build_roadmap

    def width(x):
        return np.clip(np.abs(x - 140.0) / 10.0 - 1.0, 0.0, 1.0) * 3.5  # 0 at 130-150 m

    left = _lane((1, 0, -1), 0, 300, succ=[(2, 0, -1)])
    right = _lane((1, 0, -2), 0, 300, y=3.5, succ=[(2, 0, -2)], width=width)
    left.right, right.left = (1, 0, -2), (1, 0, -1)
    on_left, on_right = _lane((2, 0, -1), 300, 500), _lane((2, 0, -2), 300, 500, y=3.5)
    on_left.right, on_right.left = (2, 0, -2), (2, 0, -1)
    return build_roadmap("bays", [left, right, on_left, on_right])


def test_taper_stop_is_the_next_narrowing_ahead():
    from drivemind.maps.roadmap import MIN_SPAWN_WIDTH

    rm = bays_road()
    right = rm.key_index[(1, 0, -2)]
    world = LiteWorld(rm, SimConfig(vehicles=0, offroad_margin=None))
    o0, o1 = rm.offset[right], rm.offset[right + 1]
    stops = world.taper_stop[o0:o1]
    w = rm.width[o0:o1]
    first = int(np.argmax(w < MIN_SPAWN_WIDTH))  # where it first gets too narrow
    assert stops[0] == pytest.approx(first * rm.ds[right])
    assert 120.0 < stops[0] < 140.0
    # past the closed stretch, where the lane is wide again to its end: no stop ahead
    assert np.isinf(stops[int(200 / rm.ds[right])])
    assert np.isinf(world.taper_stop[rm.offset[rm.key_index[(1, 0, -1)]]])


def test_traffic_leaves_a_lane_before_it_closes_up_without_a_collision():
    """Before the per-point stop only a lane narrow at its *end* was an obstacle: vehicles drove
    on into a stretch where the lane closes up, their centre 1.75 m from the next lane's, and hit
    its traffic (parking_demo: 5-6 NPC contacts in 600 s)."""
    rm = bays_road()
    right = rm.key_index[(1, 0, -2)]
    world = LiteWorld(rm, SimConfig(vehicles=12, offroad_margin=None))
    world.reset(seed=2, ego_pose=(100.0, 60.0, 0.0))
    assert (world.v_lane == right).sum() >= 2
    stop = world.taper_stop[rm.offset[right]]
    inside = 0
    for _ in range(1200):
        world.step(np.zeros(2))
        on = (world.v_lane == right) & (world.v_s < stop + 30.0)  # before the lane opens again
        inside += int(((world.v_s + world.v_hl)[on] > stop + 0.05).sum())
    assert world.npc_collision_total == 0
    assert inside == 0  # nobody drove into the closed stretch
    assert world.lane_change_total >= 1 and world.npc_exits >= 5


def test_no_lane_change_into_a_lane_that_narrows():
    """The right lane's taper makes it no target: a vehicle on the left lane behind a standing
    ego does not swerve into it (on a full-width lane it would, test_traffic_flow)."""
    from drivemind.sim.config import TrafficParams

    rm = merge_road()
    left = rm.key_index[(1, 0, -1)]
    world = LiteWorld(rm, SimConfig(vehicles=1, offroad_margin=None,
                                    traffic=TrafficParams(signals="none", stuck_respawn=None)))
    world.reset(seed=0, ego_pose=(1e4, 1e4, 0.0))
    world.v_lane[0], world.v_s[0], world.v_v[0] = left, 20.0, 5.0
    world.v_path[0] = -1
    world.v_path[0, 0] = left
    world.ego.update(x=80.0, y=0.0, yaw=0.0, v=0.0)  # standing in the left lane
    for _ in range(300):
        world.step((0.0, -1.0))
    assert world.lane_change_total == 0 and world.v_xy[0, 0] < 80.0


def test_bench_sim_runs_on_an_open_road_and_restarts_its_ego_elsewhere(tmp_path, monkeypatch, capsys):
    from script_loader import load_script

    (tmp_path / "open_road.xodr").write_text(OPEN_ROAD)
    monkeypatch.setenv("DRIVEMIND_MAP_PATH", str(tmp_path))
    out = load_script("bench").main(["sim", "--town", "open_road", "--density", "regular",
                                     "--seconds", "300", "--cores", "0"])
    assert out["npc_exits"] > 0 and out["npc_collisions"] == 0 and out["npc_respawns"] == 0
    assert out["ego_restarts"] >= 1 and out["ego_routes_completed"] >= out["ego_restarts"]
    assert out["ego_collisions"] == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('{"what": "sim"')
    # --vehicles N: N vehicles instead of the density's, the rest of its actors as they are
    few = load_script("bench").main(["sim", "--town", "open_road", "--density", "regular",
                                     "--seconds", "30", "--cores", "0", "--vehicles", "2"])
    assert few["vehicles_asked"] == 2 and few["vehicles"] == 2 and "vehicles_asked" not in out
    # cars only at this density: their mean speed is the NPCs' mean speed
    assert list(out["npc_mean_speed_kmh_by_class"]) == ["car"]
    assert out["npc_mean_speed_kmh_by_class"]["car"] == pytest.approx(out["npc_mean_speed_kmh"], abs=0.011)
    with pytest.raises(SystemExit, match="--vehicles must be >= 0"):
        load_script("bench").main(["sim", "--town", "open_road", "--vehicles", "-1"])


# A 90-degree turn written as editors export junction turns: a clothoid from straight to
# curvature K, a "spiral" whose curvature stays K (an arc), and a clothoid back to straight.
K, L_IN, L_ARC = 0.0691, 10.47, 12.26


def _clothoid_end(x, y, hdg, c0, c1, length, n=20000):
    ds = length / n
    s = (np.arange(n) + 0.5) * ds
    h = hdg + c0 * s + 0.5 * (c1 - c0) / length * s * s
    return x + np.cos(h).sum() * ds, y + np.sin(h).sum() * ds, hdg + 0.5 * (c0 + c1) * length


def _turn_xodr(middle: str) -> str:
    pieces, x, y, h, s = [], 0.0, 0.0, 0.0, 0.0
    for c0, c1, length in ((1e-9, K, L_IN), (K, K, L_ARC), (K, 1e-9, L_IN)):
        shape = (middle if c0 == c1 else f'<spiral curvStart="{c0}" curvEnd="{c1}"/>')
        pieces.append(f'<geometry s="{s}" x="{x}" y="{y}" hdg="{h}" length="{length}">{shape}</geometry>')
        x, y, h = _clothoid_end(x, y, h, c0, c1, length)
        s += length
    lanes = "".join(f'<lane id="{i}" type="driving" level="false"><link/><width sOffset="0" a="3" b="0" c="0" '
                    f'd="0"/></lane>' for i in (1, 2))
    rlanes = lanes.replace('id="1"', 'id="-1"').replace('id="2"', 'id="-2"')
    return f"""<?xml version="1.0" standalone="yes"?>
<OpenDRIVE><header revMajor="1" revMinor="4" name="" version="1"/>
<road name="turn" length="{s}" id="7" junction="-1"><link/><planView>{''.join(pieces)}</planView>
 <lanes><laneSection s="0"><left>{lanes}</left><center><lane id="0" type="none" level="false"/></center>
 <right>{rlanes}</right></laneSection></lanes></road></OpenDRIVE>"""


def test_a_spiral_of_constant_curvature_is_read_as_the_arc_it_is():
    from drivemind.maps.opendrive import carla_lane_records, constant_spirals_as_arcs, parse_carla_map
    from drivemind.maps.validate import broken_centre_line, find_issues

    as_spiral = _turn_xodr(f'<spiral curvStart="{K}" curvEnd="{K}"/>')
    as_arc = _turn_xodr(f'<arc curvature="{K}"/>')
    # the native parser on the text as written misplaces the middle piece, so the lanes leap
    # (or turn back, depending on the offsets) where the third piece starts: why the rewrite exists
    raw, _, _ = carla_lane_records(parse_carla_map(as_spiral, "turn", "turn.xodr"), name="turn")
    assert all(broken_centre_line(r.points) for r in raw), "carla drew the constant spiral correctly"
    assert any("jumps or turns back" in k for k in find_issues(raw))

    text, rewritten = constant_spirals_as_arcs(as_spiral)
    assert rewritten == [f"road 7 geometry s={L_IN:.2f} (curvature {K:.4g})"]
    assert text.count("<spiral") == 2 and f'<arc curvature="{K!r}"/>' in text
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rm = load_xodr_text(as_spiral, "turn", source="turn.xodr", native_check=False)
    msgs = [str(w.message) for w in caught if issubclass(w.category, MapWarning)]
    assert [m for m in msgs if "read as arcs" in m] == [
        f"turn (turn.xodr): 1 spirals of constant curvature read as arcs (the CARLA parser draws them "
        f"as straight lines, and the lanes after them jump back): road 7 geometry s={L_IN:.2f} "
        f"(curvature {K:.4g})"]
    assert not [m for m in msgs if "jumps or turns back" in m]
    ref = load_xodr_text(as_arc, "turn_arc", native_check=False)
    assert sorted(rm.keys) == sorted(ref.keys)
    for key in rm.keys:
        a, b = rm.lane_points(rm.key_index[key]), ref.lane_points(ref.key_index[key])
        assert len(a) == len(b) and np.abs(a - b).max() < 1e-6
        assert not broken_centre_line(a)
        d = np.diff(a, axis=0)
        heading = np.unwrap(np.arctan2(d[:, 1], d[:, 0]))
        # about 90 degrees (carla's y axis points the other way: a left turn turns right there)
        assert abs(np.degrees(heading[-1] - heading[0])) == pytest.approx(np.degrees(K * (L_IN + L_ARC)), abs=1.0)


def test_real_spirals_and_texts_without_them_are_left_alone():
    from drivemind.maps.opendrive import constant_spirals_as_arcs

    clothoids = _turn_xodr('<spiral curvStart="0.0691" curvEnd="0.05"/>')
    assert constant_spirals_as_arcs(clothoids) == (clothoids, [])
    assert constant_spirals_as_arcs(OPEN_ROAD) == (OPEN_ROAD, [])
    flat = _turn_xodr('<spiral curvStart="0" curvEnd="0"/>')
    text, rewritten = constant_spirals_as_arcs(flat)
    assert "<line/>" in text and rewritten == [f"road 7 geometry s={L_IN:.2f} (curvature 0)"]


def test_a_lane_whose_centre_line_kinks_is_warned():
    """A lane whose width jumps from 3 to 5 m at once: its centre line steps 1 m sideways within
    one 0.5 m sample step (esmini's mixed_roads: vehicles on it swung into the next lane and met
    its traffic). Named in a warning; a 6 m radius turn and a bay opening at 1 m of width per metre
    (centre line at 27 degrees) are not."""
    from drivemind.maps.validate import find_issues, kinked_centre_line

    xs = np.arange(0.0, 20.0, 0.5)
    kinked = np.stack([xs, np.where(xs < 10.0, 0.0, 1.0)], 1)
    a = np.linspace(0.0, math.pi / 2, 20)
    turn = np.stack([6.0 * np.sin(a), 6.0 - 6.0 * np.cos(a)], 1)  # 0.47 m steps, 4.8 degrees
    bay = np.stack([xs, np.clip(xs - 5.0, 0.0, 5.0) * 0.5], 1)
    assert kinked_centre_line(kinked)
    assert not kinked_centre_line(turn) and not kinked_centre_line(bay)
    rec = _lane((7, 0, 1), 0, 20)
    rec.points = kinked
    rec.width = np.full(len(kinked), 3.0)
    issues = find_issues([rec])
    (kind,) = [k for k in issues if "kinks" in k]
    assert issues[kind] == ["road 7 lane 1"]
    rec.points = bay
    assert not any("kinks" in k for k in find_issues([rec]))


def _crossing_roads(height: float) -> str:
    """Two 200 m roads, a lane each way, crossing at right angles in their middles with no
    junction; the second ``height`` m above the first."""
    lanes = ('<lanes><laneSection s="0"><left><lane id="1" type="driving" level="false"><link/>'
             '<width sOffset="0" a="3.5" b="0" c="0" d="0"/></lane></left><center><lane id="0" '
             'type="none" level="false"/></center><right><lane id="-1" type="driving" '
             'level="false"><link/><width sOffset="0" a="3.5" b="0" c="0" d="0"/></lane></right>'
             '</laneSection></lanes>')
    roads = ""
    for rid, x, y, hdg, z in ((1, 0.0, 0.0, 0.0, 0.0), (2, 100.0, -100.0, math.pi / 2, height)):
        roads += (f'<road name="r{rid}" length="200" id="{rid}" junction="-1"><link/><planView>'
                  f'<geometry s="0" x="{x}" y="{y}" hdg="{hdg}" length="200"><line/></geometry>'
                  f'</planView><elevationProfile><elevation s="0" a="{z}" b="0" c="0" d="0"/>'
                  f'</elevationProfile>{lanes}</road>')
    return ('<?xml version="1.0" standalone="yes"?><OpenDRIVE><header revMajor="1" revMinor="4" '
            f'name="" version="1"/>{roads}</OpenDRIVE>')


@pytest.mark.parametrize("height, warned", [(0.0, True), (6.0, False)])
def test_lanes_that_cross_outside_a_junction_at_the_same_level_are_warned(height, warned):
    """Two roads crossing with no junction: at the same level, every pair of their lanes is named
    in a warning (lanelet conversions have such crossings, and their traffic met: CommonRoad's
    USA_Lanker, 57 contacts in 600 s); 6 m apart in height (a bridge, as in Town04 and Town05)
    they are not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_xodr_text(_crossing_roads(height), "crossing", source="crossing.xodr",
                       native_check=False)
    msgs = [str(w.message) for w in caught if issubclass(w.category, MapWarning)
            and "same level" in str(w.message)]
    if warned:
        (msg,) = msgs
        assert "4 pairs of lanes that cross outside any junction at the same level" in msg
        assert "road 1 lane -1 x road 2 lane -1" in msg
    else:
        assert msgs == []


def test_a_vehicle_is_never_put_back_onto_a_walker():
    """A vehicle that left the network (or stood too long) is put back at a spawn point no walker
    is within 6 m of (esmini's jolengatan at drivevlm: a bicycle put back at a crossing met three
    walkers at once)."""
    from drivemind.sim.world import RESPAWN_WALKER_GAP

    rm = bays_road()
    world = LiteWorld(rm, SimConfig(vehicles=1, walkers=0, offroad_margin=None))
    world.reset(seed=0, ego_pose=(0.0, 300.0, 0.0))
    far = np.flatnonzero(np.hypot(rm.spawn[:, 0], rm.spawn[:, 1] - 300.0) > 40.0)
    keep = int(far[len(far) // 2])
    others = np.hypot(*(rm.spawn[:, :2] - rm.spawn[keep, :2]).T) > 10.0
    world.w_xy = rm.spawn[others, :2] + 1.0  # a walker 1.4 m from every spawn point not near keep
    assert (~others).sum() >= 2  # keep and its neighbour on the next lane, 3.5 m off
    world.v_xy[0] = (1e4, 1e4)  # the vehicle's own place does not count
    assert np.hypot(*(rm.spawn[world._respawn(0), :2] - rm.spawn[keep, :2])) <= 10.0
    world.w_xy = rm.spawn[:, :2].copy()
    assert world._respawn(0) is None  # every one taken: it waits for a free one
    world.w_xy = rm.spawn[:, :2] + RESPAWN_WALKER_GAP + 0.5  # diagonal: 9.2 m off
    assert world._respawn(0) is not None
