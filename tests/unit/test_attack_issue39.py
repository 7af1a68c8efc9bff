"""The bounds of a started process's handles (sandbox/live.py), alone: what a caller asks
before the command runs is held once per signal, never once per call; nothing is sent once
it ended; a writer to a command that reads nothing waits within its bound, and is told once
the command is gone; the feeder of its input ends with it."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from orchestrator import spawn_runtime
from orchestrator.errors import ProcessEnded, UsageError
from orchestrator.sandbox.live import DEPTH, Control, LiveInput

ROOT = Path(__file__).resolve().parents[2]


def test_signals_before_the_start_are_held_once_each_and_kills_once() -> None:
    control, sent, killed = Control(), list[int](), list[int]()
    for _ in range(10000):
        control.signal(signal.SIGWINCH)
        control.signal(signal.SIGUSR1)
    control.kill()
    control.bind(sent.append, lambda: killed.append(1))
    assert (sent, killed) == ([signal.SIGWINCH, signal.SIGUSR1], [1])
    control.signal(signal.SIGINT)
    assert sent[-1] == signal.SIGINT


def test_nothing_is_sent_once_the_command_ended() -> None:
    control, sent = Control(), list[int]()
    control.bind(sent.append, lambda: sent.append(-1))
    control.unbind()
    control.signal(signal.SIGTERM)
    control.kill()
    control.bind(sent.append, lambda: sent.append(-1))  # a late bind: nothing either
    control.signal(signal.SIGTERM)
    assert sent == []


@pytest.mark.parametrize("bad", [0, -9, 100000, "TERM", 2.0, True, None])
def test_a_signal_that_is_none_is_refused(bad: object) -> None:
    with pytest.raises(UsageError):
        Control().signal(bad)  # type: ignore[arg-type]


def test_a_writer_waits_within_its_bound_and_is_told_when_the_command_is_gone() -> None:
    stdin = LiveInput()
    for _ in range(DEPTH):
        stdin.put(b"x")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        stdin.put(b"one too many", timeout=0.3)
    assert time.monotonic() - started < 5
    assert stdin.offer(b"no room") is False
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            stdin.put(b"waiting")
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=blocked)
    writer.start()
    time.sleep(0.2)
    stdin.gone()
    writer.join(5)
    assert not writer.is_alive() and isinstance(errors[0], ProcessEnded)
    with pytest.raises(ProcessEnded):
        stdin.offer(b"late")


def test_the_feeder_ends_with_the_command_or_the_close() -> None:
    stdin = LiveInput()
    stdin.put(b"a")
    stdin.close()
    stdin.close()
    assert list(stdin) == [b"a"]
    with pytest.raises(ProcessEnded):
        stdin.put(b"after close")
    open_one = LiveInput()
    got: list[list[bytes]] = []
    feeder = threading.Thread(target=lambda: got.append(list(open_one)))
    feeder.start()
    time.sleep(0.2)
    open_one.gone()  # never closed: the command ended
    feeder.join(5)
    assert not feeder.is_alive() and got == [[]]


def test_closing_a_full_input_never_waits_and_loses_nothing_written() -> None:
    stdin = LiveInput()
    for i in range(DEPTH):
        stdin.put(bytes([i]))
    started = time.monotonic()
    stdin.close()  # no room for the end: it is found once the rest is taken
    assert time.monotonic() - started < 0.5
    assert list(stdin) == [bytes([i]) for i in range(DEPTH)]


def test_a_wait_that_times_out_keeps_a_drop_of_the_output(tmp_path: Path) -> None:
    """After `drop_unread`, a `wait` that times out leaves the output dropped: the process
    runs to its end unread (its output no longer waits for a reader), with or without a
    later wait."""
    with spawn_runtime(ROOT / "environments" / "local.yaml", workspace=tmp_path) as rt:
        proc = rt.start("sleep 0.5; head -c 50000000 /dev/zero", stdin=False, timeout=60)
        proc.drop_unread()
        with pytest.raises(TimeoutError):
            proc.wait(0.2)
        deadline = time.monotonic() + 30
        while not proc.ended and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.ended
        assert proc.wait(1).exit_code == 0
