"""The plain path's own words: its exit line (`plain._ExitMark`), found and taken out of the
command's stderr however the chunks cut it, and nothing else taken for it; and the engine's
refusals said as the executor says them (`plain._refusal`)."""

from __future__ import annotations

import pytest

from orchestrator.backends.container.executor.plain import EXITED, _ExitMark, _refusal

LINE = EXITED + b"3\n"


def fed(chunks: list[bytes]) -> tuple[bytes, int | None]:
    mark = _ExitMark()
    passed = b"".join(mark.feed(c) for c in chunks) + mark.rest()
    return passed, mark.code


@pytest.mark.parametrize("cut", range(1, len(b"err\n" + LINE)))
def test_the_line_is_found_wherever_the_chunks_cut_it(cut: int) -> None:
    whole = b"err\n" + LINE
    assert fed([whole[:cut], whole[cut:]]) == (b"err\n", 3)


def test_what_a_background_process_writes_after_it_passes_on() -> None:
    assert fed([b"a" + LINE + b"late\n", b"later\n" + LINE]) == (b"alate\nlater\n" + LINE, 3)


@pytest.mark.parametrize(
    "text",
    [
        b"orchestrator-exit:0\n",  # without the control characters: a command's own words
        EXITED + b"x\n",
        EXITED + b"1234\n",
        EXITED[:5],  # the start of it, and the command's output ended there
        b"\x1e",
    ],
)
def test_anything_else_is_the_commands_own_stderr(text: bytes) -> None:
    assert fed([b"e", text]) == (b"e" + text, None)


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
    assert _refusal(said, 126) == expected
