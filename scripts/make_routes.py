#!/usr/bin/env python
"""Write the fixed evaluation routes of a town to a JSON file (10 seeded A* routes by default).

    python scripts/make_routes.py --town Town05 --out routes/Town05.json
    DRIVEMIND_MAP_PATH=../shared/maps python scripts/make_routes.py --town Town02 --shipped

Every method evaluated with the same file drives the same routes. ``--shipped`` writes into the
package's own route folder (for towns whose files ship with DriveMind).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv=None):
    from drivemind.envs.routes import N_ROUTES, SEED, SHIPPED, make_fixed_routes, write_routes
    from drivemind.maps import load_town

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--town", required=True, help="built-in town, CARLA town name or .xodr path")
    ap.add_argument("--n", type=int, default=N_ROUTES)
    ap.add_argument("--seed", type=int, default=SEED)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="JSON file to write")
    where.add_argument("--shipped", action="store_true", help="write into drivemind/envs/routes/")
    args = ap.parse_args(argv)
    rm = load_town(args.town)
    spec = make_fixed_routes(rm, args.n, args.seed)
    out = write_routes(spec, SHIPPED / f"{rm.name}.json" if args.shipped else args.out)
    lengths = [r["length_m"] for r in spec["routes"]]
    print(f"wrote {len(lengths)} routes for {rm.name} to {out} "
          f"(length {min(lengths):.0f}-{max(lengths):.0f} m, mean {sum(lengths) / len(lengths):.0f} m)")


if __name__ == "__main__":
    main()
