"""Commands that start, use and stop environments: up, pool, run, exec, down, ps, logs,
shell, snapshot, cleanup."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator.backends.container.inventory import ProjectInfo
    from orchestrator.sandbox.base import Runtime
    from orchestrator.spec import Environment
    from orchestrator.spec.models import PublishedPort


def _load(file: Path) -> Environment:
    from orchestrator.spec import load_environment

    env = load_environment(file)
    for notice in env.notices:
        typer.echo(f"notice: {notice}", err=True)
    return env


def _spawn(
    env: Environment,
    workspace: Path | None,
    detached: bool,
    evaluation: bool,
    resume: str | None = None,
    backend: str | None = None,
) -> Runtime:
    from orchestrator.sandbox.registry import spawn_runtime

    return spawn_runtime(
        env,
        workspace=workspace,
        detached=detached,
        is_evaluation=evaluation,
        resume=resume,
        backend=backend,
    )


def _ports_text(ports: Iterable[PublishedPort]) -> str:
    return ", ".join(str(p) for p in ports)


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
) -> None:
    """Bring environments up and leave them running; print their ids (one per line) and
    ports."""
    env = _load(file)
    if count > 1 and workspace is not None:
        raise UsageError("several environments cannot share one --workspace")
    if from_pool and (workspace or resume or evaluation):
        raise UsageError(
            "--pool hands out environments as their pool set them up: "
            "it takes no --workspace, --resume or --eval"
        )
    claimed = _claim(env, count) if from_pool else []
    started = _start_many(env, count - len(claimed), workspace, evaluation, resume)
    for info, ports in [*claimed, *started]:
        if as_json:
            typer.echo(json.dumps(info))
        else:
            typer.echo(info["id"])  # alone on stdout, so ID=$(orchestrator up ...) works
            if ports:
                typer.echo(f"{info['id']} ports: {_ports_text(ports)}", err=True)
    from orchestrator.backends.container.inventory import wait_for_reaper

    wait_for_reaper()


Started = list[tuple[dict[str, object], tuple["PublishedPort", ...]]]
"""What `up` prints of each environment: its JSON record, and its ports."""


def _claim(env: Environment, count: int) -> Started:
    """Up to `count` environments taken from running pools of this file."""
    from orchestrator.backends.container.inventory import claim_from_pool, project_statuses

    claimed = claim_from_pool(env.digest, count)
    if not claimed:
        typer.echo(f"no pool of {env.name} has one ready: starting", err=True)
        return []
    statuses = {r.id: r for r in project_statuses()[0]}
    out: Started = []
    for info in claimed:
        container = _main_container(info)
        status = statuses.get(info.name)
        ports = status.ports if status else ()
        record: dict[str, object] = {
            "id": info.name,
            "env": info.env,
            "backend": "docker",
            "workdir": _workdir(container),
            "user": info.main_user or None,
            "exec_mode": "plain",
            "container": container,
            "ports": [asdict(p) for p in ports],
            "connection": [*_exec_argv(info, container, interactive=False), "/bin/sh"],
            "pool": status.pool if status else "",
        }
        out.append((record, ports))
    return out


def _start_many(
    env: Environment, count: int, workspace: Path | None, evaluation: bool, resume: str | None
) -> Started:
    """Start `count` environments at once (a bar on a terminal); if any fails, remove the
    others and raise its error: a script gets all the ids it asked for, or none."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.backends.docker.render import build_tags
    from orchestrator.sandbox.registry import prepare

    if count == 0:
        return []
    from orchestrator.cli.progress import progress_bar

    if build_tags(env):
        with progress_bar(f"building the images of {env.name}", None):
            prepare(env)

    def one() -> Runtime:
        return _spawn(env, workspace, detached=True, evaluation=evaluation, resume=resume)

    runtimes: list[Runtime] = []
    with (
        progress_bar(f"starting {env.name}", count) as bar,
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
            info, connection = rt.info(), rt.connection()
            rt.detach()  # a backend that cannot keep one running says so here
            out.append(({**asdict(info), "connection": list(connection.shell)}, info.ports))
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
) -> None:
    """Keep SIZE environments of a file up and set up until stopped (Ctrl-C): `orchestrator
    up FILE --pool` takes one at once, and the pool starts another in its place. Those
    still waiting are removed when the pool stops; those taken stay until `down`."""
    import time

    from orchestrator.cli.progress import progress_bar
    from orchestrator.sandbox.pool import Pool
    from orchestrator.sandbox.registry import prepare

    env = prepare(_load(file))
    if env.backend != "docker":
        raise UsageError(f"`orchestrator pool` needs the docker backend ({file} is {env.backend})")
    with Pool(env, size) as warm:
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
) -> None:
    """Bring an environment up, run one command in it, take it down. The command's exit code
    becomes ours (124 on timeout)."""
    env = _load(file)
    if named is not None and command:
        raise UsageError("give either a command after -- or --named NAME, not both")
    if named is not None and named not in env.spec.commands:
        known = ", ".join(sorted(env.spec.commands)) or "none"
        raise UsageError(f"{file} has no command named {named!r} (known: {known})")
    argv = _argv(command) if named is None else ""
    with _spawn(env, workspace, detached=False, evaluation=evaluation, backend=on) as rt:
        argv = argv or rt.file_command(named)
        result = None
        for event in rt.stream(argv, timeout=timeout):
            if event.kind == "finished":
                result = event.result
            else:
                stream = sys.stdout if event.kind == "stdout" else sys.stderr
                stream.write(event.text)
                stream.flush()
    assert result is not None
    if result.timed_out:
        typer.echo(f"error: timed out after {timeout:g}s", err=True)
        raise typer.Exit(124)
    raise typer.Exit(result.exit_code)


