"""Attacks of the issue-38 review on a real engine: what a command run through
`Engine.exec` prints and how it exits are the sandbox's, never the engine's words (they
chose the error type: a service image could make its failed setup read as "the Docker engine
is not reachable"), a command killed inside is not a timeout; and doctor's python3 probe of
an image never pulls it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from orchestrator import BackendUnavailable, DockerError, spawn_runtime
from orchestrator.backends.container.engine import Engine
from orchestrator.sandbox.base import Runtime
from tests.docker.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, MakeEnv
from tests.docker.test_attack_issue37_builds import Listener


@pytest.fixture
def rt(make_env: MakeEnv) -> Iterator[Runtime]:
    with spawn_runtime(make_env("", name="said", image=BUSYBOX_IMAGE)) as runtime:
        yield runtime


ENGINE_WORDS = [
    "Error: No such container: x",
    "Error response from daemon: Container x is paused, unpause the container first",
    "Error response from daemon: removal of container x is already in progress",
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.",
]


@pytest.mark.parametrize("said", ENGINE_WORDS)
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_commands_words_never_type_its_failure(rt: Runtime, said: str, stream: str) -> None:
    container = rt.info().container or ""
    to = " >&2" if stream == "stderr" else ""
    try:
        Engine.at().exec(container, ["sh", "-c", f"echo '{said}'{to}; exit 1"], action="probing")
    except BackendUnavailable as exc:
        pytest.fail(f"the sandbox's words made the engine unreachable: {exc}")
    except DockerError as exc:
        assert type(exc) is DockerError and exc.returncode == 1, repr(exc)
    else:
        pytest.fail("a command that exits 1 succeeded")


@pytest.mark.parametrize(("script", "code"), [("kill -9 $$", 137), ("exit 124", 124)])
def test_a_command_ending_so_inside_is_not_a_timeout(rt: Runtime, script: str, code: int) -> None:
    with pytest.raises(DockerError) as failed:
        Engine.at().exec(rt.info().container or "", ["sh", "-c", script], action="probing")
    assert failed.value.returncode == code and "timed out" not in str(failed.value)


def test_a_command_past_its_bound_is_a_timeout(rt: Runtime) -> None:
    with pytest.raises(DockerError) as failed:
        Engine.at().exec(rt.info().container or "", ["sleep", "30"], action="probing", seconds=1)
    assert "timed out" in str(failed.value)


def test_doctors_python_probe_never_pulls_the_image() -> None:
    """`runs_python` starts a container of the image; one the engine lacks (removed since it
    was looked at) was pulled from whatever registry its name says."""
    listener = Listener()
    try:
        assert Engine.at().runs_python(f"127.0.0.1:{listener.port}/gone:1") is False
    finally:
        listener.close()
    assert listener.seen == 0


# A command's process that names itself like a zombie: "x) Z 1" and a newline, which
# /proc/PID/stat does not escape, so a killer reading its first line sees state Z and spares
# it. It forks a sleep at a time, to be seen running after the kill.
FAKE_ZOMBIE = (
    "sh -c 'printf \"x) Z 1\\n\" > /proc/self/comm; while :; do sleep 1; done' "
    "</dev/null >/dev/null 2>&1 & sleep 30"
)
SPARED = "grep -l 'x) Z 1' /proc/[0-9]*/comm 2>/dev/null | wc -l"


@pytest.mark.parametrize(
    ("image", "mode"),
    [(BUSYBOX_IMAGE, "plain"), (PYTHON_IMAGE, "plain"), (PYTHON_IMAGE, "auto")],
    ids=["plain", "plain-python", "executor"],
)
def test_a_process_named_like_a_zombie_dies_with_its_timed_out_command(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch, image: str, mode: str
) -> None:
    """The plain path's kill (images without python3, or ORCHESTRATOR_EXEC_MODE=plain) read
    each process's state from the first line of /proc/PID/stat: a command's process whose
    name held ") Z 1" and a newline passed for a zombie and outlived the timeout. The
    executor's kill, too, is tried."""
    monkeypatch.setenv("ORCHESTRATOR_EXEC_MODE", mode)
    with spawn_runtime(make_env("", name="fakez", image=image)) as rt:
        monkeypatch.delenv("ORCHESTRATOR_EXEC_MODE")
        ran = rt.execute(FAKE_ZOMBIE, timeout=3)
        assert ran.timed_out
        deadline = time.monotonic() + 10
        while (left := rt.execute(SPARED, user="0", timeout=20).stdout.strip()) != "0":
            assert time.monotonic() < deadline, f"{left} process(es) outlived the timeout"
            time.sleep(0.5)
