"""Making runtimes from environment files: which backend's class runs a file (`backend_class`,
checked against every registered name and the caller's policy), the work done once before many
spawns (`prepare`), and `spawn_runtime`, the front door that loads the file, builds the spawn's
options, waits for room (services/admission.py) and asks the class to start it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import ValidationError

from orchestrator.errors import PolicyError, SpecError, UsageError
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.options import BUILD_CHOICES, BuildChoice, SpawnOptions
from orchestrator.sandbox.registry import get_runtime_class, runtime_names
from orchestrator.sandbox.snapshot import Snapshot
from orchestrator.services import admission
from orchestrator.spec.loader import (
    Environment,
    check_backend,
    load_environment,
    require_main_image,
)
from orchestrator.spec.models import Mount, PortMap
from orchestrator.spec.policy import UNISOLATED_ENV, Policy


def backend_class(
    env: Environment, backend: str | None = None, *, policy: Policy | None = None
) -> type[Runtime]:
    """The Runtime class that runs `env`: `backend` (a caller's choice: UsageError when
    unknown) or the file's own `backend:` (SpecError at that field when unknown). A file may
    choose a backend that isolates nothing (local) only when the caller's `policy` (else
    ORCHESTRATOR_ALLOW_UNISOLATED) allows it: PolicyError at the field otherwise."""
    if backend:
        return get_runtime_class(backend)
    check_backend(env, runtime_names())
    cls = get_runtime_class(env.backend)
    if not cls.isolated and not (policy or Policy.from_env()).allow_unisolated:
        raise PolicyError(
            env.issue_at(
                "backend",
                message=f"backend {env.backend!r} runs the file's commands on this host, "
                "unisolated; a file may not choose that alone",
                fix=f"choose it as the caller (spawn_runtime(..., backend={env.backend!r}), "
                f"`orchestrator run --on {env.backend}`), or allow files to with "
                f"Policy(allow_unisolated=True) / {UNISOLATED_ENV}=1",
            )
        )
    return cls


def _load(env: Environment | str | Path) -> Environment:
    return env if isinstance(env, Environment) else load_environment(env, backends=runtime_names)


def _as_mount(m: Mount | Mapping[str, object] | str) -> Mount:
    if isinstance(m, Mount):
        return m
    try:
        return _parse_mount(m)
    except (ValidationError, IndexError) as exc:
        raise SpecError(f"spawn mount {m!r} is invalid: {exc}") from None


def _parse_mount(m: Mapping[str, object] | str) -> Mount:
    if isinstance(m, str):  # "src:dst[:ro]"
        parts = m.split(":")
        return Mount(source=parts[0], target=parts[1], read_only=parts[2:] == ["ro"])
    return Mount.model_validate(m)


def _as_port(p: PortMap | Mapping[str, object] | int) -> PortMap:
    if isinstance(p, PortMap):
        return p
    try:
        return PortMap(container=p) if isinstance(p, int) else PortMap.model_validate(p)
    except ValidationError as exc:
        raise SpecError(f"spawn port {p!r} is invalid: {exc}") from None


def spawn_runtime(
    env: Environment | str | Path,
    workspace: str | Path | None = None,
    mounts: Sequence[Mount | Mapping[str, object] | str] | None = None,
    ports: Sequence[PortMap | Mapping[str, object] | int] | None = None,
    env_vars: Mapping[str, str] | None = None,
    is_evaluation: bool = False,
    disable_setup: bool = False,
    *,
    is_resume: bool = False,
    resume: Snapshot | str | Path | None = None,
    backend: str | None = None,
    policy: Policy | None = None,
    detached: bool = False,
    host: str | None = None,
    build: BuildChoice = "auto",
) -> Runtime:
    """Bring an environment up on its backend (or `backend`), run its setup, return the live
    runtime. Use it as a context manager so it is always cleaned up. `resume`: a snapshot (or
    its path or name) whose workspace is restored first; setup then runs
    `setup.resume_commands` instead of `setup.commands`. `host`: the engine to start it on
    (any `docker --host` address; for swarm, the manager), instead of the process's.
    `build`: how the images the file builds are got: "auto" (built when what they are built
    from changed), "always" (rebuilt through the engine's cache), "never" (UsageError when
    one is missing)."""
    env = _load(env)
    _check_build(build)
    cls = backend_class(env, backend, policy=policy)
    if cls.needs_image:
        require_main_image(env)
    options = SpawnOptions(
        workspace=Path(workspace).resolve() if workspace is not None else None,
        mounts=tuple(_as_mount(m) for m in mounts or ()),
        ports=tuple(_as_port(p) for p in ports or ()),
        env_vars=dict(env_vars or {}),
        is_evaluation=is_evaluation,
        is_resume=is_resume or resume is not None,
        resume=Snapshot.find(resume) if isinstance(resume, str | Path) else resume,
        disable_setup=disable_setup,
        policy=policy or Policy.from_env(),
        detached=detached,
        host=host or None,
        build=build,
    )
    try:
        return cls.spawn(env, options, admit=lambda want: admission.admit(env, want=want))
    except SpecError as exc:  # a backend's or the policy's refusal, by field: placed in the file
        raise env.located(exc) from None


def _takes(fn: Callable[..., object], name: str) -> bool:
    """Whether `fn` takes a keyword `name` (by name or through **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def _check_build(build: str) -> None:
    if build not in BUILD_CHOICES:
        raise UsageError(f"build must be one of {', '.join(BUILD_CHOICES)}, got {build!r}")


def prepare(
    env: Environment | str | Path,
    policy: Policy | None = None,
    *,
    backend: str | None = None,
    build: BuildChoice = "auto",
) -> Environment:
    """Check an environment once before many spawns: the file, the caller's policy and what
    its backend does ahead of time (`Runtime.prepare`: a Docker backend builds its images now,
    so that spawns starting together do not each build them; `build` as in spawn_runtime)."""
    env = _load(env)
    _check_build(build)
    policy = policy or Policy.from_env()
    try:
        cls = backend_class(env, backend, policy=policy)
        if build == "auto":  # as a backend written before `build` existed takes it
            cls.prepare(env, policy)
        elif _takes(cls.prepare, "build"):
            cls.prepare(env, policy, build=build)
        else:
            raise UsageError(f"the {cls.name} backend takes no build choice ({build!r})")
    except SpecError as exc:  # placed in the file, as spawn_runtime does
        raise env.located(exc) from None
    return env
