"""Where the ego is on its route, and what lies ahead on it (the env's names).

The implementation is :mod:`drivemind.sim.tracking`, shared with the autopilot; this module keeps
the env's import path.
"""

from ..sim.tracking import (COMMANDS, LOCATE_AHEAD, LOCATE_BACK, RouteTracker, corridor_lead,
                            lane_changes, next_stop, route_commands, route_stops)

__all__ = ["COMMANDS", "LOCATE_AHEAD", "LOCATE_BACK", "RouteTracker", "corridor_lead",
           "lane_changes", "next_stop", "route_commands", "route_stops"]
