"""BEV-CLIP trained on every caption family the papers' rewards read (``scripts/train_bev_clip.py``).

:func:`train_multi` fits a :class:`~drivemind.vlm.bev_clip.BevClip` image tower against frozen
MiniLM embeddings with one loss per family of :func:`drivemind.vlm.supervision.frame_targets`:

- ``scene``: symmetric InfoNCE on the ground-truth captions (paraphrased; equal situations are
  all positives), each frame's *flipped* caption (its danger clauses reversed) added as a hard
  negative on the image-to-text side;
- ``action``: cross-entropy over the 30 Found-RL prompts of the frame's context (command x speed
  bin), the applied action the target, exactly the softmax ``found_rl_clip`` scores;
- ``risk``: cross-entropy over DriveVLM-RL's risk descriptions (frames with a ``risk_id``);
- ``polarity``: for safe frames every (safe prompt, danger prompt) pair must score
  ``cos(x, safe) - cos(x, danger) >= margin``, for danger frames the reverse: a logistic loss
  ``softplus(k (margin - y (cos_safe - cos_danger)))``, the two classes weighted equally;
- ``teacher``: the same logistic loss on DriveMind's generated (ideal, present) prompts, the
  frame's own and another frame's of the batch.

:func:`evaluate` measures what the rewards need on held-out frames: caption top-1, the AUROC of
the static and VLM-RL prompt pairs for danger against safe frames, and Found-RL's alignment
(mean P(a_t) at tau = 100 and top-1 over the context's 30 actions, against 1/30).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn import functional as F

from .bev_clip import BevClip, _caption_ids

LOSS_WEIGHTS = {"scene": 1.0, "action": 1.0, "risk": 0.25, "polarity": 1.0, "teacher": 0.5}
POLARITY_SCALE, POLARITY_MARGIN = 10.0, 0.3


def _soft_nce(logits: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """KL(target || softmax(logits)) per row, target uniform over ``same`` (row-wise)."""
    target = same / same.sum(1, keepdim=True)
    ent = (target * target.clamp_min(1e-12).log()).sum(1)
    return (ent - (target * F.log_softmax(logits, 1)).sum(1)).mean()


def _polarity(diff: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over labelled rows (each class weighted half) of softplus(k (m - y diff)); ``diff``
    (B, ...) is cos(safe) - cos(danger) per pair."""
    loss = F.softplus(POLARITY_SCALE * (POLARITY_MARGIN - y.view(-1, *[1] * (diff.dim() - 1)) * diff))
    loss = loss.reshape(len(y), -1).mean(1)
    out = loss.new_zeros(())
    for cls in (-1, 1):
        m = y == cls
        if m.any():
            out = out + 0.5 * loss[m].mean()
    return out


class _Texts:
    """Every text a batch needs, embedded once by the frozen tower."""

    def __init__(self, targets: dict, safe, danger, text_encoder):
        from ..privileged import RISK_VOCABULARY

        enc = (lambda xs: torch.as_tensor(text_encoder.encode(list(xs))))
        self.scene_uniq, self.scene_id = _caption_ids(targets["scene"])
        self.scene = enc(self.scene_uniq)
        flip_uniq, self.flip_id = _caption_ids(targets["scene_flip"])
        self.flip = enc(flip_uniq)
        # situation ids (canonical wording) for positives and for masking flips equal to a scene
        canon = targets.get("scene_canonical", targets["scene"])
        sit_uniq, self.sit_id = _caption_ids(list(canon) + list(targets["scene_flip"]))
        n = len(canon)
        self.flip_sit_id, self.sit_id = self.sit_id[n:], self.sit_id[:n]
        pu, self.present_id = _caption_ids(targets["present"])
        self.present = enc(pu)
        iu, self.ideal_id = _caption_ids(targets["ideal"])
        self.ideal = enc(iu)
        self.action = enc(targets["library"]).view(24, 30, -1)
        self.risk = enc(RISK_VOCABULARY)
        self.safe, self.danger = enc(safe), enc(danger)


