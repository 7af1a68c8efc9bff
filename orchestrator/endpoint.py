"""`orchestrator exec` through an environment's own endpoint, before anything heavy loads.

The `orchestrator` command starts here. For `exec [-i] ID [--timeout S] [--] CMD...` on an
environment that has an endpoint (a detached Docker environment: `up`), it runs the command
over that endpoint: a unix socket in the environment's project folder, which no container
sees, held by the environment's resident executor (see backends/container/resident.py), the
same executor protocol as the library's commands. No docker exec, no Typer, no pydantic: a
command costs a connection and a few frames. Anything else, or whatever this path cannot
answer exactly as the full CLI would (an id it does not find whole, another option, a
paused environment, kills owed, no endpoint), goes to the full CLI unchanged, before any
command ran. Standard library only (and the executor's wire format), so that this module
loads in a few milliseconds: Typer and argparse are not used here on purpose.

Who can use the endpoint: its socket is the owner's (mode 0600, in the owner's 0700 project
folder, taken only when state folder, record and socket are this user's alone); a connection
must first show the token that only the environment's record (owner-only) and the resident
hold. The command then runs as the full
CLI would run it: the environment's user and workdir, its timeout kills its tree, its exit
code is ours (124 on timeout), its stdout and stderr apart; it dies with our connection
(Ctrl-C, a kill of this process), as the full CLI kills it. One difference: a command
already running when its environment is paused waits here for the resume (as under `docker
exec`), where the full CLI fails it at once (SandboxPaused) and kills it while frozen
(with `-it`, where Ctrl-C is a key typed into the command's terminal, SIGTERM from elsewhere
ends the wait; its `--timeout` still holds).
"""

from __future__ import annotations

import _thread
import json
import os
import re
import select
import socket
import stat
import sys
import time

from orchestrator.backends.container.executor import wire
from orchestrator.execflags import FLAGS

# (`typing`, `threading`, `contextlib` and platformdirs are not loaded on this path: each
# costs milliseconds of a call that takes about thirty; see bench/results/cli.md)

ENDPOINT = "exec.sock"
"""The resident's socket, in <project> (never in a folder a container sees)."""
RECORD = "exec.json"
"""In <project> (owner-only): the token, and what a command gets when the call says nothing."""
RECORD_LIMIT = 64 * 1024
READY_WITHIN = 1.0
"""Seconds for the resident to greet (a paused environment does not: the full CLI says so)."""
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}")
PIECE = 64 * 1024
VEOF = b"\x04"
"""A terminal's end of input (procutil.VEOF; that package is not loaded on this path)."""
OVERDUE = 5.0
"""Seconds past a command's timeout before we stop waiting for its end (its sandbox frozen
meanwhile): reported as a timeout, and the command dies with our connection."""


class Call:
    """One `exec` call, read."""

    __slots__ = ("argv", "folder", "ident", "interactive", "timeout", "tty")

    def __init__(
        self,
        ident: str,
        interactive: bool,
        timeout: float | None,
        argv: list[str],
        tty: bool = False,
    ) -> None:
        self.ident, self.interactive, self.timeout, self.argv = ident, interactive, timeout, argv
        self.tty = tty
        """On a terminal of its own (`-t`), our terminal's size, and each resize (SIGWINCH)."""
        self.folder = ""
        """The environment's project folder, once found."""


class NotHere(Exception):
    """This call is not for the endpoint: the full CLI takes it (nothing ran)."""


def main() -> None:
    """The `orchestrator` command: `exec` over an endpoint here, `ps`, `down` and `logs` in
    quickcli.py, anything else (and each, where its path cannot answer it) in the full CLI."""
    args = sys.argv[1:]
    try:
        # Typer's completion, under whatever name the program was started by (Click names the
        # variable after it): any such variable only sends the call to the full CLI
        if any(name.endswith("_COMPLETE") for name in os.environ):
            raise NotHere("completion")
        if args[:1] in (["ps"], ["down"], ["logs"]):
            from orchestrator import quickcli

            try:
                code = quickcli.run(args)
            except quickcli.Other:
                raise NotHere("not for the quick path") from None
            _leave(code)
        else:
            code = run(args)
    except KeyboardInterrupt:  # the command died with our connection, as the full CLI's
        code = 130
    except NotHere:
        from orchestrator.cli import main as full

        full()
        return
    sys.exit(code)


