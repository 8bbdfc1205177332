"""The embedded ("lite") simulator backend and the WorldSnapshot type shared with CARLA."""

from .config import DENSITIES, EgoParams, SimConfig, TrafficParams, density_config
from .snapshot import ActorClass, Actors, CollisionEvent, EgoState, LightState, TrafficLights, WorldSnapshot
from .world import LiteWorld, validate_action

__all__ = ["DENSITIES", "ActorClass", "Actors", "CollisionEvent", "EgoParams", "EgoState",
           "LightState", "LiteWorld", "SimConfig", "TrafficLights", "TrafficParams", "WorldSnapshot",
           "density_config", "validate_action"]
