"""`orchestrator doctor`: one [pass] / [warn] / [fail] line per check. The engine's checks
are the backend class's (`doctor()`): this module runs no engine command of its own."""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from orchestrator import settings
from orchestrator.errors import OrchestratorError

Check = tuple[str, str]  # (status, message)


def _dirs() -> Check:
    from orchestrator.paths import state_dir, state_folder

    try:
        state_folder()  # private and ours, in folders only root and we may change
    except OrchestratorError as exc:
        return "fail", str(exc)
    for d in (Path(tempfile.gettempdir()), state_dir()):
        try:
            with tempfile.NamedTemporaryFile(dir=d):
                pass
        except OSError as exc:
            return "fail", f"{d} is not writable: {exc.strerror}"
    return "pass", f"temp dir and state dir ({state_dir()}) writable"


def _file_checks(file: Path) -> list[Check]:
    from orchestrator import Policy, backend_class, runtime_names
    from orchestrator.errors import SpecError
    from orchestrator.spec.loader import load_environment

    try:
        env = load_environment(file, backends=runtime_names)
        with tempfile.TemporaryDirectory() as ws:
            backend_class(env).check(env, Policy.from_env(), workspace=Path(ws))
    except SpecError as exc:
        return [("fail", f"{file}: {exc}")]
    return [("pass", f"{file}: valid, policy satisfied"), *backend_class(env).doctor(env)]


def doctor(
    file: Path = typer.Argument(None, help="Also check this environment file."),
    host: str = typer.Option(
        None, "--host", "-H", help="Check the Docker engine at this address instead."
    ),
) -> None:
    """Check that this machine can run environments (on its engine, or the one at --host)."""
    if host:
        settings.use_flag(settings.DOCKER_HOST, host, "doctor --host")
    from orchestrator import get_runtime_class

    results: list[Check] = get_runtime_class("docker").doctor()  # the engine, then its needs
    results.append(_dirs())
    if file is not None and not any(s == "fail" for s, _ in results):
        results += _file_checks(file)
    for status, message in results:
        typer.echo(f"[{status}] {message}")
    if any(s == "fail" for s, _ in results):
        raise typer.Exit(1)
