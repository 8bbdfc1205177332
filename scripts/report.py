#!/usr/bin/env python
"""Aggregate a study: training runs grouped by method, mean ± std over seeds per evaluation town x
density, learning curves across seeds, and the papers' published numbers beside ours.

    python scripts/report.py outputs/sweeps/2026-11-24/10-00-00 outputs/sweeps/2026-11-25/09-12-00 \
        --out docs/results --json

Arguments are run directories or folders holding them (sweeps, outputs/); they are searched
recursively and merged. Writes report.md, table.csv, runs.csv, curves.csv, curves.png and
eval_<town>-<density>.png into --out (default: outputs/report); --archive also copies what the
report reads of every run (no checkpoints) to <out>/runs/, from which it can be rebuilt; runs
already in that archive stay as they are, so a new batch is added with
``report.py docs/results/runs <new sweep> --out docs/results --archive``. Methods are told apart by
reward, ablation, algorithm and any other config key that varies across the runs (not seed);
failed runs are listed, evaluations a run lacks are shown as missing
(drivemind.evaluation.study). With --json the last line of stdout is the summary as JSON
(runs, methods, seeds_min, the table rows).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run directories or folders holding them (sweeps)")
    ap.add_argument("--out", default="outputs/report", help="output folder (created)")
    ap.add_argument("--archive", action="store_true",
                    help="also copy each run's config, summary, episodes.csv and evaluation reports "
                         "(no checkpoints) to <out>/runs/, from which the report can be rebuilt")
    ap.add_argument("--results-md", default=None, metavar="PAGE",
                    help="also rewrite the marked tables of PAGE (docs/results.md) from this report: "
                         "blocks between <!-- report:NAME --> and <!-- /report:NAME -->, NAME in "
                         "table1, table2, ppo, heldout, guidance, contrasts (drivemind.evaluation.results_md)")
    ap.add_argument("--todo", action="store_true",
                    help="also list what the study (experiment=study_*) still lacks: seeds to train per "
                         "table and method, with the command and the method's mean wall time so far, "
                         "runs among the given folders cut short with a checkpoint (to resume, with "
                         "the resume= command), and evaluations not on disk yet (in the JSON as 'todo')")
    ap.add_argument("--contrast", nargs=2, action="append", metavar=("A", "B"), default=[],
                    help="also print A - B for two methods (labels as the report names them, e.g. "
                         "drivemind-sac vlm_rl-sac) on every evaluation: SR, CR and AS with 95%% "
                         "bootstrap intervals over seeds and routes (drivemind.evaluation.contrasts); "
                         "repeatable; in the JSON as 'contrasts' and in <out>/contrasts.csv")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    args = ap.parse_args(argv)
    from drivemind.training.cli import run_cli

    return run_cli(_main, args)


def _main(args) -> dict:
    from drivemind.evaluation.study import archive_runs, build_report, find_runs, write_study_report

    runs = find_runs(args.paths)
    if args.archive:
        dest = Path(args.out) / "runs"
        inside = [r for r in runs if dest.resolve() in r["path"].resolve().parents]
        new = archive_runs([r for r in runs if r not in inside], dest)
        print(f"[drivemind] archived or updated {len(new)} runs (no checkpoints) under {dest}"
              + (f"; {len(inside)} already there" if inside else ""), flush=True)
        # the report reads the archive's copies: a run given twice (archived, and again from its
        # sweep with later evaluations) is one run
        kept = {r["path"].resolve() for r in inside} | {p.resolve() for p in new}
        runs = [r for r in find_runs([dest]) if r["path"].resolve() in kept]
    report = build_report(runs)
    if args.contrast:  # before anything is written: an unknown method label is one error
        from drivemind.evaluation.contrasts import method_contrasts

        pairs = [c for a, b in args.contrast for c in method_contrasts(report, a, b)]
    summary = write_study_report(report, args.out)
    spec = study_spec() if (args.results_md or args.todo) else None
    if args.results_md:
        from drivemind.evaluation.results_md import fill, render_blocks

        page = Path(args.results_md)
        page.write_text(fill(page.read_text(), render_blocks(report, spec)))
        print(f"[drivemind] rewrote the study tables of {page}", flush=True)
    if args.todo:
        from drivemind.evaluation.results_md import todo

        summary["todo"] = todo(report, spec)
        for it in summary["todo"]:
            seeds = ",".join(str(s) for s in it["seeds"])
            if it["what"] == "train":
                est = f", ~{it['est_minutes']:g} min each so far" if it["est_minutes"] is not None else ""
                print(f"[drivemind] todo {it['table']}: train {it['method']} seed(s) {seeds}{est}: "
                      f"{it['command']}", flush=True)
            elif it["what"] == "resume":
                print(f"[drivemind] todo {it['table']}: resume {it['method']} seed {seeds} from its "
                      f"checkpoint at {it['steps']} env steps: {it['command']}", flush=True)
            else:
                print(f"[drivemind] todo {it['table']}: evaluate {it['method']} seed(s) {seeds} on "
                      f"{it['eval']}: {it['command']}", flush=True)
        if not summary["todo"]:
            print("[drivemind] todo: nothing, every table is complete", flush=True)
    if args.contrast:
        summary["contrasts"] = contrasts(pairs, Path(args.out) / "contrasts.csv")
    print(f"[drivemind] {summary['runs']} runs, {len(summary['methods'])} methods "
          f"(seeds per method >= {summary['seeds_min']}); evaluations: "
          f"{', '.join(summary['evals']) or 'none'}; wrote {Path(args.out) / 'report.md'}", flush=True)
    if summary["failed"]:
        print(f"[drivemind] failed or incomplete: {', '.join(summary['failed'])}", flush=True)
    if args.json:
        print(json.dumps(summary))
    return summary


def contrasts(rows: list[dict], path: Path) -> list[dict]:
    """``--contrast``: the pairs' contrasts, printed one line each and written to ``path``."""
    import csv

    from drivemind.evaluation.contrasts import format_interval as iv

    fields = ["a_label", "b_label", "evals", "key", "n_a", "n_b", "a_mean", "a_lo", "a_hi", "b_mean", "b_lo",
              "b_hi", "diff_mean", "diff_lo", "diff_hi", "p_greater"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for c in rows:
            flat = {"a_label": c["a_label"], "b_label": c["b_label"], "evals": " ".join(c["evals"]), "key": c["key"],
                    "n_a": c["n_a"], "n_b": c["n_b"], "p_greater": c["p_greater"]}
            for side in ("a", "b", "diff"):
                for part in ("mean", "lo", "hi"):
                    flat[f"{side}_{part}"] = c[side][part] if c[side] else None
            w.writerow(flat)
            print(f"[drivemind] contrast {c['a_label']} - {c['b_label']}, {c['key']}, {' '.join(c['evals'])}: "
                  f"A {iv(c['a'], c['key'])} ({c['n_a']} seeds), B {iv(c['b'], c['key'])} ({c['n_b']} seeds), "
                  f"A - B {iv(c['diff'], c['key'])}"
                  + (f", P(A > B) {c['p_greater']:.2f}" if c["p_greater"] is not None else ""), flush=True)
    return rows


def study_spec() -> dict:
    """What docs/results.md's tables show, from the study's own configs: the sweep lists, seeds,
    training town, evaluations and every composed setting (to pick the protocol's method where a
    key such as algo.guidance splits methods)."""
    import yaml
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import drivemind  # noqa: F401  (the config resolvers)
    from drivemind.evaluation.study import flatten

    configs = Path(__file__).resolve().parents[1] / "configs"

    spec = {}
    for key, name in (("table1", "study_table1"), ("ppo", "study_ppo")):
        raw = yaml.safe_load((configs / "experiment" / f"{name}.yaml").read_text())
        params = raw["hydra"]["sweeper"]["params"]
        with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
            cfg = compose("config", overrides=[f"experiment={name}"])
        study = raw["study"]
        spec[key] = {"rewards": [r.strip() for r in str(params["reward"]).split(",")],
                     "seeds": len(str(params["seed"]).split(",")),
                     "protocol": flatten(OmegaConf.to_container(cfg, resolve=True)),
                     "train": (study["train"]["town"], study["train"]["density"]),
                     "evals": [tuple(str(e).rsplit("-", 1)) for e in study["eval"]]}
    return spec


if __name__ == "__main__":
    main()
