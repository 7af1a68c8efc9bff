"""`orchestrator pause ID` and `orchestrator resume ID`: freeze a running environment where it
is (every service too: no CPU, memory kept), and let it run on; `orchestrator egress ID ...`:
change what it may reach outside it. Through `attach(id)` and the runtime protocol
(`rt.pause()`, `rt.resume()`, `rt.set_egress()`), so the library's errors and exit codes."""

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


def egress(
    ref: str = typer.Argument(..., help=ID_HELP, autocompletion=complete_ids),
    entries: list[str] = typer.Argument(
        ...,
        help="none, all, or allowlist entries (example.com, *.example.com:443, 10.0.0.0/8), "
        "apart or separated by commas.",
    ),
) -> None:
    """Change what a running environment may reach outside it, from now on: none, all, or
    an allowlist, as network.egress takes it, within the caller's policy
    (ORCHESTRATOR_EGRESS). What it takes away is cut at once, open tunnels too. Needs an
    environment whose sandbox has an egress gateway (an allowlist, or setup.egress)."""
    from orchestrator import attach

    words = [e.strip() for entry in entries for e in entry.split(",") if e.strip()]
    asked: str | list[str] = words[0] if words in (["none"], ["all"]) else words
    with attach(ref) as rt:
        known = len(rt.warnings)
        held = rt.set_egress(asked)
        for warning in rt.warnings[known:]:
            typer.echo(f"warning: {warning}", err=True)
        typer.echo(f"{rt.info().id}: egress {held}")
