"""Commands about environment files: validate, render, schema, migrate."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

import typer

from orchestrator.errors import SpecError, UsageError


def _notices(notices: tuple[str, ...] | list[str]) -> None:
    for notice in dict.fromkeys(notices):  # each once, in order
        typer.echo(f"notice: {notice}", err=True)


def validate(files: list[Path] = typer.Argument(..., help="Environment files to check.")) -> None:
    """Check environment files (schema, backend name, policy and what the backend itself
    checks); exit 0 when all are valid, 2 otherwise."""
    from orchestrator import Policy, backend_class, runtime_names
    from orchestrator.spec.loader import load_environment

    policy = Policy.from_env()
    bad = 0
    for path in files:
        try:
            env = load_environment(path, backends=runtime_names)
            warnings = backend_class(env).check(env, policy)
            _notices([*env.notices, *warnings])
            typer.echo(f"ok: {path} ({env.name}, backend {env.backend}, digest {env.digest})")
        except SpecError as exc:
            bad += 1
            typer.echo(f"error: {exc}", err=True)
    if bad:
        raise typer.Exit(2)


def render(
    file: Path = typer.Argument(..., help="Environment file."),
    workspace: Path = typer.Option(
        None, "--workspace", "-w", help="Host workspace folder (default: the current folder)."
    ),
    out: Path = typer.Option(None, "--out", "-o", help="Also write the project folder here."),
) -> None:
    """Print the project file an environment compiles to on its backend (Compose YAML on
    docker, the stack file on swarm); a backend that runs it directly says so."""
    from orchestrator import Policy, backend_class, runtime_names
    from orchestrator.spec.loader import load_environment

    policy = Policy.from_env()
    env = load_environment(file, backends=runtime_names)
    cls = backend_class(env)
    ws = (workspace or Path.cwd()).resolve()
    _notices([*env.notices, *cls.check(env, policy, workspace=ws)])
    rendered = cls.render(env, ws, policy)
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
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
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
        file = os.open(temp, flags, 0o644, dir_fd=fd)
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


def migrate(file: Path = typer.Argument(..., help="Legacy (or v1) environment file.")) -> None:
    """Print the v1 equivalent of an environment file."""
    from orchestrator.spec.loader import migrated_yaml

    typer.echo(migrated_yaml(file), nl=False)