def _argv(command: list[str] | None) -> str | list[str]:
    """Words after `--`: one word runs through the shell, several run as argv."""
    command = command or []
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command given: write it after --")
    return command[0] if len(command) == 1 else command


def _docker_cmd() -> list[str]:
    from orchestrator.backends.container.engine import docker_client, raw_docker

    return raw_docker(docker_client())  # exec, shell and logs -f last as long as they need


def _main(ref: str) -> tuple[ProjectInfo, str]:
    """Environment `ref` (one listing) and its main container."""
    from orchestrator.backends.container.inventory import find_project

    info = find_project(ref)
    return info, _main_container(info)


def _main_container(info: ProjectInfo) -> str:
    mains = [cid for cid, service, _ in info.containers if service == "main"]
    if not mains:
        raise UsageError(f"{info.name} has no main container (was it stopped?)")
    return mains[0]


def _exec_argv(info: ProjectInfo, container: str, interactive: bool = True) -> list[str]:
    """`docker exec` into the main container, as the user its commands run as."""
    tty = interactive and sys.stdin.isatty() and sys.stdout.isatty()
    flags = ["-it"] if tty else ["-i"] if interactive else []
    if info.main_user:
        flags += ["-u", info.main_user]
    return [*_docker_cmd(), "exec", *flags, container]


def _main_exec(ref: str) -> list[str]:
    return _exec_argv(*_main(ref))


def exec_(
    ref: str = typer.Argument(..., help="Environment id (or a unique part of it)."),
    command: list[str] = typer.Argument(..., help="Command to run (after --)."),
    timeout: float = typer.Option(
        None, "--timeout", "-t", help="Kill the command's whole tree after this many seconds."
    ),
) -> None:
    """Run a command in a running environment; its exit code becomes ours (124 on timeout)."""
    words = _argv(command)
    argv = ["/bin/sh", "-c", words] if isinstance(words, str) else words
    if timeout is None:
        raise typer.Exit(subprocess.call([*_main_exec(ref), *argv]))
    if not 0 < timeout < float("inf"):
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout}")
    raise typer.Exit(_exec_with_deadline(ref, argv, timeout))


