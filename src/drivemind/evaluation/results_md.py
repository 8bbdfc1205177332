"""Fill the study's tables in ``docs/results.md`` from a report (``scripts/report.py --results-md``).

The hand-kept page has blocks between markers ``<!-- report:<name> -->`` and
``<!-- /report:<name> -->``; everything between a pair is rewritten from the report's rows, the
rest of the page (protocol, commands, findings) is left as it is. Blocks:

- ``table1``: every reward of ``experiment=study_table1`` (its sweep list, in that order) with
  SAC on the training town, AS / RC / TD / CS / SR / CR as mean ± sample std over the seeds, the
  number of seeds, and the paper's numbers (DriveMind Table 1) beside them;
- ``table2``: ``drivemind`` with ``reward.ablate=none|aicr|hvfr|pcfm`` (DriveMind Table 2 beside);
- ``ppo``: every reward of ``experiment=study_ppo`` with PPO;
- ``heldout``: SR of every Table 1 method on every town x density the study evaluates;
- ``endings``: how the evaluation routes of every method end (arrived, collision, off route,
  stuck, other) as shares over all its finished seeds' routes, on the training town and pooled
  over the held-out town x density pairs: whether a failing method stands, leaves its route or
  crashes;
- ``guidance``: ``found_rl_clip`` with SAC, ``algo.guidance=none`` (Table 1's row) and ``both``;
- ``contrasts``: the papers' orderings as differences between two methods (``CONTRASTS``), each
  with a 95 % hierarchical bootstrap interval over seeds and routes
  (:mod:`drivemind.evaluation.contrasts`), on the training town and pooled over the held-out towns;
- ``progress``: per table, the runs done against the protocol's methods x seeds, the methods with
  every seed, and the ones still short (from the same picks as the tables, so the page's status
  never disagrees with them).

A method is picked by reward, ablation and algorithm, and, for every other key that splits the
report's methods (``algo.guidance``, ``algo.batch_size``, ...), by the protocol's value of that
key (the composed ``experiment=study_*`` config, passed in as ``protocol``) unless a block asks for
another value. Methods with no finished run read ``pending``; fewer seeds than the protocol's show
in the ``seeds`` column, so a one-seed cell is never mistaken for a mean over three.
"""

from __future__ import annotations

import re

from .contrasts import contrast, format_interval
from .published import DM_T1, DM_T2, published_for
from .report import METRIC_COLUMNS, _table
from .study import _MISSING  # the report's "<unset>" (see below)
from .study import ENDINGS, endings_cell

BLOCKS = ("progress", "table1", "table2", "ppo", "heldout", "endings", "guidance", "contrasts")

ABLATIONS = (("none", "Full (`reward.ablate=none`)"), ("aicr", "NoAICR (`aicr`)"),
             ("hvfr", "NoHVFR (`hvfr`)"), ("pcfm", "NoPCFM (`pcfm`)"))
# pick(): a key the protocol does not set matches a run whose config lacks it (the report's
# "<unset>", _MISSING: PPO runs have no ``algo.guidance`` once a guided SAC run makes that key
# split methods)
# The papers' orderings (issue 16's "say what holds") as contrasts A - B of SAC runs: (claim, A,
# B, metrics); a side is (reward, reward.ablate). B None: A's own interval (a claim about one method).
CONTRASTS = (
    ("DriveMind ≥ VLM-RL", ("drivemind", None), ("vlm_rl", None), ("SR", "CR")),
    ("without HVFR DriveMind collapses", ("drivemind", "hvfr"), ("drivemind", None), ("SR", "AS")),
    ("without AICR it collides more", ("drivemind", "aicr"), ("drivemind", None), ("CR", "CS", "SR")),
    ("without PCFM it is slightly worse", ("drivemind", "pcfm"), ("drivemind", None), ("SR", "CR")),
    ("VLM-RL reaches a high success rate", ("vlm_rl", None), None, ("SR",)),
    ("Chen drives fast and collides", ("chen", None), None, ("AS", "CR")),
)


def _marker(name: str) -> tuple[str, str]:
    return f"<!-- report:{name} -->", f"<!-- /report:{name} -->"


