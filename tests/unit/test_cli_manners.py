"""The CLI's manners, as a user meets them (issue 21): shell completion (the script for the
shell named, environment ids for `down`/`exec`/`logs`), `snapshot --list` as a table on a
terminal, its plain form in a pipe and `--json`. Terminals are real ones (tmux)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import orchestrator
from orchestrator.cli import common

CLI = [sys.executable, "-m", "orchestrator"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


def in_terminal(argv: list[str], *, width: int, height: int = 50, within: float = 60) -> str:
    """What `argv` shows on a real terminal `width` columns wide (tmux, on a server of its
    own that is removed after), wrapped lines joined."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    sock = f"orch-test-{uuid.uuid4().hex[:8]}"
    done = "__done__"
    script = f"env -u COLUMNS -u LINES {shlex.join(argv)}; echo {done} $?; sleep 60"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", str(width), "-y", str(height), script],
        check=True,
        timeout=10,
    )
    try:
        deadline = time.monotonic() + within
        while True:
            shown = subprocess.run(
                [*tmux, "capture-pane", "-p", "-J", "-S", "-"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            if done in shown:
                return shown.split(done)[0]
            assert time.monotonic() < deadline, f"no end within {within} s:\n{shown}"
            time.sleep(0.2)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)


# --- completion ---------------------------------------------------------------------------


@pytest.mark.parametrize(("shell", "mark"), [("bash", "complete_bash"), ("zsh", "#compdef")])
def test_show_completion_prints_the_script_of_the_shell_named(shell: str, mark: str) -> None:
    shown = cli("--show-completion", shell)
    assert shown.returncode == 0, shown.stderr
    assert mark in shown.stdout and "_ORCHESTRATOR_COMPLETE" in shown.stdout
    assert "orchestrator" in shown.stdout and "python" not in shown.stdout
    wrong = cli("--show-completion", "tcsh")
    assert wrong.returncode == 2 and "tcsh" in wrong.stderr and "Traceback" not in wrong.stderr


def _complete(words: str, state: Path) -> subprocess.CompletedProcess[str]:
    """What bash completion offers after `words` (the last one being completed)."""
    env = {
        "_ORCHESTRATOR_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
        "ORCHESTRATOR_STATE_DIR": str(state),
    }
    return cli(env=env)


def _recorded(state: Path, *names: str) -> None:
    for name in names:
        folder = state / "projects" / name
        folder.mkdir(parents=True)
        (folder / "runtime.json").write_text("{}")


def test_environment_ids_complete_for_the_commands_that_take_one(tmp_path: Path) -> None:
    _recorded(tmp_path, "orch-app-db-1a2b3c4d", "orch-app-web-5e6f7a8b", "orch-other-00000000")
    _recorded(tmp_path, "orch-app-$(touch pwned)-1", "orch-app-evil\nrm -rf ~")
    for verb in ("down", "exec", "logs", "snapshot", "shell"):
        offered = _complete(f"orchestrator {verb} orch-app-", tmp_path)
        assert offered.returncode == 0, offered.stderr
        assert offered.stdout.split() == ["orch-app-db-1a2b3c4d", "orch-app-web-5e6f7a8b"]
    more = _complete("orchestrator down orch-app-db-1a2b3c4d ", tmp_path)  # down takes several
    assert "orch-app-web-5e6f7a8b" in more.stdout.split()
    assert not (Path.cwd() / "pwned").exists()


def test_id_completion_without_a_state_folder_offers_nothing(tmp_path: Path) -> None:
    offered = _complete("orchestrator down orch-", tmp_path / "missing")
    assert (offered.returncode, offered.stdout.strip(), offered.stderr) == (0, "", "")


def test_id_completion_is_bounded_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def slow() -> list[str]:
        time.sleep(30)
        return ["orch-late-00000000"]

    def broken() -> list[str]:
        raise RuntimeError("state folder on fire")

    monkeypatch.setattr(common, "COMPLETE_WITHIN", 0.5)
    for lister in (slow, broken):
        monkeypatch.setattr(orchestrator, "attachable", lister)
        started = time.monotonic()
        assert common.complete_ids("orch-") == []
        assert time.monotonic() - started < 5


# --- snapshot --list ----------------------------------------------------------------------


@pytest.fixture
def snapshots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Write a snapshot record (and its archive) into a fresh state folder."""
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path))

    def write(name: str, **record: object) -> Path:
        folder = tmp_path / "snapshots"
        folder.mkdir(exist_ok=True)
        fields: dict[str, object] = {
            "env": "app",
            "digest": "d" * 64,
            "created": "2026-11-23T10:00:00Z",
        }
        fields.update(record)
        (folder / f"{name}.json").write_text(json.dumps(fields))
        (folder / f"{name}.tar").write_bytes(b"")
        return folder / f"{name}.tar"

    return write


def test_snapshot_list_json_has_exact_byte_counts(snapshots: Callable[..., Path]) -> None:
    path = snapshots("first", size=1536000, image="orchestrator-snapshot:abc", backend="docker")
    shown = cli("snapshot", "--list", "--json")
    assert shown.returncode == 0, shown.stderr
    (one,) = json.loads(shown.stdout)
    assert one["name"] == "first" and one["size"] == 1536000 and one["path"] == str(path)
    assert (one["env"], one["image"], one["backend"]) == (
        "app",
        "orchestrator-snapshot:abc",
        "docker",
    )
    alone = cli("snapshot", "--json")
    assert alone.returncode == 2 and "--list" in alone.stderr


def test_snapshot_list_json_of_none_is_an_empty_list(snapshots: Callable[..., Path]) -> None:
    assert json.loads(cli("snapshot", "--list", "--json").stdout) == []


def test_snapshot_list_in_a_pipe_keeps_its_plain_form(snapshots: Callable[..., Path]) -> None:
    path = snapshots("first", size=1536000)
    shown = cli("snapshot", "--list", env={"COLUMNS": "40"})
    assert shown.stdout == f"first\tapp\t2026-11-23T10:00:00Z\t1536000\t{path}\t-\n"


def test_snapshot_list_on_a_terminal_is_a_table_with_human_sizes(
    snapshots: Callable[..., Path],
) -> None:
    snapshots("first-snapshot-with-a-long-name", size=1536000, image="orchestrator-snapshot:a")
    snapshots("second", size=12)
    shown = in_terminal([*CLI, "snapshot", "--list"], width=100)
    lines = shown.splitlines()
    assert lines[0].split() == ["NAME", "ENV", "CREATED", "SIZE", "IMAGE"]
    assert "1.5 MB" in shown and "12 bytes" in shown and "1536000" not in shown
    assert lines[1].startswith("first-snapshot-with-a-long-name ")
    narrow = in_terminal([*CLI, "snapshot", "--list"], width=40)
    assert "first-snapshot-with-a-long-name" in narrow  # a name is never cut
    assert "…" not in narrow and "left out to fit 40 columns" in narrow


def test_snapshot_list_shows_a_hostile_record_as_text(snapshots: Callable[..., Path]) -> None:
    snapshots("odd", size="many", env="\x1b[2J[bold]x[/]\ny", created=3)
    shown = in_terminal([*CLI, "snapshot", "--list"], width=100)
    assert "Traceback" not in shown
    assert "\\x1b[2J[bold]x[/]\\ny" in shown and "many" in shown
    piped = cli("snapshot", "--list")
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 1
    assert "\x1b" not in piped.stdout and "\\x1b[2J" in piped.stdout


# --- down -----------------------------------------------------------------------------------


def test_down_refuses_ids_with_all_and_nothing_at_all(tmp_path: Path) -> None:
    state = {"ORCHESTRATOR_STATE_DIR": str(tmp_path)}
    both = cli("down", "--all", "orch-app-1a2b3c4d", env=state)
    assert both.returncode == 2 and "not both" in both.stderr
    none = cli("down", env=state)
    assert none.returncode == 2 and "--all" in none.stderr
