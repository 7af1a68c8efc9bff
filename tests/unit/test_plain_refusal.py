"""The plain path's words for what the engine would not start: said as the executor says them
(`engine.exec_refusal`, where engine text is read), runc's and runsc's alike."""

from __future__ import annotations

import pytest

from orchestrator.backends.container.engine import exec_refusal


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        (  # runc
            b"OCI runtime exec failed: exec failed: unable to start container process: chdir to"
            b' cwd ("/w/x") set in config.json failed: no such file or directory: unknown\r\n',
            (2, b"cannot change directory to /w/x: No such file or directory\n"),
        ),
        (  # runsc (gVisor)
            b'OCI runtime exec failed: executing processes for container: executing command "t"'
            b' in sandbox: failed to find initial working directory "/w/f/s": not a directory:'
            b" unknown: Are you trying to mount a directory onto a file (or vice-versa)?\r\n",
            (2, b"cannot change directory to /w/f/s: Not a directory\n"),
        ),
        (
            b"unable to find user x: no matching entries in passwd file\r\n",
            (126, b"unable to find user x: no matching entries in passwd file\n"),
        ),
    ],
    ids=["runc-cwd", "runsc-cwd", "user"],
)
def test_the_engines_refusal_is_said_as_the_executor_says_it(
    said: bytes, expected: tuple[int, bytes]
) -> None:
    assert exec_refusal(said, 126) == expected
