"""The security policy, one escape route at a time: every host path passes one check,
capabilities come from an allow-list, host networking and wide ports need the caller."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from orchestrator import PolicyError, SpecError, load_environment_text
from orchestrator.backends.docker.render import CompiledProject, CompileOptions, compile_project
from orchestrator.spec.models import Mount
from orchestrator.spec.policy import DEFAULT_CAPS, Policy

BASE = "version: 1\nname: t\nimage: img:1\nuser: '1000:1000'\n"


def compile_text(
    text: str, folder: Path, workspace: Path | None = None, **kw: Any
) -> tuple[dict[str, Any], CompiledProject]:
    ws = workspace or folder / "ws"
    ws.mkdir(exist_ok=True)
    env = load_environment_text(text, source="env.yaml", base_dir=folder)
    compiled = compile_project(env, CompileOptions(project="p", workspace=ws, **kw))
    return YAML(typ="safe").load(compiled.compose_yaml), compiled


def refused(text: str, folder: Path, **kw: Any) -> str:
    with pytest.raises(PolicyError) as info:
        compile_text(text, folder, **kw)
    return str(info.value)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            "static_assets: [{name: s, path: /var/run/docker.sock, save_path: s}]\n",
            "static_assets.0",
        ),
        ("static_assets: [{name: s, path: /, save_path: s}]\n", "static_assets.0"),
        ("static_assets: [{name: s, path: /etc/passwd, save_path: s}]\n", "static_assets.0"),
        ("mounts: [{source: /tmp, target: /t}]\n", "mounts.0.source"),
        ("mounts: [{source: /var, target: /v}]\n", "mounts.0.source"),
        ("build: {context: /etc}\n", "build.context"),
        ("services: {db: {image: x, mounts: [{source: /, target: /h}]}}\n", "services.db.mounts"),
        ("services: {db: {build: {context: /proc}}}\n", "services.db.build.context"),
    ],
)
def test_every_host_path_passes_the_same_check(tmp_path: Path, body: str, field: str) -> None:
    text = BASE.replace("image: img:1\n", "") if body.startswith("build") else BASE
    assert field in refused(text + body, tmp_path)


def test_dockerfile_outside_the_context_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ctx").mkdir()
    text = BASE.replace("image: img:1\n", "") + "build: {context: ctx, dockerfile: ../../x}\n"
    assert "build.dockerfile" in refused(text, tmp_path)


def test_symlinked_static_asset_is_resolved_before_the_check(tmp_path: Path) -> None:
    (tmp_path / "assets").symlink_to("/etc")
    text = BASE + "static_assets: [{name: s, path: assets, save_path: s}]\n"
    assert "/etc" in refused(text, tmp_path)


def test_any_host_socket_is_refused_even_under_an_allowed_root(tmp_path: Path) -> None:
    path = tmp_path / "app.sock"  # relative paths: against the file's folder
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        message = refused(BASE + "mounts: [{source: app.sock, target: /s}]\n", tmp_path)
    finally:
        server.close()
    assert "socket" in message


def test_spawn_mounts_pass_the_same_check(tmp_path: Path) -> None:
    message = refused(BASE, tmp_path, extra_mounts=[Mount(source="/tmp", target="/t")])
    assert "spawn mounts[0]" in message and "temp folder" in message


def test_a_broad_workspace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="workspace"):
        compile_text(BASE, tmp_path, workspace=Path("/tmp"))


def test_a_file_in_a_broad_folder_gets_no_root_of_its_own(tmp_path: Path) -> None:
    env = load_environment_text(
        BASE + "mounts: [{source: /tmp/elsewhere, target: /e}]\n", base_dir="/tmp"
    )
    (tmp_path / "ws").mkdir()
    with pytest.raises(PolicyError, match="outside the allowed roots"):
        compile_project(env, CompileOptions(project="p", workspace=tmp_path / "ws"))


@pytest.mark.parametrize(
    "cap", ["DAC_READ_SEARCH", "SYS_MODULE", "SYS_RAWIO", "SYS_PTRACE", "NET_ADMIN", "SYS_ADMIN"]
)
def test_capabilities_outside_the_allow_list_need_the_callers_opt_in(
    tmp_path: Path, cap: str
) -> None:
    text = BASE + f"cap_add: [{cap}]\nservices: {{db: {{image: x, cap_add: [{cap}]}}}}\n"
    message = refused(text, tmp_path)
    assert f"capability {cap} is not allowed" in message and "services.db.cap_add" in message
    doc, compiled = compile_text(text, tmp_path, policy=Policy(allow_caps=frozenset({cap})))
    assert cap in doc["services"]["main"]["cap_add"] and cap in doc["services"]["db"]["cap_add"]
    assert sum(f"grants {cap}" in w for w in compiled.warnings) == 2


def test_all_is_never_allowed(tmp_path: Path) -> None:
    message = refused(
        BASE + "cap_add: [ALL]\n", tmp_path, policy=Policy(allow_caps=frozenset({"ALL"}))
    )
    assert "never allowed" in message


def test_every_container_drops_all_capabilities_and_new_privileges(tmp_path: Path) -> None:
    doc, _ = compile_text(BASE + "services: {db: {image: x}}\n", tmp_path)
    for svc in doc["services"].values():
        assert svc["cap_drop"] == ["ALL"] and svc["cap_add"] == list(DEFAULT_CAPS)
        assert svc["security_opt"][0] == "no-new-privileges:true"
    # main writes the caller's workspace: no set-user-ID bits there; db writes no host folder
    assert doc["services"]["main"]["security_opt"][1:] == ["seccomp=./seccomp.json"]
    assert doc["services"]["db"]["security_opt"] == ["no-new-privileges:true"]


def test_host_network_needs_the_callers_opt_in(tmp_path: Path) -> None:
    text = BASE + "network: {mode: host}\n"
    assert "ORCHESTRATOR_ALLOW_HOST_NETWORK" in refused(text, tmp_path)
    doc, compiled = compile_text(text, tmp_path, policy=Policy(allow_host_network=True))
    assert doc["services"]["main"]["network_mode"] == "host"
    assert any(w.startswith("WARNING: network.mode host") for w in compiled.warnings)


def test_ports_beyond_loopback_need_the_callers_opt_in_and_warn(tmp_path: Path) -> None:
    text = BASE + "network: {ports: [{container: 80, host_ip: 0.0.0.0}]}\n"
    text += "services: {web: {image: x, ports: [{container: 81, host_ip: '::'}]}}\n"
    message = refused(text, tmp_path)
    assert "network.ports.0.host_ip" in message and "services.web.ports.0.host_ip" in message
    _, compiled = compile_text(text, tmp_path, policy=Policy(allow_public_ports=True))
    wide = [w for w in compiled.warnings if "other machines reach it" in w]
    assert len(wide) == 2 and any("services.web.ports" in w for w in wide)


def test_policy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ALLOW_CAPS", "cap_net_admin, SYS_PTRACE")
    monkeypatch.setenv("ORCHESTRATOR_ALLOW_HOST_NETWORK", "1")
    policy = Policy.from_env()
    assert policy.allow_caps == {"NET_ADMIN", "SYS_PTRACE"} and policy.allow_host_network


@pytest.mark.parametrize(
    ("resources", "needle"),
    [
        ("{memory: '0'}", "0 is not a limit"),
        ("{memory: 0g}", "0 is not a limit"),
        ("{memory: 1m}", "at least 6m"),
        ("{tmp: '0'}", "0 is not a limit"),
        ("{disk: 0m}", "0 is not a limit"),
    ],
)
def test_zero_and_tiny_limits_are_refused(resources: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        load_environment_text(BASE + f"resources: {resources}\n")


def test_tmp_and_disk_limits(tmp_path: Path) -> None:
    doc, _ = compile_text(BASE + "resources: {memory: 512m, tmp: 64m, disk: 2g}\n", tmp_path)
    main = doc["services"]["main"]
    assert main["tmpfs"] == "/tmp:size=64m,mode=1777"
    assert main["storage_opt"] == {"size": "2g"}
