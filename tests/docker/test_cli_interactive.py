"""`orchestrator exec -i`: our stdin passed to the command as it comes (a REPL answers each
line before the next is written, the end of our input is the command's), its exit code
ours; without -i the command reads end of file at once, however long our stdin stays
open; interrupted, the command's whole tree is killed. `exec -it` on a real terminal (a
pseudo-terminal of the test's): a shell answers typed lines, Ctrl-C typed reaches what it
runs, a resize of ours reaches its terminal, and ours is left as it was."""

from __future__ import annotations

import fcntl
import json
import os
import select
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import attach
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE

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


class Terminal:
    """The CLI run on a real terminal of ours (a pseudo-terminal pair), read and typed into
    as a person at a terminal would."""

    def __init__(self, argv: list[str], cols: int = 100, rows: int = 30) -> None:
        self.master, slave = os.openpty()
        self.resize(cols, rows)
        self.settings = termios.tcgetattr(self.master)
        """Its settings before the CLI ran (cooked: the CLI must leave them so)."""
        self.proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self.seen = b""

    def resize(self, cols: int, rows: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def until(self, text: bytes) -> bytes:
        """What the terminal showed up to `text` (fails at the bound)."""
        deadline = time.monotonic() + WITHIN
        while text not in self.seen:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.master], [], [], max(0.0, left))
            assert ready, f"no {text!r} within {WITHIN}s; the terminal showed {self.seen!r}"
            try:
                self.seen += os.read(self.master, 65536)
            except OSError:  # the CLI ended: its terminal's other side is gone
                break
        assert text in self.seen, self.seen
        shown, self.seen = self.seen.partition(text)[0] + text, self.seen.partition(text)[2]
        return shown

    def close(self) -> tuple[int, bool]:
        """The CLI's exit code, and whether it left the terminal's settings as it found them."""
        try:
            code = self.proc.wait(WITHIN)
            return code, termios.tcgetattr(self.master) == self.settings
        finally:
            self.proc.kill()
            self.proc.wait()
            os.close(self.master)


def _ctrl_c_stops_what_runs(term: Terminal) -> None:
    """Ctrl-C typed while `sleep` runs (a key: the sandbox's terminal makes it SIGINT)
    stops it, and the shell at `prompt> ` goes on."""
    term.type(b"sleep 1000\r")
    time.sleep(1.0)  # sleep runs
    term.type(b"\x03")
    term.until(b"prompt> ")  # the shell is back: sleep was interrupted
    term.type(b"echo after-$?\r")
    assert b"after-130" in term.until(b"after-130")


def test_exec_it_on_a_real_terminal_runs_a_shell_answers_lines_and_passes_ctrl_c(
    running: str,
) -> None:
    term = Terminal([*CLI, "exec", "-it", running, "--", "env", "PS1=prompt> ", "sh", "-i"])
    try:
        term.until(b"prompt> ")  # (typed sooner, a line may be read before the shell runs)
        term.type(b"stty size; echo $((6 * 7))-answer\r")
        shown = term.until(b"42-answer\r\n")
        assert b"30 100" in shown
        _ctrl_c_stops_what_runs(term)
        term.resize(120, 40)  # our terminal's size: SIGWINCH to the CLI, which passes it
        time.sleep(0.5)
        term.type(b"stty size\r")
        assert b"40 120" in term.until(b"40 120")
        term.type(b"exit 7\r")
    finally:
        code, restored = term.close()
    assert (code, restored) == (7, True)


def test_shell_on_a_real_terminal_is_exec_it_of_bash(running: str) -> None:
    """`shell` runs bash on a terminal of its own through the library, as `exec -it` does:
    lines answered, Ctrl-C a key, its exit code ours, our terminal left as it was."""
    term = Terminal([*CLI, "shell", running], cols=80, rows=25)
    try:
        term.until(b"/workspace# ")  # bash's own prompt (typed sooner, a line may be lost)
        term.type(b"PS1='prompt> '\r")
        term.until(b"prompt> ")
        term.type(b"echo $BASH_VERSION-$((6 * 7)); stty size\r")
        assert b"25 80" in term.until(b"25 80")
        _ctrl_c_stops_what_runs(term)
        term.type(b"exit 5\r")
    finally:
        code, restored = term.close()
    assert (code, restored) == (5, True)


