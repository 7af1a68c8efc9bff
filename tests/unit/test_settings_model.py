"""One settings model (orchestrator/settings.py): every ORCHESTRATOR_* variable the package
reads is declared there, with its type, default and doc, and read only through it; the CLI
passes its flags on through it, never by writing os.environ; `orchestrator config` shows each
value and where it came from; docs/settings.md is made from it."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

from orchestrator import UsageError, settings
from orchestrator.backends.container.channel import Mode
from orchestrator.cli.config_view import reference
from orchestrator.spec.models import ISOLATION_LEVELS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
EXECUTOR = PACKAGE / "backends" / "container" / "executor"
"""Runs inside sandboxes on their Python (3.7 up), without the package: reads its own."""
MODEL = {PACKAGE / "settings.py", PACKAGE / "setting.py"}
NOT_SETTINGS = {
    "ORCHESTRATOR_RUNTIME": "the local backend's mark in its commands' environment",
    "ORCHESTRATOR_BIND_HOST": "a variable the rendered Compose file interpolates",
    "ORCHESTRATOR_SPAWNED_BY": "the mark of the engine clients a process starts for sandboxes",
}
EARLY_READS = {
    (PACKAGE / "endpoint.py", "ORCHESTRATOR_STATE_DIR"): "the `orchestrator` command's first "
    "module finds an environment's folder before the settings load (by their rule: "
    "test_endpoint_parse.py holds the two equal)",
}
DYNAMIC_READS = {
    PACKAGE / "spec" / "loader.py": "the host variables a file passes through, by its names",
    PACKAGE / "testing" / "target.py": "restores the variables the suite set for a spawn",
}
NAME = re.compile(r"(?<![A-Za-z0-9_])ORCHESTRATOR_[A-Z0-9_]*[A-Z0-9]")
"""(Not Typer's _ORCHESTRATOR_COMPLETE.)"""
FREE_TEXT = {
    "ORCHESTRATOR_DOCKER_HOST",
    "ORCHESTRATOR_GVISOR_RUNTIME",
    "ORCHESTRATOR_GVISOR_SEALED_RUNTIME",
    "ORCHESTRATOR_SWARM_HOST",
    "ORCHESTRATOR_SWARM_NODE_HOST",
    "ORCHESTRATOR_ALLOWED_MOUNT_ROOTS",
    "ORCHESTRATOR_ALLOW_CAPS",
    "ORCHESTRATOR_ALLOW_ENV",
    "ORCHESTRATOR_SECRETS_FILE",
    "ORCHESTRATOR_GATEWAY_TRUST",
    "ORCHESTRATOR_EGRESS",  # parsed by the policy (test_policy_egress names it)
    "ORCHESTRATOR_GATEWAY_BASE",
    "ORCHESTRATOR_GUARDIAN_LOG",
    "ORCHESTRATOR_PYTHON_IMAGE",
    "ORCHESTRATOR_BUSYBOX_IMAGE",
    "ORCHESTRATOR_HARBOR_IMAGE",
}
"""Settings any text is a value of."""


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if EXECUTOR not in path.parents:
            yield path, ast.parse(path.read_text(), str(path))


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def test_the_docs_table_is_the_model_s() -> None:
    committed = (ROOT / "docs" / "settings.md").read_text()
    assert committed == reference(), (
        "docs/settings.md is not what orchestrator/settings.py gives: regenerate it with "
        "`orchestrator config --docs > docs/settings.md`"
    )


def test_the_model_names_each_variable_once() -> None:
    names = [s.name for s in settings.CATALOG.every]
    assert len(names) == len(set(names)) and all(NAME.fullmatch(n) for n in names)
    assert all(s.section in settings.CATALOG.sections and s.doc for s in settings.CATALOG.every)


def test_a_variable_name_is_spelled_only_in_the_model() -> None:
    """Outside the model a name is `settings.X.name`: no module holds its own literal."""
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if path in MODEL or not isinstance(node, ast.Constant):
                continue
            text = node.value
            if (path, text) in EARLY_READS:
                continue
            if isinstance(text, str) and NAME.fullmatch(text) and text not in NOT_SETTINGS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert not found, found


def test_every_name_the_package_mentions_is_a_setting() -> None:
    """Docstrings, messages and the docs name only variables that exist
    (ORCHESTRATOR_DEFAULT_* and the like name several)."""
    known = {s.name for s in settings.CATALOG.every} | set(NOT_SETTINGS)
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    unknown = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in [*(p for p, _ in _modules()), *docs]
        for name in NAME.findall(path.read_text())
        if name not in known and not any(k.startswith(name + "_") for k in known)
    }
    assert not unknown, sorted(unknown)


