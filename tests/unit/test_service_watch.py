"""The start's watch over extra services (backends/container/readiness.py), with no engine:
a service that keeps running must still run SETTLE seconds after it started. Where this
machine's kernel says how long its container has run (`ran_for`), that window runs from its
start (Compose and the fast path start services before the sandbox, so most of the window
has passed once the sandbox is up); else from when it was first seen running."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.backends.container.readiness import SETTLE, ServiceWatch
from orchestrator.errors import HealthcheckFailed


def _watch(states: dict[str, Any], ran_for: Callable[[str], float | None] | None) -> ServiceWatch:
    services = {name: SimpleNamespace(job=False, healthcheck=None) for name in states}
    return ServiceWatch(
        "t",
        services,  # type: ignore[arg-type]
        lambda s: states[s],
        lambda s: "",
        timeout=5,
        ran_for=ran_for,
    )


class Clock:
    """The watch's `time`: its sleeps noted, not slept (another thread's, of the test
    process, are its own)."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr("orchestrator.backends.container.readiness.time", clock)
    return clock


def _state(status: str = "running", code: int = 0) -> SimpleNamespace:
    return SimpleNamespace(status=status, exit_code=code, health=None, oom_killed=False)


@pytest.mark.parametrize(
    ("ran", "waits"),
    [
        (0.8, SETTLE - 0.8),  # it has run 0.8 s: the rest of the window
        (30.0, 0.0),  # long since: no wait
        (-5.0, SETTLE),  # (never read so: as not run at all)
        (None, SETTLE),  # not known (another machine's kernel, a gated service)
    ],
)
def test_the_settle_window_runs_from_the_services_start_where_this_kernel_says_it(
    ran: float | None, waits: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _clock(monkeypatch)
    watch = _watch({"db": _state()}, lambda service: ran)
    watch.started()
    watch.settled()
    assert sum(clock.slept) == pytest.approx(waits, abs=0.1)


def test_without_the_kernels_word_the_window_runs_from_the_first_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _clock(monkeypatch)
    watch = _watch({"db": _state()}, None)
    watch.started()
    watch.settled()
    assert sum(clock.slept) == pytest.approx(SETTLE, abs=0.1)


def test_a_service_that_ended_within_its_window_fails_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    states = {"db": _state(), "web": _state()}
    watch = _watch(states, lambda service: 0.5)
    watch.started()
    states["db"] = _state("exited", code=3)
    _clock(monkeypatch)
    with pytest.raises(HealthcheckFailed, match="'db' exited with code 3"):
        watch.settled()


def _started(ago: float) -> str:
    return datetime.fromtimestamp(time.time() - ago, UTC).isoformat()


@pytest.mark.parametrize(
    ("ago", "expect"),
    [
        # an init (docker-init, gVisor's sandbox) that began long before the command:
        # the engine's later start is the one taken
        (0.5, 0.5),
        (-5.0, 0.0),  # a start to come (a clock stepped back): never below none
        ("", None),  # none said: the kernel's figure alone
        ("not a time", None),
        (10.0**9, None),  # an earlier start: the kernel's later one
    ],
    ids=["later", "to-come", "none", "garbage", "earlier"],
)
def test_ran_for_is_the_later_of_the_kernels_and_the_engines_start(
    monkeypatch: pytest.MonkeyPatch, ago: float | str, expect: float | None
) -> None:
    import os

    from orchestrator import procutil
    from orchestrator.backends.container import readiness

    monkeypatch.setattr(readiness, "runs_here", lambda got: True)
    started_at = _started(ago) if isinstance(ago, float) else ago  # (now: not at collection)
    began = int(procutil.stat_fields(1)[19]) / os.sysconf("SC_CLK_TCK")
    kernel = time.clock_gettime(time.CLOCK_BOOTTIME) - began  # (pid 1: long running)
    got = readiness.ran_for({"State": {"Pid": 1, "StartedAt": started_at}})
    assert got is not None
    assert got == pytest.approx(kernel if expect is None else expect, abs=0.25)
