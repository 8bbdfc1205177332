"""VLM-RL's and DriveVLM-RL's CLG window follows the image tower in use
(drivemind.rewards.windows): the reward configs leave it null, and a run gets the window measured
for its tower (vlm=... and the BEV preset), written into its saved config."""

from __future__ import annotations

import warnings

import pytest
from hydra_config import config
from script_loader import load_script

from drivemind.rewards.windows import CLG_WINDOWS, WindowWarning, resolve_window, tower_name
from drivemind.training.build import make_reward_from_cfg, with_reward_window


def _window(reward) -> tuple[float, float]:
    synth = reward.parts["synth"][1]
    return synth.theta_min, synth.theta_max


@pytest.mark.parametrize("reward", ["vlm_rl", "drivevlm_rl"])
@pytest.mark.parametrize("overrides, tower", [
    ((), "bev_clip_cpu_speed_lane.pt"),  # the config's default tower (vlm=bev_clip_speed_lane)
    (("vlm=none",), "bev_clip_cpu.pt"),  # the built-in image-only tower (the study's)
    (("vlm=bev_clip_speed",), "bev_clip_cpu_speed.pt"),
    (("vlm=bev_clip_speed_lane",), "bev_clip_cpu_speed_lane.pt"),
    (("vlm=bev_clip_speed_lane", "obs=roach"), "bev_clip_roach_speed_lane.pt"),
    (("vlm=bev_clip_speed_lane", "obs=paper"), "bev_clip_paper_speed_lane.pt"),
    (("vlm=none", "obs=roach"), "bev_clip_roach.pt"),
    (("vlm=none", "obs=paper"), "bev_clip_paper.pt"),
])
def test_the_configs_null_window_is_the_one_measured_for_the_tower_in_use(reward, overrides, tower):
    cfg = config(f"reward={reward}", *overrides)
    assert cfg["reward"]["params"]["theta_min"] is None and cfg["reward"]["params"]["theta_max"] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", WindowWarning)  # every tower here has a measured window
        got = _window(make_reward_from_cfg(cfg))
    assert got == CLG_WINDOWS[reward][tower]
    resolved = with_reward_window(cfg)["reward"]["params"]
    assert (resolved["theta_min"], resolved["theta_max"]) == got
    assert cfg["reward"]["params"]["theta_min"] is None  # the caller's config is not changed


def test_the_shipped_towers_windows_differ():
    """A table that ignored the tower would give every tower one window."""
    for reward, table in CLG_WINDOWS.items():
        assert len(set(table.values())) == len(table), reward


def test_numbers_win_a_half_window_fails_and_a_tower_without_a_window_warns():
    cfg = config("reward=vlm_rl", "vlm=bev_clip_speed_lane", "reward.params.theta_min=-0.2",
                 "reward.params.theta_max=0.1")
    assert _window(make_reward_from_cfg(cfg)) == (-0.2, 0.1)
    with pytest.raises(ValueError, match="theta_min and theta_max go together.*bev_clip_cpu_speed_lane.pt"):
        make_reward_from_cfg(config("reward=vlm_rl", "reward.params.theta_min=-0.2"))
    # a tower of the user's own: no window measured; the built-in cpu tower's, and how to measure one
    with pytest.warns(WindowWarning, match=r"mine\.pt.*calibrate_reward\.py reward=vlm_rl"):
        got = _window(make_reward_from_cfg(config("reward=vlm_rl", "vlm.encoder.weights=/my/towers/mine.pt")))
    assert got == CLG_WINDOWS["vlm_rl"]["bev_clip_cpu.pt"]
    assert tower_name({"encoder": {"kind": "bev_clip", "weights": "/my/towers/mine.pt"}}) == "mine.pt"
    assert tower_name({"encoder": {"kind": "openclip", "model_name": "ViT-B-32"}}) == "openclip:ViT-B-32"
    assert tower_name(None, (15, 192, 192)) == "bev_clip_roach.pt"
    # rewards without a window come back as they are
    assert resolve_window("chen", {"progress_weight": 1.0}, "bev_clip_cpu.pt") == {"progress_weight": 1.0}
    chen = config("reward=chen")
    assert with_reward_window(chen) is chen


def test_bench_reward_factories_take_the_towers_window():
    """bench.py reward-quality scores VLM-RL with the window of the tower it embeds with."""
    bench = load_script("bench")
    for tower in ("bev_clip_cpu.pt", "bev_clip_cpu_speed_lane.pt", "bev_clip_paper_speed_lane.pt"):
        assert _window(bench._reward_factory("vlm_rl", None, tower)()) == CLG_WINDOWS["vlm_rl"][tower]
    assert _window(bench._reward_factory("vlm_rl", {"theta_min": -0.5, "theta_max": 0.5},
                                         "bev_clip_cpu.pt")()) == (-0.5, 0.5)
    with pytest.raises(TypeError, match="go together"):
        bench._reward_factory("vlm_rl", {"theta_max": 0.5}, "bev_clip_cpu.pt")