class Tmux:
    """A tmux server of the test's own, its one window running `argv` on its terminal: typed
    into with send-keys, read with capture-pane, as a person at a terminal would."""

    def __init__(self, argv: list[str]) -> None:
        if shutil.which("tmux") is None:
            pytest.skip("tmux is not installed")
        self.base = ["tmux", "-L", f"orch-test-{uuid.uuid4().hex[:8]}", "-f", "/dev/null"]
        passed = {k: v for k, v in os.environ.items() if k.startswith(("ORCHESTRATOR_", "PYTHON"))}
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in passed.items())
        script = f"env {env} {shlex.join(argv)}; echo __done__ $?; sleep 60"
        new = [*self.base, "new-session", "-d", "-x", "100", "-y", "30", script]
        subprocess.run(new, check=True, timeout=30)

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", *keys], check=True, timeout=30)

    def until(self, text: str) -> str:
        deadline = time.monotonic() + WITHIN
        while True:
            screen = subprocess.run(
                [*self.base, "capture-pane", "-p"], capture_output=True, text=True, timeout=30
            ).stdout
            if text in screen:
                return screen
            assert time.monotonic() < deadline, f"no {text!r} within {WITHIN}s:\n{screen}"
            time.sleep(0.2)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=30)


@pytest.mark.parametrize("words", [["exec", "-it", "{id}", "--", "bash"], ["shell", "{id}"]])
def test_exec_it_and_shell_under_tmux_answer_lines_and_pass_ctrl_c(
    running: str, words: list[str]
) -> None:
    """Under tmux (a real terminal a person uses): a shell answers typed lines, Ctrl-C
    reaches what it runs and not us, and its exit code is ours."""
    term = Tmux([*CLI, *(w.format(id=running) for w in words)])
    try:
        term.until("/workspace#")  # (a pane's lines come without their trailing spaces)
        term.keys("echo $((6 * 7))-answer", "Enter")
        term.until("42-answer")
        term.keys("sleep 1000", "Enter")
        time.sleep(1.0)
        term.keys("C-c")
        term.keys("echo after-$?", "Enter")
        term.until("after-130")
        term.keys("exit 3", "Enter")
        term.until("__done__ 3")
    finally:
        term.close()


@pytest.mark.parametrize(
    ("entry", "ignored"),
    [("endpoint", False), ("full", False), ("shell", False), ("endpoint", True), ("full", True)],
)
def test_ctrl_p_ctrl_q_leaves_a_command_that_takes_every_other_key(
    running: str, entry: str, ignored: bool
) -> None:
    """A command that ignores Ctrl-C, Ctrl-\\ and Ctrl-Z (our terminal raw: they are keys
    it takes) cannot hold our terminal: Ctrl-P Ctrl-Q ends the session, the command killed
    (130), our terminal as it was, also where we were started with SIGINT ignored; a
    Ctrl-P alone is passed on with the next key. The command's terminal is an xterm, as
    `docker exec -it` gives it."""
    seconds = str(60000 + uuid.uuid4().int % 9999)
    marker = f"sleep {seconds}"
    hostile = (
        "python3 -c 'import os, signal; [signal.signal(s, signal.SIG_IGN) for s in (1, 2, 3, "
        '20)]; print("ready", flush=True); print("got", repr(input()), flush=True); '
        f'os.execvp("sleep", ["sleep", "{seconds}"])\''
    )
    argv = {
        "endpoint": [sys.executable, "-c", "from orchestrator.endpoint import main; main()"],
        "full": [sys.executable, "-c", "from orchestrator.cli import main; main()"],
    }.get(entry, CLI)
    words = ["shell", running] if entry == "shell" else ["exec", "-it", running, "--", "sh"]
    if ignored:  # (as under `nohup` or a shell's `trap '' INT`)
        argv = ["sh", "-c", "trap '' INT; exec \"$@\"", "sh", *argv]
    term = Terminal([*argv, *words])
    try:
        if entry == "shell":
            term.until(b"/workspace# ")
        else:
            term.until(b"# ")  # (sh's own prompt: typed sooner, a line may be lost)
        term.type(b"echo term-$TERM\r")
        term.until(b"term-xterm")
        term.type(hostile.encode() + b"\r")
        term.until(b"ready\r\n")
        term.type(b"a\x10b\r")  # a Ctrl-P alone: passed on
        term.until(b"got 'a\\x10b'")
        time.sleep(0.5)
        term.type(b"\x03\x1c\x1a")  # ignored
        time.sleep(0.5)
        term.type(b"\x10")
        time.sleep(0.3)  # (the two keys in two reads)
        term.type(b"\x11")
        term.until(b"left on Ctrl-P Ctrl-Q")
    finally:
        code, restored = term.close()
    assert (code, restored) == (130, True)
    with attach(running) as rt:
        deadline = time.monotonic() + 10
        while True:
            pattern = marker.replace("sleep", "slee[p]")
            left = rt.execute(f"ps -eo args | grep '{pattern}' || true", user="root").stdout
            if not left.strip() or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert not left.strip(), left


