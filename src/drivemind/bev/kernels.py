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


@nb.njit(cache=True)
def gather_static(raster, ox, oy, rppm, ex, ey, eyaw, size, ppm, bottom, out, road_plane, lane_plane):
    """Sample the town raster (bit 1 road, bit 2 solid marking, bit 4 broken marking) into the
    view: ``out[road_plane]`` gets 255 on road, ``out[lane_plane]`` 255 solid / 120 broken."""
    cy = math.cos(eyaw)
    sy = math.sin(eyaw)
    nv, nu = raster.shape
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
        for c in range(size):
            if u >= 0.0 and v >= 0.0:
                iu = int(u)
                iv = int(v)
                if iu < nu and iv < nv:
                    b = raster[iv, iu]
                    if b:
                        if road_plane >= 0 and (b & 1):
                            out[road_plane, r, c] = 255
                        if lane_plane >= 0:
                            if b & 2:
                                out[lane_plane, r, c] = 255
                            elif b & 4:
                                out[lane_plane, r, c] = 120
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
