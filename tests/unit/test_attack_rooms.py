"""ATTACK TESTS (review of issue 20, hostile review): each test here is a confirmed attack
and FAILS while the hole is open. Do not mark them xfail: the lead fixes, then they pass.

- test_attack_file_backend_local_runs_host_commands: a hostile environment file picks
  `backend: local` and its setup commands run on the host, as the caller, with no caller
  consent (threat model: "only the caller, never the file, may allow more").
- test_attack_render_out_writes_through_planted_link: `orchestrator render --out DIR`
  writes compose.yaml through a symlink already in DIR (e.g. one a sandbox left in a
  workspace), so the file's text lands in a host file outside DIR.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import OrchestratorError

CLI = [sys.executable, "-m", "orchestrator"]


def test_attack_file_backend_local_runs_host_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ATTACK (hostile file, target 4): `backend: local` is the file's choice alone. The
    refusal names the field and the caller's ways to allow it."""
    from orchestrator import PolicyError, spawn_runtime

    monkeypatch.delenv("ORCHESTRATOR_ALLOW_UNISOLATED")

    marker = tmp_path / "host-owned"
    spec = tmp_path / "evil.yaml"
    spec.write_text(
        f'version: 1\nname: evil\nbackend: local\nsetup:\n  commands: ["id -u > {marker}"]\n'
    )
    # `validate` calls it fine: nothing tells the caller the file leaves the sandbox
    done = subprocess.run([*CLI, "validate", str(spec)], capture_output=True, text=True, timeout=60)
    refused = done.returncode != 0
    try:
        with spawn_runtime(spec) as rt:
            rt.execute(["true"])
    except OrchestratorError:
        refused = True
    assert refused and not marker.exists(), (
        f"a file's `backend: local` ran its commands on the host (wrote {marker}: "
        f"{marker.read_text().strip() if marker.exists() else ''}); validate said: "
        f"{done.stdout.strip()}"
    )
    assert done.returncode == 2 and "evil.yaml:3:" in done.stderr and "--on local" in done.stderr
    with pytest.raises(PolicyError, match="ORCHESTRATOR_ALLOW_UNISOLATED"):
        spawn_runtime(spec)


def test_the_caller_may_choose_the_unisolated_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator import Policy, spawn_runtime

    monkeypatch.delenv("ORCHESTRATOR_ALLOW_UNISOLATED")
    spec = tmp_path / "local.yaml"
    spec.write_text("version: 1\nname: l\nbackend: local\n")
    with spawn_runtime(spec, backend="local") as rt:  # the caller's own choice
        assert rt.execute("echo ok").stdout == "ok\n"
    with spawn_runtime(spec, policy=Policy(allow_unisolated=True)) as rt:
        assert rt.execute("echo ok").stdout == "ok\n"


@pytest.mark.parametrize("planted", ["compose.yaml", "sandbox"])
def test_attack_render_out_writes_through_planted_link(tmp_path: Path, planted: str) -> None:
    """ATTACK (hostile sandbox leaving links where the caller renders, target 5)."""
    spec = tmp_path / "env.yaml"
    spec.write_text(
        "version: 1\nname: r\nimage: orchestrator-test/busybox:1\n"
        'env:\n  PAYLOAD: "ssh-ed25519 AAAA attacker"\n'
    )
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    if planted == "compose.yaml":
        (victim / "authorized_keys").write_text("original\n")
        (out / "compose.yaml").symlink_to(victim / "authorized_keys")
    else:  # a folder link: the project's sandbox/ files land in victim/
        (out / "sandbox").symlink_to(victim)
    ws = tmp_path / "ws"
    ws.mkdir()
    subprocess.run(
        [*CLI, "render", str(spec), "-w", str(ws), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    written = sorted(p.name for p in victim.iterdir())
    changed = [p.name for p in victim.iterdir() if p.read_text() != "original\n"]
    assert not changed, f"render --out wrote through a link in {out} into {victim}: {written}"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("mounts: [{source: ./d, target: /.orchestrator-io}]\n", "mounts.0.target"),
        ("mounts: [{source: ./d, target: /.orchestrator/x}]\n", "mounts.0.target"),
        ("mounts: [{source: ./d, target: /}]\n", "mounts.0.target"),
        ("workdir: /.orchestrator-io/w\n", "workdir"),
        (
            "services:\n  side:\n    image: orchestrator-test/busybox:1\n"
            "    mounts: [{source: ./d, target: /.orchestrator-io}]\n",
            "services.side.mounts.0.target",
        ),
    ],
)
def test_attack_a_file_mount_cannot_take_the_orchestrators_folders(
    tmp_path: Path, body: str, field: str
) -> None:
    """ATTACK (hostile file): a mount at, over or inside /.orchestrator or /.orchestrator-io
    would hide the executor or reach a transfer folder; refused at check time, at its field."""
    from orchestrator import Policy, SpecError, backend_class, load_environment

    (tmp_path / "d").mkdir()
    spec = tmp_path / "env.yaml"
    spec.write_text("version: 1\nname: m\nimage: orchestrator-test/busybox:1\n" + body)
    env = load_environment(spec)
    (tmp_path / "ws").mkdir()
    with pytest.raises(SpecError) as caught:
        backend_class(env).check(env, Policy(), workspace=tmp_path / "ws")
    assert any(i.field == field and "orchestrator" in i.message for i in caught.value.issues), (
        caught.value
    )
