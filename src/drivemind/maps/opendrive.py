"""OpenDRIVE -> RoadMap through the ``carla`` client's offline parser.

This is the only module of the map stack that imports ``carla``. ``carla.Map(name, xodr_text)``
parses OpenDRIVE without a server; a live server's ``world.get_map()`` returns the same type, so
:func:`roadmap_from_carla_map` serves both the embedded simulator and the CARLA backend.

The native parser can crash the process (a segmentation fault) on some malformed files, with no
message. So a text is first parsed, and its lanes walked exactly as the loader walks them, in a
child process (:mod:`drivemind.maps.native_check`); a crash there becomes one :class:`MapError`
naming the file, unless a second child walking the lanes a step at a time finishes (carla's
``next_until_lane_end`` dies on lanes that end inside their road): then the loader walks them so
too. The verdict is cached per content hash, so a file costs the child process once.
After loading, :mod:`drivemind.maps.validate` warns about dangling links, zero-length lanes and
junctions without connecting lanes, naming road and lane ids.

Defects of the native parser are worked around in the text before it parses. A ``<spiral>`` whose
curvature does not change (``curvStart == curvEnd``, an arc written as a clothoid, as some editors
export junction turns) is drawn as a straight line by carla 0.9.16, so the lanes after it jump
back to where the file puts the next piece; :func:`constant_spirals_as_arcs` writes such a piece as
the ``<arc>`` (or ``<line>``) it is, and the loader says which roads it rewrote. The roads leading into a
junction that shares its id with a road are mislinked; :func:`junction_ids_apart` gives such a
junction an id of its own, and the loader says which it renumbered; :func:`numeric_ids` numbers
the roads and junctions whose ids are strings (OpenDRIVE 1.5+), which the parser would merge, and
:func:`lane_borders_as_widths` gives lanes described by ``<border>`` records (read as 0 m wide)
their widths. An ``<arc>`` of zero curvature
gives NaN lane points (:func:`flat_arcs_as_lines` writes it as a line), and lanes of OpenDRIVE's
ramp types are typed driving (:func:`ramp_lanes_as_driving`: the API walks driving lanes only).
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import lzma
import math
import os
import pickle
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np

from .roadmap import LaneRecord, MapError, MarkingType, RoadMap, TrafficLightLandmark, build_roadmap

TRAFFIC_LIGHT_TYPE = "1000001"
SPIRAL_AS_ARC = 1e-3  # m: |curvEnd - curvStart| * length**2 under this -> the spiral is an arc
STRAIGHT_CURVATURE = 1e-9  # 1/m: an "arc" this flat is written as a line

_SPIRAL = re.compile(r"<spiral\b([^>]*?)\s*(?:/>|>\s*</spiral\s*>)")
_ARC = re.compile(r"<arc\b([^>]*?)\s*(?:/>|>\s*</arc\s*>)")
_ATTR = re.compile(r"""([A-Za-z_][\w.-]*)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_GEOMETRY = re.compile(r"<geometry\b[^>]*>")
_ROAD = re.compile(r"<road\b[^>]*>")
_JUNCTION = re.compile(r"<junction\b[^>]*>")
_ROAD_LINK = re.compile(r"<(?:predecessor|successor)\b[^>]*>")
_JUNCTION_REF = re.compile(r"<junctionReference\b[^>]*>")
_RAMP_LANE = re.compile(r"""(<lane\b[^>]*?\btype\s*=\s*)(["'])(entry|exit|onRamp|offRamp|connectingRamp)\2""")


def _import_carla():
    try:
        import carla  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - depends on the platform
        raise MapError(
            "loading OpenDRIVE needs the `carla` Python client (pip install carla==0.9.16; wheels "
            "exist for Linux x86_64, CPython 3.10-3.12). Import failed: " + str(exc)
        ) from exc
    return carla


def _tag(el) -> str:
    """An element's name without its namespace ("" for a comment or processing instruction)."""
    return el.tag.rsplit("}", 1)[-1] if isinstance(el.tag, str) else ""


def _check_opendrive_text(text: str, source: str) -> None:
    if not text or not text.strip():
        raise MapError(f"{source}: the file is empty, expected OpenDRIVE XML")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise MapError(f"{source}: not valid XML ({exc}); expected an OpenDRIVE .xodr file") from exc
    # RoadRunner writes <OpenDRIVE xmlns="http://www.opendrive.org">: the names count, not the
    # namespace (carla's parser reads such a file)
    if _tag(root) != "OpenDRIVE":
        raise MapError(f"{source}: root element is <{root.tag}>, expected <OpenDRIVE>")
    if not any(_tag(el) == "road" for el in root):
        raise MapError(f"{source}: OpenDRIVE file has no <road> elements")
    lanes = [ln for ln in root.iter() if _tag(ln) == "lane" and ln.get("id") not in ("0", None)]
    if lanes and all(ln.get("type") is None for ln in lanes):
        raise MapError(f"{source}: none of its {len(lanes)} lanes has a type attribute (OpenDRIVE "
                       f"requires one; the CARLA parser then reads no lane as type 'driving'): add "
                       f"type=\"driving\" to the lanes that carry traffic")


def _attrs(tag_text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) if m.group(2) is not None else m.group(3)
            for m in _ATTR.finditer(tag_text)}


def _tags_before(text: str):
    """``last_before(pattern, pos)``: the attributes of the last tag of ``pattern`` (``_ROAD``,
    ``_GEOMETRY``) opened before ``pos`` in ``text`` ({} where none is)."""
    found: dict = {}

    def last_before(pattern, pos):
        if pattern not in found:
            tags = [(m.start(), m.group(0)) for m in pattern.finditer(text)]
            found[pattern] = (tags, [at for at, _ in tags])
        tags, starts = found[pattern]
        k = bisect.bisect_right(starts, pos) - 1
        return _attrs(tags[k][1]) if k >= 0 else {}

    return last_before


