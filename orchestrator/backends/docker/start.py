"""Bringing a Compose project up: compile and write it, check what the engine must give it,
start it (again with another subnet when the engine says ours overlaps), tether its
services; on any failure remove everything it created, and say why in the file's terms."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from orchestrator.backends.container.binds import PINNED_DIR, Pins
from orchestrator.backends.container.engine import (
    TIMED_OUT,
    Engine,
    NetworkAmbiguous,
    StorageOptUnsupported,
    SubnetOverlap,
    resolved_host,
    up_timeout,
)
from orchestrator.backends.container.guardian import ensure_guardian
from orchestrator.backends.container.identity import (
    ENGINE_FILE,
    claim_folder,
    pick_subnet,
    project_labels,
    project_name,
)
from orchestrator.backends.container.inventory import reap_soon, remove_by_label
from orchestrator.backends.container.readiness import LOG_LINES, failure, late, not_ready
from orchestrator.backends.docker.binding import pin_options
from orchestrator.backends.docker.build import get_images, missing_images
from orchestrator.backends.docker.direct import DirectRun
from orchestrator.backends.docker.lifecycle import Project
from orchestrator.backends.docker.needs import require_engine
from orchestrator.backends.docker.render import CompiledProject, CompileOptions, compile_project
from orchestrator.errors import (
    DockerError,
    HealthcheckFailed,
    OrchestratorError,
    SpecError,
    SpecIssue,
    StartupError,
)
from orchestrator.paths import make_folders, projects_dir, write_file
from orchestrator.spec.loader import Environment
from orchestrator.spec.policy import raise_if

T = TypeVar("T")


def _retry_subnet(attempt: Callable[[int], T], tries: int = 8, twins: int = 2) -> T:
    """Run attempt(0), attempt(1), ... while the engine says our subnet overlaps another
    (`tries` in all), or made one of our networks twice (NetworkAmbiguous: `twins` more
    tries; each failed attempt removed both, by our labels)."""
    doubled = 0
    for i in range(tries):
        try:
            return attempt(i)
        except SubnetOverlap:
            if i == tries - 1:
                raise
        except NetworkAmbiguous:
            doubled += 1
            if doubled > twins or i == tries - 1:
                raise
    raise AssertionError("unreachable")


def start_project(
    env: Environment,
    make_options: Callable[[str, dict[str, str], str | None], CompileOptions],
    *,
    detached: bool = False,
    extra_files: dict[str, bytes] | None = None,
    host: str = "",
    first_start: Callable[[Project, DirectRun], bool] | None = None,
) -> Project:
    """Compile, write and bring up a project (on engine `host`, else the process's); on any
    failure remove everything it created. `first_start`: see Project.first_start."""
    name = project_name(env.name)
    directory = projects_dir() / name
    engine = resolved_host(host)
    _claim(directory, engine)
    labels = project_labels(env, name, directory, detached)
    pins = Pins(directory / PINNED_DIR)  # held until the engine has mounted them

    def options(subnet: str | None) -> CompileOptions:
        return pin_options(make_options(name, labels, subnet), pins, host)

    # Spec, policy and engine errors surface here, before anything runs. The subnet is only
    # used when the project has a network of its own; a retry recompiles with a fresh one.
    try:
        compiled = compile_project(env, options(pick_subnet()))
        project = Project(name, directory, compiled, host)
        project.first_start = first_start
        # (a retry changes no network and no folder)
        require_engine(compiled, name, project.engine, directory)
        raise_if([], missing_images(compiled, host=host))  # nothing is pulled, or made
    except BaseException:
        pins.close()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    reap_soon()  # leftovers of crashed runs, in the background
    if not detached:
        ensure_guardian()  # removes this process's projects if it dies without cleaning up

    def attempt(retry: int) -> Project:
        if retry:  # the subnet was taken meanwhile: compile again with another
            _claim(directory, engine)  # the failed attempt removed it
            project.compiled = compile_project(env, options(pick_subnet()))
        project.compiled.write(directory)
        for rel, data in (extra_files or {}).items():  # the executor: any user reads it
            make_folders((directory / rel).parent, 0o755)
            write_file(directory / rel, data, 0o644)
        try:
            project.up()
        except DockerError as exc:
            err = _diagnose(project, exc, env)
            _remove_quietly(project)
            if err is exc:
                raise
            raise err from exc
        except StartupError:  # its egress gateway never took connections
            _remove_quietly(project)
            raise
        return project

    try:
        try:
            _retry_subnet(attempt)
            if project.sealed and pins.held:  # it may be started again from its memory
                project.pins, pins = pins, Pins(pins.folder)
        finally:
            pins.close()  # every container is made and started: the engine holds its mounts
        if not detached:  # its services stop when this process dies, guardian or not
            project.tether(  # jobs ended already
                [*(n for n, s in env.spec.services.items() if not s.job), *project.compiled.infra]
            )
        return project
    except (DockerError, StartupError):
        raise  # attempt() already removed what it made
    except BaseException:  # interrupted mid-start: remove whatever exists
        _remove_quietly(project)
        raise


def _claim(directory: Path, engine: str) -> None:
    """Make the project folder, with its owner and its engine's address: whoever reaps it,
    working with whichever engine, asks that one whether it is still someone's."""
    claim_folder(directory)
    if engine:  # (none: a context the CLI resolves itself; the folder stays the default's)
        write_file(directory / ENGINE_FILE, engine + "\n")


def _remove_quietly(project: Project) -> None:
    try:
        project.down()
    except OrchestratorError:
        # if the engine is gone too, `orchestrator cleanup` finds the rest by label later
        with contextlib.suppress(OrchestratorError):
            remove_by_label(project.name, project.engine)
    shutil.rmtree(project.directory, ignore_errors=True)


def _diagnose(project: Project, exc: DockerError, env: Environment) -> OrchestratorError:
    """A failed `up` because a service never became healthy, died, or (a job) exited
    non-zero becomes an error that names the service, its exit code and its last log
    lines; a disk limit the engine cannot enforce becomes a spec error naming the field."""
    if isinstance(exc, StorageOptUnsupported):
        return SpecError(
            SpecIssue(
                env.source,
                field="resources.disk",
                message="this engine cannot limit a container's disk (its storage driver needs "
                "overlay2 on xfs with pquota, btrfs or zfs for that)",
                fix="remove resources.disk here, or bound /tmp with resources.tmp",
            )
        )
    try:
        states = project.service_states()
    except OrchestratorError:
        return exc
    jobs = {name: svc.job for name, svc in env.spec.services.items()}
    bad = [
        (svc, look)
        for svc, look in states
        if svc in jobs
        and (look.health == "unhealthy" or (look.ended and not (jobs[svc] and look.exit_code == 0)))
    ]

    def tail(svc: str) -> str:
        try:
            return project.logs(svc, tail=LOG_LINES)
        except OrchestratorError:
            return ""

    parts = [failure(project.name, svc, jobs[svc], look, tail(svc)) for svc, look in bad]
    if not parts and exc.returncode == TIMED_OUT:  # Compose waited on a job or a healthcheck
        parts = [
            late(project.name, svc, jobs[svc], look, tail(svc), up_timeout())
            for svc, look in states
            if svc in jobs and not_ready(look, jobs[svc])
        ]
    return HealthcheckFailed("\n".join(parts)) if parts else exc


def build_images(env: Environment, compiled: CompiledProject, *, host: str = "") -> list[str]:
    """Get the images the environment builds as `compiled.build` says (see build.py), on
    engine `host` (else the process's): spawns starting together build each once. Returns
    the tags built."""
    require_engine(compiled, env.name, Engine.at(host))
    return get_images(compiled, env.name, host=host)
