"""Built-in driving towns, generated in code as OpenDRIVE (.xodr) text.

The towns are built with the ``scenariogeneration`` package (its ``xodr`` module) and are meant to
be parsed by the ``carla`` client's offline OpenDRIVE parser (``carla.Map(name, text)``). Every
town is a closed network: every driving lane has a successor and a predecessor and the directed
lane graph is strongly connected, so vehicles can drive forever and a route exists between any
two lanes.

How a town is put together
--------------------------
* A town is a set of *nodes* (junction centres) and *roads*. Each road starts and ends at an
  *arm* of a node: the point at distance ``d`` (the node's half size) from the centre, in the
  arm's direction. Roads are placed at fixed, absolute start points, so loops close exactly.
* Road shapes are straight lines, fillets (line + arc + line) or G2 clothoid fits (three
  spirals, the same solver scenariogeneration uses for its junction roads).
* Roads have 3.5 m driving lanes and a 2 m sidewalk lane on each outer edge (double yellow
  centre line, broken white between same-direction lanes, solid white at the kerb).
* Each node becomes a ``CommonJunctionCreator`` junction in cartesian mode, using the real
  global end poses of its roads, with one single-lane, unmarked connecting road per lane
  movement, like CARLA's own towns: lane k -> lane k for straight movements and for turns
  between roads with as many lanes (dual turns on the avenues, so that no lane is trapped on a
  loop it cannot leave); between roads with different lane counts, right turns go outermost ->
  outermost and left turns innermost -> innermost. There are no U-turns.
* Signalised nodes get one ``<signal type="1000001" dynamic="yes">`` (the type CARLA uses for
  traffic lights) on every incoming road, just before the junction, with a ``<validity>`` over
  the incoming driving lanes, plus an OpenDRIVE ``<controller>`` per junction grouping them.

``random-<seed>`` names a town drawn from a seed (:func:`_layout_random`): a jittered lattice of
junctions and bends, never tuned on, for held-out evaluation and for testing the traffic and the
expert on networks nobody has seen (docs/maps.md, "Generated towns").

``scenariogeneration`` is imported lazily inside the builder so importing this module is cheap.
"""

from __future__ import annotations

import functools
import math
import xml.etree.ElementTree as ET

__all__ = ["BUILTIN_TOWNS", "RANDOM_PREFIX", "builtin_town_xodr", "is_builtin_town", "random_town_seed"]

BUILTIN_TOWNS: dict[str, str] = {
    "grid": (
        "240 m x 240 m block grid (3x3 blocks) of straight two-way streets, one 3.5 m lane each "
        "way plus sidewalks; 4 signalised 4-way junctions inside, 8 unsignalised T-junctions on "
        "the edges and curved corners, no dead ends"
    ),
    "curves": (
        "about 255 m x 235 m network of curving two-way roads (arcs and clothoid spirals, one "
        "3.5 m lane each way plus sidewalks) joined by 4 unsignalised T-junctions, no dead ends"
    ),
    "avenue": (
        "270 m x 270 m grid with two-lane-per-direction avenues (perimeter ring and two cross "
        "avenues) and single-lane side streets; 4 signalised 4-way junctions inside, 8 "
        "unsignalised T-junctions on the edges and curved corners, no dead ends"
    ),
}

# Cross section (metres).
LANE_WIDTH = 3.5
SIDEWALK_WIDTH = 2.0
# Header date written into every file, so the text is deterministic (scenariogeneration would
# otherwise write the current time).
_HEADER_DATE = "2024-01-01T00:00:00"
TRAFFIC_LIGHT_TYPE = "1000001"
# Spirals whose curvature changes by less than this are written as arcs (or lines).
_CURVATURE_EPS = 1e-6


@functools.lru_cache(maxsize=64)
def builtin_town_xodr(name: str) -> str:
    """Return the OpenDRIVE XML text of the built-in town ``name``: one of :data:`BUILTIN_TOWNS`,
    or a town generated from a seed, ``random-<seed>`` (:func:`_layout_random`).

    The text is deterministic (the same string on every call, in every process) and cached per
    name. Raises ``ValueError`` listing the valid names when ``name`` is neither.
    """
    seed = random_town_seed(name)
    if seed is None and (not isinstance(name, str) or name not in BUILTIN_TOWNS):
        raise ValueError(
            f"unknown built-in town {name!r}; valid names are: {', '.join(BUILTIN_TOWNS)}, or "
            f"{RANDOM_PREFIX}<seed> for a town generated from a seed (a whole number, e.g. "
            f"{RANDOM_PREFIX}7)"
        )
    builder = _TownBuilder(name)
    if seed is not None:
        _layout_random(builder, seed)
    else:
        _LAYOUTS[name](builder)
    return builder.to_xodr()


def is_builtin_town(name) -> bool:
    """Whether ``name`` is a town generated in code: a built-in layout or ``random-<seed>``."""
    return (isinstance(name, str) and name in BUILTIN_TOWNS) or random_town_seed(name) is not None


