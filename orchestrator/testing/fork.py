"""The fork profile: `orchestrator.fork(rt, n)` (`AsyncRuntime.fork(n)` through the async
door) makes `n` copies of a running environment, each under its
own id, from its files as they are now, and with its running processes and memory where the
backend can. `from orchestrator.testing.fork import *` in a test module with a
`conformance_target` fixture runs these checks:

- the copies carry the workspace, are apart from each other and from the original, which
  runs on untouched;
- with memory: a process running in the original runs on in each copy, from where it was,
  on its own. A backend (or configuration) that cannot lists the rule "fork-memory": the
  profile checks that `fork(memory=True)` is refused with a UsageError, then skips.

A backend that cannot suspend (rule "suspend") cannot fork either: the profile checks the
refusal, then skips."""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

import pytest

from orchestrator import Runtime, UsageError, fork
from orchestrator.testing.door import RuntimeDoor
from orchestrator.testing.target import Target

__all__ = [
    "test_fork_copies_apart_and_leaves_the_original",
    "test_fork_with_memory_carries_a_running_process",
]

COUNTER = (
    "echo $$ > /tmp/fork.pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/fork.part &&"
    " mv /tmp/fork.part /tmp/fork.count; sleep 0.05; done"
)


def _fork(rt: Runtime, n: int, *, memory: bool | None = None) -> list[Runtime]:
    """The copies, through the door the target's runtime came from."""
    if isinstance(rt, RuntimeDoor):
        return cast(list[Runtime], rt.fork(n, memory=memory))
    return fork(rt, n, memory=memory)


def _count(rt: Runtime) -> int:
    return int(rt.execute("cat /tmp/fork.count", check=True).stdout)


def _grows(rt: Runtime, within: float = 10) -> bool:
    seen, deadline = _count(rt), time.monotonic() + within
    while time.monotonic() < deadline:
        if _count(rt) > seen:
            return True
        time.sleep(0.05)
    return False


def _no_fork(target: Target, folder: Path) -> None:
    reason = target.deviation("suspend")
    if not reason:
        return
    with target.spawn(folder) as rt, target.environment():
        with pytest.raises(UsageError):
            _fork(rt, 1)
        assert rt.execute("true").ok  # it runs on
    pytest.skip(f"{target.id} deviates from 'suspend' (and so cannot fork): {reason}")


def test_fork_copies_apart_and_leaves_the_original(
    conformance_target: Target, tmp_path: Path
) -> None:
    _no_fork(conformance_target, tmp_path)
    with conformance_target.spawn(tmp_path) as rt:
        rt.write_file("sub/kept.txt", "kept\n")
        with conformance_target.environment():  # (what the target's caller allows)
            copies = _fork(rt, 2)
        try:
            assert len({rt.info().id, *(c.info().id for c in copies)}) == 3
            for n, copy in enumerate(copies):
                assert copy.read_file("sub/kept.txt") == "kept\n"
                copy.write_file("sub/kept.txt", f"copy {n}\n")
            assert [c.read_file("sub/kept.txt") for c in copies] == ["copy 0\n", "copy 1\n"]
            assert rt.read_file("sub/kept.txt") == "kept\n"
        finally:
            for copy in copies:
                copy.cleanup()


def test_fork_with_memory_carries_a_running_process(
    conformance_target: Target, tmp_path: Path
) -> None:
    _no_fork(conformance_target, tmp_path)
    with conformance_target.spawn(tmp_path) as rt:
        why = rt.memory_refusal()
        if why is not None:
            reason = conformance_target.deviation("fork-memory")
            assert reason, f"{conformance_target.id} keeps no memory, unlisted: {why}"
            with conformance_target.environment(), pytest.raises(UsageError):
                _fork(rt, 1, memory=True)
            pytest.skip(f"{conformance_target.id} deviates from 'fork-memory': {reason}")
        rt.execute(f"sh -c '{COUNTER}' >/dev/null 2>&1 &", check=True)
        deadline = time.monotonic() + 20
        while rt.execute("test -s /tmp/fork.count").exit_code != 0:
            assert time.monotonic() < deadline, "the counter did not start"
            time.sleep(0.05)
        before = _count(rt)
        with conformance_target.environment():
            copies = _fork(rt, 2, memory=True)
        try:
            for copy in copies:
                assert _count(copy) >= before  # on from where it was, not from the start
                assert _grows(copy)  # the process runs on in it
            copies[0].execute("kill $(cat /tmp/fork.pid)", check=True)
            time.sleep(0.3)
            assert not _grows(copies[0], within=1.0)  # that one is gone from it alone
            assert _grows(copies[1]) and _grows(rt)  # the others run on, apart
        finally:
            for copy in copies:
                copy.cleanup()