def constant_spirals_as_arcs(text: str) -> tuple[str, list[str]]:
    """``(text, rewritten)``: ``text`` with every ``<spiral>`` of constant curvature written as the
    ``<arc>`` it is (a ``<line>`` where the curvature is under ``STRAIGHT_CURVATURE``), and one
    description per rewritten piece ("road 300 geometry s=10.47 (curvature -0.0691)").

    A clothoid whose curvature changes by ``dc`` over ``L`` metres departs from the arc of its
    mean curvature by about ``dc * L**2 / 24`` m; a piece with ``dc * L**2 < SPIRAL_AS_ARC`` is an
    arc to well under a millimetre. carla 0.9.16 evaluates such a spiral with a curvature rate of
    (nearly) zero, which it draws as a straight line, so the next piece starts elsewhere and the
    lanes the parser samples turn back on themselves (traffic on them overlaps). Other spirals,
    and any text without spirals, are returned unchanged."""
    if "<spiral" not in text:
        return text, []
    rewritten: list[str] = []
    last_before = _tags_before(text)

    def repl(m: re.Match) -> str:
        a = _attrs(m.group(1))
        g = last_before(_GEOMETRY, m.start())
        try:
            c0, c1 = float(a["curvStart"]), float(a["curvEnd"])
            length = float(g.get("length", "nan"))
        except (KeyError, ValueError):
            return m.group(0)  # malformed: left to the parser and its error
        if not (math.isfinite(c0) and math.isfinite(c1) and math.isfinite(length)) \
                or abs(c1 - c0) * length * length >= SPIRAL_AS_ARC:
            return m.group(0)
        c = 0.5 * (c0 + c1)
        road = last_before(_ROAD, m.start()).get("id", "?")
        rewritten.append(f"road {road} geometry s={float(g.get('s', 'nan')):.2f} (curvature {c:.4g})")
        return "<line/>" if abs(c) < STRAIGHT_CURVATURE else f'<arc curvature="{c!r}"/>'

    return _SPIRAL.sub(repl, text), rewritten


def ramp_lanes_as_driving(text: str) -> str:
    """``text`` with the lanes of OpenDRIVE's ramp types (``entry``, ``exit``, ``onRamp``,
    ``offRamp``, ``connectingRamp``) typed ``driving``. They carry traffic as driving lanes do,
    but the CARLA API walks driving lanes only: esmini's ``connected_junctions_simple`` (every
    lane an ``offRamp``) read as no lane at all. CARLA's towns type every such lane ``driving``;
    a text without ramp lanes is returned unchanged."""
    return _RAMP_LANE.sub(lambda m: f"{m.group(1)}{m.group(2)}driving{m.group(2)}", text)


_LANE_SECTION = re.compile(r"<laneSection\b[^>]*>.*?</laneSection\s*>", re.S)
_SIDE = re.compile(r"<(left|right)\b[^>]*>(.*?)</\1\s*>", re.S)
_LANE_ELEMENT = re.compile(r"<lane\b[^>]*?(?:/>|>.*?</lane\s*>)", re.S)
_BORDER = re.compile(r"<border\b[^>]*?(?:/>|>\s*</border\s*>)\s*", re.S)
_WIDTH = re.compile(r"<width\b[^>]*>")
_LANE_OFFSET = re.compile(r"<laneOffset\b[^>]*>")
_LANES_BLOCK = re.compile(r"<lanes\b[^>]*>.*?</lanes\s*>", re.S)


def _cubic_pieces(tags) -> list[tuple[float, tuple[float, ...]]]:
    """[(s, (a, b, c, d))] from ``<width>``/``<border>``/``<laneOffset>`` tags: each record's
    start (``sOffset`` or ``s``) and coefficients, sorted by start (ValueError on a bad number)."""
    out = []
    for tag in tags:
        a = _attrs(tag)
        s0 = float(a.get("sOffset", a.get("s", "0")))
        out.append((s0, tuple(float(a.get(k, "0")) for k in "abcd")))
    return sorted(out, key=lambda p: p[0])


def _piece_at(pieces, s: float) -> tuple[float, ...]:
    """The cubic of ``pieces`` that holds at ``s``, re-expanded about ``s`` (before the first
    piece: the first, extrapolated; no pieces: 0)."""
    if not pieces:
        return (0.0, 0.0, 0.0, 0.0)
    k = max(bisect.bisect_right([p[0] for p in pieces], s + 1e-9) - 1, 0)
    s0, (a, b, c, d) = pieces[k]
    h = s - s0
    return (a + h * (b + h * (c + h * d)), b + h * (2 * c + 3 * d * h), c + 3 * d * h, d)


def _difference(outer, inner) -> list[tuple[float, tuple[float, ...]]]:
    """Piecewise cubic ``outer - inner``, a piece at each start of either."""
    starts = sorted({0.0, *(p[0] for p in outer), *(p[0] for p in inner)})
    starts = [x for x in starts if x >= 0.0]
    return [(x, tuple(o - i for o, i in zip(_piece_at(outer, x), _piece_at(inner, x))))
            for x in starts]


def _sum(a, b) -> list[tuple[float, tuple[float, ...]]]:
    """Piecewise cubic ``a + b``, a piece at each start of either."""
    starts = [x for x in sorted({0.0, *(p[0] for p in a), *(p[0] for p in b)}) if x >= 0.0]
    return [(x, tuple(u + v for u, v in zip(_piece_at(a, x), _piece_at(b, x)))) for x in starts]


