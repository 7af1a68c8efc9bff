"""The CLI's manners on a real engine (issue 21): `ps` never cuts an id (a real narrow
terminal, and a pipe with COLUMNS=40), `down` takes several ids and goes on past a bad one,
`doctor` says what `up` does about a missing image and checks the engine given by --host."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.conftest import MakeEnv
from tests.unit.test_cli_manners import in_terminal

CLI = [sys.executable, "-m", "orchestrator"]
LONG = "app-db-with-a-really-long-name"  # 30 characters: the longest a project name keeps


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def two(make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Two environments left running by `orchestrator up -n 2`, with 44-character ids, in a
    state folder of their own (so `ps` shows them alone, whatever else the session runs)."""
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    up = cli("up", str(make_env("", name=LONG)), "-n", "2")
    assert up.returncode == 0, up.stderr
    ids = up.stdout.split()
    assert len(ids) == 2 and all(len(i) == 44 for i in ids), ids
    try:
        yield ids
    finally:
        for ident in ids:  # one at a time, as every version takes; gone already is fine
            cli("down", ident)


def test_ps_never_cuts_an_id_on_a_narrow_terminal(two: list[str]) -> None:
    for width in (60, 40):
        shown = in_terminal([*CLI, "ps"], width=width)
        lines = shown.splitlines()
        for ident in two:
            assert any(line.split()[:1] == [ident] for line in lines), (width, shown)
        assert "…" not in shown
    narrow = in_terminal([*CLI, "ps"], width=60).splitlines()
    assert "left out to fit 60 columns" in narrow[-1], narrow
    # Other tests' environments share the engine: `ps` may first reap one whose owner died
    # ("removed …"), and a longer state of theirs may push STATE out too, but then the note
    # says so; when it is shown, ours read "running".
    header = next(line for line in narrow if line.split()[:1] == ["ID"])
    if "STATE" in header.split():
        ours = [line for line in narrow if line.split()[:1] in ([i] for i in two)]
        assert len(ours) == 2 and all("running" in line.split() for line in ours), narrow
    else:
        assert "STATE" in narrow[-1], narrow


def test_ps_in_a_pipe_never_cuts_an_id(two: list[str]) -> None:
    shown = cli("ps", env={"COLUMNS": "40"})
    assert shown.returncode == 0, shown.stderr
    firsts = [line.split()[0] for line in shown.stdout.splitlines()[1:]]
    assert set(two) <= set(firsts) and "…" not in shown.stdout


def test_down_takes_several_ids_and_goes_past_a_bad_one(two: list[str]) -> None:
    first, second = two
    done = cli("down", first, "orch-nosuch-environment", second[-8:])
    assert done.returncode == 2, done.stderr
    assert done.stdout.split() == ["removed", first, "removed", second]
    assert "orch-nosuch-environment" in done.stderr and "Traceback" not in done.stderr
    listed = cli("ps", "--json")
    assert first not in listed.stdout and second not in listed.stdout
    again = cli("down", first)  # gone: said, exit 2
    assert again.returncode == 2 and first in again.stderr


def _engine() -> str:
    fmt = "{{.Endpoints.docker.Host}}"
    found = subprocess.run(
        ["docker", "context", "inspect", "--format", fmt], capture_output=True, text=True
    )
    return found.stdout.strip() or "unix:///var/run/docker.sock"


def test_doctor_says_up_refuses_a_missing_image_unless_pulls_are_allowed(tmp_path: Path) -> None:
    """A missing image is never pulled on the file's word (issue 37, item 8): doctor fails
    it with the fix; where the caller allows pulls it says where `up` will pull it from."""
    file = tmp_path / "pulled.yaml"
    file.write_text("version: 1\nname: pulled\nimage: registry.example.invalid/team/tool:1\n")
    shown = cli("doctor", str(file))
    assert shown.returncode != 0, shown.stdout
    line = next(x for x in shown.stdout.splitlines() if "registry.example.invalid" in x)
    assert line.startswith("[fail]") and "ORCHESTRATOR_ALLOW_PULL=1" in line
    allowed = cli("doctor", str(file), env={"ORCHESTRATOR_ALLOW_PULL": "1"})
    line = next(x for x in allowed.stdout.splitlines() if "registry.example.invalid" in x)
    assert line.startswith("[warn]") and "will pull it from registry.example.invalid" in line
    assert "just images" not in shown.stdout


def test_doctor_gives_build_advice_only_for_our_test_images(tmp_path: Path) -> None:
    file = tmp_path / "ours.yaml"
    file.write_text("version: 1\nname: ours\nimage: orchestrator-test/no-such-image:1\n")
    shown = cli("doctor", str(file))
    assert shown.returncode == 1
    line = next(x for x in shown.stdout.splitlines() if "no-such-image" in x)
    assert line.startswith("[fail]") and "just images" in line and "pull" not in line


def test_doctor_checks_the_engine_given_by_host(tmp_path: Path) -> None:
    nowhere = f"unix://{tmp_path}/no-engine.sock"
    for args in (["doctor", "--host", nowhere], ["--host", nowhere, "doctor"]):
        shown = cli(*args)
        assert shown.returncode == 1
        assert f"[fail] Docker engine at {nowhere} not reachable" in shown.stdout
    real = cli("doctor", "--host", _engine())
    assert real.returncode == 0, real.stdout
    assert "Docker engine " in real.stdout and f"at {_engine()}" in real.stdout


def test_doctor_reports_the_egress_gateway_image() -> None:
    from orchestrator.backends.docker import gateway

    shown = cli("doctor")
    line = next(x for x in shown.stdout.splitlines() if "egress gateway image" in x)
    assert gateway.tag() in line and line.startswith("[pass]"), shown.stdout


def test_doctor_says_where_a_missing_gateway_image_would_come_from() -> None:
    """With a base no engine has and a gateway folder of another version, the advice names
    the base and the script that builds one without a registry."""
    from orchestrator.backends.docker import gateway, hooks

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCHESTRATOR_GATEWAY_BASE", "orchestrator-test/no-such-base:1")
        patch.setattr(gateway, "tag", lambda: "orchestrator/gateway:no-such-version")
        [(status, message), _] = hooks.doctor()
    assert status == "warn" and "orchestrator-test/no-such-base:1" in message
    assert "scripts/build-images gateway" in message