def _exec_with_deadline(ref: str, argv: list[str], timeout: float) -> int:
    """One `docker exec` whose deadline kills the command's whole tree inside the container
    (the plain-exec path of the library). Like `run`, it passes no stdin: waiting for an
    input that never ends would defeat the deadline."""
    from orchestrator.backends.container.executor.plain import run_plain
    from orchestrator.sandbox.options import Command

    info, container = _main(ref)
    cmd = Command(argv, {}, _workdir(container), info.main_user or None, timeout, None)
    chunks = run_plain(_docker_cmd(), container, cmd)
    try:
        while True:
            kind, data = next(chunks)
            stream = sys.stdout.buffer if kind == "stdout" else sys.stderr.buffer
            stream.write(data)
            stream.flush()
    except StopIteration as stop:
        outcome = stop.value
    if outcome.timed_out:
        typer.echo(f"error: timed out after {timeout:g}s", err=True)
        return 124
    return int(outcome.exit_code)


def _workdir(container: str) -> str:
    found = subprocess.run(
        [*_docker_cmd(), "inspect", "-f", "{{.Config.WorkingDir}}", container],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return found or "/"


def shell(ref: str = typer.Argument(..., help="Environment id.")) -> None:
    """Open an interactive shell (bash where the image has it) in a running environment."""
    from orchestrator.backends.container.service import SHELL

    raise typer.Exit(subprocess.call([*_main_exec(ref), "/bin/sh", "-c", SHELL]))


def down(
    ref: str = typer.Argument(
        None, help="Environment id: the full id, its last 8 characters, or a unique prefix."
    ),
    all_: bool = typer.Option(False, "--all", help="Take down every environment of ours."),
    force: bool = typer.Option(
        False, "--force", help="Also when the process that started it still runs."
    ),
) -> None:
    """Take an environment down: containers, networks and volumes."""
    from orchestrator.backends.container.identity import owner_alive
    from orchestrator.backends.container.inventory import find_project, reap, remove_project

    if all_:
        for name in reap(all_projects=True):
            typer.echo(f"removed {name}")
        return
    if not ref:
        raise UsageError("name an environment id, or pass --all")
    info = find_project(ref)
    claimed = info.kept  # taken from a pool, or kept by a harness: for `down`
    if info.owner != "detached" and owner_alive(info.labels) and not claimed and not force:
        raise UsageError(
            f"{info.name} belongs to a running process ({info.owner}), which still uses it; "
            "pass --force to take it down anyway"
        )
    remove_project(info)
    typer.echo(f"removed {info.name}")


def ps(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List our environments with their owner, state and published ports."""
    from orchestrator.backends.container.inventory import project_statuses

    rows, removed = project_statuses()
    for name in removed:
        typer.echo(f"removed {name} (its owner process is gone)", err=True)
    if as_json:
        typer.echo(json.dumps([asdict(r) for r in rows]))
        return
    if not rows:
        typer.echo("no environments")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("ID", "ENV", "OWNER", "STATE", "PORTS", "POOL", box=None)
    for r in rows:
        table.add_row(r.id, r.env, r.owner, r.state, _ports_text(r.ports), r.pool)
    Console().print(table)


def logs(
    ref: str = typer.Argument(..., help="Environment id."),
    service: str = typer.Argument(None, help="Only this service."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    tail: int = typer.Option(None, "--tail", "-n", help="Only the last N lines."),
) -> None:
    """Print the logs of an environment's containers."""
    from orchestrator.backends.container.inventory import find_project

    info = find_project(ref)
    argv = [*_docker_cmd(), "compose", "-p", info.name, "logs", "--no-color"]
    if follow:
        argv.append("-f")
    if tail is not None:
        argv += ["--tail", str(tail)]
    if service:
        argv.append(service)
    raise typer.Exit(subprocess.call(argv))


def cleanup(
    all_: bool = typer.Option(
        False,
        "--all",
        help="Remove all of ours, also those whose owner still runs and those started with `up`.",
    ),
) -> None:
    """Remove our environments whose owner process is gone. Never touches anything that does
    not carry our labels."""
    from orchestrator.backends.container import images
    from orchestrator.backends.container.inventory import reap

    for image in images.reap_orphans():
        typer.echo(f"removed {image} (its snapshot is gone)")
    removed = reap(all_projects=all_)
    for name in removed:
        typer.echo(f"removed {name}")
    typer.echo(f"{len(removed)} environment(s) removed")


SNAPSHOT_TIMEOUT = 600.0
"""Seconds `orchestrator snapshot` may pack a workspace for, unless --timeout says."""


def snapshot(
    ref: str = typer.Argument(None, help="Environment id (or a unique part of it)."),
    output: str = typer.Option(
        None, "--output", "-o", help="Where: a path, or a name in the snapshots folder."
    ),
    list_: bool = typer.Option(False, "--list", help="List the snapshots folder."),
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
    from orchestrator.sandbox import snapshot as snapshots

    if list_:
        for snap in snapshots.list_snapshots():
            fields = (snap.name, snap.env, snap.created, snap.size, snap.path, snap.image or "-")
            typer.echo("\t".join(map(str, fields)))
        return
    if remove:
        found = snapshots.Snapshot.named(remove)  # nothing outside the snapshots folder
        found.remove()
        typer.echo(f"removed {found.name}")
        return
    if not ref:
        raise UsageError("name an environment id, or pass --list or --rm NAME")
    from orchestrator.backends.container import images
    from orchestrator.backends.container.identity import LABEL_DIGEST
    from orchestrator.sandbox.options import snapshot_limit

    if not 0 < timeout < float("inf"):
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout}")
    info, container = _main(ref)
    path = snapshots.archive_path(info.env, output)
    archive = _pack_workspace(info, container, limit or snapshot_limit(), timeout)
    image = images.commit(container, path.with_suffix(".json")) if filesystem else ""
    snap = snapshots.save(archive, info.env, info.labels.get(LABEL_DIGEST, ""), path, image)
    typer.echo(snap.path)


def _pack_workspace(info: ProjectInfo, container: str, limit: int, timeout: float) -> bytes:
    """The main container's working folder as a tar stream, packed inside it as its user,
    through the library's plain-exec path: past `limit` bytes, or `timeout` seconds, the
    packing is killed (its whole tree in the container) and the snapshot refused. Memory
    stays within `limit` (and 64 KiB of its errors) whatever the workspace holds."""
    from orchestrator.backends.container.executor.plain import run_plain
    from orchestrator.errors import OrchestratorError, OutputLimitExceeded
    from orchestrator.sandbox import files
    from orchestrator.sandbox.options import SNAPSHOT_LIMIT_ENV, Command
    from orchestrator.sandbox.results import TailBuffer, decode

    workdir = _workdir(container)
    argv = files.download_argv(workdir)
    cmd = Command(argv, {}, "/", info.main_user or None, timeout, None)
    archive, err = bytearray(), TailBuffer(64 * 1024)
    chunks = run_plain(_docker_cmd(), container, cmd)
    try:
        while True:
            kind, data = next(chunks)
            if kind != "stdout":
                err.add(data)
                continue
            archive += data
            if len(archive) > limit:
                raise OutputLimitExceeded(
                    f"the workspace {workdir} of {info.name} packs to more than the limit of "
                    f"{limit} bytes: pass --limit or set {SNAPSHOT_LIMIT_ENV}, or make it smaller"
                )
    except StopIteration as stop:
        outcome = stop.value
    finally:
        chunks.close()  # given up: the packing is killed in the container
    if outcome.timed_out:
        raise OrchestratorError(
            f"packing the workspace {workdir} of {info.name} took more than {timeout:g}s and "
            "was killed: pass a longer --timeout, or make the workspace smaller"
        )
    files.raise_for_folder(outcome.exit_code, workdir, "snapshot", decode(err.value()))
    return bytes(archive)
