"""direct_run: which compose files the fast path makes through the Engine API, and that
what it asks the engine for is what the file said, read as Compose reads it (every `$`
escaped by the template's own quoting comes back as one `$`). The container itself is
compared with Compose's in tests/docker/test_direct_up.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.backends.container.engine import api as engine_api
from orchestrator.backends.container.templating import quote
from orchestrator.backends.docker.direct import UP_PATH_ENV, direct_project, direct_run
from orchestrator.backends.docker.namefiles import HOSTS
from orchestrator.errors import UsageError

FOLDER = Path("/state/projects/orch-t-1")


def project(**main: Any) -> dict[str, Any]:
    svc: dict[str, Any] = {
        "image": "img:1",
        "pull_policy": "missing",
        "init": True,
        "entrypoint": ["/bin/sh", "/.orchestrator/entry.sh"],
        "command": [],
        "user": "0:0",
        "stop_grace_period": "2s",
        "network_mode": "none",
        "environment": {"A": "1"},
        "volumes": [
            {"type": "bind", "source": "./sandbox", "target": "/.orchestrator", "read_only": True}
        ],
        "cap_drop": ["ALL"],
        "cap_add": ["CHOWN"],
        "security_opt": ["no-new-privileges:true"],
        "labels": {"org.orchestrator.project": "orch-t-1"},
    }
    svc.update(main)
    return {"name": "orch-t-1", "services": {"main": svc}}


def render(value: Any) -> str:
    """YAML in flow style, every scalar through the template's own `q`."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{quote(k)}: {render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(render(v) for v in value) + "]"
    return "null" if value is None else quote(value)


def plan(doc: dict[str, Any]) -> dict[str, Any] | None:
    run = direct_run(render(doc), "orch-t-1", FOLDER)
    return None if run is None else run.body


def test_a_plain_sandbox_is_one_create() -> None:
    run = direct_run(render(project()), "orch-t-1", FOLDER)
    assert run is not None and run.name == "orch-t-1-main-1"
    body = run.body
    assert body["Image"] == "img:1"
    assert body["Entrypoint"] == ["/bin/sh", "/.orchestrator/entry.sh"] and body["Cmd"] == []
    assert body["Env"] == ["A=1"] and body["User"] == "0:0" and body["StopTimeout"] == 2
    host = body["HostConfig"]
    assert host["Mounts"][0] == {
        "Type": "bind",
        "Source": f"{FOLDER}/sandbox",
        "Target": "/.orchestrator",
        "ReadOnly": True,
    }
    assert host["CapDrop"] == ["ALL"] and host["CapAdd"] == ["CAP_CHOWN"]
    assert host["Init"] is True and host["NetworkMode"] == "none"
    labels = body["Labels"]
    assert labels["org.orchestrator.project"] == "orch-t-1"
    assert labels["com.docker.compose.project"] == "orch-t-1"  # Compose's ps and down find it


def test_no_network_is_made_without_the_engine_hook_and_keeps_its_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # not root: the engine's files could
    run = direct_run(render(project()), "orch-t-1", FOLDER)  # not be root's: the hook stays
    assert run is not None and "NetworkDisabled" not in run.body and not run.files
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    run = direct_run(render(project()), "orch-t-1", FOLDER)
    assert run is not None and run.body["NetworkDisabled"] is True
    names = {m["Target"]: m["Source"] for m in run.body["HostConfig"]["Mounts"]}
    assert run.files[Path(names["/etc/hosts"])] == HOSTS
    assert "nameserver" in run.files[Path(names["/etc/resolv.conf"])]
    assert set(run.body["HostConfig"]["Sysctls"].values()) == {"1"}  # IPv6 off, as the hook
    # gVisor's runtime keeps the engine's own network setup
    gvisor = direct_run(render(project(runtime="runsc")), "orch-t-1", FOLDER)
    assert gvisor is not None and "NetworkDisabled" not in gvisor.body and not gvisor.files
    assert direct_run(render(project(network_mode="host")), "orch-t-1", FOLDER) is None


def test_the_files_own_names_files_and_a_kernel_without_ipv6(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A file that mounts its own /etc/hosts or /etc/resolv.conf keeps it (the engine leaves
    its own out then); a kernel without IPv6 gets no IPv6 setting (the start would fail)."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    mine = [
        {"type": "bind", "source": "/srv/hosts", "target": "/etc//hosts", "read_only": True},
        {"type": "bind", "source": "/srv/resolv", "target": "/etc/resolv.conf"},
    ]
    run = direct_run(render(project(volumes=mine)), "orch-t-1", FOLDER)
    assert run is not None and run.files == {}
    targets = [m["Target"] for m in run.body["HostConfig"]["Mounts"]]
    assert targets == ["/etc//hosts", "/etc/resolv.conf"]
    monkeypatch.setattr("orchestrator.backends.docker.namefiles.IPV6_SWITCH", str(tmp_path / "x"))
    run = direct_run(render(project()), "orch-t-1", FOLDER)
    assert run is not None and "Sysctls" not in run.body["HostConfig"] and len(run.files) == 2