# --------------------------------------------------------------------------------------------
# geometry helpers (plain math; no scenariogeneration needed)
# --------------------------------------------------------------------------------------------


def _wrap(angle: float) -> float:
    """Wrap an angle to (-pi, pi]."""
    a = math.fmod(angle + math.pi, 2.0 * math.pi)
    if a <= 0.0:
        a += 2.0 * math.pi
    return a - math.pi


def _clean_geometries(geoms, xodr):
    """Replace degenerate spirals by lines / arcs.

    The G2 clothoid solver (used by scenariogeneration for junction roads and here for curved
    roads) returns spirals whose start and end curvature are equal (really an arc) or both ~0
    (really a line). CARLA's OpenDRIVE parser divides by the curvature rate of a spiral and
    returns NaN positions for a spiral with equal start and end curvature, so those are written
    as arcs; near-straight ones are written as lines.
    """
    out = []
    for g in geoms:
        if isinstance(g, xodr.Spiral):
            k0, k1 = float(g.curvstart), float(g.curvend)
            if abs(k1 - k0) < _CURVATURE_EPS:
                k = 0.5 * (k0 + k1)
                g = xodr.Line(g.length) if abs(k) < _CURVATURE_EPS else xodr.Arc(k, length=g.length)
        out.append(g)
    return out


def _clean_planview(road, xodr) -> None:
    geoms = _clean_geometries(list(road.planview._raw_geometries), xodr)
    pv = xodr.PlanView()
    for g in geoms:
        pv.add_geometry(g)
    road.planview = pv


def _sample_reference_lines(root, step: float = 1.0) -> tuple[list[float], list[float]]:
    """Points every ~``step`` m along all <geometry> records (line, arc, spiral) of ``root``."""
    xs: list[float] = []
    ys: list[float] = []
    for g in root.iter("geometry"):
        x, y, h, length = (float(g.get(k)) for k in ("x", "y", "hdg", "length"))
        shape = g[0]
        if shape.tag == "arc":
            k0 = k1 = float(shape.get("curvature"))
        elif shape.tag == "spiral":
            k0, k1 = float(shape.get("curvStart")), float(shape.get("curvEnd"))
        else:
            k0 = k1 = 0.0
        n = max(1, int(math.ceil(length / step)))
        ds = length / n
        xs.append(x)
        ys.append(y)
        for i in range(n):
            s_mid = (i + 0.5) * ds
            k_mid = k0 + (k1 - k0) * s_mid / length if length > 0 else k0
            h_mid = h + 0.5 * ds * k_mid
            x += ds * math.cos(h_mid)
            y += ds * math.sin(h_mid)
            h += ds * k_mid
            xs.append(x)
            ys.append(y)
    return xs, ys


def _unmark(road, xodr) -> None:
    """No painted lines inside junctions (as in CARLA's towns)."""
    for section in road.lanes.lanesections:
        for lane in [section.centerlane, *section.leftlanes, *section.rightlanes]:
            lane.roadmark = [xodr.RoadMark(xodr.RoadMarkType.none)]


class _Node:
    """A junction centre. ``d`` is the distance from the centre to the ends of its roads."""

    def __init__(self, nid: int, x: float, y: float, d: float, signalised: bool) -> None:
        self.id = nid
        self.x = x
        self.y = y
        self.d = d
        self.signalised = signalised
        # (road spec, "start" | "end") for every road touching this node, in insertion order
        self.arms: list[tuple["_RoadSpec", str]] = []

    def arm_pose(self, angle: float) -> tuple[float, float, float]:
        """Pose of the arm end point, heading pointing away from the node."""
        return (self.x + self.d * math.cos(angle), self.y + self.d * math.sin(angle), angle)


class _RoadSpec:
    def __init__(self, rid, start, end, n_left, n_right, shape, radius):
        self.id = rid
        self.start = start  # (x, y, heading)
        self.end = end  # (x, y, heading), heading in driving (+s) direction
        self.n_left = n_left
        self.n_right = n_right
        self.shape = shape
        self.radius = radius
        self.via: tuple[tuple[float, float, float], ...] = ()
        self.start_node: _Node | None = None
        self.end_node: _Node | None = None
        self.road = None  # scenariogeneration Road


def _adjust_roads_and_lanes(odr) -> None:
    """``odr.adjust_roads_and_lanes()`` without its lane-link test of every pair of roads (which
    grows with the square of the roads: hours for a town of thousands): lane links are made for
    the pairs of roads that link to each other, which are all the pairs that test links, in the
    same order."""
    from scenariogeneration.xodr.enumerations import ElementType  # noqa: PLC0415
    from scenariogeneration.xodr.links import create_lane_links  # noqa: PLC0415

    odr.adjust_startpoints()
    keys = list(odr.roads)
    pos = {k: i for i, k in enumerate(keys)}
    pairs = set()
    for k, road in odr.roads.items():
        for link in (road.predecessor, road.successor):
            if link is not None and link.element_type == ElementType.road:
                other = str(link.element_id)
                if other in pos and other != k:
                    pairs.add(tuple(sorted((pos[k], pos[other]))))
    for i, j in sorted(pairs):
        create_lane_links(odr.roads[keys[i]], odr.roads[keys[j]])


