"""Commands that run something: run (up, one command, down), exec and shell in a running
environment. Each goes through the runtime protocol, so its exit code, output split and
timeout are the library's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import typer

from orchestrator import leavekeys
from orchestrator.cli.common import (
    BUILD_HELP,
    attach_ref,
    build_choice,
    complete_ids,
    load_file,
    say_warnings,
)
from orchestrator.errors import NoTerminal, OrchestratorError, UsageError
from orchestrator.execflags import FLAGS

if TYPE_CHECKING:
    from orchestrator import (
        Process,
        Runtime,
        RuntimeResult,
        Sandbox,
        StreamEvent,
    )


def run(
    file: Path = typer.Argument(..., help="Environment file."),
    command: list[str] = typer.Argument(None, help="Command to run (after --)."),
    named: str = typer.Option(
        None, "--named", help="Run the file's `commands.NAME` ({{static:...}} resolved)."
    ),
    workspace: Path = typer.Option(None, "--workspace", "-w", help="Host workspace folder."),
    timeout: float = typer.Option(
        None, "--timeout", "-t", help="Kill the command after this many seconds."
    ),
    evaluation: bool = typer.Option(False, "--eval", help="Also run setup.eval_commands."),
    on: str = typer.Option(
        None, "--on", help="Run on this backend instead of the file's (e.g. swarm)."
    ),
    build: bool | None = typer.Option(None, "--build/--no-build", help=BUILD_HELP),
) -> None:
    """Bring an environment up, run one command in it, take it down. The command's exit code
    becomes ours (124 on timeout)."""
    from orchestrator import spawn_runtime
    from orchestrator.cli.progress import admission_progress, build_progress

    env = load_file(file, backend=on, workspace=workspace.resolve() if workspace else None)
    if named is not None and command:
        raise UsageError("give either a command after -- or --named NAME, not both")
    if named is not None and named not in env.spec.commands:
        known = ", ".join(sorted(env.spec.commands)) or "none"
        raise UsageError(f"{file} has no command named {named!r} (known: {known})")
    argv = _argv(command) if named is None else ""
    with (
        build_progress(f"building {env.name}", eager=False),  # shown only if it builds
        admission_progress(),  # shown only while it waits for room on this host
    ):
        started = spawn_runtime(
            env,
            workspace=workspace,
            is_evaluation=evaluation,
            backend=on,
            build=build_choice(build),
        )
    with started as rt:
        say_warnings(rt.warnings, env)
        result = _stream(rt, argv or rt.file_command(named), timeout=timeout)
    raise typer.Exit(_exit_code(result, timeout))


def _stream(
    place: Sandbox,
    argv: str | list[str],
    *,
    user: str | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
    interactive: bool = False,
) -> RuntimeResult:
    """Run a command, its stdout to ours and its stderr to ours as they come (interrupted,
    the command's whole tree is killed). `interactive` (`exec -i`): our stdin passed to it
    as it comes, and its end as the command's end of input."""
    if interactive:
        with place.start(argv, user=user, cwd=cwd, timeout=timeout) as proc:
            threading.Thread(target=_pass_stdin, args=(proc,), daemon=True).start()
            return _printed(proc)
    events = place.stream(argv, user=user, cwd=cwd, timeout=timeout)
    try:
        return _printed(events)
    finally:
        events.close()


def _on_terminal(
    place: Sandbox,
    argv: str | list[str],
    user: str | None,
    cwd: str | None,
    timeout: float | None,
    interactive: bool,
) -> RuntimeResult:
    """The command on a terminal of its own, our terminal's size (and each resize, on
    SIGWINCH); with `interactive`, our stdin typed into it, ours raw meanwhile (Ctrl-C
    goes to the command's terminal as a key, as `docker exec -it` passes it)."""
    cols, rows = _our_size()
    with place.start(
        argv,
        tty=True,
        cols=cols,
        rows=rows,
        stdin=interactive,
        user=user,
        cwd=cwd,
        timeout=timeout,
    ) as proc:
        # the handler only notes it, taking no lock (Event.set takes one: a signal that came
        # while the main thread held it deadlocked or recursed under a storm of resizes), and
        # stays until the process ends (undone under a storm, it raced a pending signal); a
        # thread passes the size on, only when it changed
        resized = [False]
        signal.signal(signal.SIGWINCH, lambda *_: resized.__setitem__(0, True))
        follow = (proc, resized, (cols, rows))
        threading.Thread(target=_follow_size, args=follow, daemon=True).start()
        keys = interactive and sys.stdin is not None and sys.stdin.isatty()
        with _raw(sys.stdin if interactive else None), leavekeys.armed(keys):
            if interactive:
                threading.Thread(target=_pass_stdin, args=(proc, True), daemon=True).start()
            return _printed(proc)


def _follow_size(proc: Process, resized: list[bool], size: tuple[int, int]) -> None:
    """Our terminal's size, passed on each time it changed from `size` (many changes at
    once: once; looked at every RESIZE_EVERY s), until the process ended."""
    while not proc.ended:
        time.sleep(RESIZE_EVERY)
        if resized[0]:
            resized[0] = False
            now = _our_size()
            if now != size:
                with contextlib.suppress(OrchestratorError):
                    proc.resize(*now)
                size = now


RESIZE_EVERY = 0.1


def _our_size() -> tuple[int, int]:
    """Our terminal's columns and rows (80 x 24 when ours is none)."""
    for stream in (sys.stdout, sys.stdin, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            size = os.get_terminal_size(stream.fileno())
            if size.columns > 0 and size.lines > 0:
                return size.columns, size.lines
    return 80, 24


@contextlib.contextmanager
def _raw(stream: TextIO | None) -> Iterator[None]:
    """Our terminal raw while the block runs (every key, Ctrl-C too, goes as it is typed),
    then as it was, however the block ends; nothing where `stream` is no terminal."""
    fd = stream.fileno() if stream is not None and stream.isatty() else None
    if fd is None:
        yield
        return
    import termios
    import tty

    before = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, before)


def _pass_stdin(proc: Process, keys: bool = False) -> None:
    """Our stdin to the process, as it comes (a read returns what a terminal or pipe has),
    then its end; what the process no longer takes stops it. `keys` (ours raw): Ctrl-P
    Ctrl-Q leaves (see leavekeys.py)."""
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    watch = leavekeys.watch_for(fd) if keys else None
    try:
        while data := os.read(fd, STDIN_PIECE):
            left = False
            if watch is not None:
                data, left = watch.feed(data)
            if data:
                proc.write(data)
            if left:
                leavekeys.leave()
                return
    except (OSError, ValueError):  # no stdin, or the process ended (ProcessEnded)
        pass
    with contextlib.suppress(OSError):
        proc.close_stdin()


STDIN_PIECE = 64 * 1024
"""Most bytes of our stdin read (and written to the command) at once."""


def _printed(events: Iterable[StreamEvent]) -> RuntimeResult:
    """Print a command's events, its stdout to ours and its stderr to ours; its result."""
    for event in events:
        if event.kind == "finished":
            assert event.result is not None
            return event.result
        if not event.data:  # a decoder's last characters: their bytes went already
            continue
        stream = sys.stdout if event.kind == "stdout" else sys.stderr
        if stream is None:  # started with that descriptor closed (`>&-`): nowhere to go
            continue
        stream.flush()  # anything of ours written as text goes first
        raw = getattr(stream, "buffer", None)
        if raw is None:  # not a real stream (a test's capture): as text
            stream.write(event.text)
        else:  # the bytes as the command wrote them: binary output passes unchanged
            raw.write(event.data)
            raw.flush()
    raise AssertionError("a stream ends with a finished event")


def _exit_code(result: RuntimeResult, timeout: float | None) -> int:
    if result.timed_out:
        typer.echo(f"error: timed out after {timeout or 0:g}s", err=True)
        return 124  # as timeout(1)
    return result.exit_code


def _argv(command: list[str] | None) -> str | list[str]:
    """Words after `--`: one word runs through the shell, several run as argv."""
    command = command or []
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command given: write it after --")
    return command[0] if len(command) == 1 else command


_EXEC_OPTIONS = {
    "--service": "service",
    "-s": "service",
    "--user": "user",
    "-u": "user",
    "--workdir": "workdir",
    "-w": "workdir",
    "--timeout": "timeout",
}


def _exec_words(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Options written after the id (`exec ID --service side -- cmd`), then the command."""
    found: dict[str, str] = {}
    i = 0
    while i < len(words):
        if words[i] in FLAGS:
            if "tty" in FLAGS[words[i]] and _a_number(words[i + 1 : i + 2]):
                raise UsageError(  # `-t 5`: a timeout, before -t meant a terminal
                    f"{words[i]} is a terminal (as docker exec -t); for a timeout write "
                    f"--timeout {words[i + 1]}"
                )
            found.update(dict.fromkeys(FLAGS[words[i]], "1"))
            i += 1
            continue
        name, eq, value = words[i].partition("=")
        if name not in _EXEC_OPTIONS:
            break
        if not eq:
            if i + 1 == len(words):
                raise UsageError(f"{name} needs a value")
            i, value = i + 1, words[i + 1]
        found[_EXEC_OPTIONS[name]] = value
        i += 1
    rest = words[i:]
    if rest and rest[0].startswith("-") and rest[0] != "--" and "--" in rest:
        known = ", ".join(o for o in [*_EXEC_OPTIONS, *FLAGS] if o.startswith("--"))
        raise UsageError(
            f"exec has no option {rest[0]} (it has {known}); the command goes after --"
        )
    return found, rest


def _a_number(words: list[str]) -> bool:
    try:
        float(words[0])
    except (IndexError, ValueError):
        return False
    return True


def _refuse_service_word(rt: Runtime, words: list[str], verb: str) -> None:
    """Compose's `exec ID SERVICE -- cmd` must not run a command named after the service."""
    services = {"main", *rt.env.spec.services}
    if len(words) >= 2 and words[1] == "--" and words[0] in services:
        raise UsageError(
            f"`{verb} ID {words[0]} -- ...` would run a command named {words[0]!r}: to run "
            f"in service {words[0]!r}, use --service {words[0]}"
        )


def exec_(
    ref: str = typer.Argument(
        ..., help="Environment id (or a unique part of it).", autocompletion=complete_ids
    ),
    command: list[str] = typer.Argument(..., help="Command to run (after --)."),
    service: str = typer.Option(None, "--service", "-s", help="Run in this service."),
    user: str = typer.Option(None, "--user", "-u", help='As this user ("uid[:gid]", "root").'),
    workdir: str = typer.Option(None, "--workdir", "-w", help="In this folder."),
    timeout: float = typer.Option(
        None, "--timeout", help="Kill the command's whole tree after this many seconds."
    ),
    interactive: bool = typer.Option(
        False, "--interactive", "-i", help="Pass our stdin to the command as it comes."
    ),
    tty: bool = typer.Option(
        False, "--tty", "-t", help="On a terminal of its own (ours raw while it runs)."
    ),
) -> None:
    """Run a command in a running environment: `exec [-i] [-t] ID [--service NAME]
    [--user U] [--workdir W] [--timeout S] -- CMD...`, as `docker exec` (`-it`: a shell you
    type into). Its exit code becomes ours (124 on timeout). Without -i it reads end of
    file at once."""
    given, words = _exec_words(command)
    interactive = interactive or "interactive" in given
    tty = tty or "tty" in given
    service = given.get("service", service)
    user, workdir = given.get("user", user), given.get("workdir", workdir)
    if "timeout" in given:
        try:
            timeout = float(given["timeout"])
        except ValueError:
            raise UsageError(f"--timeout takes seconds, got {given['timeout']!r}") from None
    if timeout is not None and not 0 < timeout < float("inf"):
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout}")
    with attach_ref(ref) as rt:  # leaving the block leaves it running
        _refuse_service_word(rt, words, "exec")
        argv = _argv(words)
        place = rt.service(service) if service else rt
        if tty:
            result = _on_terminal(place, argv, user, workdir, timeout, interactive)
        else:
            result = _stream(
                place, argv, user=user, cwd=workdir, timeout=timeout, interactive=interactive
            )
    raise typer.Exit(_exit_code(result, timeout))


def shell(
    ref: str = typer.Argument(..., help="Environment id.", autocompletion=complete_ids),
    word: str = typer.Argument(None, hidden=True),
    service: str = typer.Option(None, "--service", "-s", help="Open it in this service."),
    user: str = typer.Option(None, "--user", "-u", help='As this user ("uid[:gid]", "root").'),
) -> None:
    """Open an interactive shell (bash where the image has it) in a running environment:
    `exec -it` of it (`-i` alone where ours is no terminal). Its exit code becomes ours."""
    if word is not None:
        raise UsageError(f"`shell ID {word}`: to open it in service {word!r}, use --service {word}")
    terminal = sys.stdin.isatty() and sys.stdout.isatty()
    with attach_ref(ref) as rt:  # leaving the block leaves it running
        place = rt.service(service) if service else rt
        connection = place.connection(user=user)
        argv, result = list(connection.command), None
        try:
            if argv and terminal:
                result = _on_terminal(place, argv, user, None, None, True)
            elif argv:
                result = _stream(place, argv, user=user, cwd=None, timeout=None, interactive=True)
        except NoTerminal:  # (refused before anything ran: commands go by plain docker exec)
            pass
    if result is not None:
        raise typer.Exit(_exit_code(result, None))
    argv = list(connection.shell)  # the backend's own way in: `docker exec -it`, a host shell
    if not terminal:
        argv = ["-i" if a == "-it" else a for a in argv]  # no terminal to give it
    raise typer.Exit(subprocess.call(argv))
