"""The executor's framed protocol. Standard library only (copied into containers).

A frame is a 9-byte header (kind, command id, payload length; big-endian) and the payload.
Host -> executor: RUN (JSON request), STDIN (bytes), STDIN_EOF, KILL, CREDIT (4-byte count:
that many more output frames of this command may be sent), PING, OWN (the host took the
greeting of an executor started with --owned: from now on the end of its input means the
owner died), RELEASE (the host closes this executor on purpose: its end of input does not
mean the owner died, and a later OWN does not change that), SIGNAL (4-byte
signal number, for the command's process group: a started process's `signal`), RESIZE
(two 2-byte numbers, columns and rows: the command's terminal's new size), DIRECT (JSON:
the path of a socket the host listens on and the token to show it; only before the first
RUN: see `direct.py`).
Executor -> host: READY (JSON), OUT / ERR (bytes), EXIT (JSON outcome), PONG, TAKEN (4-byte
count: that many STDIN frames of this command were written to it; a started process's
input is sent at most STDIN_WINDOW frames ahead of what it took), SWITCHED (the answer to
DIRECT: every later frame, both ways, goes over that socket) or NOT_SWITCHED (why not; the
pipes stay).
Kept processes (a resident's sessions only: see kept.py): RUN with `keep` set starts one
that outlives its connection; ATTACH (host -> executor, JSON: its `id` and a `cursor`, the
offset in its output to go on from) makes a new connection one of its readers. Executor ->
host: AT (8-byte offset: where this reader starts, the first frame after ATTACH: the cursor
asked for, or the output's end if that was past it), LOST (8-byte count: output bytes
dropped from the scrollback before this reader got them) and GONE (no kept process has
that id).

The two JSON payloads, RUN's request and EXIT's outcome, are encoded and decoded only here,
so both sides spell their keys alike.

Flow control is per command: the executor sends at most WINDOW output frames of a command
beyond what the host has credited back, so a consumer that stops reading stalls only its own
command, never the shared pipe. The host holds the executor to it (the executor runs the
image's python3, which a root sandbox may replace): more output than that, or a frame larger
than the host accepts, ends the executor.
"""

from __future__ import annotations

import collections
import json
import re
import struct

TYPE_CHECKING = False  # (as typing's; typing is not loaded at run time: see endpoint.py)
if TYPE_CHECKING:
    from typing import IO, Any, Dict, List, NamedTuple, Optional, Tuple

    Frame = Tuple[int, int, bytes]

    class Request(NamedTuple):
        """What RUN asks for."""

        argv: List[str]
        env: Dict[str, str]
        cwd: Optional[str]
        user: Optional[str]
        timeout: Optional[float]
        stdin: bool
        """True when STDIN frames (and a STDIN_EOF) follow; else the command reads nothing."""
        stdout_fifo: Optional[str] = None
        """A FIFO the executor opens itself (as root) and gives the command as its standard
        output; nobody else in the sandbox may open it (mode 0). Exit NO_FIFO, before anything
        runs, where it cannot be opened."""
        stdin_fifo: Optional[str] = None
        """Likewise, a FIFO given the command as its standard input."""
        tty: Optional[List[int]] = None
        """[columns, rows]: run it on a terminal of its own that size (procutil.tty): its output
        one stream, its STDIN typed into the terminal; RESIZE changes the size."""
        keep: Optional[str] = None
        """The id (KEEP_ID) of a kept process: it outlives this connection (see kept.py)."""

    class Exit(NamedTuple):
        """What EXIT reports."""

        exit_code: int
        timed_out: bool
        elapsed: float
        oom_killed: bool = False
        unavailable: str = ""
        """Set when the sandbox could not start the command at all (why, in words)."""

else:  # the same tuples, by collections (held equal by tests/unit/test_wire.py)
    Request = collections.namedtuple(
        "Request",
        "argv env cwd user timeout stdin stdout_fifo stdin_fifo tty keep",
        defaults=(None, None, None, None),
    )
    Exit = collections.namedtuple(
        "Exit", "exit_code timed_out elapsed oom_killed unavailable", defaults=(False, "")
    )

