"""The junction tables stored junction by junction (tables.JunctionPairs): the conflict and
clear-point tables were L x L arrays, about 3.6 GB for a town of 20,000 lanes (CARLA's Town12,
13 and 15 are of that size); only pairs of lanes of one junction are ever nonzero, so each
junction keeps its own block."""

from __future__ import annotations

import numpy as np
import pytest

from drivemind.maps import load_town
from drivemind.sim import kernels as K
from drivemind.sim.config import TrafficParams
from drivemind.sim.tables import JunctionPairs, traffic_tables


def _junction_sizes(rm):
    ids, counts = np.unique(rm.junction[rm.junction >= 0], return_counts=True)
    return counts


def test_junction_tables_grow_with_each_junction_not_with_the_whole_town():
    rm = load_town("Town03")
    tab = traffic_tables(rm, TrafficParams())
    sizes = _junction_sizes(rm)
    for name in ("conflict", "clear"):
        t = tab[name]
        assert isinstance(t, JunctionPairs)
        assert t.data.size == int((sizes ** 2).sum())
        assert t.nbytes < rm.n_lanes ** 2 * t.data.itemsize / 10, (name, t.nbytes)
    assert tab["conflict"].data.any() and np.isfinite(tab["clear"].data).any()


def test_a_pair_table_reads_and_writes_like_the_dense_array_it_replaces():
    junction = np.array([-1, 0, 0, 1, 1, 1, -1, 0])
    t = JunctionPairs(junction, np.int8, 0)
    ref = np.zeros((8, 8), np.int8)
    for a, b, v in ((1, 2, 1), (2, 7, 2), (3, 5, 1), (5, 4, 2), (7, 1, 1)):
        t[a, b] = v
        ref[a, b] = v
    assert t.data.size == 3 * 3 + 3 * 3
    assert np.array_equal(t.dense(), ref)
    lanes = np.array([1, 2, 7])
    assert np.array_equal(t[np.ix_(lanes, lanes)], ref[np.ix_(lanes, lanes)])
    assert t[2, 7] == 2 and t[0, 1] == 0 and t[1, 3] == 0 and t[6, 6] == 0
    assert t.partners(2).tolist() == [7] and t.partners(0).tolist() == []
    blk = t.block(np.array([3, 4, 5]))
    assert blk.shape == (3, 3) and blk[2, 1] == 2
    t[np.ix_(lanes, lanes)] = 0  # a whole block at once
    assert not t.block(lanes).any() and t[3, 5] == 1
    with pytest.raises(ValueError, match="only pairs of lanes of one junction"):
        t[1, 3] = 1  # two junctions: no place for it
    t[1, 3] = 0  # the fill value is what it reads anyway
    clear = t.like(np.float64, np.inf)
    assert clear[1, 2] == np.inf and clear[0, 0] == np.inf and clear.data.size == t.data.size
    clear[4, 3] = 2.5
    assert clear[4, 3] == 2.5 and t[4, 3] == 0  # the same blocks, its own data


def test_the_kernels_read_the_same_pairs_as_python():
    rm = load_town("grid")
    tab = traffic_tables(rm, TrafficParams())
    conflict, clear = tab["conflict"], tab["clear"]
    rng = np.random.default_rng(0)
    jl = np.flatnonzero(rm.junction >= 0)
    pairs = [(int(a), int(b)) for a in jl for b in jl if rm.junction[a] == rm.junction[b]]
    pairs += [tuple(int(x) for x in rng.integers(0, rm.n_lanes, 2)) for _ in range(500)]
    seen = set()
    for a, b in pairs:
        got = K._cf(conflict.data, conflict.index, a, b)
        assert got == conflict[a, b], (a, b)
        assert K._cl(clear.data, clear.index, a, b) == clear[a, b], (a, b)
        seen.add(int(got))
    assert seen == {0, 1, 2}  # conflicts and two ways from one lane both occur on grid


def test_conflicts_are_symmetric_and_within_one_junction_on_a_real_town():
    rm = load_town("Town03")
    c = traffic_tables(rm, TrafficParams())["conflict"].dense()
    a, b = np.nonzero(c)
    assert len(a) and (rm.junction[a] >= 0).all()
    assert (rm.junction[a] == rm.junction[b]).all()
    assert np.array_equal(c != 0, (c != 0).T)
