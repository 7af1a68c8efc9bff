"""The egress bench (bench/egress.py) at a tiny size, so that it cannot rot unnoticed: every
measurement comes out, for both sides and both protocols, and the report renders. How fast
is not asserted."""

from __future__ import annotations

import math
from pathlib import Path

from bench import egress
from orchestrator.testing.world import start_world


def test_bench_egress_measures_both_sides_and_every_startup(tmp_path: Path) -> None:
    with start_world() as world, egress.leaving_by(world):
        policy = egress.POLICIES[egress.RELAY] = egress.secrets_policy(world, str(tmp_path))
        try:
            with egress.pair() as sides:
                got = egress.measure_http(sides, rounds=1, requests=3, downloads=1)
                changes = egress.measure_changes(sides[egress.GATEWAY_SIDE], 1)
                relayed = egress.measure_relay(sides[egress.GATEWAY_SIDE], policy, 1, 3, 1)
            startups, first = egress.measure_startup(1)
        finally:
            egress.POLICIES.clear()
    assert {k: len(v) for k, v in relayed.items()} == {
        (egress.SMALL, egress.RELAYED): 3,
        (egress.SMALL, egress.TUNNELLED): 3,
        (egress.LARGE, egress.RELAYED): 1,
        (egress.LARGE, egress.TUNNELLED): 1,
    }
    assert "| 10 MiB | 1 |" in "\n".join(egress.relay_lines(relayed))
    assert {k: len(v) for k, v in changes.items()} == {
        egress.WIDEN: 1,
        egress.NARROW: 1,
        egress.CUT: 1,
    }
    assert all(t[0] > 0 for t in changes.values())
    assert "| narrow, a tunnel open" in "\n".join(egress.change_lines(changes))
    assert {kind.protocol for kind in egress.KINDS} == {egress.HTTP, egress.HTTPS}
    for kind in egress.KINDS:
        for side in egress.SIDES:
            (times,) = got[(kind, side)]
            assert len(times) == (1 if kind.size == egress.LARGE else 3), (kind, side)
            assert all(t > 0 for t in times), (kind, side, times)
    lines, ratios = egress.http_lines(got, 3, 1)
    assert set(ratios) == {egress.HTTP, egress.HTTPS}
    assert all(math.isfinite(r) and r > 0 for r in ratios.values()), ratios
    assert first > 0
    assert set(startups) == set(egress.STARTUP_FILES)
    for name, one in startups.items():
        assert len(one.ready) == len(one.cleanup) == 1, name
        assert one.ready[0] > 0 and one.cleanup[0] > 0, name
    text = "\n".join(lines + egress.startup_lines(startups, first, 1))
    assert "goal <= 1.2x" in text and "+" in text
    assert "start-up <= +0.2 s: " in text and "cleanup <= +0.3 s: " in text
    for protocol in (egress.HTTP, egress.HTTPS):
        assert f"| {protocol} |" in text, protocol
