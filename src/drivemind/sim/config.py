"""Configuration of the embedded simulator: world, ego vehicle, traffic, density presets."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field, fields, replace


@dataclass(frozen=True)
class EgoParams:
    """Kinematic bicycle (reference point: the box centre, as CARLA's actor location)."""

    length: float = 4.8
    width: float = 2.1
    wheelbase: float = 2.9
    max_steer_deg: float = 40.0  # steering action 1.0 -> this front-wheel angle
    accel_max: float = 3.5  # m/s^2 at full throttle
    brake_max: float = 8.0  # m/s^2 at full brake
    max_speed: float = 30.0  # m/s
    rolling: float = 0.15  # m/s^2 rolling resistance
    drag: float = 0.0012  # 1/m, aerodynamic term c * v^2

    @property
    def max_steer(self) -> float:
        return math.radians(self.max_steer_deg)


@dataclass(frozen=True)
class TrafficParams:
    """Background traffic: IDM car following, junction reservations, traffic lights, walkers."""

    speed_limit_kmh: float = 30.0  # CARLA towns' urban limit; caps every lane (speed_limits)
    speed_limits: str = "uniform"  # uniform: every lane's limit is speed_limit_kmh (CARLA's
    #                                Traffic Manager without speed signs; CARLA's .xodr speeds are
    #                                RoadRunner's defaults, 40-105 km/h); map: the lane's own
    #                                OpenDRIVE speed (its <speed> records, else its road type's),
    #                                speed_limit_kmh where it has none (docs/simulator.md)
    lateral_accel: float = 3.0  # m/s^2: curvature speed limit sqrt(a / kappa) per lane (drivers
    #                             take urban junction turns at about 3-4 m/s^2)
    speed_offset: tuple[float, float] = (-0.1, 0.1)  # each vehicle drives at the lane's limit
    #                                                   times 1 + U(lo, hi)
    idm_s0: float = 2.0  # m, standstill gap
    idm_T: float = 1.2  # s, time headway
    brake_max: float = 8.0  # m/s^2 emergency braking bound
    lookahead: float = 60.0  # m along the path for leaders and stop lines
    request_margin: float = 8.0  # m added to the braking distance when asking for a junction
    conflict_distance: float = 2.6  # m: connectors closer than this conflict
    junction_conflict: str = "boxes"  # which ways through a junction conflict: boxes: those whose
    #                                   centre lines come within conflict_distance, and those
    #                                   where a car's box on the one overlaps a car's box on the
    #                                   other (in a bend the box cuts inside: two opposite left
    #                                   turns 2.7 m apart touch); centre: only the centre lines
    #                                   (the behaviour before; the study pins it)
    junction_exit: str = "way"  # where the room a vehicle needs beyond a junction before it is
    #                             let in is measured from: way: the end of its whole way through
    #                             (a junction road of several lane sections), and a way ending in a
    #                             stretch too short to stand on is not entered while the ego is
    #                             on a lane crossing the way on through the next junction; lane:
    #                             the end of the way's first lane (the behaviour before; the study
    #                             pins it)
    diverging_follow: str = "way"  # a vehicle that went ahead from our lane into a way through
    #                                diverging from ours is followed as a leader: way: while it is
    #                                on any lane of its way (a junction road of several lane
    #                                sections); lane: only while on the way's first lane (the
    #                                behaviour before; the study pins it)
    junction_release: str = "crossing"  # crossing: a vehicle in a junction stops holding a
    #                                    crossing way through once its rear has passed the crossing
    #                                    (plus release_margin), and vehicles follow one another
    #                                    through a way of several lanes; connector: it holds every
    #                                    conflicting way until it has driven off its junction lane
    #                                    (the behaviour before; the study pins it)
    release_margin: float = 1.0  # m the rear must be past the last point near the crossing way
    signals: str = "landmarks"  # landmarks | all | none: which junctions get traffic lights
    signal_phases: str = "opposite"  # opposite: opposite approaches green together (two-phase
    #                                  plans); single: one approach at a time (CARLA's group cycle)
    signal_control: str = "actuated"  # actuated: a green phase ends early when its approaches
    #                                   are empty and another phase has demand, and rests in green
    #                                   while no other has (vehicle-actuated control); fixed: each
    #                                   phase green for ``green`` s in turn (CARLA's cycle)
    min_green: float = 5.0  # s, actuated: shortest green
    detector_distance: float = 30.0  # m before the stop line that counts as demand (actuated)
    detector_reach: str = "upstream"  # upstream: the detector reaches back over the lanes before
    #                                   the light's own (where that is their only way on), up to
    #                                   detector_distance from the stop line; lane: the light's own
    #                                   lane only, where an approach shorter than a car saw no
    #                                   standing car and stayed red for good (opendrive-1; the
    #                                   behaviour before; the study pins it)
    green: float = 10.0  # s (CARLA's default light timings: the fixed cycle's green, and where
    #                      each junction starts in it)
    max_green: float | None = 30.0  # s, actuated: the longest green while another phase has
    #                                 demand (urban actuated controllers use 30-60 s); None: ``green``
    #                                 (the behaviour before; the study pins it)
    yellow: float = 3.0
    all_red: float = 2.0
    walker_speed: tuple[float, float] = (0.8, 1.5)  # m/s (DriveVLM-RL)
    walker_wait: tuple[float, float] = (4.0, 20.0)  # s on the kerb before each crossing
    walker_roam: bool = True  # walkers walk the pavements from one crossing site to the next;
    #                           False: each crosses back and forth at one site
    walker_midblock: float = 0.2  # share of walkers crossing mid-block rather than at junctions
    walker_clear_dist: float = 15.0  # m: a walker waits while a vehicle is closer than this ...
    walker_clear_time: float = 3.0  # ... plus its speed times this
    spawn_gap: float = 12.0  # m between spawned vehicles (and from the ego)
    lane_changes: bool = True  # MOBIL lane changes on multi-lane roads
    mobil_politeness: float = 0.3  # share of the new follower's loss counted against a change
    mobil_threshold: float = 0.3  # m/s^2 a change must gain
    mobil_b_safe: float = 3.0  # m/s^2: the new follower may have to brake at most this hard
    overtake: str = "oncoming"  # oncoming: a vehicle passes a slow leader (a bicycle; one standing
    #                             with nothing ahead of it) in the adjacent lane of the opposite
    #                             direction when it is free for the whole manoeuvre, outside and
    #                             not just before junctions, never over a solid line; never: no
    #                             (the behaviour before; the study pins it)
    overtake_solid: str = "slow"  # slow: a solid centre line may be crossed to overtake a bicycle
    #                               riding at OVERTAKE_SOLID_SPEED (16 km/h) or less, or a vehicle
    #                               standing with nothing ahead of it (the UK Highway Code's rule
    #                               129; several US states allow the same for bicycles), the rest
    #                               of the manoeuvre's checks unchanged; never: only where the line
    #                               is broken (the behaviour before; the study pins it)
    walker_velocity: str = "moved"  # what a snapshot reports as a walker's velocity: moved: its
    #                                 displacement over the last step / dt (0 while it waits or
    #                                 stands for a car, its pace on the pavement, as CARLA reports
    #                                 it); crossing: its walking speed while in a crossing (even
    #                                 when it stands for a car), 0 otherwise (the behaviour
    #                                 before; the study pins it)
    walker_anticipate: float = 1.5  # s: a background vehicle keeps clear of where a crossing walker
    #                                 will be this soon at its pace and heading, not only of where
    #                                 it is; 0: only where it is (the behaviour before; the study
    #                                 pins it)
    ego_turn: float | None = 15.0  # s the ego has stood at a junction's stop line (first on its
    #                                lane, its light not red) before the traffic gives it its turn:
    #                                no vehicle is granted a way crossing the ego's for the next
    #                                EGO_TURN_HOLD s (kernels), as a background vehicle that has
    #                                waited STARVE_WAIT s is served; None: never (the behaviour
    #                                before; the study pins it)
    ego_behind: str = "ignore"  # a background vehicle and the ego behind its centre, reaching
    #                             into its way from beside (a merge lane joining its lane):
    #                             ignore: it drives on (away from the ego); brake: it stands for
    #                             the ego like for one ahead, which with an ego waiting for it to
    #                             go first left both standing (the behaviour before; the study
    #                             pins it)
    lane_change_corridor: str = "body"  # what a background vehicle changing lanes keeps clear of
    #                                     ahead (the ego, walkers): body: its new lane's centre
    #                                     line widened by its lateral offset from it, so the way
    #                                     its body sweeps while it is still between the lanes;
    #                                     lane: the new lane's centre line at its own half width
    #                                     (the behaviour before; the study pins it). With body, a
    #                                     vehicle between the lanes does not go on sliding over
    #                                     while the ego is beside it there
    lane_change_place: str = "project"  # where a vehicle changing lanes is on the lane beside
    #                                     (its place there when it moves over, and while it is
    #                                     still partly in the lane it left): project: the nearest
    #                                     point of that lane; scale: its arc length scaled by the
    #                                     two lanes' lengths, off by up to 3 m where the lanes
    #                                     curve one way, then the other (esmini's tunnels: a car
    #                                     moving over ran into the car standing ahead of it in
    #                                     the lane it left; the behaviour before; the study pins
    #                                     it). The same for a vehicle out overtaking and one
    #                                     coming the other way: where each is along the other's
    #                                     lane, and (project) closing in at both their speeds
    lane_change_follower: str = "entering"  # whom a vehicle moving into the lane beside checks
    #                                         as its new follower there: entering: also a
    #                                         vehicle about to come onto that lane from the lane
    #                                         before it (the next lane of its path), where the
    #                                         place beside us is near the lane's start; lane: only
    #                                         vehicles on that lane (the behaviour before; the study
    #                                         pins it): a car moved over 5 m into a lane just in
    #                                         front of one entering it at 30 km/h, which then stood
    #                                         behind it while it slid over onto it (esmini's
    #                                         highway_intersection_test0)
    merge_yield: str = "closing"  # closing: a vehicle whose lane narrows ahead (a lane drop, a
    #                               2+1 road's passing lane ending) asks to be let into the lane
    #                               beside, and a follower there that can stop comfortably lets
    #                               it in (a zipper); none: it waits for a gap MOBIL accepts (the
    #                               behaviour before; the study pins it): in steady traffic the
    #                               gap never came (esmini's two_plus_one: 9 respawns in 600 s
    #                               at dense)
    junction_chain: str = "queue"  # junctions joined by a link shorter than tables.LINK_SHORT m
    #                                (a roundabout's ring, two junctions a few metres apart):
    #                                queue: a vehicle on such a link asks first for its way through
    #                                the next junction and, while it waits, holds back the ways
    #                                crossing or merging with its own; it may queue on its way
    #                                through, past the last point where it stands in a crossing
    #                                or diverging way's path, when the room beyond is short; and
    #                                a stretch shorter than a car before the next junction is
    #                                entered only when it is empty and nobody else is let into it;
    #                                the ego going through a junction towards such a link holds
    #                                the ways it may take in the next junction
    #                                (CommonRoad's Roundabout8Course locked: entries and the ring
    #                                filled each other's links); none: the behaviour before (the
    #                                study pins it)
    wait_cycle_after: float | None = 5.0  # s every member of a waits-for cycle (a deadlock) has
    #                                       stood before the cycle is broken; None: no detector
    wait_cycle_break: str = "rotate"  # who acts when a cycle is broken (world._break_wait_cycles):
    #                                   rotate: a cycle of the same vehicles found again starts
    #                                   from the next member (the way the first took did not free
    #                                   it: Town07's linked junctions, 40 times in a row); first:
    #                                   always the member with the lowest id (the behaviour before;
    #                                   the study pins it)
    stuck_respawn: float | None = 60.0  # s standing (not at a red light) before a vehicle is
    #                                     respawned elsewhere (SUMO's teleport); None: never


# Settings added to TrafficParams after the study of docs/results.md began, at the values that give
# the traffic from before them. The study configs (configs/experiment/study_*.yaml) pin exactly
# these, and a study run trained before they existed (its config lacks them) is evaluated with them
# (training/evaluate.py), so that every study run trains and is evaluated in the same world.
STUDY_TRAFFIC = {"junction_release": "connector", "overtake": "never", "max_green": None,
                 "walker_velocity": "crossing", "walker_anticipate": 0.0,
                 "ego_turn": None, "ego_behind": "brake", "lane_change_corridor": "lane",
                 "junction_conflict": "centre", "diverging_follow": "lane", "junction_exit": "lane",
                 "wait_cycle_break": "first", "lane_change_place": "scale",
                 "detector_reach": "lane", "junction_chain": "none",
                 "lane_change_follower": "lane", "merge_yield": "none",
                 "overtake_solid": "never", "speed_limits": "uniform"}


# the values of TrafficParams.ego_behind
EGO_BEHIND = ("ignore", "brake")
# the values of TrafficParams.lane_change_corridor
LANE_CHANGE_CORRIDOR = ("body", "lane")
# the values of TrafficParams.junction_conflict, .diverging_follow and .junction_exit
JUNCTION_CONFLICT = ("boxes", "centre")
DIVERGING_FOLLOW = ("way", "lane")
JUNCTION_EXIT = ("way", "lane")
WAIT_CYCLE_BREAK = ("rotate", "first")
LANE_CHANGE_PLACE = ("project", "scale")
DETECTOR_REACH = ("upstream", "lane")
JUNCTION_CHAIN = ("queue", "none")
LANE_CHANGE_FOLLOWER = ("entering", "lane")
# the values of TrafficParams.merge_yield
MERGE_YIELD = ("closing", "none")
# the values of TrafficParams.overtake ("never", not "off": YAML reads off as false)
OVERTAKE = ("oncoming", "never")
# the values of TrafficParams.overtake_solid
OVERTAKE_SOLID = ("slow", "never")
# the values of TrafficParams.speed_limits
SPEED_LIMITS = ("uniform", "map")
# the values of TrafficParams.walker_velocity
WALKER_VELOCITY = ("moved", "crossing")


@dataclass(frozen=True)
class SimConfig:
    dt: float = 0.1
    vehicles: int = 0  # cars
    walkers: int = 0
    motorcycles: int = 0
    bicycles: int = 0
    offroad_margin: float | None = 2.0  # m beyond a lane edge counted as a static collision
    ego: EgoParams = field(default_factory=EgoParams)
    traffic: TrafficParams = field(default_factory=TrafficParams)

    def __post_init__(self):
        if not (math.isfinite(self.dt) and 0.0 < self.dt <= 1.0):
            raise ValueError(f"sim dt must be in (0, 1] seconds, got {self.dt}")
        for name in ("vehicles", "walkers", "motorcycles", "bicycles"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, numbers.Integral) or val < 0:
                raise ValueError(f"sim {name} must be a non-negative integer, got {val!r}")
            object.__setattr__(self, name, int(val))
        if self.traffic.signals not in ("landmarks", "all", "none"):
            raise ValueError(f"traffic.signals must be one of landmarks, all, none; got "
                             f"{self.traffic.signals!r}")
        if self.traffic.signal_control not in ("actuated", "fixed"):
            raise ValueError(f"traffic.signal_control must be one of actuated, fixed; got "
                             f"{self.traffic.signal_control!r}")
        if self.traffic.junction_release not in ("crossing", "connector"):
            raise ValueError(f"traffic.junction_release must be one of crossing, connector; got "
                             f"{self.traffic.junction_release!r}")
        mg = self.traffic.max_green
        if mg is not None and (isinstance(mg, bool) or not isinstance(mg, numbers.Real)
                               or not math.isfinite(mg) or mg < self.traffic.min_green):
            raise ValueError(f"traffic.max_green must be a number of seconds >= min_green "
                             f"({self.traffic.min_green}) or None (= green), got {mg!r}")
        if self.traffic.overtake not in OVERTAKE:
            raise ValueError(f"traffic.overtake must be one of {', '.join(OVERTAKE)}; got "
                             f"{self.traffic.overtake!r}")
        if self.traffic.walker_velocity not in WALKER_VELOCITY:
            raise ValueError(f"traffic.walker_velocity must be one of {', '.join(WALKER_VELOCITY)}; "
                             f"got {self.traffic.walker_velocity!r}")
        wa = self.traffic.walker_anticipate
        if isinstance(wa, bool) or not isinstance(wa, numbers.Real) or not (math.isfinite(wa)
                                                                            and wa >= 0):
            raise ValueError(f"traffic.walker_anticipate must be a non-negative number of seconds "
                             f"(0: react to where a walker is only), got {wa!r}")
        if self.traffic.ego_behind not in EGO_BEHIND:
            raise ValueError(f"traffic.ego_behind must be one of {', '.join(EGO_BEHIND)}; got "
                             f"{self.traffic.ego_behind!r}")
        if self.traffic.lane_change_corridor not in LANE_CHANGE_CORRIDOR:
            raise ValueError(f"traffic.lane_change_corridor must be one of "
                             f"{', '.join(LANE_CHANGE_CORRIDOR)}; got "
                             f"{self.traffic.lane_change_corridor!r}")
        for key, valid in (("junction_conflict", JUNCTION_CONFLICT),
                           ("diverging_follow", DIVERGING_FOLLOW),
                           ("junction_exit", JUNCTION_EXIT),
                           ("wait_cycle_break", WAIT_CYCLE_BREAK),
                           ("lane_change_place", LANE_CHANGE_PLACE),
                           ("detector_reach", DETECTOR_REACH),
                           ("junction_chain", JUNCTION_CHAIN),
                           ("lane_change_follower", LANE_CHANGE_FOLLOWER),
                           ("merge_yield", MERGE_YIELD),
                           ("overtake_solid", OVERTAKE_SOLID),
                           ("speed_limits", SPEED_LIMITS)):
            if getattr(self.traffic, key) not in valid:
                raise ValueError(f"traffic.{key} must be one of {', '.join(valid)}; got "
                                 f"{getattr(self.traffic, key)!r}")
        et = self.traffic.ego_turn
        if et is not None and (isinstance(et, bool) or not isinstance(et, numbers.Real)
                               or not (math.isfinite(et) and et > 0)):
            raise ValueError(f"traffic.ego_turn must be a positive number of seconds or None "
                             f"(never: the ego waits for a gap however long), got {et!r}")
        if not (math.isfinite(self.traffic.release_margin) and self.traffic.release_margin >= 0):
            raise ValueError(f"traffic.release_margin must be a non-negative number of metres, got "
                             f"{self.traffic.release_margin!r}")
        if self.traffic.signal_phases not in ("opposite", "single"):
            raise ValueError(f"traffic.signal_phases must be one of opposite, single; got "
                             f"{self.traffic.signal_phases!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "SimConfig":
        d = dict(d or {})
        check_options(cls, d, "sim")
        if isinstance(d.get("ego"), dict):
            d["ego"] = _sub(EgoParams, d["ego"], "ego")
        if isinstance(d.get("traffic"), dict):
            t = dict(d["traffic"])
            for k in ("walker_speed", "walker_wait", "speed_offset"):
                if k in t:
                    t[k] = tuple(t[k])
            d["traffic"] = _sub(TrafficParams, t, "traffic")
        return cls(**d)


def check_options(klass, d: dict, what: str, extra: tuple = ()) -> None:
    """Raise one ValueError naming the unknown keys of ``d`` and the valid ones (``klass``'s
    dataclass fields plus ``extra``)."""
    valid = {f.name for f in fields(klass)} | set(extra)
    unknown = set(d) - valid
    if unknown:
        raise ValueError(f"unknown {what} option(s) {sorted(unknown)}; valid: {sorted(valid)}")


def _sub(klass, d, what):
    check_options(klass, d, f"sim.{what}")
    return klass(**d)


# Traffic densities of the papers: empty 0, regular 20, dense 40 vehicles (VLM-RL, DriveMind);
# DriveVLM-RL adds 20 walkers, 20 motorcycles and 20 bicycles to 20 vehicles.
DENSITIES: dict[str, dict] = {
    "empty": dict(vehicles=0, walkers=0, motorcycles=0, bicycles=0),
    "regular": dict(vehicles=20, walkers=0, motorcycles=0, bicycles=0),
    "dense": dict(vehicles=40, walkers=0, motorcycles=0, bicycles=0),
    "drivevlm": dict(vehicles=20, walkers=20, motorcycles=20, bicycles=20),
}


def density_config(name: str, base: SimConfig | None = None, **overrides) -> SimConfig:
    """SimConfig for a density preset; unknown names list the valid ones."""
    if name not in DENSITIES:
        raise ValueError(f"unknown density {name!r}; valid: {', '.join(DENSITIES)}")
    return replace(base or SimConfig(), **{**DENSITIES[name], **overrides})
