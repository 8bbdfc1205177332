"""A replay buffer that stores each observation once, compactly, beside the facts its reward is
computed from, and samples only transitions whose reward is known.

Layout (``N = buffer_size // n_envs`` rows, one column per env; a *slot* is ``row * n_envs + env``):

- **Observations once.** Row ``r`` holds the observation the transition at row ``r`` starts from;
  its next observation is row ``r + 1`` of the same env (written in the same ``add``), unless the
  episode ended there, in which case the terminal observation is kept in a side table until the
  row is overwritten. SB3's ``DictReplayBuffer`` stores ``obs`` and ``next_obs`` separately.
- **Masks as palette codes.** The BEV masks of a pixel (15 uint8 values) are stored as one byte:
  an index into that frame's palette of the joint values that occur in it (at most
  ``palette_size``; a frame with more is kept raw in a side table and counted). Lossless for any
  channel set and value levels. Per-channel bit-packing would need 20 bits per pixel for Roach's
  levels (lane markings have 3, lights 4); the palette needs 8 plus the palette.
- **Facts, embeddings, labels.** Each transition keeps the env's per-step facts (``FACT_KEYS``,
  float32), an optional image-embedding slot (float16, for the semantic rewards) and a label state:
  ``EMPTY`` (no transition), ``PENDING`` (stored, reward unknown), ``LABELLED``, ``INVALID`` (its
  reward came out non-finite: counted, never sampled).
- **Forward camera frames** (``keep_views=True``): a transition whose ``info`` carries the
  backend's forward camera frame (``info["front_rgb"]``, CARLA with ``sim.carla.camera``) keeps it
  in a side table only while it is pending (for the reward's models and the view embedding), at
  most ``max_views`` frames (older ones are dropped and counted); its embedding is kept in the
  ``view_embeddings`` slot, allocated when the agent first stores one.
- **Action guidance** (``guidance=True``, Found-RL's VMR / AWAG: :mod:`drivemind.agents.guidance`):
  per transition a suggested action (``guide_actions``, float32) and its availability mask
  (``guide_mask``: 1 = a suggestion for this transition's observation, 0 = none or not scored
  yet). ``add`` copies the facts ``vlm_action_steer`` / ``vlm_action_accel`` when
  ``vlm_action_available`` is set (the env's privileged teacher); an asynchronous teacher writes
  its answers back by slot with ``set_guidance``. ``sample_guided`` returns them beside the batch.
- **Relabelling.** ``label_pending(reward)`` scores the pending transitions in one batch;
  ``relabel(reward)`` re-scores everything stored (e.g. after changing weights) from the stored
  facts, without touching observations or the simulator. ``sample`` draws only ``LABELLED`` slots.

The env reward SB3 passes to ``add`` is not used: rewards always come from the reward function.
"""

from __future__ import annotations

import warnings
from typing import Any

import numba
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.type_aliases import DictReplayBufferSamples

EMPTY, PENDING, LABELLED, INVALID = 0, 1, 2, 3
LABEL_NAMES = {EMPTY: "empty", PENDING: "pending", LABELLED: "labelled", INVALID: "invalid"}


