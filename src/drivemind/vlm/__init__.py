"""Semantic rewards' vision-language parts: the frozen MiniLM text tower, ground-truth captions
and BEV-CLIP, the compact contrastive BEV image tower aligned to it (docs/vlm.md).

Heavy imports (torch, transformers) happen when these names are first used."""

from __future__ import annotations

import os

from .captions import VOCABULARY, caption, caption_vocabulary, situation

# Nothing downloads weights at run time: set before any model library is imported through here.
# (A user who wants the hub sets these to 0 before importing drivemind.)
for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "YOLO_OFFLINE"):
    os.environ.setdefault(_k, "1")

__all__ = ["BevClip", "MiniLMTextEncoder", "VOCABULARY", "caption", "caption_vocabulary",
           "find_weights", "minilm_dir", "retrieval_accuracy", "situation", "train_bev_clip",
           "OpenClipEncoder", "resolve_openclip_weights", "CRITICAL_CLASSES", "Detection",
           "PrivilegedDetector", "YoloDetector", "gate", "build_detector", "dynamic_view",
           "make_generator", "DistilledGenerator", "SmolVLMGenerator", "HttpTeacher",
           "make_reasoner", "PrivilegedReasoner", "QwenVLReasoner", "RISK_VOCABULARY"]


def __getattr__(name):
    if name in ("BevClip", "train_bev_clip", "retrieval_accuracy", "find_weights"):
        from . import bev_clip
        return getattr(bev_clip, name)
    if name in ("MiniLMTextEncoder", "minilm_dir"):
        from . import text
        return getattr(text, name)
    if name in ("OpenClipEncoder", "resolve_openclip_weights"):  # needs the vision extra
        from . import openclip
        return getattr(openclip, name)
    if name in ("CRITICAL_CLASSES", "Detection", "PrivilegedDetector", "YoloDetector", "gate",
                "build_detector", "dynamic_view"):
        from . import detectors
        return getattr(detectors, name)
    if name in ("make_generator", "DistilledGenerator"):
        from . import generators
        return getattr(generators, name)
    if name == "SmolVLMGenerator":
        from . import smolvlm
        return smolvlm.SmolVLMGenerator
    if name == "HttpTeacher":
        from . import http_teacher
        return http_teacher.HttpTeacher
    if name in ("make_reasoner", "PrivilegedReasoner", "QwenVLReasoner", "RISK_VOCABULARY"):
        from . import reasoners
        return getattr(reasoners, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
