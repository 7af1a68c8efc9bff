"""`orchestrator suspend ID` and `orchestrator wake NAME`: an environment saved to disk and
removed, then started again under a new id (see orchestrator/services/suspend.py)."""

from __future__ import annotations

import typer

from orchestrator.cli.common import attach_ref, complete_ids, described, print_started
from orchestrator.errors import UsageError


def suspend(
    ref: str = typer.Argument(
        ..., help="Environment id (or a unique part of it).", autocompletion=complete_ids
    ),
    output: str = typer.Option(
        None, "--output", "-o", help="The record's name in the snapshots folder (default: new)."
    ),
) -> None:
    """Save a running environment to disk (its workspace and every container's filesystem,
    services too) and remove it, freeing its memory; print the record's name, which `wake`
    takes. Running processes are not kept. The record stays until woken or removed."""
    with attach_ref(ref) as rt:
        saved = rt.suspend(output)
    typer.echo(saved.name)


def wake(
    name: str = typer.Argument(..., help="A suspended environment's name (or its record's path)."),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable output."),
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
    rt = wake_(name, keep_record=keep_record, detached=True)
    try:
        record, ports, warnings = described(rt)
        rt.detach()
    except BaseException:
        rt.cleanup()
        raise
    for warning in warnings:
        typer.echo(f"warning: {warning}", err=True)
    print_started(record, ports, as_json=as_json)
