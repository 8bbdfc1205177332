"""scripts/bench.py's command line: its help, and `load` (how the simulator's set-up scales with a
town's size)."""

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
