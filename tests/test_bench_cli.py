"""scripts/bench.py's command line: its help, `load` (how the simulator's set-up scales with a
town's size) and `maps` (which OpenDRIVE files of a folder load)."""

from __future__ import annotations

import pytest


def test_bench_load_builds_a_grid_town_of_the_size_asked():
    """`bench.py load --grid N` (docs/benchmarks.md, stop 51): an N x N lattice of 4-way junctions,
    each joined to its neighbours by a two-way street."""
    from script_loader import load_script

    out = load_script("bench").main(["load", "--grid", "3", "--steps", "5", "--cores", "0"])
    assert out["junctions"] == 9
    assert out["lanes"] == out["junction_lanes"] + 2 * 12  # 12 streets, a lane each way
    assert out["tables_s"] >= 0.0 and out["step_ms"] > 0.0 and out["max_rss_mb"] > 0
    # the traffic tables and the BEV raster, in MB (stop 52: junction by junction, in tiles)
    assert 0.0 < out["tables_mb"] < 1.0 and out["bev_raster_whole"] is True
    assert 0.0 < out["bev_raster_mb"] and out["bev_first_view_s"] >= 0.0


def test_bench_help_lists_every_subcommand(capsys):
    """`bench.py --help` printed a TypeError instead (a help text's bare %)."""
    from script_loader import load_script

    with pytest.raises(SystemExit) as exit_:
        load_script("bench").main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "load" in out and "learn-summary" in out and "95 % intervals" in out


def test_bench_maps_says_which_files_load_and_why_the_others_do_not(tmp_path):
    """`bench.py maps DIR` (docs/benchmarks.md, stop 53): every OpenDRIVE file of a folder through
    the loader, the lanes of those that load, the first line of the others' errors, and the
    map warnings by kind."""
    from script_loader import load_script
    from test_map_quirks import HEAD, _lane, _road, _section

    (tmp_path / "good.xodr").write_text(
        HEAD + _road([_section(0, [_lane(-1)])], geometry='<arc curvature="0"/>') + "</OpenDRIVE>")
    (tmp_path / "bad.xodr").write_text("<OpenDRIVE></OpenDRIVE>")
    (tmp_path / "notes.txt").write_text("not a map")
    out = load_script("bench").main(["maps", str(tmp_path)])
    good, bad = f"{tmp_path.name}/good.xodr", f"{tmp_path.name}/bad.xodr"
    assert out["files"] == 2 and out["loaded"] == 1
    assert list(out["failed"]) == [bad] and "no <road>" in out["failed"][bad]
    assert out["per_file"][good]["lanes"] == 1
    assert out["per_file"][good]["warnings"] == ["arcs of zero curvature read as lines"]
    assert out["warning_kinds"] == {"arcs of zero curvature read as lines": 1}
    # one lane with an open end: a dead end, one component (itself)
    assert out["per_file"][good]["dead_ends"] == 1 and out["per_file"][good]["components"] == 1
    # towns by name, and a range of generated ones: closed networks
    towns = load_script("bench").main(["maps", "grid", "random-2..3"])
    assert sorted(towns["per_file"]) == ["grid", "random-2", "random-3"]
    assert all(v["components"] == 1 and v["dead_ends"] == 0 for v in towns["per_file"].values())
    assert towns["not_strongly_connected"] == []


