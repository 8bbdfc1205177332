"""Compiled inner loops of the embedded simulator (numba, cached on disk after the first run).

Each function is a plain loop over arrays so that one world step costs tens of microseconds.
They are deterministic: all randomness comes in as arrays drawn from the world's Generator.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

INF = 1e9
PATH_EXTEND = 4  # a path is run on to at most this many times its lanes (walker and room checks)
MERGE_ROOM = 1.0  # m: the room a vehicle letting another in (traffic.merge_yield) leaves beyond s0
FORCED_LC_REACH = 30.0  # m past a lane's end within which a forced lane change (merge_yield) also
#                      reads the vehicles on the lanes it leads to
EGO_CIRCLES = 3  # circles covering the ego's box, as the traffic sees it
WALKER_GIVE_UP = 3.0  # s a crossing walker waits in front of a vehicle before it turns back
NO_BLOCKER = -1  # codes of traffic_step's ``blocker`` other than a vehicle's index
BLOCKED_OTHER = -2  # a walker, or a lane's tapered end
BLOCKED_LIGHT = -3  # a red or yellow light
BLOCKED_EGO = -4  # the ego
# two vehicles on lanes outside junctions whose headings differ by more than this (|cos| below it,
# about 45 degrees) cross on two levels (a bridge: the map is flat here): no contact, no waiting
GRADE_SEPARATED_COS = 0.7
STARVE_WAIT = 15.0  # s a vehicle waits for its junction before crossing ways stop being granted
EGO_TURN_HOLD = 30.0  # s no way crossing the ego's is granted once the ego has its turn at a
#                       junction (traffic.ego_turn; world.LiteWorld._ego_turn)
# overtaking in the oncoming lane (traffic.overtake; :func:`overtakes`)
OTK_OFF, OTK_OUT, OTK_BACK, OTK_FALL = 0, 1, 2, 3  # overtake states (world.v_otk)
OVERTAKE_END = 20.0  # m: an overtake must be back in its lane this far before the lane's end
OVERTAKE_SLOWER = 2.5  # m/s: a leader whose desired speed is at least this much below ours is slow
OVERTAKE_REACH = 20.0  # m: a slow leader is overtaken from at most this gap behind it
OVERTAKE_STAND = 5.0  # s a leader with nothing ahead of it has stood before it is overtaken
OVERTAKE_MARGIN_T = 2.0  # s of an oncoming vehicle's travel added to the manoeuvre's time ...
OVERTAKE_MARGIN_M = 10.0  # ... and metres added to the stretch that must be free of it
OVERTAKE_SIDE = 0.3  # m clear sideways between the two before the leader is no longer followed
OVERTAKE_SOLID_SPEED = 4.47  # m/s (10 mph): a bicycle at most this fast may be overtaken over a
#                              solid line (traffic.overtake_solid; the UK Highway Code, rule 129)


@nb.njit(cache=True, inline="always")
def lane_pose(offset, ds, length, pts, yaw, lane, s):
    if s < 0.0:
        s = 0.0
    if s > length[lane]:
        s = length[lane]
    n = offset[lane + 1] - offset[lane]
    f = s / ds[lane] if ds[lane] > 0 else 0.0
    i = int(f)
    if i > n - 2:
        i = n - 2
    t = f - i
    a = offset[lane] + i
    x = pts[a, 0] * (1.0 - t) + pts[a + 1, 0] * t
    y = pts[a, 1] * (1.0 - t) + pts[a + 1, 1] * t
    return x, y, yaw[a]


@nb.njit(cache=True)
def _along(offset, ds, length, pts, yaw, lane, s_guess, x, y):
    """The arc length on ``lane`` nearest the point (x, y), found from ``s_guess`` by projection
    steps on the lane's heading (a few at most: lanes beside each other run nearly parallel)."""
    s = min(max(s_guess, 0.0), length[lane])
    for _ in range(4):
        px, py, h = lane_pose(offset, ds, length, pts, yaw, lane, s)
        d = (x - px) * math.cos(h) + (y - py) * math.sin(h)
        s2 = min(max(s + d, 0.0), length[lane])
        if abs(s2 - s) < 0.01:
            return s2
        s = s2
    return s


@nb.njit(cache=True)
def _place_beside(offset, ds, length, pts, yaw, lane, s, lat, target, project):
    """Where a vehicle at arc length ``s`` of ``lane``, ``lat`` m off its centre line, is along
    the lane ``target`` beside it (traffic.lane_change_place): project, the arc length of target
    nearest its place; else the arc length scaled by the two lanes' lengths (the rule before:
    off by up to 3 m where the lanes curve one way, then the other, so that a vehicle changing
    lanes moved along by as much and read a car ahead in the lane it left as metres further)."""
    st = s * length[target] / max(length[lane], 1e-3)
    if not project:
        return st
    x, y, h = lane_pose(offset, ds, length, pts, yaw, lane, s)
    return _along(offset, ds, length, pts, yaw, target, st, x - lat * math.sin(h),
                  y + lat * math.cos(h))


@nb.njit(cache=True)
def _ego_beside(x, y, h, lat, hl, hw, step, ego_xy, ego_yaw, ego_hl, ego_hw):
    """Whether the ego's box lies beside a vehicle changing lanes (centre line pose x, y, h of its
    new lane, ``lat`` m off it to the left) on the side it drifts to, within its length, and
    nearer than ``step`` + 0.3 m sideways to its box: a step over would bring them together."""
    cx = x - lat * math.sin(h)  # where the vehicle is now
    cy = y + lat * math.cos(h)
    dx, dy = ego_xy[0] - cx, ego_xy[1] - cy
    along = dx * math.cos(h) + dy * math.sin(h)
    left = -dx * math.sin(h) + dy * math.cos(h)  # the ego's offset to the vehicle's left
    if left * lat > 0.0:
        return False  # the ego is on the side it drifts away from
    de = ego_yaw - h
    ego_along = abs(ego_hl * math.cos(de)) + abs(ego_hw * math.sin(de))
    ego_side = abs(ego_hl * math.sin(de)) + abs(ego_hw * math.cos(de))
    if abs(along) > hl + ego_along:
        return False
    return abs(left) - hw - ego_side < step + 0.3


@nb.njit(cache=True)
def _oncoming_at(offset, ds, length, pts, yaw, lane, s, target, project):
    """Where a vehicle at arc length ``s`` of ``lane`` is along ``target``, the lane beside it
    running the other way (an overtake's oncoming lane): project, the arc length of target nearest
    its place on its lane's centre line; else its distance from its lane's end scaled by the two
    lanes' lengths (the rule before: on a curved road, whose two sides differ in length, off by up
    to 3 m, and a vehicle out overtaking drove into the one coming the other way, Town07)."""
    st = (length[lane] - s) * length[target] / max(length[lane], 1e-3)
    if not project:
        return st
    x, y, _ = lane_pose(offset, ds, length, pts, yaw, lane, s)
    return _along(offset, ds, length, pts, yaw, target, st, x, y)


@nb.njit(cache=True)
def poses(offset, ds, length, pts, yaw, lanes, s, out_xy, out_yaw):
    for i in range(lanes.shape[0]):
        x, y, h = lane_pose(offset, ds, length, pts, yaw, lanes[i], s[i])
        out_xy[i, 0] = x
        out_xy[i, 1] = y
        out_yaw[i] = h


