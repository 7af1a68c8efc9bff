"""The CLI bench (bench/cli.py) at one round, so that it cannot rot unnoticed: every way runs
as a whole process and succeeds, each has its twin, and the report renders. How fast is not
asserted."""

from __future__ import annotations

import math

from bench import cli


def test_bench_cli_runs_every_way_and_reports_each_ratio() -> None:
    ways = cli.measure(1)
    names = {w.name for w in ways}
    assert {w.twin for w in ways if w.twin} <= names
    for way in ways:
        assert len(way.wall) == len(way.cpu) == 1, way.name
        assert way.wall[0] > 0 and math.isfinite(way.cpu[0]) and way.cpu[0] >= 0, way.name
    text = "\n".join(cli.table(ways, 1))
    for way in ways:
        assert f"| {way.name} |" in text
    assert text.count("\n|---|") == 1 and "- | -" in text  # `--help` has no twin
