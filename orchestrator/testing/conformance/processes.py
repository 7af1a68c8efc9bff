"""The conformance checks of a started process (`start`): input written as it runs and its
end, output as it comes, signals to its group, kill and timeout of its whole tree, and the
errors of talking to one that ended."""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator import Process, Runtime
from orchestrator.errors import ProcessEnded, UsageError
from orchestrator.testing.conformance.kit import skip_if, survivors_within, unique_sleep
from orchestrator.testing.target import Target

WITHIN = 30.0
"""Longest any one step here may take: a bound, not a timing."""


def _until(proc: Process, text: str) -> str:
    """Stdout read until `text` shows in it (fails at the bound, or at the process's end)."""
    seen, deadline = "", time.monotonic() + WITHIN
    while text not in seen:
        event = proc.read(max(0.0, deadline - time.monotonic()))
        assert event is not None, f"no {text!r} within {WITHIN}s; stdout so far: {seen!r}"
        assert event.kind != "finished", (text, seen, event.result)
        if event.kind == "stdout":
            seen += event.text
    return seen


def test_process_a_repl_keeps_its_state_between_lines(rt: Runtime) -> None:
    """An interactive Python driven line by line: each answer read before the next line is
    written, so its output comes as it runs, not at its end."""
    with rt.start(["python3", "-i", "-u", "-q"], timeout=WITHIN) as proc:
        proc.write("a = 20\n")
        proc.write("a += 1; print('first', a)\n")
        assert "first 21" in _until(proc, "first 21\n")
        proc.write(b"print('second', a * 2)\n")
        assert "second 42" in _until(proc, "second 42\n")
        proc.close_stdin()
        result = proc.wait(WITHIN)
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout == "first 21\nsecond 42\n"  # the result keeps what the events gave
    assert ">>>" in result.stderr  # the prompts: stderr, apart


def test_process_stdin_end_reaches_the_command_after_every_byte(rt: Runtime) -> None:
    piece = bytes(range(256)) * 1024  # 256 KiB, every byte value
    proc = rt.start("wc -c; echo end >&2")
    for _ in range(12):
        proc.write(piece, timeout=WITHIN)
    proc.close_stdin()
    proc.close_stdin()  # again: nothing
    result = proc.wait(WITHIN)
    assert (result.exit_code, result.stdout.strip(), result.stderr) == (
        0,
        str(12 * len(piece)),
        "end\n",
    )
    with pytest.raises(ProcessEnded):
        proc.write("late")


def test_process_without_stdin_reads_end_of_file_and_refuses_writes(rt: Runtime) -> None:
    proc = rt.start("cat; echo done", stdin=False)
    with pytest.raises(UsageError):
        proc.write("x")
    assert proc.wait(WITHIN).stdout == "done\n"


def test_process_sigint_reaches_its_process_group(rt: Runtime) -> None:
    """Ctrl-C's signal goes to the group: the shell and the program it waits for both see it."""
    child = (
        "import signal, sys, time\n"
        "got = []\n"
        "signal.signal(signal.SIGINT, lambda *_: got.append(1)); print('ready', flush=True)\n"
        "while not got: time.sleep(0.05)\n"
        "print('child-int', flush=True); sys.exit(7)\n"
    )
    script = f"trap 'echo parent-int' INT; python3 -c \"{child}\"; echo child-exit-$?"
    proc = rt.start(script, stdin=False, timeout=WITHIN)
    _until(proc, "ready\n")
    proc.signal(signal.SIGINT)
    result = proc.wait(WITHIN)
    assert "child-int\n" in result.stdout and "parent-int\n" in result.stdout, result
    assert "child-exit-7" in result.stdout and not result.timed_out


def test_process_kill_ends_its_whole_tree(rt: Runtime) -> None:
    marker = unique_sleep()
    proc = rt.start(f"sleep {marker} & sleep {marker}; wait", timeout=WITHIN)
    proc.write("unread input\n")
    time.sleep(0.3)
    proc.kill()
    result = proc.wait(WITHIN)
    assert result.exit_code == 137 and not result.timed_out
    assert not survivors_within(rt, f"sleep {marker}", 10)
    proc.kill()  # ended: nothing
    proc.signal(signal.SIGTERM)


def test_process_timeout_kills_its_tree_with_stdin_open(rt: Runtime) -> None:
    marker = unique_sleep()
    proc = rt.start(f"sleep {marker} & cat; wait", timeout=1)
    proc.write("held open\n")
    result = proc.wait(WITHIN)
    assert result.timed_out and result.elapsed < WITHIN
    assert result.stdout == "held open\n"
    assert not survivors_within(rt, f"sleep {marker}", 10)


def test_process_output_waits_for_a_reader_and_is_all_there(rt: Runtime) -> None:
    """Output nobody reads waits (the process is not hurried past its reader, nothing is
    dropped): read late, every line is there, in order."""
    proc = rt.start("i=0; while [ $i -lt 20000 ]; do echo line-$i; i=$((i+1)); done", stdin=False)
    time.sleep(1.0)  # nobody reads meanwhile
    text = "".join(e.text for e in proc if e.kind == "stdout")
    assert text.splitlines() == [f"line-{i}" for i in range(20000)]


