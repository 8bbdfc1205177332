"""Numba kernels of the BEV renderer. All work in the output image's pixel frame.

Pixel frame: row 0 at the top; the ego's reference point sits at column ``size / 2`` and row
``size - bottom`` (continuous coordinates, pixel ``(r, c)`` covers ``[r, r+1) x [c, c+1)``); the
ego faces up (decreasing rows) and its right-hand side is to the right (increasing columns).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np


@nb.njit(cache=True, inline="always")
def _to_px(x, y, ex, ey, cy, sy, ppm, half, row0):
    dx = x - ex
    dy = y - ey
    fwd = dx * cy + dy * sy
    right = -dx * sy + dy * cy
    return row0 - fwd * ppm, half + right * ppm  # row, col


@nb.njit(cache=True, inline="always")
def _put_static(out, r, c, b, road_plane, lane_plane):
    if road_plane >= 0 and (b & 1):
        out[road_plane, r, c] = 255
    if lane_plane >= 0:
        if b & 2:
            out[lane_plane, r, c] = 255
        elif b & 4:
            out[lane_plane, r, c] = 120


@nb.njit(cache=True)
def gather_static(tiles, tile_of, shift, nv, nu, ox, oy, rppm, ex, ey, eyaw, size, ppm, bottom, out,
                  road_plane, lane_plane):
    """Sample the town raster (bit 1 road, bit 2 solid marking, bit 4 broken marking; in tiles of
    2**shift px, raster.TownRaster: ``tile_of[tv, tu]`` the tile's index in ``tiles``, negative
    for none; (nv, nu) pixels in all; a raster drawn whole is the one tile 0) into the view:
    ``out[road_plane]`` gets 255 on road, ``out[lane_plane]`` 255 solid / 120 broken."""
    cy = math.cos(eyaw)
    sy = math.sin(eyaw)
    mask = (1 << shift) - 1
    whole = tile_of.shape[0] == 1 and tile_of.shape[1] == 1 and tile_of[0, 0] == 0
    raster = tiles[0]
    half = size / 2.0
    row0 = size - bottom
    for r in range(size):
        fwd = (row0 - (r + 0.5)) / ppm
        # world point of pixel (r, 0) and the step per column
        right0 = (0.5 - half) / ppm
        x = ex + fwd * cy - right0 * sy
        y = ey + fwd * sy + right0 * cy
        u = (x - ox) * rppm
        v = (y - oy) * rppm
        du = -sy / ppm * rppm
        dv = cy / ppm * rppm
        if whole:
            for c in range(size):
                if u >= 0.0 and v >= 0.0:
                    iu = int(u)
                    iv = int(v)
                    if iu < nu and iv < nv:
                        b = raster[iv, iu]
                        if b:
                            _put_static(out, r, c, b, road_plane, lane_plane)
                u += du
                v += dv
        else:
            for c in range(size):
                if u >= 0.0 and v >= 0.0:
                    iu = int(u)
                    iv = int(v)
                    if iu < nu and iv < nv:
                        t = tile_of[iv >> shift, iu >> shift]
                        if t >= 0:
                            b = tiles[t, iv & mask, iu & mask]
                            if b:
                                _put_static(out, r, c, b, road_plane, lane_plane)
                u += du
                v += dv


@nb.njit(cache=True)
def draw_boxes(plane, value, pos, yaw, ext, select, scale, ex, ey, eyaw, size, ppm, bottom):
    """Fill oriented boxes (centre ``pos``, heading ``yaw``, half-extents ``ext`` x ``scale``) of
    the rows where ``select`` is true into ``plane``. Returns how many boxes touched the view."""
    cy = math.cos(eyaw)
    sy = math.sin(eyaw)
    half = size / 2.0
    row0 = size - bottom
    drawn = 0
    reach = size / ppm * 1.5
    for k in range(pos.shape[0]):
        if not select[k]:
            continue
        ax = pos[k, 0]
        ay = pos[k, 1]
        if abs(ax - ex) > reach or abs(ay - ey) > reach:
            continue
        hl = ext[k, 0] * scale
        hw = ext[k, 1] * scale
        pr, pc = _to_px(ax, ay, ex, ey, cy, sy, ppm, half, row0)
        rad = math.sqrt(hl * hl + hw * hw) * ppm + 1.0
        r_lo = max(int(math.floor(pr - rad)), 0)
        r_hi = min(int(math.ceil(pr + rad)), size - 1)
        c_lo = max(int(math.floor(pc - rad)), 0)
        c_hi = min(int(math.ceil(pc + rad)), size - 1)
        if r_lo > r_hi or c_lo > c_hi:
            continue
        # the box's axes in the pixel frame: rel heading = actor yaw - ego yaw; forward is -row
        rel = yaw[k] - eyaw
        cr = math.cos(rel)
        sr = math.sin(rel)
        hit = False
        for r in range(r_lo, r_hi + 1):
            fwd = (pr - (r + 0.5)) / ppm  # ego-frame forward offset from the actor centre
            for c in range(c_lo, c_hi + 1):
                right = ((c + 0.5) - pc) / ppm
                lon = fwd * cr + right * sr
                lat = -fwd * sr + right * cr
                if abs(lon) <= hl and abs(lat) <= hw:
                    plane[r, c] = value
                    hit = True
        if hit:
            drawn += 1
    return drawn


@nb.njit(cache=True)
def draw_segments(plane, seg, vals, width_px, ex, ey, eyaw, size, ppm, bottom):
    """Thick line segments ``seg`` (K, 2, 2) in world metres, ``width_px`` wide; segment k is
    painted with ``vals[k]`` (0 = skip)."""
    cy = math.cos(eyaw)
    sy = math.sin(eyaw)
    half = size / 2.0
    row0 = size - bottom
    hw = width_px / 2.0
    hw2 = hw * hw
    for k in range(seg.shape[0]):
        value = vals[k]
        if value == 0:
            continue
        r0, c0 = _to_px(seg[k, 0, 0], seg[k, 0, 1], ex, ey, cy, sy, ppm, half, row0)
        r1, c1 = _to_px(seg[k, 1, 0], seg[k, 1, 1], ex, ey, cy, sy, ppm, half, row0)
        r_lo = max(int(math.floor(min(r0, r1) - hw)), 0)
        r_hi = min(int(math.ceil(max(r0, r1) + hw)), size - 1)
        c_lo = max(int(math.floor(min(c0, c1) - hw)), 0)
        c_hi = min(int(math.ceil(max(c0, c1) + hw)), size - 1)
        if r_lo > r_hi or c_lo > c_hi:
            continue
        dr = r1 - r0
        dc = c1 - c0
        L2 = dr * dr + dc * dc
        for r in range(r_lo, r_hi + 1):
            pr = r + 0.5 - r0
            for c in range(c_lo, c_hi + 1):
                pc = c + 0.5 - c0
                t = 0.0
                if L2 > 1e-12:
                    t = (pr * dr + pc * dc) / L2
                    t = min(max(t, 0.0), 1.0)
                qr = pr - t * dr
                qc = pc - t * dc
                if qr * qr + qc * qc <= hw2:
                    plane[r, c] = value


@nb.njit(cache=True)
def draw_polyline(plane, value, pts, width_px, ex, ey, eyaw, size, ppm, bottom):
    """A thick polyline through ``pts`` (N, 2) world metres."""
    n = pts.shape[0]
    m = max(n - 1, 1)
    seg = np.empty((m, 2, 2))
    for i in range(m):
        seg[i, 0] = pts[i]
        seg[i, 1] = pts[min(i + 1, n - 1)]
    vals = np.full(m, value, np.uint8)
    draw_segments(plane, seg, vals, width_px, ex, ey, eyaw, size, ppm, bottom)


@nb.njit(cache=True)
def light_values(seg_light, states, palette, out):
    """Per stop-line segment: the palette value of its light's state."""
    for k in range(seg_light.shape[0]):
        st = states[seg_light[k]]
        out[k] = palette[st] if st < palette.shape[0] else 0


