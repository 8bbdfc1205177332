"""Checks of a loaded road network, reported as warnings that name road and lane ids.

A network can parse and still be broken in ways that make vehicles vanish, stop or meet: links to
roads or junctions that do not exist, lanes that point to lanes the loader could not read, lanes of
zero length, lanes whose centre line kinks, junctions with no connecting lanes.
:func:`find_issues` lists them; :func:`warn_issues` (called by
:func:`drivemind.maps.opendrive.load_xodr_text`) emits one :class:`MapWarning` per kind.
"""

from __future__ import annotations

import math
import warnings
import xml.etree.ElementTree as ET

import numpy as np

from .roadmap import LaneRecord, _interp_attr, finite_points

ZERO_LENGTH = 0.01  # m: a lane shorter than this has no usable centre line
FAR_SUCCESSOR = 1.0  # m between a lane's end and its successor's start: warned
BROKEN_SUCCESSOR = 2.5  # m: a link this far is dropped (a vehicle or route following it would jump)
MIN_LOOP = 20.0  # m: a lane linked to itself is a ring only this long at least (radius over 3 m)
TURNS_BACK = 120.0  # degrees between one sample step of a centre line and the next: it reverses
KINK = 30.0  # degrees between consecutive steps: the centre line kinks (a lane width or offset that
#               jumps: a vehicle on it swings sideways; real lanes turn at most ~11 degrees per
#               0.5 m step in the shipped towns, a lane opening to a bay ~27)
JUMP = 4.0  # a sample step this many times the median step: the centre line leaps
MAX_NAMED = 8  # ids named per warning, then "and N more"
OVERLAP_NEAR = 2.5  # m between a junction lane's and another road's centre lines: cars on them touch
OVERLAP_END = 5.0  # m from a lane's ends within which a junction lane may come that near (it joins)
JOIN_REACH = 30.0  # m from a road's end within which a stretch under a junction's lanes joins the
#                    junction (join_overlapped_ends)
JOIN_MARGIN = 3.0  # m of the road beyond that stretch joined too (a car standing there reaches in)
JOIN_ROUNDS = 4  # rounds of join_overlapped_ends (a joined piece over a third road's end)
JOINED_SECTION = 10_000  # added to the section id of a road's end joined to a junction
LEVEL = 2.0  # m: two crossing lanes this close in height are at the same level (not a bridge)


class MapWarning(UserWarning):
    """A defect in a loaded road network (the map still loads)."""


def _lane(key) -> str:
    road, section, lane = key
    return f"road {road} lane {lane}" + (f" (section {section})" if section else "")


def _named(items: list[str]) -> str:
    more = len(items) - MAX_NAMED
    return "; ".join(items[:MAX_NAMED]) + (f"; and {more} more" if more > 0 else "")


def _length(points) -> float:
    p = np.asarray(points, float).reshape(-1, 2)
    return float(np.hypot(*np.diff(p, axis=0).T).sum()) if len(p) >= 2 else 0.0


def drop_points_nowhere(records) -> list[str]:
    """Remove from ``records`` every point the parser puts nowhere (NaN: a geometry record
    without its coefficients, CommonRoad's ``straight_road_default``) and name each lane that had
    one. Before any check that measures a lane: a NaN end made a lane's link to itself (the
    parser's, at an open road end) look like a ring, and traffic went round it for good."""
    named = []
    for i, r in enumerate(records):
        pts = np.asarray(r.points, float).reshape(-1, 2)
        ok = np.isfinite(pts).all(axis=1)
        if not ok.all():
            records[i] = finite_points(r)
            named.append(_lane(r.key))
    return named


