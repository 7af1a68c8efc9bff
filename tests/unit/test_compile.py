"""The compiler: merge rules, network rules, policy, determinism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from orchestrator import PolicyError, SpecError, UsageError, load_environment_text
from orchestrator.backends.docker.render import CompiledProject, CompileOptions, compile_project
from orchestrator.spec.models import Mount, PortMap
from orchestrator.spec.policy import Policy
from orchestrator.spec.resolve import resolve_user

BASE = "version: 1\nname: t\nimage: img:1\nuser: '1000:1000'\n"


def build(text: str, tmp_path: Path, **kw: Any) -> tuple[dict[str, Any], CompiledProject]:
    (tmp_path / "ws").mkdir(exist_ok=True)
    env = load_environment_text(text, source="env.yaml", base_dir=tmp_path)
    opts = CompileOptions(project="p", workspace=tmp_path / "ws", **kw)
    compiled = compile_project(env, opts)
    return YAML(typ="safe").load(compiled.compose_yaml), compiled


def volumes(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["target"]: v for v in doc["services"]["main"]["volumes"]}


def test_workspace_mount_and_overrides_by_container_path(tmp_path: Path) -> None:
    (tmp_path / "ws" / "data").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    text = BASE + "mounts: [{source: ./data, target: /data, read_only: true}]\n"
    doc, _ = build(
        text, tmp_path, extra_mounts=[Mount(source=str(tmp_path / "other"), target="/data")]
    )
    vols = volumes(doc)
    assert vols["/workspace"]["source"] == str(tmp_path / "ws")
    assert vols["/data"]["source"] == str(tmp_path / "other")  # spawn mounts win
    assert vols["/data"]["read_only"] is False


def test_file_mount_overrides_workspace_at_same_path(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir(parents=True)  # relative: against the file's folder
    doc, _ = build(BASE + "mounts: [{source: ./x, target: /workspace}]\n", tmp_path)
    assert volumes(doc)["/workspace"]["source"] == str(tmp_path / "x")


def test_mount_inside_workdir_is_an_error_but_sibling_is_not(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(parents=True)
    with pytest.raises(SpecError, match="inside workdir"):
        build(BASE + "mounts: [{source: ./d, target: /workspace/sub}]\n", tmp_path)
    # the engine reads `//a` as `/a` (Go's path.Clean; Python's normpath keeps both slashes)
    with pytest.raises(SpecError, match="inside workdir"):
        build(BASE + "mounts: [{source: ./d, target: //workspace/sub}]\n", tmp_path)
    with pytest.raises(SpecError, match="inside workdir"):
        build(
            BASE + "workdir: //workspace\nmounts: [{source: ./d, target: /workspace/s}]\n", tmp_path
        )
    doc, _ = build(BASE + "mounts: [{source: ./d, target: /workspace2}]\n", tmp_path)
    assert "/workspace2" in volumes(doc)


def test_static_assets_read_only_and_not_shadowed(tmp_path: Path) -> None:
    (tmp_path / "assets").mkdir()
    (tmp_path / "ws" / "d").mkdir(parents=True)
    text = BASE + "static_assets: [{name: a, path: assets, save_path: tests}]\n"
    doc, _ = build(text, tmp_path)
    assert volumes(doc)["/static/tests"]["read_only"] is True
    with pytest.raises(SpecError, match="shadow"):
        build(text + "mounts: [{source: ./d, target: /static/tests}]\n", tmp_path)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("privileged: true\n", "privileged"),
        ("pid: host\n", "host pid"),
        ("cap_add: [SYS_ADMIN]\n", "SYS_ADMIN"),
        ("cap_add: [ALL]\n", "ALL"),
        ("devices: [/dev/kvm]\n", "devices"),
        ("services: {db: {image: x, privileged: true}}\n", "services.db.privileged"),
        ("mounts: [{source: /var/run/docker.sock, target: /d.sock}]\n", "socket"),
        ("mounts: [{source: /etc, target: /hostetc}]\n", "which no sandbox may see"),
        ("mounts: [{source: /opt, target: /o}]\n", "outside the allowed roots"),
    ],
)
def test_policy(tmp_path: Path, extra: str, needle: str) -> None:
    with pytest.raises(PolicyError) as info:
        build(BASE + extra, tmp_path)
    assert needle in str(info.value)


def test_policy_resolves_symlinks(tmp_path: Path) -> None:
    (tmp_path / "sneaky").symlink_to("/etc")
    with pytest.raises(PolicyError, match="no sandbox may see"):
        build(BASE + "mounts: [{source: ./sneaky, target: /x}]\n", tmp_path)


def test_policy_extra_roots(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    text = BASE + f"mounts: [{{source: {elsewhere}, target: /data, read_only: true}}]\n"
    with pytest.raises(PolicyError, match="outside the allowed roots"):
        build(text, tmp_path)
    doc, _ = build(text, tmp_path, policy=Policy((elsewhere,)))
    assert "/data" in volumes(doc)


def test_cap_add_from_the_file_only_within_dockers_defaults(tmp_path: Path) -> None:
    doc, _ = build(BASE + "cap_add: [CAP_SYS_CHROOT]\n", tmp_path)
    main = doc["services"]["main"]
    assert main["cap_drop"] == ["ALL"]
    assert {"SYS_CHROOT", "SETUID", "KILL"} <= set(main["cap_add"])
    assert "SETFCAP" not in main["cap_add"] and "FSETID" not in main["cap_add"]
    assert main["security_opt"][0] == "no-new-privileges:true"


def test_setfcap_is_the_callers_to_grant(tmp_path: Path) -> None:
    """File capabilities set on a program in a host folder make whoever runs it on the host
    privileged (issue 37, item 3): a file cannot add SETFCAP, the caller can, warned."""
    with pytest.raises(PolicyError, match="SETFCAP is not allowed") as err:
        build(BASE + "cap_add: [setfcap]\n", tmp_path)
    assert "ORCHESTRATOR_ALLOW_CAPS=SETFCAP" in str(err.value)
    doc, c = build(
        BASE + "cap_add: [setfcap]\n", tmp_path, policy=Policy(allow_caps=frozenset({"SETFCAP"}))
    )
    assert "SETFCAP" in doc["services"]["main"]["cap_add"]
    assert any("SETFCAP" in w and "file capabilities" in w for w in c.warnings)


def test_no_network_when_nothing_to_reach(tmp_path: Path) -> None:
    doc, c = build(BASE, tmp_path)
    assert doc["services"]["main"]["network_mode"] == "none" and "networks" not in doc
    assert not c.has_network


def test_services_get_an_internal_network_with_our_subnet(tmp_path: Path) -> None:
    doc, _ = build(
        BASE + "services: {db: {image: x}}\n",
        tmp_path,
        subnet="10.213.0.32/27",
        labels={"org.orchestrator.managed": "1"},
    )
    net = doc["networks"]["default"]
    assert net["internal"] is True and net["ipam"]["config"][0]["subnet"] == "10.213.0.32/27"
    # no address on the host side of the bridge: the host is unreachable from the sandbox
    assert net["driver_opts"] == {"com.docker.network.bridge.inhibit_ipv4": "true"}
    assert net["labels"] == {"org.orchestrator.managed": "1"}
    assert doc["services"]["db"]["labels"] == {"org.orchestrator.managed": "1"}


def test_ports_are_published_by_the_forwarder_and_open_no_egress(tmp_path: Path) -> None:
    doc, c = build(
        BASE + "network: {ports: [{container: 80}, {container: 81, host: 9001}]}\n", tmp_path
    )
    forwarder = doc["services"]["orchestrator-ports"]
    assert forwarder["ports"] == ["127.0.0.1::80/tcp", "127.0.0.1:9001:81/tcp"]
    assert forwarder["command"] == ["forward", "tcp:80:main:80", "tcp:81:main:81"]
    assert "ports" not in doc["services"]["main"]
    assert doc["networks"]["default"]["internal"] is True  # the sandbox stays held in
    assert doc["services"]["main"].get("networks", ["default"]) == ["default"]
    assert doc["networks"]["egress"]["internal"] is False  # the forwarder's outside
    assert not any("outbound" in w for w in c.warnings)


def test_spawn_ports(tmp_path: Path) -> None:
    doc, _ = build(BASE, tmp_path, extra_ports=[PortMap(container=5000)])
    assert doc["services"]["orchestrator-ports"]["ports"] == ["127.0.0.1::5000/tcp"]


HOST_OK = Policy(allow_host_network=True)


def test_host_mode_ignores_ports_and_falls_back_off_linux(tmp_path: Path) -> None:
    text = BASE + "network: {mode: host, ports: [{container: 80}]}\n"
    doc, c = build(text, tmp_path, policy=HOST_OK)
    assert doc["services"]["main"]["network_mode"] == "host"
    assert "ports" not in doc["services"]["main"]
    assert any("ignored" in w for w in c.warnings)
    doc, c = build(text, tmp_path, platform="darwin", policy=HOST_OK)
    assert "network_mode" not in doc["services"]["main"]
    assert any("only on Linux" in w for w in c.warnings)


def test_loopback_bind_host_rewritten_in_bridge_mode(tmp_path: Path) -> None:
    text = BASE + "network: {bind_host: 127.0.0.1, outbound: true}\n"
    doc, c = build(text, tmp_path)
    assert doc["services"]["main"]["environment"]["ORCHESTRATOR_BIND_HOST"] == "0.0.0.0"
    assert any("rewritten" in w for w in c.warnings)
    doc, _ = build(text.replace("outbound: true", "mode: host"), tmp_path, policy=HOST_OK)
    assert doc["services"]["main"]["environment"]["ORCHESTRATOR_BIND_HOST"] == "127.0.0.1"


def test_dollar_and_quotes_survive_compose(tmp_path: Path) -> None:
    doc, _ = build(BASE + "env: {A: 'x$HOME\"y'}\n", tmp_path)
    assert doc["services"]["main"]["environment"]["A"] == 'x$$HOME"y'  # $$: no interpolation


def test_env_passthrough(tmp_path: Path) -> None:
    doc, _ = build(
        BASE + "env_passthrough: [KEEP]\n",
        tmp_path,
        host_env={"KEEP": "1", "DROP": "2"},
        policy=Policy(allow_env=frozenset({"KEEP", "DROP"})),  # the caller lets them through
    )
    env = doc["services"]["main"]["environment"]
    assert env["KEEP"] == "1" and "DROP" not in env


@pytest.mark.parametrize(
    "host_env", [{"HUID": "4294967295"}, {"HGID": "-1"}, {"HUID": "x"}, {"HUID": "\u0661"}]
)
def test_user_host_refuses_huid_that_is_not_an_id(host_env: dict[str, str]) -> None:
    """HUID=4294967295 made `user: host` run every command as root (-1 to setuid)."""
    with pytest.raises(UsageError, match=r"HUID|HGID"):
        resolve_user("host", host_env)


def test_user_host_uses_huid(tmp_path: Path) -> None:
    doc, compiled = build(
        BASE.replace("'1000:1000'", "host"),
        tmp_path,
        host_env={"HUID": "501", "HGID": "20"},
        labels={"org.orchestrator.managed": "1"},
    )
    assert compiled.user == "501:20"
    assert doc["services"]["main"]["labels"]["org.orchestrator.user"] == "501:20"
    assert doc["services"]["main"]["user"] == "0:0"  # only PID 1; commands run as 501:20


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    text = BASE + "env: {B: '2', A: '1'}\nservices: {z: {image: z}, a: {image: a}}\n"
    _, one = build(text, tmp_path, labels={"b": "1", "a": "2"}, subnet="10.0.0.0/27")
    _, two = build(text, tmp_path, labels={"a": "2", "b": "1"}, subnet="10.0.0.0/27")
    assert one.compose_yaml == two.compose_yaml


# ----- a service's workdir, and services prepared before their command --------------------
def test_a_service_without_workdir_renders_as_before(tmp_path: Path) -> None:
    doc, _ = build(BASE + "services: {db: {image: x, healthcheck: {test: 'true'}}}\n", tmp_path)
    db = doc["services"]["db"]
    assert "entrypoint" not in db and "working_dir" not in db
    assert doc["services"]["main"]["depends_on"]["db"] == {"condition": "service_healthy"}


def test_a_service_workdir_gates_its_command_until_prepared(tmp_path: Path) -> None:
    from orchestrator.backends.container.copyin import GATE

    doc, _ = build(
        BASE + "services: {side: {image: x, user: '4321:4321', workdir: /home/side/,"
        " command: [serve, --x], healthcheck: {test: 'true'}}}\n",
        tmp_path,
    )
    side = doc["services"]["side"]
    # PID 1 (the gate) is root's, so that root commands keep their capabilities under
    # no-new-privileges; the start file makes the command 4321's
    assert side["working_dir"] == "/home/side" and side["user"] == "0:0"
    assert side["security_opt"] == ["no-new-privileges:true"]
    # the image's entrypoint and the file's command run after the gate, as given
    assert side["entrypoint"] == ["/bin/sh", "-c", GATE.replace("$", "$$"), "orchestrator-gate"]
    assert side["command"] == ["serve", "--x"]
    # the engine cannot hold main for a gated service's health: the runtime waits for it
    assert doc["services"]["main"]["depends_on"]["side"] == {"condition": "service_started"}


def test_static_assets_gate_a_service_only_where_they_are_copied_in(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    text = BASE + (
        "static_assets: [{name: site, path: site, save_path: site}]\n"
        "services: {web: {image: x}, blind: {image: x, static_assets: false}}\n"
    )
    local, _ = build(text, tmp_path)  # bind-mounted: there before the command starts
    assert "entrypoint" not in local["services"]["web"]
    remote, _ = build(text, tmp_path, remote=True)
    assert remote["services"]["web"]["entrypoint"][:2] == ["/bin/sh", "-c"]
    assert remote["services"]["web"]["command"] == []  # the image's, from the start file
    assert "entrypoint" not in remote["services"]["blind"]


@pytest.mark.parametrize(
    "service",
    [
        "{image: x, workdir: /data/w, mounts: [{source: ms, target: /data}]}",  # a host folder
        "{image: x, workdir: /data, mounts: [{source: ms, target: /data}]}",
        "{image: x, workdir: /static/mine}",
        "{image: x, workdir: /.orchestrator/w}",
        "{image: x, workdir: /.orchestrator-io}",
    ],
)
def test_attack_a_service_workdir_never_hands_over_a_mount(tmp_path: Path, service: str) -> None:
    """The workdir is given to the service's user: at or in a mount, a host folder (or the
    static assets, or our own folder) would change owner."""
    (tmp_path / "ws" / "ms").mkdir(parents=True)
    with pytest.raises(SpecError) as info:
        build(BASE + f"services: {{side: {service}}}\n", tmp_path)
    assert {i.field for i in info.value.issues} == {"services.side.workdir"}
    assert "is inside" in str(info.value)  # refused as a hand-over, not as an unknown key


@pytest.mark.parametrize(
    ("workdir", "why"),
    [("/", "whole file system"), ("/a/..", "whole file system"), ("relative", "pattern")],
)
def test_a_service_workdir_is_an_absolute_folder_below_the_root(workdir: str, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        load_environment_text(BASE + f"services: {{side: {{image: x, workdir: '{workdir}'}}}}\n")


def test_a_service_with_workdir_and_no_user_keeps_the_images_user(tmp_path: Path) -> None:
    doc, _ = build(BASE + "services: {side: {image: x, workdir: /w}}\n", tmp_path)
    assert "user" not in doc["services"]["side"]
    doc, _ = build(BASE + "services: {side: {image: x, user: root, workdir: /w}}\n", tmp_path)
    assert doc["services"]["side"]["user"] == "0:0"


def test_the_start_file_runs_what_the_engine_would_have_run() -> None:
    import subprocess

    from orchestrator.backends.container.copyin import start_text

    def argv(entry: list[str], cmd: list[str], given: list[str] | None, wd: str | None) -> str:
        text = start_text(entry, cmd, given is not None, wd)
        script = text + 'printf "[%s]" "$PWD" "$@"'
        run = subprocess.run(["sh", "-c", script, "sh", *(given or [])], capture_output=True)
        return run.stdout.decode() + run.stderr.decode()

    assert argv(["/ep", "a b"], ["c"], None, "/tmp") == "[/tmp][/ep][a b][c]"
    assert argv(["/ep"], ["c"], ["x", "$(id)"], None).endswith("[/ep][x][$(id)]")
    assert argv([], ["it's", "*"], None, None).endswith("[it's][*]")
    assert "has no command" in argv([], [], None, None)
