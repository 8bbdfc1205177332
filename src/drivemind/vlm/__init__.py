"""Semantic rewards' vision-language parts: the frozen MiniLM text tower, ground-truth captions
and BEV-CLIP, the compact contrastive BEV image tower aligned to it (docs/vlm.md).

Heavy imports (torch, transformers) happen when these names are first used."""

from __future__ import annotations

from .captions import VOCABULARY, caption, caption_vocabulary, situation

__all__ = ["BevClip", "MiniLMTextEncoder", "VOCABULARY", "caption", "caption_vocabulary",
           "find_weights", "minilm_dir", "retrieval_accuracy", "situation", "train_bev_clip"]


def __getattr__(name):
    if name in ("BevClip", "train_bev_clip", "retrieval_accuracy", "find_weights"):
        from . import bev_clip
        return getattr(bev_clip, name)
    if name in ("MiniLMTextEncoder", "minilm_dir"):
        from . import text
        return getattr(text, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