class PaletteCodec:
    """uint8 C x H x W masks <-> one code byte per pixel + a per-frame palette (P x C)."""

    def __init__(self, shape: tuple[int, int, int], palette_size: int = 64):
        if not 2 <= palette_size <= 256:
            raise ValueError(f"palette_size must be in [2, 256] (codes are one byte), got {palette_size}")
        self.shape, self.P = tuple(shape), int(palette_size)
        self.C, self.HW = shape[0], shape[1] * shape[2]

    def encode(self, x: np.ndarray):
        """-> (codes (HW,) uint8, palette (P, C) uint8), or None if the frame has more than P
        joint values. The palette lists the frame's distinct pixel values in ascending byte order
        (as ``np.unique`` over the pixels would), padded with zeros."""
        pix = np.ascontiguousarray(x.reshape(self.C, self.HW).T)  # HW x C
        codes = np.empty(self.HW, np.uint8)
        seen = np.empty((self.P, self.C), np.uint8)
        n = _palette_codes(pix, seen, codes)  # codes in order of first appearance
        if n < 0:
            return None
        order = np.lexsort(seen[:n, ::-1].T)  # ascending rows, first byte most significant
        rank = np.empty(n, np.uint8)
        rank[order] = np.arange(n, dtype=np.uint8)
        pal = np.zeros((self.P, self.C), np.uint8)
        pal[:n] = seen[order]
        return rank[codes], pal

    def decode(self, codes: np.ndarray, palettes: np.ndarray, scaled: bool = False,
               device: th.device | str | None = None) -> th.Tensor:
        """codes (B, HW), palettes (B, P, C) -> B x C x H x W: uint8, or float32 divided by 255
        when ``scaled`` (what the network reads, written in one pass).

        ``device`` other than the CPU (a GPU): the codes and palettes go there and are expanded
        there (one gather), so only one byte per pixel crosses the bus instead of C floats (at the
        paper's 15 x 224 x 224 BEV, 25 MB per batch of 256 transitions instead of 1.5 GB). The
        values are the same, bit for bit (the same float32 product of byte and 1/255)."""
        if device is not None and th.device(device).type != "cpu":
            return self.decode_torch(th.from_numpy(np.ascontiguousarray(codes)),
                                     th.from_numpy(np.ascontiguousarray(palettes)), scaled, device)
        if scaled:
            out = np.empty((len(codes), self.C, self.HW), np.float32)
            _decode(codes, palettes.astype(np.float32) * np.float32(1 / 255), out)
        else:
            out = np.empty((len(codes), self.C, self.HW), np.uint8)
            _decode(codes, palettes, out)
        return th.from_numpy(out).view(len(codes), *self.shape)

    def decode_torch(self, codes: th.Tensor, palettes: th.Tensor, scaled: bool = False,
                     device: th.device | str | None = None) -> th.Tensor:
        """``decode`` with torch ops on ``device`` (default: where ``codes`` are): out[b, c, p] =
        palettes[b, codes[b, p], c], one gather over the palette transposed to (B, C, P)."""
        dev = th.device(device) if device is not None else codes.device
        b = codes.shape[0]
        idx = codes.to(dev, non_blocking=True).long().unsqueeze(1).expand(b, self.C, self.HW)
        pal = palettes.to(dev, non_blocking=True)
        if scaled:
            pal = pal.float() * np.float32(1 / 255)
        out = th.gather(pal.transpose(1, 2), 2, idx)
        return out.view(b, *self.shape)


@numba.njit(cache=True, inline="always")
def _same_row(pix, i, seen, q):  # pragma: no cover - compiled
    for j in range(pix.shape[1]):
        if pix[i, j] != seen[q, j]:
            return False
    return True


@numba.njit(cache=True)
def _palette_codes(pix, seen, codes):  # pragma: no cover - compiled
    """Codes of the rows of ``pix`` (HW x C) in order of first appearance, the distinct rows in
    ``seen``; returns their number, or -1 past ``len(seen)``."""
    n, last = 0, -1
    hw, c = pix.shape
    for i in range(hw):
        k = -1
        if last >= 0 and _same_row(pix, i, seen, last):  # runs: most pixels repeat their neighbour's value
            k = last
        if k < 0:
            for q in range(n):
                if _same_row(pix, i, seen, q):
                    k = q
                    break
        if k < 0:
            if n == seen.shape[0]:
                return -1
            for j in range(c):
                seen[n, j] = pix[i, j]
            k = n
            n += 1
        codes[i] = k
        last = k
    return n


@numba.njit(cache=True)
def _decode(codes, palettes, out):  # pragma: no cover - compiled
    for b in range(codes.shape[0]):
        for c in range(out.shape[1]):
            for p in range(codes.shape[1]):
                out[b, c, p] = palettes[b, codes[b, p], c]


