"""The plain path's words for what the engine would not start: said as the executor says them
(`engine.exec_refusal`, where engine text is read), runc's and runsc's alike."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.container.engine import (
    Engine,
    exec_impossible,
    exec_refusal,
    exec_refused_as_it_died,
    no_process,
)
from orchestrator.backends.container.executor import plain
from orchestrator.backends.container.executor.plain import run_plain
from orchestrator.sandbox.options import Command


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
    assert exec_refusal(said, 126) == expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (0, ("on\n", "", 0)),  # it ran, and its session line was lost on the way
        (1, ("on\n", "", 1)),
        (126, ("", "on\n", 126)),  # the engine would not start it: its reason, on stderr
    ],
)
def test_stdout_before_a_session_line_is_a_refusal_only_when_the_exec_was_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, expected: tuple[str, str, int]
) -> None:
    """The plain path holds a command's stdout until its session line comes on stderr, since
    until then it may be the docker CLI's reason for refusing it. An engine lost that line
    once (gVisor, under load: `echo on` read as stdout "" and stderr "on"); a command that
    exited with a status of its own is no refusal, so what it printed stays its stdout."""
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\necho on\nexit {code}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    cmd = Command(argv=["echo", "on"], env={}, cwd="/", user=None, timeout=10, stdin=None)
    chunks = run_plain(Engine.at("unix:///run/orchestrator-test-none.sock"), "c", cmd)
    said: dict[str, bytes] = {"stdout": b"", "stderr": b""}
    while True:
        try:
            kind, data = next(chunks)
        except StopIteration as stop:
            outcome = stop.value
            break
        said[kind] += data
    assert (said["stdout"].decode(), said["stderr"].decode(), outcome.exit_code) == expected


@pytest.mark.parametrize("size", [64 * 1024, 64 * 1024 + 1, 300 * 1024])
def test_stdout_past_what_a_refusal_holds_comes_whole_and_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """Stdout before the session line is held up to HOLD_LIMIT bytes, never more: past
    that it is the command's own, passed on as it comes, every byte in order."""
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\nhead -c {size} /dev/zero | tr '\\0' x\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    cmd = Command(argv=["x"], env={}, cwd="/", user=None, timeout=10, stdin=None)
    chunks = run_plain(Engine.at("unix:///run/orchestrator-test-none.sock"), "c", cmd)
    out = b""
    while True:
        try:
            kind, data = next(chunks)
        except StopIteration:
            break
        assert kind == "stdout"
        out += data
    assert out == b"x" * size


@pytest.mark.parametrize(
    ("said", "impossible"),
    [
        (
            b"Error response from daemon: Container 3f2a is paused, unpause the container first",
            True,
        ),
        (b"Error response from daemon: Container 3f2a is not running", True),
        (b"Error response from daemon: No such container: 3f2a", True),
        (b"Cannot connect to the Docker daemon at unix:///var/run/docker.sock.", True),
        # runc, when a pause came as it started the exec (review: taken for a full pids
        # limit, the kill owed at the thaw was never made, and the command lived on)
        (b"OCI runtime exec failed: exec failed: cannot exec in a paused state: unknown", True),
        (b"cannot exec in a paused container (use --ignore-paused to override): unknown", True),
        # a full pids limit: runc refuses one exec in about twenty so (126), and the
        # killer tries again (CI: taken as the kill's end, a fork loop lived on)
        (
            b"OCI runtime exec failed: exec failed: unable to start container process: "
            b"read init-p: connection reset by peer: unknown",
            False,
        ),
    ],
    ids=["paused", "stopped", "gone", "engine-down", "runc-paused", "runc-paused-2", "runc-init"],
)
def test_no_exec_can_run_in_a_paused_stopped_or_gone_container_and_else_a_retry_may(
    said: bytes, impossible: bool
) -> None:
    assert exec_impossible(said) is impossible
    assert no_process(said) is not impossible  # (runc's words are a process not started)


