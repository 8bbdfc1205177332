"""Junctions joined by short links (``traffic.junction_chain``; stop 51, from CommonRoad's
Roundabout8Course, a road network nobody tuned on): a roundabout whose ring runs from junction to
junction over links that hold one car locked up, as entries and ring filled each other's links.
Each map is built here from LaneRecords (tests/roundabout.py)."""

from __future__ import annotations

import numpy as np
import pytest

from drivemind.sim import SimConfig
from drivemind.sim.config import TrafficParams
from drivemind.sim.tables import LINK_SHORT, chain_ids, chain_links, traffic_tables, way_storage
from drivemind.sim.world import LiteWorld

from roundabout import roundabout
from test_junction_geometry import _place  # a vehicle at a place, with a path from given lanes

FAR = (1e5, 1e5, 0.0)  # the ego, out of the way


def _world(rm, n, **traffic):
    cfg = SimConfig(vehicles=n, traffic=TrafficParams(signals="none", **traffic))
    world = LiteWorld(rm, cfg)
    world.reset(seed=0, ego_pose=FAR)
    return world


def test_the_ring_s_short_links_are_found_and_its_ways_through_have_room_past_their_crossings():
    rm, ix = roundabout()
    tab = traffic_tables(rm, TrafficParams())
    links = set(np.flatnonzero(chain_links(rm, tab["succ"])).tolist())
    assert links == {ix[f"link{k}"] for k in range(4)}  # 11.4 m each; arms and ways are none
    assert all(rm.length[ix[f"link{k}"]] < LINK_SHORT for k in range(4))
    # as kernel tables: one id per link; a way through leads into the link after its junction
    link_id, via = chain_ids(rm, tab["succ"])
    assert sorted(link_id[ix[f"link{k}"]] for k in range(4)) == [0, 1, 2, 3]
    assert (link_id >= 0).sum() == 4
    for k in range(4):
        for way in ("cont", "entry"):
            assert via[ix[f"{way}{k}"]].tolist() == [ix[f"link{k}"]] * 2
        assert via[ix[f"exit{k}"]].tolist() == [-1, -1] and via[ix[f"in{k}"]].tolist() == [-1, -1]
    store = way_storage(rm, tab["succ"], tab["conflict"], tab["clear"], 1.0)
    for k in range(4):
        # an entry only merges with the ring: all of it but the margin is room to queue in
        assert store[ix[f"entry{k}"]] == pytest.approx(rm.length[ix[f"entry{k}"]] - 1.0)
        # the ring's way through diverges from the exit: room only past where the two part
        cont = ix[f"cont{k}"]
        assert 0.0 < store[cont] < rm.length[cont] - 1.0 - 3.0
    assert not store[[ix[f"link{k}"] for k in range(4)]].any()  # no junction lanes
    # with a ring twice as large the links are 34 m long: no chain
    big, bix = roundabout(radius=40.0)
    assert big.length[bix["link0"]] > LINK_SHORT
    assert not chain_links(big, traffic_tables(big, TrafficParams())["succ"]).any()


@pytest.mark.parametrize("rule", ["none", "queue"])
def test_a_roundabout_of_junctions_joined_by_short_links_keeps_moving(rule):
    """16 vehicles on the roundabout for 300 s. Under the rule before, cars entering fill the
    one-car links, the ring's cars wait for them and they for the ring: waits-for cycles, and
    vehicles standing 60 s respawned. With the chain rule, none of either, and twice as many
    vehicles get through (leave at an arm's end)."""
    rm, _ = roundabout()
    world = _world(rm, 20, junction_chain=rule)
    assert len(world.v_lane) == 16  # what the spawn points take
    for _ in range(3000):
        world.step((0.0, -1.0))
    assert world.npc_collision_total == 0
    if rule == "none":
        assert world.npc_respawns > 0 and world.npc_wait_cycles > 0
        assert world.npc_exits < 100
    else:
        assert world.npc_respawns == 0 and world.npc_wait_cycles == 0
        assert world.npc_max_stuck_s < 40.0
        assert world.npc_exits > 130


