"""Found-RL's action-guidance settings (``algo.guidance`` / ``algo.guidance_kwargs``) and its
cosine schedule: plain Python, so the settings are checked before a run starts
(:mod:`drivemind.training.validate`) without loading torch. The losses and the requester that use
them are in :mod:`drivemind.agents.guidance`, which re-exports these names."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

MODES = ("none", "vmr", "awag", "both")
SOURCES = ("privileged", "smolvlm", "http")
ASYNC_SOURCES = ("http", "smolvlm")


def cosine_weight(step: float, start: float, end: float, steps: float, power: float = 1.0) -> float:
    """Found-RL's cosine-decayed coefficient (Eq. 14 / 24): ``start`` at step 0, ``end`` from
    ``steps`` on; ``power`` < 1 decays faster early."""
    p = min(max(float(step), 0.0) / float(steps), 1.0) ** float(power)
    return float(end + (start - end) * (1.0 + math.cos(math.pi * p)) / 2.0)


def _vmr_default():
    return {"margin": 2.0, "start": 1.0, "end": 0.0, "steps": 150_000, "power": 1.0}


def _awag_default():
    return {"beta": 2.0, "w_max": 20.0, "start": 0.01, "end": 0.01, "steps": 150_000, "power": 1.0}


@dataclass
class GuidanceConfig:
    """``algo.guidance`` + ``algo.guidance_kwargs`` (configs/algo/sac.yaml)."""

    mode: str = "none"
    source: str = "privileged"
    vmr: dict = field(default_factory=_vmr_default)
    awag: dict = field(default_factory=_awag_default)
    teacher: dict = field(default_factory=dict)  # source=http: HttpTeacher's arguments
    service: dict = field(default_factory=dict)  # source=http: the reward service's settings

    @classmethod
    def from_config(cls, mode, kwargs: dict | None = None) -> "GuidanceConfig | None":
        """None for ``mode`` none (the default path); otherwise a checked config. Bad values
        raise one ``ValueError`` naming the key and the valid choices."""
        mode = "none" if mode in (None, False) else str(mode)
        if mode not in MODES:
            raise ValueError(f"unknown algo.guidance {mode!r}; valid: {', '.join(MODES)}")
        if mode == "none":
            return None
        kw = dict(kwargs or {})
        unknown = set(kw) - {f.name for f in fields(cls)} - {"mode"}
        if unknown:
            raise ValueError(f"unknown algo.guidance_kwargs key(s) {sorted(unknown)}; valid: source, "
                             f"vmr, awag, teacher, service")
        source = str(kw.get("source", "privileged"))
        if source not in SOURCES:
            raise ValueError(f"unknown algo.guidance_kwargs.source {source!r}; valid: {', '.join(SOURCES)}")
        sub = {}
        for name, default in (("vmr", _vmr_default()), ("awag", _awag_default())):
            given = dict(kw.get(name) or {})
            bad = set(given) - set(default)
            if bad:
                raise ValueError(f"unknown algo.guidance_kwargs.{name} key(s) {sorted(bad)}; "
                                 f"valid: {', '.join(default)}")
            merged = {**default, **given}
            for k, v in merged.items():
                lo_ok = v > 0 if k in ("steps", "power", "beta", "w_max") else v >= 0
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo_ok:
                    want = "> 0" if k in ("steps", "power", "beta", "w_max") else ">= 0"
                    raise ValueError(f"algo.guidance_kwargs.{name}.{k} must be a number {want}, got {v!r}")
            sub[name] = merged
        teacher, service = dict(kw.get("teacher") or {}), dict(kw.get("service") or {})
        if "api_key" in teacher:
            raise ValueError("API keys are never taken from configuration; put the key in the "
                             "environment variable named by algo.guidance_kwargs.teacher.api_key_env")
        bad = set(service) - {"max_batch", "max_wait_ms", "max_pending"}
        if bad:
            raise ValueError(f"unknown algo.guidance_kwargs.service key(s) {sorted(bad)}; valid: "
                             f"max_batch, max_wait_ms, max_pending")
        for k, v in service.items():
            ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
                  and (v >= 0 if k == "max_wait_ms" else (v >= 1 and float(v).is_integer())))
            if not ok:
                want = "a number >= 0" if k == "max_wait_ms" else "an integer >= 1"
                raise ValueError(f"algo.guidance_kwargs.service.{k} must be {want}, got {v!r}")
        return cls(mode=mode, source=source, vmr=sub["vmr"], awag=sub["awag"], teacher=teacher,
                   service=service)

    @property
    def use_vmr(self) -> bool:
        return self.mode in ("vmr", "both")

    @property
    def use_awag(self) -> bool:
        return self.mode in ("awag", "both")

    def vmr_weight(self, step: float) -> float:
        v = self.vmr
        return cosine_weight(step, v["start"], v["end"], v["steps"], v["power"])

    def awag_weight(self, step: float) -> float:
        a = self.awag
        return cosine_weight(step, a["start"], a["end"], a["steps"], a["power"])

    @property
    def asynchronous(self) -> bool:
        return self.source in ASYNC_SOURCES

    def to_dict(self) -> dict:
        return {"source": self.source, "vmr": dict(self.vmr), "awag": dict(self.awag),
                "teacher": dict(self.teacher), "service": dict(self.service)}
