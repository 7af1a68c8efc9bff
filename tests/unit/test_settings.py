"""Every ORCHESTRATOR_* variable is parsed in one place: a bad value is a UsageError naming the
variable (exit 2 in the CLI), never a bare ValueError from deep inside, never ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import UsageError, load_environment_text, spawn_runtime
from orchestrator.backends.container.identity import pick_subnet
from orchestrator.spec.loader import load_environment


@pytest.mark.parametrize("value", ["soon", "-1", "0", "nan", "inf"])
def test_a_bad_setup_timeout_names_the_variable(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_SETUP_TIMEOUT", value)
    env = load_environment_text(
        "version: 1\nname: s\nbackend: local\nsetup: {commands: ['true']}\n"
    )
    with pytest.raises(UsageError, match="ORCHESTRATOR_SETUP_TIMEOUT must be a positive number"):
        spawn_runtime(env, workspace=tmp_path)


def test_a_bad_spec_size_limit_is_not_silently_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "env.yaml").write_text("version: 1\nname: s\nbackend: local\n")
    monkeypatch.setenv("ORCHESTRATOR_MAX_SPEC_BYTES", "lots")
    with pytest.raises(UsageError, match="ORCHESTRATOR_MAX_SPEC_BYTES must be a whole number"):
        load_environment(tmp_path / "env.yaml")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ORCHESTRATOR_SUBNET_PREFIX", "x", "must be a whole number of prefix bits"),
        ("ORCHESTRATOR_SUBNET_PREFIX", "8", r"\(16 to 30\)"),
        ("ORCHESTRATOR_SUBNET_POOL", "10.0.0.300/16", "must be a network like"),
    ],
)
def test_bad_subnet_settings_name_the_variable(
    name: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=f"{name} {message}" if "must" in message else message):
        pick_subnet()


def test_a_bad_exec_mode_is_refused_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.backends.docker.runtime import ComposeRuntime
    from orchestrator.sandbox.options import SpawnOptions

    monkeypatch.setenv("ORCHESTRATOR_EXEC_MODE", "fast")
    env = load_environment_text("version: 1\nname: s\nimage: i\n")
    with pytest.raises(UsageError, match="ORCHESTRATOR_EXEC_MODE must be one of auto, executor"):
        ComposeRuntime(env, SpawnOptions())
