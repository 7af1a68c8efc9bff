"""Running one command: start it, pump its output as it arrives, keep its deadline with a
watchdog, kill its whole tree when it times out or its caller gives up. The rules are the
package's (see its docstring). Standard library only, Python 3.7+."""

from __future__ import annotations

import errno
import fcntl
import os
import selectors
import signal
import subprocess
import threading
import time
from typing import (
    IO,
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generator,
    Iterable,
    List,
    Optional,
    Tuple,
)

from .base import CHUNK, DRAIN, DRAIN_MAX, F_SETPIPE_SZ, GRACE, Outcome, exit_status, scope
from .fed import close_fed, feeding
from .start import Refused, start_command
from .tree import kill_tree
from .workers import Spare, hold_spares

if TYPE_CHECKING:
    from .base import Chunk, Killer, Spawn


def _feed(pipe: IO[bytes], chunks: Iterable[bytes]) -> None:
    try:
        for chunk in chunks:
            if chunk:
                pipe.write(chunk)
                pipe.flush()  # now: a process written to as it runs answers each line
    except (BrokenPipeError, OSError, ValueError):
        pass  # the command stopped reading; that is its business
    finally:
        close_fed(pipe)


def _watchdog(
    proc: "subprocess.Popen[bytes]",
    deadline: float,
    grace: float,
    kill: Callable[[int], None],
    finished: threading.Event,
    timed_out: threading.Event,
) -> None:
    """Enforce the deadline whatever the reader is doing: blocked on a consumer that stopped
    reading, or waiting for a process that closed its pipes."""
    if finished.wait(max(0.0, deadline - time.monotonic())) or proc.poll() is not None:
        return
    timed_out.set()
    kill(signal.SIGTERM)
    finished.wait(grace)  # the main process may end sooner: what it leaves gets no longer
    kill(signal.SIGKILL)  # whatever outlived SIGTERM (ignored it, or was forking meanwhile)


def pump(
    proc: "subprocess.Popen[bytes]",
    stdin: Optional[Iterable[bytes]] = None,
    timeout: Optional[float] = None,
    grace: float = GRACE,
    killer: Optional[Killer] = None,
    started: Optional[float] = None,
    out: Optional[int] = None,
    spares: Optional[List[Spare]] = None,
) -> Generator[Chunk, None, Outcome]:
    """Yield ("stdout"|"stderr", bytes) as output arrives; return the Outcome. `killer(proc,
    sig)` replaces the default tree kill (the plain-exec path kills inside the container
    instead). The timeout is kept by a watchdog thread, so it holds even while the caller is
    not reading; closing the generator early kills the command. `out`: a file descriptor
    (the read end of a FIFO, the caller's to close) that carries the command's standard
    output instead; what the process itself prints on stdout then counts as stderr.
    `spares`: threads started before the process (see Spare), used before new ones."""
    start = time.monotonic() if started is None else started
    spare = list(spares or ())

    def begin(target: Callable[..., None], *args: Any) -> Spare:
        held = spare.pop() if spare else Spare()
        return held.give(lambda: target(*args))

    if stdin is not None and proc.stdin is not None:
        feeding(proc.stdin)  # a child forked from now on does not hold it open
        begin(_feed, proc.stdin, stdin)
    known: List[int] = []
    kill_lock = threading.Lock()

    def kill(sig: int) -> None:
        with kill_lock:
            if killer is not None:
                killer(proc, sig)
            else:
                known[:] = kill_tree(proc.pid, sig, known)

    finished, timed_out = threading.Event(), threading.Event()
    watchdog = None
    if timeout is not None:
        watchdog = begin(_watchdog, proc, start + timeout, grace, kill, finished, timed_out)
    for unused in spare:
        unused.give(None)
    sel = selectors.DefaultSelector()
    sources = [(proc.stdout, "stdout" if out is None else "stderr"), (proc.stderr, "stderr")]
    for pipe, kind in sources:
        if pipe is not None:
            try:
                fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, CHUNK)
            except OSError:
                pass  # not Linux, or over /proc/sys/fs/pipe-max-size: the default stays
            sel.register(pipe, selectors.EVENT_READ, kind)
    if out is not None:
        sel.register(out, selectors.EVENT_READ, "stdout")
    exited_at: Optional[float] = None
    last_data = start
    held = 0.0  # seconds the caller held a chunk since the process exited: not silence
    abandon: Optional[threading.Event] = getattr(scope, "abandon", None)
    try:
        while abandon is None or not abandon.is_set():
            if sel.get_map():
                for key, _ in sel.select(0.05):
                    try:
                        data = os.read(key.fd, CHUNK)
                    except BlockingIOError:  # a FIFO: woken, then nothing to read
                        continue
                    except OSError as exc:  # a terminal's master once its last user left
                        if exc.errno != errno.EIO:
                            raise
                        data = b""
                    if data:
                        last_data = time.monotonic()
                        yield key.data, data
                        back = time.monotonic()
                        if exited_at is not None:
                            held += back - last_data
                        last_data = back
                    else:
                        sel.unregister(key.fileobj)
            elif abandon is None:  # both pipes closed: wait for the process (the watchdog
                proc.wait()  # keeps the deadline; a timed wait polls with sleeps, costing a ms)
            else:
                try:
                    proc.wait(0.05)
                except subprocess.TimeoutExpired:
                    continue
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now  # leftovers of its group keep running, by design
            if exited_at is not None and (
                not sel.get_map()
                or (now - last_data >= DRAIN and now - exited_at - held >= DRAIN)
                or now - exited_at - held > DRAIN_MAX
            ):
                break
    finally:
        finished.set()
        sel.close()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        if proc.poll() is None:  # the caller gave up on us: nothing may outlive that
            kill(signal.SIGKILL)
        if watchdog is not None and timed_out.is_set():
            watchdog.join()  # its SIGKILL lands before the result: nothing of it runs on
    code = proc.wait()
    return Outcome(exit_status(code), timed_out.is_set(), time.monotonic() - start)


