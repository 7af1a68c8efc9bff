"""`orchestrator pause ID` and `orchestrator resume ID`: freeze a running environment where it
is (every service too: no CPU, memory kept), and let it run on. Through `attach(id)` and the
runtime protocol (`rt.pause()`, `rt.resume()`), so the library's errors and exit codes."""

from __future__ import annotations

import typer

from orchestrator.cli.common import complete_ids

ID_HELP = "Environment id (or a unique part of it)."


def pause(
    ref: str = typer.Argument(..., help=ID_HELP, autocompletion=complete_ids),
) -> None:
    """Freeze every process of a running environment, its services too: no CPU, its memory
    kept. Commands in it fail (exit 3) until `orchestrator resume ID`."""
    from orchestrator import attach

    with attach(ref) as rt:  # leaving the block leaves it as it is now
        rt.pause()
        typer.echo(f"paused {rt.info().id}")


def resume(
    ref: str = typer.Argument(..., help=ID_HELP, autocompletion=complete_ids),
) -> None:
    """Let a paused environment run on, its processes where they were."""
    from orchestrator import attach

    with attach(ref) as rt:
        rt.resume()
        typer.echo(f"resumed {rt.info().id}")
