"""A one-lane roundabout of four junctions joined by short ring links, built from LaneRecords for
tests (traffic.junction_chain)."""

from __future__ import annotations

import math

import numpy as np

from drivemind.maps.roadmap import LaneRecord, build_roadmap


def _rec(key, pts, junction=-1, succ=()):
    n = len(pts)
    none = np.zeros(n, np.uint8)
    return LaneRecord(key=key, points=np.asarray(pts, float), width=np.full(n, 3.5),
                      mark_left=none, mark_right=none, junction=junction, successors=list(succ))


def _arc(r, a0, a1, step=0.5):
    n = max(2, int(round(abs(a1 - a0) * r / step)) + 1)
    a = np.linspace(a0, a1, n)
    return np.stack([r * np.cos(a), r * np.sin(a)], 1)


def _bezier(p0, t0, p1, t1, step=0.5):
    """A cubic from p0, leaving along the unit vector t0, to p1, arriving along t1, resampled
    every ``step`` m."""
    p0, p1, t0, t1 = map(np.asarray, (p0, p1, t0, t1))
    d = np.linalg.norm(p1 - p0) / 3.0
    c = [p0, p0 + d * t0, p1 - d * t1, p1]
    u = np.linspace(0, 1, 200)[:, None]
    pts = (1 - u) ** 3 * c[0] + 3 * (1 - u) ** 2 * u * c[1] + 3 * (1 - u) * u * u * c[2] + u ** 3 * c[3]
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    s = np.concatenate([[0], np.cumsum(seg)])
    n = max(2, int(round(s[-1] / step)) + 1)
    si = np.linspace(0, s[-1], n)
    return np.stack([np.interp(si, s, pts[:, 0]), np.interp(si, s, pts[:, 1])], 1)


def roundabout(radius=20.0, half=0.5, arm=60.0, name="ring"):
    """A one-lane roundabout of radius ``radius`` m, driven anticlockwise, with four junctions
    (each spanning ``half`` rad either side of its arm) joined by ring links, and four two-way
    arms ``arm`` m long whose outbound lanes end open (vehicles leave there and come back at a
    spawn point). Lanes (one per name, k = 0..3): ``in{k}`` (the arm into junction k),
    ``entry{k}`` (from it onto the ring), ``cont{k}`` (the ring through junction k), ``link{k}``
    (the ring from junction k to junction k+1), ``exit{k}`` (off the ring at junction k) and
    ``out{k}``. Returns (roadmap, lane index by name)."""
    recs, keys = [], {}
    for k in range(4):
        keys[f"link{k}"] = (100 + k, 0, -1)
        keys[f"cont{k}"] = (200 + k, 0, -1)
        keys[f"entry{k}"] = (300 + k, 0, -1)
        keys[f"exit{k}"] = (400 + k, 0, -1)
        keys[f"in{k}"] = (500 + k, 0, -1)
        keys[f"out{k}"] = (600 + k, 0, -1)
    for k in range(4):
        phi = k * math.pi / 2
        nxt = (k + 1) % 4
        a_in, a_out = phi - half, phi + half
        # the link from junction k to junction k+1
        recs.append(_rec(keys[f"link{k}"], _arc(radius, a_out, (k + 1) * math.pi / 2 - half),
                         succ=[keys[f"cont{nxt}"], keys[f"exit{nxt}"]]))
        recs.append(_rec(keys[f"cont{k}"], _arc(radius, a_in, a_out), junction=k,
                         succ=[keys[f"link{k}"]]))
        radial = np.array([math.cos(phi), math.sin(phi)])
        tang = np.array([-math.sin(phi), math.cos(phi)])  # anticlockwise
        # arms: inbound on the downstream side (+tang), outbound upstream (-tang)
        p_in_end = radial * (radius + 12.0) + tang * 2.5
        p_out_start = radial * (radius + 12.0) - tang * 2.5
        steps = int(arm / 0.5) + 1
        recs.append(_rec(keys[f"in{k}"], np.linspace(p_in_end + radial * arm, p_in_end, steps),
                         succ=[keys[f"entry{k}"]]))
        recs.append(_rec(keys[f"out{k}"], np.linspace(p_out_start, p_out_start + radial * arm, steps)))
        pe = np.array([radius * math.cos(a_out), radius * math.sin(a_out)])
        te = np.array([-math.sin(a_out), math.cos(a_out)])
        recs.append(_rec(keys[f"entry{k}"], _bezier(p_in_end, -radial, pe, te), junction=k,
                         succ=[keys[f"link{k}"]]))
        px = np.array([radius * math.cos(a_in), radius * math.sin(a_in)])
        tx = np.array([-math.sin(a_in), math.cos(a_in)])
        recs.append(_rec(keys[f"exit{k}"], _bezier(px, tx, p_out_start, radial), junction=k,
                         succ=[keys[f"out{k}"]]))
    rm = build_roadmap(name, recs)
    return rm, {n: rm.keys.index(v) for n, v in keys.items()}