def _leave(code: int) -> None:
    """End `ps` or `down` without the interpreter's teardown of the 200 modules they load
    (6 ms of a 70 ms `ps`): what an exit does that counts is done first (the functions
    registered to run at exit, such as a reap's wait for its thread and logging's flush; the
    streams' flush). Where a thread of ours still runs, the exit is the usual one, which
    waits for it."""
    import atexit
    import threading

    if any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.main_thread()
    ):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a reader that left, a stream closed: quiet, as ever
            pass
    os._exit(code)


def run(args: list[str]) -> int:
    call = parse(args)
    folder = call.folder = _project_folder(call.ident)
    try:
        owed = os.listdir(os.path.join(folder, "owed-kills"))
    except FileNotFoundError:
        owed = []
    except OSError:
        raise NotHere("kills owed cannot be told") from None
    if owed:
        raise NotHere("kills are owed")
    record = _record(folder)
    try:
        token = bytes.fromhex(str(record["token"]))
    except ValueError:
        raise NotHere("a record that is not one") from None
    cwd, user = record.get("cwd"), record.get("user")
    if not isinstance(cwd, str) or not (user is None or isinstance(user, str)):
        raise NotHere("a record that is not one")
    link = _connect(folder, token)
    import signal

    for sig in (signal.SIGTERM, signal.SIGHUP):  # unwinding as Ctrl-C does, as the full CLI
        signal.signal(sig, _exit_on)  # (our terminal put back; the command dies with us)
    try:
        return _run(link, call, cwd, user)
    finally:
        link.close()


def _exit_on(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def parse(args: list[str]) -> Call:
    """`exec [-i|--interactive] [-t|--tty] ID [--timeout S|--timeout=S] [--] CMD...`, as the
    full CLI reads it; NotHere for anything else."""
    if not args or args[0] != "exec":
        raise NotHere("not exec")
    rest = args[1:]
    given: set[str] = set()
    while rest and rest[0] in FLAGS:
        given.update(FLAGS[rest[0]])
        rest = rest[1:]
    interactive = "interactive" in given
    if not rest or not ID.fullmatch(rest[0]):
        raise NotHere("no id first")
    ident, rest = rest[0], rest[1:]
    timeout = None
    if rest and (rest[0] == "--timeout" or rest[0].startswith("--timeout=")):
        raw = rest[0].partition("=")[2] if "=" in rest[0] else (rest[1:2] or [""])[0]
        rest = rest[1:] if "=" in rest[0] else rest[2:]
        try:
            timeout = float(raw)
        except ValueError:
            raise NotHere("a timeout that is not a number") from None
        if not 0 < timeout < float("inf"):
            raise NotHere("a timeout out of range")
    if len(rest) >= 2 and rest[1] == "--":
        raise NotHere("`exec ID SERVICE -- ...`: the full CLI says what it means")
    if rest and rest[0] == "--":
        rest = rest[1:]
    elif rest and rest[0].startswith("-"):
        raise NotHere("an option")
    if not rest:
        raise NotHere("no command")
    argv = ["/bin/sh", "-c", rest[0]] if len(rest) == 1 else list(rest)
    return Call(ident, interactive, timeout, argv, "tty" in given)


def state_dir() -> str:
    """The state folder, by the rule of settings.STATE_DIR (held equal by a unit test)."""
    raw = os.environ.get("ORCHESTRATOR_STATE_DIR", "").strip()
    if raw:
        path = os.path.expanduser(raw)
        if not os.path.isabs(path):
            raise NotHere("a state folder setting the full CLI refuses")
        return path
    # platformdirs' Unix rule (settings.STATE_DIR's), for the cases it answers plainly; any
    # other goes to the full CLI (platformdirs takes 20 ms to load: most of this call's cost)
    xdg = os.environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "orchestrator")
    home = os.environ.get("HOME")
    if home is None or not os.path.isabs(home):
        raise NotHere("no absolute HOME: the full CLI's rule looks further")
    return os.path.join(home, ".local", "state", "orchestrator")


