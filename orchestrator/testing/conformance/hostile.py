"""The conformance checks of hostile input: no request hangs, no deadline slips, and a request
no process could take is a usage error."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from orchestrator import Runtime
from orchestrator.errors import (
    UsageError,
)


# ----- hostile input: no request hangs, no deadline slips ------------------------------------
def test_timeout_holds_after_the_command_closes_its_pipes(rt: Runtime) -> None:
    started = time.monotonic()
    r = rt.execute("exec >/dev/null 2>&1; sleep 40", timeout=2)
    assert r.timed_out and time.monotonic() - started < 2 + 3


def test_deadline_holds_while_the_consumer_is_not_reading(rt: Runtime) -> None:
    late = f"late-{uuid.uuid4().hex[:8]}"
    stream = rt.stream(f"(sleep 3; touch {late}) & while :; do echo x; done", timeout=1.5)
    assert next(stream).kind == "stdout"
    time.sleep(4.5)  # not reading: the command blocks on its full pipe, the deadline passes
    events = list(stream)
    assert events[-1].result is not None and events[-1].result.timed_out
    assert rt.execute(f"test -e {late}").exit_code == 1  # killed at 1.5 s, not at 4.5 s


def test_a_stalled_stream_stalls_only_its_own_command(rt: Runtime) -> None:
    stream = rt.stream("yes spam", timeout=60)
    assert next(stream).kind == "stdout"  # then stop reading: it may fill only its own window
    try:
        time.sleep(1)
        started = time.monotonic()
        assert rt.execute("echo other", timeout=10).stdout == "other\n"
        assert time.monotonic() - started < 5
    finally:
        stream.close()


def test_unknown_user_is_exit_126_naming_the_user(rt: Runtime) -> None:
    r = rt.execute("id", user="no-such-user", timeout=10)
    assert r.exit_code == 126 and "no-such-user" in r.stderr
    assert rt.execute("echo fine").stdout == "fine\n"


@pytest.mark.parametrize(
    "call",
    [
        {"command": ["echo", "a\0b"]},
        {"command": "true", "env": {"A=B": "1"}},
        {"command": "true", "env": {"": "1"}},
        {"command": "true", "env": {"A": "x\0y"}},
        {"command": "true", "user": "a b"},
        {"command": "true", "timeout": float("nan")},
    ],
)
def test_requests_no_process_could_take_are_usage_errors(rt: Runtime, call: dict[str, Any]) -> None:
    started = time.monotonic()
    with pytest.raises(UsageError):
        rt.execute(**call)
    assert time.monotonic() - started < 1
    assert rt.execute("echo fine", timeout=10).stdout == "fine\n"
