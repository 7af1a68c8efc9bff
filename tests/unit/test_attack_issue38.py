"""Attacks of the issue-38 review that need no engine: the socket of every engine this
process may use is a secret path, wherever it lies (not only DOCKER_HOST's)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from orchestrator import PolicyError, load_environment_text
from orchestrator.backends.docker.render import CompileOptions, compile_project

BASE = "version: 1\nname: t\nimage: img:1\nuser: '1000:1000'\n"


@pytest.mark.parametrize("variable", ["ORCHESTRATOR_DOCKER_HOST", "DOCKER_HOST"])
def test_no_file_mounts_the_folder_of_the_engine_it_is_run_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """An engine chosen by the caller (`--host`, ORCHESTRATOR_DOCKER_HOST) listens where the
    caller says: a file mounting the folder that holds its socket would hand the sandbox the
    engine (host root). It is refused as the default socket's folder is."""
    engine = tmp_path / "engine"
    engine.mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(engine / "docker.sock"))
    monkeypatch.setenv(variable, f"unix://{engine}/docker.sock")
    (tmp_path / "ws").mkdir()
    env = load_environment_text(
        BASE + "mounts: [{source: engine, target: /e}]\n", source="env.yaml", base_dir=tmp_path
    )
    try:
        with pytest.raises(PolicyError) as refused:
            compile_project(env, CompileOptions(project="p", workspace=tmp_path / "ws"))
    finally:
        server.close()
    assert "mounts.0.source" in str(refused.value)