def _environ_key(node: ast.AST) -> ast.expr | None:
    """The name `node` reads the environment at (os.environ[K], os.environ.get(K),
    os.getenv(K), K in os.environ), None when it reads none."""
    if isinstance(node, ast.Subscript) and _is_environ(node.value):
        return node.slice
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        f = node.func
        if (f.attr == "get" and _is_environ(f.value)) or f.attr == "getenv":
            return node.args[0]
    if isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
        return node.left
    return None


def test_no_environment_read_outside_the_model_names_a_setting() -> None:
    """os.environ / os.getenv are read only with a fixed name that is no setting's (HOME,
    DOCKER_HOST, ...), except where the names are a caller's (DYNAMIC_READS)."""
    found = []
    for path, tree in _modules():
        if path in MODEL or path in DYNAMIC_READS:
            continue
        for node in ast.walk(tree):
            key = _environ_key(node)
            if key is None:
                continue
            fixed = isinstance(key, ast.Constant) and isinstance(key.value, str)
            if fixed and (path, key.value) in EARLY_READS:  # type: ignore[attr-defined]
                continue
            if not fixed or NAME.match(ast.literal_eval(key)):
                found.append(f"{path.relative_to(ROOT)}: {ast.unparse(node)}")
    assert not found, found


def test_the_cli_never_writes_the_environment() -> None:
    """It passes values on (settings.use_flag), so `orchestrator config` can say so."""
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        text = path.read_text()
        assert "os.environ" not in text and "putenv" not in text, path


def test_a_bad_value_of_any_setting_is_a_usage_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for s in settings.CATALOG.every:
        if s.name in FREE_TEXT:
            continue
        monkeypatch.setenv(s.name, "#bad#")
        with pytest.raises(UsageError, match=re.escape(f"{s.name} must be {s.kind}, got '#bad#'")):
            s.get()
        monkeypatch.delenv(s.name)


def test_choices_are_those_the_code_knows() -> None:
    assert settings.ISOLATION.kind == f"one of {', '.join(ISOLATION_LEVELS)}"
    assert settings.EXEC_MODE.kind == f"one of {', '.join(get_args(Mode))}"


@pytest.fixture
def flags() -> Iterator[None]:
    settings.clear_flags()
    yield
    settings.clear_flags()


@pytest.mark.usefixtures("flags")
def test_a_flag_counts_over_the_variable_and_reaches_the_processes_we_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = settings.DOCKER_HOST.name
    monkeypatch.setenv(name, "tcp://from-env.test:1")
    assert settings.DOCKER_HOST.given() == ("tcp://from-env.test:1", "environment", "")
    settings.use_flag(settings.DOCKER_HOST, "tcp://from-flag.test:1", "--host")
    assert settings.DOCKER_HOST.get() == settings.engine_host() == "tcp://from-flag.test:1"
    assert settings.DOCKER_HOST.given() == ("tcp://from-flag.test:1", "flag", "--host")
    assert os.environ[name] == "tcp://from-env.test:1"  # never written
    assert settings.child_environ()[name] == "tcp://from-flag.test:1"  # a guardian's
    settings.clear_flags()
    assert settings.DOCKER_HOST.get() == "tcp://from-env.test:1"