@pytest.mark.parametrize(
    ("said", "dying"),
    [  # runc's words, exit 126, as a container was killed when `docker exec` started
        (
            b"OCI runtime exec failed: exec failed: cannot exec in a stopped container: unknown",
            True,
        ),
        (b"cannot exec in a deleted state: unknown", True),
        (b"cannot exec in a stopped state: unknown", True),
        (
            b"OCI runtime exec failed: exec failed: unable to start container process: error "
            b"executing setns process: exit status 1: unknown",
            True,
        ),
        (
            b"OCI runtime exec failed: exec failed: unable to start container process: error "
            b"writing config to pipe: write init-p: broken pipe: unknown",
            True,
        ),
        (b"unable to find user x: no matching entries in passwd file", False),
        (
            b"OCI runtime exec failed: exec failed: unable to start container process: "
            b'exec: "nope": executable file not found in $PATH: unknown',
            False,
        ),
    ],
)
def test_an_exec_refused_as_its_container_stopped_is_told_from_a_refused_command(
    said: bytes, dying: bool
) -> None:
    assert exec_refused_as_it_died(said) is dying


class _Target:
    """A stand-in for the engine's exec target: each pass of the killer runs `script`."""

    def __init__(self, script: str) -> None:
        self.script = script

    def argv(self, argv: list[str], **_: object) -> list[str]:
        return ["/bin/sh", "-c", self.script]


class _Engine:
    def __init__(self, script: str) -> None:
        self.target = _Target(script)

    def exec_target(self, container: str) -> _Target:
        return self.target


def _passes(tmp_path: Path, then: str) -> str:
    """Three passes that could not start ("can't fork"), then `then`."""
    count = tmp_path / "count"
    count.write_text("0")
    return (
        f'n=$(cat {count}); echo $((n + 1)) > {count}; if [ "$n" -lt 3 ]; then '
        'echo "sh: can\'t fork: Resource temporarily unavailable" >&2; exit 2; fi; ' + then
    )


@pytest.mark.parametrize(
    ("then", "kept"),
    [
        ("exec sleep 30", True),  # cut at the kill's deadline: the kill never ran
        ("echo 'Error response from daemon: Container c is paused, unpause it' >&2; exit 1", False),
        ("echo 'cannot exec in a paused state: unknown'; exit 126", False),
    ],
    ids=["cut-at-the-deadline", "paused", "runc-paused"],
)
def test_what_a_kill_that_could_not_start_said_stays_until_a_pass_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str, kept: bool
) -> None:
    """Passes that could not start are tried again; what they said is why the command's
    processes may still run (SandboxUnavailable), unless a later pass finds the container
    paused, stopped or gone (review: a pause that came as the killer started was taken for
    a full pids limit, and the kill owed at the thaw was never made)."""

    monkeypatch.setattr(plain, "KILL_TIMEOUT", 3.0)
    killer = plain.Killer(_Engine(_passes(tmp_path, then)), "c", None)  # type: ignore[arg-type]
    began = time.monotonic()
    killer.signal(signal.SIGKILL)
    assert time.monotonic() - began < 3.0 + 2
    assert not killer.ran
    assert (b"can't fork" in killer.no_process) is kept, killer.no_process


