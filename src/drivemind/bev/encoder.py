"""A frozen BEV encoder for fast learning: BEV masks -> a small feature vector the policy reads.

Training a CNN end to end inside SAC costs most of a CPU's time (two CNN passes and a backward
pass per gradient step). The fast path (``experiment=fast``, docs/training.md) instead encodes
each observation's BEV once, in the env, with this frozen encoder (``obs.features=bev_encoder``:
the observation gains ``bev_features``), and the actor and critic are small MLPs over
``bev_features`` + ego state + waypoints. The policy still sees the BEV: only through features.

The encoder is pre-trained on simulator frames **without actions** (``scripts/train_bev_encoder.py``,
deterministic for a seed, shipped like BEV-CLIP) with two objectives read from the frame's own
ground truth:

- **scene facts** (:func:`scene_targets`): what a driver needs from the BEV and the ego/waypoint
  vector does not give: the lead actor on the route (distance, speed), the traffic light ahead
  (state, distance), lateral offset and heading error against the route, and a "radar" of the
  nearest vehicle and walker in 8 sectors around the ego;
- **reconstruction** of the frame pooled to 12 x 12 per channel (a self-supervised term that keeps
  the road layout in the features).

Both heads are linear in the features, so the features carry those quantities linearly for the
policy's MLPs. Architecture (about 9 M multiply-adds at 15 x 96 x 96)::

    Conv(C,32,4,s4) - Conv(32,64,3,s2) - Conv(64,64,3,s2) - Conv(64,64,3,s2) - FC(dim) - tanh
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ..paths import weights_cache_dir

FORMAT = "drivemind.bev_encoder"
VERSION = 1
TRAIN_CMD = "python scripts/train_bev_encoder.py"
PACKAGE_WEIGHTS = Path(__file__).resolve().parent / "weights"
RADAR_SECTORS = 8
RADAR_RANGE = 30.0  # m
RECON_SIZE = 12
# scene_targets layout: names of the regression targets (light state is a separate class target)
TARGET_NAMES = (("lead_distance", "lead_speed", "lead_present", "light_distance", "lateral_offset",
                 "heading_error", "critical")
                + tuple(f"radar_vehicle_{i}" for i in range(RADAR_SECTORS))
                + tuple(f"radar_walker_{i}" for i in range(RADAR_SECTORS)))
LIGHT_CLASSES = ("green", "yellow", "red", "none")  # LightState 0, 1, 2; -1/3 -> none


def scene_targets(info: dict, snapshot, lead_range: float = 50.0, light_range: float = 50.0):
    """The encoder's ground-truth targets for one frame: (regression vector over
    ``TARGET_NAMES``, light class index into ``LIGHT_CLASSES``), from the env's per-step facts
    (``info``) and its ``WorldSnapshot`` (the sector radar), all scaled to about [0, 1] / [-1, 1]."""
    from ..sim.snapshot import ActorClass

    lead = float(info["lead_distance"])
    reg = [min(lead, lead_range) / lead_range, float(info["lead_speed_kmh"]) / 40.0,
           float(lead < lead_range - 1e-3), min(float(info["light_distance"]), light_range) / light_range,
           float(np.clip(info["lateral_offset"], -3, 3)) / 2.0, float(np.clip(info["heading_error"], -1.5, 1.5)),
           float(info.get("critical_count", 0.0) > 0)]
    e, a = snapshot.ego, snapshot.actors
    c, s = math.cos(e.yaw), math.sin(e.yaw)
    dx, dy = a.pos[:, 0] - e.x, a.pos[:, 1] - e.y
    fx, fy = dx * c + dy * s, -dx * s + dy * c
    dist = np.hypot(fx, fy)
    sector = ((np.arctan2(fy, fx) + math.pi / RADAR_SECTORS) % (2 * math.pi)
              // (2 * math.pi / RADAR_SECTORS)).astype(np.int64) % RADAR_SECTORS
    walker = a.cls == int(ActorClass.WALKER)
    moving = (a.cls != int(ActorClass.STATIC)) & (a.cls != int(ActorClass.NONE))
    for cls_mask in (moving & ~walker, walker):
        near = np.full(RADAR_SECTORS, RADAR_RANGE)
        for k in np.flatnonzero(cls_mask & (dist < RADAR_RANGE)):
            near[sector[k]] = min(near[sector[k]], dist[k])
        reg += list(near / RADAR_RANGE)
    st = int(info["light_state"])
    light = st if st in (0, 1, 2) else 3
    return np.asarray(reg, np.float32), light


def _torch():
    import torch
    from torch import nn
    return torch, nn


def build_network(in_ch: int, size: int, dim: int = 128):
    """The encoder network (see the module docstring) and its heads."""
    torch, nn = _torch()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.cnn = nn.Sequential(
                nn.Conv2d(in_ch, 32, 4, 4), nn.ReLU(),
                nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
                nn.Conv2d(64, 64, 3, 2, 1), nn.ReLU(),
                nn.Conv2d(64, 64, 3, 2, 1), nn.ReLU(), nn.Flatten())
            with torch.no_grad():
                n = self.cnn(torch.zeros(1, in_ch, size, size)).shape[1]
            self.fc = nn.Linear(n, dim)
            self.facts = nn.Linear(dim, len(TARGET_NAMES))
            self.light = nn.Linear(dim, len(LIGHT_CLASSES))
            self.recon = nn.Linear(dim, in_ch * RECON_SIZE * RECON_SIZE)

        def forward(self, x):  # x: float in [0, 1]
            return torch.tanh(self.fc(self.cnn(x)))

    return Net()


def weights_name(bev_shape) -> str:
    from ..bev.config import BEV_PRESETS

    shape = tuple(int(s) for s in bev_shape)
    for name, cfg in BEV_PRESETS.items():
        if cfg.shape == shape:
            return f"bev_encoder_{name}.pt"
    return "bev_encoder_{}x{}x{}.pt".format(*shape)


def search_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("DRIVEMIND_BEV_ENCODER"):
        dirs.append(Path(os.environ["DRIVEMIND_BEV_ENCODER"]))
    return [*dirs, weights_cache_dir(), PACKAGE_WEIGHTS]


class BevEncoder:
    """A loaded frozen encoder: ``encode(bev uint8 (B, C, H, W) or (C, H, W)) -> float32 (B, dim)``."""

    def __init__(self, net, meta: dict):
        self.net, self.meta = net.eval(), dict(meta)
        self.dim = int(meta["dim"])
        self.bev_shape = tuple(meta["bev_shape"])
        for p in self.net.parameters():
            p.requires_grad_(False)

    @classmethod
    def load(cls, name: str | os.PathLike = "bev_encoder", bev_shape=None) -> "BevEncoder":
        """``name``: ``bev_encoder`` (the shipped checkpoint for ``bev_shape``), a file name
        searched in ``$DRIVEMIND_BEV_ENCODER``, ``~/.cache/drivemind`` and the package's
        ``bev/weights/``, or a path. A BEV shape the checkpoint was not trained for is refused."""
        torch, _ = _torch()
        if str(name) == "bev_encoder":
            if bev_shape is None:
                raise ValueError("BevEncoder.load('bev_encoder') needs the BEV shape (C, H, W)")
            name = weights_name(bev_shape)
        p = Path(name)
        cands = [p] if p.exists() else [d / p.name for d in search_dirs()]
        path = next((c for c in cands if c.is_file()), None)
        if path is None:
            shape = "x".join(str(s) for s in bev_shape) if bev_shape is not None else "?"
            preset = p.name[len("bev_encoder_"):-3] if p.name.startswith("bev_encoder_") else "<preset>"
            preset = preset if "x" not in preset else "<preset> (or bev settings of this shape)"
            raise FileNotFoundError(
                f"no BEV encoder weights {p.name!r} (looked in: {', '.join(str(c.parent) for c in cands)}); "
                f"train them for this {shape} BEV with `{TRAIN_CMD} --bev {preset}` (it writes to "
                f"~/.cache/drivemind), or use obs.features=null (the policy then trains its own CNN)")
        ck = torch.load(path, map_location="cpu", weights_only=False)
        if not isinstance(ck, dict) or ck.get("format") != FORMAT:
            raise ValueError(f"{path} is not a DriveMind BEV encoder checkpoint")
        meta = ck["meta"]
        if bev_shape is not None and tuple(meta["bev_shape"]) != tuple(int(s) for s in bev_shape):
            raise ValueError(f"the BEV encoder {path} was trained on {tuple(meta['bev_shape'])} BEV "
                             f"frames but the observation is {tuple(bev_shape)}: train one for this "
                             f"shape (`{TRAIN_CMD}`) or use its BEV settings")
        c, h, _ = meta["bev_shape"]
        net = build_network(c, h, meta["dim"])
        net.load_state_dict(ck["state_dict"])
        enc = cls(net, meta)
        enc.path = path
        return enc

    def save(self, path: str | os.PathLike) -> Path:
        torch, _ = _torch()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"format": FORMAT, "version": VERSION, "meta": self.meta,
                    "state_dict": {k: v.contiguous() for k, v in self.net.state_dict().items()}}, path)
        return path

    def encode(self, bev: np.ndarray) -> np.ndarray:
        torch, _ = _torch()
        x = np.asarray(bev)
        one = x.ndim == 3
        if one:
            x = x[None]
        if tuple(x.shape[1:]) != self.bev_shape:
            raise ValueError(f"BEV encoder expects {self.bev_shape} frames, got {tuple(x.shape[1:])}")
        with torch.inference_mode():
            f = self.net(torch.from_numpy(np.ascontiguousarray(x)).float().mul_(1 / 255)).numpy()
        return f[0] if one else f


def train_encoder(frames: np.ndarray, targets: np.ndarray, lights: np.ndarray, *, dim: int = 128,
                  epochs: int = 6, batch_size: int = 128, lr: float = 1e-3, seed: int = 0,
                  heldout: np.ndarray | None = None, progress: bool = False, log=print) -> tuple:
    """Fit the encoder (facts MSE + light cross-entropy + reconstruction MSE) on uint8 ``frames``
    (N, C, H, W) with ``targets`` (N, len(TARGET_NAMES)) and ``lights`` (N,). ``heldout``: a
    boolean mask of frames kept out of training and scored at the end. Returns
    (BevEncoder, metrics dict). Deterministic for a seed on one thread."""
    torch, nn = _torch()
    import torch.nn.functional as F

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    n, c, h, w = frames.shape
    net = build_network(c, h, dim)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    held = np.zeros(n, bool) if heldout is None else np.asarray(heldout, bool)
    train_idx = np.flatnonzero(~held)
    steps_total = max(epochs * max(len(train_idx) // batch_size, 1), 1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps_total)
    pool = nn.AdaptiveAvgPool2d(RECON_SIZE)

    def losses(idx):
        x = torch.from_numpy(frames[idx]).float().mul_(1 / 255)
        z = net(x)
        l_f = F.mse_loss(net.facts(z), torch.from_numpy(targets[idx]))
        l_l = F.cross_entropy(net.light(z), torch.from_numpy(lights[idx]).long())
        l_r = F.mse_loss(net.recon(z), pool(x).flatten(1)) * 10.0
        return l_f, l_l, l_r, z

    for ep in range(epochs):
        order = rng.permutation(train_idx)
        net.train()
        tot = np.zeros(3)
        nb = 0
        for a in range(0, len(order) - batch_size + 1, batch_size):
            l_f, l_l, l_r, _ = losses(order[a:a + batch_size])
            loss = l_f + 0.2 * l_l + l_r
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            tot += [l_f.item(), l_l.item(), l_r.item()]
            nb += 1
        if progress:
            log(f"epoch {ep + 1}/{epochs}: facts {tot[0] / nb:.4f} light {tot[1] / nb:.3f} "
                f"recon {tot[2] / nb:.4f}")
    net.eval()
    metrics = {}
    for name, mask in (("train", ~held), ("heldout", held)):
        idx = np.flatnonzero(mask)
        if not len(idx):
            continue
        with torch.no_grad():
            errs, hits, rec = [], 0, 0.0
            for a in range(0, len(idx), 512):
                b = idx[a:a + 512]
                x = torch.from_numpy(frames[b]).float().mul_(1 / 255)
                z = net(x)
                errs.append((net.facts(z) - torch.from_numpy(targets[b])).abs().numpy())
                hits += int((net.light(z).argmax(1).numpy() == lights[b]).sum())
                rec += float(F.mse_loss(net.recon(z), pool(x).flatten(1), reduction="sum"))
            err = np.concatenate(errs).mean(0)
        metrics[name] = {"frames": int(len(idx)), "light_accuracy": round(hits / len(idx), 4),
                         "recon_mse": round(rec / (len(idx) * c * RECON_SIZE ** 2), 5),
                         "mae": {k: round(float(v), 4) for k, v in zip(TARGET_NAMES, err)}}
    meta = {"dim": dim, "bev_shape": [int(c), int(h), int(w)], "targets": list(TARGET_NAMES),
            "lights": list(LIGHT_CLASSES), "epochs": epochs, "seed": seed, "metrics": metrics}
    return BevEncoder(net, meta), metrics
