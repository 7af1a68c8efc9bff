"""Faults injected into live sandboxes: every call returns within a bound, a dead sandbox is
reported as such (never as the command's own failure), and nothing is left behind."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator import (
    OrchestratorError,
    RuntimeClosed,
    SandboxUnavailable,
    StartupError,
    spawn_runtime,
)
from orchestrator.backends.container.executor import wire
from orchestrator.sandbox.base import Runtime
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, labelled_ids, main_container
from tests.docker.conftest import MakeEnv, spawn_in_mode

ROOT = Path(__file__).resolve().parents[2]
MODES = ["executor", "plain"]


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)


def pause(container: str) -> None:
    """`docker pause`, seen done: CI once ran a command in a sandbox this test had paused
    (its pause's answer was never read), so a pause is asked again until the engine says
    the container is paused, within 60 s."""
    deadline = time.monotonic() + 60
    while True:
        done = docker("pause", container)
        state = docker("inspect", "--format", "{{.State.Paused}}", container).stdout.strip()
        if state == "true":
            return
        assert time.monotonic() < deadline, f"not paused: {done.stderr.strip()}"
        time.sleep(0.5)


def spawn(path: Path, mode: str) -> Runtime:
    return spawn_in_mode("plain" if mode == "plain" else "auto", path)


def project_state(name: str) -> list[str]:
    flt = f"label=org.orchestrator.project={name}"
    return docker("ps", "-a", "--format", "{{.State}}", "--filter", flt).stdout.split()


def project_objects(name: str) -> list[str]:
    flt = f"label=org.orchestrator.project={name}"
    return (
        docker("ps", "-aq", "--filter", flt).stdout.split()
        + docker("network", "ls", "-q", "--filter", flt).stdout.split()
    )


def in_background(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


# the processes of `sleep 30` in a container, by pid (the pattern cannot match itself)
SLEEPING = (
    "for p in /proc/[0-9]*; do c=$(tr '\\000' ' ' < $p/cmdline 2>/dev/null); "
    'case $c in *"sleep 3"[0]*) echo ${p#/proc/} ;; esac; done'
)


def fault_during(
    rt: Runtime, timeout: float, fault: str, after: float
) -> tuple[object, float, float]:
    """Run `sleep 30` with `timeout`, `docker FAULT` the main container `after` seconds after
    it is seen running; return what the call returned or raised, and the seconds from its
    start and from the fault to then. (A fault made a fixed time after the call's start came
    before the command under load: the engine then refused to start it, exit 126.)"""
    started = time.monotonic()
    t, out = in_background(lambda: rt.execute("sleep 30", timeout=timeout))
    container = main_container(rt)
    while not docker("exec", "-u", "0", container, "sh", "-c", SLEEPING).stdout.strip():
        assert time.monotonic() < started + 30 and t.is_alive(), ("never ran", out)
        time.sleep(0.05)
    time.sleep(after)
    faulted = time.monotonic()
    if fault == "pause":
        pause(container)
    else:
        docker(fault, container)
    t.join(timeout + 15)
    assert not t.is_alive(), "the call did not return"
    now = time.monotonic()
    return out[0], now - started, now - faulted


@pytest.mark.parametrize("mode", MODES)
def test_killed_container_is_sandbox_unavailable_not_a_failed_command(
    make_env: MakeEnv, mode: str
) -> None:
    with spawn(make_env(""), mode) as rt:
        outcome, _, seconds = fault_during(rt, 60, "kill", after=0.5)
        assert isinstance(outcome, SandboxUnavailable), outcome
        assert "not running" in str(outcome) or "gone" in str(outcome)
        assert seconds < 5
        with pytest.raises(SandboxUnavailable):
            rt.execute("true", timeout=10)


def test_a_container_killed_as_a_plain_command_starts_is_unavailable_not_a_126(
    make_env: MakeEnv,
) -> None:
    """The kill lands as `docker exec` starts the command: runc refuses it ("cannot exec in
    a stopped container", "error executing setns process", ..., exit 126) a moment before
    the engine records the stop. Each call either ran (before the kill) or is the sandbox
    lost, never a command that failed with 126. Calls follow each other until one meets
    the kill (a loaded machine lands the kill after a first call is done: a CI run once saw
    eight calls that all ran), so the kill lands at every point of a call's start."""
    seen = []
    for delay in (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08):  # (across the window)
        with spawn(make_env("", name="killstart"), "plain") as rt:
            container = main_container(rt)
            killer = threading.Timer(delay, lambda c=container: docker("kill", c))
            killer.start()
            deadline = time.monotonic() + 60
            try:
                while True:
                    try:
                        result = rt.execute("true", timeout=30)
                    except SandboxUnavailable as exc:
                        seen.append(type(exc).__name__)
                        break
                    assert result.exit_code == 0, (delay, result.exit_code, result.stderr)
                    seen.append("ran")
                    assert time.monotonic() < deadline, "the killed container ran on"
            finally:
                killer.join()
    assert seen.count("SandboxUnavailable") == 8, seen  # (each kill met a call)


def test_a_container_killed_with_many_processes_is_unavailable_not_a_137(
    make_env: MakeEnv,
) -> None:
    """With many processes in the sandbox, the kernel takes a while to kill them all after
    the container's first process is killed; meanwhile that process still exists and the
    engine still says running. A plain command killed so is the sandbox lost, not the
    command's own 137 (the first process is seen to be exiting)."""
    many = "for i in $(seq 1500); do setsid sleep 1000 </dev/null >/dev/null 2>&1 & done"
    with spawn(make_env("resources: {pids: 4096}\n"), "plain") as rt:  # (over the default)
        assert rt.execute(many, timeout=120).exit_code == 0
        outcome, _, _ = fault_during(rt, 60, "kill", after=0.5)
        assert isinstance(outcome, SandboxUnavailable), outcome


def test_a_plain_command_killed_in_a_running_sandbox_is_its_own_137_at_once(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain command that ends by SIGKILL while its container runs on (`kill -9 $$`, the
    out-of-memory killer) is that command's 137: the engine is not asked again and again
    as for a container killed under it (seen here: its first process lives)."""
    with spawn(make_env(""), "plain") as rt:
        channel = rt._main  # type: ignore[attr-defined]
        asked_again: list[float] = []

        def lost_soon(*args: float) -> None:
            asked_again.append(1)

        monkeypatch.setattr(channel, "_lost_soon", lost_soon)
        for command in ("kill -9 $$", "exit 137"):
            assert rt.execute(command, timeout=20).exit_code == 137
        assert asked_again == []


@pytest.mark.parametrize("mode", MODES)
def test_paused_container_is_a_clear_error_cut_at_its_timeout(make_env: MakeEnv, mode: str) -> None:
    with spawn(make_env(""), mode) as rt:
        try:
            outcome, seconds, _ = fault_during(rt, 3, "pause", after=0.2)
        finally:
            docker("unpause", main_container(rt))
        assert isinstance(outcome, SandboxUnavailable) and "paused" in str(outcome), outcome
        # cut at its timeout, never held by the paused sandbox until its command's own end
        # (30 s): the engine calls after the timeout (the kill refused, the state asked, the
        # processes marked from the host) take 0.3 s on a quiet machine, 2.1 s once on a
        # run of 8 workers on 2 CPUs
        assert seconds < 3 + 4
        assert rt.execute("echo back", timeout=20).stdout == "back\n"


HOG = """
import os, time
full = False
while True:
    try:
        if os.fork() == 0:
            time.sleep(300)
            os._exit(0)
    except OSError:
        if not full:  # every slot is taken: say so (no process needed to make a file)
            open("full", "w").close()
            full = True
        time.sleep(0.001)
"""
WAIT_FULL = "import os, time\nwhile not os.path.exists('full'): time.sleep(0.05)"


def test_exhausted_pids_is_sandbox_unavailable(make_env: MakeEnv) -> None:
    with spawn(make_env("resources: {pids: 40}\n"), "executor") as rt:
        # a daemon that outlives its command and takes every process slot that frees up
        rt.write_file("hog.py", HOG)
        # started before the slots run out: waiting for the hog needs no new process
        wait = f"python3 -c {shlex.quote(WAIT_FULL)}"
        rt.execute(f"setsid python3 hog.py >/dev/null 2>&1 & exec {wait}", timeout=60)
        # a slot freed for a moment (the waiter's, as it exits) may go to our command before
        # the hog takes it: that one runs, and frees it again for the hog; soon none can
        for _ in range(20):
            started = time.monotonic()
            try:
                ran = rt.execute("true", timeout=10)
            except SandboxUnavailable as exc:
                assert "cannot" in str(exc)
                assert time.monotonic() - started < 10
                return
            assert ran.exit_code == 0, ran
        pytest.fail("every command found a free pid: the limit never held")


def test_main_container_dying_during_start_fails_the_spawn_with_its_logs(tmp_path: Path) -> None:
    # the sandbox's keep-alive script runs under /bin/sh: make that exit at once
    (tmp_path / "Dockerfile").write_text(
        f"FROM {PYTHON_IMAGE}\nRUN ln -sf /usr/bin/false /bin/sh\n"
    )
    env = tmp_path / "env.yaml"
    env.write_text("version: 1\nname: dies\nbuild: {context: .}\n")
    before = labelled_ids()
    try:
        try:
            rt = spawn_runtime(env)
        except StartupError as exc:
            assert "not running" in str(exc) and "exit code 1" in str(exc), exc
        else:  # (what a dead sandbox taken for a live one left: not a leak on top)
            rt.cleanup()
            pytest.fail("a sandbox that died as it started was returned")
        assert labelled_ids() <= before  # nothing of ours stayed
    finally:
        for line in docker("images", "-q", "orchestrator-build/dies-main").stdout.split():
            docker("rmi", "-f", line)


OWNER = """
import sys, time
from orchestrator import spawn_runtime
rt = spawn_runtime(sys.argv[1])
print(rt.info().id, flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def owner_process(path: Path, guardian: bool) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A separate process that spawns `path` and then sleeps: (the process, project name)."""
    env = {**os.environ, "ORCHESTRATOR_GUARDIAN": "1" if guardian else "0"}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert owner.stdout is not None
    try:
        name = owner.stdout.readline().strip()
        assert name.startswith("orch-t-"), name
        yield owner, name
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        owner.stdout.close()


def wait_until(check: Callable[[], object], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_owner_death_removes_everything_within_seconds(make_env: MakeEnv, sig: int) -> None:
    path = make_env(f"services: {{db: {{image: {BUSYBOX_IMAGE}, command: [sleep, '600']}}}}\n")
    with owner_process(path, guardian=True) as (owner, name):
        assert len(project_objects(name)) == 3  # two containers and the network
        owner.send_signal(sig)
        owner.wait(10)
        assert wait_until(lambda: project_objects(name) == [], 10), project_state(name)


def test_without_a_guardian_the_sandbox_stops_itself_and_ps_removes_it(make_env: MakeEnv) -> None:
    with owner_process(make_env(""), guardian=False) as (owner, name):
        owner.kill()
        owner.wait(10)
        # the executor saw its input end and stopped the container from inside
        assert wait_until(lambda: "running" not in project_state(name), 10)
    ps = subprocess.run(
        [sys.executable, "-m", "orchestrator", "ps", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ps.returncode == 0, ps.stderr
    assert name not in [row["id"] for row in json.loads(ps.stdout)]
    assert project_objects(name) == []


AGENT = ["python3", "-u", "-I", "-S", "/.orchestrator/agent.py", "--owned"]


def test_an_owned_executor_stops_the_sandbox_only_once_the_host_took_its_greeting(
    make_env: MakeEnv,
) -> None:
    """An executor the host gave up on before its greeting came (later than the host waits,
    on a loaded machine) had its input end when the host's `docker exec` was killed, the
    RELEASE sent before lost with it: it took that for its owner's death and stopped the
    sandbox the host had just fallen back to plain exec in ("exited, exit code 0"). Its
    input ending before OWN stops nothing; after OWN it stops the sandbox, as before."""
    with spawn_runtime(make_env("")) as rt:
        container = main_container(rt)
        given_up = subprocess.run(  # greets, reads the end of its input at once
            ["docker", "exec", "-i", "-u", "0", container, *AGENT],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        assert given_up.stdout[:1] == bytes([wire.READY]), given_up
        time.sleep(2)  # (a stop from inside ends the container within a moment)
        assert project_state(rt.info().id) == ["running"]
        assert rt.execute("echo still").stdout == "still\n"
        owned = subprocess.run(  # told OWN, then its input ends: its owner's death
            ["docker", "exec", "-i", "-u", "0", container, *AGENT],
            input=wire.pack(wire.OWN, 0, b""),
            capture_output=True,
            timeout=60,
        )
        assert owned.stdout[:1] == bytes([wire.READY]), owned
        assert wait_until(lambda: "running" not in project_state(rt.info().id), 10)


def test_down_refuses_a_live_owners_environment_without_force(make_env: MakeEnv) -> None:
    cli = [sys.executable, "-m", "orchestrator"]
    with spawn_runtime(make_env("")) as rt:
        name = rt.info().id
        r = subprocess.run([*cli, "down", name], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--force" in r.stderr
        assert rt.execute("echo alive").stdout == "alive\n"
        r = subprocess.run([*cli, "down", "o"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "at least 6" in r.stderr
        r = subprocess.run(
            [*cli, "down", "--force", name[-8:]], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        assert project_objects(name) == []


def test_up_and_down_leave_no_folder_and_no_workspace(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "orchestrator"]
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(tmp_path / "state")}
    up = subprocess.run(
        [*cli, "up", str(ROOT / "environments" / "python.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert up.returncode == 0, up.stderr
    name = up.stdout.strip()
    folder = tmp_path / "state" / "projects" / name
    assert (folder / "workspace").is_dir()
    down = subprocess.run(
        [*cli, "down", name], capture_output=True, text=True, timeout=120, env=env
    )
    assert down.returncode == 0, down.stderr
    assert not folder.exists() and project_objects(name) == []


def test_a_start_killed_half_way_leaves_a_folder_the_next_spawn_reaps(
    make_env: Callable[..., Path], tmp_path: Path
) -> None:
    from orchestrator.backends.container.inventory import reap
    from orchestrator.paths import projects_dir

    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from orchestrator.backends.container.identity import claim_folder, projects_dir\n"
        "d = projects_dir() / 'orch-t-halfdone'\n"
        "claim_folder(d); (d / 'compose.yaml').write_text('name: x')\n"
        "os.kill(os.getpid(), 9)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=False)
    folder = projects_dir() / "orch-t-halfdone"
    assert folder.exists()
    assert "orch-t-halfdone" in reap()
    assert not folder.exists()


def test_a_hung_engine_call_is_bounded_and_retried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from python_on_whales.utils import run

    from orchestrator.backends.container.engine import Engine, engine_call
    from orchestrator.errors import DockerError

    monkeypatch.setenv("ORCHESTRATOR_ENGINE_TIMEOUT", "1")
    engine = Engine.at()
    calls = []

    def hangs() -> object:  # `docker events` never returns by itself
        calls.append(1)
        return run(engine.argv("events"))

    started = time.monotonic()
    with pytest.raises(DockerError, match="timed out"):
        engine_call("waiting on events", hangs)
    assert len(calls) == 2 and time.monotonic() - started < 2 * (1 + 5) + 2


KEEPER = """
import sys
from orchestrator import spawn_runtime
rt = spawn_runtime(sys.argv[1]); print(rt.info().id, flush=True); rt.cleanup()
"""


def test_kept_projects_outlive_their_owner_until_removed_on_purpose(make_env: MakeEnv) -> None:
    from orchestrator.backends.container.inventory import list_projects, reap, remove_project

    path = make_env("keep_after_cleanup: true\n")
    name = subprocess.run(
        [sys.executable, "-c", KEEPER, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    try:
        time.sleep(3)  # the owner is gone: its guardian has looked by now
        assert name not in reap()
        [info] = [p for p in list_projects() if p.name == name]
        assert {state for _, _, state in info.containers} == {"exited"}
    finally:
        for info in [p for p in list_projects() if p.name == name]:
            remove_project(info)
    assert project_objects(name) == []


@pytest.mark.parametrize("mode", MODES)
def test_stdin_to_a_paused_sandbox_does_not_block_the_caller(make_env: MakeEnv, mode: str) -> None:
    with spawn(make_env(""), mode) as rt:
        pause(main_container(rt))
        try:
            started = time.monotonic()
            t, out = in_background(
                lambda: rt.execute("cat > /dev/null", stdin=b"x" * (32 << 20), timeout=3)
            )
            t.join(15)
            assert not t.is_alive(), "blocked writing stdin to a paused sandbox"
            assert isinstance(out[0], SandboxUnavailable) and "paused" in str(out[0]), out
            assert time.monotonic() - started < 3 + 2
        finally:
            docker("unpause", main_container(rt))
        assert rt.execute("wc -c", stdin=b"y" * 1000, timeout=20).stdout.strip() == "1000"


FORKER = """
import os, sys
from orchestrator import UsageError, spawn_runtime
with spawn_runtime(sys.argv[1]) as rt:
    gen = rt.stream("echo from-a-stream")  # made here, iterated in the child
    for how in ("exits", "uses a service", "uses the main sandbox", "iterates a stream"):
        pid = os.fork()
        if pid == 0:  # a child of the owner: it exits normally, and leaves the `with` block
            try:
                if how == "uses a service":
                    rt.service("db").execute("echo from-child")
                    os._exit(3)
                if how == "uses the main sandbox":
                    rt.execute("echo from-child")
                    os._exit(3)
                if how == "iterates a stream":
                    list(gen)
                    os._exit(3)
            except UsageError:
                pass
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        assert status == 0, (how, status)
    main, db = rt.execute("echo alive"), rt.service("db").execute("echo alive")
    print(main.stdout.strip(), db.stdout.strip(), rt.info().id, flush=True)
"""


def test_a_forked_child_leaves_its_parents_environment_up(make_env: MakeEnv) -> None:
    """The owner forks (a worker, a helper that daemonizes) and the child exits, leaving the
    owner's `with` block, or tries to run a command (UsageError: the runtime is its
    parent's, and an executor started from the child would stop the sandbox as the child
    ends): the environment its parent still uses stays up, services included."""
    path = make_env(f"services: {{db: {{image: {PYTHON_IMAGE}, command: [sleep, '600']}}}}\n")
    done = subprocess.run(
        [sys.executable, "-c", FORKER, str(path)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    main, db, name = done.stdout.split()
    assert (main, db) == ("alive", "alive"), done.stderr
    assert project_objects(name) == []  # the parent's own cleanup still removed it all


POOL_FORKER = """
import os, sys, time
from orchestrator import Pool
with Pool(sys.argv[1], 1) as pool:
    deadline = time.monotonic() + 120
    while pool.ready < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    waiting = pool._ready[0].info().id
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # the child leaves the `with Pool` block: its copy closes, nothing else
    os.waitpid(pid, 0)
    rt = pool.acquire(timeout=120)
    print(waiting, rt.info().id, rt.pool_state(), flush=True)
    pool.release(rt)
"""


def test_a_forked_child_leaving_a_pool_block_leaves_the_pool_alone(make_env: MakeEnv) -> None:
    """A child forked from a pool's owner leaves the `with Pool` block: the environment
    waiting in the pool is still the parent's to hand out, and nothing is left running."""
    path = make_env("")
    done = subprocess.run(
        [sys.executable, "-c", POOL_FORKER, str(path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    waiting, got, state = done.stdout.split()
    assert (got, state) == (waiting, "in-use"), done.stdout
    assert project_objects(waiting) == []


@contextlib.contextmanager
def pinned(container: str) -> Iterator[tuple[str, Path]]:
    """An immutable file in `container`'s folder under the engine's root, so every removal
    of it fails as one does under load ("unable to remove filesystem for <id>", the
    container left Dead) until the file is unpinned, at the latest on leaving. Yields the
    container's id and the file."""
    root = docker("info", "-f", "{{.DockerRootDir}}").stdout.strip()
    cid = docker("inspect", "-f", "{{.Id}}", container).stdout.strip()
    folder = Path(root) / "containers" / cid
    if os.geteuid() != 0 or not folder.is_dir():
        pytest.skip("needs root on the engine's own machine to pin a container's folder")
    pin = folder / "pin"
    pin.touch()
    if subprocess.run(["chattr", "+i", str(pin)], capture_output=True).returncode != 0:
        pin.unlink()
        pytest.skip("the engine's filesystem has no immutable flag (chattr +i)")
    try:
        yield cid, pin
    finally:
        subprocess.run(["chattr", "-i", str(pin)], capture_output=True)


@contextlib.contextmanager
def first_removal_fails(container: str) -> Iterator[list[bool]]:
    """Make the engine's first removal of `container` fail (see `pinned`), the file taken
    away once the engine has tried and given up. Yields [True] once that happened."""
    with pinned(container) as (cid, pin), _unpin_once_dead(cid, pin) as failed:
        yield failed


@contextlib.contextmanager
def _unpin_once_dead(cid: str, pin: Path) -> Iterator[list[bool]]:
    folder = pin.parent
    failed: list[bool] = []
    done = threading.Event()

    def unpin_once_dead() -> None:
        while not done.wait(0.02):
            with contextlib.suppress(OSError):
                if os.listdir(folder) != ["pin"]:  # its removal has not reached the pin yet
                    continue
            if docker("inspect", "-f", "{{.State.Dead}}", cid).stdout.strip() == "true":
                failed.append(True)
                break
        subprocess.run(["chattr", "-i", str(pin)], capture_output=True)

    watcher = threading.Thread(target=unpin_once_dead, daemon=True)
    watcher.start()
    try:
        yield failed
    finally:
        done.set()
        watcher.join(30)


@pytest.mark.parametrize("network", ["none", "outbound"])
def test_a_removal_the_engine_fails_once_still_removes_everything(
    make_env: MakeEnv, network: str
) -> None:
    """Docker can fail a removal over a race of its own under load (its folder "not empty");
    the container is then Dead. Removal (direct, and through Compose with a gateway) goes on
    by label and id until nothing of the project is left."""
    body = "network: {outbound: true}\n" if network == "outbound" else ""
    rt = spawn_runtime(make_env(body))
    name = rt.info().id
    try:
        with first_removal_fails(main_container(rt)) as failed:
            rt.cleanup()
        assert failed, "the engine's first removal did not fail: the fault never happened"
        assert project_objects(name) == []
    finally:
        rt.cleanup()


@contextlib.contextmanager
def a_failed_cleanup(make_env: MakeEnv) -> Iterator[tuple[Runtime, str]]:
    """A runtime whose cleanup() just failed (its container pinned past down()'s tries),
    and its id; the container is unpinned on leaving."""
    rt = spawn_runtime(make_env(""))
    name = rt.info().id
    with pinned(main_container(rt)):
        with pytest.raises(OrchestratorError):
            rt.cleanup()
        yield rt, name


def test_a_cleanup_the_engine_keeps_failing_raises_and_is_tried_again(make_env: MakeEnv) -> None:
    """A removal the engine refuses for longer than down()'s own tries is said (cleanup
    raises), the runtime is closed to calls, and the next cleanup() removes it: a harness
    that retries its cleanup is not left with an object it can no longer remove."""
    with a_failed_cleanup(make_env) as (rt, name):
        assert project_objects(name) != []
        with pytest.raises(RuntimeClosed):
            rt.execute("true")
    try:
        rt.cleanup()
        assert project_objects(name) == []
    finally:
        rt.cleanup()


def test_a_runtime_detached_after_a_failed_cleanup_is_left_running(make_env: MakeEnv) -> None:
    """detach() after a cleanup that failed leaves the environment to `orchestrator down`:
    a later cleanup() (or the one at exit) must not remove it."""
    from orchestrator import remove_environment

    with a_failed_cleanup(make_env) as (rt, name):
        rt.detach()
    try:
        rt.cleanup()
        assert project_objects(name) != []
    finally:
        remove_environment(name, force=True)
    assert project_objects(name) == []


def test_a_tether_still_running_after_its_release_ends_with_the_removal(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service's tether that does not exit on `release` within its wait (a gVisor exec
    that never returns once its container is gone; seen leaking, orphaned, after a run)
    is ended once the environment is removed: nothing of ours outlives it."""
    from orchestrator.backends.docker import tether

    monkeypatch.setattr(tether, "TETHER_WAIT", 0.2)
    rt = spawn_runtime(make_env(""))
    project = rt.project  # type: ignore[attr-defined]
    stuck = subprocess.Popen(
        ["sleep", "600"], stdin=subprocess.PIPE, start_new_session=True
    )  # deaf to `release`, as such a tether is
    project.tethers._procs.append(stuck)
    try:
        rt.cleanup()
        assert stuck.wait(10) == -signal.SIGKILL
    finally:
        if stuck.poll() is None:
            stuck.kill()
            stuck.wait()


def test_a_foreign_container_on_our_network_neither_keeps_it_nor_is_touched(
    make_env: MakeEnv,
) -> None:
    """Compose leaves a network another's container has joined, says "Resource is still in
    use" and exits 0: removal goes on by label (that container disconnected, not removed)."""
    rt = spawn_runtime(make_env("network: {outbound: true}\n"))
    name = rt.info().id
    flt = f"label=org.orchestrator.project={name}"
    [net, *_] = docker("network", "ls", "-q", "--filter", flt).stdout.split()
    foreign = docker("run", "-d", "--network", net, BUSYBOX_IMAGE, "sleep", "600").stdout.strip()
    try:
        rt.cleanup()
        assert project_objects(name) == []
        assert docker("inspect", "-f", "{{.State.Running}}", foreign).stdout.strip() == "true"
    finally:
        docker("rm", "-f", foreign)
        rt.cleanup()


@pytest.mark.parametrize("whose", ["its own", "forged"])
def test_a_volume_another_container_holds_is_said_and_found_again(
    tmp_path: Path, whose: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A volume labelled with the environment (its own, or one someone on the engine made
    wearing its labels) that another's container mounts cannot go: cleanup says so and goes
    on (it must not fail over what anyone can make), and the volume stays listed as the
    environment's until a removal finds it free."""
    from orchestrator import environments, load_environment, remove_environment
    from orchestrator.paths import projects_dir

    (tmp_path / "compose.yaml").write_text(
        f"services:\n  default:\n    image: {BUSYBOX_IMAGE}\n"
        "    command: [sleep, '600']\n    volumes: ['data:/data']\nvolumes:\n  data: {}\n"
    )
    rt = spawn_runtime(load_environment(tmp_path / "compose.yaml"))
    name = rt.info().id
    flt = f"label=org.orchestrator.project={name}"
    [volume] = docker("volume", "ls", "-q", "--filter", flt).stdout.split()
    if whose == "forged":
        labels = ["--label=org.orchestrator.managed=1", f"--label=org.orchestrator.project={name}"]
        volume = docker("volume", "create", *labels).stdout.strip()
    foreign = docker("run", "-d", "-v", f"{volume}:/x", BUSYBOX_IMAGE, "sleep", "600").stdout
    folder = projects_dir() / name
    assert folder.is_dir()
    try:
        try:
            rt.cleanup()
            assert "is in use by a container of another project" in caplog.text
            assert project_objects(name) == [] and not folder.exists()
            assert name in [e.id for e in environments()[0]]  # the volume is still ours
        finally:
            docker("rm", "-f", foreign.strip())
        assert remove_environment(name, force=True) == name
        assert docker("volume", "ls", "-q", "--filter", flt).stdout.split() == []
    finally:  # a forged volume has no folder label: the leak check would not see it
        if whose == "forged":
            docker("volume", "rm", "-f", volume)
