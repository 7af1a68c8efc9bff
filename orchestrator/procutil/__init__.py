"""The one process core: start a command as its own session, pump its output, keep its
deadline, kill its whole tree. Standard library only, Python 3.7+, and it imports nothing of
ours: the local backend, the plain-exec path and the in-container executor (this file is
copied into every container) all run commands through `run`, so they keep the same rules.

Rules kept here:
- a command that cannot start is an exit status and a message, as a shell gives them
  (127 not found, 126 not executable or unknown user, 2 missing cwd), never an exception;
  only "no process can be started at all" (pids or memory limit) raises `NoProcess`;
- each command starts a new session (its own process group);
- on timeout: SIGTERM to the group and to every descendant found in /proc (also those that
  left the group), then SIGKILL after a short grace (sooner once the main process is gone),
  always, so a process that ignores SIGTERM dies too, before the result is returned;
- a process killed by signal N reports 128+N;
- after the main process exits, output is drained briefly; a background process that keeps
  the pipes open does not hold the call (it keeps running, its pipes are closed on our side).
The host's /proc reads (the local backend's process scans, an owner's start time) use these
same functions rather than psutil: the sandbox side must stay standard-library only, one
implementation is tested on both sides, and psutil would read the same /proc files.
"""

from __future__ import annotations

import errno
import fcntl
import os
import selectors
import shutil
import signal
import subprocess
import sys
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
    NamedTuple,
    NoReturn,
    Optional,
    Protocol,
    Set,
    Tuple,
)

GRACE = 0.5
"""Seconds between SIGTERM and SIGKILL on timeout."""
DRAIN = 0.1
"""Seconds of pipe silence, after the main process exited, before we stop reading."""
DRAIN_MAX = 2.0
"""Longest we keep reading after the main process exited (a background writer)."""
CHUNK = 1 << 18
"""Largest read of a command's output: one frame of the executor. The pipes are grown to it
(Linux), so bulk output (a folder being packed) crosses in a few hundred frames per 100 MB,
not thousands; the executor's window of frames in flight bounds memory at 64 of them."""
F_SETPIPE_SZ = 1031  # fcntl's name for it arrived in Python 3.10; the number is Linux's

NO_PROCESS = (errno.EAGAIN, errno.ENOMEM)
"""fork() errors that mean no process can be started at all (pids or memory limit)."""
_scope = threading.local()

_FED: Set[int] = set()
"""Write ends of the stdin pipes this process is feeding (see `_feed`)."""
_FED_GUARD = threading.RLock()
"""Held from recording such a descriptor to letting it go, and across every os.fork(). Held
only for calls that cannot wait; reentrant, as a garbage collection inside it may finish
another command (its generator's `finally`)."""


def _let_go(fd: int) -> None:
    """Make `fd` /dev/null: the pipe it was goes (its reader sees the end), and the number
    stays taken; not inherited by what is exec'd. /dev/null is opened without waiting and
    must be the null device (root in a sandbox may have replaced it by a FIFO); else `fd`
    becomes the write end of a fresh pipe nobody reads; with no descriptor left, it is
    closed."""
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        null = -1
    if null >= 0:
        try:
            if os.fstat(null).st_rdev != os.makedev(1, 3):
                os.close(null)
                null = -1
        except OSError:
            os.close(null)
            null = -1
    if null < 0:
        try:
            reader, null = os.pipe()
            os.close(reader)
        except OSError:
            try:
                os.close(fd)
            except OSError:
                pass
            return
    try:
        os.dup2(null, fd, inheritable=False)
    except OSError:
        pass
    finally:
        os.close(null)


def _fork_child_drops_fed() -> None:
    """In a child forked while commands of its parent were being fed: its copies of their
    stdin's write ends are let go (`_let_go`), so each command sees the end of its input when its
    parent is done, not when this child exits too. The numbers stay taken (the child's
    copies of the file objects close them again one day, and must not close something
    else then)."""
    for fd in _FED:
        _let_go(fd)
    _FED.clear()
    _FED_GUARD.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_FED_GUARD.acquire,
        after_in_parent=_FED_GUARD.release,
        after_in_child=_fork_child_drops_fed,
    )


def _feeding(pipe: IO[bytes]) -> None:
    with _FED_GUARD:
        if not pipe.closed:
            _FED.add(pipe.fileno())