def _batch_loss(model: BevClip, x: torch.Tensor, b: np.ndarray, t: _Texts, targets: dict,
                rng: np.random.Generator, weights: dict) -> tuple[torch.Tensor, dict]:
    scale = model.logit_scale.exp().clamp(max=100.0)
    parts = {}
    bt = torch.as_tensor
    # scene: InfoNCE, positives = same situation, flipped captions as extra image-side negatives
    sit = bt(t.sit_id[b])
    same = (sit[:, None] == sit[None, :]).float()
    txt = t.scene[bt(t.scene_id[b])]
    flip = t.flip[bt(t.flip_id[b])]
    li = scale * x @ torch.cat([txt, flip]).t()
    clash = bt(t.flip_sit_id[b])[None, :] == sit[:, None]  # a flip equal to this frame's scene
    li = torch.cat([li[:, :len(b)], li[:, len(b):].masked_fill(clash, -1e4)], 1)
    same_i = torch.cat([same, torch.zeros_like(same)], 1)
    parts["scene"] = 0.5 * (_soft_nce(li, same_i) + _soft_nce(li[:, :len(b)].t(), same))
    # Found-RL: softmax over the context's 30 action prompts
    ctx, act = bt(targets["action_context"][b]), bt(targets["action_index"][b])
    la = scale * torch.einsum("bd,bkd->bk", x, t.action[ctx])
    parts["action"] = F.cross_entropy(la, act)
    # DriveVLM-RL's risk description
    risk = bt(targets["risk"][b])
    has = risk >= 0
    parts["risk"] = F.cross_entropy(scale * x[has] @ t.risk.t(), risk[has]) if has.any() \
        else x.new_zeros(())
    # polarity: every (safe, danger) prompt pair, and the teacher's (ideal, present)
    y = bt(targets["polarity"][b])
    lab = y != 0
    if lab.any():
        xl, yl = x[lab], y[lab].float()
        cs, cd = xl @ t.safe.t(), xl @ t.danger.t()
        parts["polarity"] = _polarity(cs[:, :, None] - cd[:, None, :], yl)
        rows = np.flatnonzero(lab.numpy())
        own = b[rows]
        other = b[rng.permutation(len(b))][rows]
        diffs = []
        for j in (own, other):
            ci = (xl * t.ideal[bt(t.ideal_id[j])]).sum(1)
            cp = (xl * t.present[bt(t.present_id[j])]).sum(1)
            diffs.append(ci - cp)
        parts["teacher"] = _polarity(torch.stack(diffs, 1), yl)
    else:
        parts["polarity"] = parts["teacher"] = x.new_zeros(())
    loss = sum(weights.get(k, 0.0) * v for k, v in parts.items())
    return loss, {k: float(v.detach()) for k, v in parts.items()}


