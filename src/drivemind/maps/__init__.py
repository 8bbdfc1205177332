"""Road networks: OpenDRIVE -> RoadMap, built-in towns, town resolution, A* routing."""

from .roadmap import MapError, MarkingType, RoadMap
from .resolve import load_town, search_dirs
from .routing import Route, RouteError, plan_route, random_route

__all__ = ["MapError", "MarkingType", "RoadMap", "Route", "RouteError", "load_town", "plan_route",
           "random_route", "search_dirs"]