def test_a_timed_out_commands_kill_is_bounded_as_a_whole_and_a_cut_one_is_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ATTACK (a root sandbox replaces /bin/sh with one that never ends): the kill of a
    timed-out command is bounded as a whole, not once per signal (review: a `timeout=1` call
    took 61 s): its SIGTERM passes take KILL_TIMEOUT / 2, its SIGKILL passes (the timeout's,
    then a caller's that gave up) KILL_TIMEOUT in all; the docker client is killed with each
    SIGKILL, and a kill cut at its deadline is unfinished (the call says so)."""

    monkeypatch.setattr(plain, "KILL_TIMEOUT", 4.0)
    killer = plain.Killer(_Engine("exec sleep 30"), "c", None)  # type: ignore[arg-type]
    with subprocess.Popen(["sleep", "60"]) as client:
        began = time.monotonic()
        killer(client, signal.SIGTERM)
        termed = time.monotonic() - began
        assert client.poll() is None, "a SIGTERM killed the docker client"
        killer(client, signal.SIGKILL)
        killer(client, signal.SIGKILL)  # (the caller gave up meanwhile)
        took = time.monotonic() - began
        assert client.wait(5) == -signal.SIGKILL
    assert 1.5 < termed < 2.0 + 1, termed
    assert 5.5 < took < 6.0 + 1.5, took
    assert not killer.ran and killer.unfinished


def test_a_kill_pass_ends_an_earlier_pass_of_the_same_kill_cut_at_its_deadline() -> None:
    """ATTACK (review: a uid-1000 sandbox made each pass slow with processes of huge
    environments): a pass cut at its deadline runs on in the sandbox, and its end (SIGTERM,
    then SIGCONT) would resume what the next pass froze; each pass SIGKILLs earlier passes
    of the same kill (their token), and nothing else."""

    token, other = "ab" * 16, "cd" * 16
    env = {"PATH": os.environ["PATH"]}
    stale = subprocess.Popen(["sleep", "60"], env={**env, plain.KILL_TOKEN: token})
    unrelated = subprocess.Popen(["sleep", "60"], env={**env, plain.KILL_TOKEN: other})
    try:
        argv = ["sh", "-c", plain.KILL_TREE, "sh", "TERM", "0", "0"]
        done = subprocess.run(
            argv, env={**env, plain.KILL_TOKEN: token}, capture_output=True, text=True, timeout=60
        )
        assert plain.DONE in done.stdout, done
        assert stale.wait(5) == -9
        assert unrelated.poll() is None, "a pass killed another command's killer"
    finally:
        for proc in (stale, unrelated):
            proc.kill()
            proc.wait()


def test_a_sigkill_pass_that_ends_undone_is_unfinished(tmp_path: Path) -> None:
    """ATTACK (review: a root sandbox's /bin/sh that exits at once for the killer, or a
    uid-1000 process that kills every pass): a SIGKILL pass that ended without being done,
    in a sandbox not paused, stopped or gone, leaves the kill unfinished (the call says so)
    rather than taken for done."""

    killer = plain.Killer(_Engine("exit 0"), "c", None)  # type: ignore[arg-type]
    with subprocess.Popen(["sleep", "60"]) as client:
        killer(client, signal.SIGKILL)
    assert killer.unfinished and not killer.ran


def test_the_passes_of_one_kill_never_run_at_once(tmp_path: Path) -> None:
    """ATTACK (review: a caller's signal during the timeout's kill ran a second pass beside
    it, and each pass kills the other passes of its token): a kill's passes, whoever asks
    for them, run one at a time."""

    held, log = tmp_path / "held", tmp_path / "log"
    script = (
        f"if mkdir {held} 2>/dev/null; then sleep 0.5; rmdir {held}; "
        f"else echo overlap >> {log}; fi; echo {plain.DONE}"
    )
    killer = plain.Killer(_Engine(script), "c", None)  # type: ignore[arg-type]
    with subprocess.Popen(["sleep", "60"]) as client:
        others = [
            threading.Thread(target=killer.signal, args=(signal.SIGUSR1,)),
            threading.Thread(target=killer, args=(client, signal.SIGKILL)),
            threading.Thread(target=killer.finish),
        ]
        for thread in others:
            thread.start()
        for thread in others:
            thread.join(30)
    assert not log.exists(), log.read_text()
    assert killer.ran and not killer.unfinished


def test_an_owed_kill_is_done_only_when_its_own_pass_ran() -> None:
    """ATTACK (review: `finish` said whether any pass of the killer had ever run, so a kill
    owed by a command that was signalled before was dropped when the sandbox, paused again,
    refused it): `finish` says whether its own pass ran."""

    engine = _Engine(f"echo {plain.DONE}")
    killer = plain.Killer(engine, "c", None)  # type: ignore[arg-type]
    killer.signal(signal.SIGUSR1)
    assert killer.ran
    engine.target.script = "echo 'Error response from daemon: Container c is paused' >&2; exit 1"
    assert not killer.finish()
    engine.target.script = f"echo {plain.DONE}"
    assert killer.finish()


def test_a_timeouts_pass_kills_what_outlived_its_sigterm_after_the_grace() -> None:
    """A timeout's pass (THEN > 0) sends SIGTERM, waits the grace on the clock of
    /proc/uptime, looks again and SIGKILLs what is left, in one exec: what heeds SIGTERM
    dies of it; what ignores it, and what it started meanwhile, die of the SIGKILL. (Each
    in a session of its own: the pass kills every process of a session it finds.)"""
    token = os.urandom(16).hex()
    child = f"sleep {10_000_000 + int(token[:6], 16)}"  # (a command line no other has)
    path = {"PATH": os.environ["PATH"]}
    marked = {**path, plain.MARK: token}
    polite = subprocess.Popen(["sleep", "60"], env=marked, start_new_session=True)
    deaf = subprocess.Popen(
        ["sh", "-c", f"trap '' TERM; {child} & wait; sleep 60"],
        env=marked,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["pgrep", "-f", child], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "its child did not start"
            time.sleep(0.05)
        argv = ["sh", "-c", plain.KILL_TREE, "sh", "TERM", "0", "50"]
        done = subprocess.run(
            argv, env={**path, plain.KILL_TOKEN: token}, capture_output=True, text=True, timeout=60
        )
        assert plain.DONE in done.stdout, done
        assert polite.wait(5) == -signal.SIGTERM
        assert deaf.wait(5) == -signal.SIGKILL
        left = subprocess.run(["pgrep", "-f", child], capture_output=True)
        assert left.stdout == b"", left
    finally:
        for proc in (polite, deaf):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # (its group: a child left by a failure)
            proc.wait()


def _late_session(tmp_path: Path, found: str, session: str, during: bool) -> list[str]:
    """A timeout's pass that finds `found` while `session` is learned during it (or after
    it), then the timeout's SIGKILL: each pass's name and arguments, and the sessions."""
    log, go = tmp_path / "log", tmp_path / "go"
    script = (
        f'echo "$0 $*" >> {log}; echo orchestrator-termed; '
        f"while [ ! -e {go} ]; do sleep 0.01; done; echo {plain.DONE} {found}"
    )
    killer = plain.Killer(_Engine(script), "c", None)  # type: ignore[arg-type]
    with subprocess.Popen(["sleep", "60"]) as client:
        term = threading.Thread(target=killer, args=(client, signal.SIGTERM))
        term.start()
        deadline = time.monotonic() + 10
        while not log.exists():
            assert time.monotonic() < deadline, "no pass began"
            time.sleep(0.01)
        if during:
            killer.learn(session)
        go.touch()
        term.join(30)
        if not during:
            killer.learn(session)
        assert session in killer.sessions[:1] + killer.sessions[-1:], killer.sessions[:3]
        killer(client, signal.SIGKILL)
    return log.read_text().splitlines()


@pytest.mark.parametrize("during", [True, False], ids=["during", "after"])
def test_a_session_learned_as_the_timeouts_pass_runs_is_killed_by_a_pass_of_its_own(
    tmp_path: Path, during: bool
) -> None:
    """A busy engine starts a command late: its session line may come while the timeout's
    pass runs, or after it, and a command that cleared its environment at once (`exec env
    -i`) is found by nothing else (CI, once: two of its processes ran on). That pass's end
    neither drops the session nor stands for its SIGKILL: a pass of its own follows."""
    passes = _late_session(tmp_path, "11", "22", during)
    assert passes[0] == "TERM 0 50" and sorted(passes[1].split()) == ["0", "0", "11", "22", "KILL"]


def test_a_timeouts_pass_that_found_every_session_known_stands_for_its_sigkill(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    script = f'echo "$0 $*" >> {log}; echo orchestrator-termed; echo {plain.DONE} 11'
    killer = plain.Killer(_Engine(script), "c", None)  # type: ignore[arg-type]
    with subprocess.Popen(["sleep", "60"]) as client:
        killer(client, signal.SIGTERM)
        killer(client, signal.SIGKILL)
    assert log.read_text().splitlines() == ["TERM 0 50"]


def test_a_session_learned_as_the_pass_finds_a_full_list_is_kept_first(tmp_path: Path) -> None:
    """ATTACK (hostile review): a timeout's pass that found MAX_SESSIONS sessions (marked
    `setsid` children) cut the one learned meanwhile, the command's own, off the list, and
    stood for its SIGKILL: what is learned meanwhile comes first."""
    many = " ".join(str(1000 + i) for i in range(plain.MAX_SESSIONS))
    passes = _late_session(tmp_path, many, "77", during=True)
    assert len(passes) == 2 and passes[1].split()[3] == "77", [p[:40] for p in passes]


def test_a_session_learned_as_the_pass_merges_what_it_found_is_not_lost(tmp_path: Path) -> None:
    """ATTACK (hostile review): the reader thread learned the command's session between the
    pass's reading of the list and its replacing it: the session went into the old list,
    lost, and the SIGKILL was skipped. The two hold one lock (the reader is held here, at
    that very line, by a trace of the pass's frame, until the pass has gone on)."""
    log = tmp_path / "log"
    script = f'echo "$0 $*" >> {log}; echo orchestrator-termed; echo {plain.DONE} 11'
    killer = plain.Killer(_Engine(script), "c", None)  # type: ignore[arg-type]
    code = plain.Killer._once.__code__
    source = Path(code.co_filename).read_text().splitlines()
    line = next(i + 1 for i, text in enumerate(source) if "self.sessions = list(dict" in text)
    at_line, learned = threading.Event(), threading.Event()

    def tracer(frame: Any, event: str, arg: object) -> Any:
        if frame.f_code is not code:
            return None

        def local(frame: Any, event: str, arg: object) -> Any:
            if event == "line" and frame.f_lineno == line:
                at_line.set()
                learned.wait(1)  # (the reader runs here: held by the lock, it cannot)
            return local

        return local

    def reader() -> None:
        at_line.wait(30)
        plain._session(b"orchestrator-session:22\n", killer)
        learned.set()

    def term(client: subprocess.Popen[bytes]) -> None:
        sys.settrace(tracer)
        killer(client, signal.SIGTERM)

    with subprocess.Popen(["sleep", "60"]) as client:
        threads = [threading.Thread(target=reader), threading.Thread(target=term, args=(client,))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert at_line.is_set() and killer.sessions == ["11", "22"], killer.sessions
        killer(client, signal.SIGKILL)
    assert log.read_text().splitlines() == ["TERM 0 50", "KILL 0 0 11 22"]


def test_a_session_learned_once_the_kill_was_done_gets_a_pass_of_its_own(tmp_path: Path) -> None:
    """ATTACK (hostile review): a session line read only after the timeout's SIGKILL (a
    busy engine; a caller slow to read) was killed by nothing, and nothing said so. The
    call's end kills it (`finish_late`), within what is left of the SIGKILL's share; a
    kill that cannot be made is said (False: the call raises SandboxUnavailable)."""
    log = tmp_path / "log"
    script = f'echo "$0 $*" >> {log}; echo orchestrator-termed; shift 2; echo {plain.DONE} "$@"'
    killer = plain.Killer(_Engine(script), "c", None)  # type: ignore[arg-type]
    killer.cancels = True
    with subprocess.Popen(["sleep", "60"]) as client:
        killer(client, signal.SIGTERM)
        killer(client, signal.SIGKILL)
    assert killer.finish_late()  # no session known: nothing to do
    plain._session(b"orchestrator-session:33\n", killer)
    assert killer.finish_late()
    # (the SIGKILL's own pass ran: no session was known, one may have been on its way)
    assert log.read_text().splitlines() == ["TERM 1 50", "KILL 1 0", "KILL 1 0 33"]
    assert killer.finish_late()  # done: no other pass
    assert len(log.read_text().splitlines()) == 3
    killer.learn("44")
    killer._engine.exec_target("c").script = "exit 0"  # type: ignore[attr-defined]  # undone
    assert not killer.finish_late()


def test_a_kill_that_did_not_run_is_left_to_what_says_so_not_made_late(tmp_path: Path) -> None:
    """A timeout's kill the engine refused (a paused sandbox: the kill is owed until the
    thaw, owed.py) makes no late pass at the call's end, which would be refused as well and
    turn the paused sandbox's answer into SandboxUnavailable (CI: five pause tests)."""
    log = tmp_path / "log"
    paused = "echo 'Error response from daemon: Container c is paused' >&2; exit 1"
    script = f'echo "$0" >> {log}; {paused}'
    killer = plain.Killer(_Engine(script), "c", None)  # type: ignore[arg-type]
    with subprocess.Popen(["sleep", "60"]) as client:
        killer(client, signal.SIGTERM)
        killer(client, signal.SIGKILL)
    killer.learn("55")
    assert killer.finish_late()
    assert log.read_text().splitlines() == ["TERM", "KILL"]