def test_limits_read_as_compose_reads_them() -> None:
    body = plan(
        project(
            mem_limit="256m",
            memswap_limit="1.5g",
            cpus=0.5,
            pids_limit=128,
            tmpfs="/tmp:size=16m,mode=1777",
            storage_opt={"size": "1g"},
        )
    )
    assert body is not None
    host = body["HostConfig"]
    assert host["Memory"] == 256 * 2**20 and host["MemorySwap"] == 3 * 2**29
    assert host["NanoCpus"] == 500_000_000 and host["PidsLimit"] == 128
    assert host["Tmpfs"] == {"/tmp": "size=16m,mode=1777"}
    assert host["StorageOpt"] == {"size": "1g"}


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param({**project(), "networks": {"default": {}}}, id="a network of its own"),
        pytest.param({**project(), "volumes": {"v": {}}}, id="a named volume"),
        pytest.param({**project(), "name": "other"}, id="another project's file"),
        pytest.param(
            {"name": "orch-t-1", "services": {**project()["services"], "db": {"image": "x"}}},
            id="a second service",
        ),
        pytest.param(project(network_mode="bridge"), id="bridged"),
        pytest.param(project(ports=["8080:80"]), id="ports"),
        pytest.param(project(healthcheck={"test": "true"}), id="an unknown key"),
        pytest.param(project(build={"context": "."}), id="a build"),
        pytest.param(project(pull_policy="always"), id="another pull policy"),
        pytest.param(project(stop_grace_period="1m30s"), id="a grace it cannot say"),
        pytest.param(project(entrypoint=[]), id="no entrypoint"),
        pytest.param(project(entrypoint=["", "x"]), id="an empty entrypoint"),
        pytest.param(project(environment={"A=B": "1"}), id="a name with ="),
        pytest.param(project(labels={"k=v": "1"}), id="a label with ="),
        pytest.param(project(environment={"A": None}), id="a variable without value"),
        pytest.param(
            project(volumes=[{"type": "volume", "source": "v", "target": "/v"}]), id="a volume"
        ),
        pytest.param(project(mem_limit="lots"), id="a size it cannot read"),
        pytest.param(project(tmpfs="tmp"), id="a tmpfs not at a path"),
        pytest.param(
            project(volumes=[{"type": "bind", "source": "/a", "target": "/a", "read_only": "no"}]),
            id="read_only not a bool",
        ),
        pytest.param(
            project(volumes=[{"type": "bind", "source": "relative", "target": "/a"}]),
            id="a relative path",
        ),
        pytest.param(project(pids_limit=True), id="a flag for a number"),
        pytest.param(project(cpus=1e300), id="cpus beyond any number"),
        pytest.param(project(mem_limit="9" * 400), id="a size beyond any number"),
    ],
)
def test_what_it_cannot_make_exactly_goes_to_compose(doc: dict[str, Any]) -> None:
    assert plan(doc) is None


def test_compose_everywhere_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UP_PATH_ENV, "compose")
    assert plan(project()) is None
    monkeypatch.setenv(UP_PATH_ENV, "sometimes")
    with pytest.raises(UsageError, match=UP_PATH_ENV):
        plan(project())


def test_a_lone_dollar_is_left_to_compose() -> None:
    """The template escapes every `$`; a lone one would be Compose's interpolation."""
    text = render(project()).replace('"A": "1"', '"A": "$HOME"')
    assert "$HOME" in text and direct_run(text, "orch-t-1", FOLDER) is None


def test_not_yaml_goes_to_compose() -> None:
    assert direct_run("services: [", "orch-t-1", FOLDER) is None
    assert direct_run("", "orch-t-1", FOLDER) is None


@given(
    source=st.text(min_size=1, max_size=40).map(lambda s: "/" + s),
    value=st.text(max_size=40),
    label=st.text(max_size=40),
)
def test_what_the_engine_gets_is_what_the_file_said(source: str, value: str, label: str) -> None:
    """Whatever a path, a variable or a label holds (`$`, quotes, commas, newlines,
    unicode), the engine is asked for exactly it, or the project is left to Compose."""
    vol = {"type": "bind", "source": source, "target": "/data", "read_only": False}
    body = plan(project(volumes=[vol], environment={"V": value}, labels={"l": label}))
    if body is None:
        return
    assert body["HostConfig"]["Mounts"][0]["Source"] == str(Path(source))
    assert body["Env"] == [f"V={value}"]
    assert body["Labels"]["l"] == label