def test_ctrl_p_ctrl_q_in_piped_input_is_the_commands_own(running: str) -> None:
    """The keys end a session typed on our terminal only: in a pipe's bytes they are the
    command's input like any other, on both entries."""
    for entry in ("orchestrator.endpoint", "orchestrator.cli"):
        command = ["--", "sh", "-c", "read line; echo done"]
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from {entry} import main; main()",
                "exec",
                "-it",
                running,
                *command,
            ],
            input=b"abc\x10\x11def\n",
            capture_output=True,
            timeout=WITHIN,
        )
        assert done.returncode == 0 and b"done" in done.stdout, (entry, done)


def test_shell_in_a_service_without_python3_falls_back_to_docker_exec_it(
    tmp_path: Path,
) -> None:
    """A busybox service's commands go by plain `docker exec`, which has no terminal of
    ours to give: `shell` opens it with `docker exec -it` instead, on our terminal."""
    path = tmp_path / "side.yaml"
    path.write_text(
        f"version: 1\nname: side\nimage: {PYTHON_IMAGE}\nservices:\n"
        f"  side: {{image: {BUSYBOX_IMAGE}, command: [sleep, '100000']}}\n"
    )
    up = cli("up", str(path))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        term = Terminal([*CLI, "shell", ident, "--service", "side"])
        try:
            term.until(b"# ")  # busybox sh's own prompt
            term.type(b"PS1='side> '\r")
            term.until(b"side> ")
            term.type(b"echo $((6 * 7))-in-$(hostname)\r")
            term.until(b"42-in-")
            term.type(b"exit 3\r")
        finally:
            code, restored = term.close()
        assert (code, restored) == (3, True)
    finally:
        down = cli("down", ident)
        assert down.returncode == 0, down.stderr


CENSUS = """
import atexit, json, sys
out = sys.argv.pop(1)
def census():
    with open(out, "w") as fh:
        json.dump(sorted({m.split(".")[0] for m in sys.modules}), fh)
atexit.register(census)
sys.argv[0] = "orchestrator"
from orchestrator.endpoint import main
main()
"""
PARSERS = {"typer", "click", "rich", "pydantic", "python_on_whales"}


def test_exec_it_on_a_real_terminal_goes_over_the_endpoint(running: str, tmp_path: Path) -> None:
    """`exec -it` of a detached environment runs over its endpoint (no parser, no docker
    exec): our terminal raw, its size and each resize passed on, Ctrl-C a key, ours left as
    it was."""
    census = tmp_path / "census.json"
    command = ["env", "PS1=prompt> ", "sh", "-i"]
    argv = [sys.executable, "-c", CENSUS, str(census), "exec", "-it", running, "--", *command]
    term = Terminal(argv, cols=90, rows=20)
    try:
        term.until(b"prompt> ")  # (typed sooner, a line may be read before the shell runs)
        term.type(b"stty size; echo $((6 * 7))-answer\r")
        assert b"20 90" in term.until(b"42-answer\r\n")
        _ctrl_c_stops_what_runs(term)
        for cols, rows in ((120, 40), (70, 15)):
            term.resize(cols, rows)
            time.sleep(0.5)
            term.type(b"stty size\r")
            assert f"{rows} {cols}".encode() in term.until(f"{rows} {cols}".encode())
        term.type(b"exit 5\r")
    finally:
        code, restored = term.close()
    assert (code, restored) == (5, True)
    loaded = set(json.loads(census.read_text()))
    assert not loaded & PARSERS, sorted(loaded & PARSERS)


def _endpoint_terminal(running: str, *command: str, options: tuple[str, ...] = ()) -> Terminal:
    """`exec -it ID [OPTIONS] -- COMMAND` from the command's own start (the endpoint's path)."""
    entry = "from orchestrator.endpoint import main; main()"
    return Terminal([sys.executable, "-c", entry, "exec", "-it", running, *options, "--", *command])


