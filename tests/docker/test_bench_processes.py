"""The process bench (bench/processes.py) at a few runs, so that it cannot rot unnoticed:
every way runs and answers each line, each has its raw twin, and the report renders. How
fast is not asserted."""

from __future__ import annotations

import math

from bench import processes


def test_bench_processes_runs_every_way_and_reports_each_ratio() -> None:
    samples, twins = processes.measure(3)
    names = {s.name for s in samples}
    assert set(twins) <= names and set(twins.values()) <= names
    for sample in samples:
        assert sample.times and all(math.isfinite(t) and t > 0 for t in sample.times)
    text = "\n".join(processes.table(samples, twins, 3))
    for sample in samples:
        assert f"| {sample.name} |" in text