def pick(rows: list[dict], protocol: dict, *, reward: str, algo: str, town: str, density: str,
         ablate=None, overrides: dict | None = None) -> dict | None:
    """The report row of one method on one evaluation (module docstring), or None."""
    overrides = overrides or {}
    ab = None if ablate in (None, "", "none") else str(ablate)
    for r in rows:
        if (r["reward"], r["ablate"], r["algo"], r["town"], r["density"]) != (reward, ab, algo, town, density):
            continue
        extra = r.get("extra") or {}
        if all(str(v) == str(overrides.get(k, protocol.get(k, _MISSING))) for k, v in extra.items()) and \
                all(k in extra or str(v) == str(protocol.get(k, _MISSING)) for k, v in overrides.items()):
            return r
    return None


def _cell(row: dict | None, key: str) -> str:
    if row is None or not row.get("n") or row.get(key) is None:
        return "pending"
    fmt = METRIC_COLUMNS[key][1]
    std = row.get(f"{key}_std")
    return fmt.format(row[key]) + (f" ± {fmt.format(std)}" if std is not None and row["n"] > 1 else "")


def _seeds(row: dict | None, target: int) -> str:
    return f"{row['n'] if row else 0}/{target}"


def _paper(reward: str, algo: str, town: str, density: str, keys, ablate=None, source=None) -> str:
    def fmt(_k, v):
        return f"{v:g}"  # as the paper prints it (0.37, 663.6, 0.003)

    entries = published_for(reward, ablate, algo, town, density)
    if source:
        entries = [e for e in entries if e["source"] == source] or entries
    if entries:
        e = entries[0]
        return " / ".join(fmt(k, e["metrics"][k][0]) for k in keys if k in e["metrics"])
    for other in ("ppo", "sac"):
        alt = published_for(reward, ablate, other, town, density) if other != algo else []
        if alt:
            e = alt[0]
            vals = " / ".join(fmt(k, e["metrics"][k][0]) for k in keys if k in e["metrics"])
            return f"(the paper's is {other.upper()}: {vals})"
    return "(not in the table)"


def ending_shares(rows: list[dict]) -> tuple[str, int]:
    """The shares of ``ENDINGS`` among the evaluation routes of report ``rows`` together (one
    method's rows on several evaluations; None for a method with none), and their number."""
    counts = dict.fromkeys(ENDINGS, 0)
    for row in rows:
        for k, v in ((row or {}).get("endings") or {}).items():
            counts[k] += v
    n = sum(counts.values())
    return (endings_cell(counts) if n else "pending"), n


