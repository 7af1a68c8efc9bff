"""Typed results and stream events. A non-zero exit is data, not an exception."""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Literal

DECODE_ERRORS = "replace"


@dataclass(frozen=True)
class RuntimeResult:
    """The outcome of one command."""

    exit_code: int
    """The command's exit status; 128+N when it was killed by signal N."""
    stdout: str
    stderr: str
    elapsed: float
    """Wall-clock seconds from start to finish."""
    timed_out: bool = False
    truncated: bool = False
    """Some output was dropped (each stream keeps its last `output_limit` bytes)."""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    oom_killed: bool = False
    """The kernel's out-of-memory killer ended the command (container memory limit)."""
    setup_stdout: str = ""
    """Output of the environment's setup commands, kept apart from the command's own."""
    setup_stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class StreamEvent:
    """One event of `Runtime.stream`: output as it arrives, then "finished" with the result."""

    kind: Literal["stdout", "stderr", "finished"]
    text: str = ""
    result: RuntimeResult | None = None


@dataclass(frozen=True)
class Outcome:
    """What a backend reports when a command ends (output travels separately)."""

    exit_code: int
    timed_out: bool
    elapsed: float
    oom_killed: bool = False


class TailBuffer:
    """Keeps the last `limit` bytes of a stream; memory stays bounded whatever arrives."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()
        self.truncated = False

    def add(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) > 2 * self.limit + 65536:
            self._trim()

    def _trim(self) -> None:
        if len(self._buf) > self.limit:
            del self._buf[: len(self._buf) - self.limit]
            self.truncated = True

    def value(self) -> bytes:
        self._trim()
        return bytes(self._buf)


def decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(DECODE_ERRORS)


def decode(data: bytes) -> str:
    return data.decode("utf-8", DECODE_ERRORS)
