"""Commands that start, use and stop environments: up, pool, run, exec, down, ps, logs,
shell, snapshot, cleanup. Environments left running are reached through `attach(id)` and
the runtime protocol, so these commands give the library's exit codes, output split,
timeouts and errors."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchestrator.errors import OrchestratorError, SandboxFileTimeout, UsageError

if TYPE_CHECKING:
    from orchestrator import (
        BuildChoice,
        Environment,
        PublishedPort,
        Runtime,
        RuntimeResult,
        Sandbox,
        Snapshot,
    )


def _load(file: Path, *, backend: str | None = None, workspace: Path | None = None) -> Environment:
    """The file, checked in one pass as `validate` checks it (for `backend` and `workspace`
    when given): every problem in one error, before anything starts (its warnings are said
    when it starts)."""
    from orchestrator import Policy, backend_class, load_environment, runtime_names

    policy = Policy.from_env()

    def check(env: Environment) -> None:
        backend_class(env, backend, policy=policy).check(env, policy, workspace=workspace)

    env = load_environment(file, backends=None if backend else runtime_names, check=check)
    for notice in env.notices:
        typer.echo(f"notice: {notice}", err=True)
    return env


def _warn(warnings: Iterable[str], env: Environment, seen: set[str] | None = None) -> None:
    """The runtime's warnings on stderr, one line each (the file's notices were printed)."""
    seen = set() if seen is None else seen
    for warning in warnings:
        if warning not in env.notices and warning not in seen:
            seen.add(warning)
            typer.echo(f"warning: {warning}", err=True)


def _ports_text(ports: Iterable[PublishedPort]) -> str:
    return ", ".join(str(p) for p in ports)


def _attach(ref: str) -> Runtime:
    from orchestrator import attach

    return attach(ref)


COMPLETE_WITHIN = 2.0
"""Seconds shell completion may spend listing environment ids (then it offers none)."""
_ID_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _complete_ids(incomplete: str) -> list[str]:
    """Environment ids that start with `incomplete`, for shell completion: those `attach`
    reaches (records in the state folder: no engine is asked). Bounded by COMPLETE_WITHIN;
    never raises (a completion that fails spoils the user's command line); a folder name
    that is not id-like is never offered to the shell."""
    found: list[str] = []

    def look() -> None:
        with contextlib.suppress(Exception):
            from orchestrator import attachable

            found.extend(attachable())

    reader = threading.Thread(target=look, daemon=True)
    reader.start()
    reader.join(COMPLETE_WITHIN)
    ids = [] if reader.is_alive() else list(found)
    return sorted(i for i in ids if i.startswith(incomplete) and _ID_CHARS.fullmatch(i))


BUILD_HELP = (
    "--build: rebuild the images the file builds (through the engine's cache); --no-build: "
    "build none, fail if one is missing. Default: build when the Dockerfile, build args or "
    "context changed."
)


def _build_choice(build: bool | None) -> BuildChoice:
    """--build / --no-build / neither, as the library's `build` keyword."""
    return "auto" if build is None else "always" if build else "never"


def up(
    file: Path = typer.Argument(..., help="Environment file."),
    workspace: Path = typer.Option(None, "--workspace", "-w", help="Host workspace folder."),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable output."),
    evaluation: bool = typer.Option(False, "--eval", help="Also run setup.eval_commands."),
    resume: str = typer.Option(
        None, "--resume", help="Restore this snapshot (a name or a path), then resume_commands."
    ),
    count: int = typer.Option(
        1, "--count", "-n", min=1, help="Start this many at once (all or none come up)."
    ),
    from_pool: bool = typer.Option(
        False, "--pool", help="Take ready ones from a running `orchestrator pool` of this file."
    ),
    build: bool | None = typer.Option(None, "--build/--no-build", help=BUILD_HELP),
) -> None:
    """Bring environments up and leave them running; print their ids (one per line) and
    ports."""
    env = _load(file, workspace=workspace.resolve() if workspace else None)
    if count > 1 and workspace is not None:
        raise UsageError("several environments cannot share one --workspace")
    if from_pool and (workspace or resume or evaluation or build is not None):
        raise UsageError(
            "--pool hands out environments as their pool set them up: "
            "it takes no --workspace, --resume, --eval, --build or --no-build"
        )
    if count > 1:
        from orchestrator import check_admission

        check_admission(env, count)  # a batch over the budget would wait on itself
    claimed = _claim(env, count) if from_pool else []
    started = _start_many(
        env, count - len(claimed), workspace, evaluation, resume, build=_build_choice(build)
    )
    seen: set[str] = set()
    for record, ports, warnings in [*claimed, *started]:
        _warn(warnings, env, seen)
        print_started(record, ports, as_json=as_json)


def print_started(
    record: dict[str, object], ports: tuple[PublishedPort, ...], *, as_json: bool
) -> None:
    """An environment just started (`up`, `wake`): its JSON record, or its id alone on
    stdout (so that ID=$(orchestrator up ...) works) and its ports on stderr."""
    if as_json:
        typer.echo(json.dumps(record))
        return
    typer.echo(record["id"])
    if ports:
        typer.echo(f"{record['id']} ports: {_ports_text(ports)}", err=True)


Started = list[tuple[dict[str, object], tuple["PublishedPort", ...], list[str]]]
"""What `up` prints of each environment: its JSON record, its ports and its warnings."""


def _described(rt: Runtime) -> tuple[dict[str, object], tuple[PublishedPort, ...], list[str]]:
    info, connection = rt.info(), rt.connection()
    record: dict[str, object] = {**asdict(info), "connection": list(connection.shell)}
    return record, info.ports, list(rt.warnings)


def _claim(env: Environment, count: int) -> Started:
    """Up to `count` environments taken from running pools of this file: each is claimed
    (atomically against its pool and other claimers), described, then kept until `down`.
    One that cannot be described is handed back to its pool; never one claimed and lost."""
    from orchestrator import attachable

    out: Started = []
    for ident in attachable(env):
        if len(out) == count:
            break
        try:
            rt = _attach(ident)
        except OrchestratorError:
            continue  # removed meanwhile, or not one to hand out
        try:
            if rt.pool_state() != "ready" or not rt.pool_move("ready", "claimed"):
                continue
            try:
                record, ports, warnings = _described(rt)
                rt.keep()  # the caller's now: its pool, reapers and guardians leave it
            except OrchestratorError as exc:
                rt.pool_move("claimed", "ready")
                typer.echo(
                    f"warning: {ident} could not be taken ({exc}); left to its pool", err=True
                )
                continue
            out.append(({**record, "pool": "claimed"}, ports, warnings))
        finally:
            rt.detach()
    if len(out) < count:
        typer.echo(f"no pool of {env.name} has {count - len(out)} more ready: starting", err=True)
    return out


def _start_many(
    env: Environment,
    count: int,
    workspace: Path | None,
    evaluation: bool,
    resume: str | None,
    *,
    build: BuildChoice = "auto",
) -> Started:
    """Start `count` environments at once (a bar on a terminal); if any fails, remove the
    others and raise its error: a script gets all the ids it asked for, or none."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator import prepare, spawn_runtime
    from orchestrator.cli.progress import admission_progress, build_progress, progress_bar

    if count == 0:
        return []
    with build_progress(f"preparing {env.name}"):
        prepare(env, build=build)  # built once here, so the spawns below build nothing

    def one() -> Runtime:
        return spawn_runtime(
            env,
            workspace=workspace,
            detached=True,
            is_evaluation=evaluation,
            resume=resume,
            build="never" if build == "never" else "auto",
        )

    runtimes: list[Runtime] = []
    with (
        progress_bar(f"starting {env.name}", count) as bar,
        admission_progress(bar, f"starting {env.name}"),  # "waiting for room: ..." in the bar
        ThreadPoolExecutor(max_workers=min(count, 16)) as pool,
    ):
        futures = [pool.submit(one) for _ in range(count)]
        try:
            for future in futures:
                runtimes.append(future.result())
                bar.advance()
        except BaseException:
            for future in futures:
                future.cancel()
            for future in futures:  # those that still came up go again
                if not future.cancelled() and future.exception() is None:
                    future.result().cleanup()
            raise
    out: Started = []
    try:
        for rt in runtimes:
            described = _described(rt)
            rt.detach()  # a backend that cannot keep one running says so here
            out.append(described)
    except BaseException:
        for rt in runtimes:
            rt.cleanup()  # those detached already are closed: this does nothing to them
        raise
    return out


SWEEP_EVERY = 0.25
"""Seconds between two looks of `orchestrator pool` for members claimed by `up --pool`."""


def pool(
    file: Path = typer.Argument(..., help="Environment file."),
    size: int = typer.Option(4, "--size", "-n", min=1, help="Environments to keep ready."),
    build: bool | None = typer.Option(None, "--build/--no-build", help=BUILD_HELP),
) -> None:
    """Keep SIZE environments of a file up and set up until stopped (Ctrl-C): `orchestrator
    up FILE --pool` takes one at once, and the pool starts another in its place. Those
    still waiting are removed when the pool stops; those taken stay until `down`."""
    import time

    from orchestrator import Pool, prepare
    from orchestrator.cli.progress import build_progress, progress_bar

    choice = _build_choice(build)
    env = _load(file)
    with build_progress(f"preparing {env.name}"):
        prepare(env, build=choice)  # built once here: its members build nothing
    with Pool(env, size, build="never" if choice == "never" else "auto") as warm:
        typer.echo(
            f"pool {warm.id}: keeping {size} of {env.name} ready; "
            f"`orchestrator up {file} --pool` takes one; Ctrl-C stops",
            err=True,
        )
        with progress_bar("ready", size, keep=True) as bar:
            claimed, last = 0, ""
            while True:
                claimed += warm.sweep()
                ready, starting = warm.ready, warm.starting
                line = f"ready {ready}/{size}, starting {starting}, taken {claimed}"
                bar.update(ready, description=f"ready (starting {starting}, taken {claimed})")
                if line != last and not sys.stderr.isatty():
                    typer.echo(line, err=True)
                last = line
                time.sleep(SWEEP_EVERY)


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

    env = _load(file, backend=on, workspace=workspace.resolve() if workspace else None)
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
            build=_build_choice(build),
        )
    with started as rt:
        _warn(rt.warnings, env)
        result = _stream(rt, argv or rt.file_command(named), timeout=timeout)
    raise typer.Exit(_exit_code(result, timeout))


def _stream(
    place: Sandbox,
    argv: str | list[str],
    *,
    user: str | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
) -> RuntimeResult:
    """Run a command, its stdout to ours and its stderr to ours as they come (interrupted,
    the command's whole tree is killed)."""
    events = place.stream(argv, user=user, cwd=cwd, timeout=timeout)
    try:
        for event in events:
            if event.kind == "finished":
                assert event.result is not None
                return event.result
            stream = sys.stdout if event.kind == "stdout" else sys.stderr
            stream.write(event.text)
            stream.flush()
    finally:
        events.close()
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
    "-t": "timeout",
}


def _exec_words(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Options written after the id (`exec ID --service side -- cmd`), then the command."""
    found: dict[str, str] = {}
    i = 0
    while i < len(words):
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
        known = ", ".join(o for o in _EXEC_OPTIONS if o.startswith("--"))
        raise UsageError(
            f"exec has no option {rest[0]} (it has {known}); the command goes after --"
        )
    return found, rest


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
        ..., help="Environment id (or a unique part of it).", autocompletion=_complete_ids
    ),
    command: list[str] = typer.Argument(..., help="Command to run (after --)."),
    service: str = typer.Option(None, "--service", "-s", help="Run in this service."),
    user: str = typer.Option(None, "--user", "-u", help='As this user ("uid[:gid]", "root").'),
    workdir: str = typer.Option(None, "--workdir", "-w", help="In this folder."),
    timeout: float = typer.Option(
        None, "--timeout", "-t", help="Kill the command's whole tree after this many seconds."
    ),
) -> None:
    """Run a command in a running environment: `exec ID [--service NAME] [--user U]
    [--workdir W] [--timeout S] -- CMD...`. Its exit code becomes ours (124 on timeout)."""
    given, words = _exec_words(command)
    service = given.get("service", service)
    user, workdir = given.get("user", user), given.get("workdir", workdir)
    if "timeout" in given:
        try:
            timeout = float(given["timeout"])
        except ValueError:
            raise UsageError(f"--timeout takes seconds, got {given['timeout']!r}") from None
    if timeout is not None and not 0 < timeout < float("inf"):
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout}")
    with _attach(ref) as rt:  # leaving the block leaves it running
        _refuse_service_word(rt, words, "exec")
        argv = _argv(words)
        place = rt.service(service) if service else rt
        result = _stream(place, argv, user=user, cwd=workdir, timeout=timeout)
    raise typer.Exit(_exit_code(result, timeout))


def shell(
    ref: str = typer.Argument(..., help="Environment id.", autocompletion=_complete_ids),
    word: str = typer.Argument(None, hidden=True),
    service: str = typer.Option(None, "--service", "-s", help="Open it in this service."),
    user: str = typer.Option(None, "--user", "-u", help='As this user ("uid[:gid]", "root").'),
) -> None:
    """Open an interactive shell (bash where the image has it) in a running environment."""
    if word is not None:
        raise UsageError(f"`shell ID {word}`: to open it in service {word!r}, use --service {word}")
    with _attach(ref) as rt:
        place = rt.service(service) if service else rt
        argv = list(place.connection(user=user).shell)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        argv = ["-i" if a == "-it" else a for a in argv]  # no terminal to give it
    raise typer.Exit(subprocess.call(argv))


def down(
    refs: list[str] = typer.Argument(
        None,
        help="Environment ids: each the full id, its last 8 characters, or a unique prefix.",
        autocompletion=_complete_ids,
        show_default=False,
    ),
    all_: bool = typer.Option(False, "--all", help="Take down every environment of ours."),
    force: bool = typer.Option(
        False, "--force", help="Also when the process that started it still runs."
    ),
) -> None:
    """Take environments down: containers, networks and volumes. Each id is tried, also
    after one fails; the exit code is 0 only when every one went (2: an id names none)."""
    from orchestrator import reap, remove_environment

    if all_ and refs:
        raise UsageError("give environment ids or --all, not both")
    if all_:
        for name in reap(everything=True):
            typer.echo(f"removed {name}")
        return
    if not refs:
        raise UsageError("name an environment id (several may be given), or pass --all")
    codes = []
    for ref in dict.fromkeys(refs):
        try:
            typer.echo(f"removed {remove_environment(ref, force=force)}")
        except OrchestratorError as exc:
            typer.echo(f"error: {ref}: {exc}", err=True)
            codes.append(exc.exit_code)
    if codes:
        raise typer.Exit(codes[0] if len(set(codes)) == 1 else 1)


def ps(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List our environments with their owner, state and published ports."""
    from orchestrator import environments

    rows, removed = environments()
    for name in removed:
        typer.echo(f"removed {name} (its owner process is gone)", err=True)
    if as_json:
        typer.echo(json.dumps([asdict(r) for r in rows]))
        return
    if not rows:
        typer.echo("no environments")
        return
    from orchestrator.cli.tables import print_table

    print_table(
        ("ID", "ENV", "OWNER", "STATE", "PORTS", "POOL"),
        [(r.id, r.env, r.owner, r.state, _ports_text(r.ports), r.pool) for r in rows],
        drop=("POOL", "OWNER", "ENV", "PORTS", "STATE"),  # an id is never cut
    )


def logs(
    ref: str = typer.Argument(..., help="Environment id.", autocompletion=_complete_ids),
    service: str = typer.Argument(None, help="Only this service (default: every one)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    tail: int = typer.Option(None, "--tail", "-n", min=0, help="Only the last N lines."),
) -> None:
    """Print what an environment's containers printed: the main sandbox's first, then each
    service's, each line after its service's name when there are several."""
    with _attach(ref) as rt:
        services = [service] if service else ["main", *sorted(rt.env.spec.services)]
        for name in services:
            rt.service(name)  # an unknown one fails here, naming the known ones
        printer = _LogPrinter(services if len(services) > 1 else [])
        readers = [
            threading.Thread(
                target=printer.copy, args=(name, rt.logs(name, tail=tail, follow=follow))
            )
            for name in services
        ]
        for reader in readers if follow else []:
            reader.daemon = True
            reader.start()
        for reader in readers:
            if follow:
                while reader.is_alive():
                    reader.join(0.5)  # Ctrl-C still reaches us
            else:
                reader.run()
    if printer.error is not None:
        raise printer.error


class _LogPrinter:
    """Lines of several services on stdout, whole, each after its service's name."""

    LINE_LIMIT = 64 * 1024

    def __init__(self, prefixed: list[str]) -> None:
        width = max((len(n) for n in prefixed), default=0)
        self._prefix = {n: f"{n.ljust(width)} | ".encode() for n in prefixed}
        self._lock = threading.Lock()
        self.error: OrchestratorError | None = None

    def copy(self, name: str, chunks: Iterator[bytes]) -> None:
        prefix, partial, wrote = self._prefix.get(name, b""), b"", False
        try:
            for chunk in chunks:
                wrote = True
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                if len(partial) > self.LINE_LIMIT:  # a line without end: out in pieces
                    lines, partial = [*lines, partial], b""
                self._write(b"".join(prefix + line + b"\n" for line in lines))
            if partial:
                self._write(prefix + partial + b"\n")
        except OrchestratorError as exc:
            self.error = exc
        if not wrote and name == "main":
            typer.echo(
                "main: no output of its own (commands run with `orchestrator exec` print to "
                "their caller)",
                err=True,
            )

    def _write(self, data: bytes) -> None:
        with self._lock:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()


def cleanup(
    all_: bool = typer.Option(
        False,
        "--all",
        help="Remove all of ours, also those whose owner still runs and those started with `up`.",
    ),
) -> None:
    """Remove our environments whose owner process is gone. Never touches anything that does
    not carry our labels."""
    from orchestrator import reap

    removed = reap(everything=all_)
    for name in removed:
        typer.echo(f"removed {name}")
    typer.echo(f"{len(removed)} removed")


def _list_snapshots(snaps: list[Snapshot], *, as_json: bool) -> None:
    """`snapshot --list`: JSON; a table with human sizes on a terminal; in a pipe the plain
    form scripts read (tab-separated, exact bytes, no header), as before."""
    from orchestrator.cli.tables import print_table, printable

    if as_json:
        fields = [{"name": s.name, **asdict(s), "path": str(s.path)} for s in snaps]
        typer.echo(json.dumps(fields))
    elif not sys.stdout.isatty():
        for s in snaps:
            line = (s.name, s.env, s.created, s.size, s.path, s.image or "-")
            typer.echo("\t".join(printable(str(f)) for f in line))  # no tab, no newline
    elif not snaps:
        typer.echo("no snapshots", err=True)
    else:
        rows = [[s.name, *map(str, (s.env, s.created, _size_text(s.size), s.image))] for s in snaps]
        headers = ("NAME", "ENV", "CREATED", "SIZE", "IMAGE")
        print_table(headers, rows, drop=("IMAGE", "CREATED", "ENV", "SIZE"))
        typer.echo(f"(in {snaps[0].path.parent})", err=True)


def _size_text(size: object) -> str:
    """Bytes as people read them (1.5 MB); a record's size that is no count, as it is."""
    from rich.filesize import decimal

    return decimal(size) if isinstance(size, int) and size >= 0 else str(size)


SNAPSHOT_TIMEOUT = 600.0
"""Seconds `orchestrator snapshot` may pack a workspace for, unless --timeout says."""


def snapshot(
    ref: str = typer.Argument(
        None, help="Environment id (or a unique part of it).", autocompletion=_complete_ids
    ),
    output: str = typer.Option(
        None, "--output", "-o", help="Where: a path, or a name in the snapshots folder."
    ),
    list_: bool = typer.Option(
        False,
        "--list",
        help="List the snapshots folder (a table on a terminal; in a pipe one tab-separated "
        "line each: name, env, created, bytes, path, image or -).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="With --list: a JSON list of objects (sizes in bytes)."
    ),
    remove: str = typer.Option(
        None, "--rm", help="Remove this snapshot (its name in the snapshots folder)."
    ),
    filesystem: bool = typer.Option(
        False, "--filesystem", help="Also save the main container's filesystem (an image)."
    ),
    limit: int = typer.Option(
        None,
        "--limit",
        min=1,
        help="Refuse a workspace that packs to more bytes (default: ORCHESTRATOR_SNAPSHOT_LIMIT).",
    ),
    timeout: float = typer.Option(
        SNAPSHOT_TIMEOUT, "--timeout", "-t", help="Give up packing after this many seconds."
    ),
) -> None:
    """Save a running environment's workspace as a snapshot (resume it with `up --resume`);
    or list or remove snapshots."""
    from orchestrator import Snapshot, list_snapshots

    if as_json and not list_:
        raise UsageError("--json goes with --list")
    if list_:
        _list_snapshots(list_snapshots(), as_json=as_json)
        return
    if remove:
        found = Snapshot.named(remove)  # nothing outside the snapshots folder
        found.remove()
        typer.echo(f"removed {found.name}")
        return
    if not ref:
        raise UsageError("name an environment id, or pass --list or --rm NAME")
    if not 0 < timeout < float("inf"):
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout}")
    with _attach(ref) as rt:
        try:
            snap = rt.snapshot(output, limit=limit, filesystem=filesystem, timeout=timeout)
        except SandboxFileTimeout:
            raise OrchestratorError(
                f"packing the workspace {rt.workdir} of {rt.info().id} took more than "
                f"{timeout:g}s and was killed: pass a longer --timeout, or make the workspace "
                "smaller"
            ) from None
    typer.echo(snap.path)
