"""How a container's channel (backends/container/channel.py) reads an executor that never
greeted: an image without the executor's Python (plain `docker exec` from then on), or a
container that died as it started (the start fails), which a loaded engine records as
stopped only a moment after the executor went down with it."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from orchestrator.backends.container import channel as channel_mod
from orchestrator.errors import SandboxUnavailable


class Target:
    """An exec target whose "executor" is a local process that exits at once, printing
    `said` on stderr (nothing: as one killed with its container)."""

    def __init__(self, said: str) -> None:
        self.said = said

    def argv(self, command: list[str], **_: Any) -> list[str]:
        code = (
            f"import sys; sys.stderr.write({self.said!r}); sys.exit(126 if {self.said!r} else 137)"
        )
        return [sys.executable, "-c", code]


class Engine:
    def __init__(self, said: str) -> None:
        self.target = Target(said)

    def exec_target(self, container: str) -> Target:
        return self.target


def make(
    said: str, *, stops_after: int, running: bool
) -> tuple[channel_mod.Channel, list[int], list[str]]:
    """A channel whose container the engine reads as running for `stops_after` looks, and
    then as stopped; `running`: whether it visibly runs on. Also the looks made, and the
    warnings given."""
    looks: list[int] = []
    warned: list[str] = []

    def lost() -> SandboxUnavailable | None:
        looks.append(1)
        if len(looks) > stops_after:
            return SandboxUnavailable("main is not running (exited, exit code 1)")
        return None

    ch = channel_mod.Channel(
        label="t",
        engine=Engine(said),  # type: ignore[arg-type]
        container="t-main-1",
        mode="auto",
        owned=False,
        lost=lost,
        killed=lambda: False,
        running=lambda: running,
        warn=warned.append,
    )
    return ch, looks, warned


def test_a_container_the_engine_records_as_stopped_late_fails_the_start() -> None:
    """CI, once: the sandbox's first process exited at once, the executor went down with it
    saying nothing, and the engine still read the container as running at its one look:
    the start went on to plain `docker exec` and returned an environment that was dead."""
    ch, looks, warned = make("", stops_after=3, running=False)
    with pytest.raises(SandboxUnavailable, match="not running"):
        ch.ready()
    assert len(looks) == 4 and warned == []


@pytest.mark.parametrize(
    "said",
    ["", 'exec: "python3": executable file not found in $PATH: unknown'],
    ids=["silent-but-visibly-running", "no-python"],
)
def test_an_image_without_the_executor_goes_plain_at_once(said: str) -> None:
    """A container that visibly runs on, or an exec refused for a reason of the image's, is
    looked at once: no wait on every start of an image without Python."""
    ch, looks, warned = make(said, stops_after=10, running=not said)
    assert ch.ready() is None
    assert ch.mode == "plain" and len(looks) == 1
    assert len(warned) == 1 and "falling back to plain" in warned[0]


@pytest.mark.parametrize(
    "said",
    [
        "OCI runtime exec failed: exec failed: cannot exec in a stopped container: unknown",
        "Could not find platform independent libraries <prefix>",  # (a python3's warning)
    ],
    ids=["runc-stopping", "a-warning"],
)
def test_an_executor_that_said_something_else_is_asked_about_again(said: str) -> None:
    """Only the engine's words for an image without python3 go plain at once (a hostile
    review: a dying container whose python3 printed a warning was taken for a live one)."""
    ch, looks, _ = make(said, stops_after=2, running=False)
    with pytest.raises(SandboxUnavailable):
        ch.ready()
    assert len(looks) == 3


def test_callers_waiting_together_ask_the_engine_once_for_all() -> None:
    """Where this machine cannot see the container (a Swarm, an engine in a VM), each of
    fifty callers polled the engine for two seconds on its own (a hostile review: 1,050
    looks); the verdict is now asked once and handed to each."""
    import threading

    ch, looks, _ = make("", stops_after=3, running=False)
    got: list[BaseException] = []

    def one() -> None:
        try:
            ch.ready()
        except SandboxUnavailable as exc:
            got.append(exc)

    callers = [threading.Thread(target=one) for _ in range(20)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(30)
    assert len(got) == 20
    assert len(looks) <= 4 * 3, len(looks)  # (a few rounds at most, as callers come in turns)


def test_a_first_caller_interrupted_leaves_the_others_to_ask_on_their_own() -> None:
    """A Ctrl-C in the thread that asks for the verdict went to every thread waiting on it
    (a review: a KeyboardInterrupt in an asyncio worker stops the loop)."""
    import threading

    from orchestrator.sandbox.threads import SingleFlight

    flight = SingleFlight()
    entered, release = threading.Event(), threading.Event()

    def interrupted() -> int:
        entered.set()
        release.wait(10)
        raise KeyboardInterrupt

    got: list[object] = []

    def first() -> None:
        try:
            flight.blocking(interrupted)
        except KeyboardInterrupt:
            got.append("interrupted")

    one = threading.Thread(target=first)
    one.start()
    entered.wait(10)
    two = threading.Thread(target=lambda: got.append(flight.blocking(lambda: 7)))
    two.start()
    time.sleep(0.3)  # (it waits on the first's verdict)
    release.set()
    one.join(10)
    two.join(10)
    assert sorted(map(str, got)) == ["7", "interrupted"]


class Greeter(Target):
    """An exec target whose executor says nothing for `silent` seconds, then greets (and
    runs until its input ends): an executor slow to start on a loaded machine."""

    def __init__(self, silent: float) -> None:
        self.silent = silent

    def argv(self, command: list[str], **_: Any) -> list[str]:
        from orchestrator.backends.container.executor import wire

        greeting = wire.HEADER.pack(wire.READY, 0, 2) + b"{}"
        code = (
            f"import sys, time; time.sleep({self.silent}); "
            f"sys.stdout.buffer.write({greeting!r}); sys.stdout.flush(); sys.stdin.read()"
        )
        return [sys.executable, "-c", code]


def slow(
    silent: float, *, running: bool, monkeypatch: pytest.MonkeyPatch, most: float
) -> tuple[channel_mod.Channel, list[str]]:
    monkeypatch.setattr(channel_mod, "READY_TIMEOUT", 0.3)
    monkeypatch.setattr(channel_mod, "READY_MOST", most)
    ch, _, warned = make("", stops_after=10 if running else 0, running=running)
    ch._engine.target = Greeter(silent)  # type: ignore[attr-defined]
    return ch, warned


def test_an_executor_slow_to_greet_in_a_running_container_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI, once: on a loaded machine an executor took over READY_TIMEOUT to greet; the channel
    went plain for good, and a terminal (which needs the executor) failed with exit 2."""
    ch, warned = slow(1.5, running=True, monkeypatch=monkeypatch, most=20)
    try:
        assert ch.ready() is not None
        assert ch.mode == "executor" and warned == []
    finally:
        ch.close()


