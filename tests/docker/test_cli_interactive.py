"""`orchestrator exec -i`: our stdin passed to the command as it comes (a REPL answers each
line before the next is written, the end of our input is the command's), its exit code
ours; without -i the command reads end of file at once, however long our stdin stays
open; interrupted, the command's whole tree is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from orchestrator import attach
from tests.conftest import PYTHON_IMAGE

CLI = [sys.executable, "-m", "orchestrator"]
WITHIN = 60.0


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], input=stdin, capture_output=True, text=True, timeout=WITHIN
    )


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One environment left running by `up` for the module's checks."""
    path = tmp_path_factory.mktemp("interactive") / "interactive.yaml"
    path.write_text(f"version: 1\nname: interactive\nimage: {PYTHON_IMAGE}\n")
    up = cli("up", str(path))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        yield ident
    finally:
        down = cli("down", ident)
        assert down.returncode == 0, down.stderr


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*CLI, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _line(stream: object) -> bytes:
    """One line of a child's output, within the bound (a read that never comes fails)."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
    assert sel.select(WITHIN), f"no output within {WITHIN}s"
    return stream.readline()  # type: ignore[attr-defined, no-any-return]


def test_exec_i_answers_each_line_before_the_next_is_written(running: str) -> None:
    with _spawn("exec", "-i", running, "--", "python3", "-i", "-u", "-q") as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(b"a = 20\nprint('one', a + 1)\n")
            proc.stdin.flush()
            assert _line(proc.stdout) == b"one 21\n"  # while our stdin is still open
            proc.stdin.write(b"print('two', a * 2)\n")
            proc.stdin.close()
            assert _line(proc.stdout) == b"two 40\n"
            assert proc.wait(WITHIN) == 0
        finally:
            proc.kill()


def test_exec_i_gives_the_end_of_our_input_and_keeps_the_exit_code(running: str) -> None:
    data = "".join(f"line {i}\n" for i in range(50000))
    done = cli("exec", running, "-i", "--", "sh", "-c", "wc -l; exit 5", stdin=data)
    assert (done.returncode, done.stdout.strip()) == (5, "50000"), done.stderr


def test_exec_without_i_reads_end_of_file_at_once(running: str) -> None:
    holder = subprocess.Popen(["sleep", "600"], stdout=subprocess.PIPE)  # never ends its output
    try:
        done = subprocess.run(
            [*CLI, "exec", running, "--", "sh", "-c", "cat; echo eof"],
            stdin=holder.stdout,
            capture_output=True,
            text=True,
            timeout=WITHIN,
        )
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    assert (done.returncode, done.stdout) == (0, "eof\n"), done.stderr


def test_exec_i_interrupted_kills_the_whole_tree(running: str) -> None:
    marker = str(50000 + uuid.uuid4().int % 9999)
    with _spawn("exec", "-i", running, "--", "sh", "-c", f"sleep {marker} & echo up; cat") as proc:
        assert proc.stdout is not None
        try:
            assert _line(proc.stdout) == b"up\n"
            os.kill(proc.pid, signal.SIGINT)
            proc.wait(WITHIN)
        finally:
            proc.kill()
    with attach(running) as rt:
        deadline = time.monotonic() + 10
        while True:
            left = rt.execute(f"pgrep -f 'sleep {marker}' || true", user="root").stdout
            if not left.strip() or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert not left.strip(), left
