"""Issue 37, through `orchestrator validate` (no engine): item 6, a file that mounts the state
folder (`./.orch-state` in a CI project) to read another environment's private workspace and
write the admission ledger, by every kind of host path; the suspected item, a file that
opens a port to other machines by itself; item 7, what a file that names no limits gets on
the backends that compile without an engine (Swarm's stack file, the Compose file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from orchestrator import load_environment_text
from orchestrator.backends.docker.render import CompileOptions, compile_project
from orchestrator.backends.swarm.compile import StackOptions, compile_stack
from orchestrator.errors import PolicyError, UsageError

CLI = [sys.executable, "-m", "orchestrator"]
IMAGE = "orchestrator-test/busybox:1"


def validate(*files: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "validate", *map(str, files)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A CI project whose state folder lies in it, holding another environment's private
    workspace (with its secret) and the admission ledger, as they are while it runs."""
    root = tmp_path / "proj"
    state = root / ".orch-state"
    (state / "projects" / "orch-victim-0011aabb" / "workspace").mkdir(parents=True)
    (state / "projects" / "orch-victim-0011aabb" / "workspace" / "secret").write_text("s3cret")
    (state / "admission" / "tickets").mkdir(parents=True)
    (root / "ctx").mkdir()
    (root / "ctx" / "Dockerfile").write_text(f"FROM {IMAGE}\n")
    (root / "data").mkdir()
    return root


KINDS = {
    # the field that names the host path, and the file's line naming it (P)
    "mounts.0.source": "mounts: [{source: 'P', target: /s}]\n",
    "static_assets.0.source": "static_assets: [{name: s, path: 'P', save_path: s}]\n",
    "services.db.mounts.0.source": (
        "services: {db: {image: IMG, mounts: [{source: 'P', target: /s}]}}\n"
    ),
    "services.db.build.context": "services: {db: {build: {context: 'P'}}}\n",
}
WHERE = {
    "it": ".orch-state",
    "inside": ".orch-state/projects/orch-victim-0011aabb/workspace",
    "holding": ".",
    "a link to it": "link",
}


@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("field", sorted(KINDS))
def test_no_host_path_of_a_file_reaches_the_state_folder(
    project: Path, field: str, where: str
) -> None:
    """Item 6, v1 files: the state folder, a folder in it, a folder holding it and a link to
    it are refused for every kind of host path, naming the field (exit 2)."""
    (project / "link").symlink_to(project / ".orch-state" / "projects")
    file = project / "env.yaml"
    line = KINDS[field].replace("P", WHERE[where]).replace("IMG", IMAGE)
    file.write_text(f"version: 1\nname: st\nimage: {IMAGE}\n{line}")
    done = validate(file, env={"ORCHESTRATOR_STATE_DIR": str(project / ".orch-state")})
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{field}" in done.stderr and "state folder" in done.stderr, done.stderr


def test_a_compose_files_volumes_do_not_reach_it(project: Path) -> None:
    """Item 6, a Compose file: `./.orch-state/...:/s` and `./:/all` binds are refused."""
    file = project / "compose.yaml"
    file.write_text(
        "services:\n"
        f"  app:\n    image: {IMAGE}\n    volumes: ['./.orch-state/admission:/ledger']\n"
        f"  db:\n    image: {IMAGE}\n    volumes: ['./:/all']\n"
    )
    done = validate(file, env={"ORCHESTRATOR_STATE_DIR": str(project / ".orch-state")})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "services.app.volumes.0 (as mounts.0.source)" in done.stderr, done.stderr
    assert "services.db.volumes.0 (as services.db.mounts.0.source)" in done.stderr, done.stderr