def render_blocks(report: dict, spec: dict) -> dict[str, str]:
    """The text of every block. ``spec``: ``table1`` and ``ppo`` each ``{"rewards": [...],
    "protocol": {flat key: value}, "seeds": n, "train": (town, density), "evals": [(town,
    density), ...]}`` (from the ``experiment=study_*`` configs)."""
    rows = report["rows"]
    t1, ppo = spec["table1"], spec["ppo"]
    town, density = t1["train"]
    ptown, pdensity = ppo["train"]
    keys6 = ("AS", "RC", "TD", "CS", "SR", "CR")
    head6 = [METRIC_COLUMNS[k][0] for k in keys6]
    out = {}
    # each table's methods on its training town, picked once for its block and for ``progress``
    sac = [(rew, pick(rows, t1["protocol"], reward=rew, algo="sac", town=town, density=density))
           for rew in t1["rewards"]]
    ablations = [(ab, label, pick(rows, t1["protocol"], reward="drivemind", ablate=ab, algo="sac",
                                  town=town, density=density)) for ab, label in ABLATIONS]
    on_policy = [(rew, pick(rows, ppo["protocol"], reward=rew, algo="ppo", town=ptown, density=pdensity))
                 for rew in ppo["rewards"]]
    guided = [(label, pick(rows, t1["protocol"], reward="found_rl_clip", algo="sac", town=town,
                           density=density, overrides={"algo.guidance": g}))
              for g, label in (("none", "`algo.guidance=none` (Table 1's `found_rl_clip`)"),
                               ("both", "`algo.guidance=both` (VMR + AWAG, privileged teacher stand-in)"))]

    body = [[rew, _seeds(r, t1["seeds"]), *(_cell(r, k) for k in keys6),
             _paper(rew, "sac", town, density, ("AS", "RC", "TD", "CS", "SR"), source=DM_T1)] for rew, r in sac]
    out["table1"] = _table(["method", "seeds", *head6, "paper: AS / RC / TD / CS / SR (DriveMind Table 1)"], body)

    keys5 = ("AS", "RC", "CS", "SR", "CR")
    body = [[label, _seeds(r, t1["seeds"]), *(_cell(r, k) for k in keys5),
             _paper("drivemind", "sac", town, density, ("AS", "RC", "CS", "SR"), ablate=ab, source=DM_T2)]
            for ab, label, r in ablations]
    out["table2"] = _table(["variant", "seeds", *(METRIC_COLUMNS[k][0] for k in keys5),
                            "paper: AS / RC / CS / SR (DriveMind Table 2)"], body)

    body = [[rew, _seeds(r, ppo["seeds"]), *(_cell(r, k) for k in keys6)] for rew, r in on_policy]
    out["ppo"] = _table(["method", "seeds", *head6], body)

    evals = t1["evals"]
    body = []
    for rew in t1["rewards"]:
        cells = []
        for (t, d) in evals:
            r = pick(rows, t1["protocol"], reward=rew, algo="sac", town=t, density=d)
            cells.append(_cell(r, "SR") + (f" ({r['n']})" if r and 0 < r["n"] < t1["seeds"] else ""))
        body.append([rew, *cells])
    out["heldout"] = _table(["method", *(f"{t} {d}" for t, d in evals)], body)

    held = [e for e in evals if tuple(e) != (town, density)]
    body = []
    for name, row in ([(rew, r) for rew, r in sac] + [(f"drivemind {label.split(' ')[0]}", r) for _, label, r in ablations[1:]]
                      + [(f"{rew} (PPO)", r) for rew, r in on_policy] + [("found_rl_clip guided", guided[1][1])]):
        here, n_here = ending_shares([row])
        away, n_away = ending_shares([next((r for r in rows if r["method"] == row["method"]
                                            and (r["town"], r["density"]) == tuple(e)), None)
                                      for e in held] if row else [])
        body.append([name, str(row["n"] if row else 0), here, away, f"{n_here} / {n_away}"])
    out["endings"] = _table(["method", "seeds", f"{town} {density}: arrived / collision / off route / stuck / other",
                             f"held out ({len(held)} pairs): arrived / collision / off route / stuck / other",
                             "routes"], body)

    body = [[label, _seeds(r, t1["seeds"]), *(_cell(r, k) for k in keys6)] for label, r in guided]
    out["guidance"] = _table(["found_rl_clip, SAC", "seeds", *head6], body)
    out["contrasts"] = contrast_table(report, t1)

    groups = (("Table 1 (SAC)", t1["seeds"], sac),
              ("Table 2 (SAC; its Full row is Table 1's `drivemind`)", t1["seeds"],
               [(label.split(" ")[0], r) for _, label, r in ablations[1:]]),
              ("PPO", ppo["seeds"], on_policy),
              ("Found-RL guidance (`algo.guidance=both`)", t1["seeds"], [("found_rl_clip", guided[1][1])]))
    body = []
    for name, n, methods in groups:
        have = [(m, min(r["n"] if r else 0, n)) for m, r in methods]
        short = [f"{m} {k}/{n}" for m, k in have if k < n]
        body.append([name, f"{sum(k for _, k in have)} / {n * len(have)}",
                     f"{sum(k == n for _, k in have)} / {len(have)}", ", ".join(short) or "none"])
    out["progress"] = _table(["table", "runs done / planned", "methods with every seed",
                              "still short of seeds"], body)
    return {k: "\n".join(v) for k, v in out.items()}


def _side(report: dict, protocol: dict, side, town: str, density: str) -> tuple[str, list[dict]]:
    reward, ablate = side
    row = pick(report["rows"], protocol, reward=reward, ablate=ablate, algo="sac", town=town, density=density)
    label = reward + (f" No{ablate.upper()}" if ablate else "")
    if row is None:
        return label, []
    return label, next(m["ok"] for m in report["methods"] if m["label"] == row["method"])


def _interval(side: dict | None, key: str, n: int) -> str:
    return format_interval(side, key) + ("" if not side or n > 1 else " (1 seed)")


def _published(side, key: str, town: str, density: str, source: str) -> float | None:
    entries = [e for e in published_for(side[0], side[1], "sac", town, density) if e["source"] == source]
    return entries[0]["metrics"][key][0] if entries and key in entries[0]["metrics"] else None