def lane_borders_as_widths(text: str) -> tuple[str, list[str]]:
    """``(text, rewritten)``: ``text`` with every lane given by ``<border>`` records (its outer
    border's t-coordinate from the reference line, a cubic in s, as OpenDRIVE allows instead of
    ``<width>``) given the ``<width>`` records of the same lane, and one description per
    rewritten road ("road 7: lanes 1, -1").

    carla 0.9.16 stores border records and does not read them: such a lane has width 0, so the
    road has no lane to drive or spawn on (CommonRoad's ``poly3_and_border_record``: "its widest
    lane is 0.00 m wide"). A lane's width is its border less the outer border of the lane inside
    it (the centre lane's line, the road's ``<laneOffset>``, for lanes 1 and -1), on the left
    ``outer - inner`` and on the right ``inner - outer``, as piecewise cubics with a piece where
    either starts. A right lane whose borders all lie left of the reference line is read as
    giving distances to the right (CommonRoad's converter writes them so). A lane with
    ``<width>`` records keeps them (OpenDRIVE: widths win over borders); a text without border
    records is returned unchanged."""
    if "<border" not in text:
        return text, []
    rewritten: list[str] = []
    last_before = _tags_before(text)

    def lanes_block(m: re.Match) -> str:
        if "<border" not in m.group(0):
            return m.group(0)
        try:
            return rewrite(m)
        except ValueError:  # a record's number unreadable: the road is left to the parser
            return m.group(0)

    def rewrite(m: re.Match) -> str:
        block = m.group(0)
        road = last_before(_ROAD, m.start()).get("id", "?")
        offsets = _cubic_pieces(t.group(0) for t in _LANE_OFFSET.finditer(block))
        changed: list[str] = []

        def section(sm: re.Match) -> str:
            sec = sm.group(0)
            if "<border" not in sec:
                return sec
            s_sec = float(_attrs(sec[:sec.index(">") + 1]).get("s", "0"))
            centre = [(s0 - s_sec, c) for s0, c in offsets]  # the centre lane's t, from s_sec

            def side(xm: re.Match) -> str:
                right = xm.group(1) == "right"
                lanes = []
                for lm in _LANE_ELEMENT.finditer(xm.group(2)):
                    head = lm.group(0)[:lm.group(0).index(">") + 1]
                    try:
                        lid = int(_attrs(head).get("id", ""))
                    except ValueError:
                        return xm.group(0)  # malformed: left to the parser
                    lanes.append((abs(lid), lid, lm))
                inner_t = centre  # the t of the border inside the next lane out
                new_body = {}
                for _, lid, lm in sorted(lanes, key=lambda x: x[0]):
                    el = lm.group(0)
                    widths = _cubic_pieces(t.group(0) for t in _WIDTH.finditer(el))
                    borders = _cubic_pieces(t.group(0)[:t.group(0).index(">") + 1]
                                            for t in _BORDER.finditer(el))
                    if widths or not borders:
                        w = widths
                        inner_t = _difference(inner_t, w) if right else _sum(inner_t, w)
                        continue
                    if right and all(c[0] > 0.0 for _, c in borders) and \
                            all(_piece_at(inner_t, x)[0] <= 1e-9 for x, _ in borders):
                        borders = [(x, tuple(-v for v in c)) for x, c in borders]
                    w = _difference(inner_t, borders) if right else _difference(borders, inner_t)
                    records = "".join(
                        f'<width sOffset="{x!r}" a="{c[0]!r}" b="{c[1]!r}" c="{c[2]!r}" '
                        f'd="{c[3]!r}"/>' for x, c in w)
                    first = _BORDER.search(el)
                    body = _BORDER.sub("", el[:first.start()] + "\0" + el[first.start():])
                    new_body[lm.start()] = (lm.end(), body.replace("\0", records, 1))
                    changed.append(str(lid))
                    inner_t = borders
                if not new_body:
                    return xm.group(0)
                out, at = [], 0
                inner = xm.group(2)
                for start, (end, body) in sorted(new_body.items()):
                    out.append(inner[at:start])
                    out.append(body)
                    at = end
                out.append(inner[at:])
                whole = xm.group(0)
                return whole[:xm.start(2) - xm.start(0)] + "".join(out) + whole[xm.end(2) - xm.start(0):]

            return _SIDE.sub(side, sec)

        block = _LANE_SECTION.sub(section, block)
        if changed:
            rewritten.append(f"road {road}: lanes {', '.join(dict.fromkeys(changed))}")
        return block

    return _LANES_BLOCK.sub(lanes_block, text), rewritten


def flat_arcs_as_lines(text: str) -> tuple[str, list[str]]:
    """``(text, rewritten)``: ``text`` with every ``<arc>`` of curvature under
    ``STRAIGHT_CURVATURE`` (0 in esmini's ``slope_up_leaning_right``) written as the ``<line>`` it
    is, and one description per rewritten piece ("road 1 geometry s=0.00"). carla 0.9.16 divides
    by an arc's curvature: every lane point of such a road is NaN, and the road was read as no
    lane at all. Any other text is returned unchanged."""
    if "<arc" not in text:
        return text, []
    rewritten: list[str] = []
    last_before = _tags_before(text)

    def repl(m: re.Match) -> str:
        try:
            c = float(_attrs(m.group(1))["curvature"])
        except (KeyError, ValueError):
            return m.group(0)  # malformed: left to the parser and its error
        if not abs(c) < STRAIGHT_CURVATURE:
            return m.group(0)
        g = last_before(_GEOMETRY, m.start())
        road = last_before(_ROAD, m.start()).get("id", "?")
        rewritten.append(f"road {road} geometry s={float(g.get('s', 'nan')):.2f}")
        return "<line/>"

    return _ARC.sub(repl, text), rewritten


