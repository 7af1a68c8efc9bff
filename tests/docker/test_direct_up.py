"""A one-container environment comes up through one `docker run` (backends/docker/direct.py)
and must be the container Compose would have made from the same file: the same
configuration, mounts, limits and labels, seen by the same Compose commands after."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from orchestrator import load_environment, spawn_runtime
from orchestrator.backends.docker.direct import UP_PATH_ENV
from orchestrator.backends.docker.runtime import ComposeRuntime
from orchestrator.errors import OrchestratorError
from tests.conftest import BUSYBOX_IMAGE, main_container
from tests.docker.conftest import MakeEnv

RICH = """\
user: "1000:1000"
workdir: /work/here
env:
  GREETING: "hello, world"
  EMPTY: ""
  MULTI: "a\\nb"
  PRICE: "$5 $$ ${X}"
  ODD: "a\\x85b\\u2028c\\x7f"
static_assets:
  - {name: a, path: assets, save_path: assets}
mounts:
  - {source: ./data, target: /data, read_only: false}
resources: {memory: 256m, cpus: 0.5, pids: 128, tmp: 16m}
"""

NAME_FILES = ("/etc/hosts", "/etc/resolv.conf")
VIEW = r"""
cat /etc/hosts /etc/resolv.conf /proc/sys/net/ipv6/conf/*/disable_ipv6
ls /sys/class/net; cat /proc/net/if_inet6; echo "$(hostname | wc -c) $(cat /etc/hostname | wc -c)"
grep -E ' /etc/(hosts|resolv.conf|hostname) ' /proc/self/mountinfo | cut -d' ' -f5,6 | sort
stat -c '%n %a %U %s' /etc/hosts /etc/resolv.conf /etc/hostname
python3 -c 'import socket; print(sorted(socket.getaddrinfo("localhost", 80, type=1)))'
python3 -c 'import socket; socket.create_connection(("1.1.1.1", 53), timeout=1)' 2>&1 | tail -1
"""
"""The sandbox's network and name files, as its commands see them: the direct path gives
a sandbox without network no engine network hook, and writes these itself (direct.py)."""
COMPOSE_VERSION = "com.docker.compose.version"
"""Set by Compose on what it makes, never by the direct path: tells the two apart."""


def _inspect(container: str) -> dict[str, Any]:
    out = subprocess.run(
        ["docker", "container", "inspect", container], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    found: dict[str, Any] = json.loads(out.stdout)[0]
    return found


def _shape(found: dict[str, Any], folder: str) -> dict[str, Any]:
    """What a container is, without what differs by name (ids, project, dates) or by who
    made it (Compose's own labels, how the entrypoint is split from the command)."""
    config, host = found["Config"], found["HostConfig"]
    name = found["Name"].lstrip("/").removesuffix("-main-1")

    def mine(text: str) -> str:
        return text.replace(folder, "FOLDER").replace(name, "PROJECT")

    return {
        "argv": [*(config["Entrypoint"] or []), *(config["Cmd"] or [])],
        "env": sorted(config["Env"]),
        "user": config["User"],
        "workdir": config["WorkingDir"],
        "image": config["Image"],
        "stop": config.get("StopTimeout"),
        "labels": {
            k: mine(v)
            for k, v in config["Labels"].items()
            if not k.startswith("com.docker.compose.")
            and k not in ("org.orchestrator.started", "org.orchestrator.owner.start")
        },
        "mounts": sorted(
            (mine(m["Source"]), m["Destination"], m["RW"], m["Type"])
            for m in found["Mounts"]
            if m["Destination"] not in NAME_FILES  # the engine's own are not listed: compared
        ),  # in the sandbox (VIEW)
        "host": {
            k: _empty_is_unset(k, host.get(k))
            for k in (
                "CapAdd",
                "CapDrop",
                "SecurityOpt",
                "Init",
                "NetworkMode",
                "Memory",
                "MemorySwap",
                "NanoCpus",
                "PidsLimit",
                "Tmpfs",
                "Runtime",
                "Privileged",
                "ReadonlyRootfs",
                "IpcMode",
                "PidMode",
                "UsernsMode",
                "ShmSize",
                "Ulimits",
                "Devices",
                "StorageOpt",
                "Dns",
                "ExtraHosts",
                "PortBindings",
                "PublishAllPorts",
                "RestartPolicy",
                "AutoRemove",
            )
        },
    }


def _empty_is_unset(key: str, value: Any) -> Any:
    """The engine keeps an empty list, or none, as the client sent it: the same to it."""
    if key == "RestartPolicy" and isinstance(value, dict):
        return {**value, "Name": value.get("Name") or "no"}
    return value if value not in ([], {}) else None


def _started(env_file: Path, path: str, monkeypatch: pytest.MonkeyPatch) -> ComposeRuntime:
    monkeypatch.setenv(UP_PATH_ENV, path)
    rt = spawn_runtime(load_environment(env_file))
    assert isinstance(rt, ComposeRuntime)
    return rt


def test_the_direct_path_makes_the_container_compose_makes(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = make_env(RICH)
    (env_file.parent / "assets").mkdir()
    (env_file.parent / "data").mkdir()
    shapes, made_by, views = {}, {}, {}
    for path in ("compose", "auto"):
        rt = _started(env_file, path, monkeypatch)
        try:
            assert rt.project is not None
            found = _inspect(main_container(rt))
            made_by[path] = COMPOSE_VERSION in found["Config"]["Labels"]
            assert found["Config"].get("NetworkDisabled", False) is (path == "auto")
            shapes[path] = _shape(found, str(rt.project.directory))
            r = rt.execute("id -u; pwd; printenv GREETING; printenv PRICE; printenv ODD")
            # (a YAML parser folds NEL and U+2028 into a space unless the template escapes them)
            said = ["1000", "/work/here", "hello, world", "$5 $$ ${X}", "a\x85b\u2028c\x7f"]
            assert r.stdout.split("\n")[:-1] == said
            views[path] = rt.execute(VIEW, user="root").stdout
        finally:
            rt.cleanup()
    assert made_by == {"compose": True, "auto": False}  # each path taken as asked
    assert views["auto"] == views["compose"]
    assert "127.0.0.1\tlocalhost" in views["auto"] and "Network is unreachable" in views["auto"]
    direct, compose = shapes["auto"], shapes["compose"]
    differ = {
        k: (direct[k], compose[k]) for k in compose if k != "host" and direct[k] != compose[k]
    }
    differ |= {
        k: (direct["host"][k], v) for k, v in compose["host"].items() if direct["host"][k] != v
    }
    assert differ == {}


SEVERAL = f"""\
network:
  egress: [allowed.test]
  ports: [{{container: 8080}}]
services:
  db:
    image: {BUSYBOX_IMAGE}
    command: [sleep, "100000"]
    volumes: [{{volume: data, target: /data}}]
  web:
    image: {BUSYBOX_IMAGE}
    workdir: /srv
    healthcheck: {{test: [CMD, "true"], interval: 250ms, timeout: 2s, retries: 3}}
    entrypoint: [sh, -c]
    command: ["exec sleep 100000"]
    depends_on: {{db: started}}
    env: {{MODE: "a b $$c"}}
    resources: {{memory: 64m, pids: 64}}
"""
"""A project of several containers the fast path makes (direct_project): the egress
gateway and the port forwarder on two networks, a plain service with a named volume, and
one with a health check that waits for it and is prepared first (gated: the sandbox waits
for it to have started only, and then for its health itself)."""


SUBNET = re.compile(r"\b\d+\.\d+\.\d+\.\d+/\d+\b")


def _answers(port: int) -> bool:
    """Whether 127.0.0.1:`port` answers an HTTP GET within 20 s."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as got:
                return bool(got.status == 200)
        except OSError:
            time.sleep(0.1)
    return False


def _networks(found: dict[str, Any], project: str) -> list[tuple[str, list[str]]]:
    """A container's networks and its aliases there, named without the project (and
    without the short id the engine adds)."""
    return sorted(
        (
            net.replace(project, "PROJECT"),
            sorted(
                a.replace(project, "PROJECT") for a in e["Aliases"] or [] if a != found["Id"][:12]
            ),
        )
        for net, e in found["NetworkSettings"]["Networks"].items()
    )


def _network_shape(found: dict[str, Any], project: str, folder: str) -> dict[str, Any]:
    ipam = found["IPAM"]
    return {
        "name": found["Name"].replace(project, "PROJECT"),
        "driver": found["Driver"],
        "internal": found["Internal"],
        "attachable": found["Attachable"],
        "ipv6": found["EnableIPv6"],
        "options": found["Options"] or {},
        "ipam": (ipam["Driver"], len(ipam["Config"] or []), ipam.get("Options") or {}),
        "labels": {
            k: v.replace(folder, "FOLDER").replace(project, "PROJECT")
            for k, v in found["Labels"].items()
            if k not in ("com.docker.compose.version", "com.docker.compose.config-hash")
            and k not in ("org.orchestrator.started", "org.orchestrator.owner.start")
        },
    }


def _project_shapes(rt: ComposeRuntime) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    """Each container's shape (with its networks, health check, ports, signals, resolvers
    and kernel settings) by service, each network's, and whether Compose made them."""
    assert rt.project is not None
    project, folder = rt.project.name, str(rt.project.directory)
    label = f"label=com.docker.compose.project={project}"
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", label], capture_output=True, text=True, timeout=60
    ).stdout.split()
    containers = {}
    by_compose = set()
    for ident in ids:
        found = _inspect(ident)
        config, host = found["Config"], found["HostConfig"]
        service = config["Labels"]["com.docker.compose.service"]
        by_compose.add(COMPOSE_VERSION in config["Labels"])
        shape = _shape(found, folder)
        shape["argv"] = [SUBNET.sub("SUBNET", a) for a in shape["argv"]]  # (each run its own)
        shape["labels"] = {k: v.replace(project, "PROJECT") for k, v in shape["labels"].items()}
        shape["mounts"] = [
            tuple(str(x).replace(project, "PROJECT") for x in m) for m in shape["mounts"]
        ]
        shape["host"]["NetworkMode"] = str(shape["host"]["NetworkMode"]).replace(project, "PROJECT")
        for key in ("DnsOptions", "Sysctls"):
            shape["host"][key] = _empty_is_unset(key, host.get(key))
        shape |= {
            "networks": _networks(found, project),
            "health": config.get("Healthcheck"),
            "exposed": config.get("ExposedPorts"),
            "signal": config.get("StopSignal"),
            "depends": sorted(  # (Compose writes them in no set order)
                config["Labels"].get("com.docker.compose.depends_on", "").split(",")
            ),
        }
        containers[service] = shape
    nets = subprocess.run(
        ["docker", "network", "ls", "-q", "--filter", label],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    found_nets = json.loads(
        subprocess.run(
            ["docker", "network", "inspect", *nets], capture_output=True, text=True, timeout=60
        ).stdout
    )
    networks = sorted(
        (_network_shape(n, project, folder) for n in found_nets), key=lambda n: n["name"]
    )
    assert len(by_compose) == 1
    return containers, networks, by_compose.pop()


def test_the_direct_path_makes_the_project_of_several_compose_makes(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several containers and their networks, made through the Engine API without a Compose
    process, are what Compose makes from the same file; and work as they do: the sidecar
    answers by name, the gateway is reached, the forwarder publishes its port."""
    env_file = make_env(SEVERAL)
    got: dict[str, Any] = {}
    for path in ("compose", "auto"):
        rt = _started(env_file, path, monkeypatch)
        try:
            containers, networks, by_compose = _project_shapes(rt)
            assert by_compose is (path == "compose")
            assert sorted(containers) == [
                "db",
                "main",
                "orchestrator-egress",
                "orchestrator-ports",
                "web",
            ]
            reach = rt.execute(
                "getent hosts db web orchestrator-egress | wc -l; printenv HTTPS_PROXY", user="root"
            )
            assert reach.stdout.split("\n")[:2] == ["3", "http://orchestrator-egress:3128"]
            said = rt.service("web").execute("tr '\\0' '\\n' < /proc/1/environ | grep ^MODE=")
            assert said.stdout == "MODE=a b $$c\n"
            serve = "setsid python3 -m http.server 8080 --bind 0.0.0.0 >/dev/null 2>&1 </dev/null &"
            assert rt.execute(serve, timeout=20).exit_code == 0
            [port] = rt.info().ports
            assert port.container == 8080 and _answers(port.host)
            got[path] = (containers, networks)
        finally:
            rt.cleanup()
    (direct, direct_nets), (compose, compose_nets) = got["auto"], got["compose"]
    assert direct_nets == compose_nets
    for service, shape in compose.items():
        mine = direct[service]
        differ = {k: (mine[k], v) for k, v in shape.items() if k != "host" and mine[k] != v}
        differ |= {
            k: (mine["host"][k], v) for k, v in shape["host"].items() if mine["host"][k] != v
        }
        assert differ == {}, (service, differ)


def test_compose_commands_see_a_directly_made_project(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logs, states and kill go through Compose: they find the container it did not make."""
    rt = _started(make_env(""), "auto", monkeypatch)
    try:
        assert rt.project is not None
        states = rt.project.service_states()
        assert [s for s, _ in states] == ["main"]
        rt.project.kill()
        assert all(look.ended for _, look in rt.project.service_states())
    finally:
        rt.cleanup()
    gone = subprocess.run(
        ["docker", "container", "inspect", f"{rt.project.name}-main-1"],
        capture_output=True,
        timeout=60,
    )
    assert gone.returncode != 0  # removed by its name, and nothing else of it is left


@pytest.mark.parametrize("path", ["compose", "auto"])
def test_a_failed_start_says_why_and_leaves_nothing(
    path: str, make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine makes the container but cannot start it (its workdir is a file, where the
    workspace must be mounted): the error carries the engine's reason, and the container
    it made is removed (the autouse leak check), on both paths alike."""
    with pytest.raises(OrchestratorError, match="not a directory"):
        _started(make_env("workdir: /etc/passwd\n"), path, monkeypatch)


@pytest.mark.parametrize("path", ["compose", "auto"])
def test_a_files_own_names_files_are_what_the_sandbox_sees(
    path: str, make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file may mount its own /etc/hosts and /etc/resolv.conf: the engine then leaves its
    own out, and so must the direct path (two mounts at one target fail the start)."""
    env_file = make_env(
        "mounts:\n"
        "  - {source: ./myhosts, target: /etc/hosts, read_only: true}\n"
        "  - {source: ./myresolv, target: /etc/resolv.conf}\n"
    )
    (env_file.parent / "myhosts").write_text("10.9.8.7 mine\n")
    (env_file.parent / "myresolv").write_text("nameserver 10.9.8.6\n")
    rt = _started(env_file, path, monkeypatch)
    try:
        seen = rt.execute("cat /etc/hosts /etc/resolv.conf").stdout
        assert seen == "10.9.8.7 mine\nnameserver 10.9.8.6\n"
    finally:
        rt.cleanup()
