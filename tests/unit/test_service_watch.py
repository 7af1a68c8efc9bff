"""The start's watch over extra services (backends/container/readiness.py), with no engine:
a service that keeps running must still run SETTLE seconds after it started. Where the
engine's clock is this machine's, that window runs from when the engine says it started
the service (Compose and the fast path start services before the sandbox, so most of the
window has passed once the sandbox is up); else from when it was first seen running."""

from __future__ import annotations

import datetime
import time
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.backends.container import readiness
from orchestrator.backends.container.readiness import SETTLE, ServiceWatch
from orchestrator.errors import HealthcheckFailed


def _iso(seconds_ago: float) -> str:
    when = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f000Z")  # (nanoseconds, as the engine writes)


def _watch(states: dict[str, Any], *, same_clock: bool) -> ServiceWatch:
    services = {name: SimpleNamespace(job=False, healthcheck=None) for name in states}
    return ServiceWatch(
        "t",
        services,  # type: ignore[arg-type]
        lambda s: states[s],
        lambda s: "",
        timeout=5,
        same_clock=same_clock,
    )


def _state(status: str = "running", started: str = "", code: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        status=status, exit_code=code, health=None, oom_killed=False, started_at=started
    )


@pytest.mark.parametrize(
    ("ago", "same_clock", "waits"),
    [
        (0.8, True, SETTLE - 0.8),  # the engine started it 0.8 s ago: the rest of the window
        (30.0, True, 0.0),  # long since: no wait
        (-5.0, True, SETTLE),  # a start in the future (another clock): the whole window
        (0.8, False, SETTLE),  # the engine's clock is not ours: from when it was seen
    ],
)
def test_the_settle_window_runs_from_the_engines_start_where_its_clock_is_ours(
    ago: float, same_clock: bool, waits: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    watch = _watch({"db": _state(started=_iso(ago))}, same_clock=same_clock)
    watch.started()
    watch.settled()
    assert sum(slept) == pytest.approx(waits, abs=0.1)


def test_a_service_that_ended_within_its_window_fails_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    states = {"db": _state(started=_iso(0.5)), "web": _state(started="0001-01-01T00:00:00Z")}
    watch = _watch(states, same_clock=True)
    watch.started()
    states["db"] = _state("exited", _iso(0.6), code=3)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    with pytest.raises(HealthcheckFailed, match="'db' exited with code 3"):
        watch.settled()


def test_the_engines_times_are_read_whatever_their_form() -> None:
    now = time.time()
    assert readiness._epoch(_iso(2.0)) == pytest.approx(now - 2.0, abs=0.5)
    assert readiness._epoch(datetime.datetime.fromtimestamp(now, datetime.UTC)) == pytest.approx(
        now
    )
    for never in ("", "0001-01-01T00:00:00Z", "not a time", None, 12):
        assert readiness._epoch(never) is None