def test_a_project_keeps_the_engine_it_was_made_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made while the process's engine was another machine's (a variable set for a while,
    as a harness may), a project never later takes the fast path to this machine's socket:
    its removal would go to the wrong engine and leave the container where it runs."""
    from orchestrator.backends.docker.lifecycle import Project
    from orchestrator.backends.docker.render import CompiledProject

    (tmp_path / "compose.yaml").write_text(render({**project(), "name": "orch-t-1"}))
    compiled = CompiledProject("orch-t-1", "", {}, (), (), {}, "0:0", "", False, False)
    monkeypatch.setenv("ORCHESTRATOR_DOCKER_HOST", "tcp://192.0.2.1:2375")
    remote = Project("orch-t-1", tmp_path, compiled)
    monkeypatch.delenv("ORCHESTRATOR_DOCKER_HOST")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert remote._direct() is None  # Compose, on the engine its clients were made for
    local = Project("orch-t-1", tmp_path, compiled)
    assert local._direct() is not None or engine_api.local_socket() is None


def several(**changes: Any) -> dict[str, Any]:
    """A project of several: the sandbox, a sidecar it waits for, and a gateway on two
    networks (as the template writes them); `changes`: keys of the sidecar's replaced."""
    main = project(depends_on={"db": {"condition": "service_started"}})["services"]["main"]
    del main["network_mode"]
    db = {
        "image": "db:1",
        "pull_policy": "never",
        "command": ["serve"],
        "init": True,
        "dns": ["127.0.0.1"],
        "labels": {"org.orchestrator.project": "orch-t-1"},
        **changes,
    }
    gateway = {
        "image": "gw:1",
        "pull_policy": "never",
        "command": ["proxy"],
        "stop_signal": "SIGKILL",
        "networks": ["egress", "default"],
        "sysctls": {"net.ipv4.ip_forward": "0"},
        "ulimits": {"nofile": {"soft": 4096, "hard": 4096}},
        "ports": ["127.0.0.1::8080/tcp"],
    }
    networks = {
        "default": {
            "internal": True,
            "driver_opts": {"com.docker.network.bridge.inhibit_ipv4": "true"},
            "ipam": {"config": [{"subnet": "10.9.0.0/27"}]},
            "labels": {"org.orchestrator.project": "orch-t-1"},
        },
        "egress": {"internal": False},
    }
    services = {"main": main, "db": db, "orchestrator-egress": gateway}
    return {"name": "orch-t-1", "services": services, "networks": networks}


def test_a_project_of_several_is_its_networks_then_each_container_in_waves() -> None:
    made = direct_project(render(several()), "orch-t-1", FOLDER)
    assert made is not None
    default, egress = made.networks
    assert default["Name"] == "orch-t-1_default" and default["Internal"] is True
    assert default["Options"] == {"com.docker.network.bridge.inhibit_ipv4": "true"}
    assert default["IPAM"]["Config"] == [{"Subnet": "10.9.0.0/27"}]
    assert default["Labels"]["com.docker.compose.network"] == "default"
    assert default["Labels"]["org.orchestrator.project"] == "orch-t-1"
    assert egress["Name"] == "orch-t-1_egress" and egress["Internal"] is False
    assert [[c.service for c in wave] for wave in made.waves()] == [
        ["db", "orchestrator-egress"],
        ["main"],
    ]
    by = {c.service: c for c in made.containers}
    gateway = by["orchestrator-egress"].body
    aliases = ("orch-t-1-orchestrator-egress-1", "orchestrator-egress")
    assert gateway["HostConfig"]["NetworkMode"] == "orch-t-1_default"  # (the first by name)
    assert gateway["NetworkingConfig"]["EndpointsConfig"] == {
        "orch-t-1_default": {"Aliases": list(aliases)}
    }
    assert by["orchestrator-egress"].joins == (("orch-t-1_egress", aliases),)
    assert gateway["StopSignal"] == "SIGKILL" and gateway["Cmd"] == ["proxy"]
    assert "Entrypoint" not in gateway  # (the image's own, as Compose leaves it)
    assert gateway["HostConfig"]["Sysctls"] == {"net.ipv4.ip_forward": "0"}
    assert gateway["HostConfig"]["Ulimits"] == [{"Name": "nofile", "Soft": 4096, "Hard": 4096}]
    assert gateway["ExposedPorts"] == {"8080/tcp": {}}
    assert gateway["HostConfig"]["PortBindings"] == {
        "8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]
    }
    assert by["main"].after == ("db",)
    assert by["main"].body["Labels"]["com.docker.compose.depends_on"] == "db:service_started:false"
    assert by["db"].body["HostConfig"]["Dns"] == ["127.0.0.1"]


