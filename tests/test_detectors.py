"""Detector slot (drivemind.vlm.detectors): the privileged stand-in on real lite-sim snapshots,
the critical-class gate, the forward/BEV view choice, and ultralytics YOLO on a model built
offline from its yaml (random weights). The YOLO tests need the ``vision`` extra (ultralytics +
torchvision) and skip without it; everything else runs in the default install."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from drivemind.sim.snapshot import ActorClass
from drivemind.vlm.detectors import (ACTOR_COCO, CRITICAL_CLASSES, Detection, PrivilegedDetector,
                                     build_detector, dynamic_view, gate)

PAPER_CRITICAL = {"person", "bicycle", "motorcycle", "dog", "horse", "sheep", "cow", "elephant",
                  "bear", "zebra", "giraffe"}


def _ego_frame(snap):
    """(forward, right, distance) of every actor relative to the ego (CARLA frame)."""
    e = snap.ego
    d = snap.actors.pos - (e.x, e.y)
    fwd = d[:, 0] * math.cos(e.yaw) + d[:, 1] * math.sin(e.yaw)
    right = -d[:, 0] * math.sin(e.yaw) + d[:, 1] * math.cos(e.yaw)
    return fwd, right, np.hypot(fwd, right)


@pytest.fixture(scope="module")
def walker_scene():
    """A real lite-sim snapshot (grid, dense traffic plus walkers and two-wheelers) with one
    walker clearly ahead of the ego (within 30 deg, < 40 m) and one clearly behind (< 40 m)."""
    from drivemind.maps import load_town, random_route
    from drivemind.sim import LiteWorld, density_config

    rm = load_town("grid")
    world = LiteWorld(rm, density_config("dense", walkers=60, bicycles=10, motorcycles=10))
    for seed in range(6):
        route = random_route(rm, np.random.default_rng(seed))
        snap = world.reset(seed=seed, ego_pose=route.start)
        for _ in range(40):
            fwd, right, dist = _ego_frame(snap)
            walker = snap.actors.cls == int(ActorClass.WALKER)
            ahead = walker & (fwd > 3) & (np.abs(np.arctan2(right, fwd)) < math.radians(30)) & (dist < 40)
            behind = walker & (fwd < -5) & (dist < 40)
            if ahead.any() and behind.any():
                return snap, np.flatnonzero(ahead)[0], np.flatnonzero(behind)[0]
            snap = world.step((0.0, 0.3))
    pytest.fail("no lite-sim step with a walker ahead and one behind in 6 seeds x 40 steps")


def test_critical_classes_are_the_papers():
    assert CRITICAL_CLASSES == PAPER_CRITICAL
    assert ACTOR_COCO[ActorClass.WALKER] == "person" and ACTOR_COCO[ActorClass.CAR] == "car"
    assert ACTOR_COCO[ActorClass.BICYCLE] == "bicycle"
    assert ACTOR_COCO[ActorClass.MOTORCYCLE] == "motorcycle"


def test_gate():
    box = (0.0, 0.0, 1.0, 1.0)
    assert not gate([])
    assert not gate([Detection("car", 0.9, box), Detection("truck", 0.8, box)])
    for name in PAPER_CRITICAL:
        assert gate([Detection("car", 0.9, box), Detection(name, 0.3, box)]), name
    assert Detection("person", 0.5, box).critical and not Detection("car", 0.5, box).critical
    assert gate([Detection("car", 0.9, box)], classes={"car"})


def test_privileged_sees_walker_ahead_not_behind(walker_scene):
    snap, ahead, behind = walker_scene
    det = PrivilegedDetector()
    found = det.detect(snap)
    ids = {d.actor_id for d in found}
    a = snap.actors
    assert int(a.id[ahead]) in ids and int(a.id[behind]) not in ids
    assert gate(found)
    fwd, right, dist = _ego_frame(snap)
    for d in found:
        i = int(np.flatnonzero(a.id == d.actor_id)[0])
        assert d.cls == ACTOR_COCO[ActorClass(int(a.cls[i]))] and d.score == 1.0 and d.frame == "ego"
        assert fwd[i] > 0 and d.distance == pytest.approx(dist[i])  # nothing behind the ego
        x1, y1, x2, y2 = d.box  # the actor's box in the ego frame contains its centre
        assert x1 < fwd[i] < x2 and y1 < right[i] < y2
    assert [d.distance for d in found] == sorted(d.distance for d in found)
    # turn the ego around: the walker behind is now ahead and the one ahead is behind
    turned = replace(snap, ego=replace(snap.ego, yaw=snap.ego.yaw + math.pi))
    ids2 = {d.actor_id for d in det.detect(turned)}
    assert int(a.id[behind]) in ids2 and int(a.id[ahead]) not in ids2
    # a range shorter than the walker's distance hides it; a full circle sees both
    assert int(a.id[ahead]) not in {d.actor_id for d in
                                    PrivilegedDetector(max_range=dist[ahead] / 2).detect(snap)}
    both = {d.actor_id for d in PrivilegedDetector(fov_deg=360, max_range=45).detect(snap)}
    assert {int(a.id[ahead]), int(a.id[behind])} <= both
    assert det.detect_batch([snap, turned])[0] == found


def test_privileged_ignores_static_and_empty(walker_scene):
    snap, ahead, _ = walker_scene
    a = snap.actors
    cls = a.cls.copy()
    cls[ahead] = int(ActorClass.STATIC)
    static = replace(snap, actors=replace(a, cls=cls))
    assert int(a.id[ahead]) not in {d.actor_id for d in PrivilegedDetector().detect(static)}
    from drivemind.sim.snapshot import Actors
    assert PrivilegedDetector().detect(replace(snap, actors=Actors.empty())) == []


def test_privileged_bad_input(walker_scene):
    with pytest.raises(ValueError, match="fov_deg"):
        PrivilegedDetector(fov_deg=0)
    with pytest.raises(ValueError, match="max_range"):
        PrivilegedDetector(max_range=float("nan"))
    with pytest.raises(TypeError, match="WorldSnapshot"):
        PrivilegedDetector().detect(np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="unknown detector kind 'sam'; valid: privileged, yolo"):
        build_detector({"kind": "sam"})
    with pytest.raises(ValueError, match="bad option"):
        build_detector({"kind": "privileged", "fov": 60})
    d = build_detector(None)
    assert isinstance(d, PrivilegedDetector) and d.needs == "snapshot" and "stand-in" in repr(d)
    assert build_detector({"kind": "privileged", "fov_deg": 60}).fov_deg == 60


def test_dynamic_view_bev_on_lite_and_front_when_backend_has_one():
    import gymnasium as gym

    import drivemind  # noqa: F401  (registers DriveMind-v0)

    env = gym.make("DriveMind-v0", town="grid", density="drivevlm", bev="cpu")
    try:
        env.reset(seed=0)
        img, view = dynamic_view(env)
        assert view == "bev" and np.array_equal(img, env.unwrapped.bev.rgb())
        assert img.shape == (224, 224, 3) and img.dtype == np.uint8  # BevConfig.rgb_size
        # a backend with a forward camera (a stand-in for the CARLA backend's camera sensor;
        # no CARLA server runs here)
        cam = np.full((120, 160, 3), 7, np.uint8)

        class CameraBackend:
            def front_rgb(self):
                return cam

        env.unwrapped.world, lite = CameraBackend(), env.unwrapped.world
        img, view = dynamic_view(env)
        assert view == "front" and img is cam
        env.unwrapped.world = lite
    finally:
        env.close()


# ---------------------------------------------------------------------- YOLO (vision extra)
@pytest.fixture(scope="module")
def yolo(tmp_path_factory):
    pytest.importorskip("ultralytics", reason="needs the vision extra (ultralytics)")
    import torch

    from drivemind.vlm.detectors import YoloDetector

    torch.manual_seed(0)
    det = YoloDetector("yolov8n.yaml", imgsz=128, conf=0.0)  # random weights: every box scores
    path = tmp_path_factory.mktemp("yolo") / "tiny-yolov8n.pt"
    det.model.save(str(path))
    return det, path


@pytest.fixture(autouse=True)
def _no_env_weights(monkeypatch):
    monkeypatch.delenv("DRIVEMIND_YOLO_WEIGHTS", raising=False)


def test_yolo_from_yaml_runs_on_frames(yolo):
    det, _ = yolo
    assert det.random_init and det.name == "yolo:yolov8n.yaml:random-init" and det.needs == "image"
    assert det.names[0] == "person" and det.names[3] == "motorcycle" and len(det.names) == 80
    frames = np.random.default_rng(0).integers(0, 256, (2, 96, 128, 3), dtype=np.uint8)
    out = det.detect_batch(frames)
    assert len(out) == 2 and all(len(o) > 0 for o in out)
    for d in out[0]:
        assert isinstance(d, Detection) and d.cls in det.names.values() and d.frame == "image"
        assert 0.0 <= d.score <= 1.0 and len(d.box) == 4
        x1, y1, x2, y2 = d.box
        assert -1 <= x1 <= x2 <= 129 and -1 <= y1 <= y2 <= 97
    assert isinstance(gate(out[0]), bool)
    one = det.detect(frames[0])
    assert [(d.cls, d.box) for d in one] == [(d.cls, d.box) for d in out[0]]
    # colours matter: the frame is handed over as BGR, so swapping channels changes the output
    swapped = det.detect(np.ascontiguousarray(frames[0][..., ::-1]))
    assert [d.score for d in swapped] != [d.score for d in one]
    assert det.detect_batch(np.zeros((0, 8, 8, 3), np.uint8)) == []
    strict = type(det)("yolov8n.yaml", imgsz=128, conf=1.0)
    assert strict.detect(frames[0]) == []


def test_yolo_checkpoint_loads_back(yolo, monkeypatch, tmp_path):
    from drivemind.vlm.detectors import YoloDetector, find_yolo_weights

    det, path = yolo
    frame = np.random.default_rng(1).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    ref = det.detect(frame)
    for loaded in (YoloDetector(str(path), imgsz=128, conf=0.0),
                   YoloDetector("yolov8n.pt", weights_path=path, imgsz=128, conf=0.0)):
        assert loaded.weights == path and not loaded.random_init and loaded.names == det.names
        got = loaded.detect(frame)  # saved in fp16: boxes agree to a pixel
        assert len(got) == len(ref)
        np.testing.assert_allclose([d.box for d in got[:20]], [d.box for d in ref[:20]], atol=1.0)
    monkeypatch.setenv("DRIVEMIND_YOLO_WEIGHTS", str(path.parent))  # a folder: found by name
    assert find_yolo_weights(path.name) == path
    monkeypatch.setenv("DRIVEMIND_YOLO_WEIGHTS", str(path))  # the file itself
    assert find_yolo_weights(path.name) == path


def test_yolo_missing_weights_one_clear_error(yolo, monkeypatch, tmp_path):
    from drivemind.vlm.detectors import YoloDetector

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError) as ei:
        YoloDetector("yolov8n.pt")
    msg = str(ei.value)
    for part in ("yolov8n.pt", str(tmp_path / "cache" / "drivemind" / "yolo"), str(tmp_path),
                 "$DRIVEMIND_YOLO_WEIGHTS", "YOLO_OFFLINE", "weights_path"):
        assert part in msg, part
    assert not (tmp_path / "yolov8n.pt").exists()  # nothing was downloaded
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        YoloDetector("yolov8n.yaml", weights_path=tmp_path / "nope.pt")
    with pytest.raises(ValueError, match=".pt.*yaml"):
        YoloDetector("yolov8n.onnx")
    with pytest.raises(ValueError, match="multiple of 32"):
        YoloDetector("yolov8n.yaml", imgsz=100)
    with pytest.raises(ValueError, match="RGB"):
        yolo[0].detect_batch(np.zeros((1, 8, 8), np.uint8))


def test_config_file_detector_is_the_privileged_stand_in():
    from pathlib import Path

    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "vlm" / "openclip.yaml")
                         .read_text())
    det = build_detector(cfg["detector"])
    assert isinstance(det, PrivilegedDetector) and det.fov_deg == cfg["detector"]["fov_deg"]


def test_bench_detector_options_go_with_yolo():
    """bench.py drivevlm-service's --detector-model / --detector-imgsz reach the YOLO slot only:
    with the privileged detector they stop with one message before anything is built."""
    from script_loader import load_script

    bench = load_script("bench")
    with pytest.raises(SystemExit, match="go with --detector yolo"):
        bench.main(["drivevlm-service", "--detector-model", "yolov8n.yaml"])
    with pytest.raises(SystemExit, match="go with --detector yolo"):
        bench.main(["drivevlm-service", "--detector", "privileged", "--detector-imgsz", "64"])
