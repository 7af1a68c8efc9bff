"""The CLI as a user runs it: exit codes, messages, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_version_and_help() -> None:
    assert cli("--version").stdout.startswith("orchestrator ")
    out = cli("--help").stdout
    for verb in (
        "up",
        "run",
        "exec",
        "down",
        "ps",
        "logs",
        "shell",
        "render",
        "validate",
        "schema",
        "doctor",
        "config",
        "cleanup",
        "migrate",
    ):
        assert verb in out


def test_validate_shipped_files() -> None:
    r = cli("validate", *[str(p) for p in sorted((ROOT / "environments").glob("*.yaml"))])
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("ok: ") == 4


def test_bad_file_exits_2_with_location_and_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\nimage: i\nnetwork: {mode: bridged}\n")
    r = cli("validate", str(bad))
    assert r.returncode == 2
    assert f"{bad}:4:17: network.mode" in r.stderr and "Traceback" not in r.stderr


def test_policy_violation_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\nimage: i\nprivileged: true\n")
    r = cli("validate", str(bad))
    assert r.returncode == 2 and "privileged" in r.stderr


def test_run_bad_file_exits_2_and_starts_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\nimage: i\nworkdri: /x\n")
    r = cli("run", str(bad), "--", "true")
    assert r.returncode == 2 and "did you mean 'workdir'" in r.stderr
    assert "Traceback" not in r.stderr


def test_usage_error_exits_2() -> None:
    assert cli("run").returncode == 2
    assert cli("no-such-verb").returncode == 2


def test_schema_is_json_schema_with_docs() -> None:
    data = json.loads(cli("schema").stdout)
    assert data["properties"]["version"]["const"] == 1 or "enum" in data["properties"]["version"]
    assert data["properties"]["workdir"]["description"]
    assert data["additionalProperties"] is False


def test_render_prints_compose(tmp_path: Path) -> None:
    r = cli("render", str(ROOT / "environments" / "python.yaml"), "--workspace", str(tmp_path))
    assert r.returncode == 0 and "services:" in r.stdout and str(tmp_path) in r.stdout


def test_migrate(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("type: local\nname: l\nenvironment: {env: {A: b}}\n")
    r = cli("migrate", str(old))
    assert (
        r.returncode == 0 and r.stdout.startswith("version: 1\n") and "backend: local" in r.stdout
    )


def test_run_on_local_backend_passes_exit_code_and_streams() -> None:
    r = cli(
        "run", str(ROOT / "environments" / "local.yaml"), "--", "echo out; echo err >&2; exit 5"
    )
    assert (r.returncode, r.stdout, r.stderr) == (5, "out\n", "err\n")


def test_run_timeout_exits_124() -> None:
    r = cli("run", "-t", "0.5", str(ROOT / "environments" / "local.yaml"), "--", "sleep 10")
    assert r.returncode == 124 and "timed out" in r.stderr


def test_up_on_local_backend_is_refused() -> None:
    r = cli("up", str(ROOT / "environments" / "local.yaml"))
    assert r.returncode == 2 and "orchestrator run" in r.stderr


def test_run_named_file_command_resolves_static_assets(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hello.txt").write_text("hello\n")
    env = tmp_path / "env.yaml"
    env.write_text(
        "version: 1\nname: named\nbackend: local\n"
        "static_assets: [{name: data, path: data, save_path: d}]\n"
        "commands: {show: 'cat {{static:data}}/hello.txt'}\n"
    )
    r = cli("run", "--named", "show", str(env))
    assert (r.returncode, r.stdout) == (0, "hello\n"), r.stderr
    literal = cli("run", str(env), "--", "echo", "{{static:data}}")  # caller text: as given
    assert (literal.returncode, literal.stdout) == (0, "{{static:data}}\n")
    unknown = cli("run", "--named", "nope", str(env))
    assert unknown.returncode == 2 and "no command named 'nope' (known: show)" in unknown.stderr
    both = cli("run", "--named", "show", str(env), "--", "true")
    assert both.returncode == 2 and "not both" in both.stderr


def test_doctor_checks_the_engine_it_is_told_to(tmp_path: Path) -> None:
    """`--host` (of the CLI, or of doctor itself) is the engine doctor checks, not the
    local one: an address where no engine answers fails the engine check, naming it."""
    nowhere = f"unix://{tmp_path / 'no-engine.sock'}"
    for args in (["--host", nowhere, "doctor"], ["doctor", "--host", nowhere]):
        done = cli(*args)
        assert done.returncode == 1, done.stdout
        assert f"[fail] Docker engine at {nowhere} not reachable" in done.stdout


def test_exec_usage_is_checked_before_any_engine_call() -> None:
    done = cli("exec", "orch-none-00000000", "--timeout", "0", "--", "true")
    assert done.returncode == 2 and "--timeout must be a positive" in done.stderr
    done = cli("exec", "orch-none-00000000", "--service")
    assert done.returncode == 2 and "--service needs a value" in done.stderr
    done = cli("exec", "orch-none-00000000", "--servce", "side", "--", "true")
    assert done.returncode == 2 and "exec has no option --servce" in done.stderr


PUBLIC = {
    "orchestrator",
    "orchestrator.errors",
    "orchestrator.cli.progress",
    "orchestrator.quickcli",  # (itself held to public names below)
    "orchestrator.tables",
    "orchestrator.logprint",  # (printing only: what `logs` reads comes from the public API)
    "orchestrator.execflags",  # (the flags table `exec` shares with its quick path)
}


def test_commands_on_environments_use_public_names_only() -> None:
    """up, pool, run, exec, shell, down, ps, logs, cleanup and snapshot (and what they share)
    reach environments through the public API (`attach`, the runtime protocol), never
    through a backend's modules."""
    import ast

    from orchestrator import quickcli
    from orchestrator.cli import common, exec_cmds, running_cmds, start_cmds

    allowed = {
        "__future__",
        *PUBLIC,
        "orchestrator.cli.common",
        "collections.abc",
        "dataclasses",
        "pathlib",
        "typing",
    }
    functions = 0
    for module in (common, exec_cmds, running_cmds, start_cmds, quickcli):
        tree = ast.parse(Path(module.__file__ or "").read_text())
        top = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
        assert top <= allowed, (module.__name__, top - allowed)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                functions += 1
                used = {n.module or "" for n in ast.walk(node) if isinstance(n, ast.ImportFrom)}
                ours = {m for m in used if m.startswith("orchestrator")}
                ours -= {m for m in ours if m.startswith("orchestrator.cli.")}  # the CLI's own
                assert ours <= PUBLIC, (module.__name__, node.name, ours - PUBLIC)
    assert functions >= 20  # every command and helper was looked at