def train_multi(frames, targets: dict, text_encoder, *, safe, danger, epochs: int = 6,
                batch_size: int = 128, lr: float = 2e-3, weight_decay: float = 1e-4, seed: int = 0,
                danger_repeat: int = 4, channel_names=None, weights: dict | None = None, progress: bool = False,
                log=None, speed_kmh=None, lane_input: bool = False, lane_bev: dict | None = None,
                rows=None) -> BevClip:
    """Fit a BevClip on uint8 frames (N, C, H, W) and their ``targets``
    (:func:`drivemind.vlm.supervision.frame_targets`) with the losses of the module docstring.
    Danger frames (polarity -1) appear ``danger_repeat`` times per epoch (they are few).
    ``speed_kmh`` (N,): the ego's measured speed of each frame; given, the tower is a speed tower
    (``BevClip(speed_input=True)``: the speed fused into its hidden layer), else image-only.
    ``lane_input``: the tower also reads the route-band lateral readout of each frame
    (``BevClip(lane_input=True)``, computed from the frame's own route plane; ``lane_bev``: the
    frames' BevConfig as a dict, default the preset of their shape). ``rows``: train on these rows
    of ``frames`` only (ascending; ``targets`` and ``speed_kmh`` are theirs), read batch by batch
    instead of copied out first, the same as passing ``frames[rows]`` with half the peak memory.
    Deterministic for a seed (one torch thread)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 (N, C, H, W), got {frames.dtype} {frames.shape}")
    _, c, h, w = frames.shape
    if rows is not None:
        rows = np.asarray(rows, np.int64)
        if len(rows) and (np.any(np.diff(rows) <= 0) or rows[0] < 0 or rows[-1] >= len(frames)):
            raise ValueError(f"rows must ascend within 0..{len(frames) - 1}")
    n = len(frames) if rows is None else len(rows)
    if len(targets["scene"]) != n:
        raise ValueError(f"{n} frames but {len(targets['scene'])} targets")
    if h != w:
        raise ValueError(f"BEV frames must be square, got {h}x{w}")
    if speed_kmh is not None:
        speed_kmh = np.asarray(speed_kmh, np.float32).reshape(-1)
        if len(speed_kmh) != n:
            raise ValueError(f"{n} frames but {len(speed_kmh)} speeds")
    weights = {**LOSS_WEIGHTS, **(weights or {})}
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = BevClip(in_channels=c, size=h, channel_names=channel_names,
                    speed_input=speed_kmh is not None, lane_input=lane_input, lane_bev=lane_bev)
    texts = _Texts(targets, safe, danger, text_encoder)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    pool = np.concatenate([np.arange(n)] + [np.flatnonzero(np.asarray(targets["polarity"]) < 0)]
                          * max(0, int(danger_repeat) - 1))
    steps = max(1, math.ceil(len(pool) / batch_size))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * steps,
                                                pct_start=0.1)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=epochs * steps, desc="BEV-CLIP", unit="batch")
    model.train()
    for ep in range(epochs):
        order = pool[rng.permutation(len(pool))]
        sums: dict = {}
        for i in range(steps):
            b = np.sort(order[i * batch_size:(i + 1) * batch_size])
            x = model(torch.as_tensor(frames[b if rows is None else rows[b]]),
                      None if speed_kmh is None else speed_kmh[b])
            loss, parts = _batch_loss(model, x, b, texts, targets, rng, weights)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + v / steps
            if bar is not None:
                bar.update(1)
                bar.set_postfix(epoch=ep + 1, loss=f"{loss.item():.3f}")
        if log is not None:
            log(ep + 1, sums)
    if bar is not None:
        bar.close()
    return model.eval()


def _auroc(score, positive) -> float:
    from ..evaluation.reward_quality import auroc
    return auroc(score, positive)


def evaluate(model: BevClip | None, frames, targets: dict, canonical, text_encoder, *,
             image_embeddings=None, tau: float = 100.0, speed_kmh=None,
             pairs=(("no collisions occur", "the car is about to crash"),
                    ("The road is clear with no car accidents",
                     "Two cars have collided with each other on the road"))) -> dict:
    """Held-out measures (module docstring) of a model on frames with ``targets`` and their
    canonical captions. ``pairs``: (safe, danger) prompts whose AUROC is reported, danger frames
    against safe ones (score cos(danger) - cos(safe)). ``speed_kmh``: the frames' ego speeds,
    for a speed tower."""
    from .bev_clip import retrieval_accuracy

    img = (model.embed(frames, speed_kmh=speed_kmh) if image_embeddings is None
           else np.asarray(image_embeddings))
    out = {"retrieval": retrieval_accuracy(None, None, list(canonical), text_encoder,
                                           image_embeddings=img)}
    y = np.asarray(targets["polarity"])
    sel = y != 0
    for safe, danger in pairs:
        u = text_encoder.encode([safe, danger])
        s = img @ u[1] - img @ u[0]
        out[f"auroc[{danger} | {safe}]"] = _auroc(s[sel], y[sel] < 0) if sel.any() else float("nan")
    lib = text_encoder.encode(list(targets["library"])).reshape(24, 30, -1)
    ctx, act = np.asarray(targets["action_context"]), np.asarray(targets["action_index"])
    z = tau * np.einsum("nd,nkd->nk", img, lib[ctx])
    z -= z.max(1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(1, keepdims=True)
    rows = np.arange(len(p))
    out["action_p_mean"] = float(p[rows, act].mean()) if len(p) else float("nan")
    out["action_top1"] = float((p.argmax(1) == act).mean()) if len(p) else float("nan")
    out["action_chance"] = 1.0 / 30
    out["n_danger"], out["n_safe"] = int((y < 0).sum()), int((y > 0).sum())
    return out


__all__ = ["LOSS_WEIGHTS", "evaluate", "train_multi"]