def test_sigterm_to_exec_it_puts_our_terminal_back(running: str) -> None:
    """SIGTERM (or SIGHUP) to `exec -it` over the endpoint: 143, our terminal as it was, as
    the full CLI (it was left raw, the status -15)."""
    term = _endpoint_terminal(running, "env", "PS1=prompt> ", "sh", "-i")
    try:
        term.until(b"prompt> ")
        term.proc.send_signal(signal.SIGTERM)
    finally:
        code, restored = term.close()
    assert (code, restored) == (143, True)


def test_an_error_is_said_once_our_terminal_is_back(running: str) -> None:
    """The timeout's error line comes after our terminal is put back (said while it was raw,
    its line did not end where the next prompt starts)."""
    term = _endpoint_terminal(running, "sleep", "30", options=("--timeout", "2"))
    try:
        shown = term.until(b"timed out after 2s")
        shown += term.until(b"\n")
    finally:
        code, restored = term.close()
    assert (code, restored) == (124, True)
    assert shown.endswith(b"timed out after 2s\r\n"), shown


def test_resizes_of_a_paused_environment_keep_the_timeout(running: str) -> None:
    """ATTACK (an environment paused, or a resident a root sandbox stopped): each resize was
    sent by the main thread, waiting on a socket nobody read; a few hundred of them held
    `exec -t --timeout 3` past its bound until the resume. Now a size goes only where it
    need not wait, and only when it changed."""
    term = _endpoint_terminal(
        running, "sh", "-c", "echo started; sleep 60", options=("--timeout", "3")
    )
    try:
        term.until(b"started")
        assert cli("pause", running).returncode == 0
        began = time.monotonic()
        try:
            for i in range(400):  # (each a new size: each a SIGWINCH to us)
                term.resize(80 + i % 40, 24 + i % 7)
                time.sleep(0.002)
            code = term.proc.wait(timeout=20)
            took = time.monotonic() - began
        finally:
            assert cli("resume", running).returncode == 0
    finally:
        _, restored = term.close()
    assert code == 124 and restored, code
    assert took < 3 + 5 + 5, took  # (its timeout, OVERDUE and slack)


def test_the_full_cli_survives_a_storm_of_resizes(running: str) -> None:
    """The full CLI's `exec -it` under a storm of resizes: its signal handler took a lock
    (threading.Event.set) the main thread could hold: wrong exit codes and tracebacks."""
    entry = "from orchestrator.cli import main; main()"
    argv = [
        sys.executable,
        "-c",
        entry,
        "exec",
        "-it",
        running,
        "--",
        "sh",
        "-c",
        "sleep 3; exit 3",
    ]
    term = Terminal(argv)
    try:
        deadline = time.monotonic() + 2.5
        i = 0
        while time.monotonic() < deadline:
            term.resize(80 + i % 40, 24 + i % 7)
            i += 1
        shown = term.seen
        deadline = time.monotonic() + WITHIN
        while term.proc.poll() is None and time.monotonic() < deadline:  # all it printed
            if select.select([term.master], [], [], 0.2)[0]:
                try:
                    shown += os.read(term.master, 65536)
                except OSError:
                    break
    finally:
        code, restored = term.close()
    assert (code, restored) == (3, True) and b"Traceback" not in shown, shown[-2000:]


def test_exec_t_without_a_terminal_over_the_endpoint(running: str) -> None:
    """`-t` with our stdin a pipe: the command still gets a terminal (80 x 24 when we have
    none), its input ends at once (Ctrl-D typed, as the full CLI types it), one stream."""
    done = subprocess.run(
        [sys.executable, "-c", "from orchestrator.endpoint import main; main()", "exec", "-t",
         running, "--", "sh", "-c", "stty size; cat; echo err >&2; exit 3"],
        input=b"never read\n", capture_output=True, timeout=WITHIN,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout.replace(b"\r\n", b"\n") == b"24 80\nerr\n" and not done.stderr


def test_exec_t_followed_by_a_number_says_it_is_a_terminal_now(running: str) -> None:
    done = cli("exec", running, "-t", "5", "--", "true")
    assert done.returncode == 2 and "--timeout 5" in done.stderr, done.stderr


def test_exec_it_with_piped_input_ends_with_it(running: str) -> None:
    """Our stdin a pipe, not a terminal: its lines are typed into the command's terminal and
    its end as Ctrl-D, so a shell ends with it (instead of waiting for ever)."""
    done = cli("exec", "-it", running, "--", "sh", stdin="echo from-$((40 + 2))\n")
    assert done.returncode == 0 and "from-42" in done.stdout, (done.stdout, done.stderr)