HEADER = struct.Struct(">BII")
RUN, STDIN, STDIN_EOF, KILL, CREDIT, PING, RELEASE, SIGNAL, RESIZE = 1, 2, 3, 4, 5, 6, 7, 8, 9
READY, OUT, ERR, EXIT, PONG, TAKEN = 10, 11, 12, 13, 14, 15
DIRECT, SWITCHED, NOT_SWITCHED = 16, 17, 18
ATTACH, LOST, GONE, AT = 19, 20, 21, 22
OWN = 23
MAX_PAYLOAD = 64 * 1024 * 1024
WINDOW = 64
"""Output frames (of at most procutil.CHUNK bytes each) in flight per command before credit
is needed."""
COUNT = struct.Struct(">I")
OFFSET = struct.Struct(">Q")
"""LOST's payload (bytes dropped) and AT's (where a reader starts)."""
SIZE = struct.Struct(">HH")
"""RESIZE's payload: columns, rows."""
STDIN_WINDOW = 8
"""STDIN frames (of at most STDIN_CHUNK bytes each) of a started process in flight before the
executor says it wrote them to the command: a command that reads nothing holds at most
that much of its input in the executor, and its writer waits."""
NO_FIFO = 98
"""Exit status of a command whose FIFO the executor could not open (nothing ran)."""


def pack(kind: int, cid: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, cid, len(payload)) + payload


def _read_exact(stream: IO[bytes], n: int) -> Optional[bytes]:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        count = stream.readinto(view[got:])  # type: ignore[attr-defined]
        if not count:
            return None
        got += count
    return bytes(buf)


class BadFrame(ValueError):
    """A frame header claiming a payload larger than the reader accepts."""


def read_frame(stream: IO[bytes], limit: int = MAX_PAYLOAD) -> Optional[Frame]:
    """The next frame, or None at end of stream (or a frame cut short). A header claiming
    more than `limit` bytes raises BadFrame before anything is allocated for it."""
    head = _read_exact(stream, HEADER.size)
    if head is None:
        return None
    kind, cid, size = HEADER.unpack(head)
    if size > limit:
        raise BadFrame("a frame of %d bytes (at most %d accepted)" % (size, limit))
    payload = _read_exact(stream, size) if size else b""
    if payload is None:
        return None
    return kind, cid, payload


def encode_request(req: Request) -> bytes:
    return json.dumps(req._asdict()).encode()


def decode_request(payload: bytes) -> Request:
    """Raises ValueError (JSON, a missing or mistyped field) for a request it cannot take."""
    data = json.loads(payload.decode())
    if not isinstance(data, dict):
        raise ValueError("the request is not an object")
    try:
        req = Request(**data)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(req.argv, list) or not req.argv:
        raise ValueError("argv must be a non-empty list")
    if req.tty is not None and not (
        isinstance(req.tty, list) and len(req.tty) == 2 and all(type(n) is int for n in req.tty)
    ):
        raise ValueError("tty must be [columns, rows]")
    if req.keep is not None and not (isinstance(req.keep, str) and KEEP_ID.fullmatch(req.keep)):
        raise ValueError("keep must be 32 lowercase hex digits")
    return req


KEEP_ID = re.compile(r"[0-9a-f]{32}")
"""A kept process's id: 16 random bytes in hex, chosen by the host."""


def encode_attach(ident: str, cursor: int) -> bytes:
    return json.dumps({"id": ident, "cursor": cursor}).encode()


def decode_attach(payload: bytes) -> Tuple[str, int]:
    """Raises ValueError for an ATTACH payload that is not one."""
    data = json.loads(payload.decode())
    if not isinstance(data, dict):
        raise ValueError("not an object")
    ident, cursor = data.get("id"), data.get("cursor")
    if not (isinstance(ident, str) and KEEP_ID.fullmatch(ident)):
        raise ValueError("not an id")
    if type(cursor) is not int or cursor < 0:
        raise ValueError("not a cursor")
    return ident, cursor


def encode_exit(outcome: Exit) -> bytes:
    return json.dumps(outcome._asdict()).encode()


def decode_exit(payload: bytes) -> Exit:
    """Raises ValueError or TypeError for a report that is not one (fields of the wrong
    type included: the executor may be a stand-in)."""
    data: Dict[str, Any] = json.loads(payload.decode())
    end = Exit(**data)
    numbers = (int, float)
    if not (
        type(end.exit_code) is int
        and type(end.timed_out) is bool
        and isinstance(end.elapsed, numbers)
        and not isinstance(end.elapsed, bool)
        and type(end.oom_killed) is bool
        and isinstance(end.unavailable, str)
    ):
        raise ValueError("an exit report with a field of the wrong type")
    return end