def test_attach_trusts_no_record_it_did_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record planted as a link, grown past its bound, or holding a hostile file is
    refused with a clear error, as is a project folder that is a link: nothing is started
    from it and nothing outside the state folder is read."""
    from orchestrator import ProjectNotFound, UsageError, attach
    from orchestrator.sandbox.record import RECORD, RECORD_LIMIT

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path))
    folder = tmp_path / "projects" / "orch-planted-0011aabb"
    folder.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    (folder / RECORD).symlink_to(elsewhere)
    with pytest.raises(ProjectNotFound, match="no record"):
        attach("orch-planted-0011aabb")
    (folder / RECORD).unlink()
    (folder / RECORD).write_bytes(b" " * (RECORD_LIMIT + 1))
    with pytest.raises(ProjectNotFound, match="cannot be read"):
        attach("0011aabb")
    spec = {"version": 1, "name": "x", "image": "i", "network": {"mode": "bridged"}}
    record = {"backend": "docker", "host": "", "source": "s", "base_dir": "/", "state": {}}
    (folder / RECORD).write_text(json.dumps({**record, "spec": spec}))
    with pytest.raises(ProjectNotFound, match="cannot be read"):
        attach("0011aabb")
    spec["network"] = {"mode": "none"}
    (folder / RECORD).write_text(json.dumps({**record, "spec": spec, "backend": "nosuch"}))
    with pytest.raises(UsageError, match="unknown backend 'nosuch'"):
        attach("0011aabb")
    linked = tmp_path / "projects" / "orch-linked-0022bbcc"
    linked.symlink_to(folder)
    with pytest.raises(ProjectNotFound, match="no environment"):
        attach("orch-linked-0022bbcc")
    shown = subprocess.run(
        [sys.executable, "-m", "orchestrator", "exec", "0011aabb", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ORCHESTRATOR_STATE_DIR": str(tmp_path)},
    )
    assert shown.returncode == 2 and "Traceback" not in shown.stderr, shown.stderr