def _close_fed(pipe: IO[bytes]) -> None:
    """Close a stdin pipe being fed. Its buffer is flushed first (that may wait on the
    command). Then, under the guard and without waiting, its descriptor is let go (see
    `_let_go`) and forgotten: the command sees the end of its input, and no fork sees a number we
    freed. The file object is closed after that, outside the guard: what a buffer took
    since the flush (only from a caller abandoning the command) is dropped."""
    try:
        pipe.flush()
    except (OSError, ValueError):
        pass
    with _FED_GUARD:
        try:
            fd = pipe.fileno()
        except (OSError, ValueError):  # closed already
            fd = -1
        if fd in _FED:
            _FED.discard(fd)
            _let_go(fd)
    try:
        pipe.close()
    except (OSError, ValueError):
        pass


class Flag(Protocol):
    """What abandon_when watches: a threading.Event, or anything with its `is_set`."""

    def is_set(self) -> bool: ...


def abandon_when(event: Optional[Flag]) -> None:
    """From now on, a command `pump`ed in this thread is killed (as when its caller closes
    it early) within about 0.05 s of `event` being set: the caller, in another thread, gave
    up on it (an asyncio task was cancelled). None: no such event."""
    _scope.abandon = event


def abandoned() -> bool:
    """Whether the caller of this thread's command gave up on it (see abandon_when)."""
    event: Optional[Flag] = getattr(_scope, "abandon", None)
    return event is not None and event.is_set()


class Outcome(NamedTuple):
    """How a command ended (its output travels separately)."""

    exit_code: int
    """128+N when it was killed by signal N."""
    timed_out: bool
    elapsed: float
    oom_killed: bool = False


if TYPE_CHECKING:
    from typing import Literal

    StreamKind = Literal["stdout", "stderr"]
    Chunk = Tuple[StreamKind, bytes]
    Killer = Callable[["subprocess.Popen[bytes]", int], None]
    Spawn = Callable[..., Any]