@pytest.mark.usefixtures("flags")
def test_the_engine_flag_sets_aside_the_variables_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--engine podman` is over ORCHESTRATOR_DOCKER_HOST, in this process and its guardian."""
    monkeypatch.setenv(settings.DOCKER_HOST.name, "tcp://from-env.test:1")
    monkeypatch.setenv(settings.ENGINE.name, "docker")
    settings.use_flag(settings.ENGINE, "podman", "--engine")
    settings.use_flag(settings.DOCKER_HOST, "", "--engine")
    assert settings.engine_host() == settings.podman_socket()
    assert settings.DOCKER_HOST.given() == ("", "flag", "--engine")
    child = settings.child_environ()
    assert settings.DOCKER_HOST.name not in child and child[settings.ENGINE.name] == "podman"


def _config(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """`orchestrator ARGS` with only these ORCHESTRATOR_* variables set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        env={**env, **variables},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _by_name(out: str) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in json.loads(out)}


def test_config_says_each_value_and_where_it_came_from() -> None:
    done = _config(
        "--host", "tcp://127.0.0.1:9", "config", "--json", ORCHESTRATOR_ADMISSION_TIMEOUT="42"
    )
    assert done.returncode == 0, done.stderr
    got = _by_name(done.stdout)
    assert list(got) == [s.name for s in settings.CATALOG.every]
    assert got["ORCHESTRATOR_ADMISSION_TIMEOUT"] == {
        "name": "ORCHESTRATOR_ADMISSION_TIMEOUT",
        "value": 42.0,
        "source": "environment",
        "text": "42",
    }
    assert got["ORCHESTRATOR_DOCKER_HOST"]["value"] == "tcp://127.0.0.1:9"
    assert got["ORCHESTRATOR_DOCKER_HOST"]["source"] == "flag"
    assert got["ORCHESTRATOR_DOCKER_HOST"]["flag"] == "--host"
    assert got["ORCHESTRATOR_GUARDIAN"] == {
        "name": "ORCHESTRATOR_GUARDIAN",
        "value": True,
        "source": "default",
    }
    table = _config("--engine", "podman", "config", ORCHESTRATOR_SETUP_TIMEOUT="5")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split()[1:] for line in table.stdout.splitlines()[1:]}
    assert rows["ORCHESTRATOR_SETUP_TIMEOUT"] == ["5", "environment"]
    assert rows["ORCHESTRATOR_ENGINE"] == ["podman", "flag", "--engine"]
    assert rows["ORCHESTRATOR_FILE_TIMEOUT"] == ["600", "default"]


def test_config_names_a_bad_value_and_exits_2() -> None:
    done = _config("config", "--json", ORCHESTRATOR_MAX_CPUS="lots")
    assert done.returncode == 2, done.stderr
    assert "error: ORCHESTRATOR_MAX_CPUS must be a positive number of CPUs, got 'lots'" in (
        done.stderr
    )
    bad = _by_name(done.stdout)["ORCHESTRATOR_MAX_CPUS"]
    assert bad["value"] is None and bad["text"] == "lots" and "error" in bad


def test_config_docs_prints_the_reference() -> None:
    done = _config("config", "--docs")
    assert done.returncode == 0 and done.stdout == reference(), done.stderr


_GUARDED = """
import os, sys
from orchestrator import settings
from orchestrator.backends.container.guardian import ensure_guardian
settings.use_flag(settings.DOCKER_HOST, sys.argv[1], "--host")
ensure_guardian()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            parent = int(fh.read().rpartition(")")[2].split()[1])
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = dict(e.partition(b"=")[::2] for e in fh.read().split(b"\\0") if e)
    except OSError:
        continue
    if parent == os.getpid():
        print(env.get(settings.DOCKER_HOST.name.encode(), b"").decode())
"""


def test_the_guardian_works_with_the_engine_a_flag_named(tmp_path: Path) -> None:
    """What the CLI's `--host` names reaches the guardian it starts (its environment), so
    the guardian removes what the owner left on that engine, as the owner would."""
    nowhere = f"unix://{tmp_path / 'no-engine.sock'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env["ORCHESTRATOR_STATE_DIR"] = str(tmp_path / "state")
    done = subprocess.run(
        [sys.executable, "-c", _GUARDED, nowhere],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [nowhere]
