"""The meeting that moves an executor's frames onto a socket (executor/direct.py), played here
by this process on both sides: the executor's answer on a pipe and its connection. The
socket is mode 0, so only root connects: these tests run as root (CI does)."""

from __future__ import annotations

import io
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.backends.container.executor import direct, wire

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the meeting's socket is mode 0: only root may connect to it"
)


Pipe = Callable[..., tuple[io.FileIO, int]]


@pytest.fixture
def meeting(tmp_path: Path) -> Iterator[direct.Meeting]:
    folder = tmp_path / "io"
    folder.mkdir(mode=0o700)
    m = direct.Meeting(folder, str(folder))  # "inside" is the same folder here
    try:
        yield m
    finally:
        m.close()
    assert os.listdir(folder) == []  # its name left the folder, whatever happened


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    """The executor's output: a pipe holding the frames given, its write end kept open
    (an executor that says nothing more) unless `ended`."""
    kept: list[int] = []
    files: list[io.FileIO] = []

    def make(*frames: bytes, ended: bool = False) -> tuple[io.FileIO, int]:
        r, w = os.pipe()
        for frame in frames:
            os.write(w, frame)
        if ended:
            os.close(w)
        else:
            kept.append(w)
        files.append(io.FileIO(r, "rb"))
        return files[-1], w

    yield make
    for fd in kept:
        os.close(fd)
    for f in files:
        f.close()


def _connect(m: direct.Meeting, token: bytes, then: bytes = b"") -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(m.inside)
    if token or then:
        s.sendall(token + then)
    return s


def _switch_once_told(s: socket.socket, w: int) -> threading.Thread:
    """The executor's part: once the host says it took the connection, SWITCHED."""

    def wait() -> None:
        s.settimeout(10)
        if s.recv(1) == b"\1":
            os.write(w, wire.pack(wire.SWITCHED, 0))

    t = threading.Thread(target=wait)
    t.start()
    return t


def test_the_socket_is_mode_0_in_the_folder_and_the_connection_with_the_token_is_taken(
    meeting: direct.Meeting, pipe: Pipe
) -> None:
    assert stat.S_IMODE(os.lstat(meeting.inside).st_mode) == 0
    out, w = pipe()
    wrong = [_connect(meeting, os.urandom(direct.TOKEN_BYTES)) for _ in range(3)]
    silent = [_connect(meeting, b"") for _ in range(3)]
    short = _connect(meeting, meeting.token[:-1])  # one byte short, then closed
    short.close()
    right = _connect(meeting, meeting.token, b"hello")
    told = _switch_once_told(right, w)
    got = meeting.meet(out)
    told.join()
    assert isinstance(got, socket.socket)
    assert got.recv(5) == b"hello"
    for s in wrong:  # each was let go
        s.settimeout(2)
        assert s.recv(1) == b""
    for s in [*wrong, *silent, right, got]:
        s.close()


def test_a_flood_of_silent_connections_does_not_keep_the_executor_out(
    meeting: direct.Meeting, pipe: Pipe
) -> None:
    out, w = pipe()
    held: list[socket.socket] = []
    sockets: list[socket.socket] = []

    def flood_then_connect() -> None:  # while the meeting runs, as a root sandbox could
        for _ in range(direct.PENDING * 4):
            held.append(_connect(meeting, b""))
        sockets.append(_connect(meeting, meeting.token, b"x"))
        _switch_once_told(sockets[0], w).join()

    t = threading.Thread(target=flood_then_connect)
    t.start()
    got = meeting.meet(out)
    t.join()
    [right] = sockets
    assert isinstance(got, socket.socket) and got.recv(1) == b"x"
    for s in [*held, right, got]:
        s.close()


def test_an_executor_that_cannot_connect_says_why_and_the_pipes_stay(
    meeting: direct.Meeting, pipe: Pipe
) -> None:
    out, _ = pipe(wire.pack(wire.NOT_SWITCHED, 0, b"[Errno 13] Permission denied"))
    assert meeting.meet(out) == "[Errno 13] Permission denied"


def test_an_executor_that_says_it_switched_before_it_was_told_is_broken(
    meeting: direct.Meeting, pipe: Pipe
) -> None:
    out, _ = pipe(wire.pack(wire.SWITCHED, 0))
    impostor = _connect(meeting, b"\0" * direct.TOKEN_BYTES)
    with pytest.raises(direct.Broken, match="a frame of kind 17"):
        meeting.meet(out)
    impostor.close()


def test_an_executor_told_that_never_switches_is_broken_in_time_and_released(
    meeting: direct.Meeting, monkeypatch: pytest.MonkeyPatch, pipe: Pipe
) -> None:
    """Told, it has its own bound (SWITCH_WITHIN); given up on, it finds RELEASE where it
    reads from then on, so an owned executor that switched late does not take the end of
    that connection for its owner's death and stop the sandbox."""
    monkeypatch.setattr(direct, "MEET_WITHIN", 0.5)
    monkeypatch.setattr(direct, "SWITCH_WITHIN", 0.5)
    out, _ = pipe()
    right = _connect(meeting, meeting.token)
    started = time.monotonic()
    with pytest.raises(direct.Broken, match="did not switch"):
        meeting.meet(out)
    meeting.close()
    assert time.monotonic() - started < 3 and right.recv(1) == b"\1"
    right.settimeout(5)
    assert wire.read_frame(right.makefile("rb")) == (wire.RELEASE, 0, b"")
    right.close()


def test_no_answer_in_time_leaves_the_pipes_and_nothing_to_connect_to(
    meeting: direct.Meeting, monkeypatch: pytest.MonkeyPatch, pipe: Pipe
) -> None:
    """A sandbox paused (or slow) as it was asked: the pipes stay, and an executor that
    then connects finds nothing and stays on them too."""
    monkeypatch.setattr(direct, "MEET_WITHIN", 0.5)
    out, _ = pipe()
    assert meeting.meet(out) == "no answer in time"
    meeting.close()
    late = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with pytest.raises(OSError):
        late.connect(meeting.inside)
    late.close()


@pytest.mark.parametrize(
    ("frames", "expect"),
    [
        ([wire.pack(wire.OUT, 1, b"x")], "a frame of kind 11"),
        ([wire.pack(wire.READY, 0, b"{}")], "a frame of kind 10"),
    ],
)
def test_any_other_answer_or_none_is_broken(
    meeting: direct.Meeting,
    monkeypatch: pytest.MonkeyPatch,
    pipe: Pipe,
    frames: list[bytes],
    expect: str,
) -> None:
    monkeypatch.setattr(direct, "MEET_WITHIN", 0.5)
    out, _ = pipe(*frames)
    with pytest.raises(direct.Broken, match=expect):
        meeting.meet(out)


def test_an_executor_gone_mid_meeting_is_an_end_not_a_fault(
    meeting: direct.Meeting, pipe: Pipe
) -> None:
    out, _ = pipe(ended=True)
    assert meeting.meet(out) is None


def test_a_folder_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(OSError):
        direct.Meeting(tmp_path / "link", "/x")
    assert os.listdir(real) == []
