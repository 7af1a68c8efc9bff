"""The Engine (issue 38): one object per address spells every docker command line, puts the
time bound in front of it (never cut back off), runs it bounded and types its failure."""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.backends.container.engine import (
    TIMED_OUT,
    Engine,
    NoSuchContainer,
)
from orchestrator.backends.container.engine.bounds import bound_of, bounded
from orchestrator.errors import BackendUnavailable, DockerError
from orchestrator.procutil.held import Held

HOST = "unix:///run/orchestrator-test-none.sock"


def test_an_engine_is_made_once_per_address_and_bound() -> None:
    engine = Engine.at(HOST)
    assert Engine.at(HOST) is engine and engine.address == HOST
    assert Engine.at("tcp://127.0.0.1:1") is not engine
    quick = engine.within(3)
    assert quick is Engine.at(HOST, timeout=3) and quick is not engine and quick.bound == 3
    assert engine.socket == "/run/orchestrator-test-none.sock"
    assert Engine.at("tcp://127.0.0.1:1").socket is None  # the API only on this machine's socket


def test_no_address_is_the_process_engine_fixed_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_DOCKER_HOST", HOST)
    engine = Engine.at()
    monkeypatch.setenv("ORCHESTRATOR_DOCKER_HOST", "unix:///elsewhere.sock")
    assert engine.address == HOST and engine.argv("ps", bounded=False)[:3] == [
        "docker",
        "--host",
        HOST,
    ]


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")
def test_a_call_is_bounded_in_front_and_an_unbounded_one_is_built_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ENGINE_TIMEOUT", "42")
    engine = Engine.at(HOST)
    assert engine.argv("ps", "-q") == [
        *("timeout", "-k", "5", "42", "docker", "--host", HOST, "ps", "-q")
    ]
    assert engine.argv("ps", seconds=7)[:4] == ["timeout", "-k", "5", "7"]
    assert engine.argv("exec", bounded=False) == ["docker", "--host", HOST, "exec"]
    assert bound_of(engine.argv("ps")) == 42 and bound_of(engine.argv("ps", bounded=False)) is None
    assert Engine.at("").argv("ps", bounded=False)[:2] in (["docker", "ps"], ["docker", "--host"])


def test_without_coreutils_timeout_the_line_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert bounded(["docker", "ps"], 5) == ["docker", "ps"]


def test_the_executors_exec_line_is_unbounded_and_as_before() -> None:
    """The channel's `docker exec` is byte for byte what it was: no time bound (the executor
    lives as long as the environment), every option one word, the container last."""
    target = Engine.at(HOST).exec_target("orch-x-main-1")
    argv = target.argv(["python3", "-u", "/s/agent.py", "--owned"], user="0", stdin=True)
    assert argv == [
        *("docker", "--host", HOST, "exec", "-i", "--user=0", "orch-x-main-1"),
        *("python3", "-u", "/s/agent.py", "--owned"),
    ]
    assert target.argv(["true"], seconds=9)[:4] in (
        ["timeout", "-k", "5", "9"],
        ["docker", "--host", HOST, "exec"],  # (no coreutils timeout here)
    )


def _fake_docker(folder: Path, script: str) -> None:
    """A `docker` on PATH that runs `script` (sh), for the runner's own behaviour."""
    path = folder / "docker"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def fake_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def test_run_gives_stdout_and_a_typed_failure(fake_path: Path) -> None:
    _fake_docker(
        fake_path,
        'if [ "$3" = ps ]; then printf "a\\nb\\n"; exit 0; fi\n'
        "echo 'Error: No such container: x' >&2; exit 1\n",
    )
    engine = Engine.at(HOST)
    assert engine.run("ps", action="listing") == "a\nb"
    with pytest.raises(NoSuchContainer) as info:
        engine.run("inspect", "x", action="inspecting x")
    assert info.value.returncode == 1 and "--host" in info.value.command


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")
def test_a_call_past_its_bound_is_timed_out_and_an_idempotent_one_tried_once_more(
    fake_path: Path,
) -> None:
    calls = fake_path / "calls"
    _fake_docker(fake_path, f"echo x >> {calls}\nexec sleep 30\n")
    engine = Engine.at(HOST, timeout=1)
    started = time.monotonic()
    with pytest.raises(DockerError) as info:
        engine.run("ps", action="listing", retry=True)
    assert info.value.returncode == TIMED_OUT and "timed out" in str(info.value)
    assert calls.read_text().count("x") == 2 and time.monotonic() - started < 30


def test_the_api_is_asked_only_on_this_machines_socket() -> None:
    with pytest.raises(BackendUnavailable, match="not on this machine's socket"):
        Engine.at("tcp://127.0.0.1:1").api("GET", "/version", action="asking")


