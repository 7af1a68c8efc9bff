"""Engine errors are typed once, in backends/container/engine/errors.py, from the engine's own words
(as python-on-whales does); everywhere else catches types. The messages below are what a
Docker 20.10 engine and CLI print (captured from the test machine's engine)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from python_on_whales.exceptions import DockerException

from orchestrator.backends.container.engine import (
    TIMED_OUT,
    ContainerNotRunning,
    ContainerPaused,
    NetworkAmbiguous,
    NetworkInUse,
    NoSuchContainer,
    NoSuchImage,
    NoSuchNetwork,
    NoSuchVolume,
    NotSwarmManager,
    RemovalInProgress,
    StorageOptUnsupported,
    SubnetOverlap,
    classify,
    engine_call,
    unknown_user,
    wrap,
)
from orchestrator.backends.container.engine.bounds import backstop
from orchestrator.backends.container.engine.cli import run
from orchestrator.errors import BackendUnavailable, DockerError

CID = "37256ffbb1403974e9e2e5ddb0f7a46851aba57e2fe61782e582a26c5e48a900"
REAL = [
    (f"Error response from daemon: No such container: {CID}", NoSuchContainer),
    (f"Error: No such object: {CID}", NoSuchContainer),
    (
        f"Error response from daemon: Cannot kill container: {CID}: No such container: {CID}",
        NoSuchContainer,
    ),
    (f"Error response from daemon: Container {CID} is not running", ContainerNotRunning),
    (
        f"Error response from daemon: Cannot kill container: {CID}: Container {CID} is not running",
        ContainerNotRunning,
    ),
    (
        f"Error response from daemon: Container {CID} is paused, unpause the container before exec",
        ContainerPaused,
    ),
    ("Error response from daemon: No such image: orchestrator-snapshot:nonexist", NoSuchImage),
    (
        "Error response from daemon: no such image: orchestrator-snapshot:nonexist: No such "
        "image: orchestrator-snapshot:nonexist",
        NoSuchImage,
    ),
    (  # Podman, listing images while one is removed (4.3)
        'Error response from daemon: locating image with ID "22119ea2c400": image not known',
        NoSuchImage,
    ),
    (  # a second removal while another process removes the container
        f"Error response from daemon: removal of container {CID} is already in progress",
        RemovalInProgress,
    ),
    ("Error: No such network: orch-x-12345678_default", NoSuchNetwork),
    ("Error response from daemon: network shared-egress not found", NoSuchNetwork),
    ("Error response from daemon: no such volume: orch-x_pin0", NoSuchVolume),
    (
        "Error response from daemon: error while removing network: network orch-x_default id "
        "0a1b has active endpoints",
        NetworkInUse,
    ),
    (
        "failed to create network orch-x_default: Error response from daemon: invalid pool "
        "request: Pool overlaps with other one on this address space",
        SubnetOverlap,
    ),
    (
        "Error response from daemon: networks have overlapping IPv4",
        SubnetOverlap,
    ),
    (  # Compose's `up` after its `create`, on a loaded engine that made the network twice
        "Error response from daemon: network orch-perm-2c8c3d15_egress is ambiguous (2 matches "
        "found on name)",
        NetworkAmbiguous,
    ),
    (
        'this node is not a swarm manager. Use "docker swarm init" or "docker swarm join" to '
        "connect this node to swarm and try again",
        NotSwarmManager,
    ),
    (
        "Error response from daemon: --storage-opt is supported only for overlay over xfs "
        "with 'pquota' mount option",
        StorageOptUnsupported,
    ),
    ("Error response from daemon: conflict: unable to remove repository reference", DockerError),
]


@pytest.mark.parametrize(("stderr", "kind"), REAL)
def test_real_engine_messages_become_their_type(stderr: str, kind: type[DockerError]) -> None:
    assert classify(stderr) is kind
    err = wrap("doing it", DockerException(["docker", "x"], 1, b"", stderr.encode()))
    assert type(err) is kind and isinstance(err, DockerError)  # old `except`s still match
    assert err.stderr == stderr and err.returncode == 1 and "doing it failed" in str(err)


def test_a_daemon_that_is_down_stays_backend_unavailable() -> None:
    said = b"Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
    assert isinstance(wrap("x", DockerException(["docker"], 1, b"", said)), BackendUnavailable)


def test_an_unknown_user_is_read_from_the_exec_s_own_words() -> None:
    said = "unable to find user nobody2: no matching entries in passwd file\n"
    assert unknown_user(said) == said.strip()
    assert unknown_user("sh: 1: nope: not found") is None


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake-docker"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_our_runner_returns_stdout_and_types_a_failure_as_the_engine_said(tmp_path: Path) -> None:
    ok = _script(tmp_path, 'printf "a\\nb\\n\\n"\n')
    assert run([str(ok)]) == "a\nb\n"  # one trailing newline dropped, as python-on-whales does
    gone = _script(tmp_path, "echo 'Error: No such container: x' >&2; exit 1\n")
    with pytest.raises(NoSuchContainer) as info:
        engine_call("inspecting x", lambda: run([str(gone)]), retry=False)
    assert info.value.returncode == 1 and "No such container" in info.value.stderr


def test_bytes_that_are_not_utf8_in_an_engine_message_do_not_break_its_error(
    tmp_path: Path,
) -> None:
    said = _script(tmp_path, "printf 'no such image: \\377\\376\\n' >&2; exit 1\n")
    with pytest.raises(NoSuchImage) as info:
        engine_call("pulling", lambda: run([str(said)]), retry=False)
    assert "\ufffd" in info.value.stderr  # replaced, where python-on-whales' decode raised


def test_a_missing_docker_cli_is_backend_unavailable() -> None:
    with pytest.raises(BackendUnavailable, match="docker CLI is not installed"):
        engine_call("listing", lambda: run(["/nonexistent/docker", "ps"]), retry=False)


def test_an_engine_loads_python_on_whales_only_when_its_api_is_used() -> None:
    code = (
        "import sys\n"
        "from orchestrator.backends.container.engine import Engine\n"
        "e = Engine.at('unix:///x.sock', timeout=7)\n"
        "print(e.argv('ps')[-5:], e.argv('ps', bounded=False), 'python_on_whales' in sys.modules)\n"
        "e.whales.container\n"
        "print('python_on_whales' in sys.modules, e.whales.client_config.host)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    assert out == [
        "['7', 'docker', '--host', 'unix:///x.sock', 'ps'] "
        "['docker', '--host', 'unix:///x.sock', 'ps'] False",
        "True unix:///x.sock",
    ]


def test_a_call_whose_leftover_holds_its_output_open_is_given_up_after_its_bound() -> None:
    """coreutils `timeout` kills the call's process group; a process it started in a
    session of its own keeps the output open. The call is still given up (TIMED_OUT) a few
    seconds after its bound, not when that process ends."""
    if shutil.which("timeout") is None or shutil.which("setsid") is None:
        pytest.skip("needs coreutils timeout and util-linux setsid")
    marker = "47.125"
    argv = ["timeout", "-k", "1", "1", "sh", "-c", f"setsid sleep {marker} & sleep {marker}"]
    started = time.monotonic()
    try:
        with pytest.raises(DockerError) as info:
            engine_call("waiting", lambda: run(argv, backstop=backstop(1)), retry=False)
        assert info.value.returncode == TIMED_OUT and "timed out" in str(info.value)
        assert time.monotonic() - started < 20
    finally:
        subprocess.run(["pkill", "-f", f"sleep {marker}"], check=False)


def test_a_call_that_timeout_had_to_kill_is_timed_out_and_tried_once_more(tmp_path: Path) -> None:
    """A docker CLI call that ignores SIGTERM is KILLed by `timeout -k` (ending it with 137,
    or -9 when `timeout` goes with its process group): that is a time-out, as 124 is, so an
    idempotent call is made once more, and the error says it timed out."""
    if shutil.which("timeout") is None:
        pytest.skip("needs coreutils timeout")
    calls = tmp_path / "calls"
    stubborn = _script(tmp_path, f"echo x >> {calls}\ntrap '' TERM\nsleep 30 & wait\n")
    argv = ["timeout", "-k", "1", "1", str(stubborn)]
    started = time.monotonic()
    with pytest.raises(DockerError) as info:
        engine_call("listing", lambda: run(argv, backstop=backstop(1)))
    assert info.value.returncode == TIMED_OUT and "timed out" in str(info.value)
    assert calls.read_text().count("x") == 2  # idempotent: tried once more
    assert time.monotonic() - started < 15


def test_a_bounded_call_that_timeout_had_to_kill_is_a_timeout() -> None:
    """A Compose call under `timeout` that ignores SIGTERM is KILLed (137): that is the
    bound spent, as `run` says it, not a failure that a caller may follow with more calls."""
    from python_on_whales.utils import run as whales_run

    hung = ["timeout", "-k", "1", "1", "sh", "-c", "trap '' TERM; sleep 30"]
    with pytest.raises(DockerException) as caught:
        whales_run(hung)
    assert caught.value.return_code in (137, -9)
    err = wrap("removing project p", caught.value)
    assert isinstance(err, DockerError)
    assert err.returncode == TIMED_OUT and "timed out" in str(err)
    unbounded = wrap("x", DockerException(["docker", "run", "img"], 137, b"", b""))
    assert (
        isinstance(unbounded, DockerError) and unbounded.returncode == 137
    )  # a command's own SIGKILL, with no bound of ours


def test_a_listing_that_trips_over_a_removal_is_made_again_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five tries in half a second were all failed once, under six workers' churn: a
    listing is made again for LIST_WITHIN seconds, then the failure is raised."""
    from orchestrator.backends.container.engine import cli
    from orchestrator.backends.container.engine.errors import NoSuchContainer

    calls: list[float] = []

    def trips(until: int) -> Callable[[], str]:
        def call() -> str:
            calls.append(time.monotonic())
            if len(calls) <= until:
                raise NoSuchContainer("listing (ps) failed: No such container: abc")
            return "listed"

        return call

    assert cli.listing("listing (ps)", trips(8), (NoSuchContainer,)) == "listed"
    assert len(calls) == 9  # (more than five)
    monkeypatch.setattr(cli, "LIST_WITHIN", 0.3)
    calls.clear()
    started = time.monotonic()
    with pytest.raises(NoSuchContainer):
        cli.listing("listing (ps)", trips(10**6), (NoSuchContainer,))
    assert 0.1 < time.monotonic() - started < 1.0 and len(calls) >= 3


def test_a_start_is_tried_again_when_the_engine_made_a_network_twice() -> None:
    """A network made twice (NetworkAmbiguous) fails the attempt, which removes both: the
    start is tried again, a bounded number of times."""
    from orchestrator.backends.docker.start import _retry_subnet

    tried: list[int] = []

    def attempt(i: int) -> str:
        tried.append(i)
        if len(tried) < 3:
            raise NetworkAmbiguous("network x_egress is ambiguous (2 matches found on name)")
        return "up"

    assert _retry_subnet(attempt) == "up" and tried == [0, 1, 2]
    tried.clear()

    def always(i: int) -> str:
        tried.append(i)
        raise NetworkAmbiguous("network x_egress is ambiguous (2 matches found on name)")

    with pytest.raises(NetworkAmbiguous):
        _retry_subnet(always)
    assert tried == [0, 1, 2]