def test_an_executor_silent_past_the_longest_wait_goes_plain_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The longer wait has its own bound: one that never greets (a python3 that hangs) goes
    plain once READY_MOST has passed, saying how long it waited."""
    ch, warned = slow(60, running=True, monkeypatch=monkeypatch, most=1.5)
    began = time.monotonic()
    assert ch.ready() is None
    assert 1.4 < time.monotonic() - began < 10
    assert ch.mode == "plain" and "no answer within 2 s" in warned[0], warned


def test_a_silent_executor_of_a_stopped_container_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The longer wait is only for a container that runs: one that stopped fails its start
    after READY_TIMEOUT (and the engine's few looks), not after READY_MOST."""
    ch, warned = slow(60, running=False, monkeypatch=monkeypatch, most=60)
    began = time.monotonic()
    with pytest.raises(SandboxUnavailable):
        ch.ready()
    assert time.monotonic() - began < 10 and warned == []


def test_a_command_s_own_timeout_sends_it_plain_and_leaves_the_executor_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hostile reviews: the longer wait ignored the caller's timeout (a `timeout=10` call
    took 60 s); then one caller's short timeout closed the executor others waited for and
    sent the whole channel plain for good (no terminal after). Now that command alone goes
    plain, and the executor starts on for the next."""
    ch, warned = slow(1.5, running=True, monkeypatch=monkeypatch, most=20)
    try:
        began = time.monotonic()
        assert ch.ready(0.5) is None
        modes: list[str] = [ch.mode]
        assert time.monotonic() - began < 1.4 and modes == ["auto"] and warned == []
        assert ch.ready() is not None
        modes.append(ch.mode)
        assert modes == ["auto", "executor"] and warned == []
    finally:
        ch.close()


def test_callers_with_other_timeouts_share_one_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller without a timeout and one with a short one, together: the short one goes
    plain, the other gets the executor once it greets, alive, and nothing is said."""
    import threading

    ch, warned = slow(1.5, running=True, monkeypatch=monkeypatch, most=20)
    got: dict[str, object] = {}
    callers = [
        threading.Thread(target=lambda: got.setdefault("long", ch.ready())),
        threading.Thread(target=lambda: got.setdefault("short", ch.ready(0.4))),
    ]
    try:
        for t in callers:
            t.start()
        for t in callers:
            t.join(30)
        long = got["long"]
        assert got["short"] is None and long is not None and long.alive  # type: ignore[attr-defined]
        assert ch.mode == "executor" and warned == []
    finally:
        ch.close()


def test_an_executor_started_again_after_it_worked_gets_no_longer_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A root sandbox can kill its executor and make python3 hang: every later command
    would wait READY_MOST for a new one. Only a channel's first executor is waited for
    (and the first after the channel closed it itself: a restore's)."""
    from orchestrator.errors import ExecutorLost

    ch, _ = slow(60, running=True, monkeypatch=monkeypatch, most=20)
    ch._greeted, ch.mode = True, "executor"
    began = time.monotonic()
    with pytest.raises(ExecutorLost):
        ch.ready()
    assert time.monotonic() - began < 5
    ch._greeted = True
    ch.close()
    assert not ch._greeted


def test_a_container_paused_meanwhile_ends_the_longer_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A paused container still reads as running: the longer wait looks whether it is
    paused (or gone) every READY_LOOK seconds, and says so at once."""
    from orchestrator.errors import SandboxPaused

    monkeypatch.setattr(channel_mod, "READY_LOOK", 0.2)
    ch, _ = slow(60, running=True, monkeypatch=monkeypatch, most=20)
    ch._lost = lambda: SandboxPaused("main is paused")
    began = time.monotonic()
    with pytest.raises(SandboxPaused):
        ch.ready()
    assert time.monotonic() - began < 5
