"""Evaluation reports: ``metrics.json``, ``routes.csv``, ``metrics.md`` and ``metrics.png`` in one
folder, and a side-by-side markdown table of several runs (sweeps).

``metrics.json`` = ``{"meta": ..., "metrics": ..., "routes": [EpisodeRecord.to_dict(), ...]}``;
non-finite numbers (a DCF of inf) are written as ``null`` so the file is strict JSON.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import fields
from pathlib import Path

import numpy as np

from .metrics import METRIC_KEYS, EpisodeRecord

# metric -> (column header with unit, format)
METRIC_COLUMNS = {
    "AS": ("AS (km/h)", "{:.1f}"), "RC": ("RC", "{:.2f}"), "TD": ("TD (m)", "{:.0f}"),
    "CS": ("CS (km/h)", "{:.1f}"), "SR": ("SR", "{:.2f}"), "CR": ("CR", "{:.2f}"),
    "TCF": ("TCF (/1000 steps)", "{:.2f}"), "DCF": ("DCF (/km)", "{:.2f}"),
    "ICT": ("ICT (steps)", "{:.0f}"), "AC": ("AC (/route)", "{:.2f}"),
}
ROUTE_COLUMNS = [f.name for f in fields(EpisodeRecord)]
FILES = ("metrics.json", "routes.csv", "metrics.md", "metrics.png")


def _jsonable(x):
    """``x`` with non-finite floats as None and numpy scalars as Python ones (strict JSON)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def format_metric(key: str, metrics: dict) -> str:
    """One metric as table text: '-' when missing, '>= n' for a censored ICT."""
    v = metrics.get(key)
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    text = METRIC_COLUMNS[key][1].format(v)
    return f">= {text}" if key == "ICT" and metrics.get("ICT_censored") else text


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _route_rows(records: list[EpisodeRecord]) -> list[list[str]]:
    rows = []
    for r in records:
        cs = ", ".join(f"{s:.1f}" for s in r.collision_speeds_kmh) or "-"
        rows.append([str(r.route_index), r.termination or r.truncation or "-", str(r.steps),
                     f"{r.distance_m:.0f}", f"{r.duration_s:.1f}", f"{r.mean_speed_kmh:.1f}",
                     f"{r.completion:.2f}", "yes" if r.arrived else "no", str(r.collisions), cs])
    return rows


def metrics_markdown(metrics: dict, records: list[EpisodeRecord], meta: dict) -> str:
    lines = ["# Evaluation", ""]
    for k in ("town", "density", "policy", "mode"):
        if k in meta:
            lines.append(f"- {k}: {meta[k]}")
    lines.append(f"- episodes: {metrics['episodes']}, steps: {metrics['steps']}, "
                 f"distance: {metrics['distance_km']:.2f} km, collisions: {metrics['collisions']}")
    lines += ["", *_table([METRIC_COLUMNS[k][0] for k in METRIC_KEYS],
                          [[format_metric(k, metrics) for k in METRIC_KEYS]])]
    if metrics.get("ICT_censored"):
        lines += ["", "ICT: no collision, so the steps driven are a lower bound."]
    lines += ["", "## Routes", "",
              *_table(["route", "end", "steps", "distance (m)", "time (s)", "speed (km/h)",
                       "completion", "arrived", "collisions", "collision speed (km/h)"],
                      _route_rows(records)), ""]
    return "\n".join(lines)


def _plot(path: Path, records: list[EpisodeRecord], title: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: leaves the caller's backend alone (Agg)

    x = np.arange(len(records))
    labels = [str(r.route_index) for r in records]
    hit = np.array([r.collisions > 0 for r in records])
    colors = ["tab:red" if h else ("tab:green" if r.arrived else "tab:gray")
              for r, h in zip(records, hit)]
    fig = Figure(figsize=(max(8.0, 0.9 * len(records) + 4), 3.6))
    a, b = fig.subplots(1, 2)
    a.bar(x, [r.completion for r in records], color=colors)
    a.set_ylim(0, 1.15)
    a.set_ylabel("completion")
    a.set_title("route completion (green arrived, red collision)", fontsize=9)
    b.bar(x, [r.mean_speed_kmh for r in records], color=colors)
    b.set_ylabel("mean speed (km/h)")
    b.set_title("mean speed", fontsize=9)
    top = max([r.mean_speed_kmh for r in records] + [1.0])
    b.set_ylim(0, top * 1.15)
    for ax, ys in ((a, [1.07] * len(records)), (b, [top * 1.07] * len(records))):
        if hit.any():
            ax.scatter(x[hit], np.asarray(ys)[hit], marker="x", color="tab:red", label="collision")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xticks(x, labels)
        ax.set_xlabel("route")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_reports(out_dir, metrics: dict, records: list[EpisodeRecord], meta: dict) -> dict[str, Path]:
    """Write metrics.json, routes.csv, metrics.md and metrics.png to ``out_dir`` (created);
    returns {file stem: path} with stems json, csv, md, png."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = list(records)
    meta = dict(meta or {})
    paths = {k: out / n for k, n in zip(("json", "csv", "md", "png"), FILES)}
    doc = {"meta": meta, "metrics": metrics, "routes": [r.to_dict() for r in records]}
    paths["json"].write_text(json.dumps(_jsonable(doc), indent=2, allow_nan=False) + "\n")
    with paths["csv"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROUTE_COLUMNS)
        w.writeheader()
        for r in records:
            d = r.to_dict()
            d["collision_speeds_kmh"] = ";".join(f"{s:.2f}" for s in r.collision_speeds_kmh)
            w.writerow(d)
    paths["md"].write_text(metrics_markdown(metrics, records, meta))
    title = " / ".join(str(meta[k]) for k in ("policy", "town", "density") if k in meta)
    _plot(paths["png"], records, title or "evaluation")
    return paths


def compare_runs(paths) -> str:
    """A markdown table of several runs side by side: one row per ``metrics.json`` (or folder
    holding one), named by ``meta["name"]`` or the folder's name."""
    rows = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "metrics.json"
        if not p.is_file():
            raise FileNotFoundError(f"no metrics.json at {p}")
        doc = json.loads(p.read_text())
        meta, m = doc.get("meta", {}), doc.get("metrics", {})
        if m.get("DCF", 0) is None:  # written as null: inf
            m["DCF"] = math.inf
        name = str(meta.get("name") or p.parent.name)
        rows.append([name, str(meta.get("town", "-")), str(meta.get("density", "-")),
                     str(m.get("episodes", "-")), *(format_metric(k, m) for k in METRIC_KEYS)])
    if not rows:
        raise ValueError("compare_runs needs at least one run")
    header = ["run", "town", "density", "episodes", *(METRIC_COLUMNS[k][0] for k in METRIC_KEYS)]
    return "\n".join(_table(header, rows)) + "\n"