def exit_status(returncode: int) -> int:
    """Popen's -N for "killed by signal N" becomes the shell's 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def stat_fields(pid: int | str) -> List[bytes]:
    """The fields of /proc/PID/stat after the command name, which may hold spaces and
    parentheses (so: split after the last ')'). Field 0 is the state, 1 the parent, 3 the
    session, 19 the start time. Empty when the process is gone or there is no /proc."""
    try:
        with open("/proc/%s/stat" % pid, "rb") as fh:
            stat = fh.read()
    except OSError:
        return []
    return stat[stat.rfind(b")") + 2 :].split()


def _pids() -> List[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def _ppid_map() -> Dict[int, int]:
    out: Dict[int, int] = {}
    for pid in _pids():
        fields = stat_fields(pid)
        if len(fields) > 1:
            out[pid] = int(fields[1])
    return out


def descendants(pid: int) -> List[int]:
    """Every live descendant of `pid`, found through /proc (empty where there is no /proc)."""
    children: Dict[int, List[int]] = {}
    for child, parent in _ppid_map().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def marked(entry: bytes) -> List[int]:
    """Pids whose environment holds `entry` (b"NAME=value"): processes that left a command's
    tree (a `setsid` daemon) still inherit its environment. Only processes whose environ we
    may read are found (our own uid, or any as a privileged user)."""
    found = []
    for pid in _pids():
        try:
            with open("/proc/%d/environ" % pid, "rb") as fh:
                if entry in fh.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def guardian(
    code: str,
    args: List[str],
    log: Optional[str] = None,
    environ: Optional[Dict[str, str]] = None,
) -> "subprocess.Popen[bytes]":
    """Start one of our guardians: `code` run by this interpreter, in a session of its own
    (signals to the caller's process group do not reach it), stdin a pipe only the caller
    holds. From / and with `-P`: nothing in the caller's current folder (a workspace a
    sandbox writes into, say) is on its sys.path, so no file planted there is imported; and
    with this package's folder first on PYTHONPATH, however the package was installed.
    Errors go to `log` (appended), else nowhere. Its variables: `environ` (default: ours)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ if environ is None else environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(log or os.devnull, flags, 0o600), "ab") as err:  # (private)
        return subprocess.Popen(
            [sys.executable, "-P", "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd="/",
            env=env,
            start_new_session=True,
        )


def kill_marked(entry: bytes, within: float = 1.0) -> None:
    """SIGKILL every process whose environment holds `entry` (see `marked`), in passes until
    three in a row find none: a process forking while a pass read /proc has a child that pass
    never saw, and one in the middle of exec() has no environment to read for an instant
    (after `within` seconds, give up)."""
    deadline, quiet = time.monotonic() + within, 0
    while quiet < 3 and time.monotonic() < deadline:
        found = marked(entry)
        quiet = 0 if found else quiet + 1
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def guard_marked(owner: int, start: str, entry: bytes, folder: str) -> None:
    """The local backend's guardian (a `python -c` of its own session, one per runtime):
    block until the runtime is done with (the end of stdin, whose only write end the owner
    holds and closes at cleanup or by dying) or its owner is gone (its pid no longer started
    at `start`: a forked child may hold that end too), then kill every process carrying
    `entry` and remove `folder` (after a cleanup, there is nothing left to find)."""
    ended = threading.Event()

    def read_to_end() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except OSError:
            pass
        ended.set()

    threading.Thread(target=read_to_end, daemon=True).start()
    while not ended.is_set() and alive(owner, start):
        ended.wait(0.5)
    kill_marked(entry, within=5.0)
    remove_tree(folder)


def alive(pid: int, start: str) -> bool:
    """Whether the process `pid` that started at `start` still runs (a zombie does not: it
    waits only for its parent to reap it)."""
    fields = stat_fields(pid)
    return len(fields) > 19 and fields[19].decode() == start and fields[0] != b"Z"


def process_start(pid: int) -> str:
    """Start time of a process in clock ticks since boot ('' when it is gone)."""
    fields = stat_fields(pid)
    return fields[19].decode() if len(fields) > 19 else ""


def remove_tree(folder: str) -> None:
    """Remove a folder whose parts may have been made read-only (write bits given back)."""
    for dirpath, dirnames, _ in os.walk(folder):
        for path in [dirpath, *(os.path.join(dirpath, d) for d in dirnames)]:
            try:
                if not os.path.islink(path):
                    os.chmod(path, os.stat(path).st_mode | 0o700)
            except OSError:
                pass
    shutil.rmtree(folder, ignore_errors=True)


def kill_tree(pid: int, sig: int, known: Optional[List[int]] = None) -> List[int]:
    """Signal the process group led by `pid` and every descendant; return the pids signalled
    (pass them back as `known` so processes that were reparented meanwhile are not missed)."""
    pids = set(known or []) | set(descendants(pid)) | {pid}
    try:
        os.killpg(pid, sig)
    except OSError:
        pass
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass
    return sorted(pids)


class UnknownUser(LookupError):
    """The user (or group) of a request does not exist where the command would run."""


class Lost(Exception):
    """A command that may have started but whose process is lost to us (the executor's
    spawner for its user was killed before it named it): it answers as killed (137), with
    the message on stderr, and is never started again."""


class NoProcess(OSError):
    """No process can be started at all: the pids or memory limit is reached."""


MAX_ID = 2147483647
"""The largest uid or gid taken, the engine's (Docker and runc refuse more: "uids and gids
must be in range 0-2147483647"). The kernel would take more, but 4294967295 is -1 to setuid,
setgid and chown, "leave it as it is", which left a command root."""


def _id_text(text: str) -> bool:
    """Whether `text` is written as a numeric id (ASCII digits only)."""
    return text.isascii() and text.isdigit()


def in_range(number: int, what: str) -> int:
    """`number` as a uid or gid (`what`); UnknownUser when it is out of MAX_ID's range."""
    if not 0 <= number <= MAX_ID:  # (pwd gives 4294967295 as -1: said as written)
        shown = number % (1 << 32) if -(1 << 31) <= number < 0 else number
        raise UnknownUser("%s %d is out of range (0 to %d)" % (what, shown, MAX_ID))
    return number


def numeric_ids(user: str) -> Optional[Tuple[int, int]]:
    """ "uid" or "uid:gid" as numbers (a bare uid gets gid = uid); None when a part is a name.
    UnknownUser for a number out of range."""
    uid, _, gid = user.partition(":")
    if not _id_text(uid) or not _id_text(gid or uid):
        return None
    return in_range(int(uid), "uid"), in_range(int(gid or uid), "gid")


def resolve_ids(user: str) -> Tuple[int, int]:
    """ "uid", "uid:gid", "name" or "name:group" as numbers, looked up in this system's
    passwd and group files. A bare uid without a passwd entry gets gid = uid. UnknownUser
    when one is missing, or a number (written, or in those files) is out of range."""
    numeric = numeric_ids(user)
    if numeric is not None:
        return numeric
    name, _, group = user.partition(":")
    entry = None
    if _id_text(name):
        uid = in_range(int(name), "uid")
    else:
        try:
            import pwd

            entry = pwd.getpwnam(name)
        except (ImportError, KeyError):
            raise UnknownUser(
                "unable to find user %s: no matching entries in passwd file" % name
            ) from None
        uid = in_range(entry.pw_uid, "uid")
    if _id_text(group):
        return uid, in_range(int(group), "gid")
    if group:
        try:
            import grp

            return uid, in_range(grp.getgrnam(group).gr_gid, "gid")
        except (ImportError, KeyError):
            raise UnknownUser(
                "unable to find group %s: no matching entries in group file" % group
            ) from None
    return uid, in_range(entry.pw_gid, "gid") if entry is not None else uid


def home_of(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_dir
    except (ImportError, KeyError):
        return "/"


class _Refused(Exception):
    """A command that cannot start, as the exit status and message a shell would give."""

    def __init__(self, code: int, message: str) -> None:
        Exception.__init__(self, message)
        self.code, self.message = code, message


def _start(
    argv: List[str],
    env: Optional[Dict[str, str]],
    cwd: Optional[str],
    user: Optional[str],
    with_stdin: bool,
    stdio: Tuple[Optional[int], Optional[int]] = (None, None),
    spawn: Optional[Spawn] = None,
) -> "subprocess.Popen[bytes]":
    """Start `argv` as a new session, as `user` (switching only when it differs from ours);
    `stdio`: file descriptors to give it as stdin and stdout instead of pipes. `spawn`
    starts it instead when there is a switch to make (the executor's spawners), or returns
    None to leave it to Popen."""
    kwargs: Dict[str, Any] = {}
    if user:
        try:
            uid, gid = resolve_ids(user)
        except UnknownUser as exc:  # as `docker exec -u` answers it
            raise _Refused(126, str(exc)) from None
        if uid != os.geteuid() or gid != os.getegid():
            if env is not None and uid != os.geteuid():
                env = dict(env, HOME=home_of(uid))
            if spawn is not None:
                given: Any = stdio[0] if stdio[0] is not None else (True if with_stdin else None)
                try:
                    child = spawn(argv, env or dict(os.environ), cwd, uid, gid, given, stdio[1])
                except Lost as exc:
                    raise _Refused(128 + signal.SIGKILL, str(exc)) from None
                except OSError as exc:
                    _raise_as_shell(exc, argv, cwd)
                except (ValueError, TypeError) as exc:
                    raise _Refused(125, "cannot start the command: %s" % exc) from None
                if child is not None:
                    return child  # type: ignore[no-any-return]
            if sys.version_info >= (3, 9):
                kwargs = {"user": uid, "group": gid, "extra_groups": []}
            else:  # pragma: no cover - old Pythons inside containers

                def drop() -> None:
                    os.setgroups([])
                    os.setgid(gid)
                    os.setuid(uid)

                kwargs = {"preexec_fn": drop}
    given = subprocess.PIPE if with_stdin else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            argv,
            stdin=given if stdio[0] is None else stdio[0],
            stdout=subprocess.PIPE if stdio[1] is None else stdio[1],
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            **kwargs,
        )
    except OSError as exc:
        _raise_as_shell(exc, argv, cwd)
    except (ValueError, TypeError) as exc:  # NUL bytes, bad env keys, ...
        raise _Refused(125, "cannot start the command: %s" % exc) from None


def _raise_as_shell(exc: OSError, argv: List[str], cwd: Optional[str]) -> NoReturn:
    if exc.errno in NO_PROCESS:
        raise NoProcess(exc.errno, "cannot start a process: %s" % exc.strerror) from None
    raise _Refused(*_shell_answer(exc, argv, cwd)) from None


def _shell_answer(exc: OSError, argv: List[str], cwd: Optional[str]) -> Tuple[int, str]:
    """The exit code and message a shell would give for a command that could not start."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)) and cwd and not os.path.isdir(cwd):
        why = (
            "Not a directory"
            if isinstance(exc, NotADirectoryError)
            else "No such file or directory"
        )
        return 2, "cannot change directory to %s: %s" % (cwd, why)  # the error's, as a shell
    if isinstance(exc, FileNotFoundError):
        return 127, "%s: command not found" % argv[0]
    if isinstance(exc, PermissionError):
        return 126, "%s: permission denied" % argv[0]
    return 126, "%s: %s" % (argv[0], exc.strerror or exc)


IDLE_WORKERS = 3
"""Threads kept waiting after their job, for the next: a command takes up to three (its
runner in the executor, its watchdog, its stdin feeder), and starting a thread costs about
1 ms under gVisor (0.1 ms under runc), which each command would pay again."""
_idle: List["_Worker"] = []
_idle_lock = threading.Lock()


class _Worker:
    """A thread that runs the jobs it is given, one at a time; between them it waits among
    the idle (at most IDLE_WORKERS), or ends."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._job: Optional[Callable[[], None]] = None
        threading.Thread(target=self._serve, daemon=True).start()  # RuntimeError: none

    def assign(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._job = job
            self._cond.notify()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while self._job is None:
                    self._cond.wait()
                job, self._job = self._job, None
            _scope.__dict__.clear()  # nothing of the last job's (abandon_when) carries over
            job()  # a job that raises ends its thread, reported as any thread's would be
            with _idle_lock:
                if len(_idle) >= IDLE_WORKERS:
                    return
                _idle.append(self)


def _worker() -> _Worker:
    """An idle worker, or a new one (RuntimeError when no thread can start)."""
    with _idle_lock:
        if _idle:
            return _idle.pop()
    return _Worker()


def _forget_workers() -> None:
    """In a forked child: the idle workers' threads were not copied."""
    global _idle_lock
    _idle_lock = threading.Lock()
    del _idle[:]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


def in_thread(job: Callable[[], None]) -> None:
    """Run `job` on a thread of its own (an idle worker's when there is one); RuntimeError
    when none can start."""
    _worker().assign(job)


class _Spare:
    """A thread held before the process it will serve. Under a pids limit a command can
    take every free pid before a thread could start after it (a fork bomb does, in
    microseconds); a thread held first cannot be taken away, and the deadline it keeps
    then holds."""

    def __init__(self) -> None:
        self._worker: Optional[_Worker] = _worker()  # RuntimeError: before any process
        self._lock = threading.Lock()
        self._done = threading.Event()

    def give(self, job: Optional[Callable[[], None]]) -> "_Spare":
        """Run `job` on the held thread, or let the thread go with None; only the first
        call counts."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is None:
            return self

        def work() -> None:
            try:
                if job is not None:
                    job()
            finally:
                self._done.set()

        worker.assign(work)
        return self

    def join(self) -> None:
        """Wait for the job given to end."""
        self._done.wait()


def _spares(count: int) -> List[_Spare]:
    """`count` spare threads, or NoProcess when the container cannot start one."""
    spares: List[_Spare] = []
    try:
        for _ in range(count):
            spares.append(_Spare())
    except RuntimeError:  # the pids limit: nothing has started yet
        for spare in spares:
            spare.give(None)
        raise NoProcess(
            errno.EAGAIN, "cannot start a thread: the process limit is reached"
        ) from None
    return spares


def _feed(pipe: IO[bytes], chunks: Iterable[bytes]) -> None:
    try:
        for chunk in chunks:
            if chunk:
                pipe.write(chunk)
    except (BrokenPipeError, OSError, ValueError):
        pass  # the command stopped reading; that is its business
    finally:
        _close_fed(pipe)


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
    spares: Optional[List[_Spare]] = None,
) -> Generator[Chunk, None, Outcome]:
    """Yield ("stdout"|"stderr", bytes) as output arrives; return the Outcome. `killer(proc,
    sig)` replaces the default tree kill (the plain-exec path kills inside the container
    instead). The timeout is kept by a watchdog thread, so it holds even while the caller is
    not reading; closing the generator early kills the command. `out`: a file descriptor
    (the read end of a FIFO, the caller's to close) that carries the command's standard
    output instead; what the process itself prints on stdout then counts as stderr.
    `spares`: threads started before the process (see _Spare), used before new ones."""
    start = time.monotonic() if started is None else started
    spare = list(spares or ())

    def begin(target: Callable[..., None], *args: Any) -> _Spare:
        held = spare.pop() if spare else _Spare()
        return held.give(lambda: target(*args))

    if stdin is not None and proc.stdin is not None:
        _feeding(proc.stdin)  # a child forked from now on does not hold it open
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
    abandon: Optional[threading.Event] = getattr(_scope, "abandon", None)
    try:
        while abandon is None or not abandon.is_set():
            if sel.get_map():
                for key, _ in sel.select(0.05):
                    try:
                        data = os.read(key.fd, CHUNK)
                    except BlockingIOError:  # a FIFO: woken, then nothing to read
                        continue
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
    spares = _spares((timeout is not None) + (stdin is not None))
    try:
        proc = _start(argv, env, cwd, user, stdin is not None, stdio, spawn)
    except BaseException as exc:
        for spare in spares:
            spare.give(None)
        if not isinstance(exc, _Refused):
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
            if proc.poll() is None:
                kill_tree(proc.pid, signal.SIGKILL)
            if proc.stdin is not None:
                _close_fed(proc.stdin)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait()
