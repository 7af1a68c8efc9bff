"""What the commands on environments share: a file loaded and checked as `validate` checks
it, warnings said once, an id attached or completed, `--build`, and how a started
environment is printed."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchestrator.tables import ports_text

if TYPE_CHECKING:
    from orchestrator import (
        BuildChoice,
        Environment,
        PublishedPort,
        Runtime,
    )


def load_file(
    file: Path, *, backend: str | None = None, workspace: Path | None = None
) -> Environment:
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


def say_warnings(warnings: Iterable[str], env: Environment, seen: set[str] | None = None) -> None:
    """The runtime's warnings on stderr, one line each (the file's notices were printed)."""
    seen = set() if seen is None else seen
    for warning in warnings:
        if warning not in env.notices and warning not in seen:
            seen.add(warning)
            typer.echo(f"warning: {warning}", err=True)


def attach_ref(ref: str) -> Runtime:
    from orchestrator import attach

    return attach(ref)


COMPLETE_WITHIN = 2.0
"""Seconds shell completion may spend reading the state folder for environment ids (then it
offers none: a folder on a filesystem that hangs)."""
ID_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def complete_ids(incomplete: str) -> list[str]:
    """Environment ids that start with `incomplete`, for shell completion: those `attach`
    reaches (records in the state folder: no engine is asked). Bounded by COMPLETE_WITHIN;
    never raises (a completion that fails spoils the user's command line); a folder name
    that is not id-like is never offered to the shell."""
    found: list[str] = []
    try:  # (before the clock starts: a loaded machine took more than the bound to import it)
        from orchestrator import attachable
    except Exception:  # (never spoil the command line)
        return []

    def look() -> None:
        with contextlib.suppress(Exception):
            found.extend(attachable())

    reader = threading.Thread(target=look, daemon=True)
    reader.start()
    reader.join(COMPLETE_WITHIN)
    ids = [] if reader.is_alive() else list(found)
    return sorted(i for i in ids if i.startswith(incomplete) and ID_CHARS.fullmatch(i))


BUILD_HELP = (
    "--build: rebuild the images the file builds (through the engine's cache); --no-build: "
    "build none, fail if one is missing. Default: build when the Dockerfile, build args or "
    "context changed."
)


def build_choice(build: bool | None) -> BuildChoice:
    """--build / --no-build / neither, as the library's `build` keyword."""
    return "auto" if build is None else "always" if build else "never"


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
        typer.echo(f"{record['id']} ports: {ports_text(ports)}", err=True)


Started = list[tuple[dict[str, object], tuple["PublishedPort", ...], list[str]]]
"""What `up` prints of each environment: its JSON record, its ports and its warnings."""


def described(rt: Runtime) -> tuple[dict[str, object], tuple[PublishedPort, ...], list[str]]:
    info, connection = rt.info(), rt.connection()
    record: dict[str, object] = {**asdict(info), "connection": list(connection.shell)}
    return record, info.ports, list(rt.warnings)
