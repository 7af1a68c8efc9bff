"""`orchestrator suspend ID` and `orchestrator wake NAME`: an environment saved to disk and
removed, then started again under a new id (see orchestrator/services/suspend.py);
`orchestrator checkpoint ID` and `orchestrator fork ID -n N`: the same saving without
stopping it, and copies of it at once (docs/fork.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orchestrator.cli.common import attach_ref, complete_ids, described, print_started
from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator import Runtime

REF = typer.Argument(
    ..., help="Environment id (or a unique part of it).", autocompletion=complete_ids
)
OUTPUT = typer.Option(
    None, "--output", "-o", help="The record's name in the snapshots folder (default: new)."
)
JSON = typer.Option(False, "--json", help="Print machine-readable output.")


def suspend(ref: str = REF, output: str = OUTPUT) -> None:
    """Save a running environment to disk (its workspace and every container's filesystem,
    services too) and remove it, freeing its memory; print the record's name, which `wake`
    takes. Running processes are not kept. The record stays until woken or removed."""
    with attach_ref(ref) as rt:
        saved = rt.suspend(output)
    typer.echo(saved.name)


MEMORY = typer.Option(
    False,
    "--memory",
    help="Its running processes and memory too (a gVisor sandbox with no network; else refused).",
)


def checkpoint(ref: str = REF, output: str = OUTPUT, memory: bool = MEMORY) -> None:
    """Save a running environment's files (its workspace and every container's filesystem,
    services too) and leave it running; print the record's name. `wake NAME --keep-record`
    starts copies of it. Running processes and memory are saved with --memory only."""
    with attach_ref(ref) as rt:
        saved = rt.checkpoint(output, memory=memory)
    typer.echo(saved.name)


def wake(
    name: str = typer.Argument(..., help="A suspended environment's name (or its record's path)."),
    as_json: bool = JSON,
    keep_record: bool = typer.Option(
        False, "--keep-record", help="Keep the record, to wake it again later (each a copy)."
    ),
) -> None:
    """Start a suspended environment again, under a new id, and leave it running: its
    services from their saved files, its workspace restored, then setup.resume_commands.
    Prints its id (as `up` does); the record is removed once it is up."""
    from orchestrator import wake as wake_

    if not name:
        raise UsageError("name a suspended environment (`orchestrator snapshot --list`)")
    _left_running(wake_(name, keep_record=keep_record, detached=True), as_json)


def fork(
    ref: str = REF,
    count: int = typer.Option(1, "--count", "-n", min=1, help="How many copies."),
    as_json: bool = JSON,
    memory: bool | None = typer.Option(
        None,
        "--memory/--files-only",
        help="--memory: carry running processes and memory, or fail; --files-only: do not. "
        "Default: carry them where the environment can.",
    ),
) -> None:
    """Copy a running environment N times, leaving it running: each copy under its own id,
    with its own networks, ports and workspace, from its workspace and every container's
    filesystem as they are now. A gVisor sandbox with no network is copied with its running
    processes and memory, which run on in each copy; any other starts its processes anew
    (setup.resume_commands in each, and a warning says so). Prints each copy's id, one a
    line (as `up` does), and leaves them running."""
    from orchestrator import fork as fork_

    with attach_ref(ref) as rt:
        made = fork_(rt, count, detached=True, memory=memory)
    for copy in made:
        _left_running(copy, as_json)


def _left_running(rt: Runtime, as_json: bool) -> None:
    """Print a started environment as `up` does, and leave it running (removed if it
    cannot be described)."""
    try:
        record, ports, warnings = described(rt)
        rt.detach()
    except BaseException:
        rt.cleanup()
        raise
    for warning in warnings:
        typer.echo(f"warning: {warning}", err=True)
    print_started(record, ports, as_json=as_json)
