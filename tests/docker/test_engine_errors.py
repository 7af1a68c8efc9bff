"""The real engine's errors arrive as types (backends/container/engine/): an exec into a
container that was removed, stopped or paused, built by the one ExecTarget, through our own
CLI runner and python-on-whales' alike."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest
from python_on_whales.utils import run as whales_run

from orchestrator.backends.container.engine import (
    ContainerNotRunning,
    ContainerPaused,
    Engine,
    NoSuchContainer,
    engine_call,
)
from orchestrator.backends.container.engine.cli import run
from orchestrator.errors import DockerError
from tests.conftest import BUSYBOX_IMAGE


def _docker(*argv: str) -> str:
    done = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def container() -> Iterator[str]:
    cid = _docker(
        "run", "-d", "--label", "org.orchestrator.test=engine-errors", BUSYBOX_IMAGE, "sleep", "300"
    )
    try:
        yield cid
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60)


Runner = Callable[[list[str]], object]


def _exec(cid: str, runner: Runner) -> str:
    argv = Engine.at().exec_target(cid).argv(["echo", "hi"], user="0", workdir="/")
    return str(engine_call("exec into it", lambda: runner(argv), retry=False))


@pytest.mark.parametrize("runner", [run, whales_run], ids=["ours", "python-on-whales"])
def test_exec_into_a_removed_paused_or_stopped_container_raises_its_type(
    container: str, runner: Runner
) -> None:
    assert _exec(container, runner).strip() == "hi"
    _docker("pause", container)
    with pytest.raises(ContainerPaused):
        _exec(container, runner)
    _docker("unpause", container)
    _docker("kill", container)
    with pytest.raises(ContainerNotRunning):
        _exec(container, runner)
    _docker("rm", "-f", container)
    with pytest.raises(NoSuchContainer) as info:
        _exec(container, runner)
    assert isinstance(info.value, DockerError) and "No such container" in info.value.stderr
