"""Pause and resume (issue 26): every container of an environment frozen by the engine's
cgroup freezer, no CPU while paused (read from the cgroup), processes intact after resume,
calls on a paused environment failing fast with SandboxPaused, the executor surviving the
pause, the CLI's `pause` / `resume` / `ps`, and paused environments of dead owners removed
by the guardian and by the reaper."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator import SandboxPaused, SandboxUnavailable, environments, spawn_runtime
from orchestrator.sandbox.base import Runtime
from tests.conftest import BUSYBOX_IMAGE, main_container, pause_container
from tests.docker.cgroups import cpu_ns
from tests.docker.conftest import MakeEnv
from tests.docker.test_faults import owner_process, project_objects, project_state, wait_until

CLI = [sys.executable, "-m", "orchestrator"]
SIDECAR = (
    "services:\n"
    f"  side:\n    image: {BUSYBOX_IMAGE}\n"
    "    command: [sh, -c, 'i=0; while :; do i=$((i+1)); done']\n"
)
# A root process of the sandbox that spins and, on every turn, tries to get out of the
# freezer's reach: thaw its cgroup (v1 and v2 files), move itself to the root cgroup. Every
# 20000 turns it writes its count, so that one can see it count on after a resume.
HOSTILE = (
    "i=0; while :; do i=$((i+1)); "
    "echo THAWED > /sys/fs/cgroup/freezer/freezer.state; "
    "echo 0 > /sys/fs/cgroup/cgroup.freeze; "
    "echo $$ > /sys/fs/cgroup/freezer/cgroup.procs; "
    "[ $((i % 20000)) = 0 ] && echo $i > /tmp/count; "
    "done 2>/dev/null"
)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def container_of(rt: Runtime, service: str) -> str:
    return rt.service(service).connection().container or ""


def counted(rt: Runtime) -> int:
    """The spinner's last count: its `echo > /tmp/count` empties the file before it writes,
    so a read may find it empty for a moment (as a full run did once)."""
    for _ in range(100):
        if text := rt.execute("cat /tmp/count").stdout.strip():
            return int(text)
    raise AssertionError("/tmp/count stayed empty")


@pytest.fixture
def paired(make_env: MakeEnv) -> Iterator[Runtime]:
    """An environment with a sidecar that spins."""
    with spawn_runtime(make_env(SIDECAR, name="pz")) as rt:
        yield rt


def test_a_paused_environment_uses_no_cpu_and_resumes_intact(paired: Runtime) -> None:
    rt = paired
    started = rt.execute(f"nohup sh -c '{HOSTILE}' >/dev/null 2>&1 & echo $!", user="root")
    pid = started.stdout.strip()
    assert pid.isdigit(), started
    containers = [main_container(rt), container_of(rt, "side")]
    assert wait_until(lambda: rt.execute("cat /tmp/count").ok, 30)  # it spins
    # Both spin: each container's CPU time grows. On a loaded machine (a full run has six
    # workers on two CPUs) a spinner may get less than 20 ms in any one second, so it is
    # waited for rather than read once after a fixed sleep (a CI run failed so).
    before = [cpu_ns(c) for c in containers]
    assert wait_until(
        lambda: all(cpu_ns(c) - b > 20_000_000 for c, b in zip(containers, before, strict=True)),
        30,
    )

    rt.pause()
    assert rt.paused
    frozen = [cpu_ns(c) for c in containers]
    time.sleep(1.5)
    used = [cpu_ns(c) - f for c, f in zip(containers, frozen, strict=True)]
    assert used == [0, 0], f"nanoseconds of CPU used while paused: {used}"

    started_at = time.monotonic()
    rt.resume()
    assert time.monotonic() - started_at < 10 and not rt.paused
    count = counted(rt)
    assert wait_until(lambda: counted(rt) > count, 30)
    assert rt.execute(f"kill -0 {pid}", user="root").ok  # the same process counts on
    assert rt.service("side").execute("echo up").stdout == "up\n"


def test_calls_on_a_paused_environment_fail_fast(paired: Runtime, tmp_path: Path) -> None:
    rt = paired
    rt.write_file("kept.txt", "kept\n")
    rt.pause()
    rt.pause()  # idempotent
    calls: dict[str, Callable[[], object]] = {
        "execute": lambda: rt.execute("true"),
        "stream": lambda: list(rt.stream("true")),
        "read_file": lambda: rt.read_file("kept.txt"),
        "write_file": lambda: rt.write_file("other.txt", "x"),
        "upload": lambda: rt.upload(tmp_path, "up"),
        "download": lambda: rt.download(".", tmp_path / "down"),
        "snapshot": lambda: rt.snapshot(tmp_path / "snap.tar"),
        "service": lambda: rt.service("side").execute("true"),
    }
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(SandboxPaused, match=r"rt\.resume\(\)"):
            call()
        assert time.monotonic() - started < 5, name
    assert isinstance(SandboxPaused("x"), SandboxUnavailable)
    assert rt.poll() is None and rt.info().id  # what asks nothing of the sandbox works
    status = next(s for s in environments()[0] if s.id == rt.info().id)
    assert status.paused and "paused" in status.state
    rt.resume()
    rt.resume()  # idempotent
    assert rt.read_file("kept.txt") == "kept\n"
    status = next(s for s in environments()[0] if s.id == rt.info().id)
    assert not status.paused and "paused" not in status.state


def _running(rt: Runtime, pattern: str) -> str:
    """The processes of the main container whose command line matches `pattern` (a regular
    expression that does not match itself)."""
    script = f"for f in /proc/[0-9]*/cmdline; do grep -l '{pattern}' $f; done 2>/dev/null; true"
    return rt.execute(script, user="root").stdout


def _executors(rt: Runtime) -> str:
    """The pids of the executors running in the main container."""
    return _running(rt, "agent[.]py")


def test_a_command_in_flight_fails_and_the_executor_survives(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("")) as rt:
        executors = _executors(rt)
        assert executors
        out: list[object] = []

        def run() -> None:
            try:
                out.append(rt.execute("sleep 41234; echo done", timeout=120))
            except BaseException as exc:
                out.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert wait_until(lambda: _running(rt, "4123[4]"), 20)
        rt.pause()
        thread.join(10)  # the executor is silent: its probe says why within ~2 s
        assert not thread.is_alive() and isinstance(out[0], SandboxPaused), out
        time.sleep(3)  # longer than the channel waits before it probes
        rt.resume()
        # the command whose caller gave up is killed; the executor is the same one
        assert wait_until(lambda: not _running(rt, "4123[4]"), 10)
        assert _executors(rt) == executors
        times = []
        for _ in range(10):
            started = time.perf_counter()
            assert rt.execute(["true"]).ok
            times.append(time.perf_counter() - started)
        assert sorted(times)[5] < 1.0, times  # the executor, not a fresh start per call


def test_cleanup_and_kill_of_a_paused_environment(make_env: MakeEnv) -> None:
    path = make_env(SIDECAR, name="pz")
    rt = spawn_runtime(path)
    name = rt.info().id
    rt.pause()
    started = time.monotonic()
    rt.cleanup()
    assert time.monotonic() - started < 30
    assert project_objects(name) == []
    rt = spawn_runtime(path)
    name = rt.info().id
    try:
        rt.pause()
        rt.kill()
        assert wait_until(lambda: rt.poll() is not None, 15)
    finally:
        rt.cleanup()
    assert project_objects(name) == []


def test_cli_pause_resume_ps_and_exec(make_env: MakeEnv) -> None:
    up = cli("up", str(make_env(SIDECAR, name="pz")))
    assert up.returncode == 0, up.stderr
    name = up.stdout.strip().splitlines()[0]
    try:
        paused = cli("pause", name)
        assert paused.returncode == 0 and paused.stdout == f"paused {name}\n", paused.stderr
        assert set(project_state(name)) == {"paused"}
        rows = {r["id"]: r for r in json.loads(cli("ps", "--json").stdout)}
        assert rows[name]["paused"] and "paused" in rows[name]["state"]
        ran = cli("exec", name, "--", "echo", "hi")
        assert ran.returncode == 3 and "paused" in ran.stderr and "resume" in ran.stderr
        assert "Traceback" not in ran.stderr
        assert cli("pause", name).returncode == 0  # idempotent
        resumed = cli("resume", name)
        assert resumed.returncode == 0 and resumed.stdout == f"resumed {name}\n"
        assert set(project_state(name)) == {"running"}
        ran = cli("exec", name, "--", "echo", "hi")
        assert ran.returncode == 0 and ran.stdout == "hi\n", ran.stderr
        assert cli("pause", "orch-no-such-env-00000000").returncode == 2
    finally:
        down = cli("down", name)
        assert down.returncode == 0, down.stderr
    assert project_objects(name) == []


def test_a_pause_by_another_process_is_seen_and_resumed_here(make_env: MakeEnv) -> None:
    """The library's owner learns of a pause made with the CLI: its next command fails with
    SandboxPaused (the silent executor is probed), `paused` says so, and it may resume it."""
    with spawn_runtime(make_env("")) as rt:
        container = main_container(rt)
        pause_container(container)
        try:
            started = time.monotonic()
            with pytest.raises(SandboxPaused):
                rt.execute("true", timeout=30)
            assert time.monotonic() - started < 10
            assert rt.paused
        finally:
            rt.resume()
        assert rt.execute("echo on").stdout == "on\n"


@pytest.mark.parametrize("guardian", [True, False], ids=["guardian", "reaper"])
def test_a_dead_owners_paused_environment_is_removed(make_env: MakeEnv, guardian: bool) -> None:
    """SIGKILL the owner of a paused environment (with a sidecar): its guardian removes it;
    without one, its executor cannot stop it (it is frozen), and the reaper of `ps` does."""
    path = make_env(SIDECAR, name="t")
    with owner_process(path, guardian=guardian) as (owner, name):
        paused = cli("pause", name)  # from another process than its owner
        assert paused.returncode == 0, paused.stderr
        assert set(project_state(name)) == {"paused"}
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        if not guardian:  # (any process's reaper may be first: they run on every spawn)
            ps = cli("ps", "--json")
            assert ps.returncode == 0, ps.stderr
            assert name not in [row["id"] for row in json.loads(ps.stdout)]
        assert wait_until(lambda: project_objects(name) == [], 30), project_state(name)
