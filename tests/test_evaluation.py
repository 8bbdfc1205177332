"""The evaluation package: metric maths on hand-made episodes, the per-step accumulator, the
reports, the video helpers, and one end-to-end run of the autopilot on two grid routes."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from PIL import Image

from drivemind.envs import FACT_KEYS
from drivemind.evaluation import (
    METRIC_KEYS,
    EpisodeAccumulator,
    EpisodeRecord,
    compare_runs,
    compute_metrics,
    evaluate,
    render_frame,
    write_reports,
    write_video,
)
from drivemind.evaluation.video import annotate_frame, check_video_path, mask_panel


def rec(i, steps, dist, dur, speed, arrived, completion, rc, speeds, termination="", truncation=""):
    return EpisodeRecord(route_index=i, steps=steps, distance_m=dist, duration_s=dur,
                         mean_speed_kmh=speed, arrived=arrived, completion=completion,
                         routes_completed=rc, collisions=len(speeds), collision_speeds_kmh=speeds,
                         termination=termination, truncation=truncation)


# r0 reached, r1 collided at 20 km/h, r2 reached three routes but collided twice (10, 30 km/h:
# a training-like episode), r3 stood still until truncated
R0 = rec(0, 100, 200.0, 10.0, 72.0, True, 1.0, 1.0, [], "arrived")
R1 = rec(1, 50, 50.0, 5.0, 36.0, False, 0.25, 0.0, [20.0], "collision")
R2 = rec(2, 150, 150.0, 15.0, 36.0, True, 0.5, 3.0, [10.0, 30.0], "collision")
R3 = rec(3, 200, 0.0, 20.0, 0.0, False, 0.0, 0.0, [], "", "max_steps")


# ---------------------------------------------------------------------------------------- metrics
def test_metrics_by_hand():
    m = compute_metrics([R0, R1, R2, R3])
    # N = 4 episodes, S = 500 steps, T = 50 s, D = 400 m, C = 3 collisions
    assert m["episodes"] == 4 and m["steps"] == 500 and m["collisions"] == 3
    assert m["distance_km"] == pytest.approx(0.4)
    assert m["AS"] == pytest.approx((72 * 10 + 36 * 5 + 36 * 15 + 0 * 20) / 50)  # 28.8, time-weighted
    assert m["RC"] == pytest.approx(2 / 4)  # test mode: routes reached
    assert m["TD"] == pytest.approx(400 / 4)
    assert m["CS"] == pytest.approx((0 + 20 + (10 + 30) / 2 + 0) / 4)  # 10: 0 for no collision
    assert m["SR"] == pytest.approx(1 / 4)  # only r0 reached without collision
    assert m["CR"] == pytest.approx(2 / 4)
    assert m["TCF"] == pytest.approx(1000 * 3 / 500)
    assert m["DCF"] == pytest.approx(3 / 0.4)
    assert m["ICT"] == pytest.approx(500 / 3) and m["ICT_censored"] is False
    assert m["AC"] == pytest.approx(3 / 4)
    assert m["completion"] == pytest.approx((1 + 0.25 + 0.5 + 0) / 4)
    assert set(METRIC_KEYS) <= m.keys()


def test_train_mode_rc_counts_routes_per_episode():
    assert compute_metrics([R0, R1, R2, R3], mode="train")["RC"] == pytest.approx((1 + 0 + 3 + 0) / 4)
    assert compute_metrics([R2], mode="test")["RC"] == 1.0
    assert compute_metrics([R2], mode="train")["RC"] == 3.0


def test_metrics_without_collisions():
    m = compute_metrics([R0, R3])
    assert m["CS"] == 0.0 and m["CR"] == 0.0 and m["TCF"] == 0.0 and m["DCF"] == 0.0
    assert m["AC"] == 0.0 and m["collisions"] == 0
    assert m["ICT"] == 300 and m["ICT_censored"] is True  # all steps: a lower bound
    assert m["SR"] == 0.5 and m["RC"] == 0.5
    assert m["AS"] == pytest.approx(72 * 10 / 30)


def test_metrics_all_collisions():
    m = compute_metrics([R1, R2])
    assert m["CR"] == 1.0 and m["SR"] == 0.0 and m["RC"] == 0.5
    assert m["CS"] == pytest.approx((20 + 20) / 2)
    assert m["AC"] == pytest.approx(1.5)
    assert m["TCF"] == pytest.approx(1000 * 3 / 200)
    assert m["DCF"] == pytest.approx(3 / 0.2)
    assert m["ICT"] == pytest.approx(200 / 3) and not m["ICT_censored"]


def test_metrics_degenerate_inputs():
    with pytest.raises(ValueError, match="at least one"):
        compute_metrics([])
    with pytest.raises(ValueError, match="no steps"):
        compute_metrics([rec(0, 0, 0.0, 0.0, 0.0, False, 0.0, 0.0, [])])
    with pytest.raises(ValueError, match="mode"):
        compute_metrics([R0], mode="eval")
    standing_hit = rec(0, 10, 0.0, 1.0, 0.0, False, 0.0, 0.0, [5.0], "collision")
    assert compute_metrics([standing_hit])["DCF"] == math.inf  # a collision in zero km


# ---------------------------------------------------------------------------------------- accumulator
def info(t, speed, dist, progress, length=100.0, collision=0.0, cs=0.0, termination="",
         truncation="", arrived=False, routes=0.0, route_index=3):
    d = dict.fromkeys(FACT_KEYS, 0.0)
    d.update(time=t, speed_kmh=speed, distance=dist, route_progress=progress, route_length=length,
             collision=collision, collision_speed_kmh=cs, routes_completed=routes,
             termination=termination, truncation=truncation, arrived=arrived, route_index=route_index)
    return d


def test_accumulator_on_a_hand_made_episode():
    acc = EpisodeAccumulator()
    acc.start(info(0.0, 0.0, 0.0, 0.0))
    acc.add(info(0.1, 36.0, 1.0, 1.0))
    acc.add(info(0.3, 72.0, 5.0, 5.0))  # a 0.2 s step: weighs twice
    acc.add(info(0.4, 18.0, 5.5, 30.0, collision=1.0, cs=18.0, termination="collision"))
    r = acc.finish()
    assert r.route_index == 3 and r.steps == 3
    assert r.duration_s == pytest.approx(0.4) and r.distance_m == 5.5
    assert r.mean_speed_kmh == pytest.approx((36 * 0.1 + 72 * 0.2 + 18 * 0.1) / 0.4)  # 49.5, not 42
    assert r.collisions == 1 and r.collision_speeds_kmh == [18.0]
    assert r.completion == pytest.approx(0.3) and not r.arrived
    assert r.termination == "collision" and r.truncation == ""
    assert json.loads(json.dumps(r.to_dict())) == r.to_dict()
    assert EpisodeRecord.from_dict(r.to_dict()) == r


def test_accumulator_arrival_clipping_and_override():
    acc = EpisodeAccumulator()
    acc.start(info(0.0, 0.0, 0.0, 0.0))
    acc.add(info(0.1, 10.0, 1.0, 96.0, arrived=True, routes=1.0, termination="arrived"))
    r = acc.finish()
    assert r.arrived and r.completion == 1.0 and r.routes_completed == 1.0  # within 5 m counts
    acc.start()  # reusable; start info optional
    acc.add(info(0.1, 10.0, 1.0, -4.0))
    assert acc.finish(truncation="max_steps").completion == 0.0
    acc.start()
    acc.add(info(0.1, 10.0, 1.0, 140.0))
    r = acc.finish(truncation="max_steps")
    assert r.completion == 1.0 and not r.arrived and r.truncation == "max_steps"


# ---------------------------------------------------------------------------------------- reports
def test_reports_written_and_parseable(tmp_path):
    records = [R0, R1, R2, R3]
    m = compute_metrics(records)
    files = write_reports(tmp_path / "a", m, records, {"town": "grid", "density": "empty",
                                                       "policy": "hand", "name": "run-a"})
    assert set(files) == {"json", "csv", "md", "png"} and all(p.is_file() for p in files.values())
    doc = json.loads(files["json"].read_text())
    assert doc["meta"]["town"] == "grid" and doc["metrics"]["SR"] == pytest.approx(0.25)
    assert [r["route_index"] for r in doc["routes"]] == [0, 1, 2, 3]
    assert [EpisodeRecord.from_dict(r) for r in doc["routes"]] == records
    with files["csv"].open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["route_index"]) for r in rows] == [0, 1, 2, 3]
    assert rows[2]["collision_speeds_kmh"] == "10.00;30.00" and rows[1]["termination"] == "collision"
    md = files["md"].read_text()
    assert ("| AS (km/h) | RC | TD (m) | CS (km/h) | SR | CR | TCF (/1000 steps) | DCF (/km) | "
            "ICT (steps) | AC (/route) |") in md
    assert "| 28.8 | 0.50 | 100 | 10.0 | 0.25 | 0.50 | 6.00 | 7.50 | 167 | 0.75 |" in md
    assert files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Image.open(files["png"]).size[0] > 100

    # a second run with no collisions and a standing collision (DCF inf -> JSON null)
    hit = rec(5, 10, 0.0, 1.0, 0.0, False, 0.0, 0.0, [5.0], "collision")
    m2 = compute_metrics([hit])
    write_reports(tmp_path / "b", m2, [hit], {"town": "grid", "density": "dense"})
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["metrics"]["DCF"] is None
    write_reports(tmp_path / "c", compute_metrics([R0]), [R0], {})
    table = compare_runs([tmp_path / "a", tmp_path / "b" / "metrics.json", tmp_path / "c"])
    lines = table.strip().splitlines()
    assert lines[0].startswith("| run | town | density | episodes | AS (km/h) |") and len(lines) == 5
    assert lines[2].startswith("| run-a | grid | empty | 4 | 28.8 |")
    assert "| b | grid | dense | 1 |" in lines[3] and "| inf |" in lines[3]
    assert "| c | - | - | 1 |" in lines[4] and ">= 100" in lines[4]  # censored ICT
    with pytest.raises(FileNotFoundError):
        compare_runs([tmp_path / "missing"])


# ---------------------------------------------------------------------------------------- video
def test_video_helpers(tmp_path):
    rgb = np.zeros((224, 224, 3), np.uint8)
    i = info(1.0, 30.0, 10.0, 10.0)
    a = annotate_frame(rgb, i, scale=2)
    assert a.shape == (448, 448, 3) and a.dtype == np.uint8 and a.any()  # text drawn
    masks = np.zeros((15, 96, 96), np.uint8)
    f = render_frame(rgb, i, masks=masks, extra=["route 3"])
    assert f.shape == (224, 224 + mask_panel(masks, 224).width, 3)
    frames = [render_frame(rgb, info(t, 30.0, 10.0, 10.0), masks=masks) for t in (0.1, 0.2, 0.3)]
    out = write_video(frames, tmp_path / "v" / "x.gif", fps=10)
    im = Image.open(out)  # (Pillow merges identical consecutive frames: these differ in time)
    assert im.n_frames == 3 and im.size == (f.shape[1], f.shape[0]) and im.info["duration"] == 100
    assert Image.open(write_video(frames, tmp_path / "y.gif", fast_palette=True)).n_frames == 3
    with pytest.raises(ValueError, match=".gif or .mp4"):
        write_video([f], tmp_path / "x.avi")
    with pytest.raises(ValueError, match="no frames"):
        write_video([], tmp_path / "z.gif")
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="imageio-ffmpeg"):
            check_video_path(tmp_path / "x.mp4")


# ---------------------------------------------------------------------------------------- end to end
def test_evaluate_on_a_generated_town_with_routes_written_to_the_cache(tmp_path, monkeypatch):
    """``town=random-<seed>`` (docs/maps.md, "Generated towns"): its 10 fixed routes are drawn on
    first use into the user cache, the same ones on the next evaluation, and the expert drives
    them; the Hydra group ``town=random town.seed=<seed>`` names the same town."""
    from hydra_config import config

    monkeypatch.setenv("DRIVEMIND_CACHE", str(tmp_path / "cache"))
    res = evaluate("autopilot", town="random-5", density="empty", routes=[0], out_dir=tmp_path / "a",
                   env_kwargs={"bev": "cpu"}, progress=False)
    files = list((tmp_path / "cache" / "routes").glob("random-5-*.json"))
    assert len(files) == 1
    assert [r.termination for r in res["records"]] == ["arrived"]
    again = evaluate("autopilot", town="random-5", density="empty", routes=[0], out_dir=tmp_path / "b",
                     env_kwargs={"bev": "cpu"}, progress=False)
    assert [r.distance_m for r in again["records"]] == [r.distance_m for r in res["records"]]
    assert config("town=random", "town.seed=5")["town"]["name"] == "random-5"


def test_evaluate_autopilot_on_two_grid_routes(tmp_path):
    res = evaluate("autopilot", town="grid", density="empty", routes=[0, 1], out_dir=tmp_path,
                   env_kwargs={"bev": "cpu"}, video_route=1, progress=False, meta={"name": "ref"})
    m, records, files = res["metrics"], res["records"], res["files"]
    assert [r.route_index for r in records] == [0, 1]
    assert all(r.termination == "arrived" and r.completion == 1.0 for r in records)
    assert m["RC"] == 1.0 and m["SR"] == 1.0 and m["CR"] == 0.0 and m["ICT_censored"]
    assert m["steps"] == sum(r.steps for r in records) and m["AS"] > 5.0
    assert m["TD"] == pytest.approx(np.mean([r.distance_m for r in records]))
    assert set(files) == {"json", "csv", "md", "png", "video"}
    assert files["video"] == tmp_path / "route_1.gif"
    assert Image.open(files["video"]).n_frames == records[1].steps
    doc = json.loads(files["json"].read_text())
    assert doc["meta"]["policy"] == "autopilot" and doc["meta"]["name"] == "ref"
    assert doc["meta"]["routes"] == [0, 1] and doc["metrics"]["RC"] == 1.0
    from drivemind.paths import machine_info
    assert doc["meta"]["machine"] == machine_info()  # the CPU it ran on (docs/simulator.md, "Determinism")
    assert "| 1.00 | " in files["md"].read_text()


def test_evaluate_callable_policy_step_limit_and_bad_arguments(tmp_path):
    seen = []

    def brake(obs):
        seen.append(obs)
        return np.array([0.0, -1.0], np.float32)

    res = evaluate(brake, town="grid", density="empty", routes=[2], out_dir=tmp_path,
                   env_kwargs={"bev": "cpu"}, video_route=None, max_steps_per_route=20,
                   progress=False)
    (r,) = res["records"]
    assert len(seen) == 20 and set(seen[0]) == {"bev", "ego", "waypoints"}
    assert r.route_index == 2 and r.steps == 20 and r.truncation == "max_steps"
    assert r.termination == "" and not r.arrived and r.completion < 0.05
    assert res["metrics"]["RC"] == 0.0 and "video" not in res["files"]
    assert res["metrics"]["AS"] == pytest.approx(0.0, abs=1.0)
    with pytest.raises(ValueError, match="autopilot"):
        evaluate("expert", town="grid", density="empty", out_dir=tmp_path)
    with pytest.raises(ValueError, match="video_route"):
        evaluate(brake, town="grid", density="empty", out_dir=tmp_path, routes=[1], video_route=0)
    with pytest.raises(ValueError, match="routes"):
        evaluate(brake, town="grid", density="empty", out_dir=tmp_path, routes=[10])
