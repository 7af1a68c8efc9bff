"""`orchestrator ps`, `down` and `logs`, before anything heavy loads: the command's entry
(endpoint.py) brings `ps [--json] [--usage]`, `down [--force] [--all] ID...` and `logs ID
[SERVICE] [--tail N] [--follow]` (a Docker environment on this machine's engine) here, where
they load no Typer, no pydantic and no backend (the inventory asks built-in backends through
the light hooks of services/inventory.py). Anything else (`--help`, an option they do not
take, `--`) goes to the full CLI, before anything ran. The full CLI's `ps` and `down` run
`show_environments` and `take_down` too, its `logs` prints through logprint.py, and both set
up and report errors through `prepare` and `failed`, so the two print the same, byte for byte
(held by a test). Hand-written: a
parser library would cost more than the command."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING

from orchestrator.errors import OrchestratorError, SandboxUnavailable, UsageError
from orchestrator.tables import (
    echo,
    egress_text,
    ports_text,
    print_table,
    printable_lines,
    size_text,
)

if TYPE_CHECKING:
    from orchestrator.sandbox.results import EnvironmentStatus
    from orchestrator.sandbox.usage import Usage

FLAGS = {"ps": frozenset({"--json", "--usage"}), "down": frozenset({"--force", "--all"})}
"""The options each command takes on this path (any other word starting with "-" is not
for it)."""


class Other(Exception):
    """Not a call for this path: the full CLI takes it (nothing ran)."""


class _Said(logging.Formatter):
    """A warning as `warning: MESSAGE`, each of its lines printable (a message may quote
    what a label, an engine or a file said)."""

    def format(self, record: logging.LogRecord) -> str:
        return printable_lines(super().format(record))


def prepare() -> None:
    """What every run of the command starts with: warnings one line each on stderr, and
    SIGTERM and SIGHUP unwinding like Ctrl-C (so `with` blocks take their sandboxes down)."""
    said = logging.StreamHandler()
    said.setFormatter(_Said("warning: %(message)s"))
    logging.basicConfig(handlers=[said], level=logging.WARNING)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on)


def _exit_on(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def failed(exc: OrchestratorError) -> int:
    """Say an error on stderr, in one line where a sandbox is gone (its last log lines are
    `orchestrator logs ID` away); its exit code."""
    text = str(exc)
    if isinstance(exc, SandboxUnavailable) and text:
        text = text.splitlines()[0].removesuffix(";").removesuffix("; last log lines:")
    echo(f"error: {printable_lines(text)}", err=True)
    return exc.exit_code


def run(args: list[str]) -> int:
    """`ps [--json] [--usage]`, `down [--force] [--all] ID...` or `logs ID [SERVICE]
    [--tail N] [--follow]`; Other for anything else."""
    command = args[0] if args else ""
    words = args[1:]
    if command == "logs":
        prepare()  # (its warnings said as the full CLI's; that one sets it up again alike)
        return guarded(_logs_of(words))
    if command not in FLAGS or any(w.startswith("-") and w not in FLAGS[command] for w in words):
        raise Other(command)
    if command == "ps" and not FLAGS["ps"].issuperset(words):
        raise Other("ps takes no arguments")
    prepare()
    return guarded(lambda: _run(command, words))


def guarded(command: Callable[[], int]) -> int:
    """Its exit code; a reader that left (`ps | head`): quiet, exit 1, as Click does (the
    full CLI's `logs` runs through it too)."""
    try:
        return command()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                os.dup2(devnull, stream.fileno())
        return 1


def _run(command: str, words: list[str]) -> int:
    try:
        if command == "down":
            refs = [w for w in words if not w.startswith("-")]
            return take_down(refs, all_="--all" in words, force="--force" in words)
        from orchestrator import environments

        failures: list[str] = []
        usage = "--usage" in words
        rows, removed = environments(usage=usage, failures=failures)
        return show_environments(rows, removed, failures, as_json="--json" in words, usage=usage)
    except OrchestratorError as exc:
        return failed(exc)


def _logs_of(words: list[str]) -> Callable[[], int]:
    """`logs ID [SERVICE] [--tail N|-n N] [--follow|-f]` of an environment whose logs its
    backend reads without attaching (`running_logs`: a Docker environment on this
    machine's engine, found whole): how to print them, as the full CLI's `logs` prints
    them; Other for anything else (the full CLI says what is wrong), found out before
    anything is printed."""
    from orchestrator import running_logs

    follow, tail, named = False, None, list[str]()
    given = iter(words)
    for word in given:
        if word in ("--follow", "-f"):
            follow = True
        elif word in ("--tail", "-n"):
            value = next(given, "")
            if not (value.isascii() and value.isdigit() and len(value) <= 9):
                raise Other("a --tail the full CLI reads")
            tail = int(value)
        elif word.startswith("-") or len(named) == 2:
            raise Other(word)
        else:
            named.append(word)
    if not named:
        raise Other("no id")
    service = named[1] if len(named) == 2 else None
    try:
        found = running_logs(named[0], service, tail=tail, follow=follow)
    except OrchestratorError:
        found = None
    if found is None:
        raise Other("not found whole here")
    services, log_of = found

    def show() -> int:
        from orchestrator.logprint import show_logs

        error = show_logs(services, log_of, follow=follow)
        return 0 if error is None else failed(error)

    return show


def take_down(refs: list[str], *, all_: bool, force: bool) -> int:
    """`down`: each id tried, also after one fails; its exit code (0 only when every one
    went; an error's own code when all that failed failed alike)."""
    from orchestrator import reap, remove_environment

    if all_ and refs:
        raise UsageError("give environment ids or --all, not both")
    if all_:
        for name in reap(everything=True):
            echo(f"removed {name}")
        return 0
    if not refs:
        raise UsageError("name an environment id (several may be given), or pass --all")
    codes = []
    for ref in dict.fromkeys(refs):
        try:
            echo(f"removed {remove_environment(ref, force=force)}")
        except OrchestratorError as exc:
            echo(printable_lines(f"error: {ref}: {exc}"), err=True)
            codes.append(exc.exit_code)
    if not codes:
        return 0
    return codes[0] if len(set(codes)) == 1 else 1


def show_environments(
    rows: list[EnvironmentStatus],
    removed: list[str],
    failures: list[str],
    *,
    as_json: bool,
    usage: bool,
) -> int:
    """Print what `ps` lists; its exit code (1 when a backend's engine failed to list its
    own: a partial list never passes for the whole one)."""
    for name in removed:
        echo(f"removed {name} (its owner process is gone)", err=True)
    if as_json:
        echo(json.dumps([asdict(r) for r in rows]))
    elif not rows:
        echo("no environments")
    elif usage:
        print_table(
            ("ID", "ENV", "STATE", "CPU-S", "MEMORY", "PEAK", "PIDS", "EGRESS"),
            [(r.id, r.env, r.state, *_usage_cells(r.usage)) for r in rows],
            drop=("EGRESS", "PEAK", "ENV", "STATE"),
        )
    else:
        print_table(
            ("ID", "ENV", "OWNER", "STATE", "PORTS", "POOL"),
            [(r.id, r.env, r.owner, r.state, ports_text(r.ports), r.pool) for r in rows],
            drop=("POOL", "OWNER", "ENV", "PORTS", "STATE"),  # an id is never cut
        )
    for failure in failures:
        echo(f"error: {failure}", err=True)
    return 1 if failures else 0


def _usage_cells(usage: Usage | None) -> list[str]:
    """`ps --usage`'s columns of one environment ("?" each where it was not read)."""
    if usage is None or not usage.measured:
        return ["?"] * 4 + ["-" if usage is None or usage.egress is None else "?"]
    total, egress = usage.total, usage.egress
    return [
        f"{total.cpu_seconds:.1f}",
        size_text(total.memory_bytes),
        size_text(total.memory_peak_bytes),
        str(total.pids),
        "-" if egress is None else egress_text(egress.allowed, egress.denied, egress.complete),
    ]
