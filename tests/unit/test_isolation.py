"""`isolation: runc | gvisor` without an engine: which containers the compose file puts under
gVisor's runtime, the caller's policy raising (never lowering) a file, and the backends that
cannot run gVisor refusing it by field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from orchestrator.backends.docker.render import (
    GVISOR_RUNTIME_ENV,
    CompiledProject,
    CompileOptions,
    compile_project,
)
from orchestrator.backends.local import LocalRuntime
from orchestrator.backends.swarm.compile import StackOptions, compile_stack
from orchestrator.errors import SpecError, UsageError
from orchestrator.spec.loader import load_environment_text
from orchestrator.spec.policy import ISOLATION_ENV, Policy

BASE = "version: 1\nname: iso\nimage: img\n"
TWO = "services:\n  db: {image: d}\n  cache: {image: c, isolation: runc}\n"


@pytest.fixture(autouse=True)
def _no_caller_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's own isolation settings do not reach these tests."""
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    monkeypatch.delenv(GVISOR_RUNTIME_ENV, raising=False)


def render(text: str, tmp_path: Path, policy: Policy | None = None) -> CompiledProject:
    env = load_environment_text(text, base_dir=tmp_path)
    opts = CompileOptions(
        project="orch-iso-1",
        workspace=tmp_path,
        subnet="10.213.0.0/27",
        host_env={},
        policy=policy or Policy(),
    )
    return compile_project(env, opts)


def runtimes(compiled: CompiledProject) -> dict[str, Any]:
    """Each rendered container's `runtime` (None where it has none)."""
    doc = YAML(typ="safe").load(compiled.compose_yaml)
    return {name: svc.get("runtime") for name, svc in doc["services"].items()}


def test_runc_is_the_default_and_renders_no_runtime(tmp_path: Path) -> None:
    c = render(BASE + TWO, tmp_path)
    assert runtimes(c) == {"main": None, "db": None, "cache": None}
    assert c.runtimes == ()


def test_a_gvisor_file_puts_every_container_without_its_own_under_runsc(tmp_path: Path) -> None:
    c = render(BASE + "isolation: gvisor\n" + TWO, tmp_path)
    assert runtimes(c) == {"main": "runsc", "db": "runsc", "cache": None}
    assert c.runtimes == ("runsc",)


def test_one_service_alone_under_gvisor(tmp_path: Path) -> None:
    text = BASE + "services:\n  db: {image: d, isolation: gvisor}\n  cache: {image: c}\n"
    assert runtimes(render(text, tmp_path)) == {"main": None, "db": "runsc", "cache": None}


def test_the_environment_own_containers_stay_on_the_default_runtime(tmp_path: Path) -> None:
    """The egress gateway is the environment's own (no user code runs there): runc."""
    text = BASE + "isolation: gvisor\nnetwork: {egress: [allowed.test]}\n"
    c = render(text, tmp_path)
    got = runtimes(c)
    assert c.infra and all(got[name] is None for name in c.infra)
    assert got["main"] == "runsc"


def test_the_runtime_name_comes_from_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GVISOR_RUNTIME_ENV, "gvisor-kvm")
    c = render(BASE + "isolation: gvisor\n" + TWO, tmp_path)
    assert runtimes(c) == {"main": "gvisor-kvm", "db": "gvisor-kvm", "cache": None}
    assert c.runtimes == ("gvisor-kvm",)


@pytest.mark.parametrize("own", ["", "isolation: runc\n"], ids=["unsaid", "runc"])
def test_the_policy_raises_every_container_to_gvisor(tmp_path: Path, own: str) -> None:
    c = render(BASE + own + TWO, tmp_path, Policy(isolation="gvisor"))
    assert runtimes(c) == {"main": "runsc", "db": "runsc", "cache": "runsc"}


def test_a_runc_policy_never_lowers_a_gvisor_file(tmp_path: Path) -> None:
    text = BASE + "isolation: gvisor\nservices:\n  db: {image: d, isolation: gvisor}\n"
    env = load_environment_text(text, base_dir=tmp_path)
    policy = Policy(isolation="runc")
    assert policy.isolation_of(env.spec, "main") == "gvisor"
    assert policy.isolation_of(env.spec, "db") == "gvisor"
    assert runtimes(render(text, tmp_path, policy)) == {"main": "runsc", "db": "runsc"}


def test_the_policy_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Policy.from_env().isolation == "runc"
    monkeypatch.setenv(ISOLATION_ENV, "gvisor")
    assert Policy.from_env().isolation == "gvisor"


@pytest.mark.parametrize("value", ["kata", "GVISOR ", "none"])
def test_a_bad_isolation_setting_is_a_usage_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(ISOLATION_ENV, value)
    with pytest.raises(UsageError, match=ISOLATION_ENV):
        Policy.from_env()


@pytest.mark.parametrize(
    ("text", "policy", "field"),
    [
        (BASE + "isolation: gvisor\n", Policy(), "isolation"),
        (
            BASE + "services:\n  db: {image: d, isolation: gvisor}\n",
            Policy(),
            "services.db.isolation",
        ),
        (BASE, Policy(isolation="gvisor"), "isolation"),
    ],
    ids=["file", "service", "policy"],
)
def test_swarm_refuses_gvisor_naming_the_field(
    tmp_path: Path, text: str, policy: Policy, field: str
) -> None:
    env = load_environment_text(text, base_dir=tmp_path)
    with pytest.raises(SpecError) as err:
        compile_stack(env, StackOptions(project="orch-iso-1", labels={}, policy=policy))
    assert field in [i.field for i in err.value.issues]
    assert "gVisor" in str(err.value) and "docker backend" in str(err.value)


def test_swarm_takes_runc(tmp_path: Path) -> None:
    env = load_environment_text(BASE + "isolation: runc\n", base_dir=tmp_path)
    compile_stack(env, StackOptions(project="orch-iso-1", labels={}, policy=Policy()))


@pytest.mark.parametrize(
    ("own", "policy"),
    [("isolation: gvisor\n", Policy()), ("", Policy(isolation="gvisor"))],
    ids=["file", "policy"],
)
def test_local_refuses_gvisor_naming_the_field(tmp_path: Path, own: str, policy: Policy) -> None:
    env = load_environment_text("version: 1\nname: iso\nbackend: local\n" + own, base_dir=tmp_path)
    with pytest.raises(SpecError) as err:
        LocalRuntime.check(env, policy)
    assert [i.field for i in err.value.issues] == ["isolation"]
    assert "gVisor" in str(err.value) and "docker backend" in str(err.value)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (BASE + "isolation: kata\n", "isolation"),
        (BASE + "services:\n  db: {image: d, isolation: kata}\n", "services.db.isolation"),
    ],
    ids=["file", "service"],
)
def test_the_schema_refuses_an_unknown_isolation(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(SpecError) as err:
        load_environment_text(text, base_dir=tmp_path)
    assert field in [i.field for i in err.value.issues]
    assert "gvisor" in str(err.value)
