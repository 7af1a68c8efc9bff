"""Commands that start environments and leave them running: up (also from a pool), pool."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchestrator.cli.common import (
    BUILD_HELP,
    Started,
    build_choice,
    described,
    load_file,
    print_started,
    say_warnings,
)
from orchestrator.errors import OrchestratorError, UsageError

if TYPE_CHECKING:
    from orchestrator import (
        BuildChoice,
        Environment,
        PublishedPort,
        Runtime,
    )


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
    env = load_file(file, workspace=workspace.resolve() if workspace else None)
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
        env, count - len(claimed), workspace, evaluation, resume, build=build_choice(build)
    )
    seen: set[str] = set()
    for record, ports, warnings in [*claimed, *started]:
        say_warnings(warnings, env, seen)
        print_started(record, ports, as_json=as_json)


def _claim(env: Environment, count: int) -> Started:
    """Up to `count` environments taken from running pools of this file (`claim_ready`),
    described; one that cannot be described is left to its pool, with a warning."""
    from orchestrator import claim_ready

    def take(rt: Runtime) -> tuple[dict[str, object], tuple[PublishedPort, ...], list[str]]:
        record, ports, warnings = described(rt)
        return {**record, "pool": "claimed"}, ports, warnings

    def refused(ident: str, exc: OrchestratorError) -> None:
        typer.echo(f"warning: {ident} could not be taken ({exc}); left to its pool", err=True)

    out: Started = claim_ready(env, count, take, refused=refused)
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
            record = described(rt)
            rt.detach()  # a backend that cannot keep one running says so here
            out.append(record)
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

    choice = build_choice(build)
    env = load_file(file)
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
