"""The isolation bench (bench/isolation.py) at a tiny size, so that it cannot rot unnoticed:
every measurement comes out for every side (runc, gvisor, podman), and the report renders. How fast
is not asserted."""

from __future__ import annotations

import math

import pytest

from bench import isolation


@pytest.mark.podman  # (its leak check looks on Podman's engine too)
def test_bench_isolation_measures_every_side(gvisor_engine: str, podman_engine: str) -> None:
    sizes = isolation.Sizes(execs=3, raw=2, floor=2, outputs=1, files=5, big=64 * 1024)
    got = isolation.measure(1, sizes)
    measurements = (
        isolation.EXEC,
        isolation.RAW,
        isolation.FLOOR,
        isolation.READY,
        isolation.BIG,
        isolation.UPLOAD,
        isolation.DOWNLOAD,
    )
    assert set(got) == {(what, iso) for what in measurements for iso in isolation.ISOLATIONS}
    want = {isolation.EXEC: 3, isolation.RAW: 2, isolation.FLOOR: 2}
    for (what, iso), rounds in got.items():
        (times,) = rounds
        assert len(times) == want.get(what, 1), (what, iso)
        assert all(t > 0 for t in times), (what, iso, times)
    ratios = isolation.exec_ratio(got)
    assert all(math.isfinite(r) and r > 0 for r in ratios), ratios
    text = "\n".join(isolation.table_lines(got, sizes))
    assert "goal" in text.lower() and ("**met**" in text or "**not met**" in text)
    for what in measurements:
        assert f"| {what} |" in text, what