def drop_broken_successors(records, max_gap: float = BROKEN_SUCCESSOR) -> list[str]:
    """Remove from ``records`` every successor link whose lane starts more than ``max_gap`` m from
    the end of the lane that links to it, and every link of a lane to itself unless the lane is
    a ring (its start within ``FAR_SUCCESSOR`` m of its end, ``MIN_LOOP`` m long at least), and
    return each one removed as ``(lane key, successor key, gap in m)``.

    The native parser gives such links for roads that end open (it links the lane to itself, the
    whole road's length away: a straight highway's lanes "continue" at their own start) and for
    some junction exports. Traffic following one jumps (and lands on whatever stands there),
    and a route through one is not drivable; without it the lane is a dead end (the traffic's
    vehicles leave the network there, ``drivemind.sim.world``) or continues geometrically
    (``drivemind.sim.tables.traffic_successors``)."""
    ends = {r.key: np.asarray(r.points, float).reshape(-1, 2) for r in records}
    # a link of a lane to itself is drivable only where the lane closes on itself (a ring: its
    # end meets its start, and it is a road's length at least); the parser's open-end self-link
    # on a lane shorter than max_gap (MONAEast's 1.7 m stub) was kept, and a vehicle reaching it
    # went round it for good, at speed, in the way of everyone behind
    far = [(r, s, gap) for r, s, gap in _successor_gaps(records, ends)
           if gap > max_gap or (s == r.key and (gap > FAR_SUCCESSOR
                                                 or _length(ends[s]) < MIN_LOOP))]
    for r, s, _ in far:
        r.successors = [t for t in r.successors if t != s]
    return [(r.key, s, gap) for r, s, gap in far]


def _successor_gaps(records, ends: dict):
    """(record, successor key, metres from the record's lane end to the successor's start) for
    every link between two lanes of ``ends`` (``{key: centre-line points}``)."""
    for r in records:
        if len(ends.get(r.key, ())):
            for s in r.successors:
                if len(ends.get(s, ())):
                    yield r, s, float(np.hypot(*(ends[s][0] - ends[r.key][-1])))


def _link(a, b, gap: float) -> str:
    return f"{_lane(a)} -> {_lane(b)} ({gap:.1f} m)"


def broken_centre_line(points, max_turn_deg: float = TURNS_BACK) -> bool:
    """A centre line that reverses or leaps: two consecutive steps between its points more than
    ``max_turn_deg`` apart in heading (a lane's sample steps are 0.5 m; the tightest real turn
    changes heading by a few degrees per step), or one step over ``JUMP`` times the median step
    and over 1 m (the parser skipped a piece of road it could not place). Broken geometry, not a
    road. Steps under 5 cm (the parser's last sample can land a few micrometres from the one
    before) carry no heading and are left out."""
    d = np.diff(np.asarray(points, float).reshape(-1, 2), axis=0)
    n = np.hypot(*d.T) if len(d) else np.zeros(0)
    n = n[n >= 0.05]
    if len(n) < 2:
        return False
    if n.max() > max(JUMP * float(np.median(n)), 1.0):
        return True
    return bool(_step_turns(points).max() > max_turn_deg)


def _step_turns(points) -> np.ndarray:
    """Degrees between consecutive sample steps of a centre line (steps under 5 cm left out)."""
    d = np.diff(np.asarray(points, float).reshape(-1, 2), axis=0)
    n = np.hypot(*d.T) if len(d) else np.zeros(0)
    d, n = d[n >= 0.05], n[n >= 0.05]
    if len(d) < 2:
        return np.zeros(0)
    cos = (d[1:] * d[:-1]).sum(1) / np.maximum(n[1:] * n[:-1], 1e-12)
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def kinked_centre_line(points, min_turn_deg: float = KINK) -> bool:
    """A centre line that turns by more than ``min_turn_deg`` from one sample step to the next
    (but does not reverse: :func:`broken_centre_line`): the lane's width or offset jumps there, so
    a vehicle following it swings sideways into the next lane (esmini's mixed_roads: 64 degrees
    where a lane widens from 3 to 5 m at once)."""
    t = _step_turns(points)
    return bool(len(t) and t.max() > min_turn_deg)


