"""On/off variables go through one parser: a value that is neither on nor off is a UsageError
naming the variable and the accepted values (exit 2 in the CLI), never read as off (or on)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import UsageError, settings
from orchestrator.spec.policy import Policy

CLI = Path(sys.executable).with_name("orchestrator")
ACCEPTED = "one of 1, true, yes, on (on) or 0, false, no, off (off)"


@pytest.mark.parametrize(
    ("raw", "value"),
    [("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("0", False), ("Off", False)],
)
def test_flag_values(raw: str, value: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ALLOW_HOST_NETWORK", raw)
    assert Policy.from_env().allow_host_network is value


@pytest.mark.parametrize(
    "name", ["ORCHESTRATOR_ALLOW_HOST_NETWORK", "ORCHESTRATOR_ALLOW_UNISOLATED"]
)
def test_a_mistyped_policy_flag_is_refused_not_read_as_off(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, "ture")
    with pytest.raises(UsageError, match=re.escape(f"{name} must be {ACCEPTED}, got 'ture'")):
        Policy.from_env()


def test_unset_and_empty_flags_take_their_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_GUARDIAN", "")
    assert settings.GUARDIAN.get() is True
    monkeypatch.setenv("ORCHESTRATOR_ALLOW_PULL", " ")
    assert settings.ALLOW_PULL.get() is False
    monkeypatch.delenv("ORCHESTRATOR_GUARDIAN")
    assert settings.GUARDIAN.get() is True


def test_a_mistyped_guardian_switch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.backends.container.guardian import ensure_guardian

    monkeypatch.setenv("ORCHESTRATOR_GUARDIAN", "of")
    with pytest.raises(UsageError, match="ORCHESTRATOR_GUARDIAN must be one of"):
        ensure_guardian()


def test_the_cli_exits_2_naming_the_variable(tmp_path: Path) -> None:
    (tmp_path / "env.yaml").write_text("version: 1\nname: f\nbackend: local\n")
    env = {**os.environ, "ORCHESTRATOR_ALLOW_UNISOLATED": "yes please"}
    done = subprocess.run(
        [str(CLI), "validate", str(tmp_path / "env.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"ORCHESTRATOR_ALLOW_UNISOLATED must be {ACCEPTED}, got 'yes please'" in done.stderr
    assert "Traceback" not in done.stderr