class _TownBuilder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: dict[int, _Node] = {}
        self.roads: list[_RoadSpec] = []

    # ---- layout API -------------------------------------------------------------------------
    def node(self, nid: int, x: float, y: float, d: float, signalised: bool = False) -> _Node:
        if nid in self.nodes:
            raise ValueError(f"duplicate node {nid}")
        n = _Node(nid, float(x), float(y), float(d), signalised)
        self.nodes[nid] = n
        return n

    def road(self, start_node: int, start_angle_deg: float, end_node: int, end_angle_deg: float,
             lanes: int | tuple[int, int] = 1, shape: str = "auto", radius: float = 0.0,
             via: tuple[tuple[float, float, float], ...] = ()) -> _RoadSpec:
        """Add a two-way road from arm ``start_angle_deg`` of ``start_node`` to arm
        ``end_angle_deg`` of ``end_node`` (angles in degrees, counter-clockwise from +x, measured
        at the node pointing away from it).

        ``lanes`` is the number of driving lanes per direction (or ``(left, right)``).
        ``shape``: "line", "fillet" (line-arc-line of ``radius``), "clothoid" (G2 fit, through
        the optional ``via`` poses ``(x, y, heading_deg)``) or "auto" (line when the end poses
        are collinear, else clothoid).
        """
        n_left, n_right = (lanes, lanes) if isinstance(lanes, int) else lanes
        s_node, e_node = self.nodes[start_node], self.nodes[end_node]
        start = s_node.arm_pose(math.radians(start_angle_deg))
        ex, ey, eh = e_node.arm_pose(math.radians(end_angle_deg))
        end = (ex, ey, _wrap(eh + math.pi))
        spec = _RoadSpec(len(self.roads) + 1, start, end, n_left, n_right, shape, radius)
        spec.via = tuple((float(x), float(y), math.radians(h)) for x, y, h in via)
        spec.start_node, spec.end_node = s_node, e_node
        s_node.arms.append((spec, "start"))
        e_node.arms.append((spec, "end"))
        self.roads.append(spec)
        return spec

    # ---- geometry ---------------------------------------------------------------------------
    def _geometries(self, spec: _RoadSpec, xodr):
        x0, y0, h0 = spec.start
        x1, y1, h1 = spec.end
        dx, dy = x1 - x0, y1 - y0
        dist = math.hypot(dx, dy)
        shape = spec.shape
        collinear = (
            abs(_wrap(h1 - h0)) < 1e-9
            and abs(-math.sin(h0) * dx + math.cos(h0) * dy) < 1e-6
            and (math.cos(h0) * dx + math.sin(h0) * dy) > 0
        )
        if shape == "auto":
            shape = "line" if collinear else "clothoid"
        if shape == "line":
            if not collinear:
                raise ValueError(f"road {spec.id}: end poses are not collinear")
            return [xodr.Line(dist)]
        if shape == "fillet":
            turn = _wrap(h1 - h0)
            # intersection of the two tangent lines: p0 + a*t0 = p1 - b*t1
            c0, s0, c1, s1 = math.cos(h0), math.sin(h0), math.cos(h1), math.sin(h1)
            det = c0 * s1 - s0 * c1  # solve a * t0 + b * t1 = p1 - p0
            if abs(det) < 1e-9:
                raise ValueError(f"road {spec.id}: fillet needs non-parallel ends")
            a = (dx * s1 - c1 * dy) / det
            b = (c0 * dy - s0 * dx) / det
            tangent = spec.radius * math.tan(abs(turn) / 2.0)
            if a < tangent - 1e-9 or b < tangent - 1e-9:
                raise ValueError(f"road {spec.id}: fillet radius {spec.radius} too large")
            curvature = math.copysign(1.0 / spec.radius, turn)
            geoms = []
            if a - tangent > 1e-6:
                geoms.append(xodr.Line(a - tangent))
            geoms.append(xodr.Arc(curvature, angle=abs(turn)))
            if b - tangent > 1e-6:
                geoms.append(xodr.Line(b - tangent))
            return geoms
        if shape == "clothoid":
            import pyclothoids  # noqa: PLC0415 - a dependency of scenariogeneration

            k0 = xodr.generators.STD_START_CLOTH
            poses = [spec.start, *spec.via, spec.end]
            geoms = []
            for (xa, ya, ha), (xb, yb, hb) in zip(poses[:-1], poses[1:]):
                segs = pyclothoids.SolveG2(xa, ya, ha, k0, xb, yb, hb, k0)
                geoms += [xodr.Spiral(s.KappaStart, s.KappaEnd, length=s.length) for s in segs]
            return _clean_geometries(geoms, xodr)
        raise ValueError(f"road {spec.id}: unknown shape {shape!r}")

    def _lanes(self, n_left: int, n_right: int, xodr):
        """One lane section: sidewalk | n_left driving | centre | n_right driving | sidewalk.
        Marks: double solid yellow centre line, broken white between same-direction lanes,
        solid white at the kerb."""
        center = xodr.Lane(lane_type=xodr.LaneType.none)
        center.add_roadmark(
            xodr.RoadMark(xodr.RoadMarkType.solid_solid, width=0.15, color=xodr.RoadMarkColor.yellow)
        )
        section = xodr.LaneSection(0, center)
        for side, n in (("right", n_right), ("left", n_left)):
            add = section.add_right_lane if side == "right" else section.add_left_lane
            for k in range(1, n + 1):
                lane = xodr.Lane(lane_type=xodr.LaneType.driving, a=LANE_WIDTH)
                mark = xodr.RoadMarkType.solid if k == n else xodr.RoadMarkType.broken
                lane.add_roadmark(
                    xodr.RoadMark(mark, width=0.15, length=None if k == n else 3.0,
                                  space=None if k == n else 9.0, color=xodr.RoadMarkColor.white)
                )
                add(lane)
            walk = xodr.Lane(lane_type=xodr.LaneType.sidewalk, a=SIDEWALK_WIDTH)
            walk.add_roadmark(xodr.RoadMark(xodr.RoadMarkType.none))
            add(walk)
        lanes = xodr.Lanes()
        lanes.add_lanesection(section)
        return lanes

    # ---- assembly ---------------------------------------------------------------------------
    def to_xodr(self) -> str:
        from scenariogeneration import xodr  # noqa: PLC0415 - lazy: generation only

        odr = xodr.OpenDrive(self.name, geo_reference="+lat_0=0.0 +lon_0=0.0")
        for spec in self.roads:
            pv = xodr.PlanView()
            for g in self._geometries(spec, xodr):
                pv.add_geometry(g)
            road = xodr.Road(spec.id, pv, self._lanes(spec.n_left, spec.n_right, xodr))
            pv.set_start_point(*spec.start)
            pv.adjust_geometries()
            ex, ey, eh = pv.get_end_point()
            if math.hypot(ex - spec.end[0], ey - spec.end[1]) > 1e-6 or abs(_wrap(eh - spec.end[2])) > 1e-6:
                raise RuntimeError(
                    f"{self.name}: road {spec.id} ends at ({ex:.3f}, {ey:.3f}, {eh:.4f}) instead of "
                    f"{tuple(round(v, 3) for v in spec.end)}"
                )
            spec.road = road
            odr.add_road(road)

        signal_id = 1
        controllers = []  # (controller id, junction id, [signal ids])
        # junction ids above every road's, and the connecting roads' above both (in a town of
        # 100+ roads: carla's parser mislinks roads leading into a junction numbered as a road)
        jbase = 100
        while any(spec.id >= jbase for spec in self.roads):
            jbase *= 10
        first = 1000
        while first < jbase + len(self.nodes) or any(spec.id >= first for spec in self.roads):
            first *= 10
        for k, nid in enumerate(sorted(self.nodes)):
            node = self.nodes[nid]
            jid = jbase + k
            jc = xodr.CommonJunctionCreator(jid, f"junction_{nid}", startnum=first + 100 * k)
            arms = []
            for spec, contact in node.arms:
                if contact == "end":
                    x, y, h = spec.road.planview.get_end_point()
                    jc.add_incoming_road_cartesian_geometry(spec.road, x, y, h, "successor")
                    n_in, n_out = spec.n_right, spec.n_left
                    in_sign, out_sign = -1, 1
                    h_in, h_out = h, _wrap(h + math.pi)
                else:
                    x, y, h = spec.road.planview.get_start_point()
                    jc.add_incoming_road_cartesian_geometry(spec.road, x, y, _wrap(h + math.pi), "predecessor")
                    n_in, n_out = spec.n_left, spec.n_right
                    in_sign, out_sign = 1, -1
                    h_in, h_out = _wrap(h + math.pi), h
                arms.append((spec, contact, n_in, n_out, in_sign, out_sign, h_in, h_out))

            moves = {}  # (arm in, arm out) -> lane pairs
            for a_in in arms:
                for a_out in arms:
                    if a_in is not a_out:
                        moves[id(a_in), id(a_out)] = self._movements(a_in, a_out)
            # every lane in gets a way on and every lane out a way in (the hand-made layouts
            # have them from _movements alone, so their text is as it was)
            self._fill_movements(arms, moves)
            for a_in in arms:
                for a_out in arms:
                    for lane_in, lane_out in moves.get((id(a_in), id(a_out)), ()):
                        jc.add_connection(a_in[0].id, a_out[0].id, lane_in, lane_out)
            if len(jc.get_connecting_roads()) >= 100:
                raise RuntimeError(f"{self.name}: too many connecting roads at node {nid}")
            for connecting_road in jc.get_connecting_roads():
                _clean_planview(connecting_road, xodr)
                _unmark(connecting_road, xodr)
            odr.add_junction_creator(jc)

            if node.signalised:
                ids = []
                for spec, contact, n_in, _n_out, in_sign, *_ in arms:
                    length = spec.road.planview.get_total_length()
                    if contact == "end":
                        s = length - 1.0
                        t = -(spec.n_right * LANE_WIDTH + 0.5 * SIDEWALK_WIDTH)
                        orientation = xodr.Orientation.positive
                    else:
                        s = 1.0
                        t = spec.n_left * LANE_WIDTH + 0.5 * SIDEWALK_WIDTH
                        orientation = xodr.Orientation.negative
                    sig = xodr.Signal(
                        s=round(s, 6), t=t, country="OpenDRIVE", Type=TRAFFIC_LIGHT_TYPE,
                        subtype="-1", id=str(signal_id), name="Signal_3Light_Post01",
                        dynamic=xodr.Dynamic.yes, zOffset=0.0, orientation=orientation,
                        height=5.0, width=0.5,
                    )
                    lanes = sorted((in_sign, in_sign * n_in))
                    sig.add_validity(lanes[0], lanes[1])
                    # appended directly: Road.add_signal() would renumber ids through a
                    # process-wide registry, which would make the text differ between calls.
                    spec.road.signals.append(sig)
                    ids.append(signal_id)
                    signal_id += 1
                controllers.append((len(controllers) + 1, jid, ids))

        _adjust_roads_and_lanes(odr)
        root = odr.get_element()
        return self._finish(root, controllers)

    @staticmethod
    def _turn(a_in, a_out) -> float:
        """The turn in degrees (left positive) from arm ``a_in`` into arm ``a_out``."""
        return math.degrees(_wrap(a_out[7] - a_in[6]))

    def _fill_movements(self, arms, moves) -> None:
        """Give every incoming lane a way on and every outgoing lane a way in, where
        :meth:`_movements` left one without, between roads with different lane counts: a
        three-lane road's middle lane where its ways on only turn, or a two-lane road whose two
        ways in both turn left (115 of generated towns' seeds 0-299 have one or more): lane k ->
        lane min(k, n) through the arm with the smallest turn. An arm is
        ``(road, contact, n_in, n_out, in_sign, out_sign, heading_in, heading_out)``, as
        :meth:`to_xodr` builds it; ``moves[id(arm in), id(arm out)]`` its (lane in, lane out)
        pairs."""
        for side in (0, 1):  # 0: lanes into the junction want a way on; 1: lanes out a way in
            for a in arms:
                def pair(b, a=a, side=side):  # (arm in, arm out) between a and b
                    return (a, b) if side == 0 else (b, a)

                others = sorted((b for b in arms if b is not a and b[3 - side] > 0),
                                key=lambda b: abs(self._turn(*pair(b))))
                have = {abs(lanes[side]) for b in arms if b is not a
                        for lanes in moves[tuple(map(id, pair(b)))]}
                for k in range(1, a[2 + side] + 1):
                    if k not in have and others:
                        b = others[0]
                        lanes = [0, 0]  # (lane in, lane out)
                        lanes[side] = a[4 + side] * k
                        lanes[1 - side] = b[5 - side] * min(k, b[3 - side])
                        moves[tuple(map(id, pair(b)))].append(tuple(lanes))

    @staticmethod
    def _movements(a_in, a_out):
        """Lane pairs (incoming lane id, outgoing lane id) for one movement through a node."""
        _, _, n_in, _, in_sign, _, h_in, _ = a_in
        _, _, _, n_out, _, out_sign, _, h_out = a_out
        if n_in == 0 or n_out == 0:
            return []
        turn = math.degrees(_wrap(h_out - h_in))
        if n_in == n_out or abs(turn) <= 30.0:
            # straight, or a turn between roads with as many lanes: lane k -> lane k (dual
            # turns on multi-lane roads, so that no lane is trapped on a loop it can't leave);
            # extra lanes merge into / split from the outermost one.
            n = max(n_in, n_out)
            pairs = [(min(k, n_in), min(k, n_out)) for k in range(1, n + 1)]
        elif turn < 0:  # right turn between different lane counts: outermost -> outermost
            pairs = [(n_in, n_out)]
        else:  # left turn between different lane counts: innermost -> innermost
            pairs = [(1, 1)]
        return [(in_sign * i, out_sign * o) for i, o in pairs]

    def _finish(self, root, controllers) -> str:
        header = root.find("header")
        if header is not None:
            header.set("date", _HEADER_DATE)
            # bounding box of the road reference lines
            xs, ys = _sample_reference_lines(root)
            if xs:
                for key, value in (("north", max(ys)), ("south", min(ys)), ("east", max(xs)), ("west", min(xs))):
                    header.set(key, f"{round(value, 3) + 0.0:.3f}")
        # OpenDRIVE order: header, road*, controller*, junction*
        first_junction = next((i for i, el in enumerate(root) if el.tag == "junction"), len(root))
        junctions = {int(j.get("id")): j for j in root.findall("junction")}
        for offset, (cid, jid, ids) in enumerate(controllers):
            ctrl = ET.Element("controller", {"id": str(cid), "name": f"controller_junction_{jid}", "sequence": "0"})
            for sid in ids:
                ET.SubElement(ctrl, "control", {"signalId": str(sid), "type": "0"})
            root.insert(first_junction + offset, ctrl)
            ET.SubElement(junctions[jid], "controller", {"id": str(cid), "type": "0", "sequence": "0"})
        ET.indent(root, space="  ")
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# --------------------------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------------------------