@nb.njit(cache=True)
def colorize(masks, order, lut, paint, out):
    """Paint ``out`` (H, W, 3) plane by plane in ``order`` (later planes on top): a pixel whose
    value ``m`` in plane ``p`` has ``paint[p, m]`` takes colour ``lut[p, m]``."""
    H = out.shape[0]
    W = out.shape[1]
    for k in range(order.shape[0]):
        p = order[k]
        for r in range(H):
            for c in range(W):
                m = masks[p, r, c]
                if m != 0 and paint[p, m]:
                    out[r, c, 0] = lut[p, m, 0]
                    out[r, c, 1] = lut[p, m, 1]
                    out[r, c, 2] = lut[p, m, 2]


@nb.njit(cache=True)
def _interp(x, xp, fp):
    """np.interp for one point (the same arithmetic: slope * (x - xp[j]) + fp[j])."""
    n = len(xp)
    if x <= xp[0]:
        return fp[0]
    if x >= xp[n - 1]:
        return fp[n - 1]
    lo, hi = 0, n - 1  # xp[lo] <= x < xp[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if xp[mid] <= x:
            lo = mid
        else:
            hi = mid
    if xp[lo] == x:
        return fp[lo]
    slope = (fp[lo + 1] - fp[lo]) / (xp[lo + 1] - xp[lo])
    return slope * (x - xp[lo]) + fp[lo]