def contrast_rows(report: dict, spec: dict) -> list[dict]:
    """Every contrast of ``CONTRASTS`` on the training town and pooled over the other
    evaluations of ``spec`` (``render_blocks``'s ``table1``), as
    :func:`drivemind.evaluation.contrasts.contrast` dicts plus ``claim``, ``a_label``,
    ``b_label``, ``where`` and ``paper`` (the published A, or A - B, on the training town from
    DriveMind's Table 1, or Table 2 for an ablation; None where it has none)."""
    town, density = spec["train"]
    held = [e for e in spec["evals"] if tuple(e) != (town, density)]
    out = []
    for claim, a, b, keys in CONTRASTS:
        a_label, a_runs = _side(report, spec["protocol"], a, town, density)
        b_label, b_runs = _side(report, spec["protocol"], b, town, density) if b else (None, None)
        source = DM_T2 if any(side and side[1] for side in (a, b)) else DM_T1
        for key in keys:
            pa = _published(a, key, town, density, source)
            pb = _published(b, key, town, density, source) if b else 0.0
            paper = pa - pb if pa is not None and pb is not None else None
            for where, evals in ((f"{town} {density}", [(town, density)]), ("held out (pooled)", held)):
                c = contrast(a_runs, b_runs, key, evals)
                out.append({**c, "claim": claim, "a_label": a_label, "b_label": b_label, "where": where,
                            "paper": paper if len(evals) == 1 else None})
    return out


def contrast_table(report: dict, spec: dict) -> list[str]:
    body = []
    for c in contrast_rows(report, spec):
        key = c["key"]
        if c["b_label"] is None:
            diff, p = "-", "-"
        else:
            diff = format_interval(c["diff"], key)
            p = "-" if c["diff"] is None else f"{c['p_greater']:.2f}"
        paper = "-" if c["paper"] is None else f"{c['paper']:.3g}"
        body.append([c["claim"], METRIC_COLUMNS[key][0], c["where"],
                     f"{c['a_label']}: {_interval(c['a'], key, c['n_a'])}",
                     "-" if c["b_label"] is None else f"{c['b_label']}: {_interval(c['b'], key, c['n_b'])}",
                     diff, p, f"{c['n_a']}" + ("" if c["b_label"] is None else f" / {c['n_b']}"), paper])
    return _table(["claim", "metric", "where", "A [95 % interval]", "B [95 % interval]",
                   "A - B [95 % interval]", "P(A > B)", "seeds A / B", "paper: A - B (or A)"], body)


def _seed_list(seeds) -> str:
    return ",".join(str(s) for s in seeds)