def _grid_layout(b: _TownBuilder, spacing: float, n_lanes_row, n_lanes_col, corner_lanes: int,
                 corner_radius: float, signalised_inner: bool) -> None:
    """A 4x4 lattice of nodes (3x3 blocks): 4-way junctions inside, T-junctions on the edges,
    and the four corners turned by fillet roads. ``n_lanes_row(j)`` / ``n_lanes_col(i)`` give
    the lanes per direction of row ``j`` / column ``i`` (the edge rows/columns are the ring)."""
    n = 4

    def nid(i, j):
        return 10 * i + j

    def half(lanes):
        return lanes * LANE_WIDTH + SIDEWALK_WIDTH

    for i in range(n):
        for j in range(n):
            if i in (0, n - 1) and j in (0, n - 1):
                continue  # corners are curved roads
            widest = max(half(n_lanes_row(j)), half(n_lanes_col(i)))
            inner = 0 < i < n - 1 and 0 < j < n - 1
            b.node(nid(i, j), i * spacing, j * spacing, d=widest + 6.0, signalised=signalised_inner and inner)
    # rows (west -> east)
    for j in range(n):
        for i in range(n - 1):
            if (i, j) in ((0, 0), (0, n - 1)) or (i + 1, j) in ((n - 1, 0), (n - 1, n - 1)):
                continue
            b.road(nid(i, j), 0, nid(i + 1, j), 180, lanes=n_lanes_row(j), shape="line")
    # columns (south -> north)
    for i in range(n):
        for j in range(n - 1):
            if (i, j) in ((0, 0), (n - 1, 0)) or (i, j + 1) in ((0, n - 1), (n - 1, n - 1)):
                continue
            b.road(nid(i, j), 90, nid(i, j + 1), 270, lanes=n_lanes_col(i), shape="line")
    # corners, counter-clockwise around the ring
    last = n - 1
    b.road(nid(1, 0), 180, nid(0, 1), 270, lanes=corner_lanes, shape="fillet", radius=corner_radius)
    b.road(nid(last, 1), 270, nid(last - 1, 0), 0, lanes=corner_lanes, shape="fillet", radius=corner_radius)
    b.road(nid(last - 1, last), 0, nid(last, last - 1), 90, lanes=corner_lanes, shape="fillet", radius=corner_radius)
    b.road(nid(0, last - 1), 90, nid(1, last), 180, lanes=corner_lanes, shape="fillet", radius=corner_radius)