@nb.njit(cache=True)
def junction_lanes_near(origin, cell, nx, ny, start, items, pts, yaw, point_lane, junction, x, y,
                        qyaw, max_dyaw, radius, out):
    """The junction lanes with a centre-line point within ``radius`` of (x, y) heading within
    ``max_dyaw`` of ``qyaw`` (where connectors overlap, a vehicle may be on any of them), written
    to ``out``; their count is returned. Uses the lane grid of :mod:`drivemind.maps.spatial`."""
    n = 0
    if not (math.isfinite(x) and math.isfinite(y)):
        return n
    fx = (x - origin[0]) / cell
    fy = (y - origin[1]) / cell
    r = int(radius // cell) + 1
    if fx < -r - 1 or fy < -r - 1 or fx > nx + r + 1 or fy > ny + r + 1:
        return n  # far outside the map
    ci = int(math.floor(fx))
    cj = int(math.floor(fy))
    for i in range(max(ci - r, 0), min(ci + r + 1, nx)):
        for j in range(max(cj - r, 0), min(cj + r + 1, ny)):
            c = i * ny + j
            for k in range(start[c], start[c + 1]):
                p = items[k]
                lane = point_lane[p]
                if junction[lane] < 0:
                    continue
                dx = pts[p, 0] - x
                dy = pts[p, 1] - y
                if dx * dx + dy * dy > radius * radius:
                    continue
                if abs((yaw[p] - qyaw + math.pi) % (2 * math.pi) - math.pi) > max_dyaw:
                    continue
                seen = False
                for q in range(n):
                    if out[q] == lane:
                        seen = True
                        break
                if not seen and n < out.shape[0]:
                    out[n] = lane
                    n += 1
    return n


@nb.njit(cache=True, inline="always")
def obb_overlap(x1, y1, c1, s1, l1, w1, x2, y2, c2, s2, l2, w2):
    """Separating-axis test for two oriented boxes (centre, cos/sin of yaw, half length/width)."""
    dx = x2 - x1
    dy = y2 - y1
    # axes of box 1
    for k in range(4):
        if k == 0:
            ax, ay = c1, s1
        elif k == 1:
            ax, ay = -s1, c1
        elif k == 2:
            ax, ay = c2, s2
        else:
            ax, ay = -s2, c2
        r1 = l1 * abs(c1 * ax + s1 * ay) + w1 * abs(-s1 * ax + c1 * ay)
        r2 = l2 * abs(c2 * ax + s2 * ay) + w2 * abs(-s2 * ax + c2 * ay)
        if abs(dx * ax + dy * ay) > r1 + r2:
            return False
    return True


@nb.njit(cache=True)
def overlaps_with(x, y, yaw, hl, hw, pos, ayaw, ext, out):
    """Indices of boxes in (pos, ayaw, ext) overlapping the box (x, y, yaw, hl, hw); count returned."""
    c = math.cos(yaw)
    s = math.sin(yaw)
    r = math.hypot(hl, hw)
    n = 0
    for j in range(pos.shape[0]):
        dx = pos[j, 0] - x
        dy = pos[j, 1] - y
        rr = r + math.hypot(ext[j, 0], ext[j, 1])
        if dx * dx + dy * dy > rr * rr:
            continue
        if obb_overlap(x, y, c, s, hl, hw, pos[j, 0], pos[j, 1], math.cos(ayaw[j]), math.sin(ayaw[j]),
                       ext[j, 0], ext[j, 1]):
            out[n] = j
            n += 1
    return n


@nb.njit(cache=True)
def pairwise_overlaps(pos, ayaw, ext, radius, skip_cls, cls, out):
    """All overlapping pairs (i < j) among boxes, except pairs where both have class skip_cls.
    ``radius``: each box's circumradius, ``hypot(*ext[i])``. Boxes are swept in order of x, so
    only pairs whose x ranges can meet are tested. Writes pairs as i * N + j into out; returns the
    count."""
    n = pos.shape[0]
    cnt = 0
    if n < 2:
        return 0
    order = np.argsort(pos[:, 0])
    rmax = radius.max()
    for a in range(n):
        i0 = order[a]
        for b in range(a + 1, n):
            j0 = order[b]
            dx = pos[j0, 0] - pos[i0, 0]  # >= 0 in this order
            if dx > radius[i0] + rmax:
                break
            i, j = (i0, j0) if i0 < j0 else (j0, i0)
            if cls[i] == skip_cls and cls[j] == skip_cls:
                continue
            rr = radius[i] + radius[j]
            dx = pos[j, 0] - pos[i, 0]
            dy = pos[j, 1] - pos[i, 1]
            if dx * dx + dy * dy > rr * rr:
                continue
            if obb_overlap(pos[i, 0], pos[i, 1], math.cos(ayaw[i]), math.sin(ayaw[i]), ext[i, 0],
                           ext[i, 1], pos[j, 0], pos[j, 1], math.cos(ayaw[j]), math.sin(ayaw[j]),
                           ext[j, 0], ext[j, 1]):
                if cnt < out.shape[0]:
                    out[cnt] = i * n + j
                cnt += 1
    return cnt


@nb.njit(cache=True)
def actor_velocities(v_v, v_yaw, w_speed, w_state, w_yaw, out):
    """World-frame velocities of the vehicles, then the walkers, into out; a walker counts as
    moving at its walking speed while it crosses (state 1), 0 otherwise
    (``traffic.walker_velocity=crossing``; with ``moved`` the world overwrites the walkers' rows
    with their displacement over the last step)."""
    nv = v_v.shape[0]
    for i in range(nv):
        out[i, 0] = v_v[i] * math.cos(v_yaw[i])
        out[i, 1] = v_v[i] * math.sin(v_yaw[i])
    for w in range(w_speed.shape[0]):
        sp = w_speed[w] if w_state[w] == 1 else 0.0
        out[nv + w, 0] = sp * math.cos(w_yaw[w])
        out[nv + w, 1] = sp * math.sin(w_yaw[w])


@nb.njit(cache=True)
def light_states(t, jn_offset, jn_groups, light_phase, jn_phases, green, yellow, allred, out):
    """State of every light: junction k cycles its ``jn_phases[k]`` phases one at a time (green,
    yellow, all-red); its ``jn_groups[k]`` lights are green in phase ``light_phase``."""
    slot = green + yellow + allred
    base = 0
    for k in range(jn_groups.shape[0]):
        g = jn_groups[k]
        if g == 0:
            continue
        tm = (t + jn_offset[k]) % (slot * jn_phases[k])
        active = int(tm // slot)
        ph = tm - active * slot
        for q in range(g):
            if light_phase[base + q] != active:
                out[base + q] = 2
            elif ph < green:
                out[base + q] = 0
            elif ph < green + yellow:
                out[base + q] = 1
            else:
                out[base + q] = 2
        base += g


@nb.njit(cache=True)
def light_demand(lane, s, length, det_light, det_off, ego_lane, ego_s, dist, out):
    """Which lights have a vehicle (or the ego) within ``dist`` m of their stop line (the
    detectors of a vehicle-actuated signal): on a lane whose detector reaches it (``det_light``,
    the light; ``det_off``, metres from the lane's end on to the stop line: 0 on the light's own
    lane, world.detector_lanes)."""
    out[:] = False
    for i in range(lane.shape[0]):
        li = det_light[lane[i]]
        if li >= 0 and length[lane[i]] - s[i] + det_off[lane[i]] < dist:
            out[li] = True
    if ego_lane >= 0:
        li = det_light[ego_lane]
        if li >= 0 and length[ego_lane] - ego_s + det_off[ego_lane] < dist:
            out[li] = True


@nb.njit(cache=True)
def lights_actuated(dt, jn_groups, light_phase, jn_phases, demand, min_green, max_green, yellow,
                    allred, phase, stage, timer, out):
    """Vehicle-actuated signals (as SUMO's ``actuated`` programs and most real controllers): a
    junction's green phase ends (yellow, then all-red) only when another phase has demand, and
    then once it has been green ``min_green`` s with nobody left to serve, or ``max_green`` s in
    any case; with no demand elsewhere it rests in green. The next phase is the next one in order
    with demand (else simply the next). State per junction, kept between calls: ``phase``,
    ``stage`` (0 green, 1 yellow, 2 all-red) and ``timer`` (s in that stage)."""
    base = 0
    for k in range(jn_groups.shape[0]):
        g = jn_groups[k]
        P = jn_phases[k]
        timer[k] += dt
        if stage[k] == 0:
            mine = False
            other = False
            for q in range(g):
                if demand[base + q]:
                    if light_phase[base + q] == phase[k]:
                        mine = True
                    else:
                        other = True
            if other and timer[k] >= min_green and (not mine or timer[k] >= max_green):
                stage[k] = 1
                timer[k] = 0.0
        elif stage[k] == 1:
            if timer[k] >= yellow:
                stage[k] = 2
                timer[k] = 0.0
        elif timer[k] >= allred:
            nxt = (phase[k] + 1) % P
            for d in range(1, P + 1):
                p = (phase[k] + d) % P
                want = False
                for q in range(g):
                    if demand[base + q] and light_phase[base + q] == p:
                        want = True
                        break
                if want:
                    nxt = p
                    break
            phase[k] = nxt
            stage[k] = 0
            timer[k] = 0.0
        for q in range(g):
            out[base + q] = stage[k] if light_phase[base + q] == phase[k] else 2
        base += g


@nb.njit(cache=True)
def _corridor_gap(offset, ds, length, pts, yaw, path, s_i, hl, hw, obs, obs_r, lookahead, step):
    """Distance (bumper to obstacle edge) to the first obstacle circle within the vehicle's
    corridor along its lane path; INF if none. obs: (M, 2) centres, obs_r: (M,) radii."""
    best = INF
    m = obs.shape[0]
    if m == 0:
        return best
    d = 0.0
    k = 0
    s = s_i
    while d <= lookahead and k < path.shape[0] and path[k] >= 0:
        lane = path[k]
        x, y, _ = lane_pose(offset, ds, length, pts, yaw, lane, s)
        for j in range(m):
            dx = obs[j, 0] - x
            dy = obs[j, 1] - y
            lim = hw + obs_r[j] + 0.4
            if d >= 0.0 and dx * dx + dy * dy < lim * lim:  # behind us: not ours to yield to
                g = d - hl - obs_r[j]
                if g < best:
                    best = g
        if best < INF:
            return best
        d += step
        s += step
        while k < path.shape[0] and path[k] >= 0 and s > length[path[k]]:
            s -= length[path[k]]
            k += 1
    return best


QUEUE_GAP = 10.0  # m: a standing ego this close behind a standing vehicle or a stop line queues there


@nb.njit(cache=True)
def _waits_for_light(i, blocker, v, light_block, ego_at_light):
    """Whether standing vehicle ``i`` waits for a red or yellow light: its waits-for chain of
    standing vehicles (``blocker``) ends at one, or at the ego when ``ego_at_light``."""
    j = i
    for _ in range(blocker.shape[0]):
        if light_block[j]:
            return True
        b = blocker[j]
        if b == BLOCKED_EGO:
            return ego_at_light
        if b < 0 or v[b] >= 0.3:
            return False
        j = b
    return False  # a cycle of standing vehicles: a deadlock, not a light


@nb.njit(cache=True)
def _ego_at_light(lane, s, v, hl, light_block, blocker, junction, succ, length, lane_light,
                  light_state, ego_lane, ego_s, ego_v, ego_r):
    """Whether the ego stands in a queue at a red or yellow light: within QUEUE_GAP m of a
    standing vehicle ahead on its lane (or the lanes that lane leads on to, outside junctions)
    that waits for one, or of the stop line of such a light with nobody between."""
    if ego_lane < 0 or ego_v >= 0.3:
        return False
    n = lane.shape[0]
    l = ego_lane
    base = -ego_s  # the lane's start, from the ego
    for _ in range(4):
        lead = -1
        best = INF
        for j in range(n):
            if lane[j] == l and (l != ego_lane or s[j] > ego_s) and base + s[j] < best:
                best = base + s[j]
                lead = j
        if lead >= 0:
            if best - hl[lead] - ego_r > QUEUE_GAP or v[lead] >= 0.3:
                return False
            return _waits_for_light(lead, blocker, v, light_block, False)
        li = lane_light[l]
        if li >= 0:
            return (light_state[li] == 1 or light_state[li] == 2) and \
                base + length[l] - ego_r <= QUEUE_GAP
        nxt = -1
        cnt = 0
        for q in range(succ.shape[1]):
            if succ[l, q] >= 0:
                cnt += 1
                nxt = succ[l, q]
        base += length[l]
        if cnt != 1 or junction[nxt] >= 0 or base - ego_r > QUEUE_GAP:
            return False
        l = nxt
    return False


@nb.njit(cache=True)
def boxes_touch(pa, ca, sa, pb, cb, sb, hl, hw, reach2, out):
    """out[i] = True where a box of half length ``hl`` and half width ``hw`` at pose i of pa
    (heading cosine ``ca``, sine ``sa``) overlaps the box at some pose of pb (:func:`obb_overlap`,
    only for centres closer than sqrt(reach2)). For :func:`tables.boxes_touch`, with the same
    arithmetic as its numpy version had."""
    for i in range(pa.shape[0]):
        for j in range(pb.shape[0]):
            dx = pb[j, 0] - pa[i, 0]
            dy = pb[j, 1] - pa[i, 1]
            if not dx * dx + dy * dy < reach2:
                continue
            if obb_overlap(pa[i, 0], pa[i, 1], ca[i], sa[i], hl, hw, pb[j, 0], pb[j, 1], cb[j], sb[j],
                           hl, hw):
                out[i] = True
                break


@nb.njit(cache=True, inline="always")
def pair_at(jix, a, b):
    """Where the pair of lanes (a, b) of one junction sits in a :class:`tables.JunctionPairs`
    table's ``data`` (``jix``: its ``index``); -1 when they are not lanes of one junction."""
    base = jix[a, 0]
    if base < 0 or base != jix[b, 0]:
        return -1
    return base + jix[a, 1] * jix[a, 2] + jix[b, 1]


@nb.njit(cache=True, inline="always")
def _cf(conflict, jix, a, b):
    """The junction conflict table at (a, b): 0 none, 1 conflict, 2 two ways from one lane."""
    k = pair_at(jix, a, b)
    return conflict[k] if k >= 0 else 0


@nb.njit(cache=True, inline="always")
def _cl(clear, jix, a, b):
    """The clear-point table (tables.conflict_clear_points) at (a, b); inf off the table."""
    k = pair_at(jix, a, b)
    return clear[k] if k >= 0 else np.inf


@nb.njit(cache=True)
def traffic_step(
    dt, t,
    # map
    offset, ds, length, pts, yaw, junction, succ, choose, conflict, jix, way_start, follow_way,
    exit_way,
    lane_light, lane_vmax, taper_stop,
    # vehicles (modified in place)
    lane, s, v, acc, path, grant, entered, wait, stuck, hl, hw, vfac, vcap, amax, bcomf, lat,
    lcfrom,
    # lights
    light_state,
    # ego and walkers as obstacles
    ego_xy, ego_yaw, ego_hl, ego_hw, ego_r, ego_lane, ego_s, ego_v, ego_jlanes, ego_nj, ego_turn,
    ego_behind, lc_body, lc_project,
    walker_xy, walker_on_road, walker_yaw, walker_speed, walker_anticipate,
    rnd,
    # params
    s0, T, bmax, lookahead, req_extra,
    # outputs
    xy, heading, blocker,
    # junction_release='crossing' (tables.conflict_clear_points); release False: the whole way
    clear, release, release_margin,
    # overtaking in the oncoming lane (:func:`overtakes`; all OTK_OFF when traffic.overtake=off)
    otk, otk_of, otk_off, otk_lane,
    # junctions joined by short links (traffic.junction_chain; -1 / 0 everywhere with 'none'):
    # each link lane's link (-1: none), the first and last link lane after a junction lane, the
    # room to queue on a way through past its crossings
    link_id, via, store, short_empty,
    # traffic.merge_yield: per vehicle, the lane beside it that it asks to be let into because
    # its own closes ahead (:func:`lane_changes`; -1: none), and whether followers there let it in;
    # the lane the ego asks to be let into so (:func:`merge_request`; -1: none)
    merge_lane, merge_yield, ego_merge,
):
    """One step of the background vehicles. ``blocker`` (out, per vehicle): what limits it now,
    for the waits-for graph (:func:`wait_cycles`): another vehicle's index (its leader, or the one
    keeping its junction reservation from being granted), or NO_BLOCKER, BLOCKED_EGO (the ego),
    BLOCKED_OTHER (a walker, a tapered lane end), BLOCKED_LIGHT (a red or yellow light).
    ``choose``: the successor table paths are drawn on from (``succ`` less the ways that only
    lead into a lane closing up, world.way_choices); ``succ`` serves everything else.

    ``stuck`` (per vehicle): seconds standing not explained by a red light. It runs while the
    vehicle stands, pauses while its waits-for chain (its leader, that one's leader, ..., each
    standing) ends at a red or yellow light, or at the ego standing before one on its lane (a
    queue behind a light, however long), and restarts from 0 once it moves.

    ``release``: a vehicle in a junction stops keeping a crossing way through from being granted
    once its rear is ``release_margin`` m past the last point of its lane near that way
    (``clear``), and a vehicle ahead on the requester's own way through is followed (as a leader)
    rather than waited for; without it a vehicle keeps every way through that conflicts with its
    lane until it has driven off that lane.

    Overtaking (``otk``, :func:`overtakes`): a vehicle out in the oncoming lane and the leader it
    passes no longer follow each other once they are OVERTAKE_SIDE m apart sideways; a vehicle
    whose way is the lane an overtaking vehicle is out in brakes for it (head-on), and so does the
    overtaking one for a vehicle coming the other way; the overtaking one's corridor (for the
    ego and walkers) is widened by its offset; it drops back (OTK_FALL) braking comfortably; its
    offset moves to the oncoming lane's centre and back at :func:`_lat_rate`.

    Returns the longest standing time (``stuck``) of any vehicle after the step."""
    n = lane.shape[0]
    K = path.shape[1]
    n_otk = 0  # vehicles out in an oncoming lane
    otk_idx = np.empty(n, np.int64)
    for i in range(n):
        if otk[i] != OTK_OFF and otk_lane[i] >= 0 and abs(lat[i]) > 0.5:
            otk_idx[n_otk] = i
            n_otk += 1
    # the ego's body as EGO_CIRCLES circles along its length that cover its box (one circle round
    # the whole box would reach into the next lane and stop the traffic there)
    ego_circ = np.empty((EGO_CIRCLES, 2))
    ego_circ_r = np.full(EGO_CIRCLES, math.hypot(ego_hw, ego_hl / EGO_CIRCLES))
    for m in range(EGO_CIRCLES):
        along = (2.0 * m + 1.0 - EGO_CIRCLES) * ego_hl / EGO_CIRCLES
        ego_circ[m, 0] = ego_xy[0] + along * math.cos(ego_yaw)
        ego_circ[m, 1] = ego_xy[1] + along * math.sin(ego_yaw)
    # ---- pass 1: next junction connector and whether each vehicle must ask for it
    nxt_c = np.full(n, -1, np.int64)
    nxt_k = np.full(n, -1, np.int64)
    dstop = np.full(n, INF)
    light_block = np.zeros(n, np.bool_)
    rej = np.full(n, NO_BLOCKER, np.int64)  # who kept a request from being granted this step
    for i in range(n):
        cum = -s[i]
        for k in range(K):
            l = path[i, k]
            if l < 0:
                break
            if k > 0 and junction[l] >= 0 and junction[path[i, k - 1]] < 0:
                nxt_c[i] = l
                nxt_k[i] = k
                dstop[i] = cum
                inc = path[i, k - 1]
                li = lane_light[inc]
                if li >= 0:
                    st = light_state[li]
                    can_stop = cum > v[i] * v[i] / (2.0 * bcomf[i]) + 1.0
                    if grant[i] == l and not entered[i] and st != 0 and can_stop:
                        # granted while green, and the light changed before it got there: it
                        # gives the reservation back and stops
                        grant[i] = -1
                    if grant[i] != l:
                        if st == 2:
                            light_block[i] = True
                        elif st == 1 and can_stop:
                            light_block[i] = True
                break
            cum += length[l]
            if cum > lookahead:
                break
    # ---- pass 2: grant junction connectors, longest-waiting first
    # the ego coming up to a junction, first on its lane and too fast or too close to stop short of
    # it (unless it faces a red light), claims every connector it may take: none crossing them is
    # granted meanwhile
    # (so does the ego standing at the stop line when it has its turn: ``ego_turn``, from
    # traffic.ego_turn; without it a busy junction can keep it waiting for a gap for good, and
    # the queue behind it with it)
    ego_coming = False
    if ego_lane >= 0 and junction[ego_lane] < 0 and (ego_v > 0.5 or ego_turn):
        li = lane_light[ego_lane]
        if ego_turn or ((li < 0 or light_state[li] != 2) and
                        length[ego_lane] - ego_s - ego_r < ego_v * ego_v / 6.0 + 3.0):
            ego_coming = True
            for j in range(n):
                if lane[j] == ego_lane and s[j] > ego_s:
                    ego_coming = False
                    break
    # (junction_chain) the ego in a junction whose way leads on over a short link into the next
    # junction claims the ways it may take there, as it would coming up on the link: by the time
    # it is on the link it is too close to stop, and one let into a way merging with its own
    # there met it (BEL_Wervik); not while another vehicle is on the link before it
    ego_via = -1
    if ego_lane >= 0 and ego_v > 0.5 and via[ego_lane, 0] >= 0:
        ego_via = via[ego_lane, 1]
        for j in range(n):
            if link_id[lane[j]] == link_id[via[ego_lane, 0]]:
                ego_via = -1
                break
    # the lane whose next junction's ways the ego holds: its own, coming up to a junction, or the
    # link it is heading for through the junction it is in
    ego_from = ego_lane if ego_coming else ego_via
    req = np.empty(n, np.int64)
    nr = 0
    for i in range(n):
        c = nxt_c[i]
        if c >= 0 and grant[i] != c and not light_block[i]:
            if dstop[i] < v[i] * v[i] / (2.0 * bcomf[i]) + req_extra:
                # only the first vehicle of the approach may ask (a granted vehicle stuck behind
                # an ungranted one would block it for good)
                first = True
                for j in range(n):
                    if j == i:
                        continue
                    for k in range(nxt_k[i]):
                        if lane[j] == path[i, k] and (k > 0 or s[j] > s[i]):
                            first = False
                            break
                    if not first:
                        break
                if first:
                    req[nr] = i
                    nr += 1
    if nr > 0:
        keys = np.empty(nr)
        for q in range(nr):
            keys[q] = -wait[req[q]] * 1000.0 + dstop[req[q]]
            if link_id[path[req[q], nxt_k[req[q]] - 1]] >= 0:
                keys[q] -= 1e9  # in a chain of junctions: asks first
        order = np.argsort(keys)
        way_on = np.full((1, PATH_EXTEND * K), -1, np.int64)  # a path run on (the room check)
        claimed = np.empty(nr, np.int64)  # connectors of long waiters not granted this step
        claimer = np.empty(nr, np.int64)
        ncl = 0
        for q in range(nr):
            i = req[order[q]]
            c = nxt_c[i]
            on_link = link_id[path[i, nxt_k[i] - 1]] >= 0  # (junction_chain) it comes off a link
            ok = True
            # no starving: nothing crossing the way of one that has waited long goes first
            for q2 in range(ncl):
                if _cf(conflict, jix, c, claimed[q2]) == 1 or c == claimed[q2]:
                    ok = False
                    rej[i] = claimer[q2]
                    break
            for j in range(n):
                if j == i:
                    continue
                lj = lane[j]
                # one that went ahead from our lane into a way through diverging from ours, far
                # enough in for us to follow it (as a leader), does not block us
                ahead = (_cf(conflict, jix, c, lj) == 2
                         and way_start[lj] + s[j] - hl[j] > 2.0 * hl[i] + s0)
                gone = False  # (release) past the crossing with our way, or ahead on it
                if release and junction[lj] >= 0 and _cf(conflict, jix, c, lj):
                    if s[j] - hl[j] > _cl(clear, jix, lj, c) + release_margin:
                        gone = True
                    else:
                        for kk in range(nxt_k[i] + 1, K):
                            if path[i, kk] < 0 or junction[path[i, kk]] < 0:
                                break
                            if path[i, kk] == lj:
                                gone = True
                                break
                if junction[lj] >= 0 and _cf(conflict, jix, c, lj) and not ahead and not gone:
                    ok = False
                    rej[i] = j
                    break
                gj = grant[j]
                if gone and entered[j] and gj == lj:
                    continue
                if gj >= 0 and _cf(conflict, jix, c, gj) and not (ahead and gj == lj):
                    ok = False
                    rej[i] = j
                    break
            if not ok and rej[i] == NO_BLOCKER:
                rej[i] = BLOCKED_OTHER
            if (ok and ego_lane >= 0 and junction[ego_lane] >= 0
                    and _cf(conflict, jix, c, ego_lane)):
                ok = False
                rej[i] = BLOCKED_EGO
            for q in range(ego_nj):  # junction lanes the ego may be on
                if ok and _cf(conflict, jix, c, ego_jlanes[q]):
                    ok = False
                    rej[i] = BLOCKED_EGO
            if ok and ego_from >= 0:
                for q in range(succ.shape[1]):
                    e = succ[ego_from, q]
                    if e >= 0 and junction[e] >= 0 and (e == c or _cf(conflict, jix, c, e)):
                        ok = False
                        rej[i] = BLOCKED_EGO
                        break
            if ok:
                # the connector must not pass through the ego (its body as circles along its length)
                a = offset[c]
                b = offset[c + 1]
                lim = ego_circ_r[0] + hw[i] + 1.0
                for p in range(a, b):
                    for m in range(ego_circ.shape[0]):
                        dx = pts[p, 0] - ego_circ[m, 0]
                        dy = pts[p, 1] - ego_circ[m, 1]
                        if dx * dx + dy * dy < lim * lim:
                            ok = False
                            rej[i] = BLOCKED_EGO
                            break
                    if not ok:
                        break
            if ok:
                # room beyond the junction for this vehicle, counting those already granted into
                # its exit: the free stretch along its path up to the first vehicle there (over
                # as many short lanes as it takes, as far as the next junction); with
                # ``exit_way`` beyond the whole way through, not its first lane
                k = nxt_k[i]
                need = 2.0 * hl[i] + s0 + 1.0
                # its path, and on past the lanes drawn where they run out, as far as the way on
                # is the only one (PATH_LEN lanes of short links and sections can end before the
                # next junction, which was then taken for no junction at all: CommonRoad's
                # roundabout, a car let into a way with no room beyond, in front of the ego)
                na, branch = _path_on(path, i, choose, way_on)
                kx = _way_end(way_on, 0, k, junction, na) if exit_way else k + 1
                if kx < na and way_on[0, kx] >= 0:
                    e = way_on[0, kx]
                    free = 0.0
                    kk = kx
                    blocked_at = INF
                    room_by = BLOCKED_OTHER  # who takes the room (the first one there)
                    while (kk < na and way_on[0, kk] >= 0 and junction[way_on[0, kk]] < 0
                           and free < need):
                        ln = way_on[0, kk]
                        for j in range(n):
                            if j != i and lane[j] == ln and free + s[j] - hl[j] < blocked_at:
                                blocked_at = free + s[j] - hl[j]
                                room_by = j
                        if ego_lane == ln and free + ego_s - ego_r < blocked_at:
                            blocked_at = free + ego_s - ego_r
                            room_by = BLOCKED_EGO
                        if blocked_at < INF:
                            break
                        free += length[ln]
                        kk += 1
                    # where the lanes known run out at a lane with several ways on, all of them
                    # into a junction: the next junction is there, its way through unknown
                    fork = (kk >= na and branch and free < need
                            and _all_into_junction(choose, way_on[0, na - 1], junction))
                    if blocked_at < free or blocked_at < INF:
                        free = blocked_at
                    elif free < need and (kk >= na or way_on[0, kk] < 0) and not fork:
                        free = INF  # the path ends (or forks off the junctions): room enough
                    granted_in = False
                    for j in range(n):
                        if j == i or grant[j] < 0:
                            continue
                        if lane[j] != e:
                            for q2 in range(K - 1):
                                if path[j, q2] != grant[j]:
                                    continue
                                qe = _way_end(path, j, q2, junction, K) if exit_way else q2 + 1
                                if qe < K and path[j, qe] == e:
                                    free -= 2.0 * hl[j] + s0
                                    room_by = j
                                    granted_in = True
                                    break
                    if on_link:
                        free += store[c]
                    if free < need:
                        # a stretch shorter than a car to the next junction will do if it is empty
                        short = fork or (kk < na and way_on[0, kk] >= 0
                                         and junction[way_on[0, kk]] >= 0)
                        if not (short and blocked_at == INF and free >= 0.0
                                and not (short_empty and granted_in)):
                            ok = False
                            rej[i] = room_by
                        elif exit_way and _ego_in_ways(
                                choose, way_on[0, na - 1], fork, way_on[0, min(kk, na - 1)],
                                junction, conflict, jix, ego_lane, ego_jlanes, ego_nj):
                            # ... and not while the ego is in the way on through that junction:
                            # it stood in the first, in the way of the ego waiting to leave the
                            # second for it (Town07)
                            ok = False
                            rej[i] = BLOCKED_EGO
            if ok:
                grant[i] = c
                entered[i] = False
                wait[i] = 0.0
            elif wait[i] > STARVE_WAIT or on_link:
                claimed[ncl] = c
                claimer[ncl] = i
                ncl += 1
    # ---- pass 3: IDM acceleration
    # walkers near the vehicle under consideration: each crossing one where it is and where it
    # will be traffic.walker_anticipate s on at its pace and heading, as circles 0.9 m round (at
    # most 2.25 m apart: the corridor's reach, over 1.6 m, covers the way between them)
    wbuf = np.empty((2 * walker_xy.shape[0], 2))
    wrad = np.full(2 * walker_xy.shape[0], 0.9)
    pext = np.full(PATH_EXTEND * K, -1, np.int64)  # a path run on for the walker check
    asking = False  # (merge_yield) anyone asking to be let over this step
    if merge_yield:
        for j in range(n):
            if merge_lane[j] >= 0:
                asking = True
                break
    # (merge_yield) the ego asks to be let in: where it would be on the lane beside
    ego_st = INF
    if merge_yield and ego_merge >= 0 and ego_lane >= 0:
        ego_st = _place_beside(offset, ds, length, pts, yaw, ego_lane, ego_s, 0.0, ego_merge,
                               lc_project)
    for i in range(n):
        gap = INF
        vl = 0.0
        src = NO_BLOCKER  # what sets gap
        # leader along the lane path
        cum = -s[i]
        for k in range(K):
            l = path[i, k]
            if l < 0 or cum > lookahead:
                break
            for j in range(n):
                if j == i:
                    continue
                sj = s[j]
                if lane[j] != l:
                    if (junction[l] >= 0 and junction[lane[j]] >= 0
                            and _cf(conflict, jix, l, lane[j]) == 2):
                        # on a way through that leaves l's lane with l's: followed as on l, at
                        # its distance along its way (traffic.diverging_follow)
                        sj = s[j] + way_start[lane[j]] - way_start[l]
                        if follow_way:
                            if sj < 0.0 or sj > length[l]:
                                continue  # alongside an earlier or a later lane of our way
                            if (release and s[j] - hl[j]
                                    > _cl(clear, jix, lane[j], l) + release_margin):
                                continue  # past where the two ways part: not in ours
                    elif lcfrom[j] == l and abs(lat[j]) >= 0.5:
                        # changing lanes away from l and not yet across: still in our way
                        sj = _place_beside(offset, ds, length, pts, yaw, lane[j], s[j], lat[j],
                                           l, lc_project)
                    else:
                        continue
                if k == 0 and sj <= s[i]:
                    continue
                g = cum + sj - hl[j] - hl[i]
                if g < gap:
                    if n_otk > 0 and (((otk[i] == OTK_OUT or otk[i] == OTK_FALL) and otk_of[i] == j)
                                      or ((otk[j] == OTK_OUT or otk[j] == OTK_FALL)
                                          and otk_of[j] == i)):
                        # side by side, one out in the oncoming lane (one going back in follows
                        # again)
                        if abs(lat[i] - lat[j]) >= hw[i] + hw[j] + OVERTAKE_SIDE:
                            continue
                    gap = g
                    vl = v[j]
                    src = j
            if gap < INF:
                break
            cum += length[l]
        # head-on: a vehicle out in the oncoming lane on our way, or (out ourselves) one coming
        for q in range(n_otk):
            j = otk_idx[q]
            # (with lc_project, where each is along the other's lane is its nearest point there,
            # and the two close in at both their speeds)
            if j == i:
                o = otk_lane[i]
                for k2 in range(n):
                    if lane[k2] == o:
                        p = _oncoming_at(offset, ds, length, pts, yaw, o, s[k2], lane[i],
                                         lc_project)
                        if p > s[i]:
                            g = p - s[i] - hl[k2] - hl[i]
                            if g < gap:
                                gap = g
                                vl = -v[k2] if lc_project else 0.0
                                src = k2
                continue
            o = otk_lane[j]
            cum = -s[i]
            for k in range(3):
                l = path[i, k]
                if l < 0 or cum > lookahead:
                    break
                if l == o:
                    p = _oncoming_at(offset, ds, length, pts, yaw, lane[j], s[j], o, lc_project)
                    if k > 0 or p > s[i]:
                        g = cum + p - hl[j] - hl[i]
                        if g < gap:
                            gap = g
                            vl = -v[j] if lc_project else 0.0
                            src = j
                    break
                cum += length[l]
        # changing lanes and still partly on the old one: the vehicles ahead there count too
        lo = lcfrom[i]
        if lo >= 0 and abs(lat[i]) > 1.0:
            so = _place_beside(offset, ds, length, pts, yaw, lane[i], s[i], lat[i], lo,
                               lc_project)
            for j in range(n):
                if j != i and lane[j] == lo and s[j] > so:
                    g = s[j] - so - hl[j] - hl[i]
                    if g < gap:
                        gap = g
                        vl = v[j]
                        src = j
        # (merge_yield) a vehicle beside us, ahead, whose lane closes and that asks to move over
        # onto ours: let it in (a leader where it would be on our lane, MERGE_ROOM m further on)
        # when we can stop for it comfortably; else it waits for the next gap. Without this, a
        # car standing at a lane drop waited for a gap in steady traffic that never came
        # (esmini's two_plus_one: 9 respawns in 600 s at dense)
        if asking:
            for j in range(n):
                if merge_lane[j] != lane[i] or j == i:
                    continue
                sj = _place_beside(offset, ds, length, pts, yaw, lane[j], s[j], 0.0, lane[i],
                                   lc_project)
                g = sj - s[i] - hl[j] - hl[i] - MERGE_ROOM
                if _lets_in(g, gap, v[i], bcomf[i], s0):
                    gap = g
                    vl = v[j]
                    src = j
        # ... and the ego, whose lane closes ahead, as a background vehicle is (a car behind it
        # that can stop for it comfortably leaves it room to move over; before, the expert
        # waited at a lane drop for a gap in the stream)
        if ego_st < INF and lane[i] == ego_merge:
            g = ego_st - s[i] - ego_hl - hl[i] - MERGE_ROOM
            if _lets_in(g, gap, v[i], bcomf[i], s0):
                gap = g
                vl = ego_v
                src = BLOCKED_EGO
        # the ego on the path (by its lane) and by geometry
        if ego_lane >= 0:
            cum = -s[i]
            for k in range(K):
                l = path[i, k]
                if l < 0 or cum > lookahead:
                    break
                if l == ego_lane and (k > 0 or ego_s > s[i]):
                    g = cum + ego_s - ego_r - hl[i]
                    if g < gap:
                        gap = g
                        vl = 0.0
                        src = BLOCKED_EGO
                    break
                cum += length[l]
        # corridor half width: widened by the lateral offset from the lane's centre line while out
        # overtaking or (lc_body: traffic.lane_change_corridor 'body') still between two lanes
        # after a lane change, so that it covers the body where it is
        hw_c = hw[i] + abs(lat[i]) if otk[i] != OTK_OFF or lc_body else hw[i]
        dx = ego_xy[0] - xy[i, 0]
        dy = ego_xy[1] - xy[i, 1]
        # (ego_behind False) the ego's centre behind ours: it reaches into our way from beside or
        # behind (a merge lane joining ours), and we drive away from it; braking for it, we would
        # stand for good beside an ego that waits for us to go first
        behind = not ego_behind and dx * math.cos(heading[i]) + dy * math.sin(heading[i]) < 0.0
        if dx * dx + dy * dy < (lookahead * 0.5) ** 2 and not behind:
            g = _corridor_gap(offset, ds, length, pts, yaw, path[i], s[i], hl[i], hw_c, ego_circ,
                              ego_circ_r, lookahead * 0.5, 1.0)
            if g < gap and junction[lane[i]] < 0 and ego_lane >= 0 and junction[ego_lane] < 0:
                # where it meets the ego on its own lane, outside junctions, crossing the ego's
                # lane (outside junctions) at more than about 45 degrees: one passes over the
                # other (a bridge), as in the world's collision test
                sh = s[i] + max(g, 0.0) + hl[i]
                if sh <= length[lane[i]]:
                    _, _, hh = lane_pose(offset, ds, length, pts, yaw, lane[i], sh)
                    if abs(math.cos(hh - ego_yaw)) < GRADE_SEPARATED_COS:
                        g = INF
            if g < gap:
                gap = g
                vl = 0.0
                src = BLOCKED_EGO
        # walkers on the road
        q = 0
        for w in range(walker_xy.shape[0]):
            if walker_on_road[w]:
                dx = walker_xy[w, 0] - xy[i, 0]
                dy = walker_xy[w, 1] - xy[i, 1]
                if dx * dx + dy * dy < (lookahead * 0.6) ** 2:
                    wbuf[q, 0] = walker_xy[w, 0]
                    wbuf[q, 1] = walker_xy[w, 1]
                    q += 1
                    if walker_anticipate > 0.0:
                        step = walker_speed[w] * walker_anticipate
                        wbuf[q, 0] = walker_xy[w, 0] + step * math.cos(walker_yaw[w])
                        wbuf[q, 1] = walker_xy[w, 1] + step * math.sin(walker_yaw[w])
                        q += 1
        if q > 0:
            # along the path, run on by each last lane's first way on where the path's lanes
            # end short of the reach: on Town06's chains of 1-3 m lane sections six lanes of
            # path covered 2 m, and a car at 32 km/h saw a walker crossing in front of it 5 m
            # before it
            prow = _path_reaching(path[i], succ, length, s[i], lookahead * 0.6, pext)
            g = _corridor_gap(offset, ds, length, pts, yaw, prow, s[i], hl[i], hw_c, wbuf[:q],
                              wrad[:q], lookahead * 0.6, 1.0)
            if g < gap:
                gap = g
                vl = 0.0
                src = BLOCKED_OTHER
        # stop line: red light, or a junction not (yet) granted
        if nxt_c[i] >= 0 and grant[i] != nxt_c[i]:
            g = dstop[i] - hl[i] - 0.5
            if g < gap:
                gap = g
                vl = 0.0
                src = BLOCKED_LIGHT if light_block[i] else rej[i]
        # where the lane narrows ahead (a taper: it merges into its neighbour, or closes up):
        # nobody drives into it
        ts = _taper_on_path(taper_stop, offset, ds, length, path[i], lane[i], s[i],
                            lookahead if merge_yield else 0.0)
        if ts < INF:
            g = ts - hl[i]
            if g < gap:
                gap = g
                vl = 0.0
                src = BLOCKED_OTHER
        # desired speed: class speed capped by this lane's and the next lane's curvature limit
        v0 = _v0(vfac[i], vcap[i], lane_vmax[lane[i]])
        if K > 1 and path[i, 1] >= 0 and length[lane[i]] - s[i] < 20.0:
            v0 = min(v0, _v0(vfac[i], vcap[i], lane_vmax[path[i, 1]]))
        a = amax[i]
        b = bcomf[i]
        free = 1.0 - (v[i] / max(v0, 0.1)) ** 4
        inter = 0.0
        if gap < INF:
            ss = s0 + max(0.0, v[i] * T + v[i] * (v[i] - vl) / (2.0 * math.sqrt(a * b)))
            inter = (ss / max(gap, 0.05)) ** 2
        ai = a * (free - inter)
        if ai < -bmax:
            ai = -bmax
        if gap < 0.3 and ai > 0.0:
            ai = 0.0
        if otk[i] == OTK_FALL and ai > -b:
            ai = -b  # dropping back behind the leader it could not pass
        acc[i] = ai
        blocker[i] = src
        if v[i] < 0.3 and nxt_c[i] >= 0 and grant[i] != nxt_c[i]:
            wait[i] += dt
    # standing time not explained by a red light (the last-resort respawn's clock): it pauses
    # while the vehicle's waits-for chain of standing vehicles ends at a red or yellow light, or at
    # the ego standing in such a queue or at such a light
    ego_at_light = _ego_at_light(lane, s, v, hl, light_block, blocker, junction, succ, length,
                                 lane_light, light_state, ego_lane, ego_s, ego_v, ego_r)
    for i in range(n):
        if v[i] >= 0.3:
            stuck[i] = 0.0
        elif not _waits_for_light(i, blocker, v, light_block, ego_at_light):
            stuck[i] += dt
    # ---- pass 4: integrate, move along lanes, release grants
    for i in range(n):
        nv = v[i] + acc[i] * dt
        if nv < 0.0:
            nv = 0.0
        s[i] += 0.5 * (v[i] + nv) * dt
        v[i] = nv
        while s[i] > length[lane[i]] and path[i, 1] >= 0:
            s[i] -= length[lane[i]]
            for k in range(K - 1):
                path[i, k] = path[i, k + 1]
            path[i, K - 1] = _draw_next(choose, path[i, K - 2], rnd[i])
            lane[i] = path[i, 0]
        if s[i] > length[lane[i]]:
            s[i] = length[lane[i]]
            v[i] = 0.0
        if grant[i] >= 0:
            if lane[i] == grant[i]:
                entered[i] = True
            elif entered[i]:  # released once the vehicle has driven off its granted connector
                grant[i] = -1
                entered[i] = False
        x, y, h = lane_pose(offset, ds, length, pts, yaw, lane[i], s[i])
        if otk[i] != OTK_OFF:  # out to the oncoming lane's centre, or back to 0
            target = 0.0 if otk[i] == OTK_BACK else otk_off[i]
            step = _lat_rate(v[i]) * dt
            dl = target - lat[i]
            if dl > step:
                dl = step
            elif dl < -step:
                dl = -step
            lat[i] += dl
            if otk[i] == OTK_BACK and lat[i] == 0.0:
                otk[i] = OTK_OFF
                otk_of[i] = -1
                otk_lane[i] = -1
            x -= lat[i] * math.sin(h)
            y += lat[i] * math.cos(h)
            if dl != 0.0 and v[i] > 2.0:
                h += math.atan2(dl / dt, v[i])
        elif lat[i] != 0.0:  # drifting over to the lane it changed to (1 m/s sideways at most)
            step = max(0.3, min(1.0, 0.35 * v[i])) * dt
            if lc_body and _ego_beside(x, y, h, lat[i], hl[i], hw[i], step, ego_xy, ego_yaw,
                                       ego_hl, ego_hw):
                pass  # it stays between the lanes, off the ego beside it, until past it
            elif abs(lat[i]) <= step:
                lat[i] = 0.0
                lcfrom[i] = -1
            else:
                lat[i] -= step if lat[i] > 0.0 else -step
            x -= lat[i] * math.sin(h)
            y += lat[i] * math.cos(h)
            if lat[i] != 0.0 and v[i] > 2.0:  # turned a little towards the new lane
                h += math.atan2(-(lat[i] / abs(lat[i])) * step / dt, v[i])
        if lcfrom[i] >= 0 and lane[i] != lcfrom[i] and lat[i] == 0.0:
            lcfrom[i] = -1
        xy[i, 0] = x
        xy[i, 1] = y
        heading[i] = h
    longest = 0.0
    for i in range(n):
        longest = max(longest, stuck[i])
    return longest


@nb.njit(cache=True, inline="always")
def _way_end(path, i, k, junction, K):
    """Index in vehicle i's path of the first lane after the way through that starts at index
    k (the lanes of k's junction in a row)."""
    jid = junction[path[i, k]]
    kx = k + 1
    while kx < K and path[i, kx] >= 0 and junction[path[i, kx]] == jid:
        kx += 1
    return kx


@nb.njit(cache=True, inline="always")
def _only_way_on(choose, lane):
    """(the way on from ``lane`` in ``choose`` if it is the only one, else -1; how many there are)"""
    nxt, cnt = -1, 0
    for q in range(choose.shape[1]):
        if choose[lane, q] >= 0:
            nxt = choose[lane, q]
            cnt += 1
    return (nxt if cnt == 1 else -1), cnt


@nb.njit(cache=True)
def _path_on(path, i, choose, way_on):
    """Vehicle i's path into ``way_on[0]`` and on past its last drawn lane while that lane has
    only one way on (``choose``), as far as ``way_on`` holds (a path that ends before PATH_LEN
    lanes ends at a dead end, as drawn). Returns the number of lanes known and whether they end at
    a lane with several ways on."""
    way_on[0, :] = -1
    na = 0
    for k in range(path.shape[1]):
        if path[i, k] < 0:
            return na, False
        way_on[0, k] = path[i, k]
        na += 1
    while True:
        nxt, cnt = _only_way_on(choose, way_on[0, na - 1])
        if cnt != 1 or na == way_on.shape[1]:
            return na, cnt > 1
        way_on[0, na] = nxt
        na += 1


@nb.njit(cache=True, inline="always")
def _all_into_junction(choose, lane, junction):
    """Whether every way on from ``lane`` (``choose``) is a junction lane."""
    for q in range(choose.shape[1]):
        e = choose[lane, q]
        if e >= 0 and junction[e] < 0:
            return False
    return True


@nb.njit(cache=True)
def _ego_in_ways(choose, last, fork, c, junction, conflict, jix, ego_lane, ego_jlanes, ego_nj):
    """Whether the ego is on a junction lane crossing the way through that starts with lane c,
    or (``fork``) any of those that start with the ways on from lane ``last``."""
    if not fork:
        return _ego_in_way(c, junction, conflict, jix, ego_lane, ego_jlanes, ego_nj)
    for q in range(choose.shape[1]):
        e = choose[last, q]
        if e >= 0 and _ego_in_way(e, junction, conflict, jix, ego_lane, ego_jlanes, ego_nj):
            return True
    return False


@nb.njit(cache=True)
def _ego_in_way(c, junction, conflict, jix, ego_lane, ego_jlanes, ego_nj):
    """Whether the ego is on a junction lane crossing the way through that starts with lane c."""
    if ego_lane >= 0 and junction[ego_lane] >= 0 and _cf(conflict, jix, c, ego_lane):
        return True
    for q in range(ego_nj):
        if _cf(conflict, jix, c, ego_jlanes[q]):
            return True
    return False


@nb.njit(cache=True)
def wait_cycles(blocker, stuck, min_stand, cycle):
    """Cycles of the waits-for graph: vehicle i waits for ``blocker[i]`` (its leader, or the
    vehicle keeping its junction reservation from being granted) when it has stood at least
    ``min_stand`` seconds (``stuck``: standing time not explained by a red light). Each vehicle
    has one such edge, so every cycle is found by following them. Writes the cycle number of
    each member to ``cycle`` (-1 elsewhere); returns the number of cycles. A vehicle waiting for
    a light, the ego, a walker or one that is moving is on no cycle."""
    n = blocker.shape[0]
    state = np.zeros(n, np.int64)  # 0 unseen, 1 on the present walk, 2 done
    order = np.empty(n, np.int64)
    cycle[:] = -1
    nc = 0
    for start in range(n):
        if state[start] != 0:
            continue
        m = 0
        i = start
        while True:
            state[i] = 1
            order[m] = i
            m += 1
            j = blocker[i]
            if j < 0 or j >= n or stuck[i] < min_stand:
                break
            if state[j] == 1:  # back on this walk: j .. i is a cycle
                q = m - 1
                while True:
                    cycle[order[q]] = nc
                    if order[q] == j:
                        break
                    q -= 1
                nc += 1
                break
            if state[j] == 2:
                break
            i = j
        for q in range(m):
            state[order[q]] = 2
    return nc


@nb.njit(cache=True, inline="always")
def _v0(vfac, vcap, lane_vmax):
    """Desired speed: the lane's limit (speed limit, curvature) times the vehicle's own factor
    (its offset around the limit), at most its class's top speed."""
    v0 = vfac * lane_vmax
    return vcap if vcap < v0 else v0


@nb.njit(cache=True, inline="always")
def _idm(v, v0, gap, vl, a, b, s0, T):
    free = 1.0 - (v / max(v0, 0.1)) ** 4
    if gap >= INF:
        return a * free
    ss = s0 + max(0.0, v * T + v * (v - vl) / (2.0 * math.sqrt(a * b)))
    return a * (free - (ss / max(gap, 0.05)) ** 2)


@nb.njit(cache=True)
def _neighbours_on(lane, s, v, hl, n, target, s_t, skip):
    """On lane ``target``: (gap ahead of s_t, its speed, gap behind, follower's speed, follower)."""
    ga, va, gb, vb, fb = INF, 0.0, INF, 0.0, -1
    for j in range(n):
        if j == skip or lane[j] != target:
            continue
        if s[j] >= s_t:
            g = s[j] - s_t - hl[j]
            if g < ga:
                ga, va = g, v[j]
        else:
            g = s_t - s[j] - hl[j]
            if g < gb:
                gb, vb, fb = g, v[j], j
    return ga, va, gb, vb, fb


@nb.njit(cache=True)
def _entering_behind(lane, s, v, hl, path, length, n, target, s_t, skip, gb, vb, fb):
    """(gap behind, follower's speed, follower) on lane ``target`` behind ``s_t`` (as
    :func:`_neighbours_on` gave them), counting also a vehicle about to come onto ``target`` from
    the lane before it (its path's next lane): its place is ``s - length`` of its lane along
    ``target`` (traffic.lane_change_follower='entering')."""
    for j in range(n):
        if j == skip or lane[j] == target or path[j, 1] != target:
            continue
        g = s_t - (s[j] - length[lane[j]]) - hl[j]
        if g < gb:
            gb, vb, fb = g, v[j], j
    return gb, vb, fb


@nb.njit(cache=True)
def _leaving_beside(offset, ds, length, pts, yaw, lane, s, hl, lat, lcfrom, n, target, s_t,
                    reach, skip, project):
    """Whether a vehicle changing lanes out of lane ``target`` (not yet across: its lateral
    offset still puts it partly there) is within ``reach`` plus its half length of ``s_t`` along
    ``target``. :func:`_neighbours_on` sees it on its new lane only; a vehicle moving into
    ``target`` beside it would swap lanes with it and meet it half way."""
    for j in range(n):
        if j == skip or lcfrom[j] != target or lat[j] == 0.0:
            continue
        sj = _place_beside(offset, ds, length, pts, yaw, lane[j], s[j], lat[j], target,
                           project)  # its place along target
        if abs(sj - s_t) < reach + hl[j]:
            return True
    return False


@nb.njit(cache=True, inline="always")
def _draw_next(choose, last, r):
    """The lane a path goes on to after lane ``last``, drawn with ``r`` (in [0, 1)) among its
    ways on in ``choose`` (a -1 padded successor table); -1 where it has none."""
    ns = 0
    for q in range(choose.shape[1]):
        if choose[last, q] >= 0:
            ns += 1
    return choose[last, min(int(r * ns), ns - 1)] if ns > 0 else -1


@nb.njit(cache=True)
def _path_reaching(row, succ, length, s, reach, out):
    """``row`` (a vehicle's lane path, from arc length ``s`` of its first lane) where its lanes
    reach ``reach`` m; else ``out`` holding it run on by each last lane's first successor until
    they do (or ``out`` is full, or a lane has none)."""
    K = row.shape[0]
    cum = -s
    k = 0
    while k < K and row[k] >= 0:
        cum += length[row[k]]
        k += 1
    if cum >= reach or k == 0 or k < K:  # far enough, empty, or ending at a dead end
        return row
    out[:K] = row
    m = K
    while m < out.shape[0] and cum < reach:
        nxt = succ[out[m - 1], 0]
        if nxt < 0:
            break
        out[m] = nxt
        cum += length[nxt]
        m += 1
    out[m:] = -1
    return out


@nb.njit(cache=True)
def _side_lane(left, right, left_same, right_same, junction, li, side):
    """The lane beside ``li`` (``side`` 0: left, 1: right) that a vehicle may change to: the
    same direction, outside junctions; -1 where there is none."""
    nb_ = left[li] if side == 0 else right[li]
    same = left_same[li] if side == 0 else right_same[li]
    if nb_ < 0 or not same or junction[nb_] >= 0:
        return -1
    return nb_


@nb.njit(cache=True)
def _taper_on_path(taper_stop, offset, ds, length, path_row, li, s, reach):
    """Metres from arc length ``s`` of lane ``li`` to where its lane, or a lane of its path
    (``path_row``, lane ``li`` first) starting within ``reach`` m, next becomes too narrow
    (world.taper_stops); INF where none does. ``reach`` 0: lane ``li`` only (the rule before
    traffic.merge_yield: a car saw a taper in the next lane section only once on it, too late to
    move over, and MOBIL makes no change within a car's length of a lane's start)."""
    ts = _taper_ahead(taper_stop, offset, ds, li, s)
    if ts < INF:
        return ts - s
    cum = length[li] - s
    for k in range(1, path_row.shape[0]):
        if cum > reach:
            break
        l = path_row[k]
        if l < 0:
            break
        t0 = taper_stop[offset[l]]
        if t0 < INF:
            return cum + t0
        cum += length[l]
    return INF


@nb.njit(cache=True)
def _taper_ahead(taper_stop, offset, ds, li, s):
    """Where lane ``li`` next becomes too narrow ahead of arc length ``s`` (world.taper_stops)."""
    n = offset[li + 1] - offset[li]
    k = min(max(int(s / ds[li]), 0), n - 1)
    return taper_stop[offset[li] + k]


@nb.njit(cache=True)
def _lets_in(g, gap, v, bcomf, s0):
    """(merge_yield) Whether a vehicle at speed ``v`` lets one asking to move over into its lane
    in, as a leader ``g`` m ahead (MERGE_ROOM beyond where it would be): not when it is already
    too close to come in (MOBIL wants s0 behind it: we go first), when a nearer leader holds us
    anyway (``gap``), nor when we cannot stop for it comfortably (``bcomf``)."""
    return not (g + MERGE_ROOM < s0 or g >= gap or v * v > 2.0 * bcomf * g)


@nb.njit(cache=True)
def merge_request(taper_stop, offset, ds, length, pts, yaw, junction, left, right, left_same,
                  right_same, path_row, li, s, hl, reach, project):
    """The lane beside lane ``li`` that a vehicle at arc length ``s`` of it (half length ``hl``)
    asks to be let into because its lane, or the next lane of its path (``path_row``, ``li``
    first), narrows within ``reach`` m ahead and the lane beside stays open past that point
    (traffic.merge_yield); -1: none."""
    if reach <= 0.0 or junction[li] >= 0:
        return -1
    tsm = _taper_on_path(taper_stop, offset, ds, length, path_row, li, s, reach)
    if tsm - hl >= reach:
        return -1
    for side in range(2):
        nb_ = _side_lane(left, right, left_same, right_same, junction, li, side)
        if nb_ < 0:
            continue
        st = _place_beside(offset, ds, length, pts, yaw, li, s, 0.0, nb_, project)
        # the lane beside stays open past where ours closes
        if _taper_ahead(taper_stop, offset, ds, nb_, st) - st > tsm + 2.0 * hl:
            return nb_
    return -1


@nb.njit(cache=True)
def lane_changes(dt, offset, ds, length, pts, yaw, junction, succ, choose, left, right, left_same,
                 right_same, lane_vmax, taper_stop, lane, s, v, acc, path, grant, hl, hw, vfac, vcap, amax, bcomf,
                 lat, lcfrom, lc_timer, ego_xy, ego_lane, ego_s, ego_v, rnd, s0, T, politeness,
                 threshold, b_safe, xy, project, entering, merge_lane, merge_reach):
    """MOBIL lane changes on multi-lane roads (Kesting, Treiber & Helbing 2007): a vehicle moves
    to a neighbouring lane of its direction when its IDM acceleration there beats the present one
    by ``threshold`` plus ``politeness`` times what it costs the new follower, and the new
    follower would not have to brake harder than ``b_safe``; never inside or within a few
    seconds of a junction, never with a junction grant, at most once per 4 s. A standing leader
    makes the present acceleration strongly negative, so vehicles pass stopped ones where a lane
    is free. The vehicle keeps a lateral offset that it drives off at up to 1 m/s; the follower on
    the lane it left keeps it as a leader until it is across. ``merge_lane`` (out): per
    vehicle, the lane beside it that it asks to be let into because its own narrows within
    ``merge_reach`` m ahead (a lane drop; traffic.merge_yield, read by :func:`traffic_step`;
    -1: none; 0 m: nobody asks). A vehicle's path on from its new lane is drawn on ``choose``
    (as traffic_step's). Returns the number of changes."""
    n = lane.shape[0]
    K = path.shape[1]
    changes = 0
    for i in range(n):
        lc_timer[i] += dt
        li = lane[i]
        merge_lane[i] = -1
        if lat[i] == 0.0:
            merge_lane[i] = merge_request(taper_stop, offset, ds, length, pts, yaw, junction, left,
                                          right, left_same, right_same, path[i], li, s[i], hl[i],
                                          merge_reach, project)
        if lc_timer[i] < 4.0 or lat[i] != 0.0 or grant[i] >= 0 or junction[li] >= 0:
            continue
        # near a lane's ends it keeps its lane (the next may be a junction's), unless it asks to
        # be let over because its lane closes (merge_lane): then anywhere before the taper (a
        # taper 5 m into a 30 m lane section: the first car stood at its start and the cars
        # behind it at the end of the section before, none allowed to move over, and the lane
        # beside stood letting them in; scenariogeneration's lane_number_change_merge)
        forced = merge_lane[i] >= 0
        rest = length[li] - s[i]
        if not forced and (rest < 12.0 + 4.0 * v[i] or s[i] < 2.0 * hl[i]):
            continue
        v0 = _v0(vfac[i], vcap[i], lane_vmax[li])
        # present situation: leader on the lane path ahead (within this lane), and our follower
        ga, va, gb, vb, fb = _neighbours_on(lane, s, v, hl, n, li, s[i] + hl[i], i)
        if ego_lane == li and ego_s > s[i] and ego_s - s[i] - hl[i] - 2.5 < ga:
            ga, va = ego_s - s[i] - hl[i] - 2.5, ego_v
        # the lane (with merge_yield: or the next of its path) narrows ahead (a taper): a
        # standing obstacle
        ts = _taper_on_path(taper_stop, offset, ds, length, path[i], li, s[i], merge_reach)
        if ts - hl[i] < ga:
            ga, va = ts - hl[i], 0.0
        a_cur = _idm(v[i], v0, ga, va, amax[i], bcomf[i], s0, T)
        best_gain = threshold
        best = -1
        best_s = 0.0
        for side in range(2):
            nb_ = _side_lane(left, right, left_same, right_same, junction, li, side)
            if nb_ < 0:
                continue
            # where we would be on it (traffic.lane_change_place; we are on our centre line)
            st = _place_beside(offset, ds, length, pts, yaw, li, s[i], 0.0, nb_, project)
            if not forced and length[nb_] - st < 12.0 + 4.0 * v[i]:
                continue
            if _leaving_beside(offset, ds, length, pts, yaw, lane, s, hl, lat, lcfrom, n, nb_, st,
                               hl[i] + s0, i, project):
                continue  # one still moving out of that lane beside us (two would swap lanes)
            na, nva, nbk, nvb, nf = _neighbours_on(lane, s, v, hl, n, nb_, st + hl[i], i)
            if forced and length[nb_] - st < 12.0 + 4.0 * v[i] + FORCED_LC_REACH:
                # moving over near that lane's end: the vehicles at the start of the lanes it
                # leads to are ahead of us too (a car let over 0.6 m before a section's end
                # slid into one standing 3.5 m on, on the next section's lane)
                room = length[nb_] - st
                for q in range(succ.shape[1]):
                    l2 = succ[nb_, q]
                    if l2 < 0:
                        break
                    for j in range(n):
                        if j != i and lane[j] == l2:
                            g = room + s[j] - hl[j] - hl[i]
                            if g < na:
                                na, nva = g, v[j]
            if entering:
                nbk, nvb, nf = _entering_behind(lane, s, v, hl, path, length, n, nb_, st + hl[i],
                                                i, nbk, nvb, nf)
            nbk -= 2.0 * hl[i]  # gaps measured from our front; behind: from our rear
            # the ego on that lane (by its lane), or near where we would be
            if ego_lane == nb_:
                d = ego_s - st
                if d >= 0.0:
                    g = d - hl[i] - 2.5
                    if g < na:
                        na, nva = g, ego_v
                else:
                    g = -d - hl[i] - 2.5
                    if g < 2.0 + ego_v * 1.5:
                        continue
            x, y, _ = lane_pose(offset, ds, length, pts, yaw, nb_, st)
            if (x - ego_xy[0]) ** 2 + (y - ego_xy[1]) ** 2 < (2.5 * hl[i] + 5.0) ** 2:
                continue
            if na < s0 + 0.5 * v[i] or nbk < s0:
                continue
            a_new = _idm(v[i], _v0(vfac[i], vcap[i], lane_vmax[nb_]), na, nva, amax[i], bcomf[i], s0, T)
            cost = 0.0
            if nf >= 0:
                a_f_new = _idm(vb if nf < 0 else v[nf], _v0(vfac[nf], vcap[nf], lane_vmax[nb_]), nbk, v[i],
                               amax[nf], bcomf[nf], s0, T)
                if a_f_new < -b_safe:
                    continue
                a_f_old = _idm(v[nf], _v0(vfac[nf], vcap[nf], lane_vmax[nb_]), nbk + 2.0 * hl[i] + na,
                               nva, amax[nf], bcomf[nf], s0, T)
                cost = a_f_old - a_f_new
            gain = a_new - a_cur - politeness * cost
            if gain > best_gain:
                best_gain, best, best_s = gain, nb_, st
        if best < 0:
            continue
        # switch: keep where we are (a lateral offset onto the new lane), re-draw the path on
        x0, y0 = xy[i, 0], xy[i, 1]
        x, y, h = lane_pose(offset, ds, length, pts, yaw, best, best_s)
        lat[i] = -(x0 - x) * math.sin(h) + (y0 - y) * math.cos(h)
        lcfrom[i] = li
        lane[i] = best
        s[i] = best_s
        lc_timer[i] = 0.0
        path[i, 0] = best
        r = rnd[i]
        for k in range(1, K):
            r = (r * 7.0) % 1.0
            nxt = _draw_next(choose, path[i, k - 1], r)
            if nxt < 0:
                for kk in range(k, K):
                    path[i, kk] = -1
                break
            path[i, k] = nxt
        changes += 1
    return changes


@nb.njit(cache=True, inline="always")
def _turn_round(w, a, b, anode, bnode):
    """Walker ``w`` crosses back: its crossing's ends ``a`` / ``b`` and their nodes swap."""
    for k in range(2):
        tmp = a[w, k]
        a[w, k] = b[w, k]
        b[w, k] = tmp
    tn = anode[w]
    anode[w] = bnode[w]
    bnode[w] = tn


@nb.njit(cache=True)
def walkers_step(dt, pos, heading, state, timer, a, b, anode, bnode, path, plen, pk, speed, veh_xy,
                 veh_v, veh_yaw, veh_ext, clear_time, clear_dist, wait_lo, wait_hi, rnd, roam):
    """Walkers wait on the kerb, cross the road from a to b when no vehicle is near, and (with
    ``roam``) walk along the pavement to their next crossing site; without ``roam`` they cross
    back and forth at one site. While crossing they stop rather than step into a vehicle; one kept
    from going on for WALKER_GIVE_UP seconds turns back to the kerb it came from (a car that
    stopped for it right beside it would otherwise wait for it for ever, and it for the car).

    state: 0 waiting on the kerb, 1 crossing, 2 walking the pavement along ``path[w, pk:plen]``,
    3 arrived across the road (the caller plans its next walk and sets state 2, or 0 to cross
    back); timer: seconds left to wait, or (crossing) seconds blocked. ``anode``/``bnode``: the
    kerb-end nodes of a and b (swapped with them). Returns the number of walkers in state 3."""
    for w in range(pos.shape[0]):
        if state[w] == 0:
            timer[w] -= dt
            if timer[w] > 0.0:
                continue
            # gap acceptance: every vehicle is far from the crossing, or slow and not close
            mx = 0.5 * (a[w, 0] + b[w, 0])
            my = 0.5 * (a[w, 1] + b[w, 1])
            half = 0.5 * math.hypot(b[w, 0] - a[w, 0], b[w, 1] - a[w, 1])
            clear = True
            for j in range(veh_xy.shape[0]):
                d = math.hypot(veh_xy[j, 0] - mx, veh_xy[j, 1] - my) - half
                if d < clear_dist + veh_v[j] * clear_time:
                    clear = False
                    break
            if clear:
                state[w] = 1
                timer[w] = 0.0
            else:
                timer[w] = 0.5
        elif state[w] == 2:
            k = pk[w]
            dx = path[w, k, 0] - pos[w, 0]
            dy = path[w, k, 1] - pos[w, 1]
            d = math.hypot(dx, dy)
            step = speed[w] * dt
            if d > 1e-9:
                heading[w] = math.atan2(dy, dx)
            if d <= step:
                pos[w, 0] = path[w, k, 0]
                pos[w, 1] = path[w, k, 1]
                pk[w] = k + 1
                if k + 1 >= plen[w]:  # at the next crossing site: wait for a gap there
                    state[w] = 0
                    timer[w] = wait_lo + (wait_hi - wait_lo) * rnd[w]
            else:
                pos[w, 0] += dx / d * step
                pos[w, 1] += dy / d * step
        elif state[w] == 1:
            dx = b[w, 0] - pos[w, 0]
            dy = b[w, 1] - pos[w, 1]
            d = math.hypot(dx, dy)
            step = speed[w] * dt
            if d <= step:
                pos[w, 0] = b[w, 0]
                pos[w, 1] = b[w, 1]
                if roam:
                    state[w] = 3
                    timer[w] = 0.0
                    continue
                _turn_round(w, a, b, anode, bnode)  # the next crossing goes back
                state[w] = 0
                timer[w] = wait_lo + (wait_hi - wait_lo) * rnd[w]
            else:
                # one metre ahead must be clear of every vehicle box (grown by 0.5 m)
                px = pos[w, 0] + dx / d * 1.0
                py = pos[w, 1] + dy / d * 1.0
                blocked = False
                for j in range(veh_xy.shape[0]):
                    ex = px - veh_xy[j, 0]
                    ey = py - veh_xy[j, 1]
                    rr = veh_ext[j, 0] + veh_ext[j, 1] + 1.01  # beyond the grown box's corners
                    if ex * ex + ey * ey > rr * rr:
                        continue
                    c = math.cos(veh_yaw[j])
                    sn = math.sin(veh_yaw[j])
                    if (abs(ex * c + ey * sn) < veh_ext[j, 0] + 0.5
                            and abs(-ex * sn + ey * c) < veh_ext[j, 1] + 0.5):
                        blocked = True
                        break
                heading[w] = math.atan2(dy, dx)
                if not blocked:
                    pos[w, 0] += dx / d * step
                    pos[w, 1] += dy / d * step
                    timer[w] = 0.0
                else:
                    timer[w] += dt
                    if timer[w] > WALKER_GIVE_UP:  # back where it came from
                        _turn_round(w, a, b, anode, bnode)
                        timer[w] = 0.0
    arrived = 0
    for w in range(pos.shape[0]):
        if state[w] == 3:
            arrived += 1
    return arrived


@nb.njit(cache=True)
def lane_clearance(origin, cell, nx, ny, start, items, pts, width, xy, radius, out):
    """For each point of ``xy`` (n, 2): its distance to the nearest lane's edge (distance to a
    centre-line point less that point's half width; negative on a lane), at most ``radius``."""
    r = int(radius // cell) + 1
    for q in range(xy.shape[0]):
        x = xy[q, 0]
        y = xy[q, 1]
        best = radius
        ci = int(math.floor((x - origin[0]) / cell))
        cj = int(math.floor((y - origin[1]) / cell))
        for i in range(max(ci - r, 0), min(ci + r + 1, nx)):
            for j in range(max(cj - r, 0), min(cj + r + 1, ny)):
                c = i * ny + j
                for k in range(start[c], start[c + 1]):
                    p = items[k]
                    d = math.hypot(pts[p, 0] - x, pts[p, 1] - y) - 0.5 * width[p]
                    if d < best:
                        best = d
        out[q] = best


# ---------------------------------------------------------------- overtaking in the oncoming lane
@nb.njit(cache=True, inline="always")
def _lat_rate(v):
    """m/s sideways while pulling out into the oncoming lane and back."""
    return max(0.5, min(1.5, 0.35 * v))


@nb.njit(cache=True)
def _gain_time(rel, v, vp, vj, a):
    """Seconds for a vehicle at ``v`` accelerating at ``a`` up to ``vp`` to gain ``rel`` metres on
    one driving at ``vj``; INF if it never does."""
    if rel <= 0.0:
        return 0.0
    if vp - vj < 0.5:
        return INF
    dv0 = v - vj
    t_acc = max(0.0, (vp - v) / a)
    g_acc = dv0 * t_acc + 0.5 * a * t_acc * t_acc
    if g_acc >= rel:
        return (-dv0 + math.sqrt(max(dv0 * dv0 + 2.0 * a * rel, 0.0))) / a
    return t_acc + (rel - g_acc) / (vp - vj)


@nb.njit(cache=True)
def _overtake_plan(i, j, lane, s, v, hl, hw, vfac, vcap, amax, lane_vmax, s0, out_w, lat_i):
    """(seconds, metres ahead of i's centre) the overtake of j by i still takes: pull out until
    the two are OVERTAKE_SIDE apart sideways, gain on j until i's rear is s0 + 0.5 s x j's speed past j's
    front, pull back in."""
    li = lane[i]
    vp = _v0(vfac[i], vcap[i], lane_vmax[li])
    rate = _lat_rate(min(v[i], vp))
    # pulled out far enough to pass the leader by OVERTAKE_SIDE (the rest overlaps the gain)
    t_out = max(0.0, hw[i] + hw[j] + OVERTAKE_SIDE - abs(lat_i)) / rate
    rel = s[j] + hl[j] + s0 + 0.5 * v[j] + hl[i] - s[i]
    t_gain = _gain_time(rel, v[i], vp, v[j], amax[i])
    if t_gain >= INF:
        return INF, INF
    t_back = abs(out_w) / _lat_rate(vp)
    dist = v[j] * (t_out + t_gain) + max(rel, 0.0) + vp * t_back
    return t_out + t_gain + t_back, dist


@nb.njit(cache=True)
def _oncoming_clear(i, lane, s, v, hl, vfac, vcap, otk, lane_vmax, length, pred, left, right,
                    left_same, right_same, li, o, s_from, s_to, t_left):
    """Whether the oncoming lane ``o`` beside lane ``li`` (and the lanes leading into it, two
    deep, and the lanes of its direction beside it, from which a vehicle may change into it) is
    free for an overtake from ``s_from`` to ``s_to`` (along ``li``) lasting ``t_left``
    s: no vehicle on it there, nor one that could get there meanwhile at its desired speed (plus
    OVERTAKE_MARGIN_T s and OVERTAKE_MARGIN_M m); no other overtake under way on ``li`` near."""
    n = lane.shape[0]
    ratio = length[li] / max(length[o], 1e-3)
    for k in range(n):
        if k == i:
            continue
        lk = lane[k]
        if lk == li:
            if otk[k] != OTK_OFF and s[k] + hl[k] > s_from - 30.0 and s[k] - hl[k] < s_to + 30.0:
                return False
            continue
        p = -INF  # k's position along li (oncoming: it drives towards smaller p)
        if lk == o:
            p = (length[o] - s[k]) * ratio
        elif (lk == left[o] and left_same[o]) or (lk == right[o] and right_same[o]):
            p = (length[lk] - s[k]) * length[li] / max(length[lk], 1e-3)
        else:
            for q in range(pred.shape[1]):
                p1 = pred[o, q]
                if p1 < 0:
                    break
                if lk == p1:
                    p = length[li] + length[p1] - s[k]
                    break
                for q2 in range(pred.shape[1]):
                    p2 = pred[p1, q2]
                    if p2 < 0:
                        break
                    if lk == p2:
                        p = length[li] + length[p1] + length[p2] - s[k]
                        break
                if p > -INF:
                    break
        if p == -INF:
            continue
        vk = max(v[k], _v0(vfac[k], vcap[k], lane_vmax[lk]))
        reach = s_to + vk * (t_left + OVERTAKE_MARGIN_T) + OVERTAKE_MARGIN_M
        if p + hl[k] > s_from and p - hl[k] < reach:
            return False
    return True


@nb.njit(cache=True)
def overtakes(dt, decide, offset, ds, length, pts, yaw, junction, pred, left, right, left_same,
              right_same, pass_left, pass_right, lane_vmax, lane, s, v, hl, hw, vfac, vcap, amax,
              path, grant, lat, lcfrom, blocker, stuck, otk, otk_of, otk_off, otk_lane, otk_t,
              ego_xy, ego_v, walker_xy, walker_on_road, s0, xy, solid_left, solid_right, cls,
              pedal):
    """Overtaking a slow leader in the oncoming lane of a two-way road (``traffic.overtake``).

    Each step, for every vehicle overtaking (``otk`` OTK_OUT): back into its lane (OTK_BACK)
    once its rear is s0 + 0.5 s x the leader's speed past the leader's front; while its front is
    not yet beside the leader, back in behind it (abort; following it again) as soon as the rest
    of the manoeuvre no longer fits (the oncoming lane no longer free, the ego nearer than the
    reach below, the lane's end); beside it, it goes on if the rest still fits, else it drops
    back behind the leader before pulling in (OTK_FALL). With ``decide`` (at
    2 Hz), a vehicle starts one when

    - its leader on its lane is slow: its desired speed is OVERTAKE_SLOWER below ours (a
      bicycle), or it has stood OVERTAKE_STAND s with nothing ahead making it stand (broken down,
      parked); the leader is within OVERTAKE_REACH and not itself overtaking or changing lanes;
    - its lane is outside any junction and has an adjacent lane of the opposite direction (on
      the left where traffic keeps right, on the right where it keeps left), outside junctions;
    - the whole manoeuvre (pull out, gain on the leader, pull back in) ends OVERTAKE_END m before
      its lane's end (so never into or just before a junction), with nobody else on its lane up
      to there plus a car length;
    - the line between the lanes may be crossed (``pass_left``/``pass_right``: no solid line)
      all the way; with ``pedal`` >= 0 (the bicycles' class code, traffic.overtake_solid), a
      painted solid line too (``solid_left``/``solid_right``: a line, not a kerb or grass) where
      the leader is a bicycle (``cls``) riding at OVERTAKE_SOLID_SPEED or less, or stands as
      above;
    - the oncoming lane is free for it (:func:`_oncoming_clear`); the ego is farther than the
      manoeuvre's length + its speed (at least 30 km/h) x the manoeuvre's time + 20 m, and no
      walker is crossing within the manoeuvre's length + 10 m.

    Returns (overtakes started, aborted, vehicles with an overtake under way)."""
    n = lane.shape[0]
    started = 0
    aborted = 0
    for i in range(n):
        st = otk[i]
        if st == OTK_OFF:
            continue
        otk_t[i] += dt
        if st == OTK_BACK:
            continue
        j = otk_of[i]
        li = lane[i]
        o = otk_lane[i]
        if (left[li] != o and right[li] != o) or lane[j] != li:
            otk[i] = OTK_BACK  # off this road, or the leader left it: back in
            continue
        if st == OTK_FALL:
            if s[i] + hl[i] < s[j] - hl[j] - 0.3:
                otk[i] = OTK_BACK
            continue
        if s[i] - hl[i] >= s[j] + hl[j] + s0 + 0.5 * v[j]:
            otk[i] = OTK_BACK  # past it with room
            continue
        t_left, dist = _overtake_plan(i, j, lane, s, v, hl, hw, vfac, vcap, amax, lane_vmax, s0,
                                      otk_off[i], lat[i])
        s_end = s[i] + dist
        ok = t_left < INF and s_end <= length[li] - 0.5 * OVERTAKE_END
        if ok:  # the ego still well away
            reach = dist + max(ego_v, 8.3) * t_left + 20.0
            ok = (ego_xy[0] - xy[i, 0]) ** 2 + (ego_xy[1] - xy[i, 1]) ** 2 >= reach * reach
        if ok:
            ok = _oncoming_clear(i, lane, s, v, hl, vfac, vcap, otk, lane_vmax, length, pred, left,
                                 right, left_same, right_same, li, o, s[i] - hl[i], s_end + hl[i],
                                 t_left)
        if ok:
            continue
        aborted += 1
        if s[i] + hl[i] < s[j] - hl[j] - 0.3:
            otk[i] = OTK_BACK
        else:
            otk[i] = OTK_FALL
    if not decide:
        return started, aborted, _count_active(otk)
    for i in range(n):
        li = lane[i]
        if (otk[i] != OTK_OFF or lat[i] != 0.0 or lcfrom[i] >= 0 or grant[i] >= 0
                or junction[li] >= 0):
            continue
        if left[li] >= 0 and not left_same[li] and junction[left[li]] < 0:
            o = left[li]
            side_ok = pass_left
            side_solid = solid_left
        elif right[li] >= 0 and not right_same[li] and junction[right[li]] < 0:
            o = right[li]
            side_ok = pass_right
            side_solid = solid_right
        else:
            continue
        here = min(offset[li] + int(s[i] / max(ds[li], 1e-6)), offset[li + 1] - 1)
        if not side_ok[here] and not (pedal >= 0 and side_solid[here]):
            continue  # no line to cross here (checked all the way below)
        # the leader on this lane
        j = -1
        sj = INF
        for k in range(n):
            if k != i and lane[k] == li and s[k] > s[i] and s[k] < sj:
                j = k
                sj = s[k]
        if j < 0 or s[j] - hl[j] - s[i] - hl[i] > OVERTAKE_REACH:
            continue
        if otk[j] != OTK_OFF or lat[j] != 0.0 or lcfrom[j] >= 0:
            continue
        v0i = _v0(vfac[i], vcap[i], lane_vmax[li])
        v0j = _v0(vfac[j], vcap[j], lane_vmax[li])
        slow = v0j <= v0i - OVERTAKE_SLOWER
        standing = v[j] < 0.3 and stuck[j] >= OVERTAKE_STAND and blocker[j] == NO_BLOCKER
        if not slow and not standing:
            continue
        if pedal >= 0 and (standing or (cls[j] == pedal and v[j] <= OVERTAKE_SOLID_SPEED)):
            side_ok = side_solid  # a solid line may be crossed too
        if not side_ok[here]:
            continue
        # how far over: the oncoming lane's centre, sideways from ours (right +)
        x, y, h = lane_pose(offset, ds, length, pts, yaw, li, s[i])
        xo, yo, _ = lane_pose(offset, ds, length, pts, yaw, o,
                              length[o] - s[i] * length[o] / max(length[li], 1e-3))
        off = -(xo - x) * math.sin(h) + (yo - y) * math.cos(h)
        if abs(off) < hw[i] + hw[j] + OVERTAKE_SIDE:
            continue
        t_man, dist = _overtake_plan(i, j, lane, s, v, hl, hw, vfac, vcap, amax, lane_vmax, s0, off,
                                     0.0)
        if t_man >= INF:
            continue
        s_end = s[i] + dist
        if s_end > length[li] - OVERTAKE_END:
            continue
        # nobody else on our lane up to the end plus a car length
        free = True
        for k in range(n):
            if k != i and k != j and lane[k] == li and s[k] + hl[k] > s[i] and \
                    s[k] - hl[k] < s_end + 2.0 * hl[i] + s0:
                free = False
                break
        if not free:
            continue
        # no solid line between the lanes from our rear to the end
        a = offset[li]
        p0 = a + int(max(s[i] - hl[i], 0.0) / max(ds[li], 1e-6))
        p1 = a + int(min(s_end + hl[i], length[li]) / max(ds[li], 1e-6))
        for p in range(p0, min(p1 + 1, offset[li + 1])):
            if not side_ok[p]:
                free = False
                break
        if not free:
            continue
        # the ego and crossing walkers well away
        reach = dist + max(ego_v, 8.3) * t_man + 20.0
        if (ego_xy[0] - xy[i, 0]) ** 2 + (ego_xy[1] - xy[i, 1]) ** 2 < reach * reach:
            continue
        for w in range(walker_xy.shape[0]):
            if walker_on_road[w]:
                dx = walker_xy[w, 0] - xy[i, 0]
                dy = walker_xy[w, 1] - xy[i, 1]
                if dx * dx + dy * dy < (dist + 10.0) ** 2:
                    free = False
                    break
        if not free:
            continue
        if not _oncoming_clear(i, lane, s, v, hl, vfac, vcap, otk, lane_vmax, length, pred, left,
                               right, left_same, right_same, li, o, s[i] - hl[i], s_end + hl[i],
                               t_man):
            continue
        otk[i] = OTK_OUT
        otk_of[i] = j
        otk_off[i] = off
        otk_lane[i] = o
        otk_t[i] = 0.0
        started += 1
    return started, aborted, _count_active(otk)


@nb.njit(cache=True, inline="always")
def _count_active(otk):
    c = 0
    for i in range(otk.shape[0]):
        if otk[i] != OTK_OFF:
            c += 1
    return c
