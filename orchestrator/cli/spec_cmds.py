"""Commands about environment files: validate, render, schema, migrate."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import typer

from orchestrator.errors import SpecError


def _notices(notices: tuple[str, ...] | list[str]) -> None:
    for notice in notices:
        typer.echo(f"notice: {notice}", err=True)


def validate(files: list[Path] = typer.Argument(..., help="Environment files to check.")) -> None:
    """Check environment files (schema and policy); exit 0 when all are valid, 2 otherwise."""
    from orchestrator.backends.docker.render import CompileOptions, compile_project
    from orchestrator.spec import load_environment

    bad = 0
    for path in files:
        try:
            env = load_environment(path)
            if env.backend == "docker":  # policy and mount rules, against a scratch workspace
                with tempfile.TemporaryDirectory() as ws:
                    compile_project(env, CompileOptions(project="validate", workspace=Path(ws)))
            _notices(env.notices)
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
    """Print the Compose YAML an environment file compiles to."""
    from orchestrator.backends.container.identity import LABEL_DIGEST, LABEL_ENV, LABEL_MANAGED
    from orchestrator.backends.docker.render import CompileOptions, compile_project
    from orchestrator.spec import load_environment

    env = load_environment(file)
    if env.backend != "docker":
        raise SpecError(f"{file}: backend {env.backend!r} has no Compose project to render")
    ws = (workspace or Path.cwd()).resolve()
    labels = {LABEL_MANAGED: "1", LABEL_ENV: env.name, LABEL_DIGEST: env.digest}
    compiled = compile_project(
        env, CompileOptions(project=f"orch-{env.name}-preview", workspace=ws, labels=labels)
    )
    _notices(compiled.warnings)
    if out is not None:
        compiled.write(out)
        typer.echo(f"wrote {out / 'compose.yaml'}", err=True)
    typer.echo(compiled.compose_yaml, nl=False)


def schema() -> None:
    """Print the JSON Schema of environment files (v1), for editors."""
    from orchestrator.spec.models import EnvironmentV1

    data = EnvironmentV1.model_json_schema()
    data["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    data["title"] = "orchestrator environment file, version 1"
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def migrate(file: Path = typer.Argument(..., help="Legacy (or v1) environment file.")) -> None:
    """Print the v1 equivalent of an environment file."""
    from orchestrator.spec.loader import migrated_yaml

    typer.echo(migrated_yaml(file), nl=False)