def _layout_grid(b: _TownBuilder) -> None:
    _grid_layout(b, spacing=80.0, n_lanes_row=lambda j: 1, n_lanes_col=lambda i: 1,
                 corner_lanes=1, corner_radius=25.0, signalised_inner=True)


def _layout_avenue(b: _TownBuilder) -> None:
    # rows are avenues (2 lanes each way); inner columns are side streets (1 lane each way);
    # the outer columns belong to the avenue ring.
    _grid_layout(b, spacing=90.0, n_lanes_row=lambda j: 2, n_lanes_col=lambda i: 2 if i in (0, 3) else 1,
                 corner_lanes=2, corner_radius=30.0, signalised_inner=True)


def _layout_curves(b: _TownBuilder) -> None:
    d = 12.0
    # the side T's have a branch at 60 deg from their north / south arm: a bit more room
    b.node(1, 0.0, 0.0, d + 2.0)  # west T: north, south, and a branch towards the middle (30 deg)
    b.node(2, 250.0, 0.0, d + 2.0)  # east T: north, south, and a branch towards the middle (210 deg)
    b.node(3, 125.0, 125.0, d)  # north T on the top arc: west, east, south
    b.node(4, 135.0, 5.0, d)  # middle T: west, east, north
    # top: a line-arc-line fillet (R = 90 m) and a clothoid curve, meeting at the north T
    b.road(1, 90, 3, 180, shape="fillet", radius=90.0)
    b.road(3, 0, 2, 90, shape="clothoid")
    # bottom: one long U-shaped road from west T to east T, through a pose at the bottom
    b.road(1, 270, 2, 270, shape="clothoid", via=((125.0, -105.0, 0.0),))
    # middle: S-curves between the side T's and the middle T
    b.road(1, 30, 4, 180, shape="clothoid")
    b.road(4, 0, 2, 210, shape="clothoid")
    # north T down to the middle T: S-curve
    b.road(3, 270, 4, 90, shape="clothoid")


