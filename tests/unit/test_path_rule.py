"""One rule for relative paths (issue 21, item 3): a relative path in an environment file
resolves against the file's own folder, in `validate`, `render` and the library alike, never
against a workspace (the private one `up` makes is new for each run); a path outside the
allowed roots is refused with a message that states the rule, the roots and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from orchestrator import Policy, PolicyError, backend_class, load_environment, prepare


def _load_yaml(text: str) -> Any:
    return YAML(typ="safe").load(text)


CLI = [sys.executable, "-m", "orchestrator"]
IMAGE = "orchestrator-test/busybox:1"
ROOTS_ENV = "ORCHESTRATOR_ALLOWED_MOUNT_ROOTS"


def cli(*args: str, cwd: Path, roots: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_ALLOW")}
    if roots is not None:
        env[ROOTS_ENV] = roots
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=120, env=env
    )


@pytest.fixture
def eval_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """eval/e4/env.yaml mounting ../e1 (and its own ./data); the working folder elsewhere."""
    e4, e1 = tmp_path / "eval" / "e4", tmp_path / "eval" / "e1"
    for folder in (e4 / "data", e1, tmp_path / "elsewhere"):
        folder.mkdir(parents=True)
    (e4 / "env.yaml").write_text(
        f"version: 1\nname: e4\nimage: {IMAGE}\n"
        "mounts:\n"
        "  - {source: ../e1, target: /e1, read_only: true}\n"
        "  - {source: ./data, target: /data}\n"
    )
    return e4, e1


def test_cli_refuses_a_parent_mount_naming_the_rule(eval_dirs: tuple[Path, Path]) -> None:
    e4, e1 = eval_dirs
    for verb in ("validate", "render"):
        done = cli(verb, str(e4 / "env.yaml"), cwd=e4.parent.parent / "elsewhere")
        assert done.returncode == 2, done.stderr
        assert f"{e1} is outside the allowed roots" in done.stderr  # the file's folder's ../e1
        assert f"the environment file's folder {e4}" in done.stderr
        assert "resolve against the file's own folder" in done.stderr  # the rule
        assert f"{ROOTS_ENV}={e1}" in done.stderr  # and the fix
        assert "orch-check-" not in done.stderr and "/tmp/tmp" not in done.stderr
        assert "Traceback" not in done.stderr


def test_cli_allows_a_parent_mount_inside_the_roots(eval_dirs: tuple[Path, Path]) -> None:
    e4, e1 = eval_dirs
    elsewhere = e4.parent.parent / "elsewhere"
    done = cli("validate", str(e4 / "env.yaml"), cwd=elsewhere, roots=str(e1))
    assert done.returncode == 0, done.stderr
    done = cli("render", str(e4 / "env.yaml"), cwd=elsewhere, roots=str(e1))
    assert done.returncode == 0, done.stderr
    volumes = {
        v["target"]: v["source"] for v in _load_yaml(done.stdout)["services"]["main"]["volumes"]
    }
    assert volumes["/e1"] == str(e1)
    assert volumes["/data"] == str(e4 / "data")  # not the working folder's, nor a workspace's


def test_library_uses_the_same_rule(eval_dirs: tuple[Path, Path]) -> None:
    e4, e1 = eval_dirs
    env = load_environment(e4 / "env.yaml")
    assert env.host_path("../e1").real == e1
    with pytest.raises(PolicyError) as caught:
        prepare(env, Policy())
    [issue] = caught.value.issues
    assert issue.field == "mounts.0.source" and (issue.line, issue.column) == (5, 14)
    assert f"{e1} is outside the allowed roots (the environment file's folder {e4})" in str(issue)
    assert "resolve against the file's own folder" in issue.fix
    allowed = Policy(extra_mount_roots=(e1,))
    assert backend_class(env).check(env, allowed) == []
    # a caller's workspace does not change where the file's paths point
    rendered = backend_class(env).render(env, e4.parent.parent / "elsewhere", allowed)
    volumes = _load_yaml(rendered["compose.yaml"])["services"]["main"]["volumes"]
    assert {v["target"]: v["source"] for v in volumes}["/e1"] == str(e1)