@nb.njit(cache=True)
def corridor_path(waypoints, s, rng, step):
    """The readout's path (``bev.corridor.CorridorReadout.path``): points every ``step`` m along
    ego -> ``waypoints`` (n x 2, forward / right in metres), extended to the edge of the view
    (``rng`` m), and the unit normal pointing right at each. Returns (points, normals), len(s) x 2."""
    n = waypoints.shape[0]
    pts = np.empty((n + 2, 2))
    pts[0, 0] = 0.0
    pts[0, 1] = 0.0
    m = 1
    px, py = 0.0, 0.0  # the previous waypoint (not the previous kept one), as np.diff before the filter
    for i in range(n):
        x, y = waypoints[i, 0], waypoints[i, 1]
        if math.hypot(x - px, y - py) > 1e-6:
            pts[m, 0] = x
            pts[m, 1] = y
            m += 1
        px, py = x, y
    if m < 2:  # no route ahead: straight on
        pts[1, 0] = rng
        pts[1, 1] = 0.0
        m = 2
    cum = np.empty(n + 2)
    cum[0] = 0.0
    for i in range(1, m):
        cum[i] = cum[i - 1] + math.hypot(pts[i, 0] - pts[i - 1, 0], pts[i, 1] - pts[i - 1, 1])
    if cum[m - 1] < rng:  # extend the last segment to the edge of the view
        dx, dy = pts[m - 1, 0] - pts[m - 2, 0], pts[m - 1, 1] - pts[m - 2, 1]
        h = math.hypot(dx, dy)
        ext = rng - cum[m - 1] + step
        pts[m, 0] = pts[m - 1, 0] + dx / h * ext
        pts[m, 1] = pts[m - 1, 1] + dy / h * ext
        cum[m] = rng + step
        m += 1
    k = len(s)
    f = np.empty(k)
    r = np.empty(k)
    for i in range(k):
        f[i] = _interp(s[i], cum[:m], pts[:m, 0])
        r[i] = _interp(s[i], cum[:m], pts[:m, 1])
    p = np.empty((k, 2))
    nrm = np.empty((k, 2))
    for i in range(k):  # np.gradient: central differences inside, one-sided at the ends
        if k < 2:
            tf, tr = 0.0, 0.0
        elif i == 0:
            tf, tr = f[1] - f[0], r[1] - r[0]
        elif i == k - 1:
            tf, tr = f[k - 1] - f[k - 2], r[k - 1] - r[k - 2]
        else:
            tf, tr = (f[i + 1] - f[i - 1]) / 2.0, (r[i + 1] - r[i - 1]) / 2.0
        h = max(math.hypot(tf, tr), 1e-9)
        p[i, 0] = f[i]
        p[i, 1] = r[i]
        nrm[i, 0] = -tr / h
        nrm[i, 1] = tf / h
    return p, nrm