def _set_attr(tag: str, name: str, value: str) -> str:
    """``tag`` (an element's opening tag) with attribute ``name`` set to ``value``."""
    return re.sub(rf"""(\b{name}\s*=\s*)(["'])[^"']*\2""", lambda m: f"{m.group(1)}{m.group(2)}"
                  f"{value}{m.group(2)}", tag, count=1)


_JUNCTION_ELEMENT = re.compile(r"<junction\b[^>]*(?<!/)>.*?</junction\s*>", re.S)  # not <junction/>
_CONNECTION = re.compile(r"<connection\b[^>]*>.*?</connection\s*>", re.S)
_LANE_LINK = re.compile(r"<laneLink\b[^>]*>")


@dataclass(frozen=True)
class DirectConnection:
    """One connection of a direct junction: lanes of ``incoming`` that continue as lanes of
    ``linked`` (``lanes``: (from, to) lane ids), with no connecting road between them."""

    junction: str
    incoming: int
    linked: int
    lanes: tuple[tuple[int, int], ...]


def direct_junctions_as_links(text: str) -> tuple[str, list[DirectConnection]]:
    """``(text, connections)``: ``text`` without its direct junctions (OpenDRIVE 1.6
    ``type="direct"``: roads whose lanes continue into each other's, a highway's exit or entry,
    with no connecting road) and without the road links to them; the connections they held, for
    :func:`link_direct_connections` to join the lanes with once the parser has read the roads.

    carla 0.9.16 reads few of them: most files with one stop it with ``_Map_base::at`` (esmini's
    ``direct_junction_simple``, scenariogeneration's highway exits). A text without direct
    junctions is returned unchanged."""
    if "direct" not in text or "<junction" not in text:
        return text, []
    conns: list[DirectConnection] = []
    gone: set[str] = set()

    def drop(m: re.Match) -> str:
        head = _JUNCTION.match(m.group(0))
        a = _attrs(head.group(0)) if head else {}
        if a.get("type") != "direct":
            return m.group(0)
        jid = a.get("id", "?")
        gone.add(jid)
        for c in _CONNECTION.finditer(m.group(0)):
            ca = _attrs(c.group(0)[:c.group(0).index(">") + 1])
            lanes = []
            for ll in _LANE_LINK.finditer(c.group(0)):
                la = _attrs(ll.group(0))
                try:
                    lanes.append((int(la["from"]), int(la["to"])))
                except (KeyError, ValueError):
                    continue
            try:
                conns.append(DirectConnection(jid, int(ca["incomingRoad"]), int(ca["linkedRoad"]),
                                              tuple(lanes)))
            except (KeyError, ValueError):
                continue  # malformed: its lanes stay unlinked (the checks name dead ends)
        return ""

    out = _JUNCTION_ELEMENT.sub(drop, text)
    if not gone:
        return text, []

    def unlink(m: re.Match) -> str:
        a = _attrs(m.group(0))
        if a.get("elementType") == "junction" and a.get("elementId") in gone:
            return ""
        return m.group(0)

    return _ROAD_LINK.sub(unlink, out), conns


DIRECT_LINK_GAP = 0.5  # m: a lane of a direct junction's road ends this close to where the lane
#                        it continues as starts


def link_direct_connections(records: list[LaneRecord], conns: list[DirectConnection]) -> list[str]:
    """Join the lanes of each direct junction's connections (:func:`direct_junctions_as_links`):
    each lane pair of a connection whose ends meet (one's last point within DIRECT_LINK_GAP m of
    the other's first, heading on the same way) gets that successor link, in whichever direction
    its traffic drives. Returns one description per junction ("junction 4: road 1 with roads 2,
    3 (3 lane links)": its connections' incoming and linked roads)."""
    by_lane: dict[tuple[int, int], list[LaneRecord]] = {}
    for r in records:
        by_lane.setdefault((r.key[0], r.key[2]), []).append(r)

    def heading(p, at_end):
        d = p[-1] - p[-2] if at_end else p[1] - p[0]
        return d / max(float(np.hypot(*d)), 1e-9)

    def join(a: LaneRecord, b: LaneRecord) -> bool:
        if len(a.points) < 2 or len(b.points) < 2:
            return False
        if (np.hypot(*(a.points[-1] - b.points[0])) < DIRECT_LINK_GAP
                and heading(a.points, True) @ heading(b.points, False) > 0.9):
            if b.key not in a.successors:
                a.successors.append(b.key)
            return True
        return False

    made: dict[str, list] = {}
    for c in conns:
        for f, t in c.lanes:
            for a in by_lane.get((c.incoming, f), []):
                for b in by_lane.get((c.linked, t), []):
                    if join(a, b) or join(b, a):
                        entry = made.setdefault(c.junction, [set(), set(), 0])
                        entry[0].add(c.incoming)
                        entry[1].add(c.linked)
                        entry[2] += 1
    return [f"junction {j}: road{'s' if len(i) > 1 else ''} {', '.join(map(str, sorted(i)))} with "
            f"road{'s' if len(o) > 1 else ''} {', '.join(map(str, sorted(o)))} ({k} lane link"
            f"{'s' if k != 1 else ''})" for j, (i, o, k) in made.items()]