def _ours(path: str, kind: int) -> None:
    """`path` is of `kind` (not a link), ours, and nobody else may change it: as the full
    CLI holds its state folder (paths.private_folder); NotHere otherwise."""
    try:
        st = os.lstat(path)
    except OSError:
        raise NotHere("not there") from None
    if stat.S_IFMT(st.st_mode) != kind or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise NotHere(f"{path} is not ours alone")


def _project_folder(ident: str) -> str:
    state = state_dir()
    folder = os.path.join(state, "projects", ident)
    for path in (state, os.path.dirname(folder), folder):
        _ours(path, stat.S_IFDIR)
    return folder


def _record(folder: str) -> dict[str, object]:
    try:
        fd = os.open(os.path.join(folder, RECORD), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise NotHere("no endpoint") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise NotHere("a record that is not ours alone")
        try:
            data = json.loads(fh.read(RECORD_LIMIT).decode())
        except (OSError, ValueError):
            raise NotHere("a record that is not one") from None
    if not isinstance(data, dict) or not isinstance(data.get("token"), str):
        raise NotHere("a record that is not one")
    return data


class Link:
    """The connection to the resident: frames sent whole by one writer at a time (the
    stdin feeder and the reader's credit share it), frames read against a deadline (the
    socket itself stays blocking: a send is never cut by a timeout)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = _thread.allocate_lock()
        self._file = sock.makefile("rb", buffering=0)
        self.deadline: float | None = None
        self.wake: tuple[int, object] | None = None
        """A descriptor that wakes the wait for frames (a signal's: see `_run`), and what
        is done each time it does."""
        self.owed: dict[int, object] = {}
        """Frames the main thread could not send without waiting, by kind: each a call
        that tries again (True once sent), made at each turn of the wait for frames."""

    def send(self, kind: int, payload: bytes = b"") -> None:
        with self._lock:
            self.sock.sendall(wire.pack(kind, 1, payload))

    def try_send(self, kind: int, payload: bytes = b"") -> bool:
        """Send a small frame only where that cannot wait (the stdin feeder does not hold
        the connection, and the socket has room: a resident that reads nothing, paused or
        stopped by its sandbox, must not hold the main thread past its deadline); whether
        it went. A connection gone is the read's to tell."""
        if not self._lock.acquire(False):
            return False
        try:
            poller = select.poll()
            poller.register(self.sock, select.POLLOUT)
            if not poller.poll(0):
                return False
            self.sock.sendall(wire.pack(kind, 1, payload))
            return True
        except OSError:
            return False
        finally:
            self._lock.release()

    def owe(self, kind: int, attempt: object) -> None:
        """Try `attempt` (a call, True once its frame went) now, and again at each turn of
        the wait for frames until it went; a later one of the same kind replaces it."""
        self.owed.pop(kind, None)
        if not attempt():  # type: ignore[operator]
            self.owed[kind] = attempt

    def readinto(self, view: memoryview) -> int:
        """(For wire.read_frame.) TimeoutError once the deadline passed."""
        while self.deadline is not None or self.wake is not None or self.owed:
            for kind, attempt in list(self.owed.items()):
                if attempt():  # type: ignore[operator]
                    self.owed.pop(kind, None)
            left = 3600.0 if self.deadline is None else self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if self.owed:  # (tried again soon)
                left = min(left, 0.2)
            poller = select.poll()  # (select() fails past descriptor 1023)
            poller.register(self.sock, select.POLLIN)
            if self.wake is not None:
                poller.register(self.wake[0], select.POLLIN)
            ready = {fd for fd, _ in poller.poll(min(left, 3600.0) * 1000)}
            if self.wake is not None and self.wake[0] in ready:
                try:
                    while os.read(self.wake[0], 512):  # (many signals at once: one resize)
                        pass
                except BlockingIOError:
                    pass
                self.wake[1]()  # type: ignore[operator]
            if self.sock.fileno() in ready:
                break
        return self._file.readinto(view) or 0

    def frame(self, limit: int) -> wire.Frame | None:
        return wire.read_frame(self, limit=limit)  # type: ignore[arg-type]

    def close(self) -> None:
        self._file.close()
        self.sock.close()


def dial(folder: str, token: bytes | None = None) -> socket.socket:
    """A connection to the resident of the environment whose project folder is `folder`,
    its token (the record's, unless given) shown; NotHere when there is none (gone, paused,
    not ours). Its greeting is the caller's to read."""
    if token is None:
        try:
            token = bytes.fromhex(str(_record(folder)["token"]))
        except ValueError:
            raise NotHere("a record that is not one") from None
    path = os.path.join(folder, ENDPOINT)
    _ours(path, stat.S_IFSOCK)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)  # the connect alone: a full backlog must not hold us
        try:  # noqa: SIM105 (contextlib is not loaded on this path)
            sock.connect(path)
        except BlockingIOError:
            pass
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        if not poller.poll(READY_WITHIN * 1000):
            raise NotHere("no resident")
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            raise NotHere("no resident")
        sock.setblocking(True)
        sock.sendall(token)
    except OSError:
        sock.close()
        raise NotHere("no resident") from None
    except NotHere:
        sock.close()
        raise
    return sock


def answers(folder: str, within: float = READY_WITHIN) -> bool:
    """Whether the resident of the project folder `folder` greets a client of its record
    (within `within` seconds, once connected)."""
    try:
        token = bytes.fromhex(str(_record(folder)["token"]))
        _connect(folder, token, within).close()
    except (NotHere, ValueError):
        return False
    return True


def _connect(folder: str, token: bytes, within: float = READY_WITHIN) -> Link:
    """A connection to the resident, its token shown and its greeting read (within
    `within` seconds); NotHere when there is none (gone, paused, not ours)."""
    link = Link(dial(folder, token))
    link.deadline = time.monotonic() + within
    try:
        frame = link.frame(4096)
        if frame is None or frame[0] != wire.READY:
            raise NotHere("no greeting")
    except (OSError, ValueError):
        link.close()
        raise NotHere("no resident") from None
    except NotHere:
        link.close()
        raise
    link.deadline = None
    return link


def _run(link: Link, call: Call, cwd: str, user: str | None) -> int:
    if not call.tty:
        return _follow(link, call, cwd, user)
    import signal

    # SIGWINCH wakes the wait for frames (Link.readinto) through a wakeup pipe, and the main
    # thread sends the size then, only when it changed and only where that cannot wait
    # (Link.owe). Handler, pipe and wakeup stay as they are until the process ends: undone
    # under a storm of signals, they raced it (a traceback at the exit)
    resized = os.pipe()
    for end in resized:
        os.set_blocking(end, False)
    sent = [_our_size()]

    def resize() -> None:
        def attempt() -> bool:
            size = _our_size()
            if size == sent[0]:
                return True
            if link.try_send(wire.RESIZE, wire.SIZE.pack(*size)):
                sent[0] = size
                return True
            return False

        link.owe(wire.RESIZE, attempt)

    link.wake = (resized[0], resize)
    signal.signal(signal.SIGWINCH, lambda *_: None)
    signal.set_wakeup_fd(resized[1], warn_on_full_buffer=False)
    raw = _raw(sys.stdin) if call.interactive else None  # (Ctrl-C then goes as a key)
    _SAID.append([])  # (said once our terminal is as it was: raw, a line would not end)
    try:
        if raw is None:
            return _follow(link, call, cwd, user, size=sent[0])
        from orchestrator import leavekeys

        with leavekeys.armed(True):
            return _follow(link, call, cwd, user, size=sent[0])
    finally:
        link.wake = None
        if raw is not None:
            _restore(*raw)
        for line in _SAID.pop():
            print(line, file=sys.stderr)


_SAID: list[list[str]] = []
"""Error lines held while our terminal is raw (see `_say`)."""


def _say(line: str) -> None:
    """An error line on stderr (held until our terminal is put back, while it is raw)."""
    if _SAID:
        _SAID[-1].append(line)
    else:
        print(line, file=sys.stderr)


def _restore(fd: int, before: list[int | list[bytes | int]]) -> None:
    """Our terminal's settings as they were (tried again when a signal cuts the call)."""
    import errno
    import termios

    for _ in range(100):
        try:
            termios.tcsetattr(fd, termios.TCSADRAIN, before)
            return
        except termios.error as exc:
            if exc.args[0] != errno.EINTR:
                return


def _our_size() -> tuple[int, int]:
    """Our terminal's columns and rows (80 x 24 when ours is none), as the full CLI's."""
    for stream in (sys.stdout, sys.stdin, sys.stderr):
        try:
            size = os.get_terminal_size(stream.fileno())
        except (AttributeError, ValueError, OSError):
            continue
        if size.columns > 0 and size.lines > 0:
            return size.columns, size.lines
    return 80, 24


def _raw(stream: object) -> tuple[int, list[int | list[bytes | int]]] | None:
    """Make `stream` raw (every key, Ctrl-C too, goes as typed) when it is a terminal: its
    descriptor and its settings before, to be put back; None when it is no terminal."""
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return None
    if not os.isatty(fd):
        return None
    import termios
    import tty

    before = termios.tcgetattr(fd)
    tty.setraw(fd)
    return fd, before


def _follow(
    link: Link, call: Call, cwd: str, user: str | None, size: tuple[int, int] | None = None
) -> int:
    """Send the command (on a terminal of `size` with -t), pass it our stdin (with -i),
    print what it says; its exit code."""
    timeout, interactive = call.timeout, call.interactive
    # (a terminal's input ends as one ends, with Ctrl-D typed: at once without -i, as the
    # full CLI's; see sandbox/core.py `start`)
    tty = list(size) if size is not None else None
    request = wire.Request(call.argv, {}, cwd, user, timeout, interactive or call.tty, tty=tty)
    link.send(wire.RUN, wire.encode_request(request))
    typed_end = VEOF if call.tty else b""
    window = _feed_in_thread(link, typed_end, call.tty) if interactive else None
    if call.tty and not interactive:
        link.send(wire.STDIN, typed_end)
        link.send(wire.STDIN_EOF)
    outs = {wire.OUT: _binary(sys.stdout), wire.ERR: _binary(sys.stderr)}
    consumed, credit = 0, [0]  # (credit: read and not yet handed back)
    if timeout is not None:  # past it (and the executor's grace), given up on: see OVERDUE
        link.deadline = time.monotonic() + min(timeout, 1e9) + OVERDUE
    while True:
        try:
            frame = link.frame(PIECE * 4)
        except TimeoutError:
            return _timed_out(timeout)
        except (OSError, ValueError):
            frame = None
        if frame is None:
            return _gone(call) or _lost("it went away while the command ran")
        kind, cid, payload = frame
        if cid != 1:
            continue
        if kind in outs:
            if not _write(outs[kind], payload):
                return 1  # our reader went (`| head`): the command dies with us, as there
            consumed += 1
            if consumed >= wire.WINDOW // 2:  # (never waiting: see Link.try_send)
                link.owe(wire.CREDIT, _credit(link, credit, consumed))
                consumed = 0
        elif kind == wire.TAKEN and window is not None and len(payload) == wire.COUNT.size:
            window.took(wire.COUNT.unpack(payload)[0])
        elif kind == wire.EXIT:
            try:
                end = wire.decode_exit(payload)
            except (ValueError, TypeError):
                return _lost("it sent an exit report that is not one")
            if end.unavailable:
                why = f"{end.unavailable} (its pids or memory limit is reached; the command did"
                _say(f"error: the sandbox cannot run the command: {why} not start)")
                return 3  # SandboxUnavailable's, as the full CLI
            return _timed_out(timeout) if end.timed_out else int(end.exit_code)


def _credit(link: Link, credit: list[int], read: int) -> object:
    """An attempt (see Link.owe) to hand back the credit of `read` more frames, with all
    that earlier attempts could not."""
    credit[0] += read

    def attempt() -> bool:
        if credit[0] and not link.try_send(wire.CREDIT, wire.COUNT.pack(credit[0])):
            return False
        credit[0] = 0
        return True

    return attempt


def _gone(call: Call) -> int | None:
    """3, with why, where the environment's main container is gone or stopped (its resident
    went with it), as the full CLI says it (SandboxUnavailable); None where it runs on."""
    from pathlib import Path

    from orchestrator.backends.container.readiness import main_gone

    why = main_gone(Path(call.folder), call.ident)
    if why is None:
        return None
    _say(f"error: {call.ident}: {why.splitlines()[0].removesuffix('; last log lines:')}")
    return 3


def _lost(what: str) -> int:
    _say(f"error: the environment's executor: {what}")
    return 1


def _timed_out(timeout: float | None) -> int:
    _say(f"error: timed out after {timeout or 0:g}s")
    return 124  # as timeout(1), as the full CLI


def _binary(stream: object) -> object:
    """Where a stream's bytes go: its binary buffer, or None when it was closed at our start."""
    return getattr(stream, "buffer", None) if stream is not None else None


def _write(out: object, data: bytes) -> bool:
    """False once our reader is gone (further output goes nowhere, ours included)."""
    if out is None:
        return True
    try:
        out.write(data)  # type: ignore[attr-defined]
        out.flush()  # type: ignore[attr-defined]
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, out.fileno())  # type: ignore[attr-defined]
        os.close(null)
        return False
    return True


