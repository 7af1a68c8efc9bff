"""`orchestrator logs`, printed: what several services' containers printed, each line whole
after its service's name, the main sandbox's first. Both entries print through here, the
full CLI's `logs` (cli/running_cmds.py) and the quick path (quickcli.py), so the two print
the same. Standard library only: the quick path loads no Typer."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator

from orchestrator.errors import OrchestratorError
from orchestrator.tables import echo

LINE_LIMIT = 64 * 1024
"""Bytes of a line printed before it ends: a longer one comes in pieces of this size, each a
line of its own."""
FOLLOW_LOOK = 0.5
"""How often a followed log's wait looks up (so Ctrl-C reaches us)."""


def show_logs(
    services: list[str], chunks_of: Callable[[str], Iterator[bytes]], *, follow: bool
) -> OrchestratorError | None:
    """Print the logs of `services` (`chunks_of(name)`: one's log as it comes), each after
    the other, or side by side when they follow; the error that ended one, if any (the
    others are printed all the same)."""
    printer = _Printer(services if len(services) > 1 else [])
    readers = [
        threading.Thread(target=printer.copy, args=(name, chunks_of(name)), daemon=follow)
        for name in services
    ]
    for reader in readers if follow else []:
        reader.start()
    for reader in readers:
        if follow:
            while reader.is_alive() and not printer.gone:
                reader.join(FOLLOW_LOOK)
        elif not printer.gone:
            reader.run()
    if printer.gone:  # our reader left (`logs -f | head`): as any command's broken pipe
        raise BrokenPipeError
    return printer.error


class _Printer:
    """Lines of several services on stdout, whole, each after its service's name."""

    def __init__(self, prefixed: list[str]) -> None:
        width = max((len(n) for n in prefixed), default=0)
        self._prefix = {n: f"{n.ljust(width)} | ".encode() for n in prefixed}
        self._lock = threading.Lock()
        self.error: OrchestratorError | None = None
        self.gone = False
        """Our reader left (a broken pipe): nothing more is printed."""

    def copy(self, name: str, chunks: Iterator[bytes]) -> None:
        prefix, partial, wrote = self._prefix.get(name, b""), b"", False
        try:
            for chunk in chunks:
                wrote = True
                *ended, partial = (partial + chunk).split(b"\n")
                lines = [piece for line in ended for piece in _pieces(line)]
                while len(partial) > LINE_LIMIT:  # a line without end yet: its whole pieces
                    lines.append(partial[:LINE_LIMIT])
                    partial = partial[LINE_LIMIT:]
                self._write(b"".join(prefix + line + b"\n" for line in lines))
        except OrchestratorError as exc:  # (what came before it is printed all the same)
            self.error = exc
        except BrokenPipeError:
            self.gone = True
            return
        if partial:
            with contextlib.suppress(BrokenPipeError):
                self._write(prefix + partial + b"\n")
        if not wrote and name == "main":
            echo(
                "main: no output of its own (commands run with `orchestrator exec` print to "
                "their caller)",
                err=True,
            )

    def _write(self, data: bytes) -> None:
        out = getattr(sys.stdout, "buffer", None)  # (None: started with stdout closed)
        with self._lock:
            if self.gone:
                raise BrokenPipeError
            if out is None:
                return
            try:
                out.write(data)
                out.flush()
            except BrokenPipeError:
                self.gone = True
                raise


def _pieces(line: bytes) -> Iterator[bytes]:
    """A line in pieces of at most LINE_LIMIT bytes, cut from its start (the same pieces
    however its bytes came)."""
    while len(line) > LINE_LIMIT:
        yield line[:LINE_LIMIT]
        line = line[LINE_LIMIT:]
    yield line