_LAYOUTS = {"grid": _layout_grid, "curves": _layout_curves, "avenue": _layout_avenue}


# ---- procedurally generated towns ----------------------------------------------------------


RANDOM_PREFIX = "random-"


def random_town_seed(name) -> int | None:
    """The seed of a generated town's name (``random-<seed>``, seed a whole number >= 0 written
    without leading zeros, so one town has one name), or None when ``name`` is not such a name."""
    if not isinstance(name, str) or not name.startswith(RANDOM_PREFIX):
        return None
    tail = name[len(RANDOM_PREFIX):]
    ok = tail.isascii() and tail.isdigit() and str(int(tail)) == tail
    return int(tail) if ok else None


def _layout_random(b: _TownBuilder, seed: int) -> None:
    """A town drawn from ``seed``: a jittered lattice of 3-5 x 3-5 nodes, 60-120 m apart, whose
    lattice links are roads; some links are left out (never leaving a node with fewer than two
    roads, or the network in pieces). Nodes with three or more roads are junctions (half of
    them signalised); a node with two is a bend the road passes through (a clothoid through
    the node). Each road, bends included, gets one or two lanes each way (a third of them two;
    a quarter of those without bends three). Some unsignalised junctions of one-lane roads are
    roundabouts (:func:`_roundabouts`): a junction per arm on a circle of RING_RADIUS, joined
    counter-clockwise by one-way ring roads. Junction arms point at the next node along their
    road, so the angles between them are what the jitter makes (about 65-115 degrees); where the
    builder's movements leave a lane without a way on or in (a three-lane road's middle lane at
    turns, say), :meth:`_TownBuilder._fill_movements` adds one, so the network is closed
    (tests/test_towns.py checks it over seeds). Deterministic for a seed, on any machine
    (Python's ``random.Random``)."""
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    nx, ny = rng.randint(3, 5), rng.randint(3, 5)
    sx, sy = rng.uniform(60.0, 120.0), rng.uniform(60.0, 120.0)
    pos = {(i, j): (i * sx + rng.uniform(-0.15, 0.15) * sx, j * sy + rng.uniform(-0.15, 0.15) * sy)
           for i in range(nx) for j in range(ny)}
    edges = {frozenset(((i, j), (i + 1, j))) for i in range(nx - 1) for j in range(ny)}
    edges |= {frozenset(((i, j), (i, j + 1))) for i in range(nx) for j in range(ny - 1)}

    def neighbours(es, n):
        return [next(iter(e - {n})) for e in es if n in e]

    def connected(es):
        start = next(iter(pos))
        seen, todo = {start}, [start]
        while todo:
            for m in neighbours(es, todo.pop()):
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return len(seen) == len(pos)

    def chains_of(es):
        """Roads: from a junction arm through bends (two links) to a junction arm."""
        deg = {n: len(neighbours(es, n)) for n in pos}
        out, used = [], set()
        for n in sorted(m for m in pos if deg[m] >= 3):
            for m in sorted(neighbours(es, n)):
                if frozenset((n, m)) in used:
                    continue
                chain = [n, m]
                used.add(frozenset((n, m)))
                while deg[chain[-1]] == 2:
                    nxt = [k for k in neighbours(es, chain[-1]) if frozenset((chain[-1], k)) not in used]
                    if not nxt:
                        break
                    used.add(frozenset((chain[-1], nxt[0])))
                    chain.append(nxt[0])
                out.append(chain)
        return out

    # corners have two links: they are bends. Leave out about a fifth of the other links, where
    # every node keeps two, the network stays in one piece with three junctions or more, and no
    # road comes back to the junction it leaves (a junction takes each road at one arm).
    for e in sorted(edges, key=lambda e: sorted(e)):
        if rng.random() >= 0.2:
            continue
        rest = edges - {e}
        if (all(len(neighbours(rest, n)) >= 2 for n in e) and connected(rest)
                and sum(len(neighbours(rest, n)) >= 3 for n in pos) >= 3
                and all(c[0] != c[-1] for c in chains_of(rest))):
            edges = rest
    junctions = sorted(n for n in pos if len(neighbours(edges, n)) >= 3)
    chains = chains_of(edges)

    def angle(a, c):
        return math.atan2(pos[c][1] - pos[a][1], pos[c][0] - pos[a][0])

    lanes = [1 if rng.random() < 2 / 3 else 2 for _ in chains]
    # a quarter of the two-lane roads without bends have three lanes each way (through a bend a
    # three-lane road's outer lane can fold back on itself); their own random stream, so the
    # rest of the town is what the seed gave before they existed
    wide = random.Random(f"wide-{seed}")
    lanes = [3 if wide.random() < 0.25 and k == 2 and len(c) == 2 else k for k, c in zip(lanes, chains)]
    # arms of each junction: angle -> half width of its road
    arms: dict = {n: [] for n in junctions}
    for chain, k in zip(chains, lanes):
        half = k * LANE_WIDTH + SIDEWALK_WIDTH
        arms[chain[0]].append((angle(chain[0], chain[1]), half))
        arms[chain[-1]].append((angle(chain[-1], chain[-2]), half))
    size, sig = {}, {}
    for n in junctions:
        angs = sorted(arms[n])
        d = 0.0
        for (a0, w0), (a1, w1) in zip(angs, angs[1:] + angs[:1]):
            gap = (a1 - a0) % (2 * math.pi) or 2 * math.pi
            d = max(d, max(w0, w1) / math.tan(min(gap, math.pi * 0.999) / 2.0))
        size[n], sig[n] = d + 6.0, rng.random() < 0.5
    rings = _roundabouts(seed, junctions, arms, sig, pos, edges, neighbours)
    ids = {}
    for k, n in enumerate(junctions):
        ids[n] = k + 1
        if n not in rings:
            b.node(k + 1, *pos[n], d=size[n], signalised=sig[n])
    # a roundabout: one small junction per arm on a circle of RING_RADIUS, joined one way
    # (counter-clockwise: right-hand traffic) by ring roads; each arm's road ends at its own
    ring_node = {}
    next_id = len(junctions) + 1
    for n in sorted(rings):
        around = sorted(a for a, _ in arms[n])
        for a in around:  # its arms and the ring roads are all one lane each way (_roundabouts)
            x, y = pos[n][0] + RING_RADIUS * math.cos(a), pos[n][1] + RING_RADIUS * math.sin(a)
            b.node(next_id, x, y, d=RING_HALF + RING_MARGIN)
            ring_node[n, a] = next_id
            next_id += 1

    def end(n, a):
        """(node id, arm angle in degrees) where a road leaving ``n`` at angle ``a`` ends."""
        return (ring_node[n, a], math.degrees(a)) if n in rings else (ids[n], math.degrees(a))

    for chain, k in zip(chains, lanes):
        via = tuple((*pos[m], math.degrees(angle(p, q)))
                    for p, m, q in zip(chain, chain[1:-1], chain[2:]))
        b.road(*end(chain[0], angle(chain[0], chain[1])), *end(chain[-1], angle(chain[-1], chain[-2])),
               lanes=k, shape="clothoid" if via else "auto", via=via)
    for n in sorted(rings):
        around = sorted(a for a, _ in arms[n])
        for a0, a1 in zip(around, around[1:] + around[:1]):
            b.road(ring_node[n, a0], math.degrees(a0) + 90.0, ring_node[n, a1],
                   math.degrees(a1) - 90.0, lanes=(0, 1), shape="clothoid")