def find_issues(records, text: str | None = None, short: dict | None = None,
                dropped: list[tuple] | None = None, arcs: list[str] | None = None,
                junctions: list[str] | None = None, lines: list[str] | None = None,
                nowhere: list[str] | None = None, joined: list[str] | None = None,
                merged: list[tuple] | None = None,
                direct: list[str] | None = None, ids: list[str] | None = None,
                borders: list[str] | None = None) -> dict[str, list[str]]:
    """Defects of a network: ``{kind: [description naming ids, ...]}`` for the kinds
    "dangling road links", "dangling junction connections", "zero-length lanes", "dangling lane
    successors", "successors that start away from the lane's end" (over 1 m), "successor links
    dropped" (``dropped``, from :func:`drop_broken_successors`; a lane's link to itself only where
    the file links its road to itself: the parser links a lane to itself where its road ends
    open, which is no defect of the file), "spirals of constant curvature
    read as arcs" (``arcs``, from :func:`drivemind.maps.opendrive.constant_spirals_as_arcs`),
    "arcs of zero curvature read as lines" (``lines``, from
    :func:`drivemind.maps.opendrive.flat_arcs_as_lines`), "lanes with points the parser puts
    nowhere" (``nowhere``, from :func:`drop_points_nowhere`), "road ends under a junction's
    lanes joined to that junction" (``joined``, from :func:`join_overlapped_ends`), "junctions
    whose lanes run over each other, merged" (``merged``, from
    :func:`merge_overlapping_junctions`), "direct junctions read as links between their roads'
    lanes" (``direct``, from :func:`drivemind.maps.opendrive.link_direct_connections`),
    "junctions sharing an id with a road, renumbered" (``junctions``, from
    :func:`drivemind.maps.opendrive.junction_ids_apart`), "roads and junctions whose ids are not
    plain numbers below 2^31, renumbered" (``ids``, from :func:`drivemind.maps.opendrive.numeric_ids`), "lanes
    given by their borders, read as widths" (``borders``, from
    :func:`drivemind.maps.opendrive.lane_borders_as_widths`),
    "lanes whose centre line jumps or turns back" (:func:`broken_centre_line`), lanes whose centre
    line kinks (:func:`kinked_centre_line`) and "junctions without connecting lanes" (only kinds
    with findings).

    ``records``: the loader's lane records; ``short``: lanes it spliced out for being shorter than
    one sample step, with their length (``{key: metres}``); ``text``: the OpenDRIVE XML."""
    issues: dict[str, list[str]] = {}
    root = None
    if text is not None:
        try:
            root = _without_namespace(ET.fromstring(text))
        except ET.ParseError:
            pass
    merged_ids = {j for group, _ in merged or () for j in group}
    merged = [f"junctions {', '.join(str(j) for j in group)} into junction {j}"
              for group, j in merged or ()]
    if dropped:
        # the parser's own link of a lane to itself at a road that ends open is no defect of the
        # file (its road links nowhere there): said only where the file links the road to itself
        own = _self_linked_roads(root) if root is not None else None
        dropped = [_link(*d) for d in dropped
                   if own is None or d[0] != d[1] or str(d[0][0]) in own]
    # what the loader repaired or left out, each named as it reported it
    for kind, found in (
            (f"successor links dropped, each starting over {BROKEN_SUCCESSOR} m from the lane's "
             f"end or linking a lane that is no ring to itself (traffic and routes would jump "
             f"there, or go round it for good)", dropped),
            ("spirals of constant curvature read as arcs (the CARLA parser draws them as straight "
             "lines, and the lanes after them jump back)", arcs),
            ("arcs of zero curvature read as lines (the CARLA parser divides by the curvature: "
             "their lanes have no position)", lines),
            ("roads and junctions whose ids are not plain numbers below 2^31, renumbered (the CARLA "
             "parser reads ids as numbers: roads named by strings land on one number and "
             "overwrite each other)", ids),
            ("junctions sharing an id with a road, renumbered (the CARLA parser mislinks the "
             "roads leading into such a junction)", junctions),
            ("roads whose lanes are given by their borders (<border>, which the CARLA parser "
             "reads as width 0), read as widths", borders),
            ("lanes with points the parser puts nowhere (NaN: a broken geometry record), those "
             "points left out", nowhere),
            ("road ends under a junction's lanes joined to that junction (its lanes ran over "
             "them: the traffic there now gives way as in the junction)", joined),
            ("junctions whose lanes run over each other, merged (their traffic gives way to "
             "each other as in one junction)", merged),
            ("direct junctions (OpenDRIVE 1.6 type=\"direct\", which the CARLA parser mostly "
             "rejects) read as links between their roads' lanes", direct)):
        if found:
            issues[kind] = list(found)
    back = [_lane(r.key) for r in records if broken_centre_line(r.points)]
    if back:
        issues["lanes whose centre line jumps or turns back (broken geometry: traffic on them "
               "jumps or overlaps)"] = back
    kinks = [_lane(r.key) for r in records
             if kinked_centre_line(r.points) and not broken_centre_line(r.points)]
    if kinks:
        issues[f"lanes whose centre line kinks (over {KINK:.0f} degrees from one 0.5 m step to the "
               f"next: a width or offset that jumps; vehicles on them swing into the next "
               f"lane)"] = kinks
    short = short or {}
    zero = [r.key for r in records if _length(r.points) < ZERO_LENGTH]
    zero += [k for k, length in short.items() if length < ZERO_LENGTH]
    if zero:
        issues["zero-length lanes"] = [_lane(k) for k in sorted(zero)]
    usable = {r.key for r in records} - set(zero)
    dangling = [f"{_lane(r.key)} -> {_lane(s)}" for r in records if r.key in usable
                for s in r.successors if s not in usable]
    if dangling:
        issues["dangling lane successors"] = dangling
    ends = {r.key: np.asarray(r.points, float).reshape(-1, 2) for r in records if r.key in usable}
    far = [_link(r.key, s, gap) for r, s, gap in _successor_gaps(records, ends) if gap > FAR_SUCCESSOR]
    if far:
        issues["successors that start away from the lane's end"] = far
    crossings = level_crossings([r for r in records if r.key in usable])
    if crossings:
        issues[f"pairs of lanes that cross outside any junction at the same level (within "
               f"{LEVEL:.0f} m of height; no junction ties them, so traffic on them does not "
               f"give way and meets)"] = crossings
    over = junction_overlaps([r for r in records if r.key in usable])
    if over:
        issues[f"junction lanes over a road that does not lead to or from them (within "
               f"{OVERLAP_NEAR} m of its centre line, more than {OVERLAP_END:.0f} m from its ends: "
               f"the cars queued there stand in the way of the turn)"] = over
    # (a junction merged into another had lanes: they are under the other's id now)
    lane_junctions = {r.junction for r in records if r.junction >= 0 and r.key in usable}
    lane_junctions |= merged_ids
    if root is not None:
        _xml_issues(root, lane_junctions, issues)
    return issues