def test_process_bad_signal_is_refused_before_anything_is_sent(rt: Runtime) -> None:
    proc = rt.start("sleep 30", stdin=False, timeout=WITHIN)
    try:
        for bad in (0, -1, 4096, "INT", True):
            with pytest.raises(UsageError):
                proc.signal(bad)  # type: ignore[arg-type]
    finally:
        proc.kill()
    assert proc.wait(WITHIN).exit_code == 137


# ----- on a terminal of its own ---------------------------------------------------------------
def test_process_on_a_terminal_sees_its_size_and_each_resize(
    conformance_target: Target, rt: Runtime
) -> None:
    skip_if(conformance_target, "tty")
    script = "stty size; tty; echo err >&2; read x; stty size; echo got-$x"
    with rt.start(script, tty=True, cols=100, rows=30, timeout=WITHIN) as proc:
        assert proc.tty
        _until(proc, "err")  # (what is typed is echoed at once: only after it, here)
        proc.resize(120, 40)
        proc.write("typed\n")
        result = proc.wait(WITHIN)
    lines = result.stdout.replace("\r\n", "\n").splitlines()
    assert lines[0] == "30 100" and lines[1].startswith("/dev/"), result
    assert lines[2:] == ["err", "typed", "40 120", "got-typed"], result  # one stream, echoed
    assert (result.exit_code, result.stderr) == (0, "")


def test_process_on_a_terminal_passes_ctrl_c_to_its_foreground_group(
    conformance_target: Target, rt: Runtime
) -> None:
    skip_if(conformance_target, "tty")
    skip_if(conformance_target, "tty-keys")
    proc = rt.start(
        "trap 'echo caught-int; exit 3' INT; echo ready; while :; do sleep 0.05; done",
        tty=True,
        timeout=WITHIN,
    )
    _until(proc, "ready")
    proc.write(b"\x03")  # Ctrl-C, typed: the terminal signals its foreground group
    result = proc.wait(WITHIN)
    assert result.exit_code == 3 and "caught-int" in result.stdout, result


def test_process_on_a_terminal_is_killed_whole_at_its_timeout(
    conformance_target: Target, rt: Runtime
) -> None:
    skip_if(conformance_target, "tty")
    marker = unique_sleep()
    proc = rt.start(f"sleep {marker} & sleep {marker}", tty=True, timeout=1)
    result = proc.wait(WITHIN)
    assert result.timed_out and result.elapsed < WITHIN
    assert not survivors_within(rt, f"sleep {marker}", 10)


def test_process_terminal_size_is_checked_at_the_call(rt: Runtime) -> None:
    for cols, rows in ((0, 24), (80, 0), (70000, 24), (80, -1)):
        with pytest.raises(UsageError):
            rt.start("true", tty=True, cols=cols, rows=rows)
    proc = rt.start("true", stdin=False)
    with pytest.raises(UsageError):
        proc.resize(80, 24)  # no terminal to resize
    proc.wait(WITHIN)


def test_process_on_a_terminal_reads_the_end_of_its_input(
    conformance_target: Target, rt: Runtime
) -> None:
    """On a terminal the end of input is typed (Ctrl-D): `close_stdin` ends a `cat`, and one
    started without stdin reads the end at once, as through a pipe."""
    skip_if(conformance_target, "tty")
    skip_if(conformance_target, "tty-keys")
    proc = rt.start("cat; echo after-$?", tty=True, timeout=WITHIN)
    proc.write("typed\n")
    proc.close_stdin()
    result = proc.wait(WITHIN)
    assert (result.exit_code, result.timed_out) == (0, False)
    assert "after-0" in result.stdout and "typed" in result.stdout, result
    quiet = rt.start("cat; echo after-$?", tty=True, stdin=False, timeout=WITHIN)
    with pytest.raises(UsageError):
        quiet.write("x")
    assert "after-0" in quiet.wait(WITHIN).stdout


def test_process_on_a_terminal_imports_nothing_of_its_folder(
    conformance_target: Target, rt: Runtime
) -> None:
    """The few lines of Python that give a command its terminal run isolated: modules the
    sandbox leaves in the command's folder (or names in PYTHONPATH) are never imported by
    them, whoever the command runs as."""
    skip_if(conformance_target, "tty")
    folder = f"shadow-{unique_sleep()}"
    plant = "import os; open(os.path.join(os.path.dirname(__file__), 'ran'), 'w').close()\n"
    for name in ("termios", "fcntl", "os", "errno"):
        rt.write_file(f"{folder}/{name}.py", plant)
    proc = rt.start("echo fine", tty=True, stdin=False, cwd=folder, env={"PYTHONPATH": "."})
    result = proc.wait(WITHIN)
    assert (result.exit_code, result.stdout) == (0, "fine\r\n"), result
    assert rt.execute(["ls", f"{folder}/ran"]).exit_code != 0, "a planted module ran"
