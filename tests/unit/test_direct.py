"""direct_run: which compose files the fast path makes with `docker run`, and that what it
passes the docker CLI reads back as the file said (a hostile path or name cannot change
what is mounted, set or run). The container itself is compared with Compose's in
tests/docker/test_direct_up.py."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.backends.docker.direct import UP_PATH_ENV, direct_run

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


def plan(doc: dict[str, Any]) -> list[str] | None:
    # as the template renders it: JSON is YAML, and each `$` is escaped from Compose
    text = json.dumps(doc, ensure_ascii=False).replace("$", "$$")
    run = direct_run(text, "orch-t-1", FOLDER)
    return None if run is None else run.argv


def values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag and "--" not in argv[:i]]


def test_a_plain_sandbox_is_one_docker_run() -> None:
    argv = plan(project())
    assert argv is not None
    assert argv[:4] == ["run", "--detach", "--name", "orch-t-1-main-1"]
    # the image and its arguments come after `--`: no name can be read as an option
    assert argv[argv.index("--") :] == ["--", "img:1", "/.orchestrator/entry.sh"]
    assert values(argv, "--entrypoint") == ["/bin/sh"]
    assert values(argv, "--env") == ["A=1"]
    assert values(argv, "--mount") == [
        f"type=bind,source={FOLDER}/sandbox,target=/.orchestrator,readonly"
    ]
    assert values(argv, "--network") == ["none"]
    labels = values(argv, "--label")
    assert "org.orchestrator.project=orch-t-1" in labels
    assert "com.docker.compose.project=orch-t-1" in labels  # Compose's ps and down find it


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
        pytest.param(project(pull_policy="never"), id="another pull policy"),
        pytest.param(project(stop_grace_period="1m30s"), id="a grace it cannot say"),
        pytest.param(project(entrypoint=[]), id="no entrypoint"),
        pytest.param(project(entrypoint=["", "x"]), id="an empty entrypoint"),
        pytest.param(project(environment={"A=B": "1"}), id="a name with ="),
        pytest.param(project(labels={"k=v": "1"}), id="a label with ="),
        pytest.param(project(environment={"A": None}), id="a variable without value"),
        pytest.param(
            project(volumes=[{"type": "volume", "source": "v", "target": "/v"}]), id="a volume"
        ),
        pytest.param(
            project(volumes=[{"type": "bind", "source": "/a,readonly=false", "target": "/a"}]),
            id="a comma in a path",
        ),
        pytest.param(
            project(volumes=[{"type": "bind", "source": '/a"b', "target": "/a"}]),
            id="a quote in a path",
        ),
        pytest.param(
            project(volumes=[{"type": "bind", "source": "/a", "target": "/a", "read_only": "no"}]),
            id="read_only not a bool",
        ),
        pytest.param(
            project(volumes=[{"type": "bind", "source": "relative", "target": "/a"}]),
            id="a relative path",
        ),
        pytest.param(project(pids_limit=True), id="a flag for a number"),
    ],
)
def test_what_it_cannot_make_exactly_goes_to_compose(doc: dict[str, Any]) -> None:
    assert plan(doc) is None


def test_compose_everywhere_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UP_PATH_ENV, "compose")
    assert plan(project()) is None
    monkeypatch.setenv(UP_PATH_ENV, "sometimes")
    from orchestrator.errors import UsageError

    with pytest.raises(UsageError, match=UP_PATH_ENV):
        plan(project())


def test_a_dollar_reads_as_compose_reads_it() -> None:
    argv = plan(project(environment={"P": "$5 $$ ${X}"}))
    assert argv is not None and values(argv, "--env") == ["P=$5 $$ ${X}"]
    # a `$` Compose would interpolate (never rendered by us): Compose decides
    doc = json.dumps(project(), ensure_ascii=False).replace('"A": "1"', '"A": "$HOME"')
    assert direct_run(doc, "orch-t-1", FOLDER) is None


def test_not_yaml_goes_to_compose() -> None:
    assert direct_run("services: [", "orch-t-1", FOLDER) is None
    assert direct_run("", "orch-t-1", FOLDER) is None


@given(
    source=st.text(min_size=1, max_size=40).map(lambda s: "/" + s),
    target=st.text(min_size=1, max_size=20).map(lambda s: "/" + s),
    value=st.text(max_size=40),
    read_only=st.booleans(),
)
def test_what_the_cli_reads_is_what_the_file_said(
    source: str, target: str, value: str, read_only: bool
) -> None:
    """Whatever the path or value, the docker CLI's reading of --mount (one CSV record of
    key=value fields) and --env (NAME=VALUE) gives back exactly the file's."""
    vol = {"type": "bind", "source": source, "target": target, "read_only": read_only}
    argv = plan(project(volumes=[vol], environment={"V": value}))
    if argv is None:
        return
    (mount,) = values(argv, "--mount")
    fields = next(csv.reader([mount]))
    parsed = dict(f.partition("=")[::2] for f in fields)
    assert parsed == {
        "type": "bind",
        "source": source,
        "target": target,
        **({"readonly": ""} if read_only else {}),
    }
    assert len(fields) == 3 + read_only
    (env,) = values(argv, "--env")
    assert env.split("=", 1) == ["V", value]
