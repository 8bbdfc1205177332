"""Run and sweep directory names (OmegaConf resolvers used by configs/config.yaml).

Registered when :mod:`drivemind` is imported (``dm_ablate``, ``dm_safe``, ``dm_subdir``):

- ``${dm_ablate:${oc.select:reward.ablate,none}}``: ``""`` for no ablation, else ``-no<part>``
  (``drivemind-noaicr``: Table 2's NoAICR);
- ``${dm_safe:${town.name}}``: a file-system-safe name part (a custom town's path gives its stem);
- ``${dm_subdir:${hydra.job.num},${run_name},${hydra.job.override_dirname}}``: a sweep job's
  folder, ``<num>-<run_name>`` followed by the command-line overrides the run name does not
  already show (Hydra's ``override_dirname``; which keys it leaves out is set in
  ``hydra.job.config.override_dirname.exclude_keys``), made safe and at most ``MAX_LEN`` characters.
"""

from __future__ import annotations

import hashlib
import re

MAX_LEN = 120  # characters of a sweep job's folder name
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")  # no "=" or ",": the name must pass as run=<dir>


def safe_part(text, path_stem: bool = True) -> str:
    """``text`` with every run of characters other than letters, digits and ``._+-``
    replaced by ``_`` (no ``/``: a value never makes a sub-folder); a path-like town name
    (``/maps/x.xodr``) gives its stem (``x``) unless ``path_stem`` is false."""
    s = str(text)
    if path_stem and ("/" in s or "\\" in s):
        s = re.split(r"[/\\]", s.rstrip("/\\"))[-1]
        s = s[:-5] if s.lower().endswith(".xodr") else s
    return _UNSAFE.sub("_", s).strip("_") or "_"


def ablate_suffix(ablate) -> str:
    """``-no<part>`` for ``reward.ablate=<part>``, ``""`` for none."""
    if ablate is None or str(ablate).lower() in ("", "none", "null"):
        return ""
    return f"-no{safe_part(ablate)}"


def sweep_subdir(num, run_name, overrides="") -> str:
    """``<num>-<run_name>[-<overrides>]``, file-system safe; when longer than ``MAX_LEN`` the
    overrides part is cut and ended with a short hash of the whole (names stay unique)."""
    head = f"{num}-{safe_part(run_name)}"
    extra = safe_part(overrides, path_stem=False) if overrides not in (None, "") else ""
    if not extra:
        return head
    name = f"{head}-{extra}"
    if len(name) > MAX_LEN:
        digest = hashlib.sha1(extra.encode()).hexdigest()[:8]
        keep = max(MAX_LEN - len(head) - 11, 0)
        name = f"{head}-{extra[:keep]}..{digest}" if keep else f"{head}-{digest}"
    return name


def register_resolvers() -> None:
    """Register the resolvers with OmegaConf (idempotent)."""
    try:
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover - omegaconf comes with hydra, a core dependency
        return
    for name, fn in (("dm_ablate", ablate_suffix), ("dm_safe", safe_part), ("dm_subdir", sweep_subdir)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
