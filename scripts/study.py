#!/usr/bin/env python
"""Finish a study: evaluate finished training runs on the held-out towns, then write the report.

    python scripts/study.py outputs/sweeps/2026-11-24/10-00-00 [more sweeps or runs...] --out docs/results

For every run found under the arguments (as scripts/report.py finds them), each evaluation its
config's ``study.eval`` lists (experiment=study_*: Town02, Town01, Town03, Town05 at regular and
dense) or --evals gives is run on the 10 fixed routes with the run's latest checkpoint, exactly as
``python scripts/eval.py run=<run> town=<town> density=<density>`` does, into
``<run>/eval/<town>-<density>/``. Resumable: an evaluation whose metrics.json is on disk is skipped
(metrics.json is written last), so a killed study is simply started again. Failed runs are skipped.
Then the report (scripts/report.py) is written to --out. --dry-run lists what would be evaluated.
With --json the last line of stdout is the report's summary plus ``evaluated``, ``skipped``,
``errors``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

DEFAULT_EVALS = ("Town02-regular", "Town01-regular", "Town01-dense", "Town03-regular",
                 "Town03-dense", "Town05-regular", "Town05-dense")


def _parse_evals(items) -> list[tuple[str, str]]:
    out = []
    for e in items:
        town, _, density = str(e).strip().rpartition("-")
        if not town or not density:
            raise ValueError(f"evaluation {e!r} is not <town>-<density> (e.g. Town05-dense)")
        out.append((town, density))
    return out


def plan(runs, evals=None) -> tuple[list, list, list]:
    """(todo, skipped, not_evaluable): ``todo``/``skipped`` are (run, town, density) triples; a
    triple is skipped when its metrics.json exists; failed runs are ``not_evaluable``."""
    from drivemind.training.evaluate import eval_folder

    todo, skipped, bad = [], [], []
    for r in runs:
        if not r["ok"] or not (r["path"] / "checkpoints" / "latest.json").is_file():
            bad.append(r)
            continue
        wanted = evals or _parse_evals((r["config"].get("study") or {}).get("eval") or DEFAULT_EVALS)
        for town, density in wanted:
            done = (r["path"] / "eval" / eval_folder(town, density) / "metrics.json").is_file()
            (skipped if done else todo).append((r, town, density))
    return todo, skipped, bad


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run directories or folders holding them (sweeps)")
    ap.add_argument("--out", default="outputs/report", help="report folder (created)")
    ap.add_argument("--evals", default=None,
                    help="comma-separated <town>-<density> list (default: each run's study.eval, "
                         f"else {','.join(DEFAULT_EVALS)})")
    ap.add_argument("--routes", default=None, help="comma-separated route indices (default: all 10; "
                                                    "fewer only for a smoke test: the result is then "
                                                    "on disk and later skipped)")
    ap.add_argument("--max-steps-per-route", type=int, default=20000)
    ap.add_argument("--video", action="store_true", help="also write route 0's BEV video")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dry-run", action="store_true", help="list the evaluations to run, run none")
    ap.add_argument("--no-report", action="store_true", help="evaluate only")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    args = ap.parse_args(argv)
    from drivemind.training.cli import run_cli

    return run_cli(_main, args)


def _main(args) -> dict:
    from drivemind.evaluation.study import build_report, find_runs, load_run, write_study_report

    runs = find_runs(args.paths)
    evals = _parse_evals(args.evals.split(",")) if args.evals else None
    routes = [int(i) for i in args.routes.split(",")] if args.routes else None
    todo, skipped, bad = plan(runs, evals)
    for r in bad:
        print(f"[drivemind] not evaluated: {r['name']} ({r['status']})", flush=True)
    print(f"[drivemind] {len(runs)} runs: {len(todo)} evaluations to run, {len(skipped)} already on "
          f"disk (skipped)", flush=True)
    done, errors = [], []
    for i, (r, town, density) in enumerate(todo):
        label = f"{r['name']} on {town}-{density}"
        if args.dry_run:
            print(f"[drivemind] would evaluate {label}", flush=True)
            continue
        from drivemind.training.evaluate import evaluate_run

        t0 = time.perf_counter()
        print(f"[drivemind] ({i + 1}/{len(todo)}) evaluating {label}", flush=True)
        try:
            res = evaluate_run(r["path"], town, density, device=args.device, routes=routes,
                               video_route=0 if args.video else None,
                               max_steps_per_route=args.max_steps_per_route)
        except Exception as e:  # one bad evaluation must not lose the others; reported at the end
            errors.append(f"{label}: {type(e).__name__}: {e}")
            print(f"[drivemind] FAILED {label}: {type(e).__name__}: {e}", flush=True)
            continue
        m = res["metrics"]
        print(f"[drivemind] {label}: SR {m['SR']:.2f} RC {m['RC']:.2f} CR {m['CR']:.2f} "
              f"AS {m['AS']:.1f} km/h ({time.perf_counter() - t0:.0f} s)", flush=True)
        done.append(f"{r['name']}:{town}-{density}")
    summary = {"evaluated": done, "skipped": len(skipped), "errors": errors,
               "not_evaluable": [r["name"] for r in bad]}
    if not args.dry_run and not args.no_report:
        runs = [load_run(r["path"]) for r in runs]  # with the new evaluations
        summary = {**write_study_report(build_report(runs), args.out), **summary}
        print(f"[drivemind] wrote {Path(args.out) / 'report.md'}", flush=True)
    if args.json:
        print(json.dumps(summary, default=str))
    if errors:
        print(f"[drivemind] {len(errors)} evaluation(s) failed; run the same command again to "
              f"retry them", file=sys.stderr, flush=True)
        sys.exit(1)
    return summary


if __name__ == "__main__":
    main()
