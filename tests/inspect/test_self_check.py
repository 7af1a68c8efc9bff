"""Inspect's own conformance suite (`inspect_ai.util._sandbox.self_check`, 44 checks) against
the orchestrator provider: Docker with a non-root user, Docker as root, Docker under gVisor,
the local backend, and a non-root sidecar with its own `workdir` (every service is a sandbox)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterator

import pytest
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox import self_check

from orchestrator.integrations.inspect import OrchestratorSandbox
from tests.conftest import PYTHON_IMAGE

CONFIGS = {
    "docker-nonroot": f"image: {PYTHON_IMAGE}\nuser: '1000:1000'\n",
    "docker-root": f"image: {PYTHON_IMAGE}\nuser: root\n",
    "local": "backend: local\n",
    # under gVisor's kernel (issue 25 asks for at least 42 of the 44)
    "docker-gvisor": f"image: {PYTHON_IMAGE}\nuser: '1000:1000'\nisolation: gvisor\n",
    # every service is a sandbox: a non-root sidecar in a workdir its image does not have
    "docker-sidecar": (
        f"image: {PYTHON_IMAGE}\nuser: '1000:1000'\nservices:\n  side:\n"
        f"    image: {PYTHON_IMAGE}\n    user: '4321:4321'\n    workdir: /home/side\n"
        "    command: [sleep, infinity]\n"
    ),
}
SANDBOX = {"docker-sidecar": "side"}
"""Which of the sample's sandboxes the checks run in (default: the main one)."""
SKIPS = {
    # as root on the host it would add a user to this machine (and it passes: it did once)
    ("local", "test_exec_as_user"): "adds a user to the host machine",
}
CHECKS = sorted(self_check.__all__)
Check = Callable[[SandboxEnvironment], Awaitable[None]]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def config(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def sandbox(
    config: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[SandboxEnvironment]:
    if config == "docker-gvisor":
        request.getfixturevalue("gvisor_engine")
    folder = tmp_path_factory.mktemp(f"inspect-{config}")
    env_file = folder / "env.yaml"
    env_file.write_text(f"version: 1\nname: self-check\n{CONFIGS[config]}")
    environments = asyncio.run(_init(str(env_file)))
    try:
        yield environments[SANDBOX.get(config, "default")]
    finally:
        asyncio.run(OrchestratorSandbox.sample_cleanup("t", str(env_file), environments, False))
        asyncio.run(OrchestratorSandbox.task_cleanup("t", str(env_file), True))


async def _init(config: str) -> dict[str, SandboxEnvironment]:
    await OrchestratorSandbox.task_init("t", config)
    return await OrchestratorSandbox.sample_init("t", config, {})


@pytest.mark.parametrize("check", CHECKS)
def test_inspect_self_check(config: str, sandbox: SandboxEnvironment, check: str) -> None:
    reason = SKIPS.get((config, check))
    if reason:
        pytest.skip(reason)
    run: Check = getattr(self_check, check)
    asyncio.run(asyncio.wait_for(run(sandbox), 120))


def test_the_whole_suite_is_collected() -> None:
    """Inspect's checks are found by name: a rename there must not shrink the suite here."""
    assert len(CHECKS) >= 44
    assert all(inspect.iscoroutinefunction(getattr(self_check, c)) for c in CHECKS)