@pytest.mark.skipif(shutil.which("timeout") is None, reason="coreutils `timeout` is missing")
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_a_call_given_up_by_a_signal_leaves_no_docker_cli_behind(tmp_path: Path, how: str) -> None:
    """`orchestrator ps` interrupted (Ctrl-C, SIGTERM) while the engine hangs: the bounded
    call's `timeout` was killed alone, and the docker CLI under it lived on, orphaned, for
    good with an engine that never answers. Now its whole process group goes."""
    import signal
    import subprocess
    import sys

    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    pidfile = tmp_path / "docker.pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 300\n")
    fake.chmod(0o755)
    code = (
        "import signal\n"
        "from orchestrator.quickcli import prepare\n"
        "from orchestrator.backends.container.engine import Engine\n"
        "prepare()\n"
        "Engine.at('unix:///run/orchestrator-test-none.sock').run('ps', action='listing')\n"
    )
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    docker = 0
    with subprocess.Popen([sys.executable, "-c", code], env=env) as caller:
        try:
            deadline = time.monotonic() + 30
            while not pidfile.exists() or not pidfile.read_text().strip():
                assert time.monotonic() < deadline and caller.poll() is None
                time.sleep(0.05)
            docker = int(pidfile.read_text())
            caller.send_signal(getattr(signal, how))
            assert caller.wait(timeout=30) != 0
            deadline = time.monotonic() + 10
            while _alive(docker):
                assert time.monotonic() < deadline, f"the docker CLI ({docker}) outlived its caller"
                time.sleep(0.05)
        finally:
            caller.kill()
            if docker and _alive(docker):  # (what a failure left: the fake's own sleep)
                os.kill(docker, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("call", ["run", "output", "procutil"])
def test_a_signal_inside_popen_leaves_no_process_behind(
    monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """A signal whose handler unwinds us, run inside Popen right after its fork and before
    `self.pid` is set (CI: under load, a Ctrl-C came while the parent waited to be run
    again, and the docker CLI lived on, nameless): it is held until the pid is known, then
    raised, and the process goes."""
    import signal
    import subprocess

    from orchestrator import procutil
    from orchestrator.backends.container.engine import cli

    forked = subprocess._fork_exec  # type: ignore[attr-defined]
    made: list[int] = []

    def fork_then_signal(*args: object) -> int:
        made.append(forked(*args))
        signal.raise_signal(signal.SIGTERM)  # (its handler runs here, before `return`)
        return made[-1]

    def unwind(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    monkeypatch.setattr(subprocess, "_fork_exec", fork_then_signal)
    before = signal.signal(signal.SIGTERM, unwind)
    argv = ["sleep", "300"]
    calls: dict[str, Callable[[list[str]], object]] = {
        "run": cli.run,
        "output": lambda a: list(cli.output(a, None)),
        "procutil": lambda a: list(procutil.run(a, None, None)),  # (the plain path's exec)
    }
    made_by = calls[call]
    try:
        with pytest.raises(SystemExit):
            made_by(argv)
    finally:
        signal.signal(signal.SIGTERM, before)
        monkeypatch.undo()
    [child] = made
    try:
        deadline = time.monotonic() + 10
        while _alive(child):
            assert time.monotonic() < deadline, f"the call's process ({child}) outlived it"
            time.sleep(0.05)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


def test_what_holds_a_network_names_a_stale_endpoint_by_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine lists an endpoint whose container is gone under "ep-<its id>", which no
    disconnect takes: its name does (with --force)."""
    engine = Engine(HOST)
    said = '"ep-5f0e" "orch-x-1-main-1"\n"3ce74dd0" "orch-x-1-db-1"\n\n"ep-77" ""\n'
    monkeypatch.setattr(engine, "inspect", lambda *a, **k: said)
    assert engine.joined("n1") == ["orch-x-1-main-1", "3ce74dd0", "ep-77"]


def test_a_signal_as_the_call_starts_leaves_no_docker_cli_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal that unwinds us just as Popen returns, before anything here holds the
    call (CI: once, under load, the docker CLI lived on after SIGTERM): its process still
    goes, with the group `timeout` leads."""
    from orchestrator.backends.container.engine import cli

    pidfile = tmp_path / "child.pid"
    script = f"echo $$ > {pidfile}; exec sleep 300"
    made = Held.__init__

    def made_then_signalled(self: object, *args: object, **kwargs: object) -> None:
        made(self, *args, **kwargs)  # type: ignore[arg-type]
        deadline = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        raise SystemExit(143)

    monkeypatch.setattr(Held, "__init__", made_then_signalled)
    argv = ["timeout", "-s", "KILL", "300", "sh", "-c", script]
    with pytest.raises(SystemExit):
        cli.run(argv)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, f"the call's process ({child}) outlived it"
        time.sleep(0.05)


def test_signals_held_during_a_spawn_all_run_once_in_order_and_every_handler_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two signals noted while a process was made both run, once each, in the order they
    came (the first handler may return, as asyncio's first Ctrl-C does); and a handler that
    raises while the others are being put back leaves none of them swapped (a signal left
    on the noting handler would never be acted on again)."""
    import signal
    import subprocess

    from orchestrator.backends.container.engine import cli

    seen: list[str] = []
    forked = subprocess._fork_exec  # type: ignore[attr-defined]

    def fork_then_signals(*args: object) -> int:
        pid: int = forked(*args)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGTERM):
            signal.raise_signal(sig)
        return pid

    every = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)
    saved = {s: signal.getsignal(s) for s in every}
    try:
        signal.signal(signal.SIGINT, lambda s, f: seen.append("INT"))
        signal.signal(signal.SIGTERM, lambda s, f: seen.append("TERM"))
        signal.signal(signal.SIGALRM, lambda s, f: seen.append("ALRM"))
        monkeypatch.setattr(subprocess, "_fork_exec", fork_then_signals)
        cli.run(["true"])
        monkeypatch.undo()
        assert seen == ["TERM", "INT", "ALRM"]

        def unwind(signum: int, frame: object) -> None:
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, unwind)
        signal.signal(signal.SIGHUP, unwind)
        real = signal.signal

        def put_back_then_signal(sig: int, handler: object) -> object:
            was = real(sig, handler)  # type: ignore[arg-type]
            if sig == signal.SIGINT and handler is signal.default_int_handler:
                signal.raise_signal(signal.SIGINT)  # raises before SIGTERM is put back
            return was

        monkeypatch.setattr(signal, "signal", put_back_then_signal)
        with pytest.raises(KeyboardInterrupt):
            cli.run(["true"])
        monkeypatch.undo()
        assert signal.getsignal(signal.SIGTERM) is unwind
        assert signal.getsignal(signal.SIGHUP) is unwind
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