def test_the_state_folder_counts_as_written_and_as_resolved(tmp_path: Path) -> None:
    """ORCHESTRATOR_STATE_DIR through a linked folder: a file naming the real path (or the
    written one) is refused all the same; and no allowed root may hold the state folder
    (the caller's extra root that holds it is ignored, saying why)."""
    (tmp_path / "real" / "state" / "admission").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    (tmp_path / "proj").mkdir()
    file = tmp_path / "proj" / "env.yaml"
    for named in (tmp_path / "real" / "state", tmp_path / "alias" / "state" / "admission"):
        file.write_text(
            f"version: 1\nname: st\nimage: {IMAGE}\nmounts: [{{source: '{named}', target: /s}}]\n"
        )
        done = validate(
            file,
            env={
                "ORCHESTRATOR_STATE_DIR": str(tmp_path / "alias" / "state"),
                "ORCHESTRATOR_ALLOWED_MOUNT_ROOTS": str(tmp_path / "real"),
            },
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert "mounts.0.source" in done.stderr and "state folder" in done.stderr


def test_a_workspace_holding_the_state_folder_is_refused(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's workspace is mounted read-write: one holding the state folder would
    hand the sandbox every other environment's workspace."""
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(project / ".orch-state"))
    env = load_environment_text(f"version: 1\nname: st\nimage: {IMAGE}\n", base_dir=project)
    with pytest.raises(PolicyError, match="workspace"):
        compile_project(env, CompileOptions(project="p", workspace=project))


# ----- suspected: ports on every address -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("network: {ports: [{container: 80, host_ip: 0.0.0.0}]}\n", "network.ports.0.host_ip"),
        (
            "network: {ports: [{container: 80}, {container: 81, host_ip: '::'}]}\n",
            "network.ports.1.host_ip",
        ),
        (
            "services: {web: {image: IMG, ports: [{container: 80, host_ip: 192.0.2.1}]}}\n",
            "services.web.ports.0.host_ip",
        ),
    ],
)
def test_a_file_opens_no_port_to_other_machines_by_itself(
    tmp_path: Path, text: str, field: str
) -> None:
    """A file publishing on 0.0.0.0 (or any address but loopback) is refused, naming the
    field and the fix; the caller's ORCHESTRATOR_ALLOW_PUBLIC_PORTS=1 lets it, warning."""
    file = tmp_path / "env.yaml"
    file.write_text(f"version: 1\nname: pp\nimage: {IMAGE}\n" + text.replace("IMG", IMAGE))
    done = validate(file, env={})
    assert done.returncode == 2, done.stdout + done.stderr
    assert field in done.stderr and "ORCHESTRATOR_ALLOW_PUBLIC_PORTS=1" in done.stderr
    allowed = validate(file, env={"ORCHESTRATOR_ALLOW_PUBLIC_PORTS": "1"})
    assert allowed.returncode == 0, allowed.stderr
    assert "other machines reach it" in allowed.stdout + allowed.stderr


def test_a_compose_files_port_on_every_address_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "compose.yaml"
    file.write_text(f"services:\n  app:\n    image: {IMAGE}\n    ports: ['0.0.0.0:8080:80']\n")
    done = validate(file, env={})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "services.app.ports (as network.ports.0.host_ip)" in done.stderr, done.stderr
    plain = tmp_path / "plain" / "compose.yaml"
    plain.parent.mkdir()
    plain.write_text(f"services:\n  app:\n    image: {IMAGE}\n    ports: ['8080:80']\n")
    assert validate(plain, env={}).returncode == 0  # Compose's "every address": loopback here


# ----- item 7: the limits a file that names none gets --------------------------------------


def test_swarm_applies_the_default_memory_and_cpus(tmp_path: Path) -> None:
    env = load_environment_text(
        f"version: 1\nname: sw\nimage: {IMAGE}\nworkdir: /w\nuser: root\n"
        f"services: {{db: {{image: {IMAGE}}}}}\n",
        source="env.yaml",
        base_dir=tmp_path,
    )
    doc = YAML(typ="safe").load(compile_stack(env, StackOptions(project="p")).stack_yaml)
    for name in ("main", "db"):
        got = doc["services"][name]["deploy"]["resources"]["limits"]
        assert got == {"memory": str(1024**3), "cpus": "1.0"}, (name, got)


def test_the_defaults_are_the_callers_to_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.spec import limits  # (new with the defaults)

    monkeypatch.setenv("ORCHESTRATOR_DEFAULT_MEMORY", "256m")
    monkeypatch.setenv("ORCHESTRATOR_DEFAULT_CPUS", "0.5")
    monkeypatch.setenv("ORCHESTRATOR_DEFAULT_PIDS", "64")
    env = load_environment_text(
        f"version: 1\nname: d\nimage: {IMAGE}\nresources: {{pids: 10}}\n",
        source="env.yaml",
        base_dir=tmp_path,
    )
    (tmp_path / "ws").mkdir()
    compiled = compile_project(env, CompileOptions(project="p", workspace=tmp_path / "ws"))
    main = YAML(typ="safe").load(compiled.compose_yaml)["services"]["main"]
    assert (main["mem_limit"], main["memswap_limit"]) == (str(256 * 1024**2),) * 2
    assert (main["cpus"], main["pids_limit"]) == (0.5, 10)  # the file's own pids stays
    assert compiled.limits["main"] == limits.Limits(256 * 1024**2, 0.5, 10)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ORCHESTRATOR_DEFAULT_MEMORY", "1m"),
        ("ORCHESTRATOR_DEFAULT_MEMORY", "lots"),
        ("ORCHESTRATOR_DEFAULT_CPUS", "0"),
        ("ORCHESTRATOR_DEFAULT_PIDS", "-1"),
    ],
)
def test_a_bad_default_names_its_variable(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.spec import limits

    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=name):
        limits.applied(
            load_environment_text(f"version: 1\nname: d\nimage: {IMAGE}\n").spec.resources
        )