def test_a_health_check_reads_as_compose_reads_it() -> None:
    check = {"test": "curl -f x", "interval": "1m30s", "timeout": "250ms", "retries": 3}
    made = direct_project(render(several(healthcheck=check)), "orch-t-1", FOLDER)
    assert made is not None
    db = next(c for c in made.containers if c.service == "db").body
    assert db["Healthcheck"] == {
        "Test": ["CMD-SHELL", "curl -f x"],
        "Interval": 90 * 10**9,
        "Timeout": 250 * 10**6,
        "Retries": 3,
    }


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(several(depends_on={"main": {"condition": "service_started"}}), id="a cycle"),
        pytest.param(
            {
                **several(),
                "services": {
                    **several()["services"],
                    "main": {
                        **several()["services"]["main"],
                        "depends_on": {"db": {"condition": "service_healthy"}},
                    },
                },
            },
            id="waits for health",
        ),
        pytest.param(several(depends_on={"gone": {"condition": "service_started"}}), id="no such"),
        pytest.param(several(command="serve now"), id="a command Compose splits"),
        pytest.param(several(networks=["elsewhere"]), id="a network not declared"),
        pytest.param(several(networks=[]), id="no network"),
        pytest.param(several(network_mode="host"), id="the host's network"),
        pytest.param(several(restart="always"), id="an unknown key"),
        pytest.param(several(ports=["8080:80"]), id="a port of another form"),
        pytest.param(several(healthcheck={"test": ["NONE"]}), id="a check switched off"),
        pytest.param(several(healthcheck={"test": "x", "interval": "1d"}), id="a duration"),
        pytest.param(several(ulimits={"nofile": 4096}), id="a bare ulimit"),
        pytest.param(
            {**several(), "networks": {**several()["networks"], "x": {"external": True}}},
            id="an external network",
        ),
        pytest.param(
            {**several(), "networks": {"egress": {}}}, id="default made by Compose itself"
        ),
        pytest.param(
            {"name": "orch-t-1", "services": {"db": several()["services"]["db"]}}, id="no main"
        ),
    ],
)
def test_what_a_project_of_several_cannot_make_exactly_goes_to_compose(
    doc: dict[str, Any],
) -> None:
    assert direct_project(render(doc), "orch-t-1", FOLDER) is None


class SlowEngine:
    """An engine of this machine that answers every call, each `takes` seconds of a clock
    of its own (no Docker); records what it was asked."""

    socket = "/nonexistent.sock"
    kind = "docker"

    def __init__(self, clock: list[float], takes: float) -> None:
        self.clock, self.takes, self.asked = clock, takes, list[str]()
        self.bound = 300.0

    def within(self, seconds: float) -> SlowEngine:
        self.bound = seconds
        return self

    def has_image(self, image: str) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        def call(*args: object, **kwargs: object) -> None:
            self.asked.append(name)
            self.clock[0] += self.takes

        return call


@pytest.mark.parametrize(("takes", "made"), [(0.1, True), (4.0, False)])
def test_a_project_of_several_is_made_within_one_deadline(
    takes: float, made: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its many engine calls share the start's one bound (ORCHESTRATOR_UP_TIMEOUT, as
    Compose's one process had), never each a bound of its own: an engine that answers
    each call slowly fails the start once the bound is spent."""
    from types import SimpleNamespace

    from orchestrator.backends.container.engine import TIMED_OUT
    from orchestrator.backends.docker import lifecycle
    from orchestrator.backends.docker.render import CompiledProject
    from orchestrator.errors import DockerError

    (tmp_path / "compose.yaml").write_text(render(several()))
    compiled = CompiledProject("orch-t-1", "", {}, (), (), {}, "0:0", "", False, False)
    project = lifecycle.Project("orch-t-1", tmp_path, compiled)
    clock = [0.0]
    project.engine = SlowEngine(clock, takes)  # type: ignore[assignment]
    monkeypatch.setattr(lifecycle, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(lifecycle, "up_timeout", lambda: 10.0)
    if made:
        assert project._create_many()
        assert project.engine.asked.count("start_container") == 3  # type: ignore[attr-defined]
        return
    with pytest.raises(DockerError, match="timed out") as err:
        project._create_many()
    assert err.value.returncode == TIMED_OUT
    assert "start_container" not in project.engine.asked  # type: ignore[attr-defined]
    assert clock[0] <= 10.0 + takes