class Window:
    """STDIN frames sent ahead of what the command took: at most STDIN_WINDOW; a TAKEN
    frees only what was sent."""

    def __init__(self) -> None:
        import threading  # (only an interactive call feeds its stdin beside its output)

        self._cond = threading.Condition()
        self._ahead = 0

    def take(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._ahead < wire.STDIN_WINDOW)
            self._ahead += 1

    def took(self, count: int) -> None:
        with self._cond:
            self._ahead = max(0, self._ahead - count)
            self._cond.notify_all()


def _feed_in_thread(link: Link, end: bytes = b"", keys: bool = False) -> Window:
    """Our stdin to the command as it comes, then `end` (a terminal's Ctrl-D) and its end,
    paced by the returned window. `keys` (ours raw, -it): Ctrl-P Ctrl-Q leaves (see
    leavekeys.py)."""
    from orchestrator import leavekeys

    window = Window()
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    watch = leavekeys.watch_for(fd) if keys else None

    def feed() -> None:
        try:
            while data := os.read(fd, PIECE):
                left = False
                if watch is not None:
                    data, left = watch.feed(data)
                if data:
                    window.take()
                    link.send(wire.STDIN, data)
                if left:
                    leavekeys.leave()
                    return
        except (OSError, ValueError):
            pass
        try:
            if end:
                window.take()
                link.send(wire.STDIN, end)
            link.send(wire.STDIN_EOF)
        except OSError:
            pass

    import threading

    threading.Thread(target=feed, daemon=True).start()
    return window