RING_RADIUS = 30.0  # m from a roundabout's centre to the junctions of its arms
RING_HALF = 1 * LANE_WIDTH + SIDEWALK_WIDTH  # a one-lane ring road's half width (kerb side)
RING_MARGIN = 4.0  # m beyond the widest road's half width to the ends of a ring junction's roads
RING_SHARE = 0.3  # of the junctions that can be a roundabout, the share that are


def _roundabouts(seed, junctions, arms, sig, pos, edges, neighbours) -> set:
    """The junctions of a generated town that become roundabouts: unsignalised, three or four
    roads of one lane each way (the ring has one) at least 70 degrees apart, every next node far
    enough for a road between the ring and it (RING_RADIUS + 50 m), no two next to each other;
    RING_SHARE of those, drawn from their own random stream (so the rest of the town is what the
    seed gave before roundabouts existed)."""
    import random  # noqa: PLC0415

    rr = random.Random(f"roundabouts-{seed}")
    chosen: set = set()
    for n in junctions:
        around = sorted(a for a, _ in arms[n])
        gaps = [((a1 - a0) % (2 * math.pi)) for a0, a1 in zip(around, around[1:] + around[:1])]
        near = neighbours(edges, n)
        fits = (not sig[n] and len(around) in (3, 4) and min(gaps) >= math.radians(70.0)
                and all(h == RING_HALF for _, h in arms[n])
                and all(math.dist(pos[n], pos[m]) >= RING_RADIUS + 50.0 for m in near)
                and not any(m in chosen for m in near))
        if rr.random() < RING_SHARE and fits:
            chosen.add(n)
    return chosen
