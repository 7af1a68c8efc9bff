"""Attacks from a hostile environment file, against the real engine (issue 19): a file that
pulls the caller's secrets into the sandbox, and a root sandbox that leaves a device node in
the bind-mounted host workspace. Only the caller's Policy may allow either."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator import PolicyError, spawn_runtime
from orchestrator.spec.policy import DEFAULT_CAPS, FILE_CAPS, Policy
from tests.conftest import labelled_ids
from tests.docker.conftest import MakeEnv

SECRET = "ORCH_SECRET_TEST"
SHOW_ENV = "env; tr '\\0' '\\n' < /proc/1/environ"
"""What a command sees, and what the container itself was started with."""


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(SECRET, "s3cret")
    monkeypatch.delenv("ORCHESTRATOR_ALLOW_ENV", raising=False)
    return "s3cret"


def test_a_file_alone_pulls_no_host_secret_into_the_sandbox(make_env: MakeEnv, secret: str) -> None:
    path = make_env(f"user: root\nenv_passthrough: ['*', {SECRET}]\n")
    with spawn_runtime(path) as rt:
        seen = rt.execute(SHOW_ENV, check=True).stdout
        assert secret not in seen
        assert any(SECRET in w and "ORCHESTRATOR_ALLOW_ENV" in w for w in rt.warnings)
    with spawn_runtime(path, policy=Policy(allow_env=frozenset({SECRET}))) as rt:
        assert f"{SECRET}={secret}" in rt.execute(SHOW_ENV, check=True).stdout


def _device_nodes(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            mode = Path(dirpath, name).lstat().st_mode
            if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
                found.append(Path(dirpath, name))
    return found


MAKE_NODE = "mknod /workspace/blk b 7 0 && chmod 666 /workspace/blk"


def test_a_file_cannot_let_a_root_sandbox_make_device_nodes(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    before = labelled_ids()
    refused: PolicyError | None = None
    try:
        with spawn_runtime(make_env("user: root\ncap_add: [MKNOD]\n"), workspace=workspace) as rt:
            rt.execute(MAKE_NODE)
    except PolicyError as exc:
        refused = exc
    assert _device_nodes(workspace) == []  # no 0666 block device left for a host user
    assert refused is not None and "ORCHESTRATOR_ALLOW_CAPS=MKNOD" in str(refused)
    assert labelled_ids() <= before  # refused before anything started


def test_root_with_every_cap_a_file_may_add_makes_no_device_node(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    extra = sorted(FILE_CAPS - set(DEFAULT_CAPS))  # every capability a file may add alone
    body = f"user: root\ncap_add: [{', '.join(extra)}]\n"
    with spawn_runtime(make_env(body), workspace=workspace) as rt:
        r = rt.execute(MAKE_NODE)
        assert r.exit_code != 0 and "not permitted" in r.stderr.lower()
    assert _device_nodes(workspace) == []
