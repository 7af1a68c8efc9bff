"""Commands on the environments left running: down, ps, logs, cleanup, snapshot. They are
reached through `attach(id)` and the library's inventory, never a backend's modules."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

import typer

from orchestrator.cli.common import attach_ref, complete_ids
from orchestrator.errors import OrchestratorError, SandboxFileTimeout, UsageError

if TYPE_CHECKING:
    from orchestrator import (
        Snapshot,
    )


def down(
    refs: list[str] = typer.Argument(
        None,
        help="Environment ids: each the full id, its last 8 characters, or a unique prefix.",
        autocompletion=complete_ids,
        show_default=False,
    ),
    all_: bool = typer.Option(False, "--all", help="Take down every environment of ours."),
    force: bool = typer.Option(
        False, "--force", help="Also when the process that started it still runs."
    ),
) -> None:
    """Take environments down: containers, networks and volumes. Each id is tried, also
    after one fails; the exit code is 0 only when every one went (2: an id names none)."""
    from orchestrator.quickcli import take_down

    if code := take_down(refs or [], all_=all_, force=force):
        raise typer.Exit(code)


def ps(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    usage: bool = typer.Option(
        False, "--usage", help="Add what each costs: CPU seconds, memory, processes, egress."
    ),
) -> None:
    """List our environments with their owner, state and published ports. Exit 1 when a
    backend's engine failed to list its own (the others' are still listed)."""
    from orchestrator import environments
    from orchestrator.quickcli import show_environments

    failures: list[str] = []
    rows, removed = environments(usage=usage, failures=failures)
    if code := show_environments(rows, removed, failures, as_json=as_json, usage=usage):
        raise typer.Exit(code)


def logs(
    ref: str = typer.Argument(..., help="Environment id.", autocompletion=complete_ids),
    service: str = typer.Argument(None, help="Only this service (default: every one)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    tail: int = typer.Option(None, "--tail", "-n", min=0, help="Only the last N lines."),
) -> None:
    """Print what an environment's containers printed: the main sandbox's first, then each
    service's, each line after its service's name when there are several."""
    from orchestrator.logprint import show_logs
    from orchestrator.quickcli import failed, guarded

    with attach_ref(ref) as rt:
        services = [service] if service else ["main", *sorted(rt.env.spec.services)]
        for name in services:
            rt.service(name)  # an unknown one fails here, naming the known ones

        def show() -> int:
            error = show_logs(
                services, lambda name: rt.logs(name, tail=tail, follow=follow), follow=follow
            )
            return 0 if error is None else failed(error)

        code = guarded(show)
    if code:
        raise typer.Exit(code)


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
    from orchestrator.tables import print_table, printable

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
        None, help="Environment id (or a unique part of it).", autocompletion=complete_ids
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
    with attach_ref(ref) as rt:
        try:
            snap = rt.snapshot(output, limit=limit, filesystem=filesystem, timeout=timeout)
        except SandboxFileTimeout:
            raise OrchestratorError(
                f"packing the workspace {rt.workdir} of {rt.info().id} took more than "
                f"{timeout:g}s and was killed: pass a longer --timeout, or make the workspace "
                "smaller"
            ) from None
    typer.echo(snap.path)
