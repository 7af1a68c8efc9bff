"""Commands about environment files: validate, lock, render, schema, migrate."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchestrator.errors import SpecError, SpecIssue, UsageError
from orchestrator.paths import make_folders

if TYPE_CHECKING:
    from collections.abc import Callable

    from orchestrator import Environment


def _notices(notices: tuple[str, ...] | list[str]) -> None:
    for notice in dict.fromkeys(notices):  # each once, in order
        typer.echo(f"notice: {notice}", err=True)


def checked(
    file: Path, *, backend: str | None = None, workspace: Path | None = None
) -> tuple[Environment, list[str]]:
    """Load `file` in one pass with every check `up` and `run` make before starting: the
    schema, asset paths and placeholders, the backend's name and rules, and the policy
    (Policy.from_env) for `workspace` (None: the private one a run makes). Raises one
    SpecError listing every problem; returns the environment and the check's warnings."""
    from orchestrator import load_environment, runtime_names

    warnings: list[str] = []
    check = _checker(warnings, backend=backend, workspace=workspace)
    env = load_environment(file, backends=None if backend else runtime_names, check=check)
    return env, warnings


def _checker(
    warnings: list[str], *, backend: str | None = None, workspace: Path | None = None
) -> Callable[[Environment], None]:
    """The check `up` and `run` make of a loaded file: its backend's rules and the policy
    (Policy.from_env); the check's warnings are added to `warnings`."""
    from orchestrator import Policy, backend_class

    policy = Policy.from_env()

    def check(env: Environment) -> None:
        cls = backend_class(env, backend, policy=policy)
        warnings.extend(cls.check(env, policy, workspace=workspace))

    return check


def validate(
    files: list[Path] = typer.Argument(..., help="Environment files to check."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print {valid, issues: [{file, line, column, field, message, fix}], files}.",
    ),
) -> None:
    """Check environment files in one pass (schema, asset paths and placeholders, backend
    name, policy and what the backend itself checks), every problem with file:line:column,
    field and fix; exit 0 when all are valid, 2 otherwise."""
    issues: list[SpecIssue] = []
    results: list[dict[str, object]] = []
    for path in files:
        try:
            env, warnings = checked(path)
        except SpecError as exc:
            issues += exc.issues
            results.append({"file": str(path), "valid": False})
            if not as_json:
                typer.echo(f"error: {exc}", err=True)
            continue
        notices = list(dict.fromkeys([*env.notices, *warnings]))
        results.append(
            {
                "file": str(path),
                "valid": True,
                "name": env.name,
                "backend": env.backend,
                "digest": env.digest,
                "notices": notices,
            }
        )
        if not as_json:
            _notices(notices)
            typer.echo(f"ok: {path} ({env.name}, backend {env.backend}, digest {env.digest})")
    if as_json:
        listed = [dataclasses.asdict(i) for i in issues]
        typer.echo(json.dumps({"valid": not issues, "issues": listed, "files": results}))
    if any(not r["valid"] for r in results):
        raise typer.Exit(2)


def lock(
    file: Path = typer.Argument(..., help="Environment file (a Compose file too)."),
    update: bool = typer.Option(
        False, "--update", help="Replace a lock that no longer matches (say what changed)."
    ),
) -> None:
    """Write FILE.lock beside the file: the id of every image it runs and what each build
    is made of, as this engine resolves them now. `up`, `run`, spawns and the Inspect
    provider then run those ids, and refuse a file or build that changed until `--update`.
    A lock already there and still true is left as it is; one that is not is an error
    saying what changed, unless --update."""
    from orchestrator import load_environment, lock_environment, runtime_names

    env = load_environment(file, backends=runtime_names)  # (its lock is what may be stale)
    _notices(env.notices)
    done = lock_environment(env, update=update)
    for change in done.changes:
        typer.echo(f"changed: {change}", err=True)
    state = "written" if done.written else "up to date"
    typer.echo(f"{done.path} ({state})")


def render(
    file: Path = typer.Argument(..., help="Environment file."),
    workspace: Path = typer.Option(
        None,
        "--workspace",
        "-w",
        help="Host workspace folder, as `up -w` takes it (default: as `up` without one, a "
        "private folder made for each run, shown by a stand-in the output says is one).",
    ),
    out: Path = typer.Option(None, "--out", "-o", help="Also write the project folder here."),
) -> None:
    """Print the project file an environment compiles to on its backend (Compose YAML on
    docker, the stack file on swarm), as `up` with the same --workspace would run it; a
    backend that runs it directly says so."""
    from orchestrator import Policy, backend_class

    ws = workspace.resolve() if workspace is not None else None
    env, warnings = checked(file, workspace=ws)
    _notices([*env.notices, *warnings])
    rendered = backend_class(env).render(env, ws, Policy.from_env())
    if out is not None:
        _write_project(out, rendered)
    typer.echo(next(iter(rendered.values()), ""), nl=False)


def _write_project(out: Path, rendered: dict[str, str]) -> None:
    """Write a backend's rendering under `out`; a path that would leave it is refused, and
    nothing already in `out` is written through: `out` and every folder below it are opened
    without following links, and each file is written under a new name and renamed into
    place (so a link or a hard link left there is replaced, never its target)."""
    for rel in rendered:
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            raise UsageError(f"the backend rendered a file outside the project folder: {rel!r}")
    make_folders(out)  # what is missing: 0700, whatever the umask
    for rel, text in rendered.items():
        *folders, name = Path(rel).parts
        try:
            _write_below(out, folders, name, text.encode())
        except OSError as exc:
            raise UsageError(
                f"cannot write {out / rel}: {exc.strerror} (a link in the way is refused; "
                "render into an empty folder)"
            ) from None
    typer.echo(f"wrote {out / next(iter(rendered))}", err=True)


def _write_below(out: Path, folders: list[str], name: str, data: bytes) -> None:
    nofollow = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(out, nofollow)  # a link planted as `out` itself is refused too
    try:
        for folder in folders:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o700, dir_fd=fd)
            inner = os.open(folder, nofollow, dir_fd=fd)
            os.close(fd)
            fd = inner
        temp = f".{name}.{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        file = os.open(temp, flags, 0o600, dir_fd=fd)  # (it may name host paths and secrets)
        try:
            with os.fdopen(file, "wb") as f:
                f.write(data)
            os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=fd)
            raise
    finally:
        os.close(fd)


def schema() -> None:
    """Print the JSON Schema of environment files (v1), for editors; `backend` lists the
    backends registered now (built in, `register_runtime`, the entry-point group)."""
    from orchestrator import runtime_names
    from orchestrator.spec.models import EnvironmentV1

    data = EnvironmentV1.model_json_schema()
    data["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    data["title"] = "orchestrator environment file, version 1"
    backend = data["properties"]["backend"]
    backend["enum"] = runtime_names()
    backend["description"] += f" Registered here: {', '.join(runtime_names())}."
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def migrate(
    file: Path = typer.Argument(..., help="Compose, Dockerfile, legacy or v1 environment file."),
) -> None:
    """Print the v1 equivalent of an environment file. For a Compose file, comments say
    which keys were ignored and which are refused, each at its line."""
    from orchestrator.spec.loader import migrated_yaml

    typer.echo(migrated_yaml(file, check=_checker([])), nl=False)
