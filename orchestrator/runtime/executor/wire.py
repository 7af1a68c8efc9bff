"""The executor's framed protocol. Standard library only (copied into containers).

A frame is a 9-byte header (kind, command id, payload length; big-endian) and the payload.
Host -> executor: RUN (JSON request), STDIN (bytes), STDIN_EOF, KILL.
Executor -> host: READY (JSON), OUT / ERR (bytes), EXIT (JSON outcome).
"""

from __future__ import annotations

import struct
from typing import IO, Optional, Tuple

HEADER = struct.Struct(">BII")
RUN, STDIN, STDIN_EOF, KILL = 1, 2, 3, 4
READY, OUT, ERR, EXIT = 10, 11, 12, 13
MAX_PAYLOAD = 64 * 1024 * 1024

Frame = Tuple[int, int, bytes]


def pack(kind: int, cid: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, cid, len(payload)) + payload


def _read_exact(stream: IO[bytes], n: int) -> Optional[bytes]:
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_frame(stream: IO[bytes]) -> Optional[Frame]:
    """The next frame, or None at end of stream (or a broken frame)."""
    head = _read_exact(stream, HEADER.size)
    if head is None:
        return None
    kind, cid, size = HEADER.unpack(head)
    if size > MAX_PAYLOAD:
        return None
    payload = _read_exact(stream, size) if size else b""
    if payload is None:
        return None
    return kind, cid, payload
