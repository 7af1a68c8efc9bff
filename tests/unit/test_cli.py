"""The CLI as a user runs it: exit codes, messages, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