def junction_ids_apart(text: str) -> tuple[str, list[str]]:
    """``(text, renumbered)``: ``text`` with every junction whose id is also a road's given an id
    above every road's and junction's, and one description per renumbered junction ("junction 1
    -> 7").

    OpenDRIVE numbers roads and junctions apart, and editors reuse the numbers (esmini's example
    networks: a junction 1 beside a road 1). carla 0.9.16 then mislinks the roads that lead into
    such a junction, and their lanes lose their way on (esmini's simple_4way_intersection: 4 of
    its 8 approach lanes a dead end; a generated 20 x 20 grid, junctions 100-499 and roads 1-760:
    760 links to the lane itself, dropped, and 1,520 dead ends). The junction element, the
    roads' ``junction`` attribute, the road links to it and junction groups' references are
    rewritten; a text where no junction shares an id with a road is returned unchanged."""
    if "<junction" not in text:
        return text, []
    roads = {_attrs(m.group(0)).get("id") for m in _ROAD.finditer(text)}
    jids = [_attrs(m.group(0)).get("id") for m in _JUNCTION.finditer(text)]
    clash = [j for j in jids if j is not None and j in roads]
    if not clash:
        return text, []
    nums = [int(x) for x in roads | set(jids) if x is not None and x.lstrip("-").isdigit()]
    top = max(nums, default=0) + 1
    new = {j: str(top + k) for k, j in enumerate(dict.fromkeys(clash))}

    def swap(attr, when=None):
        def repl(m: re.Match) -> str:
            a = _attrs(m.group(0))
            if (when is None or when(a)) and a.get(attr) in new:
                return _set_attr(m.group(0), attr, new[a[attr]])
            return m.group(0)
        return repl

    text = _JUNCTION.sub(swap("id"), text)
    text = _ROAD.sub(swap("junction"), text)
    text = _ROAD_LINK.sub(swap("elementId", lambda a: a.get("elementType") == "junction"), text)
    text = _JUNCTION_REF.sub(swap("junction"), text)
    return text, [f"junction {j} -> {k}" for j, k in new.items()]


_ROAD_ID_REFS = (  # elements whose attributes name roads (OpenDRIVE 1.4-1.8)
    (re.compile(r"<connection\b[^>]*>"), ("incomingRoad", "connectingRoad", "linkedRoad")),
    (re.compile(r"<priority\b[^>]*>"), ("high", "low")),
    (re.compile(r"<crossPath\b[^>]*>"), ("crossingRoad", "roadAtStart", "roadAtEnd")),
)
_NEIGHBOR = re.compile(r"<neighbor\b[^>]*>")
ID_LIMIT = 1 << 31  # road and junction ids the loader keeps: decimal integers below this


def _plain_id(x: str | None) -> bool:
    return x is not None and x.isascii() and x.isdigit() and str(int(x)) == x and int(x) < ID_LIMIT


def numeric_ids(text: str) -> tuple[str, list[str]]:
    """``(text, renumbered)``: ``text`` with every road and junction whose id is not a plain
    decimal integer (OpenDRIVE 1.5+ allows any string: esmini's ``fabriksgatan_mixed_id_types``
    names a road "Kalle" and a junction "Junction4"; "007", ids of 2**31 or more) given a number
    above every plain one, and one description per renumbered id (``road 'Kalle' -> 17``).

    carla 0.9.16 reads road and junction ids as unsigned numbers: on that file it kept 12 of 16
    roads (the named ones landed on the same number and overwrote each other) and 16 of 27
    topology links, without a word. Every reference is rewritten with the id: a road's ``id``
    and ``junction``, road links (by ``elementType``), a junction's ``id``, its connections'
    ``incomingRoad`` / ``connectingRoad`` / ``linkedRoad``, ``<priority>``, ``<crossPath>``,
    ``<neighbor>`` and junction groups' references. Signal, object and controller ids are
    strings to the parser and stay. A text whose ids are all plain is returned unchanged."""
    roads = [_attrs(m.group(0)).get("id") for m in _ROAD.finditer(text)]
    jids = [_attrs(m.group(0)).get("id") for m in _JUNCTION.finditer(text)]
    # (-1 means "none" in a road's junction attribute and links: never renumbered)
    bad_roads = [r for r in dict.fromkeys(roads) if r not in (None, "-1") and not _plain_id(r)]
    bad_jids = [j for j in dict.fromkeys(jids) if j not in (None, "-1") and not _plain_id(j)]
    if not bad_roads and not bad_jids:
        return text, []
    top = max((int(x) for x in roads + jids if _plain_id(x)), default=-1) + 1
    road_new = {r: str(top + k) for k, r in enumerate(bad_roads)}
    top += len(bad_roads)
    junction_new = {j: str(top + k) for k, j in enumerate(bad_jids)}

    def swap(fields):  # fields: ((attribute, {old: new}), ...)
        def repl(m: re.Match) -> str:
            tag, a = m.group(0), _attrs(m.group(0))
            for attr, table in fields:
                if a.get(attr) in table:
                    tag = _set_attr(tag, attr, table[a[attr]])
            return tag
        return repl

    def link(m: re.Match) -> str:
        a = _attrs(m.group(0))
        table = junction_new if a.get("elementType") == "junction" else road_new
        if "elementId" in a and a["elementId"] in table:
            return _set_attr(m.group(0), "elementId", table[a["elementId"]])
        return m.group(0)

    text = _ROAD.sub(swap((("id", road_new), ("junction", junction_new))), text)
    text = _JUNCTION.sub(swap((("id", junction_new),)), text)
    text = _ROAD_LINK.sub(link, text)
    text = _NEIGHBOR.sub(swap((("elementId", road_new),)), text)
    text = _JUNCTION_REF.sub(swap((("junction", junction_new),)), text)
    for pattern, attrs in _ROAD_ID_REFS:
        text = pattern.sub(swap(tuple((a, road_new) for a in attrs)), text)
    return text, ([f"road {r!r} -> {n}" for r, n in road_new.items()]
                  + [f"junction {j!r} -> {n}" for j, n in junction_new.items()])


SPEED_UNITS = {"m/s": 1.0, "km/h": 1.0 / 3.6, "mph": 0.44704}
NO_LIMIT = 130.0 / 3.6  # m/s for OpenDRIVE's max="no limit" (the German autobahn's advisory speed)