def run(
    argv: List[str],
    env: Optional[Dict[str, str]],
    cwd: Optional[str],
    user: Optional[str] = None,
    stdin: Optional[Iterable[bytes]] = None,
    timeout: Optional[float] = None,
    killer: Optional[Killer] = None,
    started: Optional[float] = None,
    on_start: Optional[Callable[["subprocess.Popen[bytes]"], None]] = None,
    out: Optional[int] = None,
    stdio: Tuple[Optional[int], Optional[int]] = (None, None),
    spawn: Optional[Spawn] = None,
) -> Generator[Chunk, None, Outcome]:
    """Run one command: yield its output as it arrives, return its Outcome. Whatever keeps it
    from starting comes back as a shell would report it (see the module rules), except
    NoProcess. `on_start(proc)` sees the process once it runs; `out` is as for `pump`. Closing
    the generator early kills the command's whole tree and reaps it: nothing outlives a caller
    that gave up."""
    start = time.monotonic() if started is None else started
    spares = hold_spares((timeout is not None) + (stdin is not None))
    held: List["subprocess.Popen[bytes]"] = []
    try:
        proc = start_command(argv, env, cwd, user, stdin is not None, stdio, spawn, held)
    except BaseException as exc:
        for spare in spares:
            spare.give(None)
        for made in held:  # unwound as its process was made: it goes
            if getattr(made, "pid", None):
                _abandon(made)
        if not isinstance(exc, Refused):
            raise
        yield "stderr", (exc.message + "\n").encode()
        return Outcome(exc.code, False, time.monotonic() - start)
    try:
        if on_start is not None:
            on_start(proc)
        return (
            yield from pump(
                proc, stdin, timeout, killer=killer, started=start, out=out, spares=spares
            )
        )
    finally:
        for spare in spares:  # pump took those it needed; the others end here
            spare.give(None)
        if proc.returncode is None:  # abandoned (pump has killed it) or never pumped
            _abandon(proc)


def _abandon(proc: "subprocess.Popen[bytes]") -> None:
    """Kill a command's whole tree, close our ends of its pipes, and reap it."""
    if proc.poll() is None:
        kill_tree(proc.pid, signal.SIGKILL)
    if proc.stdin is not None:
        close_fed(proc.stdin)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    proc.wait()