def junction_overlaps(records, near: float = None, end_margin: float = None) -> list[str]:
    """Pairs (junction lane, lane outside junctions) whose centre lines come within ``near`` m
    (``OVERLAP_NEAR``: two cars side by side) of each other at points of the outer lane more
    than ``end_margin`` m (``OVERLAP_END``) from its ends, where the outer lane's road is not one
    the junction lane leads from or to and the two neither merge (a lane after both) nor part (a
    lane before both; CommonRoad's Town03 conversion joins a lane to a junction's exit so).
    scenariogeneration's junction_trippel_twoway: a connecting road runs 10 m over the end of
    another approach road, at 15 degrees, and the traffic on the two met 35-47 times in 600 s
    (the loader now joins such an end to the junction: :func:`join_overlapped_ends`).
    Same-level only where heights are known."""
    inner, outer, found = _overlaps(records, near, end_margin)
    return [f"{_lane(inner[a].key)} over {_lane(outer[b].key)}" for a, b in sorted(found)]


def _overlaps(records, near: float = None, end_margin: float = None):
    """(junction lanes, lanes outside junctions, {(index in the first, index in the second)})
    of the pairs :func:`junction_overlaps` names."""
    inner = [r for r in records if r.junction >= 0 and len(r.points) >= 2]
    outer = [r for r in records if r.junction < 0 and len(r.points) >= 2]
    preds = _predecessor_keys(records)
    found = set()
    for a, b in _near_pairs(inner, outer, near, end_margin):
        r, o = inner[a], outer[b]
        roads = ({r.key[0]} | {t[0] for t in r.successors}
                 | {k[0] for k in preds.get(r.key, ())})
        # a lane merging with the junction lane (the same lane after them) or leaving it (the
        # same lane before them) runs beside it by design
        if (o.key[0] not in roads and not set(o.successors) & set(r.successors)
                and not preds.get(o.key, set()) & preds.get(r.key, set())):
            found.add((a, b))
    return inner, outer, found


def _predecessor_keys(records) -> dict:
    """``{lane key: {keys of the lanes that link to it}}`` over ``records``."""
    preds: dict = {}
    for r in records:
        for t in r.successors:
            preds.setdefault(t, set()).add(r.key)
    return preds


