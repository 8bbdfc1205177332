"""Evaluation: fixed-route runs of a frozen policy, the papers' metrics, reports and videos.

    from drivemind.evaluation import evaluate
    evaluate(policy, town="Town02", density="regular", out_dir="outputs/eval/Town02-regular")

See docs/evaluation.md for the metric definitions and the files written.
"""

from .metrics import METRIC_KEYS, EpisodeAccumulator, EpisodeRecord, compute_metrics
from .report import compare_runs, write_reports
from .runner import AUTOPILOT, evaluate, run_route
from .video import VideoWriter, annotate_frame, mask_panel, render_frame, with_masks, write_video

__all__ = [
    "AUTOPILOT", "METRIC_KEYS", "EpisodeAccumulator", "EpisodeRecord", "VideoWriter",
    "annotate_frame", "compare_runs", "compute_metrics", "evaluate", "mask_panel",
    "render_frame", "run_route", "with_masks", "write_reports", "write_video",
]
