"""leavekeys.py: Ctrl-P Ctrl-Q found however our stdin's reads cut them, never passed on;
a Ctrl-P alone passed on with the key after it."""

from __future__ import annotations

from orchestrator.leavekeys import Watch


def test_the_keys_are_found_across_reads_and_never_passed_on() -> None:
    watch = Watch()
    assert watch.feed(b"ls\r") == (b"ls\r", False)
    assert watch.feed(b"x\x10") == (b"x", False)  # (a Ctrl-P waits for the next key)
    assert watch.feed(b"\x11tail") == (b"", True)
    assert Watch().feed(b"ab\x10\x11cd") == (b"ab", True)


def test_a_ctrl_p_alone_is_passed_on_with_the_next_key() -> None:
    watch = Watch()
    assert watch.feed(b"\x10") == (b"", False)
    assert watch.feed(b"\x10") == (b"\x10", False)
    assert watch.feed(b"p") == (b"\x10p", False)
    assert watch.feed(b"\x11") == (b"\x11", False)