def _child(el, name: str):
    return next((c for c in el if _tag(c) == name), None)


def _speed(el) -> float | None:
    """m/s of a ``<speed max=".." unit=".."/>`` element (OpenDRIVE: m/s when no unit is given),
    None where it gives none ("undefined", a broken number, an unknown unit)."""
    if el is None:
        return None
    mx = (el.get("max") or "").strip()
    if mx.lower() == "no limit":
        return NO_LIMIT
    try:
        v = float(mx) * SPEED_UNITS[(el.get("unit") or "m/s").strip()]
    except (ValueError, KeyError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def opendrive_speeds(text: str) -> dict[tuple[int, int, int], float]:
    """``{(road, section, lane): m/s}``: each lane's speed limit as the OpenDRIVE text gives it:
    the lowest of the lane's own ``<speed>`` records, else the lowest of its road type's
    ``<type><speed>`` records that hold over its lane section. Lanes the file gives no speed are
    left out (and roads whose id is not a number: :func:`numeric_ids` runs first)."""
    if "<speed" not in text:
        return {}
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return {}
    out: dict[tuple[int, int, int], float] = {}
    for road in root.iter():
        if _tag(road) != "road":
            continue
        try:
            rid = int(road.get("id"))
            length = float(road.get("length", "inf"))
            types = sorted(((float(t.get("s", "0")), _speed(_child(t, "speed")))
                            for t in road if _tag(t) == "type"), key=lambda p: p[0])
            sections = [sec for lanes in road if _tag(lanes) == "lanes"
                        for sec in lanes if _tag(sec) == "laneSection"]
            starts = [float(sec.get("s", "0")) for sec in sections] + [length]
        except (TypeError, ValueError):  # unreadable numbers: this road's speeds are not read
            continue
        for k, sec in enumerate(sections):
            a, b = starts[k], starts[k + 1]
            # the type records holding over [a, b): the last starting at or before a, and any after
            held = [v for i, (s0, v) in enumerate(types)
                    if s0 < b and (i + 1 == len(types) or types[i + 1][0] > a)]
            road_v = min((v for v in held if v is not None), default=None)
            for side in sec:
                if _tag(side) not in ("left", "right"):
                    continue
                for lane in side:
                    try:
                        lid = int(lane.get("id"))
                    except (TypeError, ValueError):
                        continue
                    own = [_speed(c) for c in lane if _tag(c) == "speed"]
                    v = min((x for x in own if x is not None), default=road_v)
                    if v is not None:
                        out[rid, k, lid] = v
    return out


def parse_carla_map(text: str, name: str, source: str):
    """``carla.Map(name, text)`` with the parser's exceptions as a MapError naming ``source``."""
    carla = _import_carla()
    try:
        return carla.Map(name, text)
    except Exception as exc:  # the C++ parser raises RuntimeError on broken files
        raise MapError(f"{source}: the CARLA OpenDRIVE parser rejected the file: {exc}") from exc


RECORDS_CACHE = "DRIVEMIND_MAP_CACHE"  # 0: read every map through the native parser
RECORDS_CACHE_MIN = 1 << 20  # characters: a smaller text parses in about a second, not cached
_code_hash: str | None = None


def _records_key(text: str, sample: float) -> str:
    """The lane records' cache key: the text, the sampling, the ``carla`` client's version and
    this module's own source (the records change with the code that reads them)."""
    global _code_hash
    if _code_hash is None:
        _code_hash = hashlib.sha256(open(__file__, "rb").read()).hexdigest()[:16]
    from .native_check import _carla_version

    h = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    h.update(f"|sample={sample!r}|carla={_carla_version()}|code={_code_hash}".encode())
    return h.hexdigest()[:40]


def _records_cache_path(text: str, sample: float):
    if os.environ.get(RECORDS_CACHE, "1") == "0" or len(text) < RECORDS_CACHE_MIN:
        return None
    from .. import paths

    return paths.cache_dir() / "map-records" / f"{_records_key(text, sample)}.pkl"


def _read_records(path) -> tuple | None:
    if path is None or not path.is_file():
        return None
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # a truncated or foreign file: parsed again (and rewritten)
        return None


def _write_records(path, out: tuple) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError:  # a read-only cache: the next load parses again
        pass


def load_xodr_text(text: str, name: str, *, source: str = "", native_check: bool = True,
                   validate: bool = True, **build_kw) -> RoadMap:
    """Parse OpenDRIVE text into a RoadMap. Errors name the source and what failed.

    ``native_check``: parse in a child process first (:func:`drivemind.maps.native_check.check_text`)
    so a file that crashes the native parser gives a MapError instead of killing this process.
    ``validate``: warn (:class:`drivemind.maps.validate.MapWarning`) about network defects.
    Successor links that start far from their lane's end are dropped either way
    (:func:`drivemind.maps.validate.drop_broken_successors`), and a road's end that a junction's
    lanes run over is joined to the junction (:func:`drivemind.maps.validate.join_overlapped_ends`),
    and junctions whose lanes cross are merged
    (:func:`drivemind.maps.validate.merge_overlapping_junctions`).

    The lane records a text of RECORDS_CACHE_MIN characters or more gives are cached on disk
    (``$DRIVEMIND_CACHE/map-records``, keyed by the text, the sampling, the ``carla`` version and
    this module's source), so a large town (a minute through the native parser for 24,000 lanes)
    loads in seconds the next time, in every process; ``DRIVEMIND_MAP_CACHE=0`` turns it off."""
    source = source or f"<OpenDRIVE text for {name}>"
    _check_opendrive_text(text, source)
    text, arcs = constant_spirals_as_arcs(text)
    text, lines = flat_arcs_as_lines(text)
    text = ramp_lanes_as_driving(text)
    text, ids = numeric_ids(text)  # first: the warnings below name the new numbers
    text, borders = lane_borders_as_widths(text)
    text, direct = direct_junctions_as_links(text)
    text, junctions = junction_ids_apart(text)
    sample = build_kw.pop("sample", 0.5)
    cache = _records_cache_path(text, sample)
    cached = _read_records(cache)
    if cached is not None:
        records, landmarks, short = cached
    else:
        walk = "native"
        if native_check:
            from .native_check import check_text

            walk = check_text(text, name, source).get("walk", "native")
        cmap = parse_carla_map(text, name, source)
        records, landmarks, short = carla_lane_records(cmap, name=name, source=source,
                                                       sample=sample, walk=walk)
        _write_records(cache, (records, landmarks, short))
    from .validate import (drop_broken_successors, drop_points_nowhere, join_overlapped_ends,
                           merge_overlapping_junctions, warn_issues)

    speeds = opendrive_speeds(text)
    for r in records:
        r.speed_limit = speeds.get(r.key)
    direct = link_direct_connections(records, direct) if direct else []
    nowhere = drop_points_nowhere(records)
    dropped = drop_broken_successors(records)
    # junctions whose lanes cross are one; a road's end under a junction's lanes joins it (which
    # may make two junctions cross: CommonRoad's USA_Lanker)
    merged = merge_overlapping_junctions(records)
    joined = join_overlapped_ends(records)
    merged += merge_overlapping_junctions(records)
    if validate:
        warn_issues(records, text, f"{name} ({source})", short=short, dropped=dropped, arcs=arcs,
                    lines=lines, junctions=junctions, nowhere=nowhere, joined=joined,
                    merged=merged, direct=direct, ids=ids, borders=borders)
    return build_roadmap(name, records, landmarks=landmarks, source=source, **build_kw)


def read_xodr(path: str | os.PathLike) -> str:
    """The text of an OpenDRIVE file, plain or compressed (``.xz`` / ``.gz``)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise MapError(f"{path}: no such OpenDRIVE file")
    opener = {".xz": lzma.open, ".gz": gzip.open}.get(os.path.splitext(path)[1], open)
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            return fh.read()
    except UnicodeDecodeError as exc:
        raise MapError(f"{path}: not a text file ({exc}); expected OpenDRIVE XML") from exc
    except (lzma.LZMAError, gzip.BadGzipFile, EOFError) as exc:
        raise MapError(f"{path}: could not decompress it ({exc}); expected an xz/gzip-compressed "
                       f"OpenDRIVE file") from exc


def xodr_stem(path: str | os.PathLike) -> str:
    """The town name of a file: its name without ``.xodr`` / ``.xodr.xz`` / ``.xodr.gz``."""
    base = os.path.basename(os.fspath(path))
    for suffix in (".xodr.xz", ".xodr.gz", ".xodr"):
        if base.endswith(suffix):
            return base[:-len(suffix)]
    return os.path.splitext(base)[0]


def load_xodr_file(path: str | os.PathLike, name: str | None = None, **build_kw) -> RoadMap:
    path = os.fspath(path)
    text = read_xodr(path)
    return load_xodr_text(text, name or xodr_stem(path), source=path, **build_kw)


_MARKING_BY_NAME = {
    "NONE": MarkingType.NONE, "Other": MarkingType.OTHER, "Broken": MarkingType.BROKEN,
    "Solid": MarkingType.SOLID, "SolidSolid": MarkingType.SOLID_SOLID,
    "SolidBroken": MarkingType.SOLID_BROKEN, "BrokenSolid": MarkingType.BROKEN_SOLID,
    "BrokenBroken": MarkingType.BROKEN_BROKEN, "BottsDots": MarkingType.BOTTS_DOTS,
    "Grass": MarkingType.GRASS, "Curb": MarkingType.CURB,
}


def _marking(m) -> int:
    """carla.LaneMarkingType -> our MarkingType code (mapped by name: CARLA's integers differ)."""
    if m is None:
        return int(MarkingType.NONE)
    return int(_MARKING_BY_NAME.get(str(m.type), MarkingType.OTHER))


def roadmap_from_carla_map(cmap, *, name: str | None = None, source: str = "",
                           max_ds: float = 1.0, sample: float = 0.5, **build_kw) -> RoadMap:
    """Build a RoadMap from a ``carla.Map`` (offline-parsed or a live server's)."""
    name = name or cmap.name
    records, landmarks, _ = carla_lane_records(cmap, name=name, source=source, sample=sample)
    return build_roadmap(name, records, landmarks=landmarks, max_ds=max_ds, source=source,
                         **build_kw)


def carla_lane_records(cmap, *, name: str, source: str = "", sample: float = 0.5,
                       walk: str = "native"):
    """(lane records, traffic-light landmarks) read from a ``carla.Map``: every native call the
    loader makes on a map (the child-process check runs exactly this). ``walk``: "native" reads
    each lane with ``next_until_lane_end``; "step" with ``next()`` a step at a time (for a file
    on which the native walk crashes, :func:`drivemind.maps.native_check.check_text`)."""
    if walk not in ("native", "step"):
        raise ValueError(f"walk must be 'native' or 'step', not {walk!r}")
    carla = _import_carla()
    try:
        topo = cmap.get_topology()
    except Exception as exc:
        raise MapError(f"{source or name}: could not read the lane topology: {exc}") from exc

    def key(w):
        return (w.road_id, w.section_id, w.lane_id)

    starts: dict[tuple, object] = {}
    succ: dict[tuple, list] = {}
    for a, b in topo:
        starts.setdefault(key(a), a)
        succ.setdefault(key(a), []).append(key(b))
        starts.setdefault(key(b), b)
        succ.setdefault(key(b), [])
    driving = carla.LaneType.Driving
    # a driving lane with no way on at its end (an open road end) is missing from get_topology():
    # find such lanes among the map's waypoints and read them from their start (none is missing
    # in the shipped towns, so their lanes are as before)
    for w in cmap.generate_waypoints(2.0):
        k = key(w)
        if k in starts or w.lane_type != driving:
            continue
        # back to the lane's start (previous_until_lane_start dies with SIGSEGV on such a lane in
        # carla 0.9.16; previous() does not), at most 50 km
        starts[k] = (_walk_lane(w, k, key, sample, backward=True) or [w])[-1]
        succ[k] = []
    if not starts:
        raise MapError(f"map {name!r} ({source or 'in memory'}) has no drivable lanes "
                       "(the OpenDRIVE file defines no lanes of type 'driving')")
    records = []
    short: dict[tuple, float] = {}  # lanes shorter than `sample` -> distance to their successor
    short_start: dict[tuple, np.ndarray] = {}
    for k in sorted(starts):
        w0 = starts[k]
        wps = [w0] + (_lane_waypoints(w0, k, key, sample) if walk == "native"
                      else _walk_lane(w0, k, key, sample))
        pts = np.array([[w.transform.location.x, w.transform.location.y] for w in wps])
        if len(pts) >= 2:
            keep = np.concatenate([[True], np.linalg.norm(np.diff(pts, axis=0), axis=1) > 1e-6])
            wps = [w for w, kp in zip(wps, keep) if kp]
            pts = pts[keep]
        if len(pts) < 2:  # shorter than one sample step: spliced out below
            nxt = succ.get(k, [])
            short_start[k] = pts[0]
            short[k] = (float(np.hypot(*(starts[nxt[0]].transform.location.x - pts[0][0],
                                         starts[nxt[0]].transform.location.y - pts[0][1])))
                        if nxt else 0.0)
            continue
        lft, rgt = w0.get_left_lane(), w0.get_right_lane()
        records.append(LaneRecord(
            key=k,
            points=pts,
            width=np.array([w.lane_width for w in wps]),
            mark_left=np.array([_marking(w.left_lane_marking) for w in wps], np.uint8),
            mark_right=np.array([_marking(w.right_lane_marking) for w in wps], np.uint8),
            junction=int(w0.junction_id) if w0.is_junction else -1,
            successors=list(dict.fromkeys(succ.get(k, []))),
            left=key(lft) if lft is not None and lft.lane_type == driving else None,
            right=key(rgt) if rgt is not None and rgt.lane_type == driving else None,
            z=np.array([w.transform.location.z for w in wps]),
        ))
    _splice_short_lanes(records, short, short_start, succ)
    try:
        lms = cmap.get_all_landmarks_of_type(TRAFFIC_LIGHT_TYPE)
    except Exception:  # pragma: no cover - older clients
        lms = []
    landmarks = [TrafficLightLandmark(lm.transform.location.x, lm.transform.location.y, lm.road_id)
                 for lm in lms]
    return records, landmarks, short


def _lane_waypoints(w0, k, key, sample: float) -> list:
    """The waypoints of lane ``k`` every ``sample`` m after ``w0`` (its start). The native
    ``next_until_lane_end`` raises ``RuntimeError: distance > 0.0`` on some lanes (a ring road
    that is its own successor, a lane section starting at s = 0 of some exports; esmini's
    velodrome); those are walked with ``next()`` instead, along the lane's direction of travel
    until its end (s stops moving that way) or 50 km."""
    try:
        return [w for w in w0.next_until_lane_end(sample) if key(w) == k]
    except RuntimeError:
        return _walk_lane(w0, k, key, sample)


def _walk_lane(w0, k, key, sample: float, backward: bool = False) -> list:
    """The waypoints of lane ``k`` every ``sample`` m after ``w0`` by ``next()`` (``backward``:
    before it, by ``previous()``), until the lane ends, s stops moving the way it went (the start
    again on a ring road that is its own successor) or 50 km."""
    out, cur, way = [], w0, 0.0
    for _ in range(int(50000 / sample)):
        ahead = cur.previous(sample) if backward else cur.next(sample)
        nxt = [n for n in ahead if key(n) == k and n.s != cur.s]
        if not nxt:
            break
        step = nxt[0].s - cur.s
        if way and step * way < 0:  # round again (a ring road) or onto its start: the lane ended
            break
        way = way or step
        cur = nxt[0]
        out.append(cur)
    return out


def _splice_short_lanes(records, short: dict, short_start: dict, succ: dict) -> None:
    """Lane sections shorter than one sample step (CARLA towns have many of a few cm) carry no
    centre line of their own: their predecessors link straight to their successors instead, and
    end where the short lane starts (the true end of the predecessor; the gap left to the
    successor is the short lane's length). A short lane with no successor stays a (dangling)
    successor."""

    def through(k, seen):
        if k not in short:
            return [k]
        nxt = [s for s in succ.get(k, []) if s not in seen]
        if not nxt:
            return [k]
        return [t for s in nxt for t in through(s, seen | {k})]

    for r in records:
        first_short = next((s for s in r.successors if s in short), None)
        if first_short is None:
            continue
        r.successors = list(dict.fromkeys(t for s in r.successors for t in through(s, {r.key})))
        end = short_start[first_short]
        if np.hypot(*(end - r.points[-1])) > 1e-6:
            r.points = np.vstack([r.points, end])
            for attr in ("width", "mark_left", "mark_right"):
                v = getattr(r, attr)
                setattr(r, attr, np.concatenate([v, v[-1:]]))
