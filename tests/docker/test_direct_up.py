"""A one-container environment comes up through one `docker run` (backends/docker/direct.py)
and must be the container Compose would have made from the same file: the same
configuration, mounts, limits and labels, seen by the same Compose commands after."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator import load_environment, spawn_runtime
from orchestrator.backends.docker.direct import UP_PATH_ENV
from orchestrator.backends.docker.runtime import ComposeRuntime
from orchestrator.errors import OrchestratorError
from tests.conftest import main_container
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