def _near_pairs(first, second, near: float = None, end_margin: float = None,
                first_ends: bool = True) -> set[tuple[int, int]]:
    """Pairs (index in ``first``, index in ``second``) of lane records whose centre lines come
    within ``near`` m (``OVERLAP_NEAR``) of each other at the same level (heights within
    ``LEVEL``, where known), at points of the second lane more than ``end_margin`` m
    (``OVERLAP_END``) from its ends (and of the first lane too, unless ``first_ends``)."""
    near = OVERLAP_NEAR if near is None else near
    end_margin = OVERLAP_END if end_margin is None else end_margin
    found: set[tuple[int, int]] = set()
    if not first or not second:
        return found
    oxy, ozz, oown = [], [], []
    for k, r in enumerate(second):
        p = np.asarray(r.points, float)
        s = _arc(p)
        keep = (s > end_margin) & (s < s[-1] - end_margin)
        if keep.any():
            oxy.append(p[keep])
            z = _heights(r, len(p))
            ozz.append(z[keep] if z is not None else np.full(int(keep.sum()), np.nan))
            oown.append(np.full(int(keep.sum()), k))
    if not oxy:
        return found
    oxy, ozz, oown = np.concatenate(oxy), np.concatenate(ozz), np.concatenate(oown)
    cell = near
    okey = np.floor(oxy / cell).astype(np.int64)
    okey = okey[:, 0] * 1_000_003 + okey[:, 1]
    order = np.argsort(okey, kind="stable")
    sk = okey[order]
    for a, r in enumerate(first):
        p = np.asarray(r.points, float)
        z = _heights(r, len(p))
        if not first_ends:
            s = _arc(p)
            keep = (s > end_margin) & (s < s[-1] - end_margin)
            p, z = p[keep], None if z is None else z[keep]
        ij = np.floor(p / cell).astype(np.int64)
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                key = (ij[:, 0] + dx) * 1_000_003 + (ij[:, 1] + dy)
                lo, hi = np.searchsorted(sk, key, "left"), np.searchsorted(sk, key, "right")
                for q in np.flatnonzero(hi > lo):
                    cand = order[lo[q]:hi[q]]
                    d = np.hypot(*(oxy[cand] - p[q]).T)
                    ok = d < near
                    if z is not None:
                        ok &= ~(np.abs(ozz[cand] - z[q]) >= LEVEL)  # NaN height: counts
                    for b in np.unique(oown[cand[ok]]):
                        found.add((a, int(b)))
    return found


def merge_overlapping_junctions(records, near: float = None) -> list[tuple[tuple[int, ...], int]]:
    """Make one junction of two whose lanes run over each other at the same level (within
    ``near`` m, ``OVERLAP_NEAR``, away from their ends, and neither lane leading into the other
    nor the two leaving or joining the same lane): their traffic then gives way to each other
    (the conflict tables are built per junction; two junctions' lanes that cross were never
    compared, and cars on them met). CommonRoad's exports of real towns: DEU_Muehlhausen (118-142
    NPC contacts in 600 s) and USA_Lanker. Each merged junction takes the smallest id of its
    group. Changes ``records`` in place; returns the merges as ``(ids merged, id kept)``."""
    inner = [r for r in records if r.junction >= 0 and len(r.points) >= 2]
    preds = _predecessor_keys(records)
    parent: dict = {}

    def root(j):
        while parent.get(j, j) != j:
            j = parent[j]
        return j

    for a, b in _near_pairs(inner, inner, near, None, False):
        r, o = inner[a], inner[b]
        if r.junction == o.junction or o.key in r.successors or r.key in o.successors:
            continue
        if set(r.successors) & set(o.successors) or preds.get(r.key, set()) & preds.get(o.key, set()):
            continue
        ja, jb = root(r.junction), root(o.junction)
        if ja != jb:
            parent[max(ja, jb)] = min(ja, jb)
    if not parent:
        return []
    groups: dict = {}
    for j in parent:
        groups.setdefault(root(j), {root(j)}).add(j)
    for r in records:
        if r.junction in parent:
            r.junction = root(r.junction)
    return [(tuple(sorted(g)), j) for j, g in sorted(groups.items())]


def _arc(p: np.ndarray) -> np.ndarray:
    """Arc length at each point of a polyline."""
    return np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(p, axis=0).T))])


