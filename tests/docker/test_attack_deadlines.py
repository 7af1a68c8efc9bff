"""Attacks on the deadlines of file calls and of the plain path's kill (issue 19, items 4, 14
and 15): a sandbox that holds a file call (a stopped `tar`), a child that clears its
environment to escape the kill, a fork loop that fills the pids limit."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import SandboxUnavailable
from orchestrator.backends.container.executor.plain import Killer
from orchestrator.errors import SandboxFileTimeout
from orchestrator.sandbox.base import Runtime
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, bounded
from tests.docker.conftest import MakeEnv, spawn_in_mode

SLACK = 6.0
"""Seconds a timed-out file call may take past its deadline (kill, grace, engine calls)."""
# A root sandbox puts a shell in place of /bin/sh that stops itself when it is asked to run a
# `tar` that packs or unpacks a stream (the file calls' own command lines), and passes every
# other command line on to the real shell. Every file call starts its tar through /bin/sh, so
# the hold takes every time, on any load (a loop that stopped each `tar` it saw in /proc lost
# the race under load: the download was over before the loop came round).
STOP_TAR = (
    r'r=$(readlink -f /bin/sh) && a= && case $r in */busybox) a=" sh" ;; esac && '
    r"""rm -f /bin/sh && printf '#!%s\ncase $2 in *"tar -"[cx]" -"*) kill -STOP $$ ;; esac\n"""
    r"""exec %s "$@"\n' "$r$a" "$r$a" > /bin/sh && chmod 755 /bin/sh"""
)


def stop_tar(rt: Runtime) -> None:
    rt.execute(STOP_TAR, user="root", timeout=10, check=True)


CASES = [(PYTHON_IMAGE, "auto"), (BUSYBOX_IMAGE, "plain")]


@pytest.fixture(params=CASES, ids=["executor", "plain"])
def rt(request: pytest.FixtureRequest, make_env: MakeEnv) -> Iterator[Runtime]:
    image, mode = request.param
    runtime = spawn_in_mode(mode, make_env("", image=image))
    with runtime:
        yield runtime


def assert_timed_out(outcome: object, path: str) -> None:
    assert isinstance(outcome, SandboxFileTimeout), outcome
    assert isinstance(outcome, TimeoutError)
    assert path in str(outcome) and "ORCHESTRATOR_FILE_TIMEOUT" in str(outcome)


# A FIFO in place of the file no longer holds read_file or write_file: it is refused at once
# (issue 37, item 11: tests/docker/test_attack_issue37_files.py). A stopped `tar` still holds
# a folder's transfer, until its deadline:


def test_file_calls_have_a_default_deadline(
    rt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt.execute("mkdir -p d && head -c 20000000 /dev/urandom > d/f", timeout=30, check=True)
    stop_tar(rt)
    monkeypatch.setenv("ORCHESTRATOR_FILE_TIMEOUT", "2")
    outcome, _ = bounded(lambda: rt.download("d", tmp_path / "out"), 2 + SLACK)  # no timeout
    assert_timed_out(outcome, "d")


def test_download_with_its_tar_stopped_ends_at_its_deadline(rt: Runtime, tmp_path: Path) -> None:
    rt.execute("mkdir -p d && head -c 20000000 /dev/urandom > d/f", timeout=30, check=True)
    stop_tar(rt)
    outcome, _ = bounded(lambda: rt.download("d", tmp_path / "out", timeout=3), 3 + SLACK)
    assert_timed_out(outcome, "d")
    assert not (tmp_path / "out" / "f").exists()


def test_upload_with_its_tar_stopped_ends_at_its_deadline(rt: Runtime, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(os.urandom(32 << 20))  # far more than a pipe holds
    stop_tar(rt)
    outcome, _ = bounded(lambda: rt.upload(src, "up", timeout=3), 3 + SLACK)
    assert_timed_out(outcome, "up")


# ----- the plain path's kill (busybox: no python3) -------------------------------------------
@pytest.fixture
def plain(make_env: MakeEnv) -> Iterator[Runtime]:
    runtime = spawn_in_mode("plain", make_env("resources: {pids: 40}\n", image=BUSYBOX_IMAGE))
    with runtime:
        yield runtime


def sleeping(rt: Runtime, seconds: int) -> list[str]:
    ps = rt.execute("ps -o pid,args", timeout=20).stdout.splitlines()
    return [line for line in ps if f"sleep {seconds}" in line]


@pytest.mark.parametrize(
    "command",
    [
        """sh -c 'env -i sh -c "sleep 301" & sleep 301'""",
        "exec env -i sh -c 'sleep 301 & sleep 301'",  # the command's own process too
        "env -i setsid sh -c 'sleep 301 & sleep 301' & sleep 301",  # a new session, no mark
    ],
    ids=["child", "itself", "setsid-child"],
)
def test_a_child_that_clears_its_environment_dies_at_the_timeout(
    plain: Runtime, command: str
) -> None:
    result = plain.execute(command, timeout=1)
    assert result.timed_out
    assert not sleeping(plain, 301)


@pytest.mark.parametrize("until", [signal.SIGTERM, signal.SIGKILL], ids=["its-pass", "its-kill"])
def test_a_command_whose_session_came_late_dies_at_the_timeout(
    plain: Runtime, monkeypatch: pytest.MonkeyPatch, until: int
) -> None:
    """A busy engine starts a command late: its session line came after the timeout's pass
    had run, and the command, which cleared its environment at once, was found by nothing
    else (CI, once: its two processes ran on). ATTACK (hostile review): a line that came
    after the timeout's SIGKILL too (a caller slow to read) was killed by nothing, and
    nothing said so: the call's end kills it. Here the line is held until the timeout's
    SIGTERM (its pass), or its SIGKILL, is done."""
    from orchestrator.backends.container.executor import plain as path

    done = threading.Event()
    call, session = Killer.__call__, path._session

    def call_then_tell(self: Killer, client: subprocess.Popen[bytes], sig: int) -> None:
        try:
            call(self, client, sig)
        finally:
            if sig == until:
                done.set()

    def held(head: bytes, killer: Killer) -> tuple[bytes | None, bytes]:
        if b"\n" in head:
            done.wait(40)
        return session(head, killer)

    monkeypatch.setattr(Killer, "__call__", call_then_tell)
    monkeypatch.setattr(path, "_session", held)
    result = plain.execute("exec env -i sh -c 'sleep 304 & sleep 304'", timeout=1)
    assert result.timed_out
    assert done.is_set()
    assert not sleeping(plain, 304)


def test_a_fork_loop_that_fills_the_pids_limit_dies_at_the_timeout(plain: Runtime) -> None:
    # one loop dies at its first failed fork; what it started holds every slot
    command = "sleep 302 & (while :; do sleep 302 & done) 2>/dev/null; wait"
    result = plain.execute(command, timeout=3)
    assert result.timed_out
    assert not sleeping(plain, 302)
    # and the sandbox can start processes again
    assert plain.execute("echo $(echo ok)", timeout=20).stdout == "ok\n"


@pytest.mark.parametrize("kill", ["sigkill", "timeout"])
def test_a_command_whose_kill_came_before_it_started_never_runs(plain: Runtime, kill: str) -> None:
    # a busy engine may start a `docker exec` seconds after its client asked, and after the
    # client was killed at the timeout: the kill, which found nothing yet, must still hold,
    # whether a SIGKILL alone (a caller gave up) or a timeout's SIGTERM, grace and SIGKILL
    from orchestrator.backends.container.executor.plain import Killer, run_plain
    from orchestrator.sandbox.options import Command

    engine, container = plain._engine_of_main(), plain._container  # type: ignore[attr-defined]
    killer = Killer(engine, container, None)
    killer.cancels = True  # (as run_plain makes its killer)
    if kill == "sigkill":
        assert killer.finish()  # the timeout's kill, before the command's exec starts
    else:
        client = subprocess.Popen(["sleep", "60"])  # stands for the command's docker client
        try:
            killer(client, signal.SIGTERM)
            assert killer.ran and not killer.unfinished
            killer(client, signal.SIGKILL)
            assert client.wait(10) == -signal.SIGKILL
        finally:
            client.kill()
            client.wait()
    mark = f"/dev/shm/.orchestrator-cancelled-{killer.token}"
    assert plain.execute(f"test -e {mark}", timeout=20).exit_code == 0
    late = Command(["sh", "-c", "echo ran > /tmp/late"], {}, "/", None, 20, None)
    chunks, _ = bounded(lambda: list(run_plain(engine, container, late, killer=killer)), 60)
    assert chunks == []
    assert plain.execute("cat /tmp/late", timeout=20).exit_code == 1
    assert plain.execute(f"test -e {mark}", timeout=20).exit_code == 1  # (taken away)
    # a command of another mark runs as ever
    assert plain.execute("echo ran > /tmp/late && cat /tmp/late", timeout=20).stdout == "ran\n"


def test_a_plain_timeout_kills_by_one_exec(plain: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeout's SIGTERM, grace and SIGKILL are sent by one exec in the container: a busy
    engine takes seconds to start each, and a call past its deadline waited for two (a
    download held by a stopped tar took more than 3 s past its deadline, once, in CI)."""
    from orchestrator.backends.container.executor.plain import Killer

    passes: list[str] = []
    once = Killer._once

    def counted(self: Killer, name: str, deadline: float, then: float = 0.0) -> bytes | None:
        passes.append(name)
        return once(self, name, deadline, then)

    monkeypatch.setattr(Killer, "_once", counted)
    result = plain.execute(
        "trap 'sleep 303 &' TERM; sleep 303 & while :; do sleep 1; done", timeout=1
    )
    assert result.timed_out
    assert passes == ["TERM"]
    assert not sleeping(plain, 303)


# a command's SIGTERM trap that finds its killer (same uid: its environment is readable),
# then forges the killer's last line into its output and kills it (ACTION 1), or stops it
# (ACTION 2); the command itself runs on
AT_ITS_KILLER = r"""
m=MARK; trap 'for d in /proc/[0-9]*; do
  case "$(tr "\0" " " < $d/environ 2>/dev/null)" in *ORCHESTRATOR_KILL=*)
    if [ ACTION = 1 ]; then echo "orchestrator-killed: " > $d/fd/1; kill -KILL ${d#/proc/}
    else kill -STOP ${d#/proc/}; fi ;;
  esac; done' TERM
while :; do sleep 0.05; done
"""


@pytest.mark.parametrize("action", [1, 2], ids=["forges-its-end", "stops-it"])
def test_a_command_that_turns_on_its_killer_dies_at_its_timeout(
    plain: Runtime, action: int
) -> None:
    """ATTACK (hostile review; a uid-1000 sandbox): the timeout's pass lets the command run
    during its grace, as the killer's own uid. A command that wrote the killer's last line
    into its output and killed it was taken for killed, and ran on; one that stopped it
    held the call for the SIGTERM's whole 15 s. The line counts only as the last of a pass
    that exited 0, and the pass must end within its grace and AFTER_GRACE, else a SIGKILL
    pass of its own follows."""
    mark = f"turn{action}x"
    script = AT_ITS_KILLER.replace("MARK", mark).replace("ACTION", str(action))
    # two killers are started (the timeout's, cut; then its SIGKILL's), each a `docker exec`
    # that a loaded engine takes seconds to start (a CI run missed 12 s flat): the bound is
    # 12 s and two such starts, as one takes now; the flaw took the SIGTERM's whole 15 s more
    began = time.monotonic()
    plain.execute(["true"], timeout=30)
    start = time.monotonic() - began
    outcome, _ = bounded(
        lambda: plain.execute(["sh", "-c", script], timeout=1, user="1000"), 12 + 2 * start
    )
    assert not isinstance(outcome, BaseException), outcome
    assert outcome.timed_out, outcome  # type: ignore[attr-defined]
    ps = plain.execute("ps -o pid,args", timeout=20).stdout
    assert mark not in ps, ps


# processes deaf to SIGTERM that look for the killer (same uid), write the engine's refusal
# ("is paused") into its output and kill it, before its look stops them, again and again
FAKES_A_REFUSAL = r"""
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
said = b"Error response from daemon: Container 0123 is paused, unpause the container before exec\n"
for _ in range(7):
    if os.fork() == 0:
        break
me = str(os.getpid())
while True:
    for p in os.listdir("/proc"):
        try:
            if not p.isdigit() or p == me:
                continue
            with open(f"/proc/{p}/environ", "rb") as fh:
                if b"ORCHESTRATOR_KILL=" not in fh.read():
                    continue
            for k in (1, 2):
                fd = os.open(f"/proc/{p}/fd/{k}", os.O_WRONLY)
                os.write(fd, said)
                os.close(fd)
            os.kill(int(p), signal.SIGKILL)
        except OSError:
            pass
"""


def test_a_command_that_fakes_the_engines_refusal_is_never_taken_for_killed(
    make_env: MakeEnv,
) -> None:
    """ATTACK (second hostile review; a uid-1000 sandbox): the passes' output was read for
    the engine's refusals, and the command writes into it as the killer's uid: a fake "is
    paused" made a pass it had killed count as one that could not run, and the call
    returned its timeout while the command ran on. A pass killed by a signal is never read
    so: the kill is made, or the call says it may not have been (SandboxUnavailable)."""
    with spawn_in_mode("plain", make_env("", image=PYTHON_IMAGE)) as rt:
        rt.write_file("/tmp/fakes.py", FAKES_A_REFUSAL)
        outcome, _ = bounded(
            lambda: rt.execute(["python3", "/tmp/fakes.py"], timeout=3, user="1000"), 90
        )
        listed = rt.execute(
            "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null; echo; done",
            user="root",
            timeout=20,
        ).stdout
        if "fakes.py" in listed:  # it ran on: the call must say so
            assert isinstance(outcome, SandboxUnavailable), (outcome, listed)
        else:
            assert not isinstance(outcome, BaseException), outcome
            assert outcome.timed_out  # type: ignore[attr-defined]


def _killer(rt: Runtime, cancels: bool) -> Killer:
    from orchestrator.backends.container.executor.plain import Killer

    engine, container = rt._engine_of_main(), rt._container  # type: ignore[attr-defined]
    killer = Killer(engine, container, None)
    killer.cancels = cancels
    return killer


def test_the_cancel_mark_holds_no_planted_fifo_or_link(plain: Runtime) -> None:
    """ATTACK (the command's own uid, which knows its mark): a FIFO where its mark goes held
    the killer to its 30 s bound, its processes living on; a link there had the killer
    empty the file it points at."""
    killer = _killer(plain, cancels=True)
    mark = f"/dev/shm/.orchestrator-cancelled-{killer.token}"
    plain.execute(f"mkfifo {mark}", check=True, timeout=20)
    ran, took = bounded(killer.finish, 60)
    assert ran is True and took < 15
    killer = _killer(plain, cancels=True)
    mark = f"/dev/shm/.orchestrator-cancelled-{killer.token}"
    plain.execute(f"echo precious > /tmp/precious && ln -s /tmp/precious {mark}", check=True)
    assert killer.finish()
    assert plain.execute("cat /tmp/precious", timeout=20).stdout == "precious\n"


def test_the_killers_token_is_in_no_argv(make_env: MakeEnv) -> None:
    """ATTACK (another uid of the sandbox): the token the killer looks for was in its argv,
    which any uid reads in /proc: a watcher could plant a link at the mark before the
    (root) killer wrote it. Only its environment holds it now."""
    env = make_env("resources: {pids: 64}\n", image=BUSYBOX_IMAGE, name="argv")
    with spawn_in_mode("plain", env) as rt:
        watch = (  # (each argument a line of its own)
            "while :; do cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | "
            "grep -e 'm=.ORCHESTRATOR_CM[D]' -e '^[0-9a-f]\\{32\\}$'; done > /tmp/seen 2>&1 &"
        )
        rt.execute(watch, user="1000", timeout=20)
        killers: list[Killer] = []
        for _ in range(30):  # until the watcher saw one run
            killers.append(_killer(rt, cancels=True))
            assert killers[-1].finish()
            seen = rt.execute("cat /tmp/seen", user="1000", timeout=20).stdout
            if "ORCHESTRATOR_CMD" in seen:  # (the killer's script; never the watcher's own)
                break
        else:
            pytest.fail("the watcher never saw a killer run")
        for killer in killers:
            assert killer.token not in seen


def test_read_file_with_the_pids_limit_exhausted_is_sandbox_unavailable(plain: Runtime) -> None:
    plain.write_file("exists.txt", "here")
    # busybox sh exits at its first failed fork, so a filler dies whenever a probe of ours held
    # the last pids, and the probe's pids come free after it: start a new filler each time a
    # process of ours could start, until none can
    filler = "(while :; do sleep 303 & done) >/dev/null 2>&1 &"
    deadline = time.monotonic() + 30  # a busy machine forks slowly
    while plain.execute(f"{filler} echo $(echo ok)", timeout=10).exit_code == 0:
        assert time.monotonic() < deadline, "the pids limit was never reached"
        time.sleep(0.2)
    # a pid freed for a moment may go to our exec instead: each read either works or says why it
    # cannot, and a read that worked starts a filler again, so with the limit held one soon cannot
    for _ in range(20):
        try:
            assert plain.read_file("exists.txt") == "here"
        except SandboxUnavailable as exc:
            assert "cannot start a process" in str(exc)
            return
        plain.execute(filler, timeout=10)
    pytest.fail("every read found a free pid: the limit never held")
