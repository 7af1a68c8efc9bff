"""The process core reading a command's output from a FIFO (`out=`), as folder downloads do,
and a slow reader losing nothing of what a command wrote before it exited."""

from __future__ import annotations

import fcntl
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator import procutil
from orchestrator.procutil import F_SETPIPE_SZ, Outcome, fed, workers


@contextmanager
def fifo(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    path = tmp_path / "out.fifo"
    os.mkfifo(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        yield path, fd
    finally:
        os.close(fd)


def collect(argv: list[str], out: int, pause: float = 0.0) -> tuple[bytes, bytes, Outcome]:
    """Run argv with its output in the FIFO `out`, sleeping `pause` after each chunk."""
    stdout, stderr = bytearray(), bytearray()
    chunks = procutil.run(argv, None, None, timeout=60, out=out)
    while True:
        try:
            kind, data = next(chunks)
        except StopIteration as stop:
            return bytes(stdout), bytes(stderr), stop.value
        (stdout if kind == "stdout" else stderr).extend(data)
        time.sleep(pause)


def test_output_comes_through_the_fifo_and_own_stdout_counts_as_stderr(tmp_path: Path) -> None:
    with fifo(tmp_path) as (path, fd):
        script = f"import sys; open({str(path)!r}, 'wb').write(b'data'); print('said')"
        stdout, stderr, outcome = collect([sys.executable, "-c", script], fd)
    assert (stdout, stderr, outcome.exit_code) == (b"data", b"said\n", 0)


def test_a_fifo_nobody_opens_does_not_hold_the_call(tmp_path: Path) -> None:
    with fifo(tmp_path) as (_, fd):
        started = time.monotonic()
        stdout, _, outcome = collect(["sh", "-c", "exit 3"], fd)
    assert (stdout, outcome.exit_code) == (b"", 3)
    assert time.monotonic() - started < 5


def test_a_slow_reader_gets_everything_written_before_the_exit(tmp_path: Path) -> None:
    """The writer finishes at once into a 1 MiB FIFO; the reader then takes longer than the
    drain limits per chunk. Time the caller holds a chunk is not silence: nothing is lost."""
    size = 1 << 20
    with fifo(tmp_path) as (path, fd):
        fcntl.fcntl(fd, F_SETPIPE_SZ, size)
        script = f"open({str(path)!r}, 'wb').write(b'x' * {size})"
        pause = procutil.DRAIN_MAX / 2  # 4 chunks of 256 KiB: held longer than DRAIN_MAX
        stdout, stderr, outcome = collect([sys.executable, "-c", script], fd, pause)
    assert outcome.exit_code == 0, stderr
    assert len(stdout) == size


def _drain(gen: Generator[procutil.Chunk, None, Outcome]) -> Outcome:
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def test_the_deadline_holds_when_no_thread_can_start_after_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fork bomb under a pids limit takes every pid right after it starts: the watchdog
    and the stdin feeder must already be running by then."""

    def no_more_threads(proc: object) -> None:
        def refuse(self: threading.Thread) -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(threading.Thread, "start", refuse)

    gen = procutil.run(
        ["sh", "-c", "cat >/dev/null; sleep 30"],
        None,
        None,
        stdin=iter([b"input"]),
        timeout=0.5,
        on_start=no_more_threads,
    )
    started = time.monotonic()
    outcome = _drain(gen)
    assert outcome.timed_out and time.monotonic() - started < 10


def test_no_thread_before_the_process_means_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    monkeypatch.setattr(workers, "_idle", [])  # no thread of an earlier command waiting
    with pytest.raises(procutil.NoProcess, match="process limit"):
        _drain(procutil.run(["true"], None, None, timeout=5))


def _run_all(gen: Generator[procutil.Chunk, None, Outcome]) -> tuple[Outcome, bytes]:
    """The outcome, and everything the command printed (both streams)."""
    out = b""
    while True:
        try:
            out += next(gen)[1]
        except StopIteration as stop:
            return stop.value, out


def _idle_at_least(count: int) -> None:
    deadline = time.monotonic() + 5
    while len(workers._idle) < count:
        assert time.monotonic() < deadline, "the last command's threads never came back"
        time.sleep(0.01)


def refuse_threads(self: threading.Thread) -> None:
    raise RuntimeError("can't start new thread")


def test_the_next_command_takes_the_last_ones_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command takes up to three threads (the executor's runner, its watchdog, its stdin
    feeder), and a thread costs about 1 ms to start under gVisor: the last command's wait
    for the next instead of ending. So the next one starts none, and runs where none can
    start (its deadline kept)."""
    monkeypatch.setattr(workers, "_idle", [])
    first = _drain(procutil.run(["cat"], None, None, stdin=iter([b"x"]), timeout=5))
    assert first.exit_code == 0
    _idle_at_least(2)
    monkeypatch.setattr(threading.Thread, "start", refuse_threads)
    started = time.monotonic()
    outcome = _drain(
        procutil.run(["sh", "-c", "cat; sleep 30"], None, None, stdin=[b"in"], timeout=0.5)
    )
    assert outcome.timed_out and time.monotonic() - started < 10
    procutil.in_thread(lambda: None)  # the executor's runner, likewise
    assert len(workers._idle) <= procutil.IDLE_WORKERS


def test_at_most_so_many_threads_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle threads count against a sandbox's pids limit: no more than IDLE_WORKERS wait,
    however many commands ran at once."""
    monkeypatch.setattr(workers, "_idle", [])
    ends = [threading.Event() for _ in range(8)]

    def waiting(end: threading.Event) -> Callable[[], None]:
        def job() -> None:
            end.wait()

        return job

    for end in ends:
        procutil.in_thread(waiting(end))
    for end in ends:
        end.set()
    _idle_at_least(procutil.IDLE_WORKERS)
    time.sleep(0.2)  # the others end rather than wait
    assert len(workers._idle) == procutil.IDLE_WORKERS


def test_a_job_on_a_waiting_thread_does_not_inherit_the_last_ones_scope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that marked its thread abandoned (abandon_when) leaves that mark behind: the
    next job on the same thread must not find its command abandoned at once."""
    monkeypatch.setattr(workers, "_idle", [])
    gone = threading.Event()
    gone.set()
    procutil.in_thread(lambda: procutil.abandon_when(gone))
    _idle_at_least(1)
    got: list[Outcome] = []
    done = threading.Event()

    def run_one() -> None:
        try:
            got.append(_drain(procutil.run(["sh", "-c", "sleep 0.2; echo ok"], None, None)))
        finally:
            done.set()

    procutil.in_thread(run_one)  # the same thread: the only one waiting
    assert done.wait(10) and got[0].exit_code == 0


def test_a_forked_child_starts_its_own_threads() -> None:
    """The idle threads are not copied into a child forked from this process: its command's
    deadline must be kept by a thread that runs there."""
    _drain(procutil.run(["true"], None, None, timeout=5))
    _idle_at_least(1)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports by its exit status
        try:
            began = time.monotonic()
            outcome = _drain(procutil.run(["sleep", "20"], None, None, timeout=0.3))
            os._exit(0 if outcome.timed_out and time.monotonic() - began < 5 else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_zombie_owner_is_not_alive_though_its_start_time_still_reads() -> None:
    """An owner killed and not yet reaped by its parent is a zombie: its /proc entry, start
    time included, stays until then. A guardian must act at once all the same."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        start = procutil.process_start(pid)
        deadline = time.monotonic() + 5
        while procutil.stat_fields(pid)[:1] != [b"Z"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procutil.process_start(pid) == start != ""  # what a pid check alone sees
        assert not procutil.alive(pid, start)
        assert procutil.alive(os.getpid(), procutil.process_start(os.getpid()))
    finally:
        os.waitpid(pid, 0)


def test_a_fed_pipe_let_go_inside_the_guard_does_not_wait_on_itself() -> None:
    """A garbage collection inside the guard may finish another command, whose generator
    lets its stdin go (the guard again, in the same thread): that must not deadlock it."""
    read_end, write_end = os.pipe()
    pipe = os.fdopen(write_end, "wb")
    fed.feeding(pipe)
    done = threading.Event()

    def inside() -> None:
        with fed.FED_GUARD:
            fed.close_fed(pipe)
        done.set()

    threading.Thread(target=inside, daemon=True).start()
    assert done.wait(5), "letting a fed pipe go inside the guard waited on the guard"
    assert os.read(read_end, 10) == b"" and write_end not in fed.FED
    os.close(read_end)


class _SlowPipe:
    """A stdin pipe whose close() takes its time (a buffered writer waiting on a command
    that reads no more), recording whether another thread could take the guard meanwhile."""

    def __init__(self, fd: int) -> None:
        self.fd, self.closed, self.free = fd, False, [False]

    def fileno(self) -> int:
        return self.fd

    def flush(self) -> None:
        pass

    def close(self) -> None:
        other = threading.Thread(target=self._try)
        other.start()
        other.join()
        os.close(self.fd)
        self.closed = True

    def _try(self) -> None:
        if fed.FED_GUARD.acquire(timeout=1):
            fed.FED_GUARD.release()
            self.free[0] = True


def test_a_fed_pipe_is_closed_outside_the_guard_every_fork_takes() -> None:
    """Closing a pipe's file object may wait (its buffer); meanwhile every os.fork() of the
    process would wait on the guard: the pipe is let go under it and closed
    outside it."""
    read_end, write_end = os.pipe()
    pipe = _SlowPipe(write_end)
    fed.feeding(pipe)  # type: ignore[arg-type]
    fed.close_fed(pipe)  # type: ignore[arg-type]
    assert pipe.closed and pipe.free == [True]
    assert write_end not in fed.FED
    os.close(read_end)


@pytest.mark.parametrize("null", ["the null device", "a FIFO someone put there"])
def test_a_fed_pipe_let_go_is_gone_for_its_reader_and_not_inherited(
    null: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its number stays taken (a file object still names it): by /dev/null, or, where that
    is not the null device (root in a sandbox can make it a FIFO, whose open would wait),
    by a pipe nobody reads."""
    if null != "the null device":
        fifo = tmp_path / "null"
        os.mkfifo(fifo)
        keeper = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader: opening it succeeds
        monkeypatch.setattr(os, "devnull", str(fifo))
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    fed.let_go(write_end)
    mode = os.fstat(write_end).st_mode
    assert stat.S_ISCHR(mode) if null == "the null device" else stat.S_ISFIFO(mode)
    assert not os.get_inheritable(write_end)
    assert os.read(read_end, 10) == b""  # the pipe's only write end went
    os.close(write_end)
    os.close(read_end)
    if null != "the null device":
        assert os.read(keeper, 10) == b""  # and nothing went to the FIFO
        os.close(keeper)


@pytest.mark.parametrize("user", ["4294967295", "0:4294967295", "2147483648", "7:99999999999"])
def test_an_id_out_of_the_kernels_range_is_an_unknown_user(user: str) -> None:
    """4294967295 is -1 to setuid and setgid ("leave it unchanged"): a command asked to run
    as it ran as root. Refused as a user that does not exist (126), like any other."""
    with pytest.raises(procutil.UnknownUser, match="out of range"):
        procutil.resolve_ids(user)
    outcome, out = _run_all(procutil.run(["id", "-u"], None, None, user=user))
    assert outcome.exit_code == 126 and b"out of range" in out


def test_a_passwd_entry_out_of_range_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """An image's passwd file may give a name the id -1: the name does not make it root."""
    import pwd

    entry = pwd.struct_passwd(("agent", "x", 4294967295, 4294967295, "", "/", "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwnam", lambda name: entry)
    with pytest.raises(procutil.UnknownUser, match="uid 4294967295 is out of range"):
        procutil.resolve_ids("agent")


def test_only_ascii_digits_are_an_id() -> None:
    """int() reads other scripts' digits too: an Arabic-Indic one would have been uid 1
    here, and a name to the engine."""
    assert procutil.numeric_ids("\u0661") is None
    with pytest.raises(procutil.UnknownUser, match="unable to find user"):
        procutil.resolve_ids("\u0661")