def _min_distance(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Per point of ``p``, the distance to the nearest point of ``q``."""
    out = np.empty(len(p))
    for i in range(0, len(p), 256):
        c = p[i:i + 256]
        out[i:i + 256] = np.hypot(c[:, None, 0] - q[None, :, 0], c[:, None, 1] - q[None, :, 1]).min(1)
    return out


def join_overlapped_ends(records, near: float = None, reach: float = JOIN_REACH,
                         margin: float = JOIN_MARGIN) -> list[str]:
    """Join to a junction the end of a road that its lanes run over (:func:`junction_overlaps`)
    where that stretch lies within ``reach`` m of the road's end at that junction: each driving
    lane of the road's lane section is cut ``margin`` m beyond the stretch, and the piece between
    the cut and the junction becomes a lane of the junction (key: the section id plus
    ``JOINED_SECTION``). Changes ``records`` in place; returns each road end joined, named.

    The junction then is what a driver sees: the traffic on the road's end and the traffic over
    it ask for ways through the same junction and give way to each other (the conflict tables
    find the overlap), where before a car queued at the road's end stood in the way of the turn
    (scenariogeneration's junction_trippel_twoway: 35-47 NPC contacts in 600 s). A stretch
    further from the road's end, or one at an end that does not lead to or from that junction,
    is left as it is and warned of. A piece joined may run over the start of a third road in
    turn (a road leaving the junction at a shallow angle): that one is joined in the next round,
    up to ``JOIN_ROUNDS``."""
    named: list[str] = []
    for _ in range(JOIN_ROUNDS):
        more = _join_round(records, near, reach, margin)
        if not more:
            break
        named += more
    return named


def _join_round(records, near, reach: float, margin: float) -> list[str]:
    """One round of :func:`join_overlapped_ends`."""
    inner, outer, found = _overlaps(records, near, OVERLAP_END)
    if not found:
        return []
    near = OVERLAP_NEAR if near is None else near
    by_key = {r.key: r for r in records}
    preds = _predecessor_keys(records)

    def touches(r, j: int, at_end: bool) -> bool:
        nxt = r.successors if at_end else preds.get(r.key, ())
        return any(t in by_key and by_key[t].junction == j for t in nxt)

    # the cut points: (road, section, junction) -> [(point, lane id sign, piece at the end)]
    cuts: dict = {}
    groups: dict = {}
    for a, b in found:
        groups.setdefault((b, inner[a].junction), []).append(a)
    for (b, j), group in sorted(groups.items()):
        o = outer[b]
        p = np.asarray(o.points, float)
        s = _arc(p)
        d = _min_distance(p, np.concatenate([np.asarray(inner[a].points, float) for a in group]))
        close = np.flatnonzero(d < near)
        lo, hi = s[close[0]], s[close[-1]]
        if touches(o, j, True) and s[-1] - lo <= reach:
            k = int(np.searchsorted(s, lo - margin))
            cuts.setdefault((o.key[0], o.key[1], j), []).append((p[max(k, 0)], o.key[2] > 0, True))
        elif touches(o, j, False) and hi <= reach:
            k = int(np.searchsorted(s, hi + margin))
            cuts.setdefault((o.key[0], o.key[1], j), []).append((p[min(k, len(p) - 1)],
                                                                  o.key[2] > 0, False))
    named = []
    for (road, section, j), where in sorted(cuts.items(), key=lambda kv: kv[0]):
        lanes = [r for r in records if r.key[0] == road and r.key[1] == section
                 and r.junction < 0 and len(r.points) >= 2]
        split: dict = {}  # key -> (index of the cut, piece at the end)
        for r in lanes:
            p = np.asarray(r.points, float)
            s = _arc(p)
            best = None
            for xy, forward, at_end in where:
                end = at_end if (r.key[2] > 0) == forward else not at_end
                if not touches(r, j, end):
                    continue
                k = int(np.argmin(np.hypot(*(p - xy).T)))
                piece = s[-1] - s[k] if end else s[k]
                if best is None or piece > best[0]:
                    best = (piece, k, end)
            if best is not None:
                split[r.key] = best[1:]
        if not split:
            continue
        new_key = {}
        for k in split:  # a road joined at both ends: a second piece, a second new section id
            nk = (road, section + JOINED_SECTION, k[2])
            while nk in by_key:
                nk = (road, nk[1] + JOINED_SECTION, k[2])
            new_key[k] = nk
        for key, (k, end) in split.items():
            r = by_key[key]
            p = np.asarray(r.points, float)
            s = _arc(p)
            rest = s[k] if end else s[-1] - s[k]
            if rest < 2.0 * margin or k in (0, len(p) - 1):
                # (almost) all of it under the junction: the whole lane joins it
                r.junction = j
                new_key[key] = key
                named.append(f"{_lane(key)}: all of it ({s[-1]:.1f} m)")
                continue
            z = None if r.z is None else _heights(r, len(p))
            for attr in ("width", "mark_left", "mark_right"):  # one value per point
                v = np.asarray(getattr(r, attr))
                if len(v) != len(p):
                    setattr(r, attr, _interp_attr(v, len(v), len(p)))
            head, tail = slice(0, k + 1), slice(k, len(p))
            jpart, opart = (tail, head) if end else (head, tail)
            piece = LaneRecord(
                key=new_key[key], points=p[jpart], width=np.asarray(r.width)[jpart],
                mark_left=np.asarray(r.mark_left)[jpart], mark_right=np.asarray(r.mark_right)[jpart],
                junction=j, successors=list(r.successors) if end else [key],
                z=None if z is None else z[jpart], speed_limit=r.speed_limit)
            r.points, r.width = p[opart], np.asarray(r.width)[opart]
            r.mark_left, r.mark_right = np.asarray(r.mark_left)[opart], np.asarray(r.mark_right)[opart]
            r.z = None if z is None else z[opart]
            if end:
                r.successors = [piece.key]
            else:
                for q in records:
                    q.successors = [piece.key if t == key else t for t in q.successors]
            records.append(piece)
            by_key[piece.key] = piece
            named.append(f"{_lane(key)}: its last {s[-1] - s[k]:.1f} m" if end
                         else f"{_lane(key)}: its first {s[k]:.1f} m")
        # the pieces' neighbours: the pieces beside them
        for key in split:
            piece = by_key[new_key[key]]
            if piece is by_key[key]:
                continue
            r = by_key[key]
            piece.left, piece.right = new_key.get(r.left), new_key.get(r.right)
    return named


def _heights(r, n: int):
    """A record's heights, one per centre-line point (None: not read)."""
    if r.z is None:
        return None
    z = np.asarray(r.z, float)
    if len(z) != n:  # points spliced in from a lane too short to keep
        z = np.interp(np.linspace(0.0, 1.0, n), np.linspace(0.0, 1.0, len(z)), z)
    return z


def _without_namespace(root):
    """``root`` with every tag's namespace taken off (RoadRunner writes ``<OpenDRIVE
    xmlns=...>``, and ``findall("road")`` found nothing in it), in place."""
    for el in root.iter():
        if isinstance(el.tag, str) and "}" in el.tag:
            el.tag = el.tag.rsplit("}", 1)[-1]
    return root


def _self_linked_roads(root) -> set[str]:
    """Ids of the roads whose own ``<link>`` names them as their predecessor or successor
    (``root``: the parsed OpenDRIVE, without namespaces)."""
    out = set()
    for road in root.iter("road"):
        for el in road.iter():
            if (el.tag in ("predecessor", "successor") and el.get("elementType") == "road"
                    and el.get("elementId") == road.get("id")):
                out.add(str(road.get("id")))
    return out


def level_crossings(records, near: float = 0.5, min_turn_deg: float = 20.0,
                    end_margin: float = 2.0) -> list[str]:
    """Pairs of lanes outside junctions, of different roads, whose centre lines cross at the same
    level: points of the two within ``near`` m of each other, more than ``min_turn_deg`` apart in
    heading, more than ``end_margin`` m from either lane's ends (where roads meet end to end) and
    within ``LEVEL`` m in height (a bridge passes higher). Lanes without heights (``z`` None) are
    left out. Maps converted from lanelets (CommonRoad's USA_Lanker, DEU_Muehlhausen) have such
    crossings with no junction, and the traffic on them met (55-130 contacts in 600 s)."""
    recs = [r for r in records if r.junction < 0 and r.z is not None and len(r.points) >= 2]
    if len(recs) < 2:
        return []
    xy, zz, hd, owner = [], [], [], []
    for k, r in enumerate(recs):
        p = np.asarray(r.points, float)
        z, s = _heights(r, len(p)), _arc(p)
        inside = (s > end_margin) & (s < s[-1] - end_margin)
        if not inside.any():
            continue
        h = np.arctan2(*np.diff(p, axis=0)[:, ::-1].T)
        h = np.concatenate([h, h[-1:]])
        xy.append(p[inside]), zz.append(z[inside]), hd.append(h[inside])
        owner.append(np.full(int(inside.sum()), k))
    if len(xy) < 2:
        return []
    xy, zz, hd, owner = (np.concatenate(a) for a in (xy, zz, hd, owner))
    road = np.array([r.key[0] for r in recs])[owner]
    found: set[tuple[int, int]] = set()
    cell = 4.0 * near
    for sx, sy in ((0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (0.5, 0.5)):  # shifted grids: a close
        # pair shares a cell in one of them
        ij = np.floor(xy / cell + (sx, sy)).astype(np.int64)
        key = ij[:, 0] * 1_000_003 + ij[:, 1]
        order = np.argsort(key, kind="stable")
        ks = key[order]
        starts = np.flatnonzero(np.concatenate([[True], ks[1:] != ks[:-1]]))
        ends = np.concatenate([starts[1:], [len(ks)]])
        for a, b in zip(starts[ends - starts > 1], ends[ends - starts > 1]):
            idx = order[a:b]
            if len(set(road[idx].tolist())) < 2:
                continue
            d = np.hypot(xy[idx, None, 0] - xy[None, idx, 0], xy[idx, None, 1] - xy[None, idx, 1])
            turn = np.abs(np.angle(np.exp(1j * (hd[idx, None] - hd[None, idx]))))
            hit = ((d < near) & (road[idx, None] != road[None, idx])
                   & (turn > math.radians(min_turn_deg))
                   & (np.abs(zz[idx, None] - zz[None, idx]) < LEVEL))
            for u, v in zip(*np.nonzero(np.triu(hit))):
                found.add(tuple(sorted((int(owner[idx[u]]), int(owner[idx[v]])))))
    return [f"{_lane(recs[a].key)} x {_lane(recs[b].key)}" for a, b in sorted(found)]


def _xml_issues(root, lane_junctions: set[int], issues: dict[str, list[str]]) -> None:
    roads = {r.get("id") for r in root.findall("road")}
    junctions = {j.get("id") for j in root.findall("junction")}
    links = []
    for r in root.findall("road"):
        link = r.find("link")
        for end in (link if link is not None else ()):
            if end.tag not in ("predecessor", "successor"):
                continue
            kind, target = end.get("elementType", "road"), end.get("elementId")
            known = junctions if kind == "junction" else roads
            if target not in known:
                links.append(f"road {r.get('id')} {end.tag} -> {kind} {target} (no such {kind})")
    if links:
        issues["dangling road links"] = links
    conns, empty = [], []
    for j in root.findall("junction"):
        cs = j.findall("connection")
        for c in cs:
            for attr in ("incomingRoad", "connectingRoad"):
                if c.get(attr) is not None and c.get(attr) not in roads:
                    conns.append(f"junction {j.get('id')} connection {c.get('id')}: {attr} "
                                 f"{c.get(attr)} (no such road)")
        try:
            jid = int(j.get("id"))
        except (TypeError, ValueError):
            jid = None
        # a junction that routes traffic has connections and driving lanes inside it; one with
        # connections but no driving lane (e.g. only sidewalks) is not a defect
        if not cs:
            empty.append(f"junction {j.get('id')} ({j.get('name') or 'unnamed'}): no <connection>")
        elif jid is not None and jid not in lane_junctions and any(
                c.get("connectingRoad") in roads for c in cs) and _has_driving(root, cs):
            empty.append(f"junction {j.get('id')} ({j.get('name') or 'unnamed'}): its connecting "
                         f"roads have driving lanes but none was loaded")
    if conns:
        issues["dangling junction connections"] = conns
    if empty:
        issues["junctions without connecting lanes"] = empty


def _has_driving(root, connections) -> bool:
    ids = {c.get("connectingRoad") for c in connections}
    for r in root.findall("road"):
        if r.get("id") in ids and any(ln.get("type") == "driving" for ln in r.iter("lane")):
            return True
    return False


def warn_issues(records, text: str | None, where: str, **repairs) -> dict[str, list[str]]:
    """Emit one :class:`MapWarning` per kind of defect (naming up to 8 ids); return them all.
    ``repairs``: what the loader repaired or left out, :func:`find_issues`' keyword arguments."""
    issues = find_issues(records, text, **repairs)
    for kind, items in issues.items():
        msg = f"{where}: {len(items)} {kind}: {_named(items)}"
        warnings.warn(msg, MapWarning, stacklevel=3)
    return issues