class RelabelReplayBuffer(ReplayBuffer):
    """See the module docstring. Drop-in for SB3's off-policy algorithms on Dict observations whose
    image keys are uint8 C x H x W; extra arguments: ``fact_keys`` (default: the env's
    ``FACT_KEYS``), ``embedding_dim`` (0 = no slot), ``obs_embeddings`` (also keep the embedding
    of the observation each action was taken in, for world models), ``columns`` (``{name: dtype}``
    per-transition values a reward's ``prepare`` fills, e.g. DriveMind's prompt ids),
    ``palette_size``, ``keep_views`` / ``max_views`` (pending forward camera frames), ``guidance``
    (the suggested-action slot and its mask)."""

    # class-level defaults: buffers pickled before the guidance slot existed load without it
    guidance = False
    decode_on_device = True  # a GPU buffer expands sampled images on the GPU (False: on the CPU, as before)
    # a GPU buffer also keeps its image codes and palettes on the GPU, so a sampled batch is
    # gathered there and no image byte crosses the bus ("auto": on a CUDA device when they fit in
    # half its free memory; True: on any device, tests use it on the CPU; False: never)
    codes_on_device: bool | str = "auto"
    _mirror = None  # {key: (codes, palettes)} tensors on the device, built on first use; not pickled
    _mirror_dirty = None  # (row, env) written since the mirror was last brought up to date
    guide_actions = guide_mask = guide_stamp = None
    _writes = 0

    def __init__(self, buffer_size: int, observation_space: spaces.Dict, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, fact_keys: tuple[str, ...] | None = None,
                 embedding_dim: int = 0, palette_size: int = 64, scale_images: bool = False,
                 check_memory: bool = True, obs_embeddings: bool = False,
                 columns: dict | None = None, keep_views: bool = False, max_views: int = 1024,
                 store_images: bool = True, sample_images: bool = True, n_steps: int = 1,
                 gamma: float = 0.99, guidance: bool = False):
        if not isinstance(observation_space, spaces.Dict):
            raise ValueError("RelabelReplayBuffer needs a Dict observation space (DriveMind-v0's)")
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        if fact_keys is None:
            from ..facts import FACT_KEYS
            fact_keys = FACT_KEYS
        self.buffer_size = max(buffer_size // n_envs, 2)
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self.fact_keys = tuple(fact_keys)
        self.embedding_dim = int(embedding_dim)
        self.scale_images = bool(scale_images)  # sample() gives images as float32 in [0, 1]
        n, e = self.buffer_size, n_envs
        images = [k for k, sp in observation_space.spaces.items() if sp.dtype == np.uint8 and len(sp.shape) == 3]
        # store_images=False: a policy that reads no images (the fast path's frozen features) and
        # a reward that embeds no frames: the masks are not kept at all
        self.store_images = bool(store_images)
        self.sample_images = bool(sample_images) and self.store_images  # decoded by sample()
        self.image_keys = images if self.store_images else []
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
            raise ValueError(f"n_steps must be a positive integer (1 = one-step returns), got {n_steps!r}")
        self.n_steps, self.gamma = int(n_steps), float(gamma)
        self.codecs = {k: PaletteCodec(observation_space[k].shape, palette_size) for k in self.image_keys}
        self.codes = {k: np.zeros((n, e, c.HW), np.uint8) for k, c in self.codecs.items()}
        self.palettes = {k: np.zeros((n, e, c.P, c.C), np.uint8) for k, c in self.codecs.items()}
        self.vectors = {k: np.zeros((n, e, *sp.shape), sp.dtype)
                        for k, sp in observation_space.spaces.items() if k not in images}
        self.actions = np.zeros((n, e, self.action_dim), np.float32)
        self.rewards = np.zeros((n, e), np.float32)
        self.dones = np.zeros((n, e), np.float32)
        self.timeouts = np.zeros((n, e), np.float32)
        self.facts = np.zeros((n, e, len(self.fact_keys)), np.float32)
        self.labels = np.zeros((n, e), np.uint8)
        self.embeddings = (np.zeros((n, e, self.embedding_dim), np.float16)
                           if self.embedding_dim else None)
        if obs_embeddings and not self.embedding_dim:
            raise ValueError("obs_embeddings=True needs an embedding slot (embedding_dim > 0)")
        self.obs_embeddings = (np.zeros((n, e, self.embedding_dim), np.float16)
                               if obs_embeddings else None)
        self.columns = {k: np.zeros((n, e), np.dtype(dt)) for k, dt in (columns or {}).items()}
        self.view_embeddings = None  # (n, e, D) float16, allocated by enable_view_embeddings()
        self.guidance = bool(guidance)
        self.guide_actions = np.zeros((n, e, self.action_dim), np.float32) if self.guidance else None
        self.guide_mask = np.zeros((n, e), np.uint8) if self.guidance else None
        # which write of the slot a suggestion belongs to: an asynchronous answer for a slot that
        # has been overwritten since it was asked for is dropped (``set_guidance(stamps=...)``)
        self.guide_stamp = np.zeros((n, e), np.int64) if self.guidance else None
        self._writes = 0
        self.keep_views, self.max_views = bool(keep_views), int(max_views)
        self.views: dict[int, np.ndarray] = {}  # pending slot -> forward camera frame (HxWx3 uint8)
        self.views_dropped = 0
        self.terminal: dict[int, dict] = {}  # slot -> encoded terminal next observation
        self.raw: dict[tuple[str, int, int], np.ndarray] = {}  # (key, row, env) -> frame too rich for a palette
        self._obs_ready = np.zeros(e, bool)  # row `pos` already holds this env's current observation
        self.nonfinite_rewards = 0
        self.palette_overflows = 0
        self._warned_nonfinite = False
        if check_memory:
            self._check_memory()

    def __getstate__(self):  # checkpoints hold the host arrays only; the mirror is rebuilt
        state = self.__dict__.copy()
        state.pop("_mirror", None)
        state.pop("_mirror_dirty", None)
        return state

    # ------------------------------------------------------------------ memory
    def nbytes(self) -> int:
        """Bytes held by the buffer's arrays and side tables (arrays are counted in full)."""
        arrays = [*self.codes.values(), *self.palettes.values(), *self.vectors.values(), self.actions,
                  self.rewards, self.dones, self.timeouts, self.facts, self.labels,
                  *self.columns.values()]
        arrays += [a for a in (self.embeddings, self.obs_embeddings, self.view_embeddings,
                               self.guide_actions, self.guide_mask, self.guide_stamp) if a is not None]
        side = sum(v.nbytes for d in self.terminal.values() for v in d.values())
        side += sum(v.nbytes for v in self.views.values())
        side += sum(v.nbytes for v in self.raw.values())
        return int(sum(a.nbytes for a in arrays) + side)

    def bytes_per_transition(self) -> float:
        return self.nbytes() / (self.buffer_size * self.n_envs)

    def _check_memory(self):
        need = self.nbytes()
        try:
            import psutil
            avail = psutil.virtual_memory().available
        except ImportError:  # pragma: no cover - psutil comes with SB3's extras only
            return
        if need > avail:
            raise MemoryError(
                f"the replay buffer needs {need / 1e9:.2f} GB for {self.buffer_size * self.n_envs} "
                f"transitions ({self.bytes_per_transition() / 1e3:.1f} kB each) but only "
                f"{avail / 1e9:.2f} GB are available: lower algo.buffer_size")

    # ------------------------------------------------------------------ writing
    def _encode_image(self, key: str, frame) -> tuple[np.ndarray, np.ndarray] | None:
        """(codes, palette) of one frame, or None (counted) when it is too rich for a palette and
        must be kept raw."""
        enc = self.codecs[key].encode(np.asarray(frame))
        if enc is None:
            self.palette_overflows += 1
        return enc

    def _encode(self, obs: dict, i: int) -> dict:
        """One env's observation, encoded (for the terminal side table)."""
        out = {}
        for k in self.codecs:
            enc = self._encode_image(k, obs[k][i])
            if enc is None:
                out[k + ":raw"] = np.array(obs[k][i], np.uint8)
            else:
                out[k + ":codes"], out[k + ":palette"] = enc
        for k, arr in self.vectors.items():
            out[k] = np.array(obs[k][i], arr.dtype)
        return out

    def _write_row(self, row: int, env: int, obs: dict):
        for k in self.codecs:
            self.raw.pop((k, row, env), None)
            enc = self._encode_image(k, obs[k][env])
            if enc is None:
                self.raw[(k, row, env)] = np.array(obs[k][env], np.uint8)
            else:
                self.codes[k][row, env], self.palettes[k][row, env] = enc
        if self._mirror_dirty is not None:
            self._mirror_dirty.append((row, env))
        for k, arr in self.vectors.items():
            arr[row, env] = obs[k][env]

    def add(self, obs: dict, next_obs: dict, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        r, nxt = self.pos, (self.pos + 1) % self.buffer_size
        action = np.asarray(action).reshape(self.n_envs, self.action_dim)
        for e in range(self.n_envs):
            slot = r * self.n_envs + e
            self.terminal.pop(slot, None)
            if not self._obs_ready[e]:
                self._write_row(r, e, obs)
            d = bool(done[e])
            if d:
                self.terminal[slot] = self._encode(next_obs, e)
                self._obs_ready[e] = False
            else:
                # the next row's old transition loses its observation now: never sample it again
                self.labels[nxt, e] = EMPTY
                self.terminal.pop(nxt * self.n_envs + e, None)
                self._write_row(nxt, e, next_obs)
                self._obs_ready[e] = True
            info = infos[e]
            try:
                self.facts[r, e] = [info[k] for k in self.fact_keys]
            except KeyError as err:
                raise KeyError(f"the env's info lacks the fact {err.args[0]!r} the replay buffer stores "
                               f"(fact_keys: {list(self.fact_keys)}); is the env DriveMind-v0?") from None
            self.timeouts[r, e] = float(self.handle_timeout_termination and d
                                        and info.get("TimeLimit.truncated", False))
            if self.guidance:
                self._store_guidance(r, e, info)
            self.views.pop(slot, None)
            view = info.get("front_rgb") if self.keep_views else None
            if view is not None:
                self._keep_view(slot, view)
        self.actions[r] = action
        self.dones[r] = np.asarray(done, np.float32)
        self.rewards[r] = 0.0
        self.labels[r] = PENDING
        for a in (self.embeddings, self.obs_embeddings, self.view_embeddings, *self.columns.values()):
            if a is not None:
                a[r] = 0
        self.pos = nxt
        if self.pos == 0:
            self.full = True

    def _store_guidance(self, row: int, env: int, info: dict) -> None:
        """The suggested action of this transition from its facts (the privileged teacher), or
        mask 0 (none yet: an asynchronous teacher may write it back with ``set_guidance``)."""
        self._writes += 1
        self.guide_stamp[row, env] = self._writes
        if float(info.get("vlm_action_available", 0.0)) > 0:
            a = np.array([info["vlm_action_steer"], info["vlm_action_accel"]], np.float32)
            if a.shape[0] != self.action_dim or not np.all(np.isfinite(a)):
                raise ValueError(f"the suggested action {a.tolist()} must have {self.action_dim} "
                                 f"finite values (steer, throttle_brake)")
            self.guide_actions[row, env] = a
            self.guide_mask[row, env] = 1
        else:
            self.guide_actions[row, env] = 0.0
            self.guide_mask[row, env] = 0

    def guidance_stamps(self, slots: np.ndarray) -> np.ndarray:
        """The write stamps of ``slots``: send them with an asynchronous request and give them
        back to ``set_guidance`` so an answer never lands on a transition stored later."""
        if not self.guidance:
            raise ValueError("this buffer has no guidance slot: create it with guidance=True")
        return self.guide_stamp.reshape(-1)[np.asarray(slots, np.int64)].copy()

    def set_guidance(self, slots: np.ndarray, actions: np.ndarray, mask: np.ndarray | None = None,
                     stamps: np.ndarray | None = None) -> int:
        """Write suggested actions back by slot (an asynchronous teacher's answers); ``mask``
        (default all 1) marks which of them are valid (an invalid or non-finite one sets the
        row's mask to 0). With ``stamps`` (from ``guidance_stamps`` when the request was made),
        rows overwritten since are skipped. Actions are clipped to [-1, 1]. Returns how many rows
        were written."""
        if not self.guidance:
            raise ValueError("this buffer has no guidance slot: create it with guidance=True "
                             "(algo.guidance=vmr|awag|both)")
        slots = np.asarray(slots, np.int64).reshape(-1)
        actions = np.asarray(actions, np.float32).reshape(len(slots), self.action_dim)
        mask = np.ones(len(slots), np.uint8) if mask is None else np.asarray(mask).reshape(-1)
        if stamps is not None:
            keep = self.guide_stamp.reshape(-1)[slots] == np.asarray(stamps, np.int64).reshape(-1)
            slots, actions, mask = slots[keep], actions[keep], mask[keep]
        ok = (mask > 0) & np.all(np.isfinite(actions), axis=1)
        self.guide_actions.reshape(-1, self.action_dim)[slots] = np.where(
            ok[:, None], np.clip(np.nan_to_num(actions), -1.0, 1.0), 0.0)
        self.guide_mask.reshape(-1)[slots] = ok.astype(np.uint8)
        return int(len(slots))

    def _keep_view(self, slot: int, view) -> None:
        view = np.asarray(view)
        if view.ndim != 3 or view.shape[-1] != 3 or view.dtype != np.uint8:
            raise ValueError(f"info['front_rgb'] must be an HxWx3 uint8 camera frame, got "
                             f"{view.dtype} {view.shape}")
        while len(self.views) >= self.max_views:  # oldest first (dicts keep insertion order)
            self.views.pop(next(iter(self.views)))
            self.views_dropped += 1
        self.views[int(slot)] = view.copy()

    def enable_view_embeddings(self) -> None:
        """Allocate the forward-camera embedding slot (once the agent knows it has frames and an
        encoder that embeds them)."""
        if self.view_embeddings is None:
            if not self.embedding_dim:
                raise ValueError("view embeddings need an embedding slot (embedding_dim > 0)")
            self.view_embeddings = np.zeros((self.buffer_size, self.n_envs, self.embedding_dim), np.float16)

    def take_views(self, slots: np.ndarray) -> None:
        """Drop the kept camera frames of ``slots`` (labelled: their frames are no longer needed)."""
        for s in np.asarray(slots, np.int64).tolist():
            self.views.pop(s, None)

    def truncate_last_trajectory(self):
        """Before continuing into new episodes (resume): the last transition of each env keeps its
        next observation in the side table and is marked as a time-limit end (bootstrapped)."""
        last = (self.pos - 1) % self.buffer_size
        nxt = self.pos
        for e in range(self.n_envs):
            if not self._obs_ready[e] or self.labels[last, e] == EMPTY:
                continue
            one = self._read_rows(np.array([nxt]), np.array([e]), {})
            self.terminal[last * self.n_envs + e] = self._encode(
                {k: v.numpy() if isinstance(v, th.Tensor) else v for k, v in one.items()}, 0)
            self.dones[last, e] = 1.0
            self.timeouts[last, e] = 1.0
            self._obs_ready[e] = False

    # ------------------------------------------------------------------ labels
    def slots(self, state: int | None = None) -> np.ndarray:
        """Flat slots in a label state (None: every stored transition)."""
        lab = self.labels.reshape(-1)
        return np.flatnonzero(lab != EMPTY if state is None else lab == state)

    def counts(self) -> dict[str, int]:
        c = np.bincount(self.labels.reshape(-1), minlength=4)
        return {LABEL_NAMES[i]: int(c[i]) for i in range(4)}

    def fact_batch(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The reward batch of the given slots: stored facts, plus ``action``, ``done``, ``env``,
        ``slot``, the embeddings (``embedding``, ``obs_embedding``) and the reward columns."""
        slots = np.asarray(slots, np.int64)
        f = self.facts.reshape(-1, len(self.fact_keys))[slots]
        batch = {k: f[:, i] for i, k in enumerate(self.fact_keys)}
        batch["action"] = self.actions.reshape(-1, self.action_dim)[slots]
        batch["done"] = self.dones.reshape(-1)[slots]
        batch["env"] = slots % self.n_envs
        batch["slot"] = slots
        if self.embeddings is not None:
            batch["embedding"] = self.embeddings.reshape(-1, self.embedding_dim)[slots].astype(np.float32)
        if self.obs_embeddings is not None:
            batch["obs_embedding"] = (self.obs_embeddings.reshape(-1, self.embedding_dim)[slots]
                                      .astype(np.float32))
        if self.view_embeddings is not None:
            batch["view_embedding"] = (self.view_embeddings.reshape(-1, self.embedding_dim)[slots]
                                       .astype(np.float32))
        for k, a in self.columns.items():
            batch[k] = a.reshape(-1)[slots]
        return batch

    def set_embeddings(self, slots: np.ndarray, emb: np.ndarray, obs: bool = False, view: bool = False):
        """Store image embeddings of the slots' next observations (``obs=True``: of the
        observations their actions were taken in; ``view=True``: of their forward camera frames)."""
        target = self.view_embeddings if view else self.obs_embeddings if obs else self.embeddings
        if target is None:
            raise ValueError("this buffer has no embedding slot: create it with embedding_dim > 0"
                             + (" and obs_embeddings=True" if obs else "")
                             + (" and call enable_view_embeddings()" if view else ""))
        target.reshape(-1, self.embedding_dim)[slots] = emb

    def set_column(self, name: str, slots: np.ndarray, values: np.ndarray):
        if name not in self.columns:
            raise KeyError(f"no reward column {name!r} in this buffer (it has {sorted(self.columns)}): "
                           f"build the agent with the reward that declares it")
        self.columns[name].reshape(-1)[slots] = values

    def time_order(self, slots: np.ndarray) -> np.ndarray:
        """``slots`` sorted oldest first (rows counted from the write position, then env)."""
        slots = np.asarray(slots, np.int64)
        rows, envs = np.divmod(slots, self.n_envs)
        age = (rows - self.pos) % self.buffer_size  # 0 = the oldest row still stored
        return slots[np.lexsort((envs, age))]

    def predecessors(self, slots: np.ndarray) -> np.ndarray:
        """The slot of the same env's previous transition in the same episode, or -1 (episode
        start, or overwritten)."""
        slots = np.asarray(slots, np.int64)
        rows, envs = np.divmod(slots, self.n_envs)
        prev = (rows - 1) % self.buffer_size
        ok = (self.labels[prev, envs] != EMPTY) & (self.dones[prev, envs] == 0) & (rows != self.pos)
        return np.where(ok, prev * self.n_envs + envs, -1)

    def label(self, reward_fn, slots: np.ndarray, batch_size: int = 65536) -> dict[str, float]:
        """(Re)compute the rewards of ``slots`` from their stored facts, in batches. Returns the
        mean of each reward term over those slots (for the logs)."""
        slots = np.asarray(slots, np.int64)
        flat_r, flat_l = self.rewards.reshape(-1), self.labels.reshape(-1)
        sums: dict[str, float] = {}
        bad_total = 0
        for a in range(0, len(slots), batch_size):
            s = slots[a:a + batch_size]
            terms = reward_fn.explain(self.fact_batch(s))
            value = np.sum(np.stack(list(terms.values())), axis=0) if terms else np.zeros(len(s))
            ok = np.isfinite(value)
            bad = int((~ok).sum())
            bad_total += bad
            if bad:
                self.nonfinite_rewards += bad
                if not self._warned_nonfinite:
                    names = [k for k, v in terms.items() if not np.all(np.isfinite(v))]
                    warnings.warn(f"reward {getattr(reward_fn, 'name', reward_fn)!r} gave {bad} "
                                  f"non-finite value(s) (terms {names}); those transitions are "
                                  f"never sampled (counted in nonfinite_rewards)", stacklevel=2)
                    self._warned_nonfinite = True
            flat_r[s] = np.where(ok, value, 0.0)
            flat_l[s] = np.where(ok, LABELLED, INVALID)
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + float(np.sum(v[ok]))
        n = max(len(slots) - bad_total, 1)
        return {k: v / n for k, v in sums.items()}

    def label_pending(self, reward_fn, batch_size: int = 65536) -> dict[str, float]:
        return self.label(reward_fn, self.slots(PENDING), batch_size)

    def relabel(self, reward_fn, batch_size: int = 65536) -> dict[str, float]:
        """Re-score every stored transition (weights or prompts changed)."""
        return self.label(reward_fn, self.slots(), batch_size)

    # ------------------------------------------------------------------ reading
    def _read_rows(self, rows: np.ndarray, envs: np.ndarray, terminal: dict[int, int],
                   scaled: bool = False, images: bool = True, device: th.device | None = None) -> dict:
        """Decoded observations at (rows, envs); positions listed in ``terminal`` (position ->
        slot) come from the terminal side table instead. ``images=False``: vector keys only.
        ``device``: a GPU decodes the images there (``PaletteCodec.decode``), from the codes kept
        there where it keeps them (``device_codes``); None: on the CPU."""
        out = {}
        mirror = self.device_codes() if device is not None and images else None
        if mirror is not None:
            dev = th.device(self.device)
            at = (th.from_numpy(rows).to(dev), th.from_numpy(envs).to(dev))
        for k, codec in (self.codecs.items() if images else ()):
            if mirror is not None:  # gathered where they are kept: no image byte crosses the bus
                codes, pals = mirror[k][0][at], mirror[k][1][at]
                put = lambda a: th.from_numpy(a).to(dev)  # noqa: E731 - the few episode ends
            else:
                codes, pals = self.codes[k][rows, envs], self.palettes[k][rows, envs]
                put = np.asarray
            raw_at = {}
            for i, slot in terminal.items():
                t = self.terminal[slot]
                if k + ":raw" in t:
                    raw_at[i] = t[k + ":raw"]
                else:
                    codes[i], pals[i] = put(t[k + ":codes"]), put(t[k + ":palette"])
            if self.raw:  # frames that were too rich for a palette (rare)
                for i, (r, e) in enumerate(zip(rows.tolist(), envs.tolist())):
                    if i not in terminal and (k, r, e) in self.raw:
                        raw_at[i] = self.raw[(k, r, e)]
            x = (codec.decode_torch(codes, pals, scaled) if mirror is not None
                 else codec.decode(codes, pals, scaled, device))
            for i, frame in raw_at.items():
                f = th.from_numpy(frame).to(x.device)
                x[i] = f / 255.0 if scaled else f
            out[k] = x
        for k, arr in self.vectors.items():
            v = arr[rows, envs]
            for i, slot in terminal.items():
                v[i] = self.terminal[slot][k]
            out[k] = th.from_numpy(v)
        return out

    def device_codes(self) -> dict | None:
        """``{key: (codes, palettes)}`` as tensors on the buffer's device, up to date with every
        row written so far, or None where they are not kept there (``codes_on_device``). Built on
        first use (one copy of the host arrays), then brought up to date with the rows written
        since, in one copy per sample."""
        want = self.codes_on_device
        dev = th.device(self.device)
        if not self.codecs or want is False or (want == "auto" and dev.type != "cuda"):
            return None
        if self._mirror is None:
            need = sum(a.nbytes for a in (*self.codes.values(), *self.palettes.values()))
            if want == "auto" and need > th.cuda.mem_get_info(dev)[0] // 2:
                warnings.warn(f"the replay buffer's image codes ({need / 1e9:.1f} GB) do not fit in "
                              f"half the free memory of {dev}: sampled batches are gathered on the "
                              "CPU and copied over (lower algo.buffer_size to keep them there)")
                self.codes_on_device = False
                return None
            self._mirror = {k: (th.from_numpy(self.codes[k]).to(dev, copy=True),
                                th.from_numpy(self.palettes[k]).to(dev, copy=True)) for k in self.codecs}
            self._mirror_dirty = []
        elif self._mirror_dirty:
            rows, envs = (np.array(x) for x in zip(*self._mirror_dirty))
            self._mirror_dirty = []
            r, e = th.from_numpy(rows).to(dev), th.from_numpy(envs).to(dev)
            for k, (codes, pals) in self._mirror.items():
                codes[r, e] = th.from_numpy(self.codes[k][rows, envs]).to(dev)
                pals[r, e] = th.from_numpy(self.palettes[k][rows, envs]).to(dev)
        return self._mirror

    def _draw(self, batch_size: int) -> np.ndarray:
        ok = self.slots(LABELLED)
        if len(ok) == 0:
            raise RuntimeError("no labelled transitions to sample: store some and call "
                               "label_pending(reward_fn) first")
        return ok[np.random.randint(0, len(ok), size=batch_size)]

    def sample(self, batch_size: int, env=None) -> DictReplayBufferSamples:
        return self._get_samples(self._draw(batch_size), env)

    def sample_guided(self, batch_size: int) -> tuple[DictReplayBufferSamples, th.Tensor, th.Tensor]:
        """``sample`` plus the batch's suggested actions (B x action_dim) and their mask
        (B x 1, float 0/1; 0 rows must contribute nothing to the guidance losses)."""
        if not self.guidance:
            raise ValueError("this buffer has no guidance slot: create it with guidance=True")
        slots = self._draw(batch_size)
        data = self._get_samples(slots, None)
        rows, envs = np.divmod(slots, self.n_envs)
        act = th.from_numpy(self.guide_actions[rows, envs]).to(self.device)
        mask = th.from_numpy(self.guide_mask[rows, envs].astype(np.float32)).reshape(-1, 1).to(self.device)
        return data, act, mask

    def _n_step(self, rows: np.ndarray, envs: np.ndarray):
        """n-step returns from the sampled transitions: rewards summed with gamma^k along the same
        env's following transitions while they are labelled, written after the start (not across
        the write position) and the episode goes on. Returns (last rows, returns, discounts)."""
        n = len(rows)
        ret = self.rewards[rows, envs].astype(np.float32).copy()
        last = rows.copy()
        alive = self.dones[rows, envs] == 0
        disc = np.full(n, self.gamma, np.float32)
        age0 = (rows - self.pos) % self.buffer_size
        for k in range(1, self.n_steps):
            r = (rows + k) % self.buffer_size
            alive &= ((r - self.pos) % self.buffer_size > age0) & (self.labels[r, envs] == LABELLED)
            if not alive.any():
                break
            ret[alive] += disc[alive] * self.rewards[r[alive], envs[alive]]
            disc[alive] *= self.gamma
            last[alive] = r[alive]
            alive &= self.dones[r, envs] == 0
        return last, ret, disc

    def _get_samples(self, slots: np.ndarray, env=None) -> DictReplayBufferSamples:
        if env is not None:
            raise ValueError("RelabelReplayBuffer does not support VecNormalize")
        rows, envs = np.divmod(slots, self.n_envs)
        discounts = None
        if self.n_steps > 1:
            last, rewards, disc = self._n_step(rows, envs)
            discounts = th.from_numpy(disc).reshape(-1, 1).to(self.device)
        else:
            last, rewards = rows, self.rewards[rows, envs]
        nxt_rows = (last + 1) % self.buffer_size
        done = self.dones[last, envs]
        last_slots = last * self.n_envs + envs
        terminal = {i: int(s) for i, s in enumerate(last_slots) if done[i] and int(s) in self.terminal}
        # one decode for obs and next obs together
        both = self._read_rows(np.concatenate([rows, nxt_rows]), np.concatenate([envs, envs]),
                               {i + len(rows): s for i, s in terminal.items()}, self.scale_images,
                               images=self.sample_images,
                               device=self.device if self.decode_on_device else None)
        b = len(rows)
        dev = self.device
        obs = {k: v[:b].to(dev) for k, v in both.items()}
        nxt = {k: v[b:].to(dev) for k, v in both.items()}
        return DictReplayBufferSamples(
            observations=obs,
            actions=th.from_numpy(self.actions[rows, envs]).to(dev),
            next_observations=nxt,
            dones=th.from_numpy(done * (1.0 - self.timeouts[last, envs])).reshape(-1, 1).to(dev),
            rewards=th.from_numpy(np.asarray(rewards, np.float32)).reshape(-1, 1).to(dev),
            discounts=discounts,
        )

    def observation(self, slot: int, next: bool = False) -> dict[str, np.ndarray]:
        """One stored observation (or next observation) as numpy arrays, for inspection/tests."""
        row, env = divmod(int(slot), self.n_envs)
        if next:
            if self.dones[row, env] and slot in self.terminal:
                d = self._read_rows(np.array([row]), np.array([env]), {0: slot})
            else:
                d = self._read_rows(np.array([(row + 1) % self.buffer_size]), np.array([env]), {})
        else:
            d = self._read_rows(np.array([row]), np.array([env]), {})
        out = {k: v[0].contiguous().numpy() for k, v in d.items()}
        if next and int(slot) in self.views:
            out["rgb"] = self.views[int(slot)]
        return out

    def stats(self) -> dict[str, float]:
        c = self.counts()
        return {**{f"buffer/{k}": v for k, v in c.items()},
                "buffer/nonfinite_rewards": self.nonfinite_rewards,
                "buffer/palette_overflows": self.palette_overflows,
                **({"buffer/views_dropped": self.views_dropped} if self.keep_views else {}),
                **({"buffer/guided": int(self.guide_mask.reshape(-1)[self.slots()].sum())}
                   if self.guidance else {}),
                "buffer/megabytes": self.nbytes() / 1e6,
                **({"buffer/device_megabytes": sum(t.nbytes for pair in self._mirror.values() for t in pair) / 1e6}
                   if self._mirror is not None else {})}
