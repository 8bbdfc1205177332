"""The CLG windows measured for each shipped image tower.

VLM-RL's and DriveVLM-RL's semantic term clips the contrasting-language-goal score to a window
(theta_min, theta_max) before scaling it to [0, 1] (docs/rewards.md). Where that window lies
depends on the image tower that embeds the BEVs: each tower's CLG scores sit in their own range.
``scripts/calibrate_reward.py`` measures a window for one tower (the 5 % and 50 % quantiles of the
score over warm-up driving); the windows measured for the shipped BEV-CLIP towers are below
(docs/benchmarks.md gives each command and set).

In the reward configs (``configs/reward/vlm_rl.yaml``, ``drivevlm_rl.yaml``) ``theta_min`` and
``theta_max`` are ``null``: "the window measured for the tower in use" (``vlm=...`` and the BEV's
preset), resolved here when a run's config is built and written into the run's saved config, so
a run is evaluated and resumed with the numbers it trained with. Numbers on the command line
(``reward.params.theta_min=... reward.params.theta_max=...``) are used as given.
"""

from __future__ import annotations

import warnings
from pathlib import Path

# reward -> tower checkpoint file -> (theta_min, theta_max)
CLG_WINDOWS: dict[str, dict[str, tuple[float, float]]] = {
    "vlm_rl": {
        # python scripts/calibrate_reward.py reward=vlm_rl [vlm=...] [obs=...] (grid, regular + dense)
        "bev_clip_cpu.pt": (-0.0779, 0.2492),
        "bev_clip_cpu_speed.pt": (-0.0914, 0.2349),
        "bev_clip_cpu_speed_lane.pt": (-0.0677, 0.2371),
        "bev_clip_roach_speed_lane.pt": (0.0552, 0.2449),
        "bev_clip_paper_speed_lane.pt": (0.0602, 0.2465),
        # ... vlm=none obs=roach|paper (the image-only towers of the larger BEVs)
        "bev_clip_roach.pt": (0.0375, 0.2527),
        "bev_clip_paper.pt": (0.073, 0.25),
    },
    "drivevlm_rl": {
        # ... reward=drivevlm_rl --densities drivevlm --steps 1500
        "bev_clip_cpu.pt": (-0.3472, 0.1951),
        "bev_clip_cpu_speed.pt": (-0.2871, 0.2086),
        "bev_clip_cpu_speed_lane.pt": (-0.297, 0.217),
        "bev_clip_roach_speed_lane.pt": (0.0088, 0.2604),
        "bev_clip_paper_speed_lane.pt": (-0.0036, 0.2589),
        "bev_clip_roach.pt": (-0.3335, 0.2537),
        "bev_clip_paper.pt": (-0.3244, 0.2556),
    },
}
# what a tower without a measured window gets (with a warning): the default tower's
FALLBACK_TOWER = "bev_clip_cpu.pt"
KEYS = ("theta_min", "theta_max")


class WindowWarning(UserWarning):
    """A CLG window was not measured for the tower in use (the default tower's is used)."""


def tower_name(vlm: dict | None, bev_shape=None) -> str:
    """The image tower a run embeds its BEVs with, as the windows table names it: the BEV-CLIP
    checkpoint's file name (``vlm.encoder.weights`` with ``{bev}`` filled in, or the shipped one
    for ``bev_shape``), or ``<kind>:<model>`` for another encoder (``openclip:ViT-B-32``)."""
    from ..vlm.bev_clip import fill_bev, weights_name

    enc = dict((vlm or {}).get("encoder") or {})
    kind = enc.get("kind", "bev_clip")
    if kind != "bev_clip":
        return f"{kind}:{enc.get('model_name') or enc.get('weights_path') or '?'}"
    weights = enc.get("weights")
    return Path(fill_bev(weights, bev_shape)).name if weights else weights_name(bev_shape)


def resolve_window(reward: str, params: dict, tower: str) -> dict:
    """``params`` with a ``null`` window (``theta_min`` and ``theta_max`` both None) replaced by
    the window measured for ``tower``; one for a tower without a measured window falls back to
    the default tower's with a :class:`WindowWarning` saying how to calibrate. Rewards without a
    window and windows given as numbers come back unchanged; a window half given is an error."""
    table = CLG_WINDOWS.get(reward)
    if table is None or not any(k in params for k in KEYS):
        return dict(params)
    lo, hi = params.get("theta_min"), params.get("theta_max")
    if lo is not None and hi is not None:
        return dict(params)
    if (lo is None) != (hi is None):
        raise ValueError(f"reward {reward!r}: theta_min and theta_max go together (got theta_min={lo}, "
                         f"theta_max={hi}); give both as numbers, or both null for the window "
                         f"measured for the tower in use ({tower})")
    win = table.get(tower)
    if win is None:
        win = table[FALLBACK_TOWER]
        warnings.warn(
            f"reward {reward!r}: no CLG window was measured for the image tower {tower} (measured for: "
            f"{', '.join(table)}); using {FALLBACK_TOWER}'s {win}. Measure one with `python "
            f"scripts/calibrate_reward.py reward={reward} vlm=... obs=...` and pass it as "
            f"reward.params.theta_min=... reward.params.theta_max=...", WindowWarning, stacklevel=2)
    return {**params, "theta_min": win[0], "theta_max": win[1]}
