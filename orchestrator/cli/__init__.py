"""The command line: a thin shell over the library (parse, call, print, map errors to exit
codes: 2 for usage and spec errors, 3 when the backend is unavailable, 1 otherwise)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import typer
from typer.completion import (  # type: ignore[attr-defined]  # its own options use them
    Shells,
    completion_init,
    install_callback,
    show_callback,
)

from orchestrator import __version__, settings
from orchestrator.cli import (
    exec_cmds,
    running_cmds,
    spec_cmds,
    start_cmds,
    state_cmds,
    suspend_cmds,
    top,
)
from orchestrator.cli.doctor import doctor
from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.quickcli import failed, prepare

app = typer.Typer(
    name="orchestrator",
    help="Run code-evaluation and AI-agent sandboxes from versioned environment files.",
    add_completion=False,  # ours below take the shell by name: `--show-completion bash`
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


completion_init()  # Typer's scripts and `_ORCHESTRATOR_COMPLETE=complete_bash` answers


def _completion(action: Callable[[Any, Any, Any], Any]) -> Callable[..., None]:
    """An eager option's callback running Typer's completion `action` (its show or install
    callback) for the shell named."""

    def callback(ctx: typer.Context, param: typer.CallbackParam, shell: Shells | None) -> None:
        if shell is not None and not ctx.resilient_parsing:
            action(ctx, param, Shells(shell).value)  # prints or installs, then exits

    return callback


def _completion_option(flag: str, action: Callable[[Any, Any, Any], Any], help: str) -> Any:
    """An eager `--FLAG SHELL` option that runs Typer's completion `action` and exits."""
    callback = _completion(action)
    return typer.Option(None, flag, callback=callback, expose_value=False, is_eager=True, help=help)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"orchestrator {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    host: str = typer.Option(
        None, "--host", "-H", help="The Docker engine to use (any `docker --host` address)."
    ),
    context: str = typer.Option(None, "--context", help="Or a Docker context's engine."),
    engine: str = typer.Option(
        None,
        "--engine",
        help="docker (the default) or podman (Podman's socket: the system one as root, "
        "the user's own rootless one otherwise); as ORCHESTRATOR_ENGINE.",
    ),
    _install: Shells = _completion_option(
        "--install-completion",
        install_callback,
        "Install completion (commands, options, environment ids) for this shell.",
    ),
    _show: Shells = _completion_option(
        "--show-completion",
        show_callback,
        "Print the completion script for this shell, to copy it or install it yourself.",
    ),
) -> None:
    """Run code-evaluation and AI-agent sandboxes from versioned environment files."""
    settings.clear_flags()  # (only this run's count)
    if sum(bool(x) for x in (host, context, engine)) > 1:
        raise UsageError("give one of --host, --context and --engine")
    # each over the process's variables, for every engine call of this run and its guardian
    if engine:  # over any engine the process's variables name
        if engine not in settings.ENGINES:
            raise UsageError(f"--engine must be one of {', '.join(settings.ENGINES)}")
        settings.use_flag(settings.ENGINE, engine, "--engine")
        settings.use_flag(settings.DOCKER_HOST, "", "--engine")
    if context:
        settings.use_flag(settings.DOCKER_HOST, _context_host(context), "--context")
    if host:
        settings.use_flag(settings.DOCKER_HOST, host, "--host")


def _context_host(name: str) -> str:
    from orchestrator import context_address

    return context_address(name)


def config(
    as_json: bool = typer.Option(False, "--json", help="JSON, for scripts."),
    docs: bool = typer.Option(
        False, "--docs", help="Print the reference of every setting (docs/settings.md) instead."
    ),
) -> None:
    """Print every setting (ORCHESTRATOR_*), its value here and where it came from:
    default, environment or flag (--host, --context, --engine)."""
    from orchestrator.cli import config_view  # (loaded by this command only)

    if docs:
        typer.echo(config_view.reference(), nl=False)
    else:
        config_view.show(as_json=as_json)


for command in (
    start_cmds.up,
    start_cmds.pool,
    exec_cmds.run,
    exec_cmds.exec_,
    running_cmds.down,
    running_cmds.ps,
    top.top,
    running_cmds.logs,
    exec_cmds.shell,
    running_cmds.snapshot,
    suspend_cmds.suspend,
    suspend_cmds.wake,
    suspend_cmds.fork,
    suspend_cmds.checkpoint,
    state_cmds.pause,
    state_cmds.resume,
    state_cmds.egress,
    spec_cmds.render,
    spec_cmds.validate,
    spec_cmds.lock,
    spec_cmds.schema,
    spec_cmds.migrate,
    doctor,
    config,
    running_cmds.cleanup,
):
    name = command.__name__.rstrip("_")
    app.command(
        name=name,
        context_settings={"allow_interspersed_args": False} if name in ("run", "exec") else None,
    )(command)


def main() -> None:
    prepare()
    try:
        app(prog_name="orchestrator")  # also as `python -m orchestrator`: one completion script
    except OrchestratorError as exc:
        sys.exit(failed(exc))
    except KeyboardInterrupt:
        sys.exit(130)
