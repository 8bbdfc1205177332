"""The names of the per-step facts: what the env puts in ``info`` each step (all floats) and what
rewards, metrics, captions and prompts are computed from. A module of its own, below the env and
the VLM package alike, so either can name the facts without importing the other.

``drivemind.envs`` re-exports ``FACT_KEYS``; docs/env.md describes each fact.
"""

FACT_KEYS = (
    "speed_kmh", "steer", "throttle", "brake", "accel", "yaw_rate", "lateral_accel", "jerk",
    "lateral_offset", "heading_error", "lateral_oscillation", "progress", "route_progress",
    "route_length", "route_remaining", "distance", "routes_completed", "collision",
    "collision_class", "collision_speed_kmh", "collision_other_speed_kmh", "offroad",
    "stuck_time", "light_state", "light_distance", "lead_distance", "lead_speed_kmh",
    "overtakes", "failure", "task_reward", "time", "command", "critical_count", "risk_id",
    # CaRL's facts (envs/infractions.py)
    "route_completion", "red_light_run", "outside_lanes", "off_center_time",
    "comfort_violations", "ttc_violation",
    # Found-RL's action guidance (agents/guidance.py): the suggested action for the observation
    # this step starts from, and whether there is one (0 unless env.suggest_action; the
    # privileged teacher, a stand-in for the VLM: the built-in autopilot from ground truth)
    "vlm_action_steer", "vlm_action_accel", "vlm_action_available",
)