@nb.njit(cache=True, inline="always")
def _band_pixel(p, nrm, i, off, row0, size, ppm):
    """Row, column of the band sample at path point ``i`` and offset ``off``, or (-1, -1) out of view."""
    fwd = p[i, 0] + nrm[i, 0] * off
    right = p[i, 1] + nrm[i, 1] * off
    row = int(math.floor(row0 - fwd * ppm))
    col = int(math.floor(size / 2.0 + right * ppm))
    if row < 0 or row >= size or col < 0 or col >= size:
        return -1, -1
    return row, col


@nb.njit(cache=True)
def _first_set(bev, plane, p, nrm, s, offs, start, row0, size, ppm):
    """Index of the first path point beyond ``start`` m whose band samples show a set pixel of
    ``plane`` (-1: none) and the largest pixel value on that row."""
    for i in range(len(s)):
        if s[i] <= start:
            continue
        best = 0
        for off in offs:
            row, col = _band_pixel(p, nrm, i, off, row0, size, ppm)
            if row >= 0 and bev[plane, row, col] > best:
                best = bev[plane, row, col]
        if best > 0:
            return i, best
    return -1, 0


@nb.njit(cache=True)
def _band_share(bev, plane, p, nrm, lo, hi, offs, row0, size, ppm):
    """Share of the band samples of path points lo..hi-1 where ``plane`` is set."""
    hits = 0
    for i in range(lo, hi):
        for off in offs:
            row, col = _band_pixel(p, nrm, i, off, row0, size, ppm)
            if row >= 0 and bev[plane, row, col] > 0:
                hits += 1
    return hits / ((hi - lo) * len(offs))


@nb.njit(cache=True)
def corridor_read(bev, waypoints, s, lane_off, wide_off, planes, row0, size, ppm, rng, step,
                  ego_half_length, prev_dt, bin_lo, bin_hi, yellow, red, out):
    """``bev.corridor.CorridorReadout.read`` into ``out`` (float32, its ``names``): ``planes``
    = (vehicle now, vehicle before or -1, walker now, light now); a light value below ``yellow``
    reads as green."""
    p, nrm = corridor_path(waypoints, s, rng, step)
    span = rng - ego_half_length
    veh, prev, walker, light = planes[0], planes[1], planes[2], planes[3]
    i, _ = _first_set(bev, veh, p, nrm, s, lane_off, ego_half_length, row0, size, ppm)
    out[1] = 0.0
    out[2] = 0.0
    if i >= 0:
        out[0] = (s[i] - ego_half_length) / span
        out[1] = 1.0
        if prev >= 0:
            j, _ = _first_set(bev, prev, p, nrm, s, lane_off, ego_half_length, row0, size, ppm)
            if j >= 0:
                out[2] = min(max((s[i] - s[j]) / prev_dt / 10.0, -1.0), 1.0)
    else:
        out[0] = 1.0
    i, _ = _first_set(bev, walker, p, nrm, s, wide_off, ego_half_length, row0, size, ppm)
    if i >= 0:
        out[3] = (s[i] - ego_half_length) / span
        out[4] = 1.0
    else:
        out[3] = 1.0
        out[4] = 0.0
    # the first stop line from the reference point on (one under the bonnet still holds it)
    i, v = _first_set(bev, light, p, nrm, s, lane_off, -1.0, row0, size, ppm)
    out[6] = 0.0
    out[7] = 0.0
    out[8] = 0.0
    if i >= 0:
        out[5] = (s[i] - ego_half_length) / span
        out[6] = 1.0 if v >= red else 0.0
        out[7] = 1.0 if yellow <= v < red else 0.0
        out[8] = 1.0 if 0 < v < yellow else 0.0
    else:
        out[5] = 1.0
    nb_ = len(bin_lo)
    for b in range(nb_):
        lane_share, wide_share = 0.0, 0.0
        if bin_hi[b] > bin_lo[b]:
            lane_share = _band_share(bev, veh, p, nrm, bin_lo[b], bin_hi[b], lane_off, row0, size, ppm)
            wide_share = _band_share(bev, veh, p, nrm, bin_lo[b], bin_hi[b], wide_off, row0, size, ppm)
        out[9 + b] = lane_share
        out[9 + nb_ + b] = wide_share