def test_bench_sim_set_runs_every_file_and_town_resumes_and_compares(tmp_path, capsys):
    """`bench.py sim-set` (docs/benchmarks.md, stop 56): `sim` on each OpenDRIVE file of a folder
    (by path: a file named as a built-in town is that file, not the built-in town) and on each
    town named, each run in its own process with its JSON written as it ends; run again, it
    resumes from those files; `--compare` names the runs whose figures differ."""
    import json

    from script_loader import load_script

    from drivemind.maps.towns import builtin_town_xodr

    maps = tmp_path / "nets"
    maps.mkdir()
    (maps / "curves.xodr").write_text(builtin_town_xodr("grid"))  # grid's roads, curves' name
    (maps / "bad.xodr").write_text("<OpenDRIVE></OpenDRIVE>")
    out = tmp_path / "runs"
    argv = ["sim-set", str(maps), "grid", "curves", "--densities", "dense", "--seconds", "5",
            "--jobs", "2", "--out", str(out)]
    bench = load_script("bench")
    first = bench.main(argv)
    runs = first["per_run"]
    assert sorted(runs) == ["curves__dense", "grid__dense", "nets__bad__dense", "nets__curves__dense"]
    assert first["runs"] == first["ran_now"] == 4
    assert list(first["failed"]) == ["nets__bad__dense"] and "no <road>" in first["failed"]["nets__bad__dense"]
    assert runs["nets__curves__dense"] == runs["grid__dense"] != runs["curves__dense"]
    assert set(runs["grid__dense"]) == set(bench.SET_KEYS["sim"])
    assert first["totals"]["npc_collisions"] == sum(r["npc_collisions"] for k, r in runs.items()
                                                     if k != "nets__bad__dense")
    assert json.loads((out / "grid__dense.json").read_text())["town"] == "grid"  # the whole JSON
    # again: nothing re-run, the same figures; compared with the first, all the same
    (tmp_path / "first.json").write_text(json.dumps(first))
    again = bench.main(argv + ["--compare", str(tmp_path / "first.json")])
    assert again["ran_now"] == 0 and again["per_run"] == runs
    assert again["compare"]["same"] == 4 and again["compare"]["differ"] == {}
    # a base whose figures differ on one run names that run and the figure
    runs["grid__dense"]["npc_respawns"] += 1
    (tmp_path / "other.json").write_text(json.dumps({"per_run": runs}))
    third = bench.main(argv + ["--compare", str(tmp_path / "other.json")])
    assert list(third["compare"]["differ"]) == ["grid__dense"]
    assert list(third["compare"]["differ"]["grid__dense"]) == ["npc_respawns"]
    capsys.readouterr()


def test_bench_sim_set_takes_a_range_of_generated_towns(tmp_path, capsys):
    """`sim-set random-2..4` runs the towns generated from seeds 2, 3 and 4 (docs/maps.md,
    "Generated towns"); a range running backwards is refused."""
    from script_loader import load_script

    bench = load_script("bench")
    argv = ["sim-set", "random-2..4", "grid", "--densities", "empty", "--seconds", "2", "--jobs", "2",
            "--out", str(tmp_path / "runs")]
    res = bench.main(argv)
    assert sorted(res["per_run"]) == ["grid__empty", "random-2__empty", "random-3__empty",
                                      "random-4__empty"]
    assert res["failed"] == {}
    with pytest.raises(SystemExit, match="first seed is above the last"):
        bench.main(["sim-set", "random-4..2", "--out", str(tmp_path / "other")])
    capsys.readouterr()


def test_bench_sim_set_runs_each_network_at_each_seed(tmp_path, capsys):
    """`sim-set --seeds 0,1`: each network and density at each seed (keys ending __s<seed>, each
    run's JSON carrying its seed), and `over_seeds` the mean NPC speed over them; --seeds is
    refused with the expert's fixed routes and when it is not a list of distinct integers."""
    import json

    from script_loader import load_script

    bench = load_script("bench")
    out = tmp_path / "runs"
    argv = ["sim-set", "grid", "--densities", "dense", "--seconds", "5", "--jobs", "2",
            "--out", str(out)]
    res = bench.main(argv + ["--seeds", "0,1"])
    runs = res["per_run"]
    assert sorted(runs) == ["grid__dense__s0", "grid__dense__s1"] and res["seed"] == [0, 1]
    assert [json.loads((out / f"grid__dense__s{s}.json").read_text())["seed"] for s in (0, 1)] == [0, 1]
    assert runs["grid__dense__s0"] != runs["grid__dense__s1"]  # another seed, another traffic
    over = res["over_seeds"]["grid__dense"]
    assert over["seeds"] == 2
    assert over["npc_mean_speed_kmh"] == pytest.approx(
        (runs["grid__dense__s0"]["npc_mean_speed_kmh"] + runs["grid__dense__s1"]["npc_mean_speed_kmh"]) / 2,
        abs=0.006)
    # grid at dense for 5 s: under 15 km/h (the cars are still starting)
    assert over["npc_mean_speed_kmh"] < 15.0 and res["over_seeds_missing_bars"] == ["grid__dense"]
    for bad, msg in ((["--seeds", "0,x"], "comma-separated integers"),
                     (["--seeds", "1,1"], "distinct integers"),
                     (["--seeds", "0,1", "--bench", "autopilot"], "for --bench sim")):
        with pytest.raises(SystemExit, match=msg):
            bench.main(argv + bad)
    capsys.readouterr()