def _two_cars(rm, rule):
    world = _world(rm, 2, junction_chain=rule, stuck_respawn=None, wait_cycle_after=None)
    assert len(world.v_lane) == 2
    world.v_hl[:], world.v_hw[:], world.v_vcap[:], world.v_vfac[:] = 2.4, 1.0, 30.0, 1.0
    return world


@pytest.mark.parametrize("rule", ["none", "queue"])
def test_a_car_on_a_ring_link_goes_before_an_entering_car_that_waited_longer(rule):
    """Car 0 stands at the end of the link before junction 0, to go on round the ring; car 1 has
    stood 40 s at junction 0's entry. Their ways merge. The rule before lets the longer wait go
    first; the chain rule lets the ring go first, and holds the entry back while it waits."""
    rm, ix = roundabout()
    world = _two_cars(rm, rule)
    link, cont = ix["link3"], ix["cont0"]
    _place(world, 0, link, rm.length[link] - 3.0, 0.0, [link, cont])
    _place(world, 1, ix["in0"], rm.length[ix["in0"]] - 3.0, 0.0, [ix["in0"], ix["entry0"]])
    world.v_wait[:] = 0.0, 40.0
    world.step((0.0, -1.0))
    granted = world.v_grant.tolist()
    if rule == "none":
        assert granted == [-1, ix["entry0"]]
    else:
        assert granted == [cont, -1]


@pytest.mark.parametrize("rule", ["none", "queue"])
def test_a_car_is_not_let_into_a_short_link_another_is_already_let_into(rule):
    """Car 0 is on its way onto the ring at junction 0, granted, into the 11.4 m link that holds
    one car; car 1 comes up behind it on the same entry. The rule before counted the link as
    room enough while more than nothing of it was left (4.6 m): car 1 was let in, to stand in the
    junction across the ring. The chain rule lets nobody else into a stretch that short."""
    rm, ix = roundabout()
    world = _two_cars(rm, rule)
    entry, inl = ix["entry0"], ix["in0"]
    _place(world, 0, entry, 6.0, 4.0, [entry, ix["link0"]])
    world.v_grant[0], world.v_entered[0] = entry, True
    _place(world, 1, inl, rm.length[inl] - 4.0, 0.0, [inl, entry])
    world.step((0.0, -1.0))
    assert world.v_grant[0] == entry
    assert world.v_grant[1] == (entry if rule == "none" else -1)


def test_unknown_junction_chain_lists_the_valid_ones():
    with pytest.raises(ValueError, match="traffic.junction_chain must be one of queue, none"):
        SimConfig(traffic=TrafficParams(junction_chain="ring"))


@pytest.mark.parametrize("rule", ["none", "queue"])
def test_the_ego_in_a_junction_before_a_short_link_holds_the_ways_across_it_in_the_next(rule):
    """The ego drives through junction 1 at 5 m/s, on to the 2 m link and junction 2; a car comes
    up to junction 2 on the way crossing the ego's there. On the link the ego would be too close
    to stop, so with the chain rule the car is not let in while the ego is in junction 1 on its
    way to the link; under the rule before it was, and met the ego in junction 2
    (CommonRoad's BEL_Wervik, `drivevlm` seed 2)."""
    import math

    from test_junction_geometry import linked_junctions

    rm, ix = linked_junctions()
    world = _world(rm, 1, junction_chain=rule, stuck_respawn=None, wait_cycle_after=None)
    assert len(world.v_lane) == 1
    world.reset(seed=0, ego_pose=(-12.0, 0.0, 0.0), ego_speed=5.0)  # half-way through junction 1
    ein = ix["ein"]
    _place(world, 0, ein, rm.length[ein] - 4.0, 2.0, [ein, ix["w"], ix["eout"]])
    world.step((0.0, 0.0))
    assert world._ego_lane == ix["l1"]  # still in junction 1
    assert math.hypot(world.ego["x"] + 12.0, world.ego["y"]) < 1.0
    assert world.v_grant[0] == (ix["w"] if rule == "none" else -1)

