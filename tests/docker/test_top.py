"""`orchestrator top` (cli/top.py) and `ps --usage`: this user's environments with what each
costs now, read from outside their owners; under tmux (a real terminal) a live table that
sorts and takes one down on a key; `--once --json` for scripts; nothing a label says moves
the terminal's cursor."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PYTHON_IMAGE
from tests.docker.test_attack_inventory import L, docker, foreign_container

pytestmark = pytest.mark.docker
CLI = [sys.executable, "-m", "orchestrator"]
BUSY = "nohup python3 -c 'while True: pass' >/dev/null 2>&1 &"


def orch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def two(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Two environments left running by `up`, this test's alone: ids that sort together,
    before any other test's (the live test's before the others' here: `00`)."""
    ids = []
    mine = ("00" if "live" in request.node.name else "0") + uuid.uuid4().hex[:6]
    try:
        for name in (f"{mine}-a", f"{mine}-b"):
            path = tmp_path / f"{name}.yaml"
            path.write_text(f"version: 1\nname: {name}\nimage: {PYTHON_IMAGE}\n")
            up = orch("up", str(path))
            assert up.returncode == 0, up.stderr
            ids.append(up.stdout.strip())
        yield ids
    finally:
        for ident in ids:
            orch("down", ident)


def test_once_json_reads_each_environment_and_its_cpu_between_two_readings(
    two: list[str],
) -> None:
    busy, idle = two
    assert orch("exec", busy, "--", "sh", "-c", BUSY).returncode == 0
    time.sleep(0.5)
    got = orch("top", "--once", "--json", "--interval", "1.5")
    assert got.returncode == 0, got.stderr
    rows = {r["id"]: r for r in json.loads(got.stdout)}
    assert {busy, idle} <= set(rows), rows
    # a busy loop takes what CPU the machine leaves it (6% of a core was seen with the whole
    # suite on two cores), the idle one next to nothing: a percent, not a fraction
    assert rows[busy]["cpu_percent"] >= 2, rows[busy]
    assert rows[idle]["cpu_percent"] < min(10, rows[busy]["cpu_percent"] / 3), rows[idle]
    assert "while True" in rows[busy]["command"], rows[busy]  # what it runs now
    assert rows[idle]["command"] == "", rows[idle]  # (nothing but ours)
    for ident in two:
        row = rows[ident]
        assert row["memory_bytes"] > 0 and row["pids"] >= 1 and row["owner"] == "detached"
        assert row["egress_allowed"] is None  # no gateway: nothing goes out
        assert 0 <= row["age_seconds"] < 600
    table = orch("ps", "--usage")
    assert table.returncode == 0, table.stderr
    seconds = {}  # CPU-S: each one's CPU seconds so far
    for ident in two:
        [line] = [ln for ln in table.stdout.splitlines() if ln.startswith(ident)]
        seconds[ident] = float(line.split()[3])
    # the busy loop's seconds so far (0.5 s of its 2 s, once, with the whole suite on two
    # cores), more than the idle one's
    assert seconds[busy] > seconds[idle], table.stdout


def test_bad_options_are_usage_errors() -> None:
    for args in (["top", "--json"], ["top", "--once", "--sort", "nope"]):
        got = orch(*args)
        assert got.returncode == 2 and "Traceback" not in got.stderr, (args, got.stderr)


def test_a_label_cannot_move_the_terminals_cursor() -> None:
    """Another user of the engine labels a container as ours, its environment name full of
    escape sequences: every table shows them as text."""
    name = f"orch-evil-{uuid.uuid4().hex[:8]}"
    hostile = "\x1b]0;pwned\x07ev\x1b[2Jil\r\n"
    labels = {f"{L}managed": "1", f"{L}project": name, f"{L}owner.pid": "0", f"{L}env": hostile}
    labels["com.docker.compose.service"] = "main"  # what it runs is shown: escapes too
    with foreign_container(labels) as ident:
        script = 'f="/tmp/$(printf "x\\033[2Jy")"; touch "$f"; exec tail -f "$f"'
        assert docker("exec", "-d", ident, "sh", "-c", script).returncode == 0
        time.sleep(0.5)
        for args in (["top", "--once", "--interval", "0.2"], ["ps", "--usage"]):
            got = orch(*args)
            assert got.returncode == 0, got.stderr
            assert name in got.stdout and "\x1b" not in got.stdout + got.stderr, got.stdout
        shown = orch("top", "--once", "--json", "--interval", "0.2")
        [row] = [r for r in json.loads(shown.stdout) if r["id"] == name]
        assert "\x1b[2J" in row["command"], row  # (JSON escapes it: the data as it is)


def test_live_under_a_terminal_sorts_and_takes_the_selected_one_down(two: list[str]) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    first, second = two
    sock = f"orch-test-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    passed = {k: os.environ[k] for k in ("ORCHESTRATOR_STATE_DIR", "PYTHONPATH") if k in os.environ}
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in passed.items())
    top = shlex.join([*CLI, "top", "--interval", "1", "--sort", "age"])
    script = f"env -u COLUMNS -u LINES {env} {top}; echo __done__ $?; sleep 60"
    subprocess.run([*tmux, "new-session", "-d", "-x", "160", "-y", "40", script], check=True)

    def screen_with(*texts: str, within: float = 60) -> str:
        deadline = time.monotonic() + within
        while True:
            shown = subprocess.run(
                [*tmux, "capture-pane", "-p"], capture_output=True, text=True, timeout=10
            ).stdout
            if all(t in shown for t in texts):
                return shown
            assert time.monotonic() < deadline, f"no {texts} in:\n{shown}"
            time.sleep(0.2)

    def row_of(ident: str, shown: str) -> str:
        return next(line for line in shown.splitlines() if line.startswith(ident))

    try:
        shown = screen_with(first, second, "sorted by age")
        before = row_of(first, shown)
        deadline = time.monotonic() + 30
        while row_of(first, screen_with(first)) == before:  # it reads again: its age moves on
            assert time.monotonic() < deadline, f"no new reading of {first}: {before}"
            time.sleep(0.3)
        subprocess.run([*tmux, "send-keys", "s"], check=True)  # age -> id
        shown = screen_with("sorted by id")
        lines = shown.splitlines()
        assert lines.index(next(ln for ln in lines if ln.startswith(first))) < lines.index(
            next(ln for ln in lines if ln.startswith(second))
        ), shown
        # to the top (the selection starts on the oldest of all), then one down: the second
        subprocess.run([*tmux, "send-keys", *["k"] * 20, "j", "d", "n"], check=True)
        screen_with("not taken down")
        assert second in orch("ps").stdout
        subprocess.run([*tmux, "send-keys", "d", "y"], check=True)  # the second: down
        screen_with(f"removed {second}")
        assert second not in orch("ps").stdout and first in orch("ps").stdout
        subprocess.run([*tmux, "send-keys", "q"], check=True)
        screen_with("__done__ 0")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)