def todo(report: dict, spec: dict) -> list[dict]:
    """What the study still lacks, from the same picks as :func:`render_blocks`: per table and
    method the seeds not trained yet (``"train"``, with the command that trains them and the mean
    wall time of the method's finished runs, ``est_minutes``, None when it has none); a seed whose
    run among the given folders is ``incomplete`` (killed, or stopped by a signal:
    :func:`drivemind.evaluation.study.load_run`) with a checkpoint is to be continued instead
    (``"resume"``, one item per seed, its run furthest on, with ``python scripts/train.py
    resume=<run dir>`` and the checkpoint's ``steps``); and per trained method the evaluations not
    on disk yet (``"evaluate"``: ``scripts/study.py`` on the runs' folders does them and skips
    what is there)."""
    from ..training.callbacks import latest_checkpoint

    rows, t1, ppo = report["rows"], spec["table1"], spec["ppo"]
    town, density = t1["train"]
    wall = {m["label"]: [r["wall_s"] for r in m["ok"] if r.get("wall_s")] for m in report["methods"]}
    items = []

    def resumable(method: str, seeds) -> dict:
        """seed -> (run, checkpoint entry) of the method's incomplete runs that can go on (a
        failed one starts again); of two for one seed, the one furthest on."""
        out = {}
        for run in report["runs"]:
            if (not str(run["status"]).startswith("incomplete") or run.get("method") != method
                    or str(run["seed"]) not in seeds):
                continue
            ck, best = latest_checkpoint(run["path"]), out.get(str(run["seed"]))
            if ck and (best is None or int(ck.get("steps") or 0) > int(best[1].get("steps") or 0)):
                out[str(run["seed"])] = (run, ck)
        return out

    def train(table, label, r, n, command):
        done = {str(x) for x in (r["trained_seeds"] if r else [])}
        seeds = [s for s in range(n) if str(s) not in done]
        cont = resumable(r["method"], {str(s) for s in seeds}) if r else {}
        for _, (run, ck) in sorted(cont.items()):
            items.append({"what": "resume", "table": table, "method": label, "seeds": [run["seed"]],
                          "steps": int(ck.get("steps") or 0), "run": str(run["path"]),
                          "command": f"python scripts/train.py resume={run['path']}"})
        seeds = [s for s in seeds if str(s) not in cont]
        if seeds:
            w = wall.get(r["method"]) if r else None
            items.append({"what": "train", "table": table, "method": label, "seeds": seeds,
                          "est_minutes": round(sum(w) / len(w) / 60, 1) if w else None,
                          "command": command(_seed_list(seeds))})

    def evaluate(table, label, algo, spec_, **kw):
        protocol, evals = spec_["protocol"], spec_["evals"]
        trained = pick(rows, protocol, algo=algo, town=spec_["train"][0], density=spec_["train"][1], **kw)
        for (t, d) in evals:
            r = pick(rows, protocol, algo=algo, town=t, density=d, **kw)
            have = {str(x) for x in (r["seeds"] if r else [])}
            seeds = [s for s in (trained["trained_seeds"] if trained else []) if str(s) not in have]
            if seeds:
                items.append({"what": "evaluate", "table": table, "method": label, "seeds": seeds,
                              "eval": f"{t}-{d}", "command": "python scripts/study.py <the runs' sweep folders>"})

    sweep = "python scripts/train.py -m experiment=study_table1 'hydra.sweeper.params.reward=\"{}\"' " \
            "'hydra.sweeper.params.seed=\"{}\"'"
    for rew in t1["rewards"]:
        r = pick(rows, t1["protocol"], reward=rew, algo="sac", town=town, density=density)
        train("table1", rew, r, t1["seeds"], lambda s, rew=rew: sweep.format(rew, s))
        evaluate("table1", rew, "sac", t1, reward=rew)
    for ab, _ in ABLATIONS[1:]:  # Full is Table 1's drivemind
        r = pick(rows, t1["protocol"], reward="drivemind", ablate=ab, algo="sac", town=town, density=density)
        # reward=drivemind on the command line, not in the sweeper's params: Hydra composes the
        # command line alone once before the sweep, and only drivemind's config has reward.ablate
        train("table2", f"drivemind reward.ablate={ab}", r, t1["seeds"],
              lambda s, ab=ab: f"python scripts/train.py -m experiment=study_table1 reward=drivemind "
                               f"reward.ablate={ab} seed={s}")
        evaluate("table2", f"drivemind reward.ablate={ab}", "sac", t1, reward="drivemind", ablate=ab)
    ptown, pdensity = ppo["train"]
    for rew in ppo["rewards"]:
        r = pick(rows, ppo["protocol"], reward=rew, algo="ppo", town=ptown, density=pdensity)
        train("ppo", rew, r, ppo["seeds"],
              lambda s, rew=rew: f"python scripts/train.py -m experiment=study_ppo reward={rew} seed={s}")
        evaluate("ppo", rew, "ppo", ppo, reward=rew)
    r = pick(rows, t1["protocol"], reward="found_rl_clip", algo="sac", town=town, density=density,
             overrides={"algo.guidance": "both"})
    train("guidance", "found_rl_clip algo.guidance=both", r, t1["seeds"],
          lambda s: sweep.format("found_rl_clip", s) + " algo.guidance=both")
    return items


def fill(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each marked block replaced; raises naming every block whose markers are
    missing or out of order (the page is left untouched then)."""
    bad = []
    for name in blocks:
        start, end = _marker(name)
        i, j = text.find(start), text.find(end)
        if i < 0 or j < i or text.count(start) != 1:
            bad.append(name)
    if bad:
        raise ValueError(f"results page: no (or no single, ordered) marker pair for {', '.join(bad)}; "
                         f"put `<!-- report:NAME -->` and `<!-- /report:NAME -->` around each table "
                         f"(names: {', '.join(BLOCKS)})")
    for name, body in blocks.items():
        start, end = _marker(name)
        text = re.sub(re.escape(start) + r".*?" + re.escape(end),
                      lambda _m, s=start, b=body, e=end: f"{s}\n{b}\n{e}", text, count=1, flags=re.S)
    return text
